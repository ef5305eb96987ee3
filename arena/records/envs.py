"""Environment-track records (ASTRA §2.2) and the verified-sample schema.

A knowledge base is a set of small relational tables and/or passages of prose;
every tool-needing sub-question is grounded in one lookup: a table cell (table,
key, column) or a fact stated in a passage chunk (passage id, entity, attribute,
quote). That is what lets the environment stage carry the rows or chunks as the
tool's data and lets verification detect tampered data.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from arena.records.common import Record

Cell = str | int | float
Structure = Literal["single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop"]
STRUCTURES: tuple[Structure, ...] = ("single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop")


class KbTable(Record):
    """One relation of a knowledge base."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", description="Table name, plural snake_case.")]
    entity: Annotated[
        str, Field(min_length=1, description="Singular noun used in questions, e.g. 'listing'.")
    ]
    key: Annotated[str, Field(description="Primary-key column; its values are unique.")]
    columns: Annotated[list[str], Field(min_length=2, description="Column names, the key among them.")]
    rows: Annotated[list[dict[str, Cell]], Field(description="Rows: column -> value.")]
    links: dict[str, str] = Field(
        default_factory=dict, description="Foreign keys: column -> name of the table whose key it holds."
    )


class KnowledgeBase(Record):
    """A domain-specific knowledge source K: tables plus optional free text."""

    domain: Annotated[str, Field(min_length=1, description="Domain, e.g. 'real_estate'.")]
    tables: list[KbTable] = Field(default_factory=list, description="Relations the rules backend walks.")
    passages: list[str] = Field(
        default_factory=list,
        description="Free-text passages (prose): chunked, retrieved per question, grounded by passage id.",
    )


class Grounding(Record):
    """The one knowledge-base lookup that answers a tool-needing sub-question.

    A table grounding names a cell (table, key_column, key, column). A passage grounding names the
    chunk that states the fact (``passage``), the entity (``key``), the attribute (``column``) and
    the sentence (``quote``); its ``table`` and ``key_column`` stay empty. Passage fields are left
    out of a table grounding's JSON, so records stored before passages existed hash the same.
    """

    table: Annotated[str, Field(description="Table looked up; empty for a passage grounding.")] = ""
    key_column: Annotated[
        str, Field(description="Column the lookup matches on (usually the key); empty for a passage.")
    ] = ""
    key: Annotated[
        str, Field(description="Value matched, as text; for a passage, the entity the fact is about.")
    ]
    column: Annotated[
        str, Field(description="Column whose value is the sub-answer; for a passage, the attribute.")
    ]
    passage: Annotated[
        str | None, Field(description="Id of the passage chunk stating the fact (passage groundings only).")
    ] = None
    quote: Annotated[
        str | None,
        Field(description="The sentence of that chunk stating the fact (passage groundings only)."),
    ] = None

    @property
    def is_passage(self) -> bool:
        return self.passage is not None

    @model_validator(mode="after")
    def _complete(self) -> Grounding:
        if self.passage is None and not (self.table and self.key_column):
            raise ValueError("a table grounding names table and key_column (or give passage for a passage)")
        return self

    @model_serializer(mode="wrap")
    def _compact(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if self.passage is None:
            out.pop("passage", None)
            if self.quote is None:
                out.pop("quote", None)
        return out


class SubQA(Record):
    """One sub-question (q_i, a_i, d_i) of a decomposed QA instance (eq. 13)."""

    index: Annotated[int, Field(ge=1, description="Position in the trace (1-based).")]
    question: Annotated[str, Field(description="Sub-question q_i.")]
    answer: Annotated[str, Field(description="Sub-answer a_i.")]
    depends_on: list[int] = Field(default_factory=list, description="Indices d_i of sub-questions it needs.")
    needs_tool: Annotated[bool, Field(description="Whether answering needs a tool call.")] = True
    grounding: Annotated[
        Grounding | None, Field(description="Knowledge-base lookup behind a tool-needing sub-question.")
    ] = None
    operation: Annotated[
        str | None,
        Field(description="For a no-tool step, the linguistic operation (compare, count, sum, format...)."),
    ] = None


class QaSeed(Record):
    """A main question or a knowledge source plus hop budget; value of ``qa.seeds``."""

    seed_id: Annotated[str, Field(description="Content hash of the seed.")]
    domain: Annotated[str, Field(description="Domain of the knowledge source.")]
    mode: Annotated[
        Literal["question", "unconditional"],
        Field(description="Question-conditional (decompose q0) or unconditional (generate q0 from K)."),
    ]
    question: Annotated[str | None, Field(description="Main question q0 (question mode only).")] = None
    knowledge: Annotated[KnowledgeBase, Field(description="Knowledge source K the instance is grounded in.")]
    hop_budget: Annotated[int, Field(ge=1, le=8, description="Hop budget H: reasoning hops per chain.")] = 2
    count: Annotated[
        int, Field(ge=1, le=1000, description="Instances to synthesise (unconditional mode).")
    ] = 1
    source: Annotated[str, Field(description="Where the seed came from (file path or generator).")] = ""


class ContextCut(Record):
    """What one role's prompt left out of the knowledge base to fit the model's context window."""

    role: Annotated[str, Field(description="The role whose prompt was cut.")]
    rows_cut: Annotated[int, Field(ge=0, description="Table rows left out.")] = 0
    rows_total: Annotated[int, Field(ge=0, description="Table rows there were.")] = 0
    passages_cut: Annotated[int, Field(ge=0, description="Passage chunks left out.")] = 0
    passages_total: Annotated[int, Field(ge=0, description="Passage chunks there were.")] = 0
    tables: list[str] = Field(default_factory=list, description="Tables some rows were cut from.")
    prompt_tokens: Annotated[int, Field(ge=0, description="Estimated prompt tokens after the cut.")] = 0
    budget_tokens: Annotated[int, Field(ge=0, description="The prompt budget it had to fit.")] = 0

    def summary(self) -> str:
        parts = [f"{self.rows_cut} of {self.rows_total} rows"] * bool(self.rows_total)
        parts += [f"{self.passages_cut} of {self.passages_total} passage chunks"] * bool(self.passages_total)
        where = f" (tables {', '.join(self.tables)})" if self.tables else ""
        return f"{self.role}: left out {' and '.join(parts) or 'nothing'}{where} to fit {self.budget_tokens} tokens"


class QaTrace(Record):
    """A decomposed QA instance; value of ``qa.traces`` and ``qa.validated``."""

    qa_id: Annotated[str, Field(description="Content hash of the instance.")]
    seed_id: Annotated[str, Field(description="Seed it came from.")]
    domain: Annotated[str, Field(description="Domain.")]
    structure: Annotated[Structure, Field(description="Dependency structure of the sub-QAs.")]
    question: Annotated[str, Field(description="Main question q0.")]
    answer: Annotated[str, Field(description="Main answer a0 = Phi(sub-answers, G) (eq. 12).")]
    sub_qas: Annotated[list[SubQA], Field(min_length=1, description="Sub-QAs whose d_i form a DAG.")]
    knowledge: Annotated[
        KnowledgeBase, Field(description="The tables the groundings refer to (pruned from the seed's K).")
    ]
    scores: dict[str, float] = Field(
        default_factory=dict, description="DC, SA, SR, TC and QS once validated."
    )
    context_cut: list[ContextCut] = Field(
        default_factory=list,
        description="Knowledge left out of the prompts that made or judged this trace (context window).",
    )


class EnvJob(Record):
    """One verifiable sub-environment job: a sub-question, its answer, and the call that answers it."""

    index: Annotated[int, Field(ge=1, description="Sub-question index in the QA trace.")]
    question: Annotated[str, Field(description="Sub-question q_i.")]
    answer: Annotated[str, Field(description="Sub-answer a_i the invocation's output must contain.")]
    tool: Annotated[str, Field(description="Name of the tool the invocation calls.")]
    invocation: Annotated[str, Field(description="One Python call expression, e.g. get_x(id='a').")]


VARIANT_STEM = 60
"""Characters of a tool name kept before a variant's ``_n`` suffix: ``name_n`` stays within 64."""


def variant_name(name: str, n: int) -> str:
    """The ``n``-th tool of one package that wants ``name`` (n >= 2): ``name_2``, ``name_3``..."""
    return f"{name[:VARIANT_STEM]}_{n}"


def tool_family(name: str) -> str:
    """A tool's family: its name without the suffix ``variant_name`` adds, so variants go together.

    Cut to ``VARIANT_STEM`` characters as ``variant_name`` cuts it, so a long name and its variants
    (whose stems were cut) share one family; never empty.
    """
    return (re.sub(r"_\d+$", "", name) or name)[:VARIANT_STEM]


class EnvPackage(Record):
    """A self-contained executable environment; value of ``envs.code`` and ``envs.verified``.

    Executing a job means running ``DATA = <data>``, then ``code``, then the
    job's invocation as the final expression, in the sandbox; it passes when
    the output contains the job's answer.
    """

    env_id: Annotated[str, Field(description="Content hash of the package.")]
    qa_id: Annotated[str, Field(description="QA instance it implements.")]
    seed_id: Annotated[str, Field(description="Seed of that instance.")]
    domain: Annotated[str, Field(description="Domain.")]
    structure: Annotated[Structure, Field(description="Dependency structure of the instance.")]
    question: Annotated[str, Field(description="Main question q0.")]
    answer: Annotated[str, Field(description="Main answer a0.")]
    sub_qas: Annotated[list[SubQA], Field(description="The validated trace, no-tool leaves included.")]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tool specs, one per implemented tool.")]
    code: Annotated[str, Field(description="Python module defining one function per tool; reads DATA.")]
    data: dict[str, list[dict[str, Cell]]] = Field(
        default_factory=dict, description="Per tool name: the table rows its implementation computes from."
    )
    jobs: Annotated[list[EnvJob], Field(description="One job per tool-needing sub-question.")]
    version: Annotated[int, Field(ge=1, description="Package version: 1 as synthesised, 2 once merged.")] = 1
    tools_before_merge: Annotated[
        int, Field(ge=0, description="Tool count before homogeneous merging (equals len(tools) before).")
    ] = 0
    merged_groups: list[list[int]] = Field(
        default_factory=list, description="Homogeneous sub-question groups that now share one tool."
    )
    lineage: dict[str, str] = Field(
        default_factory=dict, description="Prompt versions and backend per role that built the package."
    )
    context_cut: list[ContextCut] = Field(
        default_factory=list,
        description="Knowledge left out of the environment roles' prompts (context window); not hashed.",
    )


class VerifiedSample(Record):
    """A sample the trainer can roll out and reward; value of ``samples.verified``."""

    sample_id: Annotated[str, Field(description="Content hash of the sample.")]
    kind: Annotated[
        Literal["qa", "interactive", "tau2", "bfcl"],
        Field(
            description="QA environment (F1 reward over jobs), interactive (a pack instance's verification "
            "function), tau2 (a tau2 task in the domain's own code, its evaluation criteria as reward) or "
            "bfcl (a BFCL multi-turn benchmark item: evaluation only, never published or trained on)."
        ),
    ]
    prompt: Annotated[list[dict[str, Any]], Field(description="Initial OpenAI chat messages.")]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools offered.")]
    env_ref: Annotated[
        str,
        Field(description="Package or instance id to load the environment from (tau2: the import's source)."),
    ]
    reward_spec: Annotated[
        dict[str, Any],
        Field(
            description="qa: {'jobs': [{question, answer}]} for the F1 reward; interactive: an "
            "InteractiveSpec; tau2: a Tau2EnvSpec (environments/tau2_environment.py)."
        ),
    ]
    domain: Annotated[str, Field(description="Domain.")]
    split: Annotated[str, Field(description="Split name; held-out samples are never published.")] = "train"

    @property
    def has_user(self) -> bool:
        """A user answers the agent's messages (interactive, tau2: simulated; bfcl: the scripted turns)."""
        return self.kind != "qa"

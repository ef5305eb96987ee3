"""QA-instance roles of the environment track (ASTRA §2.2.1-2.2.2).

- ``QA_SYNTHESIS``: from a knowledge source K and a hop budget H, write a main
  question q0, its answer a0 and the sub-QAs (q_i, a_i, d_i) that derive it
  (unconditional mode), or decompose a given q0 (question mode). Every
  tool-needing sub-question names the one table lookup that answers it.
- ``QA_TOOL_NEED``: classify each sub-question as needing a tool (a fact of K)
  or as a purely linguistic operation (compare, sum, count, format, ...).
- ``QA_DEPENDENCY`` (DC_i), ``QA_ATOMICITY`` (SA_i), ``QA_SEQUENCE`` (SR_i):
  one binary verdict per sub-question (eq. 14, 16, 18).
- ``QA_COMPLETENESS`` (TC): one binary verdict per instance (eq. 20).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from arena.llm.core import JudgeReason, Role
from arena.records.envs import KnowledgeBase, Structure, SubQA
from synthesis.sft.roles.judges import BINARY, BinaryJudgement


class QaSynthesisInput(BaseModel):
    """A knowledge source and what to synthesise from it."""

    knowledge: Annotated[KnowledgeBase, Field(description="Knowledge source K: tables (and passages).")]
    mode: Annotated[
        Literal["question", "unconditional"],
        Field(description="question: decompose `question`; unconditional: invent q0 from K."),
    ]
    question: Annotated[str | None, Field(description="Main question q0 (question mode only).")] = None
    hop_budget: Annotated[int, Field(ge=1, le=8, description="Hop budget H: lookups per reasoning chain.")]
    structure: Annotated[
        Structure | None,
        Field(description="Dependency structure wanted (unconditional mode); None in question mode."),
    ] = None
    instance: Annotated[
        int, Field(ge=0, description="Number of this instance for the seed; vary entities and wording by it.")
    ] = 0
    flaw_rate: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="Rules backend only: share of drafts made with a realistic flaw; LLMs ignore it.",
        ),
    ] = 0.0


class QaDraft(BaseModel):
    """A decomposed QA instance: (q0, a0) and the sub-QAs whose dependencies form a DAG."""

    question: Annotated[str, Field(min_length=1, description="Main question q0.")]
    answer: Annotated[str, Field(min_length=1, description="Main answer a0, derived from the sub-answers.")]
    structure: Annotated[Structure, Field(description="Dependency structure of the sub-QAs.")]
    sub_qas: Annotated[
        list[SubQA],
        Field(
            min_length=1,
            description="Sub-QAs in execution order, indexed 1..m; each tool-needing one carries its grounding.",
        ),
    ]

    @model_validator(mode="after")
    def _well_formed(self) -> QaDraft:
        indices = [s.index for s in self.sub_qas]
        if indices != list(range(1, len(indices) + 1)):
            raise ValueError(f"sub-QA indices must be 1..{len(indices)} in order, got {indices}")
        for s in self.sub_qas:
            bad = [d for d in s.depends_on if d == s.index or not 1 <= d <= len(indices)]
            if bad:
                raise ValueError(f"sub-QA {s.index} depends on unknown or itself: {bad}")
            if s.needs_tool and s.grounding is None:
                raise ValueError(f"sub-QA {s.index} needs a tool but has no grounding (table lookup)")
            if not s.answer.strip():
                raise ValueError(f"sub-QA {s.index} has an empty answer")
        if _has_cycle({s.index: s.depends_on for s in self.sub_qas}):
            raise ValueError("the dependencies d_i form a cycle; they must form a DAG")
        return self


def _has_cycle(deps: dict[int, list[int]]) -> bool:
    state: dict[int, int] = {}  # 1 = on the stack, 2 = done

    def visit(node: int) -> bool:
        if state.get(node) == 1:
            return True
        if state.get(node) == 2:
            return False
        state[node] = 1
        if any(visit(d) for d in deps.get(node, [])):
            return True
        state[node] = 2
        return False

    return any(visit(n) for n in deps)


class ToolNeedInput(BaseModel):
    """The sub-questions of one instance, to classify."""

    question: Annotated[str, Field(description="Main question q0, for context.")]
    sub_qas: Annotated[list[SubQA], Field(description="The sub-QAs (their declared needs_tool is a claim).")]
    knowledge: Annotated[KnowledgeBase, Field(description="The tables the instance draws on.")]


class ToolNeed(BaseModel):
    """Whether one sub-question needs a tool call."""

    index: Annotated[int, Field(ge=1, description="Sub-question index.")]
    needs_tool: Annotated[
        bool, Field(description="True when answering needs a fact from outside (a lookup).")
    ]
    operation: Annotated[
        str | None,
        Field(description="For a no-tool step: the linguistic operation (compare, sum, count, format, ...)."),
    ] = None
    reason: Annotated[JudgeReason, Field(description="One sentence: why.")]

    @model_validator(mode="after")
    def _operation_named(self) -> ToolNeed:
        if not self.needs_tool and not (self.operation or "").strip():
            raise ValueError(f"sub-question {self.index}: a no-tool step must name its operation")
        return self


class ToolNeeds(BaseModel):
    """One classification per sub-question."""

    items: Annotated[list[ToolNeed], Field(description="One entry per sub-question, by index.")]


class QaJudgeInput(BaseModel):
    """A decomposed QA instance, as the four quality judges see it."""

    question: Annotated[str, Field(description="Main question q0.")]
    answer: Annotated[str, Field(description="Main answer a0.")]
    structure: Annotated[Structure, Field(description="Declared dependency structure.")]
    sub_qas: Annotated[list[SubQA], Field(description="The sub-QAs (q_i, a_i, d_i) in execution order.")]
    knowledge: Annotated[KnowledgeBase, Field(description="The tables the groundings refer to.")]


class StepVerdict(BaseModel):
    """A binary verdict on one sub-question."""

    index: Annotated[int, Field(ge=1, description="Sub-question index i.")]
    score: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="1 = yes, 0 = no; no other value.",
            json_schema_extra={"enum": list(BINARY)},
        ),
    ]
    reason: Annotated[JudgeReason, Field(description="One sentence naming the evidence.")]

    @field_validator("score")
    @classmethod
    def _binary(cls, value: float) -> float:
        if value not in BINARY:
            raise ValueError(f"score must be 0 or 1, got {value}")
        return value


class StepVerdicts(BaseModel):
    """One binary verdict per sub-question."""

    verdicts: Annotated[list[StepVerdict], Field(description="One verdict per sub-question, by index.")]


_QA = (
    "A decomposed QA instance has a main question q0, a main answer a0 and sub-questions (q_i, a_i, d_i), "
    "i = 1..m, in execution order; d_i lists the indices of the earlier sub-questions whose answers q_i "
    "uses. A sub-question either needs a tool (one lookup of one fact in the knowledge base, described "
    "by its grounding: table, key_column, key, column) or is a purely linguistic operation on earlier "
    "answers (compare, sum, count, format, summarise, rank, recommend...). Judge only from what you are "
    "given.\n"
)
_STEP_OUT = (
    'Output: one JSON object {"verdicts": [{"index": int, "score": 0 or 1, "reason": string}, ...]} with '
    "exactly one verdict per sub-question."
)

QA_SYNTHESIS: Role[QaSynthesisInput, QaDraft] = Role(
    name="qa_synthesis",
    input=QaSynthesisInput,
    output=QaDraft,
    system="You write verifiable multi-step question-answer instances grounded in a knowledge base of "
    "small relational tables (columns, rows, foreign-key links) and/or passages of prose.\n"
    "Unconditional mode: invent a main question q0 that needs about H lookups per reasoning chain, in "
    "the requested structure: single_hop (one lookup; a0 = a1), parallel_single_hop (2-3 independent "
    "lookups, then one no-tool aggregation such as compare, sum or count), multi_hop (a chain of H "
    "lookups following foreign keys, each q_i naming the previous answer literally, d_i = [i-1]), "
    "parallel_multi_hop (two such chains, then one no-tool aggregation). Question mode: decompose the "
    "given q0 the same way.\n"
    "Rules: every sub-answer a_i of a tool step is exactly one cell of the tables, copied verbatim, and "
    "its grounding names that cell (table, key_column, key, column); when the knowledge is prose "
    "(passages), a_i is copied verbatim from one sentence and the grounding names the passage instead: "
    '{"passage": the number of the passage (0-based), "key": the entity, "column": the attribute, '
    '"quote": the sentence, verbatim}; each sub-question asks for one '
    "thing; a no-tool step (needs_tool false, with its operation) may only come last, nothing may "
    "depend on it; d_i lists exactly the earlier answers q_i uses; no superfluous steps; a0 follows "
    "from the sub-answers.\n"
    'Output: one JSON object {"question", "answer", "structure", "sub_qas": [{"index", "question", '
    '"answer", "depends_on", "needs_tool", "grounding", "operation"}]}.',
    template="Knowledge base and request:\n{input}\n\nWrite the instance.",
)

QA_TOOL_NEED: Role[ToolNeedInput, ToolNeeds] = Role(
    name="qa_tool_need",
    input=ToolNeedInput,
    output=ToolNeeds,
    system=_QA
    + "Task: for every sub-question decide whether answering it needs a tool call (it asks for a fact "
    "that only the knowledge base holds) or not (a linguistic operation on answers already known: "
    "evaluation, summarisation, recommendation, ranking, matching, comparison, arithmetic, counting, "
    "format transformation). Ignore the declared needs_tool; judge the question itself.\n"
    'Output: one JSON object {"items": [{"index": int, "needs_tool": bool, "operation": string or null, '
    '"reason": string}, ...]}, one item per sub-question; a no-tool item names its operation.',
    template="Instance:\n{input}\n\nClassify every sub-question.",
)

QA_DEPENDENCY: Role[QaJudgeInput, StepVerdicts] = Role(
    name="qa_dependency",
    input=QaJudgeInput,
    output=StepVerdicts,
    system=_QA + "Task: judge DEPENDENCY CONSISTENCY (DC_i). Score 1 when d_i is exactly right: every listed "
    "dependency's answer is really used by q_i (named in it or needed to answer it), and every earlier "
    "answer q_i uses is listed. Score 0 when a dependency is missing, superfluous, or refers to no "
    "sub-question.\n" + _STEP_OUT,
    template="Instance:\n{input}\n\nJudge d_i of every sub-question.",
)

QA_ATOMICITY: Role[QaJudgeInput, StepVerdicts] = Role(
    name="qa_atomicity",
    input=QaJudgeInput,
    output=StepVerdicts,
    system=_QA
    + "Task: judge SUB-QUESTION ATOMICITY (SA_i). Score 1 when q_i is one indivisible unit: one lookup "
    "of one fact, or one operation. Score 0 when it bundles several requests (e.g. 'what is X and what "
    "is Y', 'the price and the size of ...') that should be separate sub-questions.\n" + _STEP_OUT,
    template="Instance:\n{input}\n\nJudge the atomicity of every sub-question.",
)

QA_SEQUENCE: Role[QaJudgeInput, StepVerdicts] = Role(
    name="qa_sequence",
    input=QaJudgeInput,
    output=StepVerdicts,
    system=_QA
    + "Task: judge SEQUENTIAL RATIONALITY (SR_i). Score 1 when q_i comes after every sub-question it "
    "depends on and is not superfluous (its answer feeds the main answer, directly or through later "
    "steps). Score 0 when it depends on a later step, or when it is a padding step whose answer nothing "
    "uses.\n" + _STEP_OUT,
    template="Instance:\n{input}\n\nJudge the order and necessity of every sub-question.",
)

QA_COMPLETENESS: Role[QaJudgeInput, BinaryJudgement] = Role(
    name="qa_completeness",
    input=QaJudgeInput,
    output=BinaryJudgement,
    system=_QA
    + "Task: judge TASK COMPLETENESS (TC) of the whole instance. Score 1 when the sub-QAs are sufficient "
    "to solve q0: every value a sub-question needs comes from q0 or an earlier answer, every aggregation "
    "is computed correctly from the answers it uses, and a0 is what they yield. Score 0 otherwise (a "
    "skipped step, a wrong aggregation, an a0 the sub-answers do not support).\n"
    'Output: one JSON object {"score": 0 or 1, "reason": string}.',
    template="Instance:\n{input}\n\nAre the sub-QAs sufficient to derive a0 for q0?",
)

QA_JUDGES: tuple[Role[QaJudgeInput, StepVerdicts], ...] = (QA_DEPENDENCY, QA_ATOMICITY, QA_SEQUENCE)
"""The three per-sub-question judges (DC, SA, SR)."""

QA_ROLES: tuple[Role[Any, Any], ...] = (
    QA_SYNTHESIS,
    QA_TOOL_NEED,
    QA_DEPENDENCY,
    QA_ATOMICITY,
    QA_SEQUENCE,
    QA_COMPLETENESS,
)
"""All QA roles (for prompt registration)."""

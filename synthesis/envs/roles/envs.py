"""Environment roles (ASTRA §2.2.3-2.2.4): tool documents, invocations, implementations, merging.

- ``TOOL_SPEC``: an OpenAI function spec for one tool-needing sub-question.
- ``TOOL_SCALING``: the same spec with more optional parameters and wider
  enums (complexity scaling); name and required parameters unchanged.
- ``TOOL_INVOCATION``: one Python call expression answering the sub-question.
- ``TOOL_IMPLEMENTATION``: Python source of the function; it computes the
  answer from ``DATA[<tool name>]`` (the grounded table rows), never from a
  literal answer, so a tampered table makes verification fail.
- ``HOMOGENEOUS_GROUPS``: sub-questions with the same functional intent.
- ``MERGE_INVOCATION``: the call on a base tool that answers an inserted
  sub-question once the two sub-environments are merged.
"""

from __future__ import annotations

import ast
import keyword
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator, model_validator

from arena import pyast
from arena.llm.core import JudgeReason, Role
from arena.records.envs import Cell, Grounding

IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"

__all__ = [
    "ENV_ROLES",
    "HOMOGENEOUS_GROUPS",
    "MERGE_INVOCATION",
    "TOOL_IMPLEMENTATION",
    "TOOL_INVOCATION",
    "TOOL_SCALING",
    "TOOL_SPEC",
    "DependencyContext",
    "HomogeneousGroups",
    "HomogeneousInput",
    "MergeInvocationInput",
    "SubQuestionView",
    "ToolImplementation",
    "ToolImplementationInput",
    "ToolInvocation",
    "ToolInvocationInput",
    "ToolScalingInput",
    "ToolSpec",
    "ToolSpecInput",
]


class ToolSpec(BaseModel):
    """An OpenAI function spec (the ``function`` part of ``{"type": "function", ...}``)."""

    name: Annotated[str, Field(pattern=IDENT, description="Function name: a Python identifier, snake_case.")]
    description: Annotated[
        str, Field(min_length=1, description="What the tool does, its inputs and what it returns.")
    ]
    parameters: Annotated[
        dict[str, Any],
        Field(
            description='JSON Schema of the arguments: {"type": "object", "properties": {...}, '
            '"required": [...]}; property names are Python identifiers.'
        ),
    ]

    @field_validator("name")
    @classmethod
    def _not_keyword(cls, value: str) -> str:
        if keyword.iskeyword(value):
            raise ValueError(f"tool name {value!r} is a Python keyword")
        return value

    @field_validator("parameters")
    @classmethod
    def _object_schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if value.get("type") != "object" or not isinstance(value.get("properties"), dict):
            raise ValueError('parameters must be {"type": "object", "properties": {...}}')
        for name, schema in value["properties"].items():
            if not name.isidentifier() or keyword.iskeyword(name):
                raise ValueError(f"parameter name {name!r} is not a Python identifier")
            if not isinstance(schema, dict):
                raise ValueError(f"parameter {name!r}: schema must be an object")
        required = value.get("required", [])
        if not isinstance(required, list) or any(r not in value["properties"] for r in required):
            raise ValueError("required must list names of declared properties")
        return value

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []))

    @property
    def properties(self) -> dict[str, dict[str, Any]]:
        return dict(self.parameters["properties"])

    def openai(self) -> dict[str, Any]:
        """The tool as sent to an OpenAI-compatible client."""
        return {"type": "function", "function": self.model_dump(mode="json")}

    @classmethod
    def from_openai(cls, tool: dict[str, Any]) -> ToolSpec:
        """Read ``{"type": "function", "function": {...}}`` or a bare function dict."""
        fn = tool.get("function", tool)
        return cls.model_validate(fn)


def _single_call(text: str) -> str:
    """``text`` stripped, if it is exactly one call of a named function; else ValueError."""
    text = text.strip()
    try:
        node = pyast.parse(text, mode="eval").body
    except SyntaxError as exc:
        raise ValueError(f"not a Python expression: {exc.msg}") from exc
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError("must be one call of a named function, e.g. get_x(key='a')")
    return text


class DependencyContext(BaseModel):
    """An earlier sub-question the current one depends on (d_i), with its answer."""

    index: Annotated[int, Field(ge=1, description="Index of the earlier sub-question.")]
    question: Annotated[str, Field(description="Its question.")]
    answer: Annotated[str, Field(description="Its answer, which the current question may mention.")]


class ToolSpecInput(BaseModel):
    """A tool-needing sub-question (q_i, a_i, d_i) and the table that answers it."""

    domain: Annotated[str, Field(description="Domain of the knowledge source.")]
    question: Annotated[str, Field(description="Sub-question q_i the tool must answer.")]
    answer: Annotated[str, Field(description="Its answer a_i (for context; the tool computes it).")]
    dependencies: list[DependencyContext] = Field(
        default_factory=list, description="Sub-questions in d_i with their answers."
    )
    grounding: Annotated[
        Grounding | None, Field(description="The table lookup behind the answer, when known.")
    ] = None
    entity: Annotated[str | None, Field(description="Singular noun of the grounded table's rows.")] = None
    columns: list[str] = Field(default_factory=list, description="Columns of the grounded table.")
    sample_rows: list[dict[str, Cell]] = Field(
        default_factory=list, description="A few rows of the grounded table."
    )


class ToolScalingInput(BaseModel):
    """A tool spec to make richer without changing what it requires."""

    spec: Annotated[ToolSpec, Field(description="The spec to augment.")]
    extra_params: Annotated[int, Field(ge=0, le=8, description="How many optional parameters to add.")]
    columns: list[str] = Field(default_factory=list, description="Columns of the table behind the tool.")


class ToolInvocationInput(BaseModel):
    """A sub-question and the tool to answer it with."""

    question: Annotated[str, Field(description="Sub-question q_i.")]
    spec: Annotated[ToolSpec, Field(description="The tool to call.")]
    grounding: Annotated[
        Grounding | None, Field(description="The lookup behind the answer (its key is the argument).")
    ] = None
    attempt: Annotated[int, Field(ge=1, description="Attempt number, 1 first; later ones follow a failure.")]
    feedback: Annotated[
        str | None, Field(description="What went wrong with the previous attempt, if any.")
    ] = None


class ToolInvocation(BaseModel):
    """One Python call expression."""

    invocation: Annotated[
        str, Field(min_length=3, description="Exactly one call, keyword arguments, e.g. get_x(x_id='a').")
    ]

    @field_validator("invocation")
    @classmethod
    def _call(cls, value: str) -> str:
        return _single_call(value)


class ToolImplementationInput(BaseModel):
    """What the implementation must do and the rows it reads."""

    question: Annotated[str, Field(description="Sub-question q_i.")]
    answer: Annotated[str, Field(description="Answer a_i the invocation's output must contain.")]
    spec: Annotated[ToolSpec, Field(description="The tool document to implement.")]
    invocation: Annotated[str, Field(description="The call that must return a_i.")]
    data_key: Annotated[str, Field(description="The rows are available as DATA[data_key].")]
    grounding: Annotated[Grounding | None, Field(description="The lookup behind the answer.")] = None
    columns: list[str] = Field(default_factory=list, description="Columns of the rows.")
    rows: list[dict[str, Cell]] = Field(default_factory=list, description="The table rows (DATA[data_key]).")
    attempt: Annotated[int, Field(ge=1, description="Attempt number, 1 first.")]
    feedback: Annotated[
        str | None, Field(description="What went wrong with the previous attempt, if any.")
    ] = None


class ToolImplementation(BaseModel):
    """Python source of one tool."""

    code: Annotated[
        str,
        Field(
            min_length=10,
            description="Python source defining the function (top level, named as the spec), reading "
            "DATA[data_key]; standard library only; no I/O, no network.",
        ),
    ]
    rows: list[dict[str, Cell]] = Field(
        default_factory=list,
        description="Only when no rows were given: the records the function reads as DATA[data_key].",
    )

    @field_validator("code")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            pyast.parse(value)
        except SyntaxError as exc:
            raise ValueError(f"code does not parse: {exc.msg} (line {exc.lineno})") from exc
        return value


class SubQuestionView(BaseModel):
    """A tool-needing sub-question with the tool built for it."""

    index: Annotated[int, Field(ge=1, description="Sub-question index.")]
    question: Annotated[str, Field(description="Sub-question q_i.")]
    answer: Annotated[str, Field(description="Its answer.")]
    grounding: Annotated[Grounding | None, Field(description="The lookup behind the answer.")] = None
    tool: Annotated[dict[str, Any], Field(description="Its tool's OpenAI function spec.")]


class HomogeneousInput(BaseModel):
    """The tool-needing sub-questions of one instance."""

    sub_questions: Annotated[list[SubQuestionView], Field(description="Sub-questions and their tools.")]


class HomogeneousGroups(BaseModel):
    """Groups of sub-questions that share one functional intent (e.g. weather for different cities)."""

    groups: Annotated[
        list[list[int]],
        Field(description="Each group: two or more sub-question indices; an index in at most one group."),
    ]
    reason: Annotated[JudgeReason, Field(description="One sentence on what each group shares.")]

    @model_validator(mode="after")
    def _disjoint(self) -> HomogeneousGroups:
        seen: set[int] = set()
        for group in self.groups:
            if len(group) < 2 or len(set(group)) != len(group):
                raise ValueError(f"group {group} must hold two or more distinct indices")
            if seen & set(group):
                raise ValueError(f"index in more than one group: {sorted(seen & set(group))}")
            seen |= set(group)
        return self


class MergeInvocationInput(BaseModel):
    """A sub-question to answer with another sub-question's (base) tool."""

    base: Annotated[ToolSpec, Field(description="The base tool, whose data now holds the inserted rows.")]
    base_example: Annotated[str, Field(description="The invocation that answers the base's own question.")]
    question: Annotated[str, Field(description="The inserted sub-question.")]
    grounding: Annotated[Grounding | None, Field(description="The lookup behind its answer.")] = None


_ENV_COMMON = (
    "You build executable tool environments from decomposed question-answer traces. Every "
    "tool-needing sub-question q_i has an answer a_i found in a table of a knowledge base; a tool is a "
    "Python function that answers such questions by reading the table rows from the global "
    "DATA[<tool name>] (a list of row dicts). When the answer comes from prose (the grounding names a "
    "passage), the rows are passages {id, text} and the tool searches them for the query's words and "
    "returns the best passages.\n"
)

TOOL_SPEC: Role[ToolSpecInput, ToolSpec] = Role(
    name="tool_spec",
    input=ToolSpecInput,
    output=ToolSpec,
    system=_ENV_COMMON
    + "Task: write the tool document (an OpenAI function spec) for a tool that answers the given "
    "sub-question and others like it (same intent, other values). Name it as an action on the "
    "entity (e.g. get_listing_price); parameters are a JSON Schema object whose required "
    "parameters are exactly what a caller must know to look the answer up (usually the key of the "
    "row, whose value the question states); describe what it returns. Do not put the answer in "
    "the spec.\n"
    'Output: one JSON object {"name": string, "description": string, "parameters": {"type": '
    '"object", "properties": {...}, "required": [...]}}.',
    template="Sub-question, its context and the table behind it:\n{input}\n\nReturn the tool spec.",
)

TOOL_SCALING: Role[ToolScalingInput, ToolSpec] = Role(
    name="tool_scaling",
    input=ToolScalingInput,
    output=ToolSpec,
    system=_ENV_COMMON
    + "Task: scale up the complexity of a tool document: add `extra_params` realistic OPTIONAL "
    "parameters (each with a default, e.g. a response format, a language, a flag to include "
    "source details) and widen existing enums with plausible values. Keep the name, every "
    "existing parameter and exactly the same required list.\n"
    'Output: the whole augmented spec as one JSON object {"name", "description", "parameters"}.',
    template="Spec to scale:\n{input}\n\nReturn the augmented spec.",
)

TOOL_INVOCATION: Role[ToolInvocationInput, ToolInvocation] = Role(
    name="tool_invocation",
    input=ToolInvocationInput,
    output=ToolInvocation,
    system=_ENV_COMMON
    + "Task: write the one Python call of the tool that answers the sub-question: the tool's name "
    "with keyword arguments for the required parameters (values as the question states them), "
    "optional ones only when the question asks for them. If `feedback` says an earlier attempt "
    "failed, fix that.\n"
    'Output: one JSON object {"invocation": string}, e.g. {"invocation": "get_x(x_id=\'A-1\')"}.',
    template="Sub-question and tool:\n{input}\n\nReturn the invocation.",
)

TOOL_IMPLEMENTATION: Role[ToolImplementationInput, ToolImplementation] = Role(
    name="tool_implementation",
    input=ToolImplementationInput,
    output=ToolImplementation,
    system=_ENV_COMMON
    + "Task: implement the tool as one top-level Python function named as the spec, with the spec's "
    "parameters (optional ones with their defaults, no **kwargs). It must compute its result from "
    "the rows in DATA[data_key] (match the lookup value case-insensitively) and return a JSON-"
    "serialisable value (a dict naming the returned field, or a short text) that contains the "
    "answer when called with the invocation. Never write the answer as a literal: if a row's value "
    "changes, the output must change. Return an {'error': ...} dict when nothing matches. Standard "
    "library only; no files, network or printing. Keep helpers inside the function. If no rows are "
    "given, also return `rows`: the records the function reads.\n"
    'Output: one JSON object {"code": string, "rows": [...]}.',
    template="Tool to implement:\n{input}\n\nReturn the implementation.",
)

HOMOGENEOUS_GROUPS: Role[HomogeneousInput, HomogeneousGroups] = Role(
    name="homogeneous_groups",
    input=HomogeneousInput,
    output=HomogeneousGroups,
    system=_ENV_COMMON
    + "Task: find homogeneous sub-questions: those with the same functional intent that differ only "
    "in parameter values (e.g. the weather for two cities, the price of two listings), so one tool "
    "can serve them all. Sub-questions asking for different attributes or about different kinds of "
    "entities are not homogeneous. Leave out every sub-question without a partner.\n"
    'Output: one JSON object {"groups": [[index, index, ...], ...], "reason": string}; groups may '
    "be empty.",
    template="Sub-questions and their tools:\n{input}\n\nReturn the homogeneous groups.",
)

MERGE_INVOCATION: Role[MergeInvocationInput, ToolInvocation] = Role(
    name="merge_invocation",
    input=MergeInvocationInput,
    output=ToolInvocation,
    system=_ENV_COMMON
    + "Task: the base tool's data now also holds the rows of another sub-question. Write the one "
    "Python call of the BASE tool (same name, same parameters as base_example uses) that answers "
    "the inserted sub-question.\n"
    'Output: one JSON object {"invocation": string}.',
    template="Base tool and inserted sub-question:\n{input}\n\nReturn the invocation.",
)

ENV_ROLES: tuple[Role[Any, Any], ...] = (
    TOOL_SPEC,
    TOOL_SCALING,
    TOOL_INVOCATION,
    TOOL_IMPLEMENTATION,
    HOMOGENEOUS_GROUPS,
    MERGE_INVOCATION,
)
"""All environment roles (for prompt registration)."""

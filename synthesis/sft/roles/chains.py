"""Tool-chain roles (ASTRA §2.1.2): joint (task, chain) synthesis, chain-conditioned tasks, coherence.

- ``CHAIN_SYNTHESIS``: given a server's tools, invent a realistic task and the
  tool chain that solves it (the chains feed the server's transition graph).
- ``TASK_FROM_CHAIN``: given a chain (a random walk on that graph, or a
  verified chain), write a task whose solution follows it; the argument values
  the task states are returned as slots so dependency verification can check
  them against the text.
- ``CHAIN_COHERENCE``: judge whether a task and a chain belong together.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any

from pydantic import BaseModel, Field

from arena.llm.core import JudgeReason, Role
from arena.records.sft import PromptServer, ServerRef, Slot
from arena.records.tools import NormalizedTool
from synthesis.sft.tool_links import Argument, arguments_to_state


class ChainSynthesisInput(BaseModel):
    """A server to synthesise one (task, chain) pair for."""

    server: PromptServer
    max_length: Annotated[int, Field(ge=1, le=16, description="Most tools the chain may have.")]
    variant: Annotated[
        int,
        Field(ge=0, description="Index of this synthesis for the server; vary the scenario and tools by it."),
    ]


class SynthesizedChain(BaseModel):
    """A task and the tool chain that solves it."""

    task: Annotated[str, Field(min_length=1, description="The user's request, as the user would write it.")]
    chain: Annotated[
        list[str],
        Field(min_length=1, description="Names of the server's tools in the order they are called."),
    ]
    slots: list[Slot] = Field(
        default_factory=list,
        description="Argument values the task states: one per (tool, argument), value verbatim as written.",
    )


class ChainTaskInput(BaseModel):
    """A server and a chain of its tools to write a task for."""

    server: PromptServer
    chain: Annotated[
        list[str],
        Field(min_length=1, description="Tool names in call order; the task's solution follows it."),
    ]
    variant: Annotated[int, Field(ge=0, description="Index of this request; vary the wording by it.")]


class TaskDraft(BaseModel):
    """A task text and the argument values it states."""

    text: Annotated[str, Field(min_length=1, description="The task as a user would ask it.")]
    slots: list[Slot] = Field(
        default_factory=list,
        description="Argument values the text states: one per (tool, argument), value verbatim as written.",
    )


class CoherenceInput(BaseModel):
    """A task and the chain it was paired with."""

    task: Annotated[str, Field(description="The task text.")]
    chain: Annotated[list[NormalizedTool], Field(description="The chain's tools in call order, with docs.")]


class CoherenceVerdict(BaseModel):
    """Whether the task is well posed and the chain is a sensible way to solve it."""

    coherent: Annotated[bool, Field(description="True when task and chain belong together.")]
    reason: Annotated[JudgeReason, Field(description="Why, naming the step or phrase at fault if not.")]


_SLOTS_CONTRACT = (
    'Slots: for every argument value the task text states, one entry {"tool": <tool name>, '
    '"argument": <argument name>, "value": <the value exactly as it appears in the text>}. '
    "Copy the value character for character from the text (same spelling, same date format), so "
    "that it can be found in the text. Do not list values the user does not state."
)

_WHO_KNOWS_WHAT = (
    "What the user states and what they do not:\n"
    "- The user states concrete values for the first tool's required arguments, and for any later "
    "argument a person would know: names, cities, dates, quantities, amounts, e-mail addresses, "
    "choices among allowed values.\n"
    "- The user never states identifiers produced by the system (arguments such as id, *_id, "
    "*_token, uuid) for a step after the first: those come from the output of an earlier tool "
    "(e.g. the id of the hotel the search returned). Describe which result to pick instead "
    '("the cheapest one", "the first match").\n'
    "- Values come from each argument's schema: respect types, enums, formats (YYYY-MM-DD dates, "
    "e-mail), ranges and the examples in the descriptions; keep them plausible and mutually "
    "consistent (a check-out after its check-in)."
)


def tool_names_schema(
    schema: dict[str, Any], names: list[str], *, chain: str | None = None, max_items: int | None = None
) -> dict[str, Any]:
    """``schema`` with every slot's ``tool`` (and the list field ``chain``, if named) limited to
    ``names``: under guided decoding a weak model then cannot name a tool the server lacks."""
    narrowed = copy.deepcopy(schema)
    slot = narrowed.get("$defs", {}).get("Slot", {}).get("properties", {}).get("tool")
    if slot is not None and names:
        slot["enum"] = list(names)
    field = narrowed.get("properties", {}).get(chain or "")
    if field is not None and names:
        field["items"] = {"type": "string", "enum": list(names)}
        if max_items is not None:
            field["maxItems"] = max_items
    return narrowed


def _value_schema(arg: Argument) -> dict[str, Any]:
    """A slot value's schema: a non-empty string, one of the allowed strings for a string enum."""
    allowed = arg.schema.get("enum")
    if isinstance(allowed, list) and allowed and all(isinstance(v, str) and v for v in allowed):
        return {"type": "string", "enum": list(allowed)}
    return {"type": "string", "minLength": 1}


def task_draft_schema(inputs: ChainTaskInput, schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` for a task on ``inputs.chain``: ``slots`` first, exactly one for each argument the
    task must state (``arguments_to_state``: tool and argument fixed), then ``text``.

    Under guided decoding a weak model then cannot leave a needed value out or name an argument
    the chain lacks, and it writes the values before the text that has to state them (a grammar
    follows the schema's property order). Dependency verification still checks the text."""
    narrowed = copy.deepcopy(schema)
    chain = [t for name in inputs.chain if (t := inputs.server.tool(name)) is not None]
    items = [
        {
            "type": "object",
            "properties": {
                "tool": {"type": "string", "const": tool},
                "argument": {"type": "string", "const": arg.name},
                "value": _value_schema(arg),
            },
            "required": ["tool", "argument", "value"],
            "additionalProperties": False,
        }
        for tool, arg in arguments_to_state(chain)
    ]
    slots: dict[str, Any] = {"type": "array", "minItems": len(items), "maxItems": len(items)}
    if items:
        slots["prefixItems"] = items
    narrowed["properties"] = {"slots": slots, "text": narrowed["properties"]["text"]}
    narrowed["required"] = ["slots", "text"]
    narrowed.get("$defs", {}).pop("Slot", None)
    if not narrowed.get("$defs"):
        narrowed.pop("$defs", None)
    return narrowed


def _server_tools(server: ServerRef) -> list[str]:
    return [tool.function.name for tool in server.tools]


CHAIN_SYNTHESIS: Role[ChainSynthesisInput, SynthesizedChain] = Role(
    name="chain_synthesis",
    input=ChainSynthesisInput,
    output=SynthesizedChain,
    system=(
        "You design realistic multi-step tool-use scenarios for one tool server. You receive the "
        "server (name, domain) and its tools as OpenAI function schemas; each tool may also document "
        "its output in `response_schema`. Jointly write (1) a task a real user of this server could "
        "ask and (2) the tool chain that solves it.\n"
        "\n"
        "The chain:\n"
        "- uses only tools of this server, by their exact names, at most `max_length` of them, "
        "usually 2 or more;\n"
        "- every step is needed by the task; no step repeats another without a reason;\n"
        "- each required argument of each step is either stated in the task or produced by an "
        "earlier step's output (a field of its response_schema, also inside arrays: the `hotel_id` "
        "of a search result feeds a later `hotel_id` argument, an `id` of a book search feeds a "
        "`book_id`). Prefer chains where later steps consume earlier outputs;\n"
        "- starts with a tool whose required arguments the user can state.\n"
        "Use `variant` to vary the scenario: different starting tools, goals and values for different "
        "variants.\n"
        "\n"
        f"{_WHO_KNOWS_WHAT}\n"
        "\n"
        "The task is one message from the user, in English, natural and specific, stating every value "
        "the user must provide. It names no tool and no argument key.\n"
        "\n"
        f"{_SLOTS_CONTRACT}\n"
        "\n"
        'Output: one JSON object {"task": string, "chain": [tool name, ...], "slots": '
        '[{"tool": string, "argument": string, "value": string}, ...]} and nothing else.'
    ),
    template="Server and limits:\n{input}\n\nReturn the JSON object with task, chain and slots.",
    narrow=lambda inputs, schema: tool_names_schema(
        schema, _server_tools(inputs.server), chain="chain", max_items=inputs.max_length
    ),
)

TASK_FROM_CHAIN: Role[ChainTaskInput, TaskDraft] = Role(
    name="task_from_chain",
    input=ChainTaskInput,
    output=TaskDraft,
    system=(
        "You write user tasks for a tool-using assistant. You receive a tool server (its tools as "
        "OpenAI function schemas, with `response_schema` describing each tool's output) and a chain: "
        "tool names in call order. Write one task whose natural solution calls exactly these tools in "
        "this order, each step for a reason the task makes clear.\n"
        "\n"
        f"{_WHO_KNOWS_WHAT}\n"
        "\n"
        "Write as the user, in English, in one message: the goal, the concrete values, and how each "
        "step's result is used next. Do not name tools or argument keys; do not explain the solution. "
        "Use `variant` to vary the wording and the scenario.\n"
        "\n"
        f"{_SLOTS_CONTRACT}\n"
        "\n"
        'Output: one JSON object {"text": string, "slots": [{"tool": string, "argument": '
        'string, "value": string}, ...]} and nothing else.'
    ),
    template="Server and chain:\n{input}\n\nReturn the JSON object with text and slots.",
    narrow=task_draft_schema,
)

CHAIN_COHERENCE: Role[CoherenceInput, CoherenceVerdict] = Role(
    name="chain_coherence",
    input=CoherenceInput,
    output=CoherenceVerdict,
    system=(
        "You check whether a user task and a tool chain belong together. You receive the task text "
        "and the chain's tools in call order (OpenAI function schemas with descriptions and "
        "response_schema).\n"
        "\n"
        "The pair is coherent only when all of these hold:\n"
        "- the task is a well-posed request: it asks for something specific, is not empty, "
        "self-contradictory or nonsensical, and contains no template placeholders;\n"
        "- every tool in the chain serves a need the task expresses (its purpose is reflected in the "
        "task's words); a tool the task never calls for makes the pair incoherent;\n"
        "- no tool is called again without a reason (a repeated lookup with nothing new in between is "
        "pointless);\n"
        "- the order makes sense for the task.\n"
        "Judge from the task text and the tool docs only. Do not assume facts the task does not state.\n"
        "\n"
        'Output: one JSON object {"coherent": true|false, "reason": string} and nothing else; the '
        "reason is one or two sentences naming the tool or phrase at fault when incoherent."
    ),
    template="Task and chain:\n{input}\n\nReturn the JSON verdict.",
)

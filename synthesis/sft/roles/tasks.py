"""Task roles (ASTRA §2.1.3): server-only construction, augmentation, scoring.

- ``TASK_FROM_SERVER``: tasks from the server specification alone (coverage).
- ``AUGMENT_TASK``: one variant of a task along one axis (diversity,
  complexity, persona) that keeps the intent, every stated value and the
  language of the original.
- ``SCORE_TASK``: question quality, scenario realism and tool-use necessity,
  each in [0, 1]; the stage keeps a task only when all three reach their
  thresholds (eq. 1).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from arena.llm.core import JudgeReason, Role
from arena.records.sft import AugmentAxis, PromptServer
from arena.records.tools import NormalizedTool
from synthesis.sft.roles.chains import TaskDraft, tool_names_schema

__all__ = [
    "AUGMENT_TASK",
    "SCORE_TASK",
    "TASK_FROM_SERVER",
    "AugmentInput",
    "AugmentedTask",
    "ServerTaskInput",
    "TaskDraft",
    "TaskScoreInput",
    "TaskScores",
]


class ServerTaskInput(BaseModel):
    """A server to write one task for."""

    server: PromptServer
    variant: Annotated[
        int,
        Field(ge=0, description="Index of this task for the server; cover different tools and needs by it."),
    ]


class AugmentInput(BaseModel):
    """A task to rewrite along one augmentation axis."""

    task: Annotated[str, Field(min_length=1, description="The original task text.")]
    language: Annotated[str, Field(description="ISO 639-1 language of the original; the variant keeps it.")]
    axis: Annotated[AugmentAxis, Field(description="diversity, complexity or persona.")]
    tools: Annotated[list[NormalizedTool], Field(description="The server's tools (for plausible additions).")]
    variant: Annotated[int, Field(ge=0, description="Index of this rewrite; vary the rewrite by it.")]


class AugmentedTask(BaseModel):
    """The rewritten task."""

    text: Annotated[str, Field(min_length=1, description="The variant, in the original's language.")]
    persona: Annotated[
        str | None,
        Field(description="For the persona axis: the persona written as (e.g. 'novice'); else null."),
    ] = None


class TaskScoreInput(BaseModel):
    """A candidate task and the tools it is meant to be solved with."""

    task: Annotated[str, Field(description="The task text.")]
    tools: Annotated[list[NormalizedTool], Field(description="The server's tools.")]


class TaskScores(BaseModel):
    """The three task-quality scores of ASTRA §2.1.3."""

    question_quality: Annotated[
        float,
        Field(ge=0, le=1, description="S_qq: clarity, completeness, effectiveness as a real user query."),
    ]
    scenario_realism: Annotated[
        float, Field(ge=0, le=1, description="S_sr: authenticity and plausibility of the scenario.")
    ]
    tool_necessity: Annotated[
        float,
        Field(ge=0, le=1, description="S_tn: tools are needed and fit; not solvable from general knowledge."),
    ]
    rationale: Annotated[JudgeReason, Field(description="One or two sentences justifying the scores.")]


TASK_FROM_SERVER: Role[ServerTaskInput, TaskDraft] = Role(
    name="task_from_server",
    input=ServerTaskInput,
    output=TaskDraft,
    system=(
        "You write realistic requests that users send to an assistant connected to one tool server. "
        "You receive the server (name, domain) and its tools as OpenAI function schemas, with "
        "`response_schema` describing outputs. Write one task that these tools can solve, using one "
        "to three of them.\n"
        "\n"
        "- Cover the server broadly: use `variant` to pick different tools, goals, scenarios and "
        "phrasings (questions, requests, short background then request).\n"
        "- The task states the concrete values the tools need that a user knows (cities, dates, "
        "names, amounts, quantities, choices among allowed values), plausible and consistent with "
        "each argument's schema. It never states identifiers only the system could know unless the "
        "user plausibly owns them (their booking or order number).\n"
        "- Write as the user, in English; do not name tools or argument keys.\n"
        "\n"
        'Slots: for every argument value the text states, one entry {"tool": <tool name>, '
        '"argument": <argument name>, "value": <value exactly as written in the text>}.\n'
        "\n"
        'Output: one JSON object {"text": string, "slots": [{"tool": string, "argument": '
        'string, "value": string}, ...]} and nothing else.'
    ),
    template="Server:\n{input}\n\nReturn the JSON object with text and slots.",
    narrow=lambda inputs, schema: tool_names_schema(schema, [t.function.name for t in inputs.server.tools]),
)

AUGMENT_TASK: Role[AugmentInput, AugmentedTask] = Role(
    name="augment_task",
    input=AugmentInput,
    output=AugmentedTask,
    system=(
        "You rewrite a user task for a tool-using assistant to diversify a training set, along one "
        "axis:\n"
        "- diversity: paraphrase it with different wording, and/or add a preference or a short "
        "personal context, keeping the same intent;\n"
        "- complexity: add requirements (an extra constraint, a preference among options, a "
        "follow-up need such as a summary of specific results) while keeping the core goal;\n"
        "- persona: rewrite it as a specific kind of user would write it (novice, expert, concise, "
        "verbose, hurried, polite, ...); name the persona.\n"
        "\n"
        "Hard constraints:\n"
        "- Write in the same language as the original (`language`, ISO 639-1). Never translate.\n"
        "- Keep every concrete value of the original exactly as written: names, numbers, dates, "
        "amounts, codes, identifiers, e-mail addresses, paths, quoted strings.\n"
        "- Keep the intent and every requirement; add nothing that contradicts them; anything added "
        "must be solvable with the given tools.\n"
        "Use `variant` to vary the rewrite.\n"
        "\n"
        'Output: one JSON object {"text": string, "persona": string or null} and nothing else; '
        "`persona` is set only on the persona axis."
    ),
    template="Task to rewrite:\n{input}\n\nReturn the JSON object with the rewritten text.",
)

SCORE_TASK: Role[TaskScoreInput, TaskScores] = Role(
    name="score_task",
    input=TaskScoreInput,
    output=TaskScores,
    system=(
        "You grade a candidate user task for a tool-using assistant, given the tools (OpenAI function "
        "schemas with output schemas) it should be solved with. Give three scores in [0, 1]:\n"
        "- question_quality: is it a clear, complete, effective request? It states what is wanted and "
        "the concrete values needed; it has a sane length and no template placeholders or garbled "
        "text. A vague request without specifics scores low.\n"
        "- scenario_realism: is the scenario authentic and plausible? Values are believable and "
        "consistent (dates in order, quantities in range, no placeholder values such as 'foo' or "
        "'test'); nothing contradicts itself.\n"
        "- tool_necessity: does answering require these tools? The task is about what the tools act "
        "on and carries values only the tools can resolve (look-ups, bookings, current data). A "
        "question answerable from general knowledge, or one unrelated to the tools, scores low.\n"
        "Grade the text as written; do not reward intentions it does not state.\n"
        "\n"
        'Output: one JSON object {"question_quality": number, "scenario_realism": number, '
        '"tool_necessity": number, "rationale": string} and nothing else; the rationale justifies '
        "the scores in one or two sentences."
    ),
    template="Task and tools:\n{input}\n\nReturn the JSON scores.",
)

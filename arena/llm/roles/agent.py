"""The agent policy role (ASTRA §2.1.4): one assistant turn of the tool-calling loop.

Sent natively (``Role.agent``): the conversation as OpenAI chat messages and the tools as
``tools``; the reply's ``tool_calls`` (or Hermes ``<tool_call>`` text) are the turn's calls. The
JSON contract below is what the rules simulator answers, and what a model that replies with one
JSON object is read by.

The policy sees exactly what a deployed tool-using model sees: the OpenAI chat
messages so far (system prompt, user task, earlier assistant turns and tool
results) and the OpenAI tool schemas. It never sees the tool chain a task was
built from. A turn with tool calls is one (possibly parallel) round; a turn
without tool calls is the final answer.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field

from arena.llm.core import AgentIO, Role, ToolCall, sendable


class AgentTurnInput(BaseModel):
    """The conversation so far and the tools on offer."""

    messages: Annotated[
        list[dict[str, Any]],
        Field(
            description="OpenAI chat messages so far: system prompt, user task, then assistant turns "
            "(with tool_calls) and tool results (role 'tool', tool_call_id, name, content)."
        ),
    ]
    tools: Annotated[
        list[dict[str, Any]],
        Field(
            description="OpenAI tools offered: {'type': 'function', 'function': {name, description, parameters}}."
        ),
    ]


class PlannedCall(BaseModel):
    """One tool call the policy issues."""

    name: Annotated[str, Field(min_length=1, description="Name of one of the offered tools.")]
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="Arguments as a JSON object following the tool's parameter schema."
    )


class AgentTurn(BaseModel):
    """One assistant turn: a tool-call round, or the final answer when ``tool_calls`` is empty."""

    content: Annotated[
        str,
        Field(
            description="With tool calls: a brief statement of what was understood so far and the plan "
            "for this round. Without tool calls: the final answer to the user."
        ),
    ]
    tool_calls: list[PlannedCall] = Field(
        default_factory=list,
        description="Calls to issue now, run in parallel as one round; empty for the final answer.",
    )


def _reply(text: str, calls: list[ToolCall]) -> AgentTurn:
    return AgentTurn(
        content=text, tool_calls=[PlannedCall(name=c.name, arguments=c.arguments) for c in calls]
    )


def _as_reply(turn: AgentTurn) -> tuple[str, list[ToolCall]]:
    return turn.content, [ToolCall(name=c.name, arguments=c.arguments) for c in turn.tool_calls]


NATIVE = AgentIO[AgentTurnInput, AgentTurn](
    conversation=lambda inputs: [sendable(m) for m in inputs.messages],
    tools=lambda inputs: list(inputs.tools),
    reply=_reply,
    inputs_from=lambda messages, tools: AgentTurnInput(messages=messages, tools=tools),
    as_reply=_as_reply,
)
"""The policy speaks the chat API natively: the conversation as sent, tools offered, ``tool_calls``
back; a reply with no call is the final answer. The system prompt is the conversation's own."""

AGENT_POLICY: Role[AgentTurnInput, AgentTurn] = Role(
    name="agent_policy",
    input=AgentTurnInput,
    output=AgentTurn,
    system=(
        "You are a careful tool-using assistant. You receive a conversation (a system prompt, the user's "
        "task, and possibly earlier assistant turns and tool results) and the list of tools you may call, "
        "as OpenAI function schemas. Produce the NEXT assistant turn only.\n"
        "\n"
        "How to act:\n"
        "- Call only tools from the list, with every required argument, following each parameter's type "
        "and allowed values.\n"
        "- Take argument values from the user's task (names, quoted strings, numbers, dates, codes) or "
        "from fields of earlier successful tool results (for example an id returned by a search). Never "
        "invent identifiers or values that appear in neither.\n"
        "- Calls that do not depend on each other's results go into the same turn (they run in "
        "parallel). A call that needs another call's output waits for the next turn.\n"
        "- Never repeat a call that already succeeded with the same arguments. If a call failed with a "
        "transient error (timeout, unreachable), you may retry it once; otherwise adapt or give up on it.\n"
        "- In a turn with tool calls, `content` briefly states what you understood from the task and "
        "from the latest tool results, and what this round does and why.\n"
        "- When no further call is useful, answer: `tool_calls` is empty and `content` is the final "
        "answer. It answers the task in its own terms and reports the key values the tools returned "
        "(names, ids, numbers, dates, yes/no outcomes); say plainly which calls failed. State nothing "
        "the tools did not return.\n"
        "\n"
        'Output: one JSON object {"content": string, "tool_calls": [{"name": string, '
        '"arguments": object}, ...]} and nothing else.'
    ),
    template="Conversation and tools:\n{input}\n\nReturn the next assistant turn as the JSON object.",
    agent=NATIVE,
)

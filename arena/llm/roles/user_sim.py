"""The user-simulator role (EigenData §4.2 DialogSynthesis, §5 RL rollouts): the next user message.

An interactive sample is a dialogue: a simulated user with private instructions
(objective, known information, requirements) talks to the agent being trained.
After every agent message (a turn without tool calls) the simulator sees the
dialogue as the user sees it -- user and agent messages, never the agent's tool
calls or their raw outputs -- plus the actions the agent confirmed so far, and
writes the next user message, or ends the dialogue with one control signal:

- ``stop``: the objective is achieved (the paper's ``###STOP###``);
- ``transfer``: the agent cannot help and hands over to a human (``###TRANSFER###``);
- ``out_of_scope``: the agent needs information the scenario does not give (``###OUT-OF-SCOPE###``).

In the dual-control setting a user may also act through user-only tools; those
calls come with the message and run against the same state as the agent's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.llm.core import Role

UserSignal = Literal["continue", "stop", "transfer", "out_of_scope"]


class DialogueMessage(BaseModel):
    """One message of the dialogue as the user sees it."""

    role: Annotated[Literal["user", "assistant"], Field(description="Who said it.")]
    content: Annotated[str, Field(description="What was said (agent tool calls are not shown).")]


class UserSimInput(BaseModel):
    """The simulated user's scenario and the dialogue so far."""

    instructions: Annotated[
        str,
        Field(description="Private instructions: the user's objective, what they know, what they insist on."),
    ]
    requirements: list[str] = Field(
        default_factory=list,
        description="The instructions' requirements in the order a user brings them up (empty: read them "
        "from the instructions).",
    )
    goal_actions: list[str] = Field(
        default_factory=list,
        description="Names of the state-changing actions the user wants done (e.g. 'cancel_order').",
    )
    completed_actions: list[str] = Field(
        default_factory=list,
        description="State-changing actions the agent has carried out so far, in order (what the user "
        "would see confirmed on their account).",
    )
    dialogue: Annotated[
        list[DialogueMessage],
        Field(description="User and agent messages so far; the last one is the agent's."),
    ]
    user_tools: list[dict[str, Any]] = Field(
        default_factory=list, description="OpenAI specs of tools only the user can call (dual control)."
    )
    turn: Annotated[int, Field(ge=0, description="User replies given so far (the opening message excluded).")]
    max_turns: Annotated[int, Field(ge=1, description="Most user replies before the user gives up.")] = 16


class UserAction(BaseModel):
    """A call of one of the user's own tools."""

    name: Annotated[str, Field(min_length=1, description="Name of one of the user tools.")]
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments as a JSON object.")


class UserTurn(BaseModel):
    """The simulated user's next move."""

    message: Annotated[str, Field(description="The next user message (natural, concise, in character).")]
    signal: Annotated[
        UserSignal,
        Field(
            description="continue: the dialogue goes on; stop: objective achieved; transfer: the agent hands "
            "over to a human; out_of_scope: the agent needs information the scenario does not give."
        ),
    ] = "continue"
    tool_calls: list[UserAction] = Field(
        default_factory=list, description="User-tool calls made before sending the message (dual control)."
    )


USER_SIMULATOR: Role[UserSimInput, UserTurn] = Role(
    name="user_simulator",
    input=UserSimInput,
    output=UserTurn,
    system=(
        "You simulate a customer talking to an AI customer-service agent. You follow your private "
        "instructions exactly and never invent information they do not contain.\n"
        "\n"
        "How to act:\n"
        "- Bring up your requirements one at a time, in order, as a real customer would; answer the agent's "
        "questions with the information your instructions give.\n"
        "- When the agent asks you to confirm an action your instructions want, confirm it.\n"
        "- You cannot see the agent's systems; judge progress only from what the agent tells you and from "
        "the completed actions listed in the input.\n"
        "- If you have user tools and your instructions say you take an action yourself, call that tool.\n"
        "- Keep messages short; no small talk.\n"
        "\n"
        "Control signals (exactly one per reply): signal 'stop' once every goal action is done or the agent "
        "has finished and nothing is left to ask; 'transfer' when the agent hands you over to a human; "
        "'out_of_scope' when the agent needs information your instructions do not contain; otherwise "
        "'continue'.\n"
        "\n"
        'Output: one JSON object {"message": string, "signal": "continue" | "stop" | "transfer" | '
        '"out_of_scope", "tool_calls": [{"name": string, "arguments": object}, ...]} and nothing else.'
    ),
    template="Scenario and dialogue:\n{input}\n\nReturn your next move as the JSON object.",
)

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

In the dual-control setting the user also acts through user-only tools (the app on their
phone, their own device): when the agent asks for an action, the simulator returns the calls with
an empty message; whoever runs the dialogue (the EigenData dialogue loop, an interactive
environment) runs them against the same state as the agent's and asks again with their outputs in
``own_actions``, and the simulator then reports what it saw. ``action_requests`` is the agent's
structured hint (which user tool, pre-filled arguments) when its format has one; ``known_info`` and
``planned_actions`` are what the user knows and means to enter. ``behaviour`` sets the rates of
the paper's user behaviours (incomplete information, changing goals, mistakes).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from arena.llm.core import Role

if TYPE_CHECKING:
    from arena.config import ArenaSettings

UserSignal = Literal["continue", "stop", "transfer", "out_of_scope"]


class DialogueMessage(BaseModel):
    """One message of the dialogue as the user sees it."""

    role: Annotated[Literal["user", "assistant"], Field(description="Who said it.")]
    content: Annotated[str, Field(description="What was said (agent tool calls are not shown).")]


class UserAction(BaseModel):
    """A call of one of the user's own tools."""

    name: Annotated[str, Field(min_length=1, description="Name of one of the user tools.")]
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments as a JSON object.")


class UserActionResult(BaseModel):
    """A user-tool call that ran, and what the user saw."""

    name: Annotated[str, Field(min_length=1, description="Name of the user tool.")]
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments it ran with.")
    ok: Annotated[bool, Field(description="It ran without an error.")]
    output: Any = Field(default=None, description="What it returned, or the error text.")
    turn: Annotated[
        int, Field(ge=0, description="The user reply it belongs to (equal to the input's turn: this reply).")
    ]


class UserBehaviour(BaseModel):
    """Rates of the simulated user's behaviours (EigenData §4.2); 0 turns a behaviour off.

    Draws are seeded by ``seed`` and the scenario, so a dialogue replays identically.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    incomplete_info: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="Chance that a request is stated without the identifiers it contains (known "
            "values such as ids or the email), which the user gives when the agent asks for them.",
        ),
    ] = 0.0
    goal_change: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="Chance that a request is first stated with one detail different and changed "
            "on the user's next reply ('Sorry, I changed my mind: ...').",
        ),
    ] = 0.0
    mistakes: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="Chance that the user's first try of an in-app action mistypes a value it enters "
            "(a digit off); the user enters the right value when asked again.",
        ),
    ] = 0.0
    seed: Annotated[int, Field(ge=0, description="Seed of the behaviour draws.")] = 0

    def happens(self, rate: float, *key: object) -> bool:
        """Whether a behaviour of ``rate`` happens at ``key`` (a pure function of the seed and key,
        so every ask of the same dialogue at the same point draws the same)."""
        if rate <= 0:
            return False
        digest = hashlib.blake2b(json.dumps([self.seed, *map(str, key)]).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < rate


def user_behaviour(settings: ArenaSettings) -> UserBehaviour:
    """The behaviour rates of the ``[user_sim]`` settings."""
    return UserBehaviour.model_validate(settings.user_sim.model_dump())


_EMPTY_BRACKETS = re.compile(r"\(\s*\)")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?])")


def withhold(text: str, values: Sequence[str]) -> str:
    """``text`` without the given values (a request stated without its identifiers)."""
    for value in sorted({v for v in values if len(v) >= 3}, key=len, reverse=True):
        text = text.replace(value, "")
    text = _EMPTY_BRACKETS.sub("", text)
    text = re.sub(r"(?:^|(?<=[.;!?]))[^.;!?]*\b(?:is|are)\s*[.;!?]", "", text)  # "My email is ." goes
    return _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(text.split()))


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
    known_info: dict[str, Any] = Field(
        default_factory=dict, description="What the user knows (identity, ids, the code on their phone)."
    )
    persona: str = Field(default="", description="Who the user is and how they write, e.g. 'hiker (curt)'.")
    planned_actions: list[UserAction] = Field(
        default_factory=list,
        description="In-app actions the user expects to take, with the values they would enter.",
    )
    action_requests: list[UserAction] = Field(
        default_factory=list,
        description="User-tool actions the agent's last message asks for, with the arguments the app "
        "pre-fills (the agent's structured hint; empty when its format has none).",
    )
    own_actions: list[UserActionResult] = Field(
        default_factory=list,
        description="The user's own tool calls so far and what they returned; those of this turn have "
        "just run and are reported in the message.",
    )
    behaviour: UserBehaviour = Field(default_factory=UserBehaviour, description="Behaviour rates.")
    turn: Annotated[int, Field(ge=0, description="User replies given so far (the opening message excluded).")]
    max_turns: Annotated[int, Field(ge=1, description="Most user replies before the user gives up.")] = 16


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
        "- When the agent asks you to do something in your app or on your device and you have a user tool "
        "for it, call that tool with the values you know (pre-filled ones from action_requests as given) "
        "and leave the message empty; you are asked again with the outputs in own_actions (this turn's "
        "have turn equal to the input's turn): then tell the agent briefly what you did and what you saw.\n"
        "- behaviour gives rates: withhold identifiers until asked (incomplete_info), change one detail of a "
        "request on your next reply (goal_change), mistype a value on a first in-app try (mistakes).\n"
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

"""The user simulator's side of an interactive dialogue, as text a policy can learn and produce.

EigenData's accepted dialogues also train the user simulator (``samples.sft`` with
``role_target = user``). The simulated user does not see the agent's tool calls or the policy
document; it sees its private instructions and the visible conversation. So a user-view sample
is: a system message with the user's instructions (and the user tools of dual control), then the
conversation's user and assistant *texts*. A user body carries, in order, the user tools it ran
(``<tool_call>`` blocks, the same layout as the agent's), its message, and on the last turn the
paper's control marker (``###STOP###``, ``###TRANSFER###``, ``###OUT-OF-SCOPE###``).

``user_view_messages`` builds those messages; ``parse_user_turn`` reads a generated user body
back into (message, tool calls, signal), so a policy trained on the former can drive the latter.

An interactive environment asks a ``UserSimulator`` for each user move: ``GatewayUserSimulator``
(the gateway's ``user_simulator`` role: an LLM, or the rules backend) here, or the trainer's
``trainer.user_sim.PolicyUserSimulator`` (a causal LM generating user bodies: the SFT-tuned user
simulator of EigenData §5, run as a frozen copy of the policy at the end of SFT).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, Field

from arena.llm.core import InvalidOutput, Sampling
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import (
    USER_SIMULATOR,
    DialogueMessage,
    UserAction,
    UserActionResult,
    UserBehaviour,
    UserSimInput,
)
from environments.render import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall, parse_assistant

Signal = Literal["continue", "stop", "transfer", "out_of_scope"]

MARKERS: dict[str, str] = {
    "stop": "###STOP###",
    "transfer": "###TRANSFER###",
    "out_of_scope": "###OUT-OF-SCOPE###",
}
"""Control signal -> the marker the user writes to end the dialogue (EigenData appendix prompts)."""


class ViewTurn(BaseModel):
    """One visible turn of a dialogue, from the user's side."""

    role: Annotated[Literal["user", "assistant"], Field(description="Who spoke.")]
    text: Annotated[str, Field(description="What was said.")]
    actions: list[ToolCall] = Field(default_factory=list, description="User tools run with this user turn.")


class ParsedUserTurn(BaseModel):
    """A generated user body, read back."""

    message: Annotated[str, Field(description="The text for the agent (markers and calls removed).")]
    actions: Annotated[list[ToolCall], Field(description="User tools to run before the message.")]
    signal: Annotated[Signal, Field(description="continue, or the control signal written.")]


def user_system_prompt(
    instructions: str, requirements: Sequence[str], user_tools: Sequence[dict[str, Any]]
) -> str:
    """The user simulator's system message: who it is, what it wants, what it can do itself."""
    lines = [
        "You are a customer talking to a support agent. Stay in character; reveal information only "
        "when it is asked for. Instructions: " + instructions.strip(),
    ]
    if requirements and not all(r.strip() in instructions for r in requirements):
        lines.append("Your requests, in order: " + " ".join(r.strip() for r in requirements))
    if user_tools:
        names = ", ".join(str(t["function"]["name"]) for t in user_tools)
        lines.append(
            f"Actions only you can take in your app: {names}. To take one, write "
            f'{TOOL_CALL_OPEN}{{"name": ..., "arguments": {{...}}}}{TOOL_CALL_CLOSE} before your message.'
        )
    lines.append(
        f"When your requests are done, end with {MARKERS['stop']}; if you are handed to a human, "
        f"{MARKERS['transfer']}; if the agent needs something you were not given, {MARKERS['out_of_scope']}."
    )
    return "\n".join(lines)


def user_body(text: str, actions: Sequence[ToolCall], signal: Signal = "continue") -> str:
    """A user turn's text: its tool calls, its message, and its control marker when it ends the dialogue."""
    parts = [
        f"{TOOL_CALL_OPEN}{json.dumps({'name': a.name, 'arguments': a.arguments}, ensure_ascii=False)}"
        f"{TOOL_CALL_CLOSE}"
        for a in actions
    ]
    if text.strip():
        parts.append(text.strip())
    if signal != "continue":
        parts.append(MARKERS[signal])
    return "\n".join(parts)


def user_view_messages(
    instructions: str,
    requirements: Sequence[str],
    user_tools: Sequence[dict[str, Any]],
    turns: Sequence[ViewTurn],
    end_signal: Signal = "continue",
) -> list[dict[str, Any]]:
    """The user-view conversation (see the module docstring); the last user turn carries ``end_signal``."""
    last_user = max((n for n, t in enumerate(turns) if t.role == "user"), default=-1)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": user_system_prompt(instructions, requirements, user_tools)}
    ]
    for n, turn in enumerate(turns):
        if turn.role == "assistant":
            messages.append({"role": "assistant", "content": turn.text})
        else:
            signal: Signal = end_signal if n == last_user else "continue"
            messages.append({"role": "user", "content": user_body(turn.text, turn.actions, signal)})
    return messages


def parse_user_turn(text: str) -> ParsedUserTurn:
    """Read a user body back: tool calls, message, and the first control marker (text after it is dropped)."""
    signal: Signal = "continue"
    cut = len(text)
    for name, marker in MARKERS.items():
        at = text.find(marker)
        if 0 <= at < cut:
            cut, signal = at, name  # type: ignore[assignment]  # MARKERS keys are Signal values
    parsed = parse_assistant(text[:cut])
    return ParsedUserTurn(message=parsed.content, actions=list(parsed.tool_calls), signal=signal)


# --------------------------------------------------------------------------- simulators


class UserContext(BaseModel):
    """What a user simulator knows when it replies: its scenario and the dialogue as it saw it.

    The environment's view of ``arena.llm.roles.user_sim.UserSimInput``, plus the user's own tool
    calls on its past turns (a user-view SFT sample shows them, so a policy simulator must see
    them too).
    """

    instructions: Annotated[str, Field(description="Private instructions of the simulated user.")]
    requirements: list[str] = Field(default_factory=list, description="The requests, in order.")
    goal_actions: list[str] = Field(
        default_factory=list, description="State-changing agent actions the user wants done."
    )
    completed_actions: list[str] = Field(
        default_factory=list, description="State-changing agent actions done so far, in order."
    )
    user_tools: list[dict[str, Any]] = Field(
        default_factory=list, description="OpenAI specs of the tools only the user can call."
    )
    turns: Annotated[
        list[ViewTurn], Field(description="The visible dialogue so far; the last turn is the agent's.")
    ]
    known_info: dict[str, Any] = Field(default_factory=dict, description="What the user knows.")
    persona: str = Field(default="", description="Who the user is and how they write.")
    planned_actions: list[UserAction] = Field(
        default_factory=list, description="In-app actions the user expects to take, with their values."
    )
    own_actions: list[UserActionResult] = Field(
        default_factory=list,
        description="The user's tool calls so far with their outputs (this turn's: just run, to report).",
    )
    action_requests: list[UserAction] = Field(
        default_factory=list,
        description="User tools the agent's last message asks for, with the arguments the app pre-fills "
        "(its structured hint; empty when its format has none).",
    )
    behaviour: UserBehaviour = Field(default_factory=UserBehaviour, description="Behaviour rates.")
    turn: Annotated[int, Field(ge=0, description="User replies given so far (the opening excluded).")]
    max_turns: Annotated[int, Field(ge=1, description="Most user replies before the user gives up.")] = 16

    def sim_input(self) -> UserSimInput:
        """The gateway role's input: the messages, and its own tool calls with their outputs."""
        return UserSimInput(
            instructions=self.instructions,
            requirements=self.requirements,
            goal_actions=self.goal_actions,
            completed_actions=self.completed_actions,
            dialogue=[DialogueMessage(role=t.role, content=t.text) for t in self.turns],
            user_tools=self.user_tools,
            known_info=self.known_info,
            persona=self.persona,
            planned_actions=self.planned_actions,
            own_actions=self.own_actions,
            action_requests=self.action_requests,
            behaviour=self.behaviour,
            turn=self.turn,
            max_turns=self.max_turns,
        )


STOP = ParsedUserTurn(message="", actions=[], signal="stop")
"""A simulator that cannot answer ends the dialogue; the verification function still decides."""


class UserSimulator(Protocol):
    """The user side of an interactive rollout: the next user move given the dialogue so far."""

    kind: str
    """``gateway`` or ``policy``: recorded in the trainer's metrics."""

    async def reply(self, context: UserContext) -> ParsedUserTurn:
        """The user's next message, the user tools it runs first, and its control signal."""
        ...


class GatewayUserSimulator:
    """The gateway's ``user_simulator`` role (an LLM, or the rules backend in tests and the demo)."""

    kind = "gateway"

    def __init__(self, gateway: Gateway, sampling: Sampling | None = None) -> None:
        self.gateway = gateway
        self.sampling = sampling

    async def reply(self, context: UserContext) -> ParsedUserTurn:
        try:
            answer = await self.gateway.call(USER_SIMULATOR, context.sim_input(), self.sampling)
        except InvalidOutput:
            return STOP
        turn = answer.output
        actions = [ToolCall(name=a.name, arguments=dict(a.arguments)) for a in turn.tool_calls]
        return ParsedUserTurn(message=turn.message, actions=actions, signal=turn.signal)

"""The multi-turn episode as one explicit state machine, shared by every policy.

    GENERATE --tool calls--------> TOOLS --fits, turns left, room left--> GENERATE
        |                            '--> DONE (max_length | max_turns)
        |--no tool call, qa--------> DONE (no_tool_call)
        |--no tool call, interactive-> USER --reply fits, turns left, room left--> GENERATE
        |                                '--> DONE (user_stop | max_turns | max_length)
        '--no room for a turn, or cut by the budget--> DONE (max_length)

``TurnLoop`` owns the states and their transitions, the conversation (OpenAI messages) and the
counts a ``Trajectory`` reports; it runs the tool calls and asks the user simulator. What differs
between policies plugs in, by composition:

- ``Generate`` (a function): the next assistant turn as a ``Turn`` (its message, its text, its
  calls and unparseable call blocks), or ``None`` when the context has no room for one. The
  token-level rollout samples the local model (``trainer.rollout``); the endpoint policy asks an
  OpenAI-compatible server (``trainer.endpoint_policy``).
- ``Budget`` (a protocol): the context accounting between turns. An observation or user segment
  is admitted only if it fits, the next turn opens only if room is left, a closed final message
  gets its separator. The token-level rollout counts tokens; an endpoint counts nothing
  (``UNBOUNDED``: the server says when the prompt is too long, and ``Generate`` returns ``None``).

Shared decisions: every emitted call counts in ``tool_calls``, invalid blocks included; calls of
a turn run one after the other, in order (an interactive environment's state is shared between
them), then each unparseable block gets an error observation; ``tool_outputs`` holds the outputs
of successful calls only; calls of the last turn allowed by ``max_turns`` still run.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

from environments.environment import Observation
from environments.rewards import ToolResult

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from arena.records.envs import VerifiedSample
    from environments.environment import Environment

Stop = Literal["no_tool_call", "max_turns", "max_length", "user_stop"]


class State(enum.Enum):
    GENERATE = "generate"
    TOOLS = "tools"
    USER = "user"
    DONE = "done"


class Call(Protocol):
    """A well-formed tool call (``environments.render.ToolCall``, ``arena.llm.roles.agent.PlannedCall``)."""

    @property
    def name(self) -> str: ...

    @property
    def arguments(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class Turn:
    """One generated assistant turn, as the loop needs it."""

    message: dict[str, Any]
    """The assistant message appended to the conversation."""
    content: str = ""
    """Its text outside tool calls: what the user simulator answers."""
    calls: Sequence[Call] = ()
    """Well-formed calls, run in order."""
    invalid: Sequence[str] = ()
    """Raw text of call blocks that did not parse; each gets an error observation."""
    cut: bool = False
    """Cut by the context budget: the turn stays open and the episode ends (``max_length``)."""

    @property
    def emitted(self) -> int:
        """Every call the model emitted, valid or not (the ``c`` of the F1 reward)."""
        return len(self.calls) + len(self.invalid)


Generate: TypeAlias = Callable[[list[dict[str, Any]], int], Awaitable[Turn | None]]
"""Turn number ``turn`` (1-based) for the conversation so far; ``None``: no room for a turn. It may
raise to end the episode (the endpoint's ``TurnFailed``)."""


class Budget(Protocol):
    """The context accounting between turns (the token-level rollout's sequence budget)."""

    def admit_tools(self, outputs: list[str]) -> bool:
        """Add the observation segment of these tool outputs if it fits; whether it did."""
        ...

    def admit_user(self, reply: str) -> bool:
        """Add the user segment of ``reply`` if it fits; whether it did."""
        ...

    def open_turn(self) -> bool:
        """Open the next assistant turn if room is left for it; whether it did."""
        ...

    def close(self) -> None:
        """The episode ends after a closed assistant message: end the context after it."""
        ...


class Unbounded:
    """No context accounting: everything fits (an endpoint's server enforces its own window)."""

    def admit_tools(self, outputs: list[str]) -> bool:
        return True

    def admit_user(self, reply: str) -> bool:
        return True

    def open_turn(self) -> bool:
        return True

    def close(self) -> None:
        return None


UNBOUNDED = Unbounded()


@dataclass(frozen=True)
class Episode:
    """A finished episode: the conversation, what happened in it, why it ended."""

    messages: list[dict[str, Any]]
    """OpenAI messages: the prompt, then every turn."""
    turns: int
    """Assistant turns generated."""
    tool_calls: int
    """Calls emitted, invalid ones included."""
    invalid_calls: int
    """Emitted call blocks that did not parse."""
    failed_calls: int
    """Parsed calls whose observation is an error."""
    user_turns: int
    """User-simulator replies."""
    tool_outputs: list[str]
    """Outputs of the successful calls, in order."""
    tool_results: list[ToolResult]
    """Every executed call (invalid blocks and failed calls included), in order."""
    stop: Stop
    """Why the episode ended."""


@dataclass(kw_only=True)
class TurnLoop:
    """One episode's state machine: ``run`` dispatches on the state until DONE.

    ``generate`` and ``budget`` are the policy's side; the rest is the episode's mutable state.
    """

    env: Environment
    sample: VerifiedSample
    max_turns: int
    generate: Generate
    budget: Budget = UNBOUNDED
    messages: list[dict[str, Any]] = field(init=False)
    turns: int = field(default=0, init=False)
    tool_calls: int = field(default=0, init=False)
    invalid_calls: int = field(default=0, init=False)
    failed_calls: int = field(default=0, init=False)
    user_turns: int = field(default=0, init=False)
    tool_outputs: list[str] = field(default_factory=list, init=False)
    tool_results: list[ToolResult] = field(default_factory=list, init=False)
    turn: Turn | None = field(default=None, init=False)
    """The latest assistant turn."""
    stop: Stop | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.messages = [dict(m) for m in self.sample.prompt]

    async def run(self) -> Episode:
        handlers = {State.GENERATE: self._generate, State.TOOLS: self._tools, State.USER: self._user}
        state = State.GENERATE
        while state is not State.DONE:
            state = await handlers[state]()
        assert self.stop is not None
        return Episode(
            messages=self.messages,
            turns=self.turns,
            tool_calls=self.tool_calls,
            invalid_calls=self.invalid_calls,
            failed_calls=self.failed_calls,
            user_turns=self.user_turns,
            tool_outputs=self.tool_outputs,
            tool_results=self.tool_results,
            stop=self.stop,
        )

    async def _generate(self) -> State:
        """One assistant turn: generate it, record it, route on its calls."""
        turn = await self.generate(self.messages, self.turns + 1)
        if turn is None:
            return self._done("max_length")
        self.turns += 1
        self.messages.append(turn.message)
        if turn.cut:
            return self._done("max_length")
        self.turn = turn
        self.tool_calls += turn.emitted
        self.invalid_calls += len(turn.invalid)
        if turn.emitted:
            return State.TOOLS
        if self.sample.has_user:
            return State.USER
        self.budget.close()
        return self._done("no_tool_call")

    async def _tools(self) -> State:
        """Run the turn's calls in order (invalid blocks get an error observation); each result is a
        ``tool`` message, unless their segment does not fit (then none is kept)."""
        assert self.turn is not None
        observations: list[tuple[str, Observation]] = []
        for i, call in enumerate(self.turn.calls):
            observations.append(
                (f"call_{self.turns}_{i}", await self.env.call(call.name, dict(call.arguments)))
            )
        for j, raw in enumerate(self.turn.invalid):
            text = f"error: invalid tool call (need JSON {{'name': str, 'arguments': object}}): {raw[:200]}"
            observations.append((f"call_{self.turns}_invalid_{j}", Observation(text=text, ok=False, tool="")))
        if not self.budget.admit_tools([o.text for _, o in observations]):
            self.budget.close()
            return self._done("max_length")
        for call_id, obs in observations:
            message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": obs.text}
            message |= ({"name": obs.tool} if obs.tool else {}) | ({} if obs.ok else {"error": True})
            self.messages.append(message)
            self.tool_results.append(ToolResult(name=obs.tool, content=obs.text, ok=obs.ok))
            if obs.ok:
                self.tool_outputs.append(obs.text)
            elif obs.tool:
                self.failed_calls += 1
        return self._next_turn()

    async def _user(self) -> State:
        """Interactive: the simulated user answers the agent's message, or ends the dialogue."""
        assert self.turn is not None
        if self.turns >= self.max_turns:
            self.budget.close()
            return self._done("max_turns")
        reply = await self.env.user_turn(self.turn.content)
        if reply is None:
            self.budget.close()
            return self._done("user_stop")
        if not self.budget.admit_user(reply):
            self.budget.close()
            return self._done("max_length")
        self.messages.append({"role": "user", "content": reply})
        self.user_turns += 1
        return self._next_turn()

    def _next_turn(self) -> State:
        """After an observation or user segment: the next assistant turn, if turns and room remain."""
        if self.turns >= self.max_turns:
            return self._done("max_turns")
        if not self.budget.open_turn():
            return self._done("max_length")
        return State.GENERATE

    def _done(self, stop: Stop) -> State:
        self.stop = stop
        return State.DONE

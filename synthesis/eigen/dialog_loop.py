"""EigenData DialogSynthesis (§4.2): the dialogue loop as an explicit state machine.

    AGENT --tool calls-------------> TOOLS --calls ran in the sandbox--> AGENT
      |--message to the user-------> USER --reply (its app actions ran), continue--> AGENT
      |                                |--stop | transfer | out_of_scope--> DONE (that signal)
      |                                |--max_turns replies given-------> DONE (max_turns)
      |                                '--simulator failed / unusable---> DONE (user_error)
      '--max_agent_steps calls, no message------------------------------> DONE (agent_stuck)

``synthesize_dialog(pack, intent, state, gateway, runner)`` alternates the TrajectoryAgent
(``eigen_trajectory_agent``) and the UserSimulator (``arena.llm.roles.user_sim``, fed the intent's
requirements and goal actions). The dialogue's database lives in one sandbox session for the
whole dialogue (``STATE`` bound from the initial state, the pack's tools loaded; see ``load_tools``
and ``call_tool``), and every agent and user tool call is a call in it (a failing call leaves the
database as it was); the final state is read from it at the end, and the session is closed however
the dialogue ended. The agent acts until it sends a message; the user answers. Dual control: only
the simulator acts for the user (nothing here fills in the user's actions). It sees the agent's
in-app requests (``user_action_requests``, as ``action_requests``), what the user knows
(``known_info``) and means to enter (the intent's user calls, as ``planned_actions``); when it
returns user-tool calls with no message, they run and it is asked again with their outputs
(``own_actions``) -- at most ``MAX_USER_STEPS`` asks per reply -- so its message reports what the
app showed. This is the same exchange as in RL rollouts and evaluation
(``environments.environment.InteractiveEnvironment.user_turn``).

Why a dialogue ended (``Dialog.end_signal``, an ``arena.records.eigen.EndSignal``):

- ``stop`` / ``transfer`` / ``out_of_scope``: the user's control signal (its last message, if any,
  is kept);
- ``max_turns``: the agent answered again after ``max_turns`` user replies (the opening message
  not counted), so the user gets no further move;
- ``agent_stuck``: the agent made ``max_agent_steps`` calls in a row without a message to the user;
- ``user_error``: the user simulator gave no usable move -- the ``user_simulator`` role raised
  ``InvalidOutput`` (every gateway attempt failed: invalid output, ``Undecidable`` rules, transient
  errors), or it replied ``continue`` with neither a message nor a tool call. ``Dialog.error`` says
  what went wrong; nothing of the failed move is in the dialogue. This is not the user ending the
  conversation (``stop``): validation rejects such a dialogue as incomplete. Errors the gateway
  does not retry (a missing rule, HTTP 401) propagate, as they do from the agent role.
"""

from __future__ import annotations

import copy
import enum
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from arena.llm.core import InvalidOutput, Sampling
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import (
    USER_SIMULATOR,
    DialogueMessage,
    UserAction,
    UserActionResult,
    UserBehaviour,
    UserSimInput,
    UserTurn,
)
from arena.records.eigen import Dialog, DialogCall, EndSignal, UserIntent
from environments.environment import MAX_OUTPUT_CHARS, argument_error
from sandbox.env_runtime import EnvSession, Runner
from sandbox.pool import SandboxResult
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.dialogs import (
    EIGEN_TRAJECTORY_AGENT,
    AgentToolCall,
    AppEvent,
    TrajectoryAgentInput,
    dialog_system_message,
)

log = logging.getLogger(__name__)

MAX_TURNS = 12
MAX_AGENT_STEPS = 12
MAX_USER_STEPS = 3
"""Asks of the user simulator per reply: acting (tool calls, no message), then reporting."""


def system_message(pack: DomainPack, state: Mapping[str, Any]) -> str:
    return dialog_system_message(pack.policy_text, str(state.get("today") or ""))


def user_instructions(intent: UserIntent) -> str:
    """The simulated user's private instructions."""
    known = "; ".join(f"{k}: {v}" for k, v in intent.known_info.items())
    return (
        f"You are a {intent.persona.role} ({intent.persona.tone}). Objective: {intent.objective} "
        f"What you know: {known}. Your requests, in order: " + " ".join(intent.requirements)
    )


def opening_message(intent: UserIntent, behaviour: UserBehaviour | None = None) -> str:
    """The reason for the call, with the email unless the user withholds it (``incomplete_info``)."""
    email = intent.known_info.get("email")
    text = intent.reason_for_call.strip()
    rules = behaviour or UserBehaviour()
    if rules.happens(rules.incomplete_info, user_instructions(intent), "incomplete_info", "opening"):
        return text
    return f"{text} My email is {email}." if email and email not in text else text


def planned_actions(intent: UserIntent) -> list[UserAction]:
    """The user's own calls the intent plans (the values the user would enter in the app)."""
    return [
        UserAction(name=call.name, arguments=call.arguments)
        for goal in intent.goals
        for call in goal.calls
        if call.actor == "user"
    ]


def goal_actions(intent: UserIntent) -> list[str]:
    names: list[str] = []
    for goal in intent.goals:
        for call in goal.calls:
            if call.actor == "agent" and call.name not in names:
                names.append(call.name)
    return names


# --------------------------------------------------------------------------- a pack's tools in a session

CALL_HELPER = "_eigen_call"
"""The function loaded with a pack's tools that makes one tool call (a name ``session.call`` accepts)."""
_HELPER_SOURCE = '''
def _eigen_call(tool, arguments, with_state=False):
    """tool(**arguments) on STATE: its value as JSON, whether STATE changed, and STATE when asked and
    changed. Raising on a STATE that is not a JSON object makes the call fail, so it is rolled back."""
    import json
    function = globals().get(tool) if tool.isidentifier() and not tool.startswith("__") else None
    if not callable(function):
        raise NameError(f"name {tool!r} is not defined")
    before = json.loads(json.dumps(STATE))
    value = json.loads(json.dumps(function(**arguments), default=repr))
    if not isinstance(STATE, dict):
        raise TypeError("the tool left STATE not a JSON object")
    after = json.loads(json.dumps(STATE))
    changed = after != before
    return {"value": value, "changed": changed, "state": after if with_state and changed else None}
'''


@dataclass(frozen=True)
class ToolRun:
    """What one tool call did in a session (``result`` is not ok when it failed: nothing changed)."""

    result: SandboxResult
    value: Any = None
    changed: bool = False
    state: dict[str, Any] | None = None
    """STATE after the call, when asked for and changed."""

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def error(self) -> str:
        """``error_type: error`` (the sandbox's words)."""
        result = self.result
        return f"{result.error_type}: {result.error}" if result.error else str(result.error_type)


async def load_tools(
    session: EnvSession,
    tools_source: str,
    state: Mapping[str, Any],
    *,
    space: str = "main",
    timeout_s: float | None = None,
) -> SandboxResult:
    """Bind ``STATE`` to ``state`` in ``space`` and run the pack's tools there (the helper included);
    run again, it starts ``space`` over from ``state``."""
    source = f"{tools_source.rstrip()}\n{_HELPER_SOURCE}"
    return await session.run(source, bind={"STATE": dict(state)}, space=space, timeout_s=timeout_s)


async def call_tool(
    session: EnvSession,
    name: str,
    arguments: Mapping[str, Any],
    *,
    space: str = "main",
    commit: bool = True,
    with_state: bool = False,
    timeout_s: float | None = None,
) -> ToolRun:
    """``name(**arguments)`` on the ``STATE`` of ``space`` (loaded by ``load_tools``); arguments travel as JSON."""
    request = {"tool": name, "arguments": dict(arguments), "with_state": with_state}
    result = await session.call(CALL_HELPER, request, space=space, commit=commit, timeout_s=timeout_s)
    out = result.return_value
    if not result.ok:
        return ToolRun(result)
    if not isinstance(out, dict) or not isinstance(out.get("state"), dict | None):
        missing = result.model_copy(
            update={"ok": False, "error_type": "exception", "error": "the tool call returned no result"}
        )
        return ToolRun(missing)
    return ToolRun(result, out.get("value"), bool(out.get("changed")), out.get("state"))


class _Session:
    """The dialogue's database and call log: the pack's tools and ``STATE`` live in one sandbox
    session for the whole dialogue (opened at the first call; ``close`` ends it)."""

    def __init__(self, pack: DomainPack, state: Mapping[str, Any], runner: Runner, timeout_s: float | None):
        self.pack = pack
        self.runner = runner
        self.timeout_s = timeout_s
        self.initial: dict[str, Any] = json.loads(json.dumps(dict(state)))
        self.calls: list[DialogCall] = []
        self.specs = {
            "agent": {s["function"]["name"]: s for s in pack.agent_tools},
            "user": {s["function"]["name"]: s for s in pack.user_tools},
        }
        self._sandbox: EnvSession | None = None

    async def _live(self) -> EnvSession | str:
        """The loaded session, or why the tools do not load (every call then fails with that).

        A timeout or crash ends a session; the next call gets a new one, rebuilt from the initial
        state by replaying the calls that changed it (so a failed call still changes nothing)."""
        if self._sandbox is not None and self._sandbox.alive:
            return self._sandbox
        await self.close()
        session = await self.runner.open_session(timeout_s=self.timeout_s)
        try:
            problem = await self._load(session)
        except BaseException:
            await session.close()
            raise
        if problem is not None:
            await session.close()
            return problem
        self._sandbox = session
        return session

    async def _load(self, session: EnvSession) -> str | None:
        """Tools and the initial state into ``session``, then the calls so far that changed the state."""
        loaded = await load_tools(session, self.pack.tools_source, self.initial, timeout_s=self.timeout_s)
        if not loaded.ok:
            return ToolRun(loaded).error
        for done in self.calls:
            if done.changed_state:
                replay = await call_tool(session, done.name, done.arguments, timeout_s=self.timeout_s)
                if not replay.ok:
                    raise RuntimeError(
                        f"the dialogue's database could not be rebuilt: {done.name}: {replay.error}"
                    )
        return None

    async def _run(self, name: str, arguments: dict[str, Any]) -> ToolRun | str:
        """The call's run, or why it failed."""
        session = await self._live()
        if isinstance(session, str):
            return session
        run = await call_tool(session, name, arguments, timeout_s=self.timeout_s)
        return run if run.ok else run.error

    async def execute(
        self, name: str, arguments: dict[str, Any], actor: Literal["agent", "user"], index: int
    ) -> DialogCall:
        spec = self.specs[actor].get(name)
        problem: str | None
        if spec is None or not name.isidentifier():
            problem = f"unknown tool {name!r}; available: {sorted(self.specs[actor])}"
        else:
            problem = argument_error(spec, arguments)
        outcome = problem if problem is not None else await self._run(name, arguments)
        fields: dict[str, Any] = {"ok": False, "changed_state": False, "output": f"error: {outcome}"}
        if isinstance(outcome, ToolRun):
            fields = {"ok": True, "changed_state": outcome.changed, "output": outcome.value}
        call = DialogCall(name=name, arguments=arguments, actor=actor, message_index=index, **fields)
        self.calls.append(call)
        return call

    async def final_state(self) -> dict[str, Any]:
        """The database now: the initial state unless a call changed it, else read from the session."""
        if not any(c.changed_state for c in self.calls):
            return copy.deepcopy(self.initial)
        session = await self._live()
        result = await session.read("STATE") if not isinstance(session, str) else None
        if result is None or not result.ok or not isinstance(result.return_value, dict):
            why = session if result is None else ToolRun(result).error
            raise RuntimeError(f"the dialogue's final state could not be read: {why}")
        state: dict[str, Any] = result.return_value
        return state

    async def close(self) -> None:
        """End the session (the next call would open a new one)."""
        if self._sandbox is not None:
            session, self._sandbox = self._sandbox, None
            await session.close()


def _content(call: DialogCall) -> str:
    text = (
        call.output
        if isinstance(call.output, str) and not call.ok
        else json.dumps(call.output, ensure_ascii=False)
    )
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "... [cut]"


# --------------------------------------------------------------------------- the state machine


class DialogState(enum.Enum):
    AGENT = "agent"
    TOOLS = "tools"
    USER = "user"
    DONE = "done"


class _UserFailed(Exception):
    """The user simulator gave no usable move (the message is ``Dialog.error``)."""


@dataclass
class _Run:
    """The mutable state of one dialogue (its database state and call log are the ``_Session``'s)."""

    messages: list[dict[str, Any]]
    dialogue: list[DialogueMessage]
    events: list[AppEvent] = field(default_factory=list)
    turns: int = 0
    """User replies after the opening message."""
    steps: int = 0
    """Agent steps since its last message to the user."""
    n_calls: int = 0
    """Agent tool calls so far (they number the call ids)."""
    pending: list[tuple[str, AgentToolCall]] = field(default_factory=list)
    """The agent's last tool calls, with their ids, for TOOLS to run."""
    requests: list[AgentToolCall] = field(default_factory=list)
    """In-app actions the agent's last message asked the user for."""
    end: EndSignal | None = None
    error: str | None = None

    def done(self, end: EndSignal, error: str | None = None) -> DialogState:
        self.end, self.error = end, error
        return DialogState.DONE


class DialogLoop:
    """One dialogue's transitions; ``run`` drives them from AGENT until DONE.

    ``path`` lists the states visited, in order (DONE last once ``run`` returned).
    """

    def __init__(
        self,
        pack: DomainPack,
        intent: UserIntent,
        state: Mapping[str, Any],
        gateway: Gateway,
        runner: Runner,
        *,
        max_turns: int = MAX_TURNS,
        max_agent_steps: int = MAX_AGENT_STEPS,
        sampling: Sampling | None = None,
        timeout_s: float | None = None,
        behaviour: UserBehaviour | None = None,
    ) -> None:
        self.pack = pack
        self.behaviour = behaviour or UserBehaviour()
        self.intent = intent
        self.gateway = gateway
        self.max_turns = max_turns
        self.max_agent_steps = max_agent_steps
        self.sampling = sampling
        self.today = str(state.get("today") or "")
        self.session = _Session(pack, state, runner, timeout_s)
        self.initial = copy.deepcopy(self.session.initial)
        self.instructions = user_instructions(intent)
        self.goals = goal_actions(intent)
        opening = opening_message(intent, self.behaviour)
        self.run_ = _Run(
            messages=[
                {"role": "system", "content": system_message(pack, state)},
                {"role": "user", "content": opening},
            ],
            dialogue=[DialogueMessage(role="user", content=opening)],
        )
        self.path: list[DialogState] = []
        self.own_actions: list[UserActionResult] = []
        """The user's tool calls so far and what they returned (the simulator's ``own_actions``)."""

    async def run(self) -> Dialog:
        """The dialogue; its sandbox session is closed when it ends, whatever ended it."""
        try:
            await self._walk()
            final = await self.session.final_state()
        finally:
            await self.session.close()
        run = self.run_
        assert run.end is not None
        return Dialog(
            domain=self.pack.name,
            messages=run.messages,
            calls=self.session.calls,
            initial_state=self.initial,
            final_state=final,
            end_signal=run.end,
            turns=run.turns,
            error=run.error,
        )

    async def _walk(self) -> None:
        state = DialogState.AGENT
        self.path.append(state)
        while state is not DialogState.DONE:
            if state is DialogState.AGENT:
                state = await self.agent()
            elif state is DialogState.TOOLS:
                state = await self.tools()
            else:
                state = await self.user()
            self.path.append(state)

    async def agent(self) -> DialogState:
        """One TrajectoryAgent step: tool calls (TOOLS) or a message to the user (USER)."""
        run = self.run_
        if run.steps >= self.max_agent_steps:
            return run.done("agent_stuck")
        run.steps += 1
        inputs = TrajectoryAgentInput(
            policy=self.pack.policy_text,
            today=self.today,
            tools=self.pack.agent_tools,
            user_tools=self.pack.user_tools,
            messages=run.messages,
            app_events=run.events,
            # the rules stand-in's reading of the pack (never sent to a model): packs outside the
            # bundled folder need it
            synthesis=self.pack.synthesis,
            policy_source=self.pack.policy_source,
        )
        answer = await self.gateway.call(EIGEN_TRAJECTORY_AGENT, inputs, self.sampling)
        step = answer.output
        kept = {"reasoning_content": answer.reasoning} if answer.reasoning else {}  # the trace keeps it
        if step.tool_calls:
            ids = [f"call_{run.n_calls + k}" for k in range(len(step.tool_calls))]
            run.n_calls += len(ids)
            run.pending = list(zip(ids, step.tool_calls, strict=True))
            run.messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    **kept,
                    "tool_calls": [
                        {
                            "id": i,
                            "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                        }
                        for i, c in run.pending
                    ],
                }
            )
            return DialogState.TOOLS
        text = str(step.message)
        run.messages.append({"role": "assistant", "content": text, **kept})
        run.dialogue.append(DialogueMessage(role="assistant", content=text))
        run.requests = step.user_action_requests
        run.steps = 0
        return DialogState.USER

    async def tools(self) -> DialogState:
        """Run the agent's calls in order; each output becomes a tool message."""
        run = self.run_
        for call_id, call in run.pending:
            done = await self.session.execute(call.name, call.arguments, "agent", len(run.messages))
            run.messages.append(
                {"role": "tool", "tool_call_id": call_id, "name": call.name, "content": _content(done)}
            )
        run.pending = []
        return DialogState.AGENT

    async def user(self) -> DialogState:
        """The simulated user answers the agent's message (its app actions first), or ends the dialogue."""
        run = self.run_
        if run.turns >= self.max_turns:
            return run.done("max_turns")
        index = len(run.messages)
        try:
            for _ in range(MAX_USER_STEPS):
                turn = await self._ask_user()
                for action in turn.tool_calls:
                    await self._act(action, index)
                if turn.message.strip() or turn.signal != "continue":
                    break
            else:
                raise _UserFailed(f"user simulator acted {MAX_USER_STEPS} times without a message")
        except _UserFailed as exc:
            log.warning("dialogue for %r ended on a user-simulator error: %s", self.intent.objective, exc)
            return run.done("user_error", str(exc))
        if turn.signal != "continue":
            if turn.message.strip():
                run.messages.append({"role": "user", "content": turn.message})
            return run.done(turn.signal)
        run.messages.append({"role": "user", "content": turn.message})
        run.dialogue.append(DialogueMessage(role="user", content=turn.message))
        run.turns += 1
        return DialogState.AGENT

    async def _act(self, action: UserAction, index: int) -> None:
        """Run one user-tool call in the dialogue's session: the agent sees it as an app event, the
        user what it returned (``own_actions``)."""
        done = await self.session.execute(action.name, dict(action.arguments), "user", index)
        self.run_.events.append(
            AppEvent(
                name=done.name, arguments=done.arguments, ok=done.ok, output=done.output, after_message=index
            )
        )
        self.own_actions.append(
            UserActionResult(
                name=done.name, arguments=done.arguments, ok=done.ok, output=done.output, turn=self.run_.turns
            )
        )

    async def _ask_user(self) -> UserTurn:
        """The ``user_simulator`` role's next move; ``_UserFailed`` when it gave none to use."""
        run = self.run_
        inputs = UserSimInput(
            instructions=self.instructions,
            requirements=self.intent.requirements,
            goal_actions=self.goals,
            completed_actions=[c.name for c in self.session.calls if c.actor == "agent" and c.changed_state],
            dialogue=run.dialogue,
            user_tools=self.pack.user_tools,
            known_info=self.intent.known_info,
            persona=f"{self.intent.persona.role} ({self.intent.persona.tone})",
            planned_actions=planned_actions(self.intent),
            action_requests=[UserAction(name=r.name, arguments=r.arguments) for r in run.requests],
            own_actions=self.own_actions,
            behaviour=self.behaviour,
            turn=run.turns,
            max_turns=self.max_turns,
        )
        try:
            turn = (await self.gateway.call(USER_SIMULATOR, inputs, self.sampling)).output
        except InvalidOutput as exc:
            raise _UserFailed(f"user simulator failed: {exc}") from exc
        if turn.signal == "continue" and not turn.message.strip() and not turn.tool_calls:
            raise _UserFailed("user simulator reply unusable: continue with no message and no tool call")
        return turn


async def synthesize_dialog(
    pack: DomainPack,
    intent: UserIntent,
    state: Mapping[str, Any],
    gateway: Gateway,
    runner: Runner,
    *,
    max_turns: int = MAX_TURNS,
    max_agent_steps: int = MAX_AGENT_STEPS,
    sampling: Sampling | None = None,
    timeout_s: float | None = None,
    behaviour: UserBehaviour | None = None,
) -> Dialog:
    """One dialogue on ``state`` for ``intent`` (see the module docstring)."""
    loop = DialogLoop(
        pack,
        intent,
        state,
        gateway,
        runner,
        max_turns=max_turns,
        max_agent_steps=max_agent_steps,
        sampling=sampling,
        timeout_s=timeout_s,
        behaviour=behaviour,
    )
    return await loop.run()

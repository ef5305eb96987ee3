"""Per-instance environments a rollout acts in (ASTRA §3.1, EigenData §5), run in the sandbox.

An environment offers tools, executes one tool call at a time in the sandbox and turns whatever
happens into an ``Observation`` (a failure is an observation with ``ok=False``, never an
exception), answers agent messages through a simulated user (interactive samples), and scores a
finished trajectory. One instance per rollout: nothing is shared between instances.

Each instance lives in at most one sandbox session (``sandbox.env_runtime.EnvSession``), opened on
its first call, so an instance that never calls holds no pool slot; ``close()`` ends it and must be
called when the episode is over (the rollout engine does). A session that died (timeout, crash) is
replaced by a fresh one, loaded again (an interactive one replays its state-changing calls).

- ``QaEnvironment`` (``kind="qa"``): the sample's ``EnvPackage`` -- lookup functions over a
  data table -- plus mixed-in tools from other packages, each run against its own package.
  Reward: F1 over the trajectory's tool outputs (ASTRA eq. 30-31), or recall/precision only.
- ``InteractiveEnvironment`` (``kind="interactive"``): an ``InteractiveSpec`` -- a JSON state,
  tool functions that read and change it, a user with private instructions played by a
  ``trainer.user_sim.UserSimulator`` (the gateway's role, or the SFT-tuned policy), and a
  verification function. Reward: 1 when ``verify(initial, final, calls)`` passes, else 0.

QA execution contract. Each package used (the sample's own, each mixed-in one) is loaded once
into its own namespace (``space`` = its env_id) of the session (``sandbox.env_runtime.load_package``)::

    import json
    <package.code>        # DATA bound beforehand: the package's data (keys sorted)

and each tool call is ``tool(**arguments)`` there, not committed: every call sees the package as
loaded, as if it ran alone (``sandbox.env_runtime.call_program`` is the one-program form).

Interactive execution contract. The session's main space holds ``STATE`` (bound from the spec's
initial state), then runs::

    import json
    <spec.code>
    <a helper calling tool(**arguments) and reporting its value and whether STATE changed>

Each call goes through the helper: the value comes back, the state stays in the session. A call
that raises leaves the state as it was (calls are atomic: the session rolls failed requests back);
the state is read back into ``self.state`` when needed (``read_state``: before verification, on
close). Verification runs, in another space of the same session and not committed::

    import json
    <spec.verify>
    verify(<initial>, <final>, <calls>)      # the three bound as JSON values

which must return ``{"pass": bool, "reward": float, "components": {name: number}}``; ``calls`` is
the list of executed calls as ``CallRecord`` dicts (name, arguments, actor, ok, changed_state).
``state_program`` and ``verify_program`` are the same contract as one program each (for callers
without a session).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arena.llm.core import Sampling
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import DialogueMessage, UserAction, UserActionResult, UserBehaviour, UserSignal
from arena.records.eigen import CallRecord
from arena.records.envs import EnvPackage, VerifiedSample
from arena.records.tools import tool_name
from environments.render import ToolCall
from environments.rewards import RewardMode, ToolResult, f1_reward, reward_value
from environments.user_view import GatewayUserSimulator, UserContext, UserSimulator, ViewTurn
from sandbox.env_runtime import EnvSession, Runner, load_package, output_text
from sandbox.pool import SandboxResult, SandboxUnavailable


class Trajectory(Protocol):
    """What an environment's reward reads of a finished rollout (``trainer.rollout.Trajectory``)."""

    @property
    def tool_calls(self) -> int:
        """Calls emitted, invalid ones included (the ``c`` of the F1 reward)."""
        ...

    @property
    def tool_results(self) -> list[ToolResult]:
        """Every executed call (failed ones included), in order."""
        ...


MAX_OUTPUT_CHARS = 8192
"""Observations are cut to this many characters (the sandbox caps output at 64 KiB)."""


class Observation(BaseModel):
    """What the agent sees after one tool call."""

    text: Annotated[str, Field(description="Tool output (stdout + return value JSON), or the error text.")]
    ok: Annotated[bool, Field(description="The call ran and returned; False for any failure.")]
    tool: Annotated[str, Field(description="Name of the tool called (as the model wrote it).")]


class Environment(Protocol):
    """One isolated environment instance for one rollout."""

    tools: list[dict[str, Any]]
    """OpenAI tool specs offered to the agent (mixed-in tools included)."""

    async def call(self, name: str, arguments: dict[str, Any]) -> Observation:
        """Execute one tool call; failures come back as ``ok=False`` observations."""
        ...

    async def user_turn(self, assistant_text: str) -> str | None:
        """The user's reply to an agent message (a turn without tool calls); None: the user stops."""
        ...

    async def reward(self, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        """Scalar reward of a finished trajectory of this instance, and its parts."""
        ...

    async def close(self) -> None:
        """End the instance's sandbox session if one is open (idempotent); call it when the episode is over."""
        ...


def argument_error(spec: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` cannot be a call of ``spec`` (missing required or unknown names), else None.

    Types are left to the tool code: it runs in the sandbox, and a wrong type fails there.
    """
    params = spec.get("function", spec).get("parameters") or {}
    properties = params.get("properties") or {}
    missing = [p for p in params.get("required") or [] if p not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(map(repr, missing))}"
    if properties and params.get("additionalProperties") is not True:
        unknown = [a for a in arguments if a not in properties]
        if unknown:
            return f"unknown argument(s) {', '.join(map(repr, unknown))}; parameters: {sorted(properties)}"
    return None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [cut at {limit} characters]"


def _failure(result: SandboxResult) -> str:
    return f"{result.error_type}: {result.error}" if result.error else str(result.error_type)


def load_source(code: str, line_2: str = "") -> str:
    """``code`` as a session loads it: json imported and the code from line 3, as in the one-program
    contract (so tracebacks and syntax errors keep their line numbers); ``line_2``: one statement
    run before the code."""
    return f"import json\n{line_2}\n{code.rstrip()}\n"


Loader = Callable[[EnvSession], Awaitable[SandboxResult]]
"""Loads one space of a fresh session (its code and data)."""


class SessionHolder:
    """The one sandbox session of an environment instance, opened on first use.

    Never more than one per instance: an instance waiting for a second slot while holding one can
    deadlock a small pool. Each space is loaded once per session; a failed load is not retried in
    that session (the same code would fail the same way)."""

    def __init__(self, runner: Runner, timeout_s: float | None) -> None:
        self.runner = runner
        self.timeout_s = timeout_s
        self.session: EnvSession | None = None
        self._loaded: dict[str, str | None] = {}
        """Space -> None when loaded, else why its load failed."""
        self._lock = asyncio.Lock()

    async def get(self) -> EnvSession | str:
        """The live session (a new one when there is none, or it died), or why there is none."""
        async with self._lock:
            return await self._open()

    async def space(self, name: str, load: Loader) -> EnvSession | str:
        """The live session with space ``name`` loaded by ``load``, or why it cannot run calls there."""
        async with self._lock:
            session = await self._open()
            if isinstance(session, str):
                return session
            if name not in self._loaded:
                result = await load(session)
                self._loaded[name] = None if result.ok else _failure(result)
            problem = self._loaded[name]
            return session if problem is None else problem

    async def _open(self) -> EnvSession | str:
        if self.session is not None and self.session.alive:
            return self.session
        await self.close()  # a dead one (timeout, crash) still holds its slot until closed
        try:
            self.session = await self.runner.open_session(timeout_s=self.timeout_s)
        except SandboxUnavailable as exc:
            return f"sandbox_error: {exc}"
        return self.session

    async def close(self) -> None:
        """Close the session (its pool slot is free again); a later ``get`` opens a new one."""
        session, self.session, self._loaded = self.session, None, {}
        if session is not None:
            await session.close()


def read_verdict(result: SandboxResult) -> Verdict | str:
    """The ``Verdict`` a run of ``verify_program`` returned, or why there is none (error text)."""
    if not result.ok:
        return _failure(result)
    try:
        return Verdict.model_validate(result.return_value)
    except ValidationError as exc:
        return f"verify returned {str(result.return_value)[:200]!r}: {exc.error_count()} error(s)"


# --------------------------------------------------------------------------- QA environments


class QaEnvironment:
    """A QA sample's package (and mixed-in tools from other packages) behind the Environment Protocol."""

    def __init__(
        self,
        sample: VerifiedSample,
        package: EnvPackage,
        runner: Runner,
        extras: Mapping[str, EnvPackage] | None = None,
        *,
        tools: Sequence[dict[str, Any]] | None = None,
        mode: RewardMode = "f1",
        timeout_s: float | None = None,
        max_output_chars: int = MAX_OUTPUT_CHARS,
    ) -> None:
        """``extras``: mixed-in tool name -> the package implementing it; ``tools``: the offered list
        (default: the sample's tools plus the extras' specs, in that order)."""
        if sample.kind != "qa":
            raise ValueError(f"QaEnvironment needs a qa sample, got {sample.kind!r}")
        self.sample = sample
        self.package = package
        self.runner = runner
        self.extras = dict(extras or {})
        self.mode: RewardMode = mode
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.jobs: list[dict[str, Any]] = list(sample.reward_spec.get("jobs") or [])
        own = {tool_name(t): t for t in package.tools}
        self.irrelevant = frozenset(n for n in self.extras if n not in own)
        """Mixed-in tools: a call to one never solves a sub-task."""
        self._routes: dict[str, tuple[EnvPackage, dict[str, Any]]] = {n: (package, t) for n, t in own.items()}
        for name, extra in self.extras.items():
            spec = next((t for t in extra.tools if tool_name(t) == name), None)
            if spec is None:
                raise ValueError(f"mixed-in tool {name!r} is not a tool of package {extra.env_id}")
            self._routes.setdefault(name, (extra, spec))
        if tools is None:
            offered = list(sample.tools)
            names = {tool_name(t) for t in offered}
            offered += [spec for n, (_pkg, spec) in self._routes.items() if n not in names]
            tools = offered
        self.tools: list[dict[str, Any]] = list(tools)
        self._offered = {tool_name(t) for t in self.tools}
        self._held = SessionHolder(runner, timeout_s)

    async def call(self, name: str, arguments: dict[str, Any]) -> Observation:
        route = self._routes.get(name) if name in self._offered else None
        if route is None:
            return Observation(
                text=f"error: unknown tool {name!r}; available: {sorted(self._offered)}", ok=False, tool=name
            )
        package, spec = route
        problem = argument_error(spec, arguments)
        if problem is not None:
            return Observation(text=f"error: {name}: {problem}", ok=False, tool=name)
        session = await self._held.space(
            package.env_id, lambda s: load_package(s, package, space=package.env_id)
        )
        if isinstance(session, str):
            return Observation(text=f"error: {session}", ok=False, tool=name)
        # Not committed: every call sees the package as loaded, as when each call was its own program.
        result = await session.call(name, dict(arguments), space=package.env_id, commit=False)
        if not result.ok:
            return Observation(text=f"error: {_failure(result)}", ok=False, tool=name)
        return Observation(text=_cut(output_text(result), self.max_output_chars), ok=True, tool=name)

    async def user_turn(self, assistant_text: str) -> str | None:
        return None  # a QA sample has no user after the question: a final answer ends the rollout

    async def close(self) -> None:
        await self._held.close()

    async def reward(self, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        """F1 (or recall / precision) of ``arena.tool_reward`` over the executed calls; c = every emitted call."""
        parts = f1_reward(
            self.jobs, trajectory.tool_results, trajectory.tool_calls, irrelevant=self.irrelevant
        )
        return reward_value(parts, self.mode), {k: float(v) for k, v in parts.model_dump().items()}


# --------------------------------------------------------------------------- interactive


class InteractiveSpec(BaseModel):
    """``VerifiedSample.reward_spec`` of an interactive sample (EigenData §4.2 outputs)."""

    model_config = ConfigDict(extra="allow")

    initial_state: Annotated[
        dict[str, Any], Field(description="The database before the dialogue, a JSON object (STATE).")
    ]
    code: Annotated[
        str,
        Field(
            description="Python source defining one function per agent (and user) tool; the functions read "
            "and change the global dict STATE, return JSON-able values and raise on refused actions."
        ),
    ]
    verify: Annotated[
        str,
        Field(
            description="Python source defining verify(initial_state, final_state, calls) -> "
            "{'pass': bool, 'reward': float, 'components': {name: number}}."
        ),
    ]
    user_instructions: Annotated[
        str, Field(description="The simulated user's private instructions (objective, known info).")
    ]
    requirements: list[str] = Field(
        default_factory=list,
        description="The instructions' requirements in the order the user raises them; the sample's "
        "opening user message states the first. Empty: the sentences of user_instructions.",
    )
    goal_actions: list[str] = Field(
        default_factory=list,
        description="Names of the state-changing agent tools the user wants called (the user stops once "
        "all are done).",
    )
    user_tools: list[dict[str, Any]] = Field(
        default_factory=list,
        description="OpenAI specs of tools only the user can call (dual control), implemented in code.",
    )
    max_user_turns: Annotated[int, Field(ge=1, le=64, description="Most user replies per dialogue.")] = 16
    known_info: dict[str, Any] = Field(
        default_factory=dict, description="What the simulated user knows (identity, ids, codes), as facts."
    )
    persona: str = Field(default="", description="Who the simulated user is and how they write.")
    user_plan: list[UserAction] = Field(
        default_factory=list,
        description="The user's own in-app actions with the values it would enter; empty: the user-actor "
        "calls of the instance's reference_calls, when it has them.",
    )

    def planned_actions(self) -> list[UserAction]:
        """``user_plan``, else the user's calls among the reference calls (an ``build_instance`` extra)."""
        if self.user_plan:
            return list(self.user_plan)
        reference = (self.model_extra or {}).get("reference_calls") or []
        return [
            UserAction(name=str(c["name"]), arguments=dict(c.get("arguments") or {}))
            for c in reference
            if isinstance(c, dict) and c.get("actor") == "user" and c.get("name")
        ]


MAX_USER_STEPS = 3
"""Asks of the user simulator per reply: acting (user-tool calls, no message), then reporting."""


class Verdict(BaseModel):
    """What a verification function returns."""

    model_config = ConfigDict(populate_by_name=True)

    passed: Annotated[bool, Field(alias="pass", description="The final state and calls meet the task.")]
    reward: Annotated[float, Field(description="The function's own reward (informational).")] = 0.0
    components: dict[str, float] = Field(default_factory=dict, description="Component scores.")


def state_program(state: Mapping[str, Any], code: str, tool: str, arguments: Mapping[str, Any]) -> str:
    """The program that runs ``tool(**arguments)`` against ``state`` (see the module docstring)."""
    if not tool.isidentifier():
        raise ValueError(f"not a tool name: {tool!r}")
    payload = json.dumps(dict(state), ensure_ascii=False)
    args = json.dumps(dict(arguments), ensure_ascii=False)
    # State and arguments travel as JSON string literals: model-written values never become code.
    return (
        f"import json\nSTATE = json.loads({payload!r})\n{code.rstrip()}\n"
        f"_arena_value = {tool}(**json.loads({args!r}))\n"
        "{'value': json.loads(json.dumps(_arena_value, default=repr)), "
        "'state': json.loads(json.dumps(STATE))}\n"
    )


STATE_ERROR = "the tool left STATE not a JSON object"
MAIN_SPACE = "main"
VERIFY_SPACE = "verify"
CALL_HELPER = "_arena_call"
CALL_HELPER_SOURCE = f"""

class _ArenaStateError(Exception):
    pass


def _arena_state_json():
    try:
        return json.dumps(STATE, sort_keys=True, allow_nan=False)
    except TypeError:  # keys of mixed types do not sort; a value that is not JSON raises below
        return json.dumps(STATE, allow_nan=False)


def {CALL_HELPER}(tool, arguments):
    global _arena_last
    function = globals().get(tool)
    if not callable(function):
        raise NameError(f"name {{tool!r}} is not defined")
    try:
        value = function(**arguments)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
        raise _ArenaStateError({STATE_ERROR!r}) from None
    if not isinstance(STATE, dict):
        raise _ArenaStateError({STATE_ERROR!r})
    value = json.loads(json.dumps(value, default=repr, allow_nan=False))
    now = _arena_state_json()
    changed, _arena_last = now != _arena_last, now
    return {{"value": value, "changed": changed}}
"""
"""Loaded after ``spec.code``: runs one tool and says whether STATE changed, so the state stays in the
session. ``_arena_last`` is STATE's JSON after the last call (one encoding per call; a failed call
restores it with the state). Raising on a STATE that is not a JSON object (as the one-program
contract failed such a call) makes the session roll the call back."""


class StateLost(RuntimeError):
    """The environment's state cannot be read (no sandbox, or its session could not be rebuilt)."""


def verify_program(
    verify: str, initial: Mapping[str, Any], final: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]
) -> str:
    """The program that runs ``verify(initial, final, calls)``."""
    literals = [json.dumps(v, ensure_ascii=False) for v in (dict(initial), dict(final), list(calls))]
    loads = ", ".join(f"json.loads({v!r})" for v in literals)
    return f"import json\n{verify.rstrip()}\nverify({loads})\n"


class InteractiveEnvironment:
    """An interactive sample: stateful tools in the sandbox, a simulated user, a verification function."""

    def __init__(
        self,
        sample: VerifiedSample,
        runner: Runner,
        user: UserSimulator | Gateway,
        *,
        sampling: Sampling | None = None,
        timeout_s: float | None = None,
        max_output_chars: int = MAX_OUTPUT_CHARS,
        behaviour: UserBehaviour | None = None,
    ) -> None:
        """``user``: the user simulator; a ``Gateway`` means its ``user_simulator`` role (with
        ``sampling``), as before simulators were pluggable. ``behaviour``: the simulated user's
        behaviour rates (``[user_sim]`` settings; default all off)."""
        if sample.kind != "interactive":
            raise ValueError(f"InteractiveEnvironment needs an interactive sample, got {sample.kind!r}")
        self.sample = sample
        self.spec = InteractiveSpec.model_validate(sample.reward_spec)
        self.runner = runner
        self.user: UserSimulator = GatewayUserSimulator(user, sampling) if isinstance(user, Gateway) else user
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.tools: list[dict[str, Any]] = list(sample.tools)
        self._agent_tools = {tool_name(t): t for t in self.tools}
        self._user_tools = {tool_name(t): t for t in self.spec.user_tools}
        self.initial_state: dict[str, Any] = copy.deepcopy(self.spec.initial_state)
        self.state: dict[str, Any] = copy.deepcopy(self.spec.initial_state)
        """The state as last read from the session (``read_state``; final after ``reward``/``close``)."""
        self._stale = False
        """Calls (or loading the code) changed the session's STATE since ``state`` was read."""
        self._read_at = 0
        """``len(calls)`` when ``state`` was read: the later state-changing calls rebuild a session."""
        self._held = SessionHolder(runner, timeout_s)
        self.calls: list[CallRecord] = []
        self.view: list[ViewTurn] = [
            ViewTurn(role="user", text=str(m.get("content") or ""), actions=[])
            for m in sample.prompt
            if m.get("role") == "user"
        ]
        """The dialogue as the user saw it: messages, and the user tools run with each user turn."""
        self.user_replies = 0
        self.behaviour = behaviour or UserBehaviour()
        self.user_actions: list[UserActionResult] = []
        """The user's tool calls and what each returned (the simulator reports them)."""
        self.signal: UserSignal | None = None
        """The user's last control signal (None until the user has replied)."""

    async def call(self, name: str, arguments: dict[str, Any]) -> Observation:
        return await self._execute(name, arguments, "agent")

    async def _execute(
        self, name: str, arguments: dict[str, Any], actor: Literal["agent", "user"]
    ) -> Observation:
        offered = self._agent_tools if actor == "agent" else self._user_tools
        spec = offered.get(name)
        if spec is None or not name.isidentifier():
            return Observation(
                text=f"error: unknown tool {name!r}; available: {sorted(offered)}", ok=False, tool=name
            )
        problem = argument_error(spec, arguments)
        if problem is not None:
            return self._record(name, arguments, actor, f"error: {name}: {problem}")
        session = await self._held.space(MAIN_SPACE, self._load)
        if isinstance(session, str):
            return self._record(name, arguments, actor, f"error: {session}")
        result = await session.call(CALL_HELPER, {"tool": name, "arguments": dict(arguments)})
        if not result.ok:
            error = STATE_ERROR if result.error == f"_ArenaStateError: {STATE_ERROR}" else _failure(result)
            return self._record(name, arguments, actor, f"error: {error}")
        out = result.return_value if isinstance(result.return_value, dict) else {}
        changed = out.get("changed") is not False  # not known: count it changed, so it is read back
        self._stale |= changed
        text = result.stdout + json.dumps(out.get("value"), ensure_ascii=False)
        self.calls.append(
            CallRecord(name=name, arguments=arguments, actor=actor, ok=True, changed_state=changed)
        )
        return Observation(text=_cut(text, self.max_output_chars), ok=True, tool=name)

    async def _load(self, session: EnvSession) -> SandboxResult:
        """STATE bound from ``state``, then the spec's code and the call helper, then the calls that
        changed the state since it was read, replayed: a session that died (a timeout, a crash) is
        rebuilt with nothing of the episode lost (as long as the tools are deterministic).

        The code may change STATE as it loads (as it did before every call): the run's value says
        whether it did."""
        source = (
            load_source(self.spec.code, "_arena_last = json.dumps(STATE, sort_keys=True, allow_nan=False)")
            + CALL_HELPER_SOURCE
            + "_arena_bound, _arena_last = _arena_last, _arena_state_json()\n"
            + "_arena_loaded = _arena_last != _arena_bound\ndel _arena_bound\n_arena_loaded\n"
        )
        result = await session.run(source, bind={"STATE": self.state}, space=MAIN_SPACE)
        if not result.ok:
            return result
        self._stale = self._stale or result.return_value is not False
        for done in self.calls[self._read_at :]:
            if done.changed_state:
                replay = await session.call(CALL_HELPER, {"tool": done.name, "arguments": done.arguments})
                if not replay.ok:
                    why = f"the environment's state could not be rebuilt: {done.name}: {_failure(replay)}"
                    return replay.model_copy(update={"error_type": "sandbox_error", "error": why})
        return result

    async def read_state(self) -> dict[str, Any]:
        """The current state, read from the session when calls changed it since the last read
        (``state`` is updated); ``StateLost`` when it cannot be."""
        if not self._stale:
            return self.state
        session = await self._held.space(MAIN_SPACE, self._load)
        if isinstance(session, str):
            raise StateLost(session)
        result = await session.read("STATE", space=MAIN_SPACE)
        if not result.ok or not isinstance(result.return_value, dict):
            why = _failure(result) if not result.ok else "STATE is not a JSON object"
            raise StateLost(f"the environment's state could not be read: {why}")
        self.state, self._stale, self._read_at = result.return_value, False, len(self.calls)
        return self.state

    async def close(self) -> None:
        """Read the state back (``state`` is the final one) and end the session; idempotent."""
        try:
            with contextlib.suppress(StateLost):
                await self.read_state()
        finally:
            await self._held.close()

    def _record(
        self, name: str, arguments: dict[str, Any], actor: Literal["agent", "user"], error: str
    ) -> Observation:
        """A failed call of an offered tool: logged for ``verify`` (attempts matter), state unchanged."""
        self.calls.append(
            CallRecord(name=name, arguments=arguments, actor=actor, ok=False, changed_state=False)
        )
        return Observation(text=error, ok=False, tool=name)

    @property
    def completed_actions(self) -> list[str]:
        """Agent calls that changed the state, in order."""
        return [c.name for c in self.calls if c.actor == "agent" and c.changed_state]

    @property
    def dialogue(self) -> list[DialogueMessage]:
        """User and agent messages so far (what the gateway role sees)."""
        return [DialogueMessage(role=t.role, content=t.text) for t in self.view]

    def user_context(self) -> UserContext:
        """The scenario and the dialogue so far, for the user simulator."""
        return UserContext(
            instructions=self.spec.user_instructions,
            requirements=self.spec.requirements,
            goal_actions=self.spec.goal_actions,
            completed_actions=self.completed_actions,
            user_tools=self.spec.user_tools,
            known_info=self.spec.known_info,
            persona=self.spec.persona,
            planned_actions=self.spec.planned_actions(),
            own_actions=self.user_actions,
            behaviour=self.behaviour,
            turns=self.view,
            turn=self.user_replies,
            max_turns=self.spec.max_user_turns,
        )

    async def user_turn(self, assistant_text: str) -> str | None:
        """Ask the user simulator; its user-tool calls run first; a control signal ends the dialogue.

        The user's tool calls run even on the turn that ends the dialogue (a user body lists the
        tools it ran before its message and marker). A simulator that returns calls with no
        message is asked again with their outputs (``UserContext.own_actions``), at most
        ``MAX_USER_STEPS`` times per reply, so it can report what it saw: the same exchange as the
        EigenData dialogue loop's. A reply that still has no message stops the dialogue. A user
        out of replies (``max_user_turns``) stops without being asked, whatever simulator it is.
        """
        if self.signal not in (None, "continue"):
            return None
        self.view.append(ViewTurn(role="assistant", text=assistant_text, actions=[]))
        if self.user_replies >= self.spec.max_user_turns:
            self.signal = "stop"
            return None
        actions: list[ToolCall] = []
        for _ in range(MAX_USER_STEPS):
            turn = await self.user.reply(self.user_context())
            for action in turn.actions:
                await self._user_action(action)
            actions.extend(turn.actions)
            if turn.signal != "continue" or turn.message.strip() or not turn.actions:
                break
        self.signal = turn.signal if turn.message.strip() or turn.signal != "continue" else "stop"
        if self.signal != "continue":
            return None
        self.user_replies += 1
        self.view.append(ViewTurn(role="user", text=turn.message, actions=actions))
        return turn.message

    async def _user_action(self, action: ToolCall) -> None:
        """Run one user-tool call; the user sees its output (or error) on its next ask."""
        observation = await self._execute(action.name, dict(action.arguments), "user")
        output: Any = observation.text
        with contextlib.suppress(ValueError):
            output = json.loads(observation.text)
        self.user_actions.append(
            UserActionResult(
                name=action.name,
                arguments=dict(action.arguments),
                ok=observation.ok,
                output=output,
                turn=self.user_replies,
            )
        )

    async def verdict(self) -> Verdict | str:
        """Run ``verify`` on (initial state, current state, calls); an error text when it cannot.

        It runs in the instance's own session (no second pool slot), in a space of its own and not
        committed, so the environment is as it was afterwards."""
        try:
            final = await self.read_state()
        except StateLost as exc:
            return str(exc)
        session = await self._held.get()
        if isinstance(session, str):
            return session
        calls = [c.model_dump() for c in self.calls]
        bind = {"_arena_initial": self.initial_state, "_arena_final": final, "_arena_calls": calls}
        # verify's code from line 2, as in ``verify_program`` (error texts keep their line numbers).
        source = (
            f"import json\n{self.spec.verify.rstrip()}\nverify(_arena_initial, _arena_final, _arena_calls)\n"
        )
        return read_verdict(await session.run(source, bind=bind, space=VERIFY_SPACE, commit=False))

    async def reward(self, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        """1.0 when the verification function passes on this instance's final state, else 0.0.

        The trajectory is not read: this instance's own state and call log are what it produced.
        """
        verdict = await self.verdict()
        if isinstance(verdict, str):
            return 0.0, {"pass": 0.0, "verify_error": 1.0}
        value = 1.0 if verdict.passed else 0.0
        return value, {"pass": value, "verify_reward": verdict.reward, **verdict.components}

"""EigenData DialogSynthesis and TrajectoryValidation workers (§4.2).

``synthesize_dialog(pack, intent, state, gateway, runner)`` alternates the UserSimulator
(``arena.llm.roles.user_sim``, fed the intent's requirements and goal actions) and the
TrajectoryAgent (``eigen_trajectory_agent``). Every agent and user tool call runs in the sandbox
through ``environments.environment.state_program`` against the dialogue's state (a failing call
leaves it as it was). The agent acts until it sends a message; the user answers, first running
its user-tool calls. Dual-control fill-in: when the agent asked for in-app actions
(``user_action_requests``) and the simulator made no tool call (the rules simulator never does),
the user performs the requested action if it can -- with the arguments the intent plans for it
(a goal's user call), else the pre-filled ones completed from ``known_info`` (the code on the
phone). The dialogue ends on the user's stop / transfer / out_of_scope signal, at ``max_turns``
user replies, or when the agent does not reach a message in ``max_agent_steps``.

``validate_dialog(pack, intent, dialog) -> DialogVerdict`` runs the five deterministic checks:

- schema: every call names a tool of its actor, with the required arguments, no unknown ones,
  and values of the declared JSON types / enums;
- grounding: every id, amount (``12.50 USD``) and ISO date an assistant message states appears in
  an earlier tool output, app event, user message or the system message; a status the message
  pins on an id must appear in an earlier tool output together with that id;
- goal: every goal call of the intent (name, ids, amounts) ran successfully; refused requests did
  not run; no successful state-changing agent call outside the goals and the identity / note /
  transfer helpers (must-not); must-have functions not called are a non-critical note;
- realism: no empty turns, no repeated assistant messages or repeated identical calls without a
  state change in between, no user message copying 10+ consecutive words of the private
  instructions outside the requirements;
- policy: the pack's rules re-checked on every call that ran, replaying the calls from the
  initial state (``streams.eigen.verification.policy_check``).

Pass / fail rule (the appendix TrajectoryValidationAgent prompt): CRITICAL issues -- function
errors (schema), data fabrication (grounding), severe policy violations (policy rules, must-not),
goal failure -- fail the dialogue by themselves; each dimension is rated Good / Acceptable / Poor
and a dialogue FAILS when it has a CRITICAL issue or two or more dimensions rated Poor, and PASSES
otherwise. Realism findings and unused must-have functions are non-critical (scored).
``judge_dialog`` adds the ``eigen_trajectory_validation`` role on top; a PASS that contradicts a
critical finding is overruled.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from arena.llm.core import InvalidOutput, Sampling
from arena.llm.gateway import Gateway
from arena.llm.roles.eigen import FailureReason, Repair, SuggestedFix, TaskVerdict, UserIntent
from arena.llm.roles.eigen_dialogs import (
    CRITERIA,
    EIGEN_TRAJECTORY_AGENT,
    EIGEN_TRAJECTORY_VALIDATION,
    AgentToolCall,
    AppEvent,
    DialogIssue,
    DimensionRating,
    TrajectoryAgentInput,
    TrajectoryValidationInput,
    TrajectoryVerdict,
)
from arena.llm.roles.user_sim import USER_SIMULATOR, DialogueMessage, UserSimInput
from environments.environment import MAX_OUTPUT_CHARS, CallRecord, argument_error, state_program
from sandbox.env_runtime import Runner
from streams.eigen.packs import DomainPack
from streams.eigen.verification import policy_check
from streams.eigen.workers import modify_task

MAX_TURNS = 12
MAX_AGENT_STEPS = 12
HELPER_WRITES = ("send_verification_code", "add_order_note", "transfer_to_human")
"""State-changing agent tools that are never an unasked-for action."""
EndSignal = Literal["stop", "transfer", "out_of_scope", "max_turns", "agent_stuck"]
ID_RE = re.compile(r"\b[A-Z]{1,3}-\d{2,}\b")
MONEY_RE = re.compile(r"(\d+(?:\.\d+)?)\s*USD|\$\s?(\d+(?:\.\d+)?)")
DATE_RE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")
VERBATIM_WORDS = 10


class DialogCall(CallRecord):
    """One executed call of a synthesized dialogue (``CallRecord`` plus output and position)."""

    output: Any = Field(default=None, description="What it returned, or the error text.")
    message_index: int = Field(default=0, description="Index of the message it belongs to.")

    def record(self) -> dict[str, Any]:
        """The ``CallRecord`` dict ``verify`` receives."""
        return CallRecord.model_validate(self.model_dump()).model_dump()


class Dialog(BaseModel):
    """A synthesized dialogue."""

    domain: str
    messages: list[dict[str, Any]] = Field(description="OpenAI-format messages, system policy first.")
    calls: list[DialogCall] = Field(default_factory=list, description="Every call, agent and user, in order.")
    initial_state: dict[str, Any]
    final_state: dict[str, Any]
    end_signal: EndSignal
    turns: int = Field(description="User replies after the opening message.")

    def records(self) -> list[dict[str, Any]]:
        return [c.record() for c in self.calls]


class DialogVerdict(BaseModel):
    """``validate_dialog``'s result."""

    passed: bool
    ratings: dict[str, DimensionRating] = Field(description="Criterion -> rating and score.")
    flags: dict[str, bool] = Field(description="Criterion -> no critical issue found.")
    issues: list[DialogIssue] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list, description="Why it failed (critical issues first).")


# --------------------------------------------------------------------------- synthesis


def system_message(pack: DomainPack, state: Mapping[str, Any]) -> str:
    today = str(state.get("today") or "")
    return pack.policy_text + (f"\n\nToday's date: {today}." if today else "")


def user_instructions(intent: UserIntent) -> str:
    """The simulated user's private instructions."""
    known = "; ".join(f"{k}: {v}" for k, v in intent.known_info.items())
    return (
        f"You are a {intent.persona.role} ({intent.persona.tone}). Objective: {intent.objective} "
        f"What you know: {known}. Your requests, in order: " + " ".join(intent.requirements)
    )


def opening_message(intent: UserIntent) -> str:
    email = intent.known_info.get("email")
    text = intent.reason_for_call.strip()
    return f"{text} My email is {email}." if email and email not in text else text


def goal_actions(intent: UserIntent) -> list[str]:
    names: list[str] = []
    for goal in intent.goals:
        for call in goal.calls:
            if call.actor == "agent" and call.name not in names:
                names.append(call.name)
    return names


def _fill_in(intent: UserIntent, request: AgentToolCall, specs: Mapping[str, Any]) -> dict[str, Any] | None:
    """Arguments the user can give ``request`` (None: the user cannot perform it)."""
    spec = specs.get(request.name)
    if spec is None:
        return None
    for goal in intent.goals:
        for call in goal.calls:
            if call.actor == "user" and call.name == request.name:
                if all(
                    call.arguments.get(k) == v for k, v in request.arguments.items() if k in call.arguments
                ):
                    return {**request.arguments, **call.arguments}
    arguments = dict(request.arguments)
    for name in spec["function"]["parameters"].get("required", []):
        if arguments.get(name) is not None:
            continue
        known = intent.known_info.get(name) or next(
            (v for k, v in intent.known_info.items() if k.endswith(name)), None
        )
        if known is None:
            return None
        arguments[name] = known
    return arguments


class _Session:
    def __init__(self, pack: DomainPack, state: Mapping[str, Any], runner: Runner, timeout_s: float | None):
        self.pack = pack
        self.runner = runner
        self.timeout_s = timeout_s
        self.state: dict[str, Any] = json.loads(json.dumps(dict(state)))
        self.calls: list[DialogCall] = []
        self.specs = {
            "agent": {s["function"]["name"]: s for s in pack.agent_tools},
            "user": {s["function"]["name"]: s for s in pack.user_tools},
        }

    async def execute(
        self, name: str, arguments: dict[str, Any], actor: Literal["agent", "user"], index: int
    ) -> DialogCall:
        spec = self.specs[actor].get(name)
        error: str | None = None
        value: Any = None
        after = self.state
        if spec is None or not name.isidentifier():
            error = f"unknown tool {name!r}; available: {sorted(self.specs[actor])}"
        else:
            error = argument_error(spec, arguments)
        if error is None:
            program = state_program(self.state, self.pack.tools_source, name, arguments)
            result = await self.runner.run(program, timeout_s=self.timeout_s)
            out = result.return_value
            if not result.ok:
                error = f"{result.error_type}: {result.error}" if result.error else str(result.error_type)
            elif not isinstance(out, dict) or not isinstance(out.get("state"), dict):
                error = "the tool left STATE not a JSON object"
            else:
                value, after = out.get("value"), out["state"]
        call = DialogCall(
            name=name,
            arguments=arguments,
            actor=actor,
            ok=error is None,
            changed_state=error is None and after != self.state,
            output=value if error is None else f"error: {error}",
            message_index=index,
        )
        self.state = after
        self.calls.append(call)
        return call


def _content(call: DialogCall) -> str:
    text = (
        call.output
        if isinstance(call.output, str) and not call.ok
        else json.dumps(call.output, ensure_ascii=False)
    )
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "... [cut]"


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
) -> Dialog:
    """One dialogue on ``state`` for ``intent`` (see the module docstring)."""
    session = _Session(pack, state, runner, timeout_s)
    initial = copy.deepcopy(session.state)
    opening = opening_message(intent)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_message(pack, state)},
        {"role": "user", "content": opening},
    ]
    dialogue = [DialogueMessage(role="user", content=opening)]
    events: list[AppEvent] = []
    instructions = user_instructions(intent)
    goals = goal_actions(intent)
    turns = 0
    end: EndSignal = "max_turns"
    n_calls = 0
    while True:
        requests: list[AgentToolCall] = []
        for _ in range(max_agent_steps):
            inputs = TrajectoryAgentInput(
                policy=pack.policy_text,
                today=str(state.get("today") or ""),
                tools=pack.agent_tools,
                user_tools=pack.user_tools,
                messages=messages,
                app_events=events,
            )
            step = (await gateway.call(EIGEN_TRAJECTORY_AGENT, inputs, sampling)).output
            if step.tool_calls:
                ids = [f"call_{n_calls + k}" for k in range(len(step.tool_calls))]
                n_calls += len(ids)
                messages.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": i,
                                "type": "function",
                                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                            }
                            for i, c in zip(ids, step.tool_calls, strict=True)
                        ],
                    }
                )
                for i, tool_call in zip(ids, step.tool_calls, strict=True):
                    done = await session.execute(tool_call.name, tool_call.arguments, "agent", len(messages))
                    messages.append(
                        {"role": "tool", "tool_call_id": i, "name": tool_call.name, "content": _content(done)}
                    )
                continue
            text = str(step.message)
            messages.append({"role": "assistant", "content": text})
            dialogue.append(DialogueMessage(role="assistant", content=text))
            requests = step.user_action_requests
            break
        else:
            end = "agent_stuck"
            break
        if turns >= max_turns:
            end = "max_turns"
            break
        sim = UserSimInput(
            instructions=instructions,
            requirements=intent.requirements,
            goal_actions=goals,
            completed_actions=[c.name for c in session.calls if c.actor == "agent" and c.changed_state],
            dialogue=dialogue,
            user_tools=pack.user_tools,
            turn=turns,
            max_turns=max_turns,
        )
        try:
            turn = (await gateway.call(USER_SIMULATOR, sim, sampling)).output
        except InvalidOutput:
            end = "stop"
            break
        if turn.signal != "continue":
            end = turn.signal
            if turn.message.strip():
                messages.append({"role": "user", "content": turn.message})
            break
        actions = [AgentToolCall(name=a.name, arguments=a.arguments) for a in turn.tool_calls]
        if not actions:
            for request in requests:
                filled = _fill_in(intent, request, session.specs["user"])
                if filled is not None:
                    actions.append(AgentToolCall(name=request.name, arguments=filled))
        index = len(messages)
        for action in actions:
            done = await session.execute(action.name, action.arguments, "user", index)
            events.append(
                AppEvent(
                    name=done.name,
                    arguments=done.arguments,
                    ok=done.ok,
                    output=done.output,
                    after_message=index,
                )
            )
        messages.append({"role": "user", "content": turn.message})
        dialogue.append(DialogueMessage(role="user", content=turn.message))
        turns += 1
    return Dialog(
        domain=pack.name,
        messages=messages,
        calls=session.calls,
        initial_state=initial,
        final_state=session.state,
        end_signal=end,
        turns=turns,
    )


# --------------------------------------------------------------------------- validation

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def type_error(schema: Mapping[str, Any], value: Any, where: str) -> str | None:
    """Why ``value`` does not fit the JSON ``schema`` (type, enum, array items), else None."""
    kind = schema.get("type")
    if value is None:
        return None  # optional parameters may be null
    if isinstance(kind, str) and kind in _JSON_TYPES:
        if isinstance(value, bool) and kind in ("integer", "number"):
            return f"{where}: expected {kind}, got boolean"
        if not isinstance(value, _JSON_TYPES[kind]):
            return f"{where}: expected {kind}, got {type(value).__name__} {value!r}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {value!r} is not one of {schema['enum']}"
    if kind == "array" and isinstance(value, list) and isinstance(schema.get("items"), dict):
        for n, item in enumerate(value):
            problem = type_error(schema["items"], item, f"{where}[{n}]")
            if problem:
                return problem
    return None


def _issue(
    criterion: Any, critical: bool, description: str, evidence: str = "", turn: int | None = None
) -> DialogIssue:
    return DialogIssue(
        criterion=criterion, critical=critical, description=description, evidence=evidence, turn=turn
    )


def _schema_issues(pack: DomainPack, dialog: Dialog) -> list[DialogIssue]:
    specs = {
        "agent": {s["function"]["name"]: s for s in pack.agent_tools},
        "user": {s["function"]["name"]: s for s in pack.user_tools},
    }
    issues: list[DialogIssue] = []
    for call in dialog.calls:
        what = f"{call.actor} call {call.name}({json.dumps(call.arguments, sort_keys=True)})"
        spec = specs[call.actor].get(call.name)
        if spec is None:
            other = "user" if call.actor == "agent" else "agent"
            why = f"a {other} tool" if call.name in specs[other] else "not a tool of the domain"
            issues.append(_issue("schema", True, f"{call.name} is {why}", what, call.message_index))
            continue
        problem = argument_error(spec, call.arguments)
        if problem is None:
            props = spec["function"]["parameters"].get("properties", {})
            problem = next(
                (p for k, v in call.arguments.items() if k in props and (p := type_error(props[k], v, k))),
                None,
            )
        if problem:
            issues.append(_issue("schema", True, f"{call.name}: {problem}", what, call.message_index))
    return issues


def _numbers(text: str) -> set[float]:
    return {round(float(n), 2) for n in NUMBER_RE.findall(text)}


def _grounding_issues(dialog: Dialog) -> list[DialogIssue]:
    issues: list[DialogIssue] = []
    sources: list[str] = []
    tool_outputs: list[str] = []
    for index, message in enumerate(dialog.messages):
        role = message.get("role")
        content = str(message.get("content") or "")
        events = [c for c in dialog.calls if c.actor == "user" and c.message_index == index]
        for event in events:  # in-app actions come with the user message
            sources.append(json.dumps(event.output, ensure_ascii=False))
        if role in ("system", "user"):
            sources.append(content)
            continue
        if role == "tool":
            sources.append(content)
            tool_outputs.append(content)
            continue
        if role != "assistant" or not content:
            continue
        known = " ".join(sources)
        numbers = _numbers(known)
        for sentence in re.split(r"(?<=[.!?;])\s+", content):
            for claim in ID_RE.findall(sentence):
                if claim not in known:
                    issues.append(_issue("grounding", True, f"ungrounded id {claim!r}", sentence, index))
            for match in MONEY_RE.finditer(sentence):
                amount = round(float(match.group(1) or match.group(2)), 2)
                if amount not in numbers:
                    issues.append(
                        _issue("grounding", True, f"ungrounded amount {match.group(0)!r}", sentence, index)
                    )
            for date in DATE_RE.findall(sentence):
                if date not in known:
                    issues.append(_issue("grounding", True, f"ungrounded date {date!r}", sentence, index))
            status = re.search(r"\b(?P<id>[A-Z]{1,3}-\d{2,}) is (?:now )?(?P<status>[a-z_]+)\b", sentence)
            if status and status["status"] in _STATUS_WORDS:
                pinned = f'"{status["status"]}"'
                if not any(status["id"] in out and pinned in out for out in tool_outputs):
                    issues.append(
                        _issue(
                            "grounding",
                            True,
                            f"ungrounded status claim {status.group(0)!r}",
                            sentence,
                            index,
                        )
                    )
    return issues


_STATUS_WORDS = {"pending", "processing", "shipped", "delivered", "cancelled", "returned", "open", "approved"}


def _matches(goal_args: Mapping[str, Any], args: Mapping[str, Any]) -> bool:
    for key, want in goal_args.items():
        if key in ("reason", "description", "summary", "note"):
            continue
        got = args.get(key)
        if isinstance(want, int | float) and isinstance(got, int | float):
            if abs(float(want) - float(got)) > 1e-6:
                return False
        elif got != want:
            return False
    return True


def _goal_issues(pack: DomainPack, intent: UserIntent, dialog: Dialog) -> list[DialogIssue]:
    issues: list[DialogIssue] = []
    ran = [c for c in dialog.calls if c.ok]
    for n, goal in enumerate(intent.goals):
        for call in goal.calls:
            if not any(
                c.name == call.name and c.actor == call.actor and _matches(call.arguments, c.arguments)
                for c in ran
            ):
                what = f"{call.name}({json.dumps(call.arguments, sort_keys=True)})"
                issues.append(
                    _issue("goal", True, f"goal {n} ({goal.kind}) not achieved: {what} never ran", what)
                )
    for n, goal in enumerate(intent.refused):
        for call in goal.calls:
            hit = next(
                (c for c in ran if c.name == call.name and _matches(call.arguments, c.arguments)), None
            )
            if hit is not None:
                what = f"{call.name}({json.dumps(call.arguments, sort_keys=True)})"
                issues.append(
                    _issue(
                        "goal",
                        True,
                        f"must-not broken: refused request {n} was carried out",
                        what,
                        hit.message_index,
                    )
                )
    planned = [c for g in intent.goals for c in g.calls]
    for done in ran:
        if done.actor != "agent" or not done.changed_state or done.name in HELPER_WRITES:
            continue
        if not any(
            p.name == done.name
            and _matches(
                {k: v for k, v in p.arguments.items() if k in ("order_id", "user_id")}, done.arguments
            )
            for p in planned
        ):
            what = f"{done.name}({json.dumps(done.arguments, sort_keys=True)})"
            issues.append(
                _issue(
                    "goal",
                    True,
                    f"must-not broken: {done.name} was not asked for by the user",
                    what,
                    done.message_index,
                )
            )
    called = {c.name for c in ran}
    for name in intent.must_have_functions:
        if name not in called:
            issues.append(_issue("goal", False, f"must-have function {name} was not called"))
    return issues


def _realism_issues(intent: UserIntent, dialog: Dialog) -> list[DialogIssue]:
    issues: list[DialogIssue] = []
    said: dict[str, int] = {}
    last_state_change = -1
    seen_calls: dict[str, int] = {}
    for index, message in enumerate(dialog.messages):
        role = message.get("role")
        content = message.get("content")
        if role in ("user", "assistant") and not message.get("tool_calls"):
            if not str(content or "").strip():
                issues.append(_issue("realism", False, f"empty {role} turn", "", index))
            elif role == "assistant":
                if content in said:
                    issues.append(
                        _issue("realism", False, "repeated assistant message", str(content)[:200], index)
                    )
                said[str(content)] = index
    for n, call in enumerate(dialog.calls):
        key = f"{call.actor}:{call.name}:{json.dumps(call.arguments, sort_keys=True)}"
        if key in seen_calls and last_state_change <= seen_calls[key]:  # nothing changed in between
            issues.append(
                _issue(
                    "realism",
                    False,
                    f"repeated call {call.name} with no change in between",
                    key,
                    call.message_index,
                )
            )
        seen_calls[key] = n
        if call.changed_state:
            last_state_change = n
    private = user_instructions(intent)
    for requirement in intent.requirements:
        private = private.replace(requirement, " | ")
    words = private.split()
    grams = {" ".join(words[i : i + VERBATIM_WORDS]) for i in range(max(0, len(words) - VERBATIM_WORDS + 1))}
    for index, message in enumerate(dialog.messages):
        if message.get("role") != "user":
            continue
        text = " ".join(str(message.get("content") or "").split())
        copied = next((g for g in grams if "|" not in g and g in text), None)
        if copied:
            issues.append(
                _issue("realism", False, "user message copies the private instructions", copied, index)
            )
    return issues


def _policy_issues(pack: DomainPack, dialog: Dialog) -> list[DialogIssue]:
    reference = {
        "tools_source": pack.tools_source,
        "policy_source": pack.policy_source,
        "rules": [r.function for r in pack.rules],
    }
    _checked, _violating, violations, _errors = policy_check(
        reference, dialog.initial_state, dialog.records()
    )
    return [_issue("policy", True, f"policy violation: {v}", v) for v in violations]


def _rating(issues: list[DialogIssue], total: int) -> DimensionRating:
    critical = sum(1 for i in issues if i.critical)
    score = max(0.0, 1.0 - len(issues) / max(total, 1))
    if critical or len(issues) >= 2:
        rating: Literal["Good", "Acceptable", "Poor"] = "Poor"
    elif issues:
        rating = "Acceptable"
    else:
        rating = "Good"
    assessment = "; ".join(i.description for i in issues[:3]) or "no problem found"
    return DimensionRating(rating=rating, score=round(score, 3), assessment=assessment)


def validate_dialog(pack: DomainPack, intent: UserIntent, dialog: Dialog) -> DialogVerdict:
    """The five deterministic checks and the paper's pass / fail rule (see the module docstring)."""
    found = {
        "schema": _schema_issues(pack, dialog),
        "grounding": _grounding_issues(dialog),
        "goal": _goal_issues(pack, intent, dialog),
        "realism": _realism_issues(intent, dialog),
        "policy": _policy_issues(pack, dialog),
    }
    turns = sum(1 for m in dialog.messages if m.get("role") in ("user", "assistant"))
    totals = {
        "schema": len(dialog.calls),
        "grounding": turns,
        "goal": len(intent.goals) + 1,
        "realism": turns,
        "policy": len(dialog.calls),
    }
    ratings = {c: _rating(found[c], totals[c]) for c in CRITERIA}
    issues = [i for c in CRITERIA for i in found[c]]
    critical = [i for i in issues if i.critical]
    poor = [c for c in CRITERIA if ratings[c].rating == "Poor"]
    passed = not critical and len(poor) < 2
    reasons = [
        f"{i.criterion}: {i.description}" + (f" -- {i.evidence!r}" if i.evidence else "") for i in critical
    ]
    if not passed and not critical:
        reasons.append(f"dimensions rated Poor: {', '.join(poor)}")
    return DialogVerdict(
        passed=passed,
        ratings=ratings,
        flags={c: not any(i.critical for i in found[c]) for c in CRITERIA},
        issues=issues,
        reasons=reasons,
    )


async def judge_dialog(
    pack: DomainPack,
    intent: UserIntent,
    dialog: Dialog,
    gateway: Gateway,
    sampling: Sampling | None = None,
) -> tuple[DialogVerdict, TrajectoryVerdict]:
    """The checks, then the ``eigen_trajectory_validation`` role on their evidence; evidence wins."""
    verdict = validate_dialog(pack, intent, dialog)
    inputs = TrajectoryValidationInput(
        intent=intent,
        messages=dialog.messages,
        calls=dialog.records(),
        ratings=verdict.ratings,
        issues=verdict.issues,
    )
    judged = (await gateway.call(EIGEN_TRAJECTORY_VALIDATION, inputs, sampling)).output
    if judged.validation_result == "FAIL" and verdict.passed:
        verdict = verdict.model_copy(
            update={"passed": False, "reasons": [judged.failure_reason or "judge: FAIL"]}
        )
    return verdict, judged


# --------------------------------------------------------------------------- trajectory repair

_GOAL_MISSED = re.compile(r"^goal (\d+) \(")


def repair_request(intent: UserIntent, verdict: DialogVerdict) -> TaskVerdict | None:
    """A failed dialogue's goal findings as a ``TaskVerdict`` the Modify worker can act on.

    A goal the agent never achieved is dropped (its calls did not run, so the rest of the
    dialogue still stands on its own). None when the failure is not about goals (grounding,
    schema, realism, policy: the agent's mistakes, which only a new dialogue can fix).
    """
    reasons: list[FailureReason] = []
    fixes: list[SuggestedFix] = []
    for issue in verdict.issues:
        match = (
            _GOAL_MISSED.match(issue.description) if issue.criterion == "goal" and issue.critical else None
        )
        if match is None:
            continue
        index = int(match.group(1))
        if index >= len(intent.goals) or any(f.goal_index == index for f in fixes):
            continue
        reasons.append(
            FailureReason(
                category="missing_resource",
                description=issue.description,
                evidence=issue.evidence,
                goal_index=index,
            )
        )
        fixes.append(
            SuggestedFix(fix_type="drop_goal", goal_index=index, description=f"drop it: {issue.description}")
        )
    if not reasons or len(fixes) >= len(intent.goals):
        return None  # nothing goal-shaped, or nothing would be left to do
    return TaskVerdict(status="INFEASIBLE", failure_reasons=reasons, suggested_fixes=fixes, confidence="high")


class DialogOutcome(BaseModel):
    """The end of a TrajectoryValidation <-> Modify loop."""

    accepted: bool
    rounds: int = Field(description="Modify rounds done (0: the first dialogue passed).")
    intent: UserIntent = Field(description="The task the final dialogue was synthesized for.")
    dialog: Dialog = Field(description="The last dialogue validated.")
    verdict: DialogVerdict
    judged: TrajectoryVerdict
    repairs: list[list[Repair]] = Field(default_factory=list, description="Task edits of each round.")
    reason: str | None = Field(default=None, description="Why it was rejected (the last verdict's reasons).")


async def validate_with_dialog_repair(
    pack: DomainPack,
    intent: UserIntent,
    dialog: Dialog,
    state: Mapping[str, Any],
    gateway: Gateway,
    runner: Runner,
    *,
    max_rounds: int = 3,
    max_turns: int = MAX_TURNS,
    timeout_s: float | None = None,
) -> DialogOutcome:
    """Judge; while it fails and fewer than ``max_rounds`` rounds were done, repair and re-synthesize.

    A repair is minimal: goals the agent never achieved are dropped from the task by the Modify
    worker (``repair_request``), other findings keep the task; then the dialogue is synthesized
    again from the initial state, so every call after the change re-runs in the sandbox. Each
    round samples with a new seed (an LLM backend writes a new dialogue; the rules backend is
    deterministic per input, so only a task change makes a difference there).
    """
    repairs: list[list[Repair]] = []
    rounds = 0
    while True:
        verdict, judged = await judge_dialog(pack, intent, dialog, gateway)
        if verdict.passed or rounds >= max_rounds:
            reason = None
            if not verdict.passed:
                reason = f"still failing after {rounds} repair round(s): " + "; ".join(verdict.reasons)
            return DialogOutcome(
                accepted=verdict.passed,
                rounds=rounds,
                intent=intent,
                dialog=dialog,
                verdict=verdict,
                judged=judged,
                repairs=repairs,
                reason=reason,
            )
        rounds += 1
        request = repair_request(intent, verdict)
        if request is not None:
            intent, edits = await modify_task(intent, request, rounds, gateway=gateway)
            repairs.append(edits)
        else:
            repairs.append([])
        dialog = await synthesize_dialog(
            pack,
            intent,
            state,
            gateway,
            runner,
            max_turns=max_turns,
            sampling=Sampling(seed=rounds),
            timeout_s=timeout_s,
        )

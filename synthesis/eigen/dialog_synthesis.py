"""EigenData DialogSynthesis and TrajectoryValidation agents (§4.2).

``synthesize_dialog(pack, intent, state, gateway, runner) -> Dialog`` (the TrajectoryAgent and the
UserSimulator taking turns, every tool call in the sandbox) is the state machine of
``synthesis.eigen.dialog_loop``, re-exported here with its helpers.

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
  instructions outside the requirements; the dialogue did not end on a user-simulator failure
  (``end_signal`` ``user_error``: an incomplete dialogue, critical);
- policy: the pack's rules re-checked on every call that ran, replaying the calls from the
  initial state (``synthesis.eigen.verification.policy_check``).

Pass / fail rule (the appendix TrajectoryValidationAgent prompt): CRITICAL issues -- function
errors (schema), data fabrication (grounding), severe policy violations (policy rules, must-not),
goal failure -- fail the dialogue by themselves; each dimension is rated Good / Acceptable / Poor
and a dialogue FAILS when it has a CRITICAL issue or two or more dimensions rated Poor, and PASSES
otherwise. Realism findings (except a user-simulator failure) and unused must-have functions are
non-critical (scored).
``judge_dialog`` adds the ``eigen_trajectory_validation`` role on top; a PASS that contradicts a
critical finding is overruled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from arena.llm.core import Sampling
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import UserBehaviour
from arena.records.eigen import (
    Dialog,
    DialogIssue,
    DialogVerdict,
    DimensionRating,
    Repair,
    TrajectoryVerdict,
    UserIntent,
)
from environments.environment import argument_error
from sandbox.env_runtime import Runner
from synthesis.eigen.agents import modify_task
from synthesis.eigen.dialog_loop import MAX_TURNS, synthesize_dialog, user_instructions
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.dialogs import CRITERIA, EIGEN_TRAJECTORY_VALIDATION, TrajectoryValidationInput
from synthesis.eigen.roles.tasks import FailureReason, SuggestedFix, TaskVerdict
from synthesis.eigen.verification import policy_check


def helper_writes(pack: DomainPack) -> set[str]:
    """State-changing agent tools that are never an unasked-for action: the identity check's and
    the declared helpers (notes, transfers)."""
    spec = pack.synthesis
    if spec is None:
        return set()
    return {*(t for t in (spec.customer.verify_tool,) if t), *spec.helper_tools}


def id_arguments(pack: DomainPack) -> set[str]:
    """Arguments that name a record (the customer's and the entities' id fields)."""
    return pack.synthesis.id_fields() if pack.synthesis is not None else {"user_id"}


ID_RE = re.compile(r"\b[A-Z]{1,3}-\d{2,}\b")
MONEY_RE = re.compile(r"(\d+(?:\.\d+)?)\s*USD|\$\s?(\d+(?:\.\d+)?)")
DATE_RE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")
VERBATIM_WORDS = 10


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


def dialog_issue(
    criterion: Any, critical: bool, description: str, evidence: str = "", turn: int | None = None
) -> DialogIssue:
    """One finding of a dialogue check."""
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
            issues.append(dialog_issue("schema", True, f"{call.name} is {why}", what, call.message_index))
            continue
        problem = argument_error(spec, call.arguments)
        if problem is None:
            props = spec["function"]["parameters"].get("properties", {})
            problem = next(
                (p for k, v in call.arguments.items() if k in props and (p := type_error(props[k], v, k))),
                None,
            )
        if problem:
            issues.append(dialog_issue("schema", True, f"{call.name}: {problem}", what, call.message_index))
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
                    issues.append(
                        dialog_issue("grounding", True, f"ungrounded id {claim!r}", sentence, index)
                    )
            for match in MONEY_RE.finditer(sentence):
                amount = round(float(match.group(1) or match.group(2)), 2)
                if amount not in numbers:
                    issues.append(
                        dialog_issue(
                            "grounding", True, f"ungrounded amount {match.group(0)!r}", sentence, index
                        )
                    )
            for date in DATE_RE.findall(sentence):
                if date not in known:
                    issues.append(
                        dialog_issue("grounding", True, f"ungrounded date {date!r}", sentence, index)
                    )
            status = re.search(r"\b(?P<id>[A-Z]{1,3}-\d{2,}) is (?:now )?(?P<status>[a-z_]+)\b", sentence)
            if status and status["status"] in _STATUS_WORDS:
                pinned = f'"{status["status"]}"'
                if not any(status["id"] in out and pinned in out for out in tool_outputs):
                    issues.append(
                        dialog_issue(
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
                    dialog_issue("goal", True, f"goal {n} ({goal.kind}) not achieved: {what} never ran", what)
                )
    for n, goal in enumerate(intent.refused):
        for call in goal.calls:
            hit = next(
                (c for c in ran if c.name == call.name and _matches(call.arguments, c.arguments)), None
            )
            if hit is not None:
                what = f"{call.name}({json.dumps(call.arguments, sort_keys=True)})"
                issues.append(
                    dialog_issue(
                        "goal",
                        True,
                        f"must-not broken: refused request {n} was carried out",
                        what,
                        hit.message_index,
                    )
                )
    planned = [c for g in intent.goals for c in g.calls]
    helpers, ids = helper_writes(pack), id_arguments(pack)
    for done in ran:
        if done.actor != "agent" or not done.changed_state or done.name in helpers:
            continue
        if not any(
            p.name == done.name
            and _matches({k: v for k, v in p.arguments.items() if k in ids}, done.arguments)
            for p in planned
        ):
            what = f"{done.name}({json.dumps(done.arguments, sort_keys=True)})"
            issues.append(
                dialog_issue(
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
            issues.append(dialog_issue("goal", False, f"must-have function {name} was not called"))
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
                issues.append(dialog_issue("realism", False, f"empty {role} turn", "", index))
            elif role == "assistant":
                if content in said:
                    issues.append(
                        dialog_issue(
                            "realism", False, "repeated assistant message", str(content)[:200], index
                        )
                    )
                said[str(content)] = index
    for n, call in enumerate(dialog.calls):
        key = f"{call.actor}:{call.name}:{json.dumps(call.arguments, sort_keys=True)}"
        if key in seen_calls and last_state_change <= seen_calls[key]:  # nothing changed in between
            issues.append(
                dialog_issue(
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
                dialog_issue("realism", False, "user message copies the private instructions", copied, index)
            )
    return issues


def _end_issues(dialog: Dialog) -> list[DialogIssue]:
    """A dialogue the user simulator broke off is no complete conversation (critical)."""
    if dialog.end_signal != "user_error":
        return []
    what = "the dialogue ended on a user-simulator failure, not on the user's signal"
    return [dialog_issue("realism", True, what, dialog.error or "", len(dialog.messages) - 1)]


def _policy_issues(pack: DomainPack, dialog: Dialog) -> list[DialogIssue]:
    reference = {
        "tools_source": pack.tools_source,
        "policy_source": pack.policy_source,
        "rules": [r.function for r in pack.rules],
    }
    _checked, _violating, violations, _errors = policy_check(
        reference, dialog.initial_state, dialog.records()
    )
    return [dialog_issue("policy", True, f"policy violation: {v}", v) for v in violations]


def dimension_rating(issues: list[DialogIssue], total: int) -> DimensionRating:
    """A criterion's rating from its findings over ``total`` things checked (the paper's rule: any
    critical finding or two findings, Poor; one, Acceptable; none, Good)."""
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
        "realism": _realism_issues(intent, dialog) + _end_issues(dialog),
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
    ratings = {c: dimension_rating(found[c], totals[c]) for c in CRITERIA}
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
    behaviour: UserBehaviour | None = None,
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
            behaviour=behaviour,
        )

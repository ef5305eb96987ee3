"""Rules TrajectoryAgent and TrajectoryValidation (EigenData §4.2 DialogSynthesis / validation).

``eigen_trajectory_agent`` is a deliberate, policy-following agent for any pack that declares
its synthesis (``TrajectoryAgentInput.synthesis``, else the bundled pack with the same agent
tools; neither: ``Undecidable``). It stands in for an LLM: it reads the pack's declarations (how
customers are found, the entities, what each user tool is for, the task templates) and uses the
pack's policy rules as its understanding of the policy, but it states only facts from tool
outputs, app events and user messages. It re-derives everything from its input each step and does
the first thing still missing, in this order:

1. identify: the declared lookup tool with the value the user gave (an email, say), then the
   details tool;
2. understand: each user sentence that reads back as one of the task templates' requirements is a
   request (the template's placeholders give its arguments);
3. read before write: the entity a request names, with its read tool (and the records it refers
   to); then fill the template's calls from what it read and what the user said;
4. decide each request under the policy: a missing or foreign entity is refused; the policy rules
   run on what it read (a rule that needs data it has not seen stays silent) and a broken rule
   refuses the request, citing the rule;
5. for allowed requests: start the identity check (when declared), ask the user for the in-app
   actions the requests need (``user_action_requests``, every argument pre-filled, the code the
   user supplies), propose the writes ("Shall I proceed with: ...?") and run each only once the
   user's last message said yes to that very proposal, the identity is confirmed and the user
   actions before it in the template are done;
6. report what the writes returned, refusals once, and ask whether there is anything else.

With a reference solution in its input (synthesis from a benchmark task's known solution) it is
``simulator.eigen_guided`` instead.

``eigen_trajectory_validation`` turns the checks' findings into the appendix verdict with the
paper's rule (critical issue or 2+ Poor dimensions: FAIL).
"""

from __future__ import annotations

import functools
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.records.eigen import TrajectoryVerdict
from simulator.eigen_guided import CLOSING, guided_step
from synthesis.eigen.roles.dialogs import (
    DIMENSIONS,
    EIGEN_TRAJECTORY_AGENT,
    EIGEN_TRAJECTORY_VALIDATION,
    YES_RE,
    AgentStep,
    AgentToolCall,
    TrajectoryAgentInput,
    TrajectoryValidationInput,
)
from synthesis.eigen.spec import (
    MissingValue,
    SynthesisSpec,
    TaskTemplate,
    builtin_declarations,
    context_of,
    fill,
    nest,
    requirement_pattern,
)

FREE_TEXT = ("reason", "description", "summary", "note")
"""Arguments whose wording is the agent's own (never compared to a template's)."""


@dataclass
class Request:
    template: TaskTemplate
    captured: dict[str, str]
    sentence: str


@dataclass
class Decision:
    request: Request
    verdict: str  # "allow" | "refuse"
    note: str = ""
    calls: list[AgentToolCall] = field(default_factory=list)
    actors: list[str] = field(default_factory=list)
    describe: str = ""


@functools.lru_cache(maxsize=64)
def _patterns(requirement: str) -> tuple[re.Pattern[str], dict[str, str]]:
    return requirement_pattern(requirement)


def parse_requests(texts: list[str], spec: SynthesisSpec) -> list[Request]:
    """The requests the user messages state: each match of a template's requirement, once."""
    found: list[Request] = []
    seen: set[str] = set()
    for text in texts:
        flat = " ".join(text.split())
        for template in spec.templates:
            pattern, groups = _patterns(" ".join(template.requirement.split()))
            for match in pattern.finditer(flat):
                captured = {path: match.group(g) for g, path in groups.items()}
                key = template.kind + json.dumps(captured, sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    found.append(Request(template, captured, match.group(0)))
    return found


@functools.lru_cache(maxsize=16)
def _rules(policy_source: str) -> list[tuple[str, str, Callable[..., Any]]]:
    """(name, description, function) of every ``rule_*`` of the policy code."""
    namespace: dict[str, Any] = {"__name__": "eigen_agent_policy"}
    exec(compile(policy_source, "policy.py", "exec"), namespace)
    rules = []
    for name, value in namespace.items():
        if name.startswith("rule_") and callable(value):
            doc = (value.__doc__ or "").strip().splitlines()
            rules.append((name.removeprefix("rule_"), doc[0] if doc else name, value))
    return rules


class _View:
    """What the agent knows: its calls and their outputs, user messages, app events."""

    def __init__(self, inputs: TrajectoryAgentInput) -> None:
        self.inputs = inputs
        self.results: list[tuple[str, dict[str, Any], bool, Any]] = []
        pending: dict[str, tuple[str, dict[str, Any]]] = {}
        self.user_texts: list[str] = []
        self.last_user = ""
        self.last_assistant = ""
        for message in inputs.messages:
            role = message.get("role")
            if role == "user":
                self.user_texts.append(str(message.get("content") or ""))
                self.last_user = self.user_texts[-1]
            elif role == "assistant":
                for call in message.get("tool_calls") or []:
                    fn = call.get("function", {})
                    args = fn.get("arguments")
                    parsed = json.loads(args) if isinstance(args, str) else dict(args or {})
                    pending[str(call.get("id"))] = (str(fn.get("name")), parsed)
                if message.get("content") and not message.get("tool_calls"):
                    self.last_assistant = str(message["content"])
            elif role == "tool":
                name, args = pending.get(str(message.get("tool_call_id")), (str(message.get("name")), {}))
                content = str(message.get("content") or "")
                ok = not content.startswith("error:")
                value: Any = content
                if ok:
                    try:
                        value = json.loads(content)
                    except ValueError:
                        value = content
                self.results.append((name, args, ok, value))
        self.tools = {t["function"]["name"] for t in inputs.tools}

    def result(self, name: str, **match: Any) -> tuple[bool, Any] | None:
        """The latest result of ``name`` called with arguments containing ``match``."""
        for called, args, ok, value in reversed(self.results):
            if called == name and all(args.get(k) == v for k, v in match.items()):
                return ok, value
        return None

    def ok_value(self, name: str, **match: Any) -> Any:
        got = self.result(name, **match)
        return got[1] if got is not None and got[0] else None

    def app_ok(self, name: str, **match: Any) -> bool:
        return any(
            e.name == name and e.ok and all(e.arguments.get(k) == v for k, v in match.items())
            for e in self.inputs.app_events
        )


def _call(name: str, **arguments: Any) -> AgentStep:
    return AgentStep(think=f"I need {name} now.", tool_calls=[AgentToolCall(name=name, arguments=arguments)])


def _declarations(inputs: TrajectoryAgentInput, view: _View) -> tuple[SynthesisSpec, str]:
    if inputs.synthesis is not None:
        return inputs.synthesis, inputs.policy_source
    bundled = builtin_declarations(view.tools)
    if bundled is None:
        raise Undecidable("the rules trajectory agent needs the pack's synthesis declarations")
    return bundled


def _coerce(value: Any, schema: dict[str, Any]) -> Any:
    """A value read from a message, typed as the tool's JSON schema says."""
    kind = schema.get("type")
    try:
        if kind == "number" and isinstance(value, str):
            return float(value.replace(",", ""))
        if kind == "integer" and isinstance(value, str | float):
            return int(float(value))
        if kind == "boolean" and isinstance(value, str):
            return value.strip().casefold() in ("true", "yes", "on", "1")
    except ValueError:
        return value
    if kind == "array" and isinstance(value, list):
        return [_coerce(v, schema.get("items") or {}) for v in value]
    return value


class _Agent:
    """One step of the agent: its view of the dialogue and the pack's declarations."""

    def __init__(self, inputs: TrajectoryAgentInput) -> None:
        self.inputs = inputs
        self.view = _View(inputs)
        self.spec, policy = _declarations(inputs, self.view)
        self.rules = _rules(policy) if policy else []
        self.schemas = {
            t["function"]["name"]: t["function"].get("parameters", {}).get("properties", {})
            for t in [*inputs.tools, *inputs.user_tools]
        }
        self.customer_id = ""
        self.profile: dict[str, Any] = {}
        self.known: dict[str, Any] = {"today": inputs.today}

    def arguments(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        props = self.schemas.get(name, {})
        return {k: _coerce(v, props.get(k) or {}) for k, v in arguments.items()}

    def read(self, entity_collection: str, entity_id: str) -> tuple[bool, Any] | AgentStep | None:
        """The record's read result, a step reading it, or None (no read tool)."""
        entity = self.spec.entity(entity_collection)
        if entity is None or not entity.read_tool:
            return None
        got = self.view.result(entity.read_tool, **{entity.id_field: entity_id})
        if got is None:
            return _call(entity.read_tool, **{entity.id_field: entity_id})
        if got[0] and isinstance(got[1], dict):
            self.known.setdefault(entity_collection, {})[entity_id] = got[1]
        return got

    def decide(self, request: Request) -> Decision | AgentStep:
        """Read what the request needs (a step to run first) and decide it under the policy."""
        template = request.template
        captured = nest(request.captured)
        record: dict[str, Any] | None = None
        subject = ""
        entity = self.spec.entity(template.entity)
        if template.entity is not None and entity is not None:
            entity_id = str(request.captured.get(entity.id_field) or "")
            if not entity_id:
                return Decision(request, "refuse", note=f"Which {entity.noun} do you mean?")
            subject = f" for {entity.noun} {entity_id}"
            got = self.read(entity.collection, entity_id)
            if isinstance(got, AgentStep):
                return got
            if got is None:
                record = {**captured, entity.id_field: entity_id}
            elif not got[0] or not isinstance(got[1], dict):
                return Decision(request, "refuse", note=f"I could not find {entity.noun} {entity_id}.")
            else:
                record = got[1]
                owner = entity.owner_field
                if owner and record.get(owner) not in (None, self.customer_id):
                    note = f"{entity.noun.capitalize()} {entity_id} is not on your account, so I cannot change it."
                    return Decision(request, "refuse", note=note)
                for ref_field, collection in entity.references.items():
                    if record.get(ref_field):
                        related = self.read(collection, str(record[ref_field]))
                        if isinstance(related, AgentStep):
                            return related
        context = context_of(template, record, self.profile, self.inputs.today, {})
        if context is None:
            return Decision(request, "refuse", note=f"I could not find what you describe{subject}.")
        context = {**captured, **context, "customer": {**captured.get("customer", {}), **self.profile}}
        try:
            calls = [
                AgentToolCall(name=c.name, arguments=self.arguments(c.name, fill(c.arguments, context)))
                for c in template.calls
            ]
            describe = (
                str(fill(template.confirm, context)) if template.confirm else template.summary + subject
            )
        except MissingValue:
            return Decision(request, "refuse", note=f"I need more details to help with that{subject}.")
        actors: list[str] = [c.actor for c in template.calls]
        for call, actor in zip(calls, actors, strict=True):
            if actor != "agent":
                continue
            broken = self.broken_rule(call)
            if broken:
                note = f"I am sorry, I cannot do that{subject}: {broken}"
                return Decision(request, "refuse", note=note)
        return Decision(request, "allow", calls=calls, actors=actors, describe=describe)

    def broken_rule(self, call: AgentToolCall) -> str | None:
        """The description of a policy rule ``call`` would break on what the agent has read."""
        record = {
            "name": call.name,
            "arguments": call.arguments,
            "actor": "agent",
            "ok": True,
            "changed_state": True,
        }
        for _name, description, rule in self.rules:
            try:
                message = rule(
                    json.loads(json.dumps(self.known)), dict(record), json.loads(json.dumps(self.known))
                )
            except Exception:
                continue  # the rule needs data the agent has not seen
            if message:
                return description
        return None

    def done(self, decision: Decision, index: int) -> bool:
        call, actor = decision.calls[index], decision.actors[index]
        if actor == "user":
            wanted = {k: v for k, v in call.arguments.items() if k not in FREE_TEXT}
            return self.view.app_ok(call.name, **wanted)
        key = {
            k: v for k, v in call.arguments.items() if k not in FREE_TEXT and not isinstance(v, list | dict)
        }
        return self.view.result(call.name, **key) is not None

    def next_step(self, decision: Decision) -> int | None:
        return next((n for n in range(len(decision.calls)) if not self.done(decision, n)), None)

    def step(self) -> AgentStep:
        inputs, view, c = self.inputs, self.view, self.spec.customer
        if not view.user_texts:
            raise Undecidable("the agent speaks after the user")
        values = [m for text in view.user_texts for m in re.findall(c.lookup_pattern, text)]
        if not values:
            return AgentStep(
                think="I must identify the customer first.", message=f"I can help with that. What is {c.ask}?"
            )
        value = values[-1]
        found = view.result(c.lookup_tool, **{c.lookup_argument: value})
        if found is None:
            return _call(c.lookup_tool, **{c.lookup_argument: value})
        if not found[0] or not isinstance(found[1], dict) or c.id_field not in found[1]:
            return AgentStep(
                think="No such account.",
                message=f"I could not find an account with {value}. Could you check it?",
            )
        self.customer_id = str(found[1][c.id_field])
        self.profile = dict(found[1])
        if c.details_tool:
            profile = view.ok_value(c.details_tool, **{c.id_field: self.customer_id})
            if profile is None:
                return _call(c.details_tool, **{c.id_field: self.customer_id})
            if isinstance(profile, dict):
                self.profile = {**self.profile, **profile}
        self.known[c.collection] = {self.customer_id: self.profile}

        decisions: list[Decision] = []
        for request in parse_requests(view.user_texts, self.spec):
            decided = self.decide(request)
            if isinstance(decided, AgentStep):
                return decided
            decisions.append(decided)
        earlier = " ".join(
            str(m.get("content") or "") for m in inputs.messages if m.get("role") == "assistant"
        )
        notes = [d.note for d in decisions if d.verdict != "allow" and d.note and d.note not in earlier]
        pending = [d for d in decisions if d.verdict == "allow" and self.next_step(d) is not None]
        if pending:
            return self.act(pending, notes)
        return self.report(notes)

    def act(self, pending: list[Decision], notes: list[str]) -> AgentStep:
        view, c = self.view, self.spec.customer
        writes_left = any(
            d.actors[n] == "agent" for d in pending for n in range(self.next_step(d) or 0, len(d.calls))
        )
        verified = not c.confirm_tool or view.app_ok(c.confirm_tool, **{c.id_field: self.customer_id})
        if writes_left and c.verify_tool and not verified:
            if view.result(c.verify_tool, **{c.id_field: self.customer_id}) is None:
                return _call(c.verify_tool, **{c.id_field: self.customer_id})
        said_yes = any(YES_RE.search(s) for s in re.split(r"(?<=[.!?])\s+", view.last_user))
        for decision in pending:
            n = self.next_step(decision)
            assert n is not None
            if (
                decision.actors[n] == "agent"
                and verified
                and said_yes
                and decision.describe in view.last_assistant
            ):
                return AgentStep(
                    think=f"Identity checked and the customer agreed to: {decision.describe}.",
                    tool_calls=[decision.calls[n]],
                )
        parts = list(notes)
        asks: list[AgentToolCall] = []
        if writes_left and c.confirm_tool and not verified:
            ask = self.spec.user_actions.get(c.confirm_tool, c.confirm_tool.replace("_", " "))
            parts.append(f"To verify your identity, please {ask}.")
            asks.append(AgentToolCall(name=c.confirm_tool, arguments={c.id_field: self.customer_id}))
        for decision in pending:
            n = self.next_step(decision)
            assert n is not None
            if decision.actors[n] == "user":
                call = decision.calls[n]
                ask = self.spec.user_actions.get(call.name, call.name.replace("_", " "))
                try:
                    ask = str(fill(ask, call.arguments))
                except MissingValue:
                    pass  # an instruction naming what the call does not carry stays as written
                parts.append(f"Please {ask}.")
                asks.append(call)
        proposals = [d.describe for d in pending if "agent" in d.actors[self.next_step(d) or 0 :]]
        if proposals:
            parts.append("Shall I proceed with: " + "; and ".join(proposals) + "?")
        else:
            parts.append("Shall I guide you through the next step after that?")
        return AgentStep(
            think="Every request was checked against the policy; I ask for the customer's actions and confirm writes first.",
            message=" ".join(parts),
            user_action_requests=asks,
        )

    def report(self, notes: list[str]) -> AgentStep:
        """Nothing left to do: report the writes and user actions since the last message, and refusals."""
        messages = self.inputs.messages
        last_text = max(
            (
                n
                for n, m in enumerate(messages)
                if m.get("role") == "assistant" and m.get("content") and not m.get("tool_calls")
            ),
            default=-1,
        )
        helpers = {self.spec.customer.verify_tool, *self.spec.helper_tools}
        reads = set(self.spec.read_tools)
        names: dict[str, str] = {}
        reports: list[str] = []
        for n, message in enumerate(messages):
            if message.get("role") == "assistant":
                for call in message.get("tool_calls") or []:
                    names[str(call.get("id"))] = str(call.get("function", {}).get("name"))
            if n <= last_text or message.get("role") != "tool":
                continue
            name = names.get(str(message.get("tool_call_id")), "")
            if not name or name in reads or name in helpers:
                continue
            content = str(message.get("content") or "")
            what = name.replace("_", " ")
            if content.startswith("error:"):
                reports.append(f"The {what} did not go through ({content.removeprefix('error:').strip()}).")
                continue
            try:
                value = json.loads(content)
            except ValueError:
                value = content
            shown = ""
            if isinstance(value, dict):
                shown = "; ".join(
                    f"{k.replace('_', ' ')}: {v}"
                    for k, v in value.items()
                    if isinstance(v, str | int | float)
                )
            reports.append(f"Done: {what} went through" + (f" ({shown})." if shown else "."))
        fixed = [
            e
            for e in self.inputs.app_events
            if e.after_message > last_text and e.ok and e.name in self.spec.user_actions
        ]
        if fixed and not reports and self.spec.customer.confirm_tool not in {e.name for e in fixed}:
            reports.append("Thank you, that completes the steps on your side.")
        text = " ".join(reports + notes)
        return AgentStep(think="All requests are handled.", message=f"{text} {CLOSING}".strip())


def trajectory_agent(inputs: BaseModel, rng: random.Random) -> AgentStep:
    assert isinstance(inputs, TrajectoryAgentInput)
    if inputs.reference is not None:  # synthesis from a task whose solution is known
        return guided_step(inputs)
    return _Agent(inputs).step()


def trajectory_validation(inputs: BaseModel, rng: random.Random) -> TrajectoryVerdict:
    assert isinstance(inputs, TrajectoryValidationInput)
    summary = {DIMENSIONS.get(k, k): v for k, v in inputs.ratings.items()}
    critical = [i for i in inputs.issues if i.critical]
    observations = [f"{i.criterion}: {i.description}" for i in inputs.issues if not i.critical]
    poor = [k for k, v in summary.items() if v.rating == "Poor"]
    failed = bool(critical) or len(poor) >= 2
    reason = None
    if critical:
        reason = f"{critical[0].criterion}: {critical[0].description}"
    elif failed:
        reason = f"dimensions rated Poor: {', '.join(poor)}"
    return TrajectoryVerdict(
        validation_summary=summary,
        critical_issues=critical,
        non_critical_observations=observations,
        validation_result="FAIL" if failed else "PASS",
        failure_reason=reason,
    )


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    EIGEN_TRAJECTORY_AGENT.name: trajectory_agent,
    EIGEN_TRAJECTORY_VALIDATION.name: trajectory_validation,
}

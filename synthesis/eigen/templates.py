"""A pack's task templates on a seeded state: filled goals, and which of them the policy allows.

``goal_options(pack, state, draw)`` fills every declared template (``domain.yaml`` ``synthesis``)
on the entities of a draw's slice and dry-runs each, in this process, on a copy of the state:
the customer's identity check first (as a real dialogue does), then the goal's calls, with every
policy rule checked on each call. A goal whose calls all run and break no rule is ``allowed``; one
whose calls run but break a rule is ``forbidden`` (material for policy-enforcement tasks); one whose
calls raise is dropped. This only guides the UserIntent worker (the pack is trusted code, like its
generator): the feasibility probe re-executes every task in the sandbox.
"""

from __future__ import annotations

import copy
import pickle
import random
from collections.abc import Callable, Mapping
from typing import Any

from arena.records.eigen import Goal, GoalCall, PoolDraw
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.tasks import GoalOption
from synthesis.eigen.spec import Instance, SynthesisSpec, TaskTemplate, fill, instantiate

Rule = tuple[str, Callable[..., Any]]


def rule_functions(pack: DomainPack) -> list[Rule]:
    """(name, function) of every policy rule of ``pack``."""
    namespace: dict[str, Any] = {"__name__": "eigen_policy"}
    exec(compile(pack.policy_source, "policy.py", "exec"), namespace)
    return [(r.name, namespace[r.function]) for r in pack.rules]


class Snapshot:
    """A value frozen once, handed out as fresh deep copies (JSON-like pack data).

    Unpickling is several times faster than ``copy.deepcopy`` on a pack's database, and pickling
    keeps shared references shared, as deepcopy does; a value pickle cannot take is deep-copied.
    """

    def __init__(self, value: Any) -> None:
        self._value = value
        try:
            self._blob: bytes | None = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            self._blob = None

    def copy(self) -> Any:
        return pickle.loads(self._blob) if self._blob is not None else copy.deepcopy(self._value)


def clone(value: Any) -> Any:
    """A deep copy of ``value`` (see ``Snapshot``)."""
    return Snapshot(value).copy()


def check_rules(rules: list[Rule], before: Any, record: dict[str, Any], after: Any) -> list[str]:
    """'rule: message' for every rule ``record`` (a call that ran) breaks.

    Each rule gets its own deep copies, so a rule that changes its arguments affects no other."""
    violations: list[str] = []
    frozen = (Snapshot(before), Snapshot(record), Snapshot(after))
    for name, rule in rules:
        try:
            message = rule(*(f.copy() for f in frozen))
        except Exception as exc:
            message = f"the rule raised {type(exc).__name__}: {exc}"
        if message:
            violations.append(f"{name}: {message}")
    return violations


def goal_of(instance: Instance) -> Goal:
    return Goal(
        kind=instance.kind,
        requirement=instance.requirement,
        calls=[GoalCall(name=c.name, actor=c.actor, arguments=c.arguments) for c in instance.calls],
    )


def instances_for(
    spec: SynthesisSpec,
    template: TaskTemplate,
    state: Mapping[str, Any],
    customer_id: str,
    entity_ids: list[str],
    seed: int,
) -> list[Instance]:
    """``template`` filled on each of ``entity_ids`` it applies to (on the account when it names no entity)."""
    customer = state.get(spec.customer.collection, {}).get(customer_id)
    if not isinstance(customer, dict):
        return []
    today = str(state.get("today") or "")
    entity = spec.entity(template.entity)
    if template.entity is None:
        targets: list[tuple[str | None, dict[str, Any] | None]] = [(None, None)]
    elif entity is None:
        return []
    else:
        rows = state.get(entity.collection, {})
        targets = [
            (key, rows[key])
            for key in entity_ids
            if key in rows
            and (entity.owner_field is None or rows[key].get(entity.owner_field) == customer_id)
        ]
    found: list[Instance] = []
    for key, row in targets:
        rng = random.Random(f"{seed}:{template.kind}:{key}")
        instance = instantiate(template, row, customer, today, rng, key)
        if instance is not None:
            found.append(instance)
    return found


def identity_calls(spec: SynthesisSpec, customer: Mapping[str, Any]) -> list[GoalCall]:
    """The identity check a dialogue starts with, made as the customer would (their own secret)."""
    c = spec.customer
    if not c.verify_tool or not c.confirm_tool:
        return []
    customer_id = customer[c.id_field]
    confirm = fill(c.confirm_arguments, {"customer": dict(customer)})
    return [
        GoalCall(name=c.verify_tool, arguments={c.id_field: customer_id}),
        GoalCall(name=c.confirm_tool, actor="user", arguments=confirm),
    ]


class DryRun:
    """The pack's tools and rules in this process, on copies of a state."""

    def __init__(self, pack: DomainPack) -> None:
        self.code = compile(pack.tools_source, "tools.py", "exec")
        self.rules = rule_functions(pack)

    def run(self, state: Mapping[str, Any], calls: list[GoalCall]) -> tuple[str, str]:
        """('allowed' | 'forbidden' | 'broken', the first violation or error)."""
        current = clone(dict(state))
        namespace: dict[str, Any] = {"__name__": "eigen_dry_run", "STATE": current}
        exec(self.code, namespace)
        for call in calls:
            before = clone(current)
            try:
                namespace[call.name](**copy.deepcopy(call.arguments))
            except Exception as exc:
                return "broken", f"{call.name}: {type(exc).__name__}: {exc}"
            record = {"name": call.name, "arguments": call.arguments, "actor": call.actor, "ok": True}
            record["changed_state"] = current != before
            violations = check_rules(self.rules, before, record, current)
            if violations:
                return "forbidden", violations[0]
        return "allowed", ""


def goal_options(pack: DomainPack, state: Mapping[str, Any], draw: PoolDraw) -> list[GoalOption]:
    """Every template of ``pack`` on the draw's entities, dry-run (see the module docstring)."""
    spec = pack.synthesis
    if spec is None:
        return []
    customer = state.get(spec.customer.collection, {}).get(draw.context.user_id)
    if not isinstance(customer, dict):
        return []
    dry = DryRun(pack)
    identity = identity_calls(spec, customer)
    options: list[GoalOption] = []
    for template in spec.templates:
        if draw.task_kinds and template.kind not in draw.task_kinds:
            continue
        for instance in instances_for(
            spec, template, state, draw.context.user_id, draw.context.order_ids, draw.seed
        ):
            goal = goal_of(instance)
            status, why = dry.run(state, identity + goal.calls)
            if status == "broken":
                continue
            options.append(
                GoalOption(
                    kind=template.kind,
                    entity_id=instance.entity_id,
                    status="allowed" if status == "allowed" else "forbidden",
                    violation=why,
                    goal=goal,
                    summary=template.summary,
                    must_not=template.must_not,
                    agent_writes=template.agent_writes,
                )
            )
    return options

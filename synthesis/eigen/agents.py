"""EigenData execution-layer agents (§4.2): RandomPool, UserIntent, TaskValidation, Modify.

Thin async functions over the gateway roles of ``synthesis.eigen.roles.tasks`` and the sandbox; the
stages ``eigen.seeds -> eigen.intents -> eigen.tasks`` wrap them.

- ``random_pool``: a ``PoolDraw`` (persona, entities of the seeded database, difficulty factors)
  from a pack, its seeded state, a seed and the generator parameters ``PoolParams``.
- ``user_intent``: a ``UserIntent`` on a draw, given the database slice the draw names and the
  pack's goal options (``synthesis.eigen.templates.goal_options``: its task templates filled on
  the slice and dry-run against the policy; ``user_intent_input`` builds the whole input).
- ``probe_task``: the feasibility probe, generic over the pack's declarations (``domain.yaml``
  ``synthesis``). It EXECUTES, in one sandbox session (the pack's tools loaded with the state,
  each call a ``call_tool`` of ``synthesis.eigen.dialog_loop``; only a changed state comes back, and
  a state is sent in only when the probe steps back to one the session does not hold), against a
  copy of the state: the declared customer lookup (with what the user knows), the details and
  list tools, the identity check (the verify tool, then the user's confirm tool with what the
  user knows), then per goal a read of the entity it names (its read tool) and a dry run of its
  calls, with every pack policy rule checked on each call (rules are trusted pack code, checked
  here on the states the sandbox returned). A failing goal is rolled back and the probe looks for
  a working substitute (the goal's template on another of the customer's entities, a smaller
  amount), dry-run the same way. Refused requests are dry-run too: the policy must in fact forbid
  them.
- ``validate_task``: probe + the ``eigen_task_validation`` role -> ``TaskVerdict``. A FEASIBLE
  verdict that contradicts the probe's evidence is overruled (execute, don't assume).
- ``modify_task``: the ``eigen_modify`` role (task repair).
- ``validate_with_repair``: validate; while INFEASIBLE and fewer than ``MAX_ROUNDS`` repair
  rounds were done: modify, validate again. ``rounds`` counts modify rounds (0 when the task
  was feasible as generated), so a task that never validates is rejected after exactly
  ``MAX_ROUNDS`` rounds (``MAX_ROUNDS + 1`` verdicts) with the last verdict's reasons.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from arena.llm.core import Sampling
from arena.llm.gateway import Gateway
from arena.records.eigen import Goal, GoalCall, PoolDraw, Repair, UserIntent
from environments.environment import argument_error
from sandbox.env_runtime import EnvSession, Runner
from synthesis.eigen.dialog_loop import call_tool, load_tools
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.tasks import (
    EIGEN_MODIFY,
    EIGEN_RANDOM_POOL,
    EIGEN_TASK_VALIDATION,
    EIGEN_USER_INTENT,
    Alternative,
    DomainSummary,
    EntityRef,
    FailureReason,
    ModifyInput,
    PoolParams,
    ProbeCall,
    ProbeReport,
    RandomPoolInput,
    RuleBrief,
    TaskValidationInput,
    TaskVerdict,
    ToolBrief,
    UserIntentInput,
)
from synthesis.eigen.spec import SynthesisSpec, fill
from synthesis.eigen.templates import check_rules, goal_of, goal_options, instances_for, rule_functions

MAX_ROUNDS = 3
"""Most validate <-> modify repair rounds before a task is rejected (EigenData §4.2)."""
READ_PREFIXES = ("get_", "find_", "list_", "search_", "lookup_", "check_", "show_")
"""Tools whose name starts so only read the state."""
ATTRIBUTES = ("status", "user_id", "category", "tier")
"""Scalar fields copied into ``EntityRef.attributes`` (besides every ``*_id`` naming another record)."""
MAX_OUTPUT_CHARS = 1500
MAX_CANDIDATES = 6
"""Substitute entities the probe dry-runs per failing goal."""


def tool_kind(name: str, spec: SynthesisSpec | None = None) -> str:
    """``read`` for look-up tools (declared in the pack's ``read_tools``, else by name), else ``write``."""
    if spec is not None and spec.read_tools:
        return "read" if name in spec.read_tools else "write"
    return "read" if name.startswith(READ_PREFIXES) else "write"


def domain_summary(pack: DomainPack, state: Mapping[str, Any] | None = None) -> DomainSummary:
    """What the agents are told about ``pack`` (and the size of its database)."""
    tools = [
        ToolBrief(
            name=spec["function"]["name"],
            description=spec["function"]["description"],
            actor=actor,
            kind="read" if tool_kind(spec["function"]["name"], pack.synthesis) == "read" else "write",
            parameters=spec["function"]["parameters"],
        )
        for actor, specs in (("agent", pack.agent_tools), ("user", pack.user_tools))
        for spec in specs
    ]
    counts = {k: len(v) for k, v in (state or {}).items() if isinstance(v, dict | list)}
    return DomainSummary(
        name=pack.name,
        description=pack.description,
        policy=pack.policy_text,
        tools=tools,
        rules=[RuleBrief(name=r.name, description=r.description) for r in pack.rules],
        entity_counts=counts,
        today=str((state or {}).get("today") or ""),
        synthesis=pack.synthesis,
    )


def entity_refs(state: Mapping[str, Any]) -> list[EntityRef]:
    """Entities of every table that maps ids to records (``{"orders": {"O-1": {...}}}``)."""
    refs: list[EntityRef] = []
    for table, rows in state.items():
        if not isinstance(rows, dict) or not rows or not all(isinstance(r, dict) for r in rows.values()):
            continue
        for key in sorted(rows):
            row = rows[key]
            attributes: dict[str, str | int | float | bool | None] = {
                a: row[a]
                for a in row
                if (a in ATTRIBUTES or (a.endswith("_id") and row[a] != key))
                and not isinstance(row[a], dict | list)
            }
            products = [i.get("product_id") for i in row.get("items", []) if isinstance(i, dict)]
            if products:
                attributes["product_ids"] = ",".join(dict.fromkeys(str(p) for p in products if p))
            refs.append(EntityRef(kind=table, id=str(key), attributes=attributes))
    return refs


def _references(ref: EntityRef, ids: set[str]) -> set[str]:
    """Ids of other entities ``ref``'s attributes name (``user_id``, ``product_ids`` lists, ...)."""
    named = {v.strip() for value in ref.attributes.values() for v in str(value).split(",")}
    return (named & ids) - {ref.id}


def neighbourhoods(refs: Sequence[EntityRef]) -> list[set[str]]:
    """One coherent slice of the database per entity others refer to (a customer, a product): it,
    the entities that refer to it (their orders) and what those refer to (the orders' products)."""
    ids = {r.id for r in refs}
    names = {r.id: _references(r, ids) for r in refs}
    referrers: dict[str, list[str]] = {}
    for ref in refs:
        for target in names[ref.id]:
            referrers.setdefault(target, []).append(ref.id)
    hoods = []
    for ref in refs:
        if ref.id in referrers:
            around = set(referrers[ref.id])
            hoods.append({ref.id, *around, *(t for r in around for t in names[r])})
    return hoods


def entities_within(
    refs: list[EntityRef], fits: Callable[[list[EntityRef]], bool], seed: int
) -> tuple[list[EntityRef], int]:
    """``refs`` when they fit; else whole neighbourhoods, in a seeded order, while they fit (the
    entities a scenario can be about, with what they relate to). Returns the kept and how many were cut."""
    if fits(refs):
        return refs, 0
    hoods = neighbourhoods(refs)
    random.Random(seed).shuffle(hoods)
    chosen: set[str] = set()
    for hood in hoods:
        trial = chosen | hood
        if fits([r for r in refs if r.id in trial]):
            chosen = trial
    kept = [r for r in refs if r.id in chosen]
    return kept, len(refs) - len(kept)


def _owner_of(row: Mapping[str, Any], owner: str) -> bool:
    return any(k.endswith("_id") and v == owner for k, v in row.items())


def state_slice(state: Mapping[str, Any], draw: PoolDraw) -> dict[str, Any]:
    """The records a draw is about: today, the customer ('user'), the records the draw names (by
    table), and the customer's rows of every list table (their credits, tickets, ...)."""
    owner = draw.context.user_id
    named = set(draw.context.order_ids) | set(draw.context.product_ids)
    records: dict[str, Any] = {"today": state.get("today", ""), "user": {"user_id": owner}}
    for table, rows in state.items():
        if isinstance(rows, dict) and rows and all(isinstance(r, dict) for r in rows.values()):
            if owner in rows:
                records["user"] = rows[owner]
            picked = {k: rows[k] for k in sorted(rows) if k in named}
            if picked:
                records[table] = picked
        elif isinstance(rows, list):
            mine = [r for r in rows if isinstance(r, dict) and _owner_of(r, owner)]
            if mine:
                records[table] = mine
    return copy.deepcopy(records)


# --------------------------------------------------------------------------- RandomPool, UserIntent


async def random_pool(
    gateway: Gateway,
    pack: DomainPack,
    state: Mapping[str, Any],
    seed: int,
    params: PoolParams | None = None,
    sampling: Sampling | None = None,
) -> PoolDraw:
    """RandomPool: a scenario seed on ``state`` (the pack's seeded database)."""
    inputs = RandomPoolInput(
        domain=domain_summary(pack, state),
        seed=seed,
        params=params or PoolParams(),
        entities=entity_refs(state),
    )
    return (await gateway.call(EIGEN_RANDOM_POOL, inputs, sampling)).output


async def user_intent(
    gateway: Gateway,
    pack: DomainPack,
    state: Mapping[str, Any],
    draw: PoolDraw,
    sampling: Sampling | None = None,
) -> UserIntent:
    """UserIntent: a concrete task on ``draw``."""
    return (await gateway.call(EIGEN_USER_INTENT, user_intent_input(pack, state, draw), sampling)).output


def user_intent_input(
    pack: DomainPack, state: Mapping[str, Any], draw: PoolDraw, domain: DomainSummary | None = None
) -> UserIntentInput:
    """The UserIntent worker's input: the draw, the domain, its slice and the pack's goal options."""
    return UserIntentInput(
        draw=draw,
        domain=domain or domain_summary(pack, state),
        records=state_slice(state, draw),
        options=goal_options(pack, state, draw),
    )


# --------------------------------------------------------------------------- the probe


def _cut(value: Any) -> Any:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return value if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "... [cut]"


PROBE_SPACES = ("probe-a", "probe-b")
"""Namespaces of a probe's session, each holding one state: the probe's current one and a trial."""


class _Probe:
    """Runs calls against explicit states in one sandbox session and checks the pack's rules on each.

    Each space of the session holds one state, and the probe knows which (by identity): a call
    from a state a space holds runs there and nothing is shipped in; a call from another state
    loads it into the least recently used space. What comes back is the call's value and, when
    the call changed it, the state after it (the rules read it). ``close`` ends the session."""

    def __init__(self, pack: DomainPack, runner: Runner, timeout_s: float | None) -> None:
        self.pack = pack
        self.runner = runner
        self.timeout_s = timeout_s
        self.rules = rule_functions(pack)
        self.executed: list[ProbeCall] = []
        self._session: EnvSession | None = None
        self._held: dict[str, dict[str, Any]] = {}
        """Space -> the state object its STATE equals."""
        self._spaces = list(PROBE_SPACES)
        """Least recently used first."""

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def _space(self, state: dict[str, Any]) -> tuple[EnvSession, str] | str:
        """A space whose STATE is ``state`` (loaded there if no space holds it), or why the tools
        do not load. A timeout or crash ends a session: the next call opens a new one."""
        if self._session is None or not self._session.alive:
            await self.close()
            self._held.clear()
            self._session = await self.runner.open_session(timeout_s=self.timeout_s)
        session = self._session
        space = next((s for s, held in self._held.items() if held is state), None)
        if space is None:
            space = self._spaces[0]
            self._held.pop(space, None)
            loaded = await load_tools(
                session, self.pack.tools_source, state, space=space, timeout_s=self.timeout_s
            )
            if not loaded.ok:
                return loaded.error or str(loaded.error_type)
            self._held[space] = state
        self._spaces.remove(space)
        self._spaces.append(space)
        return session, space

    async def run(
        self, state: dict[str, Any], call: GoalCall, *, keep: bool = True
    ) -> tuple[bool, Any, str | None, dict[str, Any], list[str]]:
        """(ok, value, error, state after, violations); a failed call leaves the state as it was.

        ``keep=False``: the caller drops the state after, so the space keeps ``state`` (not committed)."""
        where = await self._space(state)
        if isinstance(where, str):
            return False, None, where, state, []
        session, space = where
        done = await call_tool(
            session,
            call.name,
            call.arguments,
            space=space,
            commit=keep,
            with_state=True,
            timeout_s=self.timeout_s,
        )
        if not done.ok:
            return False, None, done.result.error or str(done.result.error_type), state, []
        after = done.state if done.changed and done.state is not None else state
        if keep:
            self._held[space] = after
        record = {
            "name": call.name,
            "arguments": call.arguments,
            "actor": call.actor,
            "ok": True,
            "changed_state": done.changed,
        }
        return True, done.value, None, after, check_rules(self.rules, state, record, after)

    async def step(
        self,
        state: dict[str, Any],
        call: GoalCall,
        purpose: str,
        *,
        goal_index: int | None = None,
        refused_index: int | None = None,
        record: bool = True,
        keep: bool = True,
    ) -> tuple[bool, Any, dict[str, Any], list[str]]:
        ok, value, error, after, violations = await self.run(state, call, keep=keep)
        if record:
            self.executed.append(
                ProbeCall(
                    step=len(self.executed),
                    name=call.name,
                    arguments=call.arguments,
                    actor=call.actor,
                    kind="read" if tool_kind(call.name, self.pack.synthesis) == "read" else "write",
                    purpose=purpose,
                    goal_index=goal_index,
                    refused_index=refused_index,
                    ok=ok,
                    output=_cut(value),
                    error=error,
                    violations=violations,
                )
            )
        return ok, value, after, violations

    async def dry_run(self, state: dict[str, Any], calls: list[GoalCall]) -> bool:
        """All ``calls`` run from ``state`` without an error or a violation (nothing recorded)."""
        for n, call in enumerate(calls):
            ok, _value, state, violations = await self.step(
                state, call, "", record=False, keep=n < len(calls) - 1
            )
            if not ok or violations:
                return False
        return True


def static_problems(pack: DomainPack, intent: UserIntent) -> list[str]:
    """Problems visible without executing: unknown tools, wrong sides, bad argument names."""
    specs = {s["function"]["name"]: ("agent", s) for s in pack.agent_tools}
    specs.update({s["function"]["name"]: ("user", s) for s in pack.user_tools})
    problems = [
        f"must_have_functions names {f!r}, not a tool of {pack.name}"
        for f in intent.must_have_functions
        if f not in specs
    ]
    for label, goals in (("goal", intent.goals), ("refused request", intent.refused)):
        for n, goal in enumerate(goals):
            for call in goal.calls:
                if call.name not in specs:
                    problems.append(f"{label} {n}: unknown tool {call.name!r}")
                    continue
                side, spec = specs[call.name]
                if side != call.actor:
                    problems.append(f"{label} {n}: {call.name} is a {side} tool, called by the {call.actor}")
                problem = argument_error(spec, call.arguments)
                if problem:
                    problems.append(f"{label} {n}: {call.name}: {problem}")
    return problems


def _goal_entity(spec: SynthesisSpec, goal: Goal) -> tuple[str, str, str] | None:
    """(collection, id field, id) of the entity ``goal`` is about: the first argument of its calls
    that names a declared entity (one the agent can read), else None."""
    by_field = {e.id_field: e for e in spec.entities}
    template = spec.template(goal.kind)
    if template is not None and template.entity is not None:
        entity = spec.entity(template.entity)
        by_field = {entity.id_field: entity} if entity is not None else {}
    for call in goal.calls:
        for name, value in call.arguments.items():
            entity = by_field.get(name)
            if entity is not None and isinstance(value, str):
                return entity.collection, entity.id_field, value
    return None


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}.{key}").items()}
    if isinstance(value, list):
        return {k: v for n, item in enumerate(value) for k, v in _flat(item, f"{prefix}[{n}]").items()}
    return {prefix: value}


def _replacements(old: Goal, new: Goal) -> dict[str, str]:
    """old -> new strings for the texts: the requirement, then every argument value that changed."""
    found = {old.requirement: new.requirement} if old.requirement != new.requirement else {}
    for before, after in zip(old.calls, new.calls, strict=False):
        olds, news = _flat(before.arguments), _flat(after.arguments)
        for key, value in olds.items():
            if key not in news or news[key] == value:
                continue
            if isinstance(value, int | float) and not isinstance(value, bool):
                found[f"{float(value):.2f}"] = f"{float(news[key]):.2f}"
            elif isinstance(value, str) and len(value) > 2:
                found[value] = str(news[key])
    return found


async def _alternatives(
    probe: _Probe,
    state: dict[str, Any],
    intent: UserIntent,
    index: int,
    customer_id: str,
    listed: list[str],
) -> list[Alternative]:
    """A working substitute for failing goal ``index``: the goal's template on another of the
    customer's entities, else a smaller amount; each dry-run in the sandbox."""
    goal = intent.goals[index]
    spec = probe.pack.declarations()
    template = spec.template(goal.kind)
    target = _goal_entity(spec, goal)
    if template is not None and target is not None:
        used = {t[2] for g in intent.goals + intent.refused if (t := _goal_entity(spec, g)) is not None}
        rows = state.get(target[0], {})
        candidates = [c for c in listed if c in rows and c not in used] or [
            k for k in sorted(rows) if k not in used and _owner_of(rows[k], customer_id)
        ]
        instances = instances_for(
            spec, template, state, customer_id, candidates[:MAX_CANDIDATES], intent.seed
        )
        for instance in instances:
            calls = goal_of(instance).calls
            if await probe.dry_run(state, calls):
                new = Goal(kind=goal.kind, requirement=instance.requirement, calls=calls)
                evidence = (
                    f"dry run of {[c.name for c in calls]} on {instance.entity_id} "
                    f"({rows[instance.entity_id].get('status', 'found')}) passed every rule"
                )
                return [
                    Alternative(
                        goal_index=index,
                        calls=calls,
                        replacements=_replacements(goal, new),
                        evidence=evidence,
                    )
                ]
        return []
    last = goal.calls[-1]
    if isinstance(last.arguments.get("amount"), int | float):
        amount = float(last.arguments["amount"])
        for smaller in sorted({round(amount / 2, 2), 20.0, 10.0, 5.0}, reverse=True):
            if smaller >= amount:
                continue
            calls = [
                c.model_copy(update={"arguments": {**c.arguments, "amount": smaller}}) if c is last else c
                for c in goal.calls
            ]
            if await probe.dry_run(state, calls):
                return [
                    Alternative(
                        goal_index=index,
                        calls=calls,
                        replacements={f"{amount:.2f}": f"{smaller:.2f}"},
                        evidence=f"dry run with amount {smaller:.2f} passed every rule",
                    )
                ]
    return []


async def probe_task(
    pack: DomainPack,
    state: Mapping[str, Any],
    intent: UserIntent,
    runner: Runner,
    *,
    timeout_s: float | None = None,
) -> ProbeReport:
    """Execute the task's lookups and a dry run of its goals in the sandbox (see the module docstring)."""
    pack.declarations()
    probe = _Probe(pack, runner, timeout_s)
    try:
        return await _probe(probe, pack, state, intent)
    finally:
        await probe.close()


async def _identify(
    probe: _Probe, spec: SynthesisSpec, current: dict[str, Any], intent: UserIntent
) -> tuple[str | None, dict[str, list[str]], dict[str, Any]]:
    """The declared lookups and identity check, as the agent and the customer make them:
    (customer id or None, listed entity ids per collection, state after)."""
    c = spec.customer
    known_key = next((k for k, f in c.known_fields.items() if f == c.lookup_field), c.lookup_field)
    value = intent.known_info.get(known_key, "")
    ok, found, current, _v = await probe.step(
        current, GoalCall(name=c.lookup_tool, arguments={c.lookup_argument: value}), "the customer exists"
    )
    if not ok or not isinstance(found, dict) or c.id_field not in found:
        return None, {}, current
    customer_id = str(found[c.id_field])
    if c.details_tool:
        _ok, _value, current, _v = await probe.step(
            current,
            GoalCall(name=c.details_tool, arguments={c.id_field: customer_id}),
            "the customer's profile",
        )
    listed: dict[str, list[str]] = {}
    for entity in spec.entities:
        if not entity.list_tool:
            continue
        ok, rows, current, _v = await probe.step(
            current,
            GoalCall(name=entity.list_tool, arguments={c.id_field: customer_id}),
            f"the customer's {entity.noun}s (substitutes for failing goals)",
        )
        if ok and isinstance(rows, list):
            listed[entity.collection] = [
                str(r[entity.id_field]) for r in rows if isinstance(r, dict) and entity.id_field in r
            ]
    if c.verify_tool and c.confirm_tool:
        _ok, _value, current, _v = await probe.step(
            current,
            GoalCall(name=c.verify_tool, arguments={c.id_field: customer_id}),
            "identity check started",
        )
        # The customer completes it with what they know (known_info), not with the database's secret.
        knows = {field: intent.known_info.get(key, "") for key, field in c.known_fields.items()}
        arguments = fill(c.confirm_arguments, {"customer": {**knows, c.id_field: customer_id}})
        _ok, _value, current, _v = await probe.step(
            current,
            GoalCall(name=c.confirm_tool, actor="user", arguments=arguments),
            "identity check: the customer completes it",
        )
    return customer_id, listed, current


async def _probe(
    probe: _Probe, pack: DomainPack, state: Mapping[str, Any], intent: UserIntent
) -> ProbeReport:
    spec = pack.declarations()
    problems = static_problems(pack, intent)
    current: dict[str, Any] = json.loads(json.dumps(dict(state)))
    alternatives: list[Alternative] = []
    customer_id, listed, current = await _identify(probe, spec, current, intent)
    if customer_id is None:
        return ProbeReport(executed=probe.executed, problems=problems)
    for index, goal in enumerate(intent.goals):
        if any(p.startswith(f"goal {index}:") for p in problems):
            continue
        before = current
        target = _goal_entity(spec, goal)
        entity = spec.entity(target[0]) if target is not None else None
        if target is not None and entity is not None and entity.read_tool:
            ok, value, _s, _v = await probe.step(
                current,
                GoalCall(name=entity.read_tool, arguments={entity.id_field: target[2]}),
                f"goal {index}: the {entity.noun} exists and its state allows {goal.kind}",
                goal_index=index,
                keep=False,
            )
            if not ok or not isinstance(value, dict):
                alternatives += await _alternatives(
                    probe, before, intent, index, customer_id, listed.get(target[0], [])
                )
                continue
        failed = False
        for call in goal.calls:
            ok, _value, current, violations = await probe.step(
                current, call, f"goal {index}: {goal.requirement}", goal_index=index
            )
            if not ok or violations:
                failed = True
                break
        if failed:
            current = before  # the failing goal is rolled back
            alternatives += await _alternatives(
                probe, before, intent, index, customer_id, listed.get(target[0], []) if target else []
            )
    for index, goal in enumerate(intent.refused):
        trial = current
        for n, call in enumerate(goal.calls):
            ok, _value, trial, violations = await probe.step(
                trial,
                call,
                f"refused request {index}: the policy must forbid it",
                refused_index=index,
                keep=n < len(goal.calls) - 1,
            )
            if not ok or violations:
                break
    return ProbeReport(executed=probe.executed, problems=problems, alternatives=alternatives)


def _probe_failures(report: ProbeReport) -> list[FailureReason]:
    reasons = [FailureReason(category="invalid_arguments", description=p) for p in report.problems]
    for call in report.executed:
        if call.refused_index is None and (not call.ok or call.violations):
            evidence = call.error or "; ".join(call.violations)
            category = "policy_violation" if call.violations else "missing_resource"
            reasons.append(
                FailureReason(
                    category=category,
                    description=f"{call.name}({call.arguments}) failed in the probe: {evidence}",
                    evidence=evidence,
                    goal_index=call.goal_index,
                )
            )
    return reasons


# --------------------------------------------------------------------------- TaskValidation, Modify


async def validate_task(
    intent: UserIntent,
    *,
    gateway: Gateway,
    runner: Runner,
    pack: DomainPack,
    state: Mapping[str, Any],
    sampling: Sampling | None = None,
    timeout_s: float | None = None,
) -> TaskVerdict:
    """TaskValidation: run the probe in the sandbox, then the verdict role on its evidence."""
    report = await probe_task(pack, state, intent, runner, timeout_s=timeout_s)
    inputs = TaskValidationInput(intent=intent, domain=domain_summary(pack, state), probe=report)
    verdict = (await gateway.call(EIGEN_TASK_VALIDATION, inputs, sampling)).output
    failures = _probe_failures(report)
    if verdict.status == "FEASIBLE" and failures:  # execute, don't assume: the evidence wins
        verdict = TaskVerdict(status="INFEASIBLE", failure_reasons=failures, confidence="high")
    return verdict


async def modify_task(
    intent: UserIntent,
    verdict: TaskVerdict,
    round_: int,
    *,
    gateway: Gateway,
    sampling: Sampling | None = None,
) -> tuple[UserIntent, list[Repair]]:
    """Modify (task repair): the repaired intent and the edits made."""
    answer = await gateway.call(
        EIGEN_MODIFY, ModifyInput(intent=intent, verdict=verdict, round=round_), sampling
    )
    return answer.output.repaired_intent, answer.output.repairs_applied


class RepairOutcome(BaseModel):
    """The end of a validate <-> modify loop."""

    accepted: bool = Field(description="The final intent is FEASIBLE.")
    rounds: int = Field(description="Modify rounds done (0: feasible as generated).")
    verdicts: list[TaskVerdict] = Field(description="Every verdict, first to last (rounds + 1 of them).")
    final_intent: UserIntent = Field(description="The last intent validated.")
    reason: str | None = Field(default=None, description="Why it was rejected (the last verdict's reasons).")
    repairs: list[list[Repair]] = Field(default_factory=list, description="The edits of each round.")

    @property
    def plan(self) -> list[Any]:
        return list(self.verdicts[-1].plan) if self.accepted else []


async def validate_with_repair(
    intent: UserIntent,
    *,
    gateway: Gateway,
    runner: Runner,
    pack: DomainPack,
    state: Mapping[str, Any],
    max_rounds: int = MAX_ROUNDS,
    sampling: Sampling | None = None,
    timeout_s: float | None = None,
) -> RepairOutcome:
    """Validate; repair and re-validate up to ``max_rounds`` times; accept or reject with the last reasons."""
    verdicts: list[TaskVerdict] = []
    repairs: list[list[Repair]] = []
    current = intent
    rounds = 0
    while True:
        verdict = await validate_task(
            current,
            gateway=gateway,
            runner=runner,
            pack=pack,
            state=state,
            sampling=sampling,
            timeout_s=timeout_s,
        )
        verdicts.append(verdict)
        if verdict.status == "FEASIBLE":
            return RepairOutcome(
                accepted=True, rounds=rounds, verdicts=verdicts, final_intent=current, repairs=repairs
            )
        if rounds >= max_rounds:
            reason = f"still infeasible after {rounds} repair round(s): " + "; ".join(verdict.reasons)
            return RepairOutcome(
                accepted=False,
                rounds=rounds,
                verdicts=verdicts,
                final_intent=current,
                reason=reason,
                repairs=repairs,
            )
        rounds += 1
        current, edits = await modify_task(current, verdict, rounds, gateway=gateway, sampling=sampling)
        repairs.append(edits)

"""EigenData three-phase self-evolution (§4.3, §4.4): diverse prompt sets, pilot optimisation, drift audit.

- ``plan_workflow``: the Planner role (``eigen_planner``) on a generation request for a pack.
- Phase 1, ``make_prompt_sets(k, ...)``: K prompt sets written one after the other by the Prompt
  Engineer (``eigen_prompt_engineer``), each conditioned on the summaries of all earlier sets; every
  worker prompt is registered in the catalog (``Catalog.register_prompt``: versions queryable per
  role), every set in ``lake.eigen_catalog`` (parameter version 1).
- Phase 2, ``pilot(set, ...)``: up to 16 iterations; each runs a small batch through the workers
  the set's plan names (``synthesis.eigen.pilot_chain.run_item``: RandomPool -> UserIntent ->
  TaskValidation (+ Modify) -> DialogSynthesis -> TrajectoryValidation (+ Modify) ->
  VerificationFunction), every LLM worker with the set's prompt for it, and measures the
  INFEASIBLE share before repair, tool-call validity (the share of the intent's must-have
  functions that exist and whose goal / plan calls are schema-valid), task quality (richness of
  the spec) and its change, the dialogue pass rate and quality, the verified share (items that
  ended as a verified instance) and the calls made per worker role (which workers ran). A
  ``PilotMetrics`` per iteration is returned (and handed to ``publish``, e.g. a producer of
  ``eigen.pilot.metrics``) and logged in the catalog's evolution log
  (``EigenCatalog.record_iteration``: plan, prompt version per worker, metrics). It stops once
  infeasibility <= threshold, validity >= threshold, the dialogue pass rate >= threshold and
  quality is stable; otherwise, with ``evolve``, the Judge (``eigen_judge``) critiques the batch's
  metrics and a sample of its failing tasks / dialogues with the validators' and verifier's
  diagnosis, proposing edits per worker role; the Planner replans from that review (``replan``:
  which workers run next, which workers' prompts may evolve); parameter updates apply while
  RandomPool evolves, and the Prompt Engineer rewrites exactly the prompts of the evolving workers
  that got edits (critique, new prompt versions, plan and parameter version recorded in the
  catalog). With ``evolve=False`` nothing changes between iterations.
- Phase 3, ``detect_drift(history)``: reasons a set in large-scale generation should go back to
  phase 2 (rising repair rounds, new schema errors, falling quality / realism); ``audit`` does it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from arena.config import EigenSettings
from arena.hashing import content_hash
from arena.llm.core import InvalidOutput, Role
from arena.llm.gateway import Gateway, PromptCatalog
from arena.llm.roles.user_sim import USER_SIMULATOR, UserBehaviour
from arena.records.eigen import PilotMetrics, UserIntent
from environments.environment import argument_error
from lake.eigen_catalog import EigenCatalog
from sandbox.env_runtime import Runner
from synthesis.eigen.agents import domain_summary, static_problems
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.pilot_chain import BatchResult, PromptedGateway, run_item, sample_failures
from synthesis.eigen.roles.dialogs import EIGEN_DIALOG_ROLES
from synthesis.eigen.roles.orchestration import (
    EIGEN_JUDGE,
    EIGEN_PLANNER,
    EIGEN_PROMPT_ENGINEER,
    ESSENTIAL_WORKERS,
    PROMPTED_ROLES,
    WORKERS,
    BatchMetrics,
    Critique,
    GenerationRequest,
    JudgeInput,
    ParamUpdate,
    PilotThresholds,
    PlanReview,
    PromptEngineerInput,
    PromptSetDraft,
    PromptSetSummary,
    WorkerPrompt,
    WorkflowPlan,
    standard_plan,
)
from synthesis.eigen.roles.tasks import EIGEN_ROLES, PoolParams, TaskVerdict, template_kinds

__all__ = [
    "MAX_PILOT_ITERATIONS",
    "PILOT_TOPIC",
    "BatchResult",
    "PilotResult",
    "PromptSet",
    "PromptedGateway",
    "audit",
    "detect_drift",
    "make_prompt_sets",
    "measure_batch",
    "pilot",
    "pilot_key",
    "plan_workflow",
    "replan",
    "thresholds_from",
    "workers_run",
]

MAX_PILOT_ITERATIONS = 16
"""Most self-evolution iterations per prompt set (§4.4 phase 2)."""
PILOT_TOPIC = "eigen.pilot.metrics"
log = logging.getLogger(__name__)

_KNOWN_ROLES: dict[str, Role[Any, Any]] = {
    r.name: r for r in (*EIGEN_ROLES, *EIGEN_DIALOG_ROLES, USER_SIMULATOR)
}
"""Every role a prompt set can carry a prompt for (``PROMPTED_ROLES``), with its default prompt."""

Publish = Callable[[PilotMetrics], Awaitable[None] | None]


class PromptSet(BaseModel):
    """One prompt set: a prompt per worker and the generator parameters, as evolved so far."""

    set_id: str
    domain: str
    position: int = Field(ge=0, description="Index among the K sets of phase 1.")
    focus: str
    summary: str = ""
    plan: WorkflowPlan
    params: PoolParams
    prompts: dict[str, str] = Field(description="Worker role -> system prompt.")
    prompt_versions: dict[str, str] = Field(
        default_factory=dict, description="Worker role -> prompt version id."
    )
    guidance: list[str] = Field(default_factory=list, description="Prompt edits applied so far.")
    worker_guidance: dict[str, list[str]] = Field(
        default_factory=dict, description="Worker role -> the prompt edits applied to its prompt so far."
    )
    parent: str | None = None
    conditioned_on: list[str] = Field(default_factory=list)
    version: int = 1

    def role(self, base: Role[Any, Any]) -> Role[Any, Any]:
        """``base`` with this set's prompt for it (the role name, and so the rule, stays).

        ``gateway`` below does this for every call a worker makes."""
        system = self.prompts.get(base.name)
        return base if system is None else dataclasses.replace(base, system=system)

    def gateway(self, gateway: Gateway) -> PromptedGateway:
        """``gateway`` calling every role with this set's prompt for it: hand it to any worker function."""
        return PromptedGateway(gateway, self.prompts)

    def summary_for_later(self) -> PromptSetSummary:
        return PromptSetSummary(
            set_id=self.set_id,
            focus=self.focus,
            personas=[p.role for p in self.params.personas],
            task_kinds=list(self.params.task_kinds),
            summary=self.summary,
        )


def _prompt_text(role_name: str, system: str) -> str:
    """What is versioned for a worker prompt (for gateway roles: exactly ``Role.prompt_text``)."""
    known = _KNOWN_ROLES.get(role_name)
    if known is not None:
        return dataclasses.replace(known, system=system).prompt_text
    return f"{system}\n---\n{{input}}"


def _defaults(roles: Mapping[str, Any]) -> dict[str, str]:
    """The default prompt of each of ``roles`` (a set written before its worker was planned has none)."""
    return {r: _KNOWN_ROLES[r].system for r in roles if r in _KNOWN_ROLES}


def _register(catalog: PromptCatalog | None, prompts: Mapping[str, str]) -> dict[str, str]:
    """Register every prompt; worker role -> version id (the content hash, catalog or not)."""
    versions: dict[str, str] = {}
    for role_name, system in prompts.items():
        text = _prompt_text(role_name, system)
        if catalog is not None:
            versions[role_name] = catalog.register_prompt(role_name, text).id
        else:
            versions[role_name] = content_hash({"role": role_name, "text": text}, prefix="pv-", length=24)
    return versions


# --------------------------------------------------------------------------- planning, phase 1


async def plan_workflow(
    gateway: Gateway,
    pack: DomainPack,
    state: Mapping[str, Any] | None = None,
    *,
    request: str | None = None,
    size: int = 100,
    outputs: Sequence[str] = ("sft", "rl"),
) -> WorkflowPlan:
    """The Planner's worker DAG for generating ``size`` instances of ``pack``'s domain."""
    inputs = GenerationRequest.model_validate(
        {
            "request": request or f"generate {pack.name} tasks and dialogs that require tool use",
            "domain": domain_summary(pack, state).model_dump(),
            "size": size,
            "outputs": list(outputs),
        }
    )
    try:
        plan: WorkflowPlan = (await gateway.call(EIGEN_PLANNER, inputs)).output
    except InvalidOutput as exc:
        # A model that cannot plan (a small one) still gets §4.2's workflow, and says so.
        names = {name for name, _ in WORKERS if name != "VerificationFunction" or "rl" in outputs}
        reason = f"the planner wrote no usable plan ({_last_error(exc)}): the standard workflow of §4.2"
        log.warning("%s for %s", reason, pack.name)
        return standard_plan(names, rationale=reason)
    plan.check()
    return plan


def _last_error(exc: InvalidOutput) -> str:
    return (exc.errors[-1] if exc.errors else str(exc))[:300]


async def make_prompt_sets(
    k: int,
    *,
    gateway: Gateway,
    pack: DomainPack,
    state: Mapping[str, Any] | None = None,
    params: PoolParams | None = None,
    plan: WorkflowPlan | None = None,
    catalog: PromptCatalog | None = None,
    store: EigenCatalog | None = None,
) -> list[PromptSet]:
    """Phase 1: K prompt sets, each written conditioned on the summaries of the ones before it."""
    if k < 1:
        raise ValueError("k must be at least 1")
    plan = plan or await plan_workflow(gateway, pack, state)
    domain = domain_summary(pack, state)
    roles = [r for w in plan.workers for r in PROMPTED_ROLES.get(w.name, ()) if r in _KNOWN_ROLES]
    base = [WorkerPrompt(worker=r, system=_KNOWN_ROLES[r].system) for r in roles]
    sets: list[PromptSet] = []
    for position in range(k):
        inputs = PromptEngineerInput(
            set_index=position,
            domain=domain,
            plan=plan,
            params=params or PoolParams(),
            base_prompts=base,
            earlier=[s.summary_for_later() for s in sets],
        )
        try:
            draft = (await gateway.call(EIGEN_PROMPT_ENGINEER, inputs)).output
        except InvalidOutput as exc:
            if not base:
                raise
            # A model that cannot write prompts (a small one) pilots the roles' own prompts, and says so.
            reason = f"the prompt engineer wrote no usable prompt set ({_last_error(exc)})"
            log.warning("%s for %s set %d: piloting the base prompts", reason, pack.name, position)
            draft = PromptSetDraft(
                focus=f"base prompts, set {position}",
                prompts=base,
                params=params or PoolParams(),
                summary=f"{reason}; the workers' base prompts, unchanged",
            )
        prompts = {p.worker: p.system for p in draft.prompts}
        set_id = content_hash(
            {"domain": pack.name, "position": position, "focus": draft.focus, "prompts": prompts},
            prefix="ps-",
            length=16,
        )
        versions = await asyncio.to_thread(_register, catalog, prompts)
        prompt_set = PromptSet(
            set_id=set_id,
            domain=pack.name,
            position=position,
            focus=draft.focus,
            summary=draft.summary,
            plan=plan,
            params=draft.params,
            prompts=prompts,
            prompt_versions=versions,
            parent=sets[-1].set_id if sets else None,
            conditioned_on=[s.set_id for s in sets],
        )
        if store is not None:
            await asyncio.to_thread(
                store.record_set,
                set_id=set_id,
                domain=pack.name,
                position=position,
                params=prompt_set.params.model_dump(mode="json"),
                prompt_versions=versions,
                parent=prompt_set.parent,
                focus=prompt_set.focus,
                summary=prompt_set.summary,
                snapshot=prompt_set.model_dump_json(),
            )
        sets.append(prompt_set)
    return sets


# --------------------------------------------------------------------------- phase 2: measuring


def _validity(pack: DomainPack, intent: UserIntent, verdict: TaskVerdict | None) -> float:
    """Share of must-have functions that exist and whose goal / plan calls are schema-valid."""
    specs = {s["function"]["name"]: s for s in pack.agent_tools + pack.user_tools}
    calls = [(c.name, c.arguments) for g in intent.goals + intent.refused for c in g.calls]
    if verdict is not None:
        calls += [(s.function, s.arguments) for s in verdict.plan]
    functions = list(dict.fromkeys(intent.must_have_functions))
    if not functions:
        return 0.0
    valid = 0
    for name in functions:
        spec = specs.get(name)
        if spec is not None and all(argument_error(spec, args) is None for n, args in calls if n == name):
            valid += 1
    return valid / len(functions)


def _quality(intent: UserIntent, params: PoolParams) -> float:
    """Richness of the spec: rubrics, hidden subgoals, must-nots, distinct requirements, call budget."""
    checks = [
        bool(intent.rubrics),
        bool(intent.hidden_subgoals),
        bool(intent.must_not),
        bool(intent.requirements) and len(set(intent.requirements)) == len(intent.requirements),
        params.min_calls <= intent.difficulty.required_calls <= params.max_calls,
        bool(intent.reason_for_call.strip()),
    ]
    return sum(checks) / len(checks)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _dialogue_metrics(results: Sequence[BatchResult]) -> dict[str, Any]:
    """Dialogue pass rate and quality (mean dimension score) over the items that got a verdict."""
    judged = [r.dialog_verdict for r in results if r.dialog_verdict is not None]
    scores = [_mean([d.score for d in v.ratings.values()]) for v in judged]
    return {
        "dialogues": sum(1 for r in results if r.dialog is not None),
        "dialogue_pass_rate": _mean([1.0 if v.passed else 0.0 for v in judged]),
        "dialogue_first_pass_rate": _mean(
            [1.0 if r.first_dialog_passed else 0.0 for r in results if r.first_dialog_passed is not None]
        ),
        "dialogue_quality": _mean([s for s in scores if s is not None]),
    }


def measure_batch(
    pack: DomainPack, params: PoolParams, results: Sequence[BatchResult], plan: WorkflowPlan | None = None
) -> BatchMetrics:
    """The batch's metrics (see the module docstring); ``plan`` says which workers ran."""
    done = [r for r in results if r.intent is not None]
    validated = [r for r in done if r.verdict is not None]
    size = len(done)
    available = template_kinds(domain_summary(pack))  # the pack's declared goal kinds
    seen = sorted({g.kind for r in done if r.intent for g in r.intent.goals})
    infeasible = [r for r in validated if r.verdict and r.verdict.status == "INFEASIBLE"]
    shares: dict[str, float] = {}
    examples: list[str] = []
    for r in infeasible:
        assert r.verdict is not None
        for category in sorted({f.category for f in r.verdict.failure_reasons}):
            shares[category] = shares.get(category, 0.0) + 1.0 / max(1, len(validated))
        examples += r.verdict.reasons[:1]
    schema_errors = sorted({p for r in done if r.intent for p in static_problems(pack, r.intent)})
    rounds = [r.repair_rounds for r in done if r.repair_rounds is not None]
    stages: dict[str, int] = {}
    for r in results:
        if r.failed_at is not None:
            stages[r.failed_at] = stages.get(r.failed_at, 0) + 1
    verifying = plan is None or plan.runs("VerificationFunction")
    return BatchMetrics(
        size=size,
        generation_failures=len(results) - size,
        infeasibility=len(infeasible) / len(validated) if validated else (None if size else 1.0),
        failure_shares={c: round(s, 4) for c, s in shares.items()},
        tool_call_validity=(
            sum(_validity(pack, r.intent, r.verdict) for r in done if r.intent) / size if size else 0.0
        ),
        quality=sum(_quality(r.intent, params) for r in done if r.intent) / size if size else 0.0,
        coverage=len([k for k in seen if k in available]) / len(available) if available else 0.0,
        kinds_seen=seen,
        kinds_available=available,
        mean_required_calls=(
            sum(r.intent.difficulty.required_calls for r in done if r.intent) / size if size else 0.0
        ),
        mean_repair_rounds=sum(rounds) / len(rounds) if rounds else None,
        schema_errors=schema_errors[:10],
        examples=examples[:3],
        **_dialogue_metrics(results),
        verified_share=(
            sum(1 for r in results if r.verified) / len(results)
            if verifying and any(r.dialog is not None for r in results)
            else None
        ),
        needed_repair=sum(1 for r in done if r.needed_repair),
        repaired=sum(
            1
            for r in done
            if r.needed_repair and r.task_accepted is not False and r.dialogue_passed is not False
        ),
        failures_by_stage=stages,
    )


def workers_run(plan: WorkflowPlan, repair: bool = True) -> list[str]:
    """The workers a pilot batch runs under ``plan`` (``repair=False``: never Modify)."""
    return [w for w in plan.names if repair or w != "Modify"]


def _values(
    batch: BatchMetrics,
    current: PromptSet,
    previous: BatchMetrics | None,
    calls: Mapping[str, int],
    ran: Sequence[str],
) -> dict[str, float]:
    """The ``PilotMetrics`` of one iteration: batch figures, changes, knobs, calls per worker role."""
    values: dict[str, float] = {
        "tool_call_validity": round(batch.tool_call_validity, 4),
        "quality": round(batch.quality, 4),
        "quality_change": round(abs(batch.quality - previous.quality), 4) if previous is not None else 0.0,
        "coverage": round(batch.coverage, 4),
        "mean_required_calls": round(batch.mean_required_calls, 4),
        "size": float(batch.size),
        "generation_failures": float(batch.generation_failures),
        "schema_errors": float(len(batch.schema_errors)),
        "param_version": float(current.version),
        "error_prone_parameters": current.params.error_prone_parameters,
        "policy_pressure": current.params.policy_pressure,
        "dialogues": float(batch.dialogues),
        "needed_repair": float(batch.needed_repair),
        "repaired": float(batch.repaired),
        "workers_run": float(len(ran)),
    }
    for key in (
        "infeasibility",
        "dialogue_pass_rate",
        "dialogue_first_pass_rate",
        "dialogue_quality",
        "verified_share",
    ):
        value = getattr(batch, key)
        if value is not None:
            values[key] = round(float(value), 4)
    values.update({f"failure_{c}": s for c, s in batch.failure_shares.items()})
    values.update({f"failed_at_{stage}": float(n) for stage, n in batch.failures_by_stage.items()})
    values.update({f"calls_{role}": float(n) for role, n in sorted(calls.items())})
    if batch.mean_repair_rounds is not None:
        values["repair_rounds"] = round(batch.mean_repair_rounds, 4)
    return values


# --------------------------------------------------------------------------- phase 2: the loop


class PilotResult(BaseModel):
    """The end of a pilot: the set as evolved, a PilotMetrics per iteration, the critiques."""

    prompt_set: PromptSet
    metrics: list[PilotMetrics]
    critiques: list[Critique] = Field(default_factory=list)
    plans: list[WorkflowPlan] = Field(default_factory=list, description="The plan each iteration ran.")
    converged: bool = False

    @property
    def infeasibility(self) -> list[float]:
        """Per iteration that measured it (one whose plan ran TaskValidation)."""
        return [m.metrics["infeasibility"] for m in self.metrics if "infeasibility" in m.metrics]

    def series(self, key: str) -> list[float | None]:
        """One metric over the iterations (None where an iteration has none)."""
        return [m.metrics.get(key) for m in self.metrics]


def _apply_updates(params: PoolParams, updates: Sequence[ParamUpdate]) -> PoolParams:
    merged = params.model_dump()
    for u in updates:
        merged[u.name] = u.value
    if merged["min_calls"] > merged["max_calls"]:
        merged["max_calls"] = merged["min_calls"]
    return PoolParams.model_validate(merged)


def _converged(metrics: BatchMetrics, previous: BatchMetrics | None, t: PilotThresholds) -> bool:
    """§4.4 phase 2: tasks feasible, calls valid, dialogues passing, and quality stable."""
    if metrics.infeasibility is not None and metrics.infeasibility > t.max_infeasibility:
        return False
    if metrics.tool_call_validity < t.min_validity:
        return False
    if metrics.dialogue_pass_rate is not None and metrics.dialogue_pass_rate < t.min_dialogue_pass_rate:
        return False
    if t.max_quality_change is None:
        return True
    if previous is None or abs(metrics.quality - previous.quality) > t.max_quality_change:
        return False
    now, before = metrics.dialogue_quality, previous.dialogue_quality
    return now is None or before is None or abs(now - before) <= t.max_quality_change


async def _publish(publish: Publish | None, record: PilotMetrics) -> None:
    if publish is None:
        return
    result = publish(record)
    if inspect.isawaitable(result):
        await result


def _check_plan(plan: WorkflowPlan) -> None:
    missing = [w for w in ESSENTIAL_WORKERS if not plan.runs(w)]
    if missing:
        raise ValueError(f"the workflow plan lacks {missing}: a pilot needs tasks to work on")
    plan.check()


async def pilot(
    prompt_set: PromptSet,
    *,
    gateway: Gateway,
    runner: Runner,
    pack: DomainPack,
    state: Mapping[str, Any],
    iterations: int = MAX_PILOT_ITERATIONS,
    batch_size: int = 8,
    thresholds: PilotThresholds | None = None,
    evolve: bool = True,
    seed: int = 0,
    repair: bool = True,
    catalog: PromptCatalog | None = None,
    store: EigenCatalog | None = None,
    publish: Publish | None = None,
    timeout_s: float | None = None,
    behaviour: UserBehaviour | None = None,
) -> PilotResult:
    """Phase 2 on one prompt set (see the module docstring); batch ``i`` uses seeds ``seed + i * batch_size ...``.

    ``repair=False`` never runs Modify, whatever the plan says; ``behaviour`` is the simulated
    user's (the ``[user_sim]`` rates phase 3 uses too).
    """
    if not 1 <= iterations <= MAX_PILOT_ITERATIONS:
        raise ValueError(f"iterations must be within 1..{MAX_PILOT_ITERATIONS}")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    t = thresholds or PilotThresholds()
    current = prompt_set.model_copy(deep=True)
    _check_plan(current.plan)
    run = 0
    if store is not None:
        await asyncio.to_thread(store.set_phase, current.set_id, 2)
        run = await asyncio.to_thread(store.next_pilot_run, current.set_id)
    records: list[PilotMetrics] = []
    critiques: list[Critique] = []
    plans: list[WorkflowPlan] = []
    previous: BatchMetrics | None = None
    converged = False
    for iteration in range(iterations):
        seeds = [seed + iteration * batch_size + j for j in range(batch_size)]
        prompted = current.gateway(gateway)
        results = await asyncio.gather(
            *(
                run_item(
                    s,
                    plan=current.plan,
                    params=current.params,
                    gateway=prompted,
                    runner=runner,
                    pack=pack,
                    state=state,
                    repair=repair,
                    timeout_s=timeout_s,
                    behaviour=behaviour,
                )
                for s in seeds
            )
        )
        plans.append(current.plan)
        batch = measure_batch(pack, current.params, results, current.plan)
        record = PilotMetrics(
            prompt_set=current.set_id,
            iteration=iteration,
            metrics=_values(batch, current, previous, prompted.calls, workers_run(current.plan, repair)),
        )
        records.append(record)
        await _publish(publish, record)
        if store is not None:
            await asyncio.to_thread(
                _log_iteration, store, current, run, iteration, record, prompted.calls, repair
            )
        if _converged(batch, previous, t):
            converged = True
            break
        previous = batch
        if not evolve or iteration == iterations - 1:
            continue
        judged = JudgeInput(
            set_id=current.set_id,
            iteration=iteration,
            params=current.params,
            metrics=batch,
            targets=t,
            failures=sample_failures(list(results)),
            workers=[r for w in current.plan.workers for r in PROMPTED_ROLES.get(w.name, ())],
        )
        critique = (await gateway.call(EIGEN_JUDGE, judged)).output
        critiques.append(critique)
        plan = await replan(gateway, pack, state, current.plan, batch, critique, iteration, t)
        before = current.version
        current, applied = await _evolve(
            current, critique, plan, gateway=gateway, pack=pack, state=state, catalog=catalog
        )
        if store is not None:
            await asyncio.to_thread(
                _record_evolution,
                store,
                current,
                critique,
                applied,
                iteration,
                batch,
                current.version != before,
            )
    if store is not None and converged:
        await asyncio.to_thread(store.set_phase, current.set_id, 3)
    return PilotResult(
        prompt_set=current, metrics=records, critiques=critiques, plans=plans, converged=converged
    )


async def replan(
    gateway: Gateway,
    pack: DomainPack,
    state: Mapping[str, Any],
    plan: WorkflowPlan,
    batch: BatchMetrics,
    critique: Critique,
    iteration: int,
    targets: PilotThresholds,
) -> WorkflowPlan:
    """The Planner's workflow for the next pilot batch, from the plan in use and the batch's review."""
    edits: dict[str, int] = {}
    for edit in critique.prompt_edits:
        edits[edit.worker] = edits.get(edit.worker, 0) + 1
    review = PlanReview(
        plan=plan,
        iteration=iteration,
        size=batch.size,
        infeasibility=batch.infeasibility,
        tool_call_validity=batch.tool_call_validity,
        needed_repair=batch.needed_repair,
        repaired=batch.repaired,
        dialogue_pass_rate=batch.dialogue_pass_rate,
        edits_by_worker=edits,
        targets=targets,
        findings=critique.findings,
    )
    inputs = GenerationRequest.model_validate(
        {
            "request": f"pilot the {pack.name} prompt set: replan after iteration {iteration}",
            "domain": domain_summary(pack, state).model_dump(),
            "outputs": ["sft", "rl"] if plan.runs("VerificationFunction") else ["sft"],
            "review": review.model_dump(),
        }
    )
    try:
        new: WorkflowPlan = (await gateway.call(EIGEN_PLANNER, inputs)).output
    except InvalidOutput as exc:
        log.warning(
            "the planner wrote no usable plan (%s); the pilot keeps the plan in use", _last_error(exc)
        )
        return plan
    _check_plan(new)
    return new


async def _evolve(
    current: PromptSet,
    critique: Critique,
    plan: WorkflowPlan,
    *,
    gateway: Gateway,
    pack: DomainPack,
    state: Mapping[str, Any],
    catalog: PromptCatalog | None,
) -> tuple[PromptSet, list[dict[str, Any]]]:
    """Apply the critique under the new ``plan``; the set as it is now and what was applied (or skipped).

    Parameter updates apply while RandomPool evolves; each prompt edit goes to its worker's
    guidance while that worker evolves (frozen or unplanned: recorded as skipped); the Prompt
    Engineer then rewrites exactly the prompts whose guidance changed.
    """
    evolving = set(plan.evolving_roles())
    applied: list[dict[str, Any]] = []
    params = current.params
    if critique.param_updates and "eigen_random_pool" in evolving:
        params = _apply_updates(current.params, critique.param_updates)
        applied += [u.model_dump(mode="json") for u in critique.param_updates]
    elif critique.param_updates:
        applied += [
            {**u.model_dump(mode="json"), "skipped": "RandomPool frozen by the plan"}
            for u in critique.param_updates
        ]
    worker_guidance = {role: list(lines) for role, lines in current.worker_guidance.items()}
    for edit in critique.prompt_edits:
        if edit.worker not in evolving:
            applied.append({**edit.model_dump(mode="json"), "skipped": "worker not evolving in the plan"})
            continue
        lines = worker_guidance.setdefault(edit.worker, [])
        if edit.text not in lines:
            lines.append(edit.text)
        applied.append(edit.model_dump(mode="json"))
    changed = {r: g for r, g in worker_guidance.items() if g != current.worker_guidance.get(r, [])}
    prompts, versions = current.prompts, current.prompt_versions
    if changed:
        revision = PromptEngineerInput(
            set_index=current.position,
            domain=domain_summary(pack, state),
            plan=plan,
            params=params,
            current=[
                WorkerPrompt(worker=w, system=s) for w, s in {**_defaults(changed), **current.prompts}.items()
            ],
            focus=current.focus,
            guidance=[g for lines in worker_guidance.values() for g in lines],
            worker_guidance=changed,
        )
        draft = (await gateway.call(EIGEN_PROMPT_ENGINEER, revision)).output
        revised = {p.worker: p.system for p in draft.prompts if p.worker in changed}
        prompts = {**current.prompts, **revised}  # only the edited workers' prompts change
        versions = {**current.prompt_versions, **await asyncio.to_thread(_register, catalog, revised)}
    if params == current.params and prompts == current.prompts and plan == current.plan:
        return current, applied
    guidance = list(dict.fromkeys(current.guidance + [g for lines in changed.values() for g in lines]))
    evolved = current.model_copy(
        update={
            "params": params,
            "prompts": prompts,
            "prompt_versions": versions,
            "guidance": guidance,
            "worker_guidance": worker_guidance,
            "plan": plan,
            "version": current.version + 1,
        }
    )
    return evolved, applied


def _record_evolution(
    store: EigenCatalog,
    current: PromptSet,
    critique: Critique,
    applied: list[dict[str, Any]],
    iteration: int,
    batch: BatchMetrics,
    changed: bool,
) -> None:
    store.record_critique(
        current.set_id, iteration, critique.model_dump(mode="json"), applied, batch.model_dump(mode="json")
    )
    if changed:
        reasons = [u.reason for u in critique.param_updates if u.reason]
        edited = sorted({a["worker"] for a in applied if "worker" in a and "skipped" not in a})
        if edited:
            reasons.append("prompt edits for " + ", ".join(edited))
        reasons.append(f"plan: {current.plan.rationale}")
        store.record_param_version(
            current.set_id,
            params=current.params.model_dump(mode="json"),
            prompt_versions=current.prompt_versions,
            iteration=iteration,
            reason=f"critique of iteration {iteration}: " + "; ".join(reasons),
            snapshot=current.model_dump_json(),
        )


def _log_iteration(
    store: EigenCatalog,
    current: PromptSet,
    run: int,
    iteration: int,
    record: PilotMetrics,
    calls: Mapping[str, int],
    repair: bool,
) -> None:
    """The evolution log's row: what ran, with which prompt versions, and what it measured."""
    store.record_iteration(
        current.set_id,
        run=run,
        iteration=iteration,
        version=current.version,
        workers=workers_run(current.plan, repair),
        frozen=[w.name for w in current.plan.workers if not w.evolve],
        prompt_versions=current.prompt_versions,
        metrics=record.metrics,
        calls=dict(calls),
        rationale=current.plan.rationale,
    )


def thresholds_from(cfg: EigenSettings) -> PilotThresholds:
    """The pilot's convergence thresholds as configured (``ARENA_EIGEN__*``)."""
    return PilotThresholds(
        max_infeasibility=cfg.max_infeasibility,
        min_validity=cfg.min_validity,
        max_quality_change=cfg.max_quality_change,
    )


def pilot_key(record: PilotMetrics) -> str:
    """Key of a ``eigen.pilot.metrics`` record: the content hash of the whole record.

    Not (set, iteration): a set sent back to phase 2 pilots again from iteration 0, and its second
    pilot must not overwrite the first one's records in the lake; a replay is still idempotent.
    """
    return content_hash(record.model_dump(mode="json"), prefix="pm-", length=24)


# --------------------------------------------------------------------------- phase 3: drift


def _series(history: Sequence[PilotMetrics | Mapping[str, float]], key: str) -> list[float]:
    values: list[float] = []
    for entry in history:
        metrics = entry.metrics if isinstance(entry, PilotMetrics) else entry
        if key in metrics:
            values.append(float(metrics[key]))
    return values


def detect_drift(
    history: Sequence[PilotMetrics | Mapping[str, float]],
    *,
    window: int = 3,
    repair_rise: float = 0.3,
    quality_drop: float = 0.1,
) -> list[str]:
    """Why the audited samples of a set in large-scale generation say it drifted ([] when not).

    Compares the mean of the last ``window`` audits with the first ``window`` (the baseline):
    rising ``repair_rounds``, more ``schema_errors`` than the baseline ever had, falling
    ``quality`` or ``realism``. A non-empty answer sends the set back to phase 2.
    """
    reasons: list[str] = []

    def halves(values: list[float]) -> tuple[list[float], list[float]] | None:
        if len(values) < 2:
            return None
        w = max(1, min(window, len(values) // 2))
        return values[:w], values[-w:]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    split = halves(_series(history, "repair_rounds"))
    if split is not None:
        base, recent = split
        if mean(recent) - mean(base) > repair_rise:
            reasons.append(f"repair rounds rising: {mean(base):.2f} -> {mean(recent):.2f}")
    split = halves(_series(history, "schema_errors"))
    if split is not None:
        base, recent = split
        if max(recent) > max(base):
            reasons.append(f"new schema errors: {max(base):.0f} -> {max(recent):.0f} per audit")
    for key in ("quality", "realism"):
        split = halves(_series(history, key))
        if split is not None:
            base, recent = split
            if mean(base) - mean(recent) > quality_drop:
                reasons.append(f"{key} falling: {mean(base):.2f} -> {mean(recent):.2f}")
    return reasons


def audit(
    prompt_set: PromptSet,
    history: Sequence[PilotMetrics | Mapping[str, float]],
    store: EigenCatalog | None = None,
    **kwargs: Any,
) -> list[str]:
    """Phase 3 audit: ``detect_drift``; on drift the set goes back to phase 2 in ``store``."""
    reasons = detect_drift(history, **kwargs)
    if reasons and store is not None:
        store.set_phase(prompt_set.set_id, 2)
    return reasons

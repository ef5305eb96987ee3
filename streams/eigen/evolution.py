"""EigenData three-phase self-evolution (§4.3, §4.4): diverse prompt sets, pilot optimisation, drift audit.

- ``plan_workflow``: the Planner role (``eigen_planner``) on a generation request for a pack.
- Phase 1, ``make_prompt_sets(k, ...)``: K prompt sets written one after the other by the Prompt
  Engineer (``eigen_prompt_engineer``), each conditioned on the summaries of all earlier sets; every
  worker prompt is registered in the catalog (``Catalog.register_prompt``: versions queryable per
  role), every set in ``lake.eigen_catalog`` (parameter version 1).
- Phase 2, ``pilot(set, ...)``: up to 16 iterations; each draws a small batch with the set's
  prompts and parameters (RandomPool -> UserIntent -> the TaskValidation probe in the sandbox, from
  ``streams.eigen.workers``) and measures the INFEASIBLE share before repair, tool-call validity
  (the share of the intent's must-have functions that exist and whose goal / plan calls are
  schema-valid), task quality (richness of the spec) and its change. A ``PilotMetrics`` per
  iteration is returned (and handed to ``publish``, e.g. a producer of ``eigen.pilot.metrics``).
  It stops once infeasibility <= threshold, validity >= threshold and quality is stable; otherwise,
  with ``evolve``, the Judge (``eigen_judge``) critiques the batch, its parameter updates are
  applied and the Prompt Engineer revises the prompts with its edits (critique, new prompt
  versions and the new parameter version recorded in the catalog). With ``evolve=False`` nothing
  changes between iterations.
- Phase 3, ``detect_drift(history)``: reasons a set in large-scale generation should go back to
  phase 2 (rising repair rounds, new schema errors, falling quality / realism); ``audit`` does it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from arena.config import EigenSettings
from arena.hashing import content_hash
from arena.llm.core import InvalidOutput, Role, Undecidable
from arena.llm.gateway import Gateway, PromptCatalog
from arena.llm.roles.eigen import (
    EIGEN_RANDOM_POOL,
    EIGEN_ROLES,
    EIGEN_USER_INTENT,
    GOAL_TEMPLATES,
    PoolParams,
    RandomPoolInput,
    TaskVerdict,
    UserIntent,
    UserIntentInput,
)
from arena.llm.roles.eigen_orchestration import (
    EIGEN_JUDGE,
    EIGEN_PLANNER,
    EIGEN_PROMPT_ENGINEER,
    BatchMetrics,
    Critique,
    GenerationRequest,
    JudgeInput,
    ParamUpdate,
    PilotThresholds,
    PromptEngineerInput,
    PromptSetSummary,
    WorkerPrompt,
    WorkflowPlan,
)
from arena.records.eigen import PilotMetrics
from environments.environment import argument_error
from lake.eigen_catalog import EigenCatalog
from sandbox.env_runtime import Runner
from streams.eigen.packs import DomainPack
from streams.eigen.workers import (
    MAX_ROUNDS,
    domain_summary,
    entity_refs,
    state_slice,
    static_problems,
    validate_task,
    validate_with_repair,
)

__all__ = [
    "MAX_PILOT_ITERATIONS",
    "PILOT_TOPIC",
    "BatchResult",
    "PilotResult",
    "PromptSet",
    "audit",
    "detect_drift",
    "make_prompt_sets",
    "measure_batch",
    "pilot",
    "pilot_key",
    "plan_workflow",
    "thresholds_from",
]

MAX_PILOT_ITERATIONS = 16
"""Most self-evolution iterations per prompt set (§4.4 phase 2)."""
PILOT_TOPIC = "eigen.pilot.metrics"
_KNOWN_ROLES: dict[str, Role[Any, Any]] = {r.name: r for r in EIGEN_ROLES}

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
    parent: str | None = None
    conditioned_on: list[str] = Field(default_factory=list)
    version: int = 1

    def role(self, base: Role[Any, Any]) -> Role[Any, Any]:
        """``base`` with this set's prompt for it (the role name, and so the rule, stays)."""
        system = self.prompts.get(base.name)
        return base if system is None else dataclasses.replace(base, system=system)

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
    plan = (await gateway.call(EIGEN_PLANNER, inputs)).output
    plan.check()
    return plan


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
    base = [WorkerPrompt(worker=r.name, system=r.system) for r in EIGEN_ROLES]
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
        draft = (await gateway.call(EIGEN_PROMPT_ENGINEER, inputs)).output
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


class BatchResult(BaseModel):
    """One generated task of a pilot batch and what validation said."""

    seed: int
    intent: UserIntent | None = None
    verdict: TaskVerdict | None = Field(default=None, description="The first verdict (before repair).")
    repair_rounds: int | None = None
    error: str | None = Field(default=None, description="Why no intent came (generation failure).")


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


def measure_batch(pack: DomainPack, params: PoolParams, results: Sequence[BatchResult]) -> BatchMetrics:
    """The batch's metrics (see the module docstring)."""
    done = [r for r in results if r.intent is not None and r.verdict is not None]
    size = len(done)
    available = [k for k in GOAL_TEMPLATES if k in set(pack.agent_tool_names)]
    seen = sorted({g.kind for r in done if r.intent for g in r.intent.goals})
    infeasible = [r for r in done if r.verdict and r.verdict.status == "INFEASIBLE"]
    shares: dict[str, float] = {}
    examples: list[str] = []
    for r in infeasible:
        assert r.verdict is not None
        for category in sorted({f.category for f in r.verdict.failure_reasons}):
            shares[category] = shares.get(category, 0.0) + 1.0 / max(1, size)
        examples += r.verdict.reasons[:1]
    schema_errors = sorted({p for r in done if r.intent for p in static_problems(pack, r.intent)})
    rounds = [r.repair_rounds for r in done if r.repair_rounds is not None]
    return BatchMetrics(
        size=size,
        generation_failures=len(results) - size,
        infeasibility=len(infeasible) / size if size else 1.0,
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
    )


async def _one(
    seed: int,
    prompt_set: PromptSet,
    *,
    gateway: Gateway,
    runner: Runner,
    pack: DomainPack,
    state: Mapping[str, Any],
    repair: bool,
    timeout_s: float | None,
) -> BatchResult:
    domain = domain_summary(pack, state)
    try:
        draw = (
            await gateway.call(
                prompt_set.role(EIGEN_RANDOM_POOL),
                RandomPoolInput(
                    domain=domain, seed=seed, params=prompt_set.params, entities=entity_refs(state)
                ),
            )
        ).output
        intent = (
            await gateway.call(
                prompt_set.role(EIGEN_USER_INTENT),
                UserIntentInput(draw=draw, domain=domain, records=state_slice(state, draw)),
            )
        ).output
    except (Undecidable, InvalidOutput) as exc:
        return BatchResult(seed=seed, error=f"{type(exc).__name__}: {exc}")
    if repair:
        outcome = await validate_with_repair(
            intent,
            gateway=gateway,
            runner=runner,
            pack=pack,
            state=state,
            max_rounds=MAX_ROUNDS,
            timeout_s=timeout_s,
        )
        return BatchResult(
            seed=seed, intent=intent, verdict=outcome.verdicts[0], repair_rounds=outcome.rounds
        )
    verdict = await validate_task(
        intent, gateway=gateway, runner=runner, pack=pack, state=state, timeout_s=timeout_s
    )
    return BatchResult(seed=seed, intent=intent, verdict=verdict)


# --------------------------------------------------------------------------- phase 2: the loop


class PilotResult(BaseModel):
    """The end of a pilot: the set as evolved, a PilotMetrics per iteration, the critiques."""

    prompt_set: PromptSet
    metrics: list[PilotMetrics]
    critiques: list[Critique] = Field(default_factory=list)
    converged: bool = False

    @property
    def infeasibility(self) -> list[float]:
        return [m.metrics["infeasibility"] for m in self.metrics]


def _apply_updates(params: PoolParams, updates: Sequence[ParamUpdate]) -> PoolParams:
    merged = params.model_dump()
    for u in updates:
        merged[u.name] = u.value
    if merged["min_calls"] > merged["max_calls"]:
        merged["max_calls"] = merged["min_calls"]
    return PoolParams.model_validate(merged)


def _converged(metrics: BatchMetrics, previous_quality: float | None, t: PilotThresholds) -> bool:
    if metrics.infeasibility > t.max_infeasibility or metrics.tool_call_validity < t.min_validity:
        return False
    if t.max_quality_change is None:
        return True
    return previous_quality is not None and abs(metrics.quality - previous_quality) <= t.max_quality_change


async def _publish(publish: Publish | None, record: PilotMetrics) -> None:
    if publish is None:
        return
    result = publish(record)
    if inspect.isawaitable(result):
        await result


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
    repair: bool = False,
    catalog: PromptCatalog | None = None,
    store: EigenCatalog | None = None,
    publish: Publish | None = None,
    timeout_s: float | None = None,
) -> PilotResult:
    """Phase 2 on one prompt set (see the module docstring); batch ``i`` uses seeds ``seed + i * batch_size ...``."""
    if not 1 <= iterations <= MAX_PILOT_ITERATIONS:
        raise ValueError(f"iterations must be within 1..{MAX_PILOT_ITERATIONS}")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    t = thresholds or PilotThresholds()
    current = prompt_set.model_copy(deep=True)
    if store is not None:
        await asyncio.to_thread(store.set_phase, current.set_id, 2)
    records: list[PilotMetrics] = []
    critiques: list[Critique] = []
    previous_quality: float | None = None
    converged = False
    for iteration in range(iterations):
        seeds = [seed + iteration * batch_size + j for j in range(batch_size)]
        results = await asyncio.gather(
            *(
                _one(
                    s,
                    current,
                    gateway=gateway,
                    runner=runner,
                    pack=pack,
                    state=state,
                    repair=repair,
                    timeout_s=timeout_s,
                )
                for s in seeds
            )
        )
        batch = measure_batch(pack, current.params, results)
        values: dict[str, float] = {
            "infeasibility": round(batch.infeasibility, 4),
            "tool_call_validity": round(batch.tool_call_validity, 4),
            "quality": round(batch.quality, 4),
            "quality_change": round(abs(batch.quality - previous_quality), 4)
            if previous_quality is not None
            else 0.0,
            "coverage": round(batch.coverage, 4),
            "mean_required_calls": round(batch.mean_required_calls, 4),
            "size": float(batch.size),
            "generation_failures": float(batch.generation_failures),
            "schema_errors": float(len(batch.schema_errors)),
            "param_version": float(current.version),
            "error_prone_parameters": current.params.error_prone_parameters,
            "policy_pressure": current.params.policy_pressure,
        }
        values.update({f"failure_{c}": s for c, s in batch.failure_shares.items()})
        if batch.mean_repair_rounds is not None:
            values["repair_rounds"] = round(batch.mean_repair_rounds, 4)
        record = PilotMetrics(prompt_set=current.set_id, iteration=iteration, metrics=values)
        records.append(record)
        await _publish(publish, record)
        if _converged(batch, previous_quality, t):
            converged = True
            break
        previous_quality = batch.quality
        if not evolve or iteration == iterations - 1:
            continue
        judged = JudgeInput(
            set_id=current.set_id, iteration=iteration, params=current.params, metrics=batch, targets=t
        )
        critique = (await gateway.call(EIGEN_JUDGE, judged)).output
        critiques.append(critique)
        before = current.version
        current = await _evolve(
            current, critique, iteration, gateway=gateway, pack=pack, state=state, catalog=catalog
        )
        if store is not None:
            await asyncio.to_thread(
                _record_evolution, store, current, critique, iteration, batch, current.version != before
            )
    if store is not None and converged:
        await asyncio.to_thread(store.set_phase, current.set_id, 3)
    return PilotResult(prompt_set=current, metrics=records, critiques=critiques, converged=converged)


async def _evolve(
    current: PromptSet,
    critique: Critique,
    iteration: int,
    *,
    gateway: Gateway,
    pack: DomainPack,
    state: Mapping[str, Any],
    catalog: PromptCatalog | None,
) -> PromptSet:
    """Apply the critique: parameter updates, then the Prompt Engineer's revision with its edits."""
    if not critique.param_updates and not critique.prompt_edits:
        return current
    params = _apply_updates(current.params, critique.param_updates)
    guidance = list(dict.fromkeys(current.guidance + [e.text for e in critique.prompt_edits]))
    prompts = current.prompts
    versions = current.prompt_versions
    if guidance != current.guidance:
        revision = PromptEngineerInput(
            set_index=current.position,
            domain=domain_summary(pack, state),
            plan=current.plan,
            params=params,
            current=[WorkerPrompt(worker=w, system=s) for w, s in current.prompts.items()],
            focus=current.focus,
            guidance=guidance,
        )
        draft = (await gateway.call(EIGEN_PROMPT_ENGINEER, revision)).output
        prompts = {p.worker: p.system for p in draft.prompts}
        versions = await asyncio.to_thread(_register, catalog, prompts)
    return current.model_copy(
        update={
            "params": params,
            "prompts": prompts,
            "prompt_versions": versions,
            "guidance": guidance,
            "version": current.version + 1,
        }
    )


def _record_evolution(
    store: EigenCatalog,
    current: PromptSet,
    critique: Critique,
    iteration: int,
    batch: BatchMetrics,
    changed: bool,
) -> None:
    applied = [u.model_dump(mode="json") for u in critique.param_updates] + [
        e.model_dump(mode="json") for e in critique.prompt_edits
    ]
    store.record_critique(
        current.set_id, iteration, critique.model_dump(mode="json"), applied, batch.model_dump(mode="json")
    )
    if applied and changed:
        reasons = "; ".join(u.reason for u in critique.param_updates) or "prompt edits"
        store.record_param_version(
            current.set_id,
            params=current.params.model_dump(mode="json"),
            prompt_versions=current.prompt_versions,
            iteration=iteration,
            reason=f"critique of iteration {iteration}: {reasons}",
            snapshot=current.model_dump_json(),
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

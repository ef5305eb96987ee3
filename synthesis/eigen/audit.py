"""Phase 3 of EigenData (§4.4): audit large-scale generation, send drifting sets back to phase 2.

The stages record per-item figures in the catalog (``eigen_audits``): the task stage the Modify
rounds a task needed and its schema problems, the validation stage the dialogue's realism and
mean quality and its repair rounds. ``audit_set`` groups a set's entries of its current
parameter version into audit points of ``audit_batch`` items (per stage, in arrival order), and
once there are ``2 * audit_window`` points ``detect_drift`` compares the first ``audit_window``
with the last ones. On drift the set
goes back to phase 2 (catalog phase 2); the seeds stage then pilots it again (``repilot``) before
drawing more tasks with it, and goes on with the evolved set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from arena.config import EigenSettings
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import UserBehaviour
from arena.records.eigen import PilotMetrics
from lake.eigen_catalog import AuditRow, EigenCatalog
from sandbox.env_runtime import Runner
from synthesis.eigen.evolution import PromptSet, detect_drift, pilot, thresholds_from
from synthesis.eigen.items import generating_set
from synthesis.eigen.packs import DomainPack

log = logging.getLogger("arena.eigen.audit")

REPILOT_SEED_BASE = 1_000_000
"""Re-pilot batches draw seeds far from phase 3's (which count up from 0)."""

_locks: dict[str, asyncio.Lock] = {}


def audit_points(rows: Sequence[AuditRow], batch: int) -> list[dict[str, float]]:
    """Means over consecutive runs of ``batch`` entries per stage (a last partial run is left out)."""
    by_stage: dict[str, list[dict[str, float]]] = {}
    for row in rows:
        by_stage.setdefault(row.stage, []).append(row.metrics_dict())
    points: list[dict[str, float]] = []
    for entries in by_stage.values():
        for start in range(0, len(entries) - batch + 1, batch):
            chunk = entries[start : start + batch]
            keys = {k for e in chunk for k in e}
            points.append({k: sum(e.get(k, 0.0) for e in chunk) / len(chunk) for k in sorted(keys)})
    return points


def audit_set(store: EigenCatalog, set_id: str, version: int, cfg: EigenSettings) -> list[str]:
    """Drift reasons for the set's current version ([] when none); on drift, back to phase 2."""
    points = audit_points(store.audits(set_id, since_version=version), cfg.audit_batch)
    if len(points) < 2 * cfg.audit_window:
        return []  # not enough evidence yet: a baseline window and a recent one, apart
    reasons = detect_drift(points, window=cfg.audit_window)
    if reasons:
        row = store.prompt_set(set_id)
        if row is not None and row.phase == 3:
            store.set_phase(set_id, 2)
            log.warning("prompt set %s drifted, back to phase 2: %s", set_id, "; ".join(reasons))
    return reasons


async def record_and_audit(
    store: EigenCatalog,
    cfg: EigenSettings,
    *,
    set_id: str,
    stage: str,
    item_id: str,
    version: int,
    figures: Mapping[str, float],
) -> list[str]:
    """Record one item's figures, then audit the set (idempotent: a replayed item is not counted twice)."""

    def work() -> list[str]:
        store.record_audit(set_id, stage, item_id, dict(figures), version)
        return audit_set(store, set_id, version, cfg)

    return await asyncio.to_thread(work)


async def repilot(
    prompt_set: PromptSet,
    *,
    gateway: Gateway,
    runner: Runner,
    pack: DomainPack,
    state: Mapping[str, Any],
    store: EigenCatalog,
    cfg: EigenSettings,
    timeout_s: float | None = None,
    behaviour: UserBehaviour | None = None,
) -> tuple[PromptSet, list[PilotMetrics]]:
    """Pilot a set sent back to phase 2 again, then return it to phase 3 with what it learned.

    One re-pilot per set at a time in this process; a caller that waited finds the set back in
    phase 3 and takes the stored snapshot instead of piloting twice. A pilot that does not
    converge still returns the set to phase 3 (with its evolved parameters): generation goes on,
    and the audit will send it back if it keeps drifting.
    """
    lock = _locks.setdefault(prompt_set.set_id, asyncio.Lock())
    async with lock:
        done = await generating_set(store, prompt_set.set_id)
        if done is not None:
            return done, []
        result = await pilot(
            prompt_set,
            gateway=gateway,
            runner=runner,
            pack=pack,
            state=state,
            iterations=cfg.pilot_iterations,
            batch_size=cfg.pilot_batch,
            thresholds=thresholds_from(cfg),
            evolve=cfg.evolve,
            seed=REPILOT_SEED_BASE + prompt_set.version * cfg.pilot_iterations * cfg.pilot_batch,
            repair=True,
            catalog=gateway.catalog,
            store=store,
            timeout_s=timeout_s,
            behaviour=behaviour,
        )
        if not result.converged:
            log.warning("prompt set %s did not converge in its re-pilot; generating on", prompt_set.set_id)
        evolved = await asyncio.to_thread(_new_version, store, result.prompt_set, result.converged)
        return evolved, result.metrics


def _new_version(store: EigenCatalog, prompt_set: PromptSet, converged: bool) -> PromptSet:
    """A new parameter version after a re-pilot (so the audit's baseline restarts), back in phase 3."""
    versions = store.param_versions(prompt_set.set_id)
    evolved = prompt_set.model_copy(update={"version": (versions[-1].version if versions else 0) + 1})
    store.record_param_version(
        prompt_set.set_id,
        params=evolved.params.model_dump(mode="json"),
        prompt_versions=evolved.prompt_versions,
        iteration=None,
        reason=f"re-piloted after phase-3 drift ({'converged' if converged else 'not converged'})",
        snapshot=evolved.model_dump_json(),
    )
    store.set_phase(prompt_set.set_id, 3)
    return evolved

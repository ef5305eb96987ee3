"""`arena publish domain PATH`: a domain pack into the EigenData track (EigenData §4.1, §4.4).

1. The pack is loaded and checked (``synthesis.eigen.packs``; a bad pack is a ``DomainPackError``
   naming file, field and fix) and stored in the catalog by content hash, so every stage works on
   exactly the pack its items name.
2. Planning and phase 1: the Planner's worker DAG, then K prompt sets, each conditioned on the
   summaries of the earlier ones (prompt versions and sets in the catalog).
3. Phase 2: every set is piloted in parallel on small batches (at most 16 iterations) against
   the pack's database, in the sandbox; each iteration's metrics go to ``eigen.pilot.metrics``.
   A set already in phase 3 from an earlier publication is not piloted again.
4. Phase 3: ``instances`` seeds to ``eigen.seeds``, round-robin over the sets that converged
   (over all sets, with a warning, when none did: an ablation such as ``--no-evolution`` still
   generates). Each seed has its own database seed; the stages take it from there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

from arena.config import ArenaSettings
from arena.llm.roles.user_sim import user_behaviour
from arena.records.eigen import EigenSeed, PilotMetrics, Scenario
from lake.catalog import open_gateway
from lake.eigen_catalog import EigenCatalog
from producers.publish import publish
from sandbox import SandboxPool
from streams.runtime import Emit
from synthesis.eigen.evolution import (
    PILOT_TOPIC,
    PilotResult,
    PromptSet,
    make_prompt_sets,
    pilot,
    pilot_key,
    thresholds_from,
)
from synthesis.eigen.items import generating_set, make_item, pack_id_of
from synthesis.eigen.packs import DomainPack, DomainPackError, builtin_pack_path, builtin_packs, load_pack

SEEDS_TOPIC = "eigen.seeds"


class SetOutcome(BaseModel):
    """One prompt set after phase 2."""

    set_id: Annotated[str, Field(description="Prompt set id.")]
    focus: Annotated[str, Field(description="What the Prompt Engineer made it focus on.")]
    iterations: Annotated[int, Field(description="Pilot iterations run (0: already in phase 3).")]
    converged: Annotated[bool, Field(description="Met the thresholds within the iterations.")]
    infeasibility: Annotated[list[float], Field(description="INFEASIBLE share per iteration.")]
    version: Annotated[int, Field(description="Parameter version it generates with.")]
    seeds: Annotated[int, Field(description="Seeds sent to it.")] = 0


class DomainPublication(BaseModel):
    """What `arena publish domain` did."""

    domain: str
    pack_id: str
    new_pack: Annotated[bool, Field(description="False when this exact pack was published before.")]
    sets: list[SetOutcome]
    seeds: Annotated[int, Field(description="Records sent to eigen.seeds.")]
    pilot_records: Annotated[int, Field(description="Records sent to eigen.pilot.metrics.")]
    warnings: list[str] = Field(default_factory=list)


def resolve_pack(path_or_name: str) -> DomainPack:
    """A pack folder, or the name of a built-in pack (``customer_service``)."""
    folder = Path(path_or_name)
    if not folder.exists() and path_or_name in builtin_packs():
        folder = builtin_pack_path(path_or_name)
    if not folder.exists():
        raise DomainPackError(
            None,
            f"no such folder: {path_or_name}",
            fix=f"pass a pack folder, or a built-in pack name ({', '.join(builtin_packs())})",
        )
    return load_pack(folder)


def seed_items(
    pack_id: str, domain: str, sets: list[PromptSet], count: int, *, base_seed: int, size: str
) -> list[EigenSeed]:
    """``count`` seeds, round-robin over ``sets``; seed ``i`` has database seed ``base_seed + i``."""
    items = []
    for i in range(count):
        chosen = sets[i % len(sets)]
        scenario = Scenario(
            pack_id=pack_id, state_seed=base_seed + i, size=size, seed=i, set_version=chosen.version
        )
        items.append(make_item(EigenSeed, None, scenario, domain=domain, prompt_set=chosen.set_id))
    return items


async def _pilot_or_resume(
    prompt_set: PromptSet, store: EigenCatalog, run: Callable[[PromptSet], Awaitable[PilotResult]]
) -> tuple[PromptSet, PilotResult | None]:
    done = await generating_set(store, prompt_set.set_id)
    if done is not None:
        return done, None  # piloted by an earlier publication
    result = await run(prompt_set)
    return result.prompt_set, result


async def publish_domain(
    settings: ArenaSettings,
    bootstrap: str,
    pack: DomainPack,
    *,
    instances: int | None = None,
    evolve: bool | None = None,
    on_metrics: Callable[[PilotMetrics], None] | None = None,
) -> DomainPublication:
    """Store ``pack``, run phases 1 and 2, publish pilot metrics and phase-3 seeds (module docstring)."""
    cfg = settings.eigen
    count = cfg.instances if instances is None else instances
    evolve = cfg.evolve if evolve is None else evolve
    store = EigenCatalog(settings.catalog)
    gateway = open_gateway(settings)
    pack_id = pack_id_of(pack)
    metrics: list[PilotMetrics] = []

    async def sent(record: PilotMetrics) -> None:
        metrics.append(record)
        await publish(bootstrap, [Emit(PILOT_TOPIC, pilot_key(record), record)])
        if on_metrics is not None:
            on_metrics(record)

    # The pilot counts draws that yield no task (BatchMetrics.generation_failures); the gateway's
    # warning per such call would only repeat them on the user's terminal.
    gateway_log = logging.getLogger("arena.llm.gateway")
    level = gateway_log.level
    gateway_log.setLevel(logging.ERROR)
    try:
        new = await asyncio.to_thread(store.record_pack, pack_id, pack.name, pack.model_dump_json())
        state = pack.generate(settings.seed, cfg.db_size)
        sets = await make_prompt_sets(
            cfg.prompt_sets, gateway=gateway, pack=pack, state=state, catalog=gateway.catalog, store=store
        )
        async with SandboxPool(settings.sandbox) as pool:

            async def run(prompt_set: PromptSet) -> PilotResult:
                return await pilot(
                    prompt_set,
                    gateway=gateway,
                    runner=pool,
                    pack=pack,
                    state=state,
                    iterations=cfg.pilot_iterations,
                    batch_size=cfg.pilot_batch,
                    thresholds=thresholds_from(cfg),
                    evolve=evolve,
                    seed=settings.seed,
                    repair=True,
                    catalog=gateway.catalog,
                    store=store,
                    publish=sent,
                    timeout_s=settings.sandbox.timeout_s,
                    behaviour=user_behaviour(settings),
                )

            piloted = await asyncio.gather(*(_pilot_or_resume(s, store, run) for s in sets))
    finally:
        gateway_log.setLevel(level)
        await gateway.aclose()
    outcomes = [_outcome(s, r) for s, r in piloted]
    ready = [s for (s, r), o in zip(piloted, outcomes, strict=True) if o.converged]
    warnings: list[str] = []
    if not ready:
        ready = [s for s, _ in piloted]
        warnings.append(
            f"no prompt set converged in {cfg.pilot_iterations} pilot iterations; generating with every "
            "set as it is (see `arena eigen sets` and the lake table eigen_pilot_metrics)"
        )
    for prompt_set in ready:  # phase 3: large-scale generation
        await asyncio.to_thread(store.set_phase, prompt_set.set_id, 3)
    items = seed_items(pack_id, pack.name, ready, count, base_seed=settings.seed, size=cfg.db_size)
    await publish(bootstrap, [Emit(SEEDS_TOPIC, item.item_id, item) for item in items])
    store.dispose()
    for outcome in outcomes:
        outcome.seeds = sum(1 for item in items if item.prompt_set == outcome.set_id)
    return DomainPublication(
        domain=pack.name,
        pack_id=pack_id,
        new_pack=new,
        sets=outcomes,
        seeds=len(items),
        pilot_records=len(metrics),
        warnings=warnings,
    )


def _outcome(prompt_set: PromptSet, result: PilotResult | None) -> SetOutcome:
    if result is None:
        return SetOutcome(
            set_id=prompt_set.set_id,
            focus=prompt_set.focus,
            iterations=0,
            converged=True,
            infeasibility=[],
            version=prompt_set.version,
        )
    return SetOutcome(
        set_id=prompt_set.set_id,
        focus=prompt_set.focus,
        iterations=len(result.metrics),
        converged=result.converged,
        infeasibility=result.infeasibility,
        version=result.prompt_set.version,
    )

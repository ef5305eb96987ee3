"""EigenData phase 3 (issue 6 item 4; §4.4): the drift audit sends a set back to phase 2, and the
seeds stage pilots it again before drawing more tasks with it.

Real catalog (SQLite in ``tmp_path``), real sandbox, the rules gateway, the built-in pack; the
stage handler runs in-process exactly as its Faust worker calls it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from arena.config import ArenaSettings
from arena.records.eigen import EigenIntent, PilotMetrics
from arena.topics import topic
from lake.eigen_catalog import AuditRow, EigenCatalog
from producers.publish_domain import seed_items
from streams.eigen import eigen_intents
from streams.resources import close_sandbox_pool, eigen_store_for, gateway_for
from streams.runtime import Context, run_handler
from synthesis.eigen.audit import audit_points, audit_set, record_and_audit
from synthesis.eigen.evolution import make_prompt_sets, pilot_key
from synthesis.eigen.items import pack_id_of
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.tasks import PoolParams

pytestmark = pytest.mark.timeout(120)


def _row(stage: str, item: str, **metrics: float) -> AuditRow:
    import json

    return AuditRow(set_id="ps-x", stage=stage, item_id=item, metrics=json.dumps(metrics))


def test_audit_points_are_per_stage_means_of_full_batches() -> None:
    rows = [_row("tasks", f"t{i}", repair_rounds=float(i)) for i in range(5)]
    rows += [_row("dialogs", f"d{i}", realism=r) for i, r in enumerate((1.0, 0.5, 0.0, 0.5))]
    points = audit_points(rows, batch=2)
    # tasks: (0,1) -> 0.5, (2,3) -> 2.5, the fifth waits for its batch; dialogs: 0.75, 0.25.
    assert points == [{"repair_rounds": 0.5}, {"repair_rounds": 2.5}, {"realism": 0.75}, {"realism": 0.25}]


def _settings(home: Path, **eigen: Any) -> ArenaSettings:
    return ArenaSettings.model_validate(
        {
            "home": home,
            "sandbox": {"pool_size": 2, "timeout_s": 10.0},
            "eigen": {"audit_batch": 2, "audit_window": 2, **eigen},
        }
    )


def test_rising_repair_rounds_send_a_set_back_to_phase_two(tmp_path: Path) -> None:
    cfg = _settings(tmp_path).eigen
    store = EigenCatalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    store.record_set(set_id="ps-x", domain="d", position=0, params={}, prompt_versions={}, phase=3)

    def audit(item: str, rounds: float, version: int = 1) -> list[str]:
        figures = {"repair_rounds": rounds, "schema_errors": 0.0}
        return asyncio.run(
            record_and_audit(
                store, cfg, set_id="ps-x", stage="eigen-tasks", item_id=item, version=version, figures=figures
            )
        )

    for n, rounds in enumerate((0.0, 0.0, 0.0, 1.0, 1.0, 1.0)):
        assert audit(f"i{n}", rounds) == []  # the baseline and the first high points: no verdict yet
        assert audit(f"i{n}", 3.0) == []  # a replayed item is not counted twice
    row = store.prompt_set("ps-x")
    assert row is not None and row.phase == 3
    reasons = audit("i6", 3.0) + audit("i7", 3.0)  # last points 1.0 and 3.0 against 0.0, 0.0
    assert any(r.startswith("repair rounds rising") for r in reasons)
    row = store.prompt_set("ps-x")
    assert row is not None and row.phase == 2
    # A new parameter version starts a new baseline: its entries alone decide.
    assert audit_set(store, "ps-x", 2, cfg) == []


def test_seeds_stage_repilots_a_drifted_set_then_draws_with_it(pack: DomainPack, tmp_path: Path) -> None:
    settings = _settings(tmp_path, pilot_iterations=6, pilot_batch=4)
    store = eigen_store_for(settings)
    pack_id = pack_id_of(pack)
    store.record_pack(pack_id, pack.name, pack.model_dump_json())
    bad = PoolParams(error_prone_parameters=0.9, policy_pressure=0.8)

    async def scenario() -> tuple[list[Any], Any]:
        gateway = gateway_for(settings)
        state = pack.generate(0)
        (prompt_set,) = await make_prompt_sets(
            1, gateway=gateway, pack=pack, state=state, params=bad, catalog=gateway.catalog, store=store
        )
        store.set_phase(prompt_set.set_id, 2)  # what audit_set does on drift
        (seed,) = seed_items(pack_id, pack.name, [prompt_set], 1, base_seed=0, size="small")
        raw = seed.model_dump_json().encode()
        spec = eigen_intents.STAGE
        ctx = Context(spec.name, spec.version, topic(spec.input), seed.item_id, settings, raw)
        try:
            return await run_handler(spec, seed, ctx, raw), prompt_set
        finally:
            await close_sandbox_pool(settings)

    emits, before = asyncio.run(scenario())
    pilots = [e for e in emits if e.topic == "eigen.pilot.metrics"]
    intents = [e for e in emits if e.topic == "eigen.intents"]
    assert pilots and len(intents) == 1, [e.topic for e in emits]
    assert all(isinstance(e.value, PilotMetrics) and e.key == pilot_key(e.value) for e in pilots)
    assert pilots[0].value.metrics["error_prone_parameters"] == 0.9
    row = store.prompt_set(before.set_id)
    assert row is not None and row.phase == 3 and row.version > before.version
    versions = store.param_versions(before.set_id)
    assert versions[-1].reason.startswith("re-piloted after phase-3 drift")
    # The intent was drawn with the evolved parameters and carries the new version.
    item = intents[0].value
    assert isinstance(item, EigenIntent)
    body = item.payload
    assert body.scenario.set_version == row.version
    assert row.params_dict()["error_prone_parameters"] < 0.9

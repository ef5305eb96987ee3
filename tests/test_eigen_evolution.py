"""EigenData self-evolution (issue 6 items 3-4; §4.1, §4.3, §4.4): planner, prompt sets, pilot, drift.

Real sandbox (the TaskValidation probe runs every call through a ``SandboxPool``), real gateway on
the rules backend, an SQLite catalog in ``tmp_path``, the built-in customer_service pack. From a
seeded bad configuration the pilot's infeasibility falls below its threshold within 16 iterations
with evolution, and stays above it without. These pilots run the task side of the plan only
(RandomPool -> UserIntent -> TaskValidation, ``TASKS``): what they measure is task infeasibility,
and 16 iterations of dialogues would take minutes here; ``test_eigen_evolution_workers`` pilots
the whole chain.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from arena.llm.gateway import Gateway
from arena.records.eigen import PilotMetrics
from lake.catalog import Catalog
from lake.eigen_catalog import EigenCatalog
from sandbox import SandboxPool
from simulator.backend import RulesBackend
from synthesis.eigen.evolution import PILOT_TOPIC, detect_drift, make_prompt_sets, pilot, plan_workflow
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.orchestration import EIGEN_JUDGE, PilotThresholds
from synthesis.eigen.roles.tasks import PoolParams
from tests.fixtures.domain import sandboxed

# The 16-iteration pilots take ~120 s on this 2-core machine, 220-300 s when it is loaded.
pytestmark = pytest.mark.timeout(600)

BAD = PoolParams(error_prone_parameters=0.9, policy_pressure=0.8)
THRESHOLDS = PilotThresholds(max_infeasibility=0.2, min_validity=0.9)
BATCH = 6
TASKS = ("RandomPool", "UserIntent", "TaskValidation")


@pytest.fixture(scope="module")
def state(pack: DomainPack) -> dict[str, Any]:
    return pack.generate(3)


def test_planner_plans_the_seven_worker_dag(pack: DomainPack, state: dict[str, Any]) -> None:
    gateway = Gateway(RulesBackend(seed=0))
    full = asyncio.run(plan_workflow(gateway, pack, state))
    assert full.names == [
        "RandomPool",
        "UserIntent",
        "TaskValidation",
        "DialogSynthesis",
        "TrajectoryValidation",
        "Modify",
        "VerificationFunction",
    ]
    full.check()
    assert full.workers[1].depends_on == ["RandomPool"] and "task" in full.workers[1].outputs
    sft = asyncio.run(plan_workflow(gateway, pack, state, outputs=("sft",)))
    assert "VerificationFunction" not in sft.names and len(sft.names) == 6


def test_a_plan_without_the_task_workers_is_asked_again_then_replaced(
    pack: DomainPack, state: dict[str, Any]
) -> None:
    """A small real model answered the planner with a plan that draws no tasks (seen with SmolLM2):
    the reply is invalid with that reason, asked again, and after the last attempt phase 1 goes on
    with §4.2's standard workflow, saying why, instead of the pilot crashing."""
    from arena.llm.backends.openai import OpenAIBackend
    from tests.fixtures.openai_server import ServerScript, start_openai_server

    bad = '{"workers": [{"name": "DialogSynthesis", "role": "eigen_trajectory_agent"}], "rationale": "chat"}'
    with start_openai_server() as server:
        server.configure(ServerScript(replies=[bad]))

        async def run() -> Any:
            gateway = Gateway(OpenAIBackend(server.base_url, "test-model"), max_attempts=2, backoff_s=0.01)
            try:
                return await plan_workflow(gateway, pack, state)
            finally:
                await gateway.aclose()

        plan = asyncio.run(run())
        bodies = server.stats().bodies
    assert len(bodies) == 2  # asked again once, with the reason fed back
    assert "the plan must run ['RandomPool', 'UserIntent']" in str(bodies[1]["messages"])
    assert plan.names[:2] == ["RandomPool", "UserIntent"] and len(plan.names) == 7
    assert plan.rationale.startswith("the planner wrote no usable plan")


def test_a_prompt_set_the_model_cannot_write_falls_back_to_the_base_prompts(
    pack: DomainPack, state: dict[str, Any]
) -> None:
    """SmolLM2 wrote prompt sets whose parameters were out of range on every attempt: phase 1 then
    pilots the workers' own prompts (the pilot may still evolve them) and says so in the summary."""
    from arena.llm.backends.openai import OpenAIBackend
    from synthesis.eigen.roles.orchestration import standard_plan
    from tests.fixtures.openai_server import ServerScript, start_openai_server

    bad = '{"focus": "x", "prompts": [{"worker": "eigen_random_pool", "system": "s"}], "params": '
    bad += '{"policy_pressure": 7}, "summary": "s"}'
    with start_openai_server() as server:
        server.configure(ServerScript(replies=[bad]))

        async def run() -> Any:
            gateway = Gateway(OpenAIBackend(server.base_url, "test-model"), max_attempts=2, backoff_s=0.01)
            try:
                return await make_prompt_sets(
                    1, gateway=gateway, pack=pack, state=state, plan=standard_plan()
                )
            finally:
                await gateway.aclose()

        (only,) = asyncio.run(run())
    assert only.summary.startswith("the prompt engineer wrote no usable prompt set")
    assert only.prompts and all(text for text in only.prompts.values())


def test_phase_one_sets_are_diverse_and_conditioned(
    pack: DomainPack, state: dict[str, Any], tmp_path: Path
) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    store = EigenCatalog(catalog.engine)
    gateway = Gateway(RulesBackend(seed=0), catalog=catalog)
    sets = asyncio.run(
        make_prompt_sets(3, gateway=gateway, pack=pack, state=state, catalog=catalog, store=store)
    )
    assert len({s.set_id for s in sets}) == 3 and len({s.focus for s in sets}) == 3
    assert len({s.params.model_dump_json() for s in sets}) == 3
    assert len({s.prompts["eigen_user_intent"] for s in sets}) == 3
    for n, prompt_set in enumerate(sets):  # each later set is written against the summaries before it
        assert prompt_set.conditioned_on == [s.set_id for s in sets[:n]]
        for earlier in sets[:n]:
            assert earlier.summary in prompt_set.prompts["eigen_user_intent"]
            assert earlier.set_id in prompt_set.prompts["eigen_random_pool"]
    assert "Earlier prompt sets" not in sets[0].prompts["eigen_user_intent"]
    # Every worker prompt of every set is a queryable version; the sets are in the catalog.
    versions = catalog.prompt_versions("eigen_user_intent")
    assert {v.id for v in versions} >= {s.prompt_versions["eigen_user_intent"] for s in sets}
    for role in ("eigen_trajectory_agent", "user_simulator", "eigen_trajectory_validation", "eigen_modify"):
        assert len(catalog.prompt_versions(role)) == 3  # every prompted worker, not only the task side
        assert all(role in s.prompt_versions for s in sets)
    assert not catalog.prompt_versions("eigen_verification_function")  # code-generated: no prompt
    rows = store.prompt_sets("customer_service")
    assert [r.set_id for r in rows] == [s.set_id for s in sets]
    assert rows[1].parent == sets[0].set_id and rows[0].phase == 1
    assert all(len(store.param_versions(s.set_id)) == 1 for s in sets)


def test_evolution_brings_infeasibility_below_threshold(
    pack: DomainPack, state: dict[str, Any], tmp_path: Path
) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    store = EigenCatalog(catalog.engine)
    gateway = Gateway(RulesBackend(seed=0), catalog=catalog)
    published: list[PilotMetrics] = []

    async def scenario(pool: SandboxPool) -> tuple[Any, Any, Any]:
        (prompt_set,) = await make_prompt_sets(
            1, gateway=gateway, pack=pack, state=state, params=BAD, catalog=catalog, store=store
        )
        assert prompt_set.params.error_prone_parameters == 0.9 and prompt_set.params.policy_pressure == 0.8
        prompt_set = prompt_set.model_copy(update={"plan": prompt_set.plan.restricted_to(TASKS)})
        common: dict[str, Any] = {
            "gateway": gateway,
            "runner": pool,
            "pack": pack,
            "state": state,
            "batch_size": BATCH,
            "thresholds": THRESHOLDS,
            "seed": 100,
            "repair": False,  # the first verdicts are what is measured; no Modify rounds
        }
        evolved = await pilot(
            prompt_set, iterations=16, catalog=catalog, store=store, publish=published.append, **common
        )
        frozen = await pilot(prompt_set, iterations=16, evolve=False, **common)
        return prompt_set, evolved, frozen

    prompt_set, evolved, frozen = sandboxed(scenario)
    # With evolution: converged within 16 iterations, infeasibility at or below the threshold.
    assert evolved.converged and len(evolved.metrics) <= 16
    assert evolved.infeasibility[0] > THRESHOLDS.max_infeasibility
    assert evolved.infeasibility[-1] <= THRESHOLDS.max_infeasibility
    assert evolved.metrics[-1].metrics["tool_call_validity"] >= THRESHOLDS.min_validity
    final = evolved.prompt_set.params
    assert final.error_prone_parameters < 0.9 and final.policy_pressure < 0.8
    assert [m.iteration for m in evolved.metrics] == list(range(len(evolved.metrics)))
    assert published == evolved.metrics and PILOT_TOPIC == "eigen.pilot.metrics"
    # Without evolution, over all 16 iterations on the same seeds: the parameters never change and
    # infeasibility never comes down to the threshold.
    assert not frozen.converged and len(frozen.metrics) == 16
    assert frozen.infeasibility[0] == evolved.infeasibility[0]  # same seeds, same start
    assert frozen.prompt_set.params == prompt_set.params and not frozen.critiques
    assert all(x > THRESHOLDS.max_infeasibility for x in frozen.infeasibility)
    assert {m.metrics["error_prone_parameters"] for m in frozen.metrics} == {0.9}
    # Queryable afterwards: critiques, parameter versions, prompt versions.
    critiques = store.critiques(prompt_set.set_id)
    assert len(critiques) == len(evolved.critiques) >= 1
    first = critiques[0].critique_dict()
    assert set(first["scores"]) == {
        "executability",
        "tool_correctness",
        "trajectory_coherence",
        "difficulty_coverage",
    }
    applied = {u["name"] for c in critiques for u in c.applied_list() if "name" in u}
    assert {"error_prone_parameters", "policy_pressure"} <= applied
    versions = store.param_versions(prompt_set.set_id)
    assert versions[0].params_dict()["error_prone_parameters"] == 0.9
    assert versions[-1].params_dict() == final.model_dump(mode="json")
    assert len(versions) == evolved.prompt_set.version >= 2
    row = store.prompt_set(prompt_set.set_id)
    assert row is not None and row.phase == 3 and row.version == len(versions)
    intent_versions = catalog.prompt_versions("eigen_user_intent")
    assert len(intent_versions) >= 2  # the Prompt Engineer revised the UserIntent prompt
    assert "Guidance from pilot critiques" in intent_versions[-1].text
    assert evolved.prompt_set.prompt_versions["eigen_user_intent"] == intent_versions[-1].id
    assert catalog.prompt_versions(EIGEN_JUDGE.name)  # the gateway versions the judge's prompt too


def test_detect_drift_flags_rising_repair_rounds() -> None:
    rising = [
        {"repair_rounds": r, "quality": 0.9, "schema_errors": 0.0} for r in (0.2, 0.3, 0.2, 0.8, 1.1, 1.4)
    ]
    flat = [
        {"repair_rounds": r, "quality": 0.9, "schema_errors": 0.0} for r in (0.3, 0.3, 0.4, 0.3, 0.3, 0.4)
    ]
    reasons = detect_drift(rising)
    assert len(reasons) == 1 and reasons[0].startswith("repair rounds rising")
    assert detect_drift(flat) == []
    worse = [
        {**h, "quality": q, "schema_errors": e}
        for h, q, e in zip(flat, (0.9, 0.9, 0.9, 0.7, 0.6, 0.6), (0, 0, 0, 0, 2, 1), strict=True)
    ]
    kinds = {r.split(":")[0] for r in detect_drift(worse)}
    assert kinds == {"new schema errors", "quality falling"}
    as_records = [PilotMetrics(prompt_set="ps-x", iteration=n, metrics=m) for n, m in enumerate(rising)]
    assert detect_drift(as_records) == reasons

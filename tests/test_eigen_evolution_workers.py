"""Self-evolution that reaches every worker with a prompt (issue 17 item 4; EigenData §4.1, §4.3, §4.4).

The pilot runs the whole planned chain -- RandomPool -> UserIntent -> TaskValidation (+ Modify)
-> DialogSynthesis -> TrajectoryValidation -> VerificationFunction -- with the prompt set's prompt
for every LLM worker; the Judge reads the failing dialogues with their diagnosis and proposes edits
per worker; the Planner's replanned workflow decides what runs next; the catalog logs every
iteration and ``arena eigen curve`` shows it.

Real sandbox, the rules gateway, an SQLite catalog, the built-in pack. The pilot scenario starts
from a plan that skips TaskValidation and Modify with error-prone generator parameters, so
infeasible tasks reach the dialogue workers and their dialogues fail -- what the Judge must read.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest

from arena.llm.gateway import Gateway
from arena.records.eigen import PilotMetrics
from lake.catalog import Catalog
from lake.eigen_catalog import EigenCatalog
from sandbox import SandboxPool
from simulator.backend import RulesBackend
from simulator.eigen_orchestration import GUIDANCE_HEADER, judge, planner, prompt_engineer
from synthesis.eigen.agents import domain_summary
from synthesis.eigen.evolution import (
    PilotResult,
    PromptSet,
    make_prompt_sets,
    measure_batch,
    pilot,
    plan_workflow,
    workers_run,
)
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.pilot_chain import PromptedGateway
from synthesis.eigen.roles.orchestration import (
    PROMPTED_ROLES,
    FailureSample,
    JudgeInput,
    PilotThresholds,
    PlanReview,
    PromptEngineerInput,
    WorkerPrompt,
    WorkflowPlan,
)
from synthesis.eigen.roles.tasks import PoolParams
from tests.cli import arena_env, run_arena
from tests.fixtures.domain import sandboxed

pytestmark = pytest.mark.timeout(300)

TASK_SIDE = {"eigen_random_pool", "eigen_user_intent"}
AGENT, USER = "eigen_trajectory_agent", "user_simulator"
NO_TASK_CHECKS = (
    "RandomPool",
    "UserIntent",
    "DialogSynthesis",
    "TrajectoryValidation",
    "VerificationFunction",
)
BAD = PoolParams(error_prone_parameters=0.9, policy_pressure=0.8)


# --------------------------------------------------------------------------- the rules roles


def _plan() -> WorkflowPlan:
    gateway = Gateway(RulesBackend(seed=0))
    from synthesis.eigen.packs import builtin_pack_path, load_pack

    return asyncio.run(plan_workflow(gateway, load_pack(builtin_pack_path())))


def _review(plan: WorkflowPlan, **figures: Any) -> PlanReview:
    base: dict[str, Any] = {"iteration": 0, "size": 6, "infeasibility": 0.0, "targets": PilotThresholds()}
    return PlanReview(plan=plan, **(base | figures))


def test_planner_replans_from_the_review(pack: DomainPack) -> None:
    from synthesis.eigen.roles.orchestration import GenerationRequest

    full = _plan()
    request = {"request": "pilot", "domain": domain_summary(pack).model_dump()}

    def replanned(review: PlanReview) -> WorkflowPlan:
        inputs = GenerationRequest.model_validate(request | {"review": review.model_dump()})
        out = planner(inputs, random.Random(0))
        assert isinstance(out, WorkflowPlan)
        out.check()
        return out

    clean = replanned(_review(full, needed_repair=0))  # nothing needed repair, tasks on target
    assert "Modify" not in clean.names and len(clean.names) == 6
    assert "Modify" not in clean.workers[-1].depends_on  # VerificationFunction no longer waits for it
    assert {w.name for w in clean.workers if not w.evolve} == {"RandomPool", "UserIntent"}
    assert "Modify skipped" in clean.rationale and "frozen" in clean.rationale
    assert set(clean.evolving_roles()) & TASK_SIDE == set()
    back = replanned(_review(clean, needed_repair=2, infeasibility=0.5))  # repairs needed, tasks off target
    assert back.names == full.names and back.workers[-1].depends_on == full.workers[-1].depends_on
    assert all(w.evolve for w in back.workers) and "Modify back" in back.rationale
    unmeasured = replanned(_review(clean, needed_repair=0, infeasibility=None))  # no TaskValidation ran
    assert all(w.evolve for w in unmeasured.workers) and "unmeasured" in unmeasured.rationale
    with pytest.raises(ValueError, match="not in the plan"):
        clean.restricted_to(("Modify",))


def _failure(stage: str, **fields: Any) -> FailureSample:
    return FailureSample.model_validate({"seed": 1, "stage": stage, **fields})


def test_judge_addresses_each_failure_to_the_worker_it_blames() -> None:
    from synthesis.eigen.roles.orchestration import BatchMetrics

    failures = [
        _failure(
            "trajectory_validation",
            categories=["schema", "grounding", "goal"],
            diagnosis=[
                "cancel_order: missing required argument 'reason'",
                "ungrounded amount '$120'",
                "goal 0 (cancel_order) not achieved: cancel_order never ran",
            ],
            end_signal="stop",
            failed_calls=["cancel_order: order O-1 is not pending"],
        ),
        _failure(
            "trajectory_validation",
            categories=["realism"],
            diagnosis=["user message copies the private instructions"],
        ),
        _failure(
            "task_validation", categories=["missing_resource"], diagnosis=["no order O-9"], repair_rounds=3
        ),
        _failure("verification", diagnosis=["the verifier fails the dialogue: {'state': 0.8}"]),
    ]
    metrics = BatchMetrics(size=4, infeasibility=0.25, dialogues=3, dialogue_pass_rate=0.33)
    inputs = JudgeInput(
        set_id="ps-x",
        iteration=0,
        params=PoolParams(),
        metrics=metrics,
        targets=PilotThresholds(),
        failures=failures,
    )
    critique = judge(inputs, random.Random(0))
    blamed = {(e.worker, e.kind) for e in critique.prompt_edits}
    assert {
        (AGENT, "negative_example"),
        (AGENT, "add_constraint"),
        (USER, "add_constraint"),
        (USER, "style"),
    } <= blamed
    assert ("eigen_task_validation", "add_constraint") in blamed  # the goal the tools refused
    assert ("eigen_modify", "add_constraint") in blamed  # still infeasible after 3 rounds
    assert ("eigen_trajectory_validation", "add_constraint") in blamed  # it passed what the verifier failed
    assert any("dialogue pass rate" in f for f in critique.findings) and not critique.converged
    # Only the roles the plan lets evolve get edits (and the knobs only while RandomPool does).
    frozen = judge(inputs.model_copy(update={"workers": [AGENT]}), random.Random(0))
    assert {e.worker for e in frozen.prompt_edits} == {AGENT} and not frozen.param_updates


def test_prompt_engineer_revises_exactly_the_prompts_with_new_guidance(pack: DomainPack) -> None:
    plan = _plan()
    current = [
        WorkerPrompt(worker=r, system=f"prompt of {r}") for w in plan.workers for r in PROMPTED_ROLES[w.name]
    ]
    inputs = PromptEngineerInput(
        set_index=0,
        domain=domain_summary(pack),
        plan=plan,
        params=PoolParams(),
        current=current,
        focus="f",
        worker_guidance={AGENT: ["Refuse forbidden requests."]},
    )
    draft = prompt_engineer(inputs, random.Random(0))
    revised = {p.worker: p.system for p in draft.prompts}
    assert revised[AGENT] == f"prompt of {AGENT}{GUIDANCE_HEADER}\n- Refuse forbidden requests."
    assert all(revised[p.worker] == p.system for p in current if p.worker != AGENT)


def test_prompted_gateway_sends_and_versions_the_sets_prompt(pack: DomainPack, tmp_path: Path) -> None:
    from synthesis.eigen.agents import random_pool

    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    gateway = Gateway(RulesBackend(seed=0), catalog=catalog)
    prompted = PromptedGateway(gateway, {"eigen_random_pool": "Draw diverse scenario seeds (set 7)."})
    asyncio.run(random_pool(prompted, pack, pack.generate(3), 5))
    assert prompted.calls == {"eigen_random_pool": 1}
    (version,) = catalog.prompt_versions("eigen_random_pool")
    assert version.text.startswith(
        "Draw diverse scenario seeds (set 7)."
    )  # what was sent is what is versioned
    assert (
        gateway.usage.roles["eigen_random_pool"].calls == prompted.usage.total.calls == 1
    )  # one set of counters


# --------------------------------------------------------------------------- a pilot of the whole chain


class Pilot:
    """The pilot scenario's artefacts (module docstring)."""

    def __init__(
        self, start: PromptSet, result: PilotResult, store: EigenCatalog, catalog: Catalog, home: Path
    ):
        self.start, self.result, self.store, self.catalog, self.home = start, result, store, catalog, home
        self.published: list[PilotMetrics] = []


@pytest.fixture(scope="module")
def piloted(pack: DomainPack, tmp_path_factory: pytest.TempPathFactory) -> Pilot:
    home = tmp_path_factory.mktemp("pilot")
    catalog = Catalog(f"sqlite:///{home / 'catalog.db'}")
    store = EigenCatalog(catalog.engine)
    gateway = Gateway(RulesBackend(seed=0), catalog=catalog)
    state = pack.generate(3)
    published: list[PilotMetrics] = []

    async def scenario(pool: SandboxPool) -> tuple[PromptSet, PilotResult]:
        (written,) = await make_prompt_sets(
            1, gateway=gateway, pack=pack, state=state, params=BAD, catalog=catalog, store=store
        )
        start = written.model_copy(update={"plan": written.plan.restricted_to(NO_TASK_CHECKS)})
        result = await pilot(
            start,
            gateway=gateway,
            runner=pool,
            pack=pack,
            state=state,
            iterations=2,  # one critique, one replanned batch: what is checked, in under a minute
            batch_size=4,
            seed=200,
            thresholds=PilotThresholds(min_dialogue_pass_rate=1.0),
            catalog=catalog,
            store=store,
            publish=published.append,
            timeout_s=10.0,
        )
        return start, result

    start, result = sandboxed(scenario)
    run = Pilot(start, result, store, catalog, home)
    run.published = published
    return run


def test_the_pilot_synthesizes_verifies_and_measures_dialogues(piloted: Pilot) -> None:
    first = piloted.result.metrics[0].metrics
    assert (
        first["dialogues"] > 0
        and first["calls_eigen_trajectory_agent"] > 0
        and first["calls_user_simulator"] > 0
    )
    assert first["calls_eigen_trajectory_validation"] == first["dialogues"]
    assert 0.0 <= first["dialogue_pass_rate"] < 1.0  # infeasible tasks went unchecked into dialogues
    assert 0.0 <= first["verified_share"] <= 1.0 and 0.0 <= first["dialogue_quality"] <= 1.0
    assert first["failed_at_trajectory_validation"] >= 1
    assert piloted.published == piloted.result.metrics


def test_the_judge_edits_dialogue_workers_and_their_prompts_get_new_versions(piloted: Pilot) -> None:
    critique = piloted.result.critiques[0]
    edited = {e.worker for e in critique.prompt_edits}
    assert edited - TASK_SIDE, f"the Judge only edited {edited}"
    assert AGENT in edited
    assert "eigen_task_validation" not in edited  # not in the plan that made the batch
    assert any("trajectory_validation failure" in f for f in critique.findings)
    start, end = piloted.start.prompt_versions, piloted.result.prompt_set.prompt_versions
    changed = {r for r in end if end[r] != start.get(r)}
    assert AGENT in changed and changed - TASK_SIDE
    versions = piloted.catalog.prompt_versions(AGENT)
    assert len(versions) >= 2 and GUIDANCE_HEADER.strip() in versions[-1].text
    assert end[AGENT] == versions[-1].id
    # What the Prompt Engineer changed is exactly what was edited: other workers keep their prompt.
    untouched = set(start) - edited
    assert all(end[r] == start[r] for r in untouched)
    assert piloted.result.prompt_set.worker_guidance[AGENT]


def test_the_planners_workflow_decides_which_workers_run(piloted: Pilot) -> None:
    result = piloted.result
    plans, metrics = result.plans, [m.metrics for m in result.metrics]
    assert plans[0].names == list(NO_TASK_CHECKS)
    assert (
        len(plans) >= 2 and "Modify" in plans[1].names
    )  # dialogues needed repair: the Planner put Modify back
    assert metrics[1]["workers_run"] == metrics[0]["workers_run"] + 1
    for plan, figures in zip(plans, metrics, strict=True):
        planned = {r for w in plan.workers for r in PROMPTED_ROLES[w.name]}
        called = {k.removeprefix("calls_") for k, v in figures.items() if k.startswith("calls_") and v > 0}
        assert called <= planned, f"{called - planned} ran outside the plan {plan.names}"
        assert "eigen_task_validation" not in called  # never planned in this scenario
    modify_runs = [m.get("calls_eigen_modify", 0.0) for m in metrics]
    assert modify_runs[0] == 0.0
    assert any(n > 0 for n in modify_runs[1:]) or all(m["needed_repair"] == 0 for m in metrics[1:])
    # The evolution log records what ran, per iteration.
    rows = piloted.store.iterations(result.prompt_set.set_id)
    assert [r.workers_list() for r in rows] == [workers_run(p) for p in plans]
    assert [r.iteration for r in rows] == list(range(len(plans))) and {r.run for r in rows} == {1}
    assert rows[1].prompt_versions_dict()[AGENT] != rows[0].prompt_versions_dict()[AGENT]
    assert rows[0].metrics_dict() == metrics[0] and rows[0].calls_dict()["eigen_trajectory_agent"] > 0


def test_measure_batch_without_dialogue_workers_reports_no_dialogue_figures(pack: DomainPack) -> None:
    from synthesis.eigen.pilot_chain import BatchResult

    metrics = measure_batch(
        pack, PoolParams(), [BatchResult(seed=1)], _plan().restricted_to(("RandomPool", "UserIntent"))
    )
    assert metrics.dialogues == 0 and metrics.dialogue_pass_rate is None and metrics.verified_share is None
    assert metrics.generation_failures == 1


def test_arena_eigen_curve_prints_every_iteration(piloted: Pilot) -> None:
    set_id = piloted.result.prompt_set.set_id
    env = arena_env(piloted.home)
    table = run_arena(["eigen", "curve", set_id], env).stdout
    n = len(piloted.result.metrics)
    assert "dialogues passed" in table and "verified" in table and f"run 1 ({n} iterations)" in table
    assert "trajectory_agent" in table  # the prompts changed at iteration 1
    spark = next(line for line in table.splitlines() if line.strip().startswith("dialogues passed"))
    assert len(spark.split()[2]) == n  # one sparkline character per iteration
    lines = run_arena(["eigen", "curve", set_id, "--json"], env).stdout.splitlines()
    logged = [json.loads(line) for line in lines if line.strip()]
    assert [e["iteration"] for e in logged] == list(range(n))
    assert logged[0]["metrics"] == piloted.result.metrics[0].metrics
    assert AGENT in logged[1]["prompts_changed"]
    changes = run_arena(["eigen", "curve", set_id, "--prompts"], env).stdout
    guidance = piloted.result.prompt_set.worker_guidance[AGENT]
    assert f"iteration 1: {AGENT}" in changes and f"  + - {guidance[0][:60]}" in changes
    missing = run_arena(["eigen", "curve", "ps-nope"], env, check=None)
    assert (
        missing.returncode == 2 and "arena eigen sets" in missing.stderr and "Traceback" not in missing.stderr
    )


def test_the_pilots_simulated_user_follows_the_behaviour_rates(pack: DomainPack) -> None:
    """The pilot's dialogues use the ``[user_sim]`` rates phase 3 uses: with ``mistakes=1`` the user
    mistypes what it enters in the app on its first try (the tool refuses it), at rate 0 never."""
    from arena.llm.roles.user_sim import UserBehaviour
    from synthesis.eigen.pilot_chain import BatchResult, run_item

    gateway = Gateway(RulesBackend(seed=0))
    state = pack.generate(3)

    def refused(result: BatchResult) -> int:
        calls = result.dialog.records() if result.dialog is not None else []
        return sum(1 for c in calls if c["actor"] == "user" and not c["ok"])

    async def scenario(pool: SandboxPool) -> list[tuple[int, int, int]]:
        (written,) = await make_prompt_sets(1, gateway=gateway, pack=pack, state=state)
        common: dict[str, Any] = {
            "plan": written.plan,
            "params": written.params,
            "gateway": written.gateway(gateway),
            "runner": pool,
            "pack": pack,
            "state": state,
            "repair": False,
            "timeout_s": 10.0,
        }
        out = []
        for seed in range(200, 206):
            calm = await run_item(seed, **common)
            slips = await run_item(seed, behaviour=UserBehaviour(mistakes=1.0), **common)
            users = sum(1 for c in (calm.dialog.records() if calm.dialog else []) if c["actor"] == "user")
            out.append((users, refused(calm), refused(slips)))
        return out

    found = sandboxed(scenario)
    acting = [f for f in found if f[0] > 0]
    assert acting, found  # some dialogue has the user act in the app
    assert all(calm == 0 and slips >= 1 for _, calm, slips in acting), found

"""The EigenData track end to end on the real stack, from the session's `arena demo` run.

The demo publishes every bundled domain pack (`arena publish domain`: phases 1-2 in
the CLI process, phase-3 seeds to eigen.seeds) and runs the five EigenData stages as workers,
which between them run the seven workers of §4.2. The checks read the committed topics, the lake
and the catalog, and run every generated verification function again in a sandbox.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from app.demo import demo_domains
from arena.config import ArenaSettings
from arena.records.eigen import (
    DialogPayload,
    EigenIntent,
    EigenItem,
    IntentPayload,
    Scenario,
    TaskPayload,
    ValidatedPayload,
    VerifiedPayload,
)
from arena.records.envs import VerifiedSample
from arena.records.sft import SftSample
from arena.topics import topic
from environments.environment import Verdict, verify_program
from environments.user_view import MARKERS, parse_user_turn
from lake.eigen_catalog import EigenCatalog
from producers.publish import publish
from producers.publish_domain import SEEDS_TOPIC
from sandbox import SandboxPool
from streams.runtime import Emit
from synthesis.eigen.items import load_prompt_set, make_item
from synthesis.eigen.packs import builtin_pack_path, load_pack
from synthesis.eigen.verification import replay_reference
from tests.cli import lake_json, read_all, run_arena
from tests.fixtures.demo import Demo, values
from tests.fixtures.domain import sandboxed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

CHAIN = (
    (SEEDS_TOPIC, Scenario),
    ("eigen.intents", IntentPayload),
    ("eigen.tasks", TaskPayload),
    ("eigen.dialogs", DialogPayload),
    ("eigen.dialogs.validated", ValidatedPayload),
    ("eigen.verified", VerifiedPayload),
)


def items(demo: Demo, name: str) -> list[EigenItem[Any]]:
    """The records of ``name``, validated as the topic's own value model (``EigenSeed``, ...)."""
    model = topic(name).value
    found = [model.model_validate(v) for v in values(demo.bootstrap, name)]
    typed = [i for i in found if isinstance(i, EigenItem)]
    assert len(typed) == len(found), f"{name} does not carry EigenData items"
    return typed


@pytest.fixture(scope="module")
def verified(demo_run: Demo) -> list[EigenItem[Any]]:
    found = items(demo_run, "eigen.verified")
    assert found, "the demo verified no EigenData instance"
    return found


def test_every_stage_hands_typed_items_to_the_next(demo_run: Demo, verified: list[EigenItem[Any]]) -> None:
    by_id: dict[str, EigenItem[Any]] = {}
    for name, model in CHAIN:
        found = items(demo_run, name)
        assert found, f"nothing reached {name}"
        for item in found:
            assert isinstance(item.payload, model)  # each stage's payload is its typed model
            assert item.domain in demo_domains()  # the demo publishes every bundled pack
            by_id[item.item_id] = item
    # Lineage: every verified instance leads back, stage by stage, to a published seed.
    for item in verified:
        chain = [item]
        while chain[-1].parent_id is not None:
            chain.append(by_id[chain[-1].parent_id])
        assert len(chain) == len(CHAIN) and chain[-1].item_id.startswith("seed-")
        assert len({c.prompt_set for c in chain}) == 1
    # The demo's seeds are the phase-3 seeds `arena publish domain` sent, spread over the sets.
    seeds = items(demo_run, SEEDS_TOPIC)
    for domain in demo_domains():  # two prompt sets per pack (ARENA_EIGEN__PROMPT_SETS default)
        assert len({s.prompt_set for s in seeds if s.domain == domain}) == 2


def test_the_seven_workers_left_their_marks(demo_run: Demo, verified: list[EigenItem[Any]]) -> None:
    intents = [i.payload for i in items(demo_run, "eigen.intents")]
    # RandomPool: persona, environment context, difficulty factors; UserIntent: a task on them.
    for body in intents:
        assert body.draw.persona.role and body.draw.difficulty.required_calls >= 1
        assert body.intent.goals and body.intent.rubrics and body.intent.must_have_functions
    # TaskValidation: every task that went on is FEASIBLE with a probe-backed plan; Modify repaired
    # at least one of the demo's tasks (seeded: the seed-2 database has an infeasible first draft).
    tasks = [i.payload for i in items(demo_run, "eigen.tasks")]
    assert all(t.plan for t in tasks)
    repaired = [t for t in tasks if t.repair_rounds]
    assert repaired and all(t.first_reasons and t.repairs for t in repaired)
    # DialogSynthesis: the agent called tools in every dialogue, and in every domain the simulated
    # user called its own tools too (dual control; a task may need no act of the user's).
    user_acted: dict[str, bool] = {}
    for item in items(demo_run, "eigen.dialogs"):
        dialog = item.payload.dialog
        actors = {c.actor for c in dialog.calls}
        assert "agent" in actors and actors <= {"agent", "user"} and dialog.end_signal == "stop"
        user_acted[item.domain] = user_acted.get(item.domain, False) or "user" in actors
    assert user_acted and all(user_acted.values()), user_acted
    # TrajectoryValidation: the five checks and the judge role passed what went on.
    for item in items(demo_run, "eigen.dialogs.validated"):
        body = item.payload
        assert body.verdict.passed and body.judged.validation_result == "PASS"
        assert set(body.verdict.ratings) == {"schema", "grounding", "goal", "realism", "policy"}
    # VerificationFunction: generated code that passed the dialogue's own outcome in the sandbox.
    for item in verified:
        body = item.payload
        assert Verdict.model_validate(body.verdict).passed
        assert "def verify(initial_state, final_state, calls)" in body.instance["verify"]


def test_every_verification_function_runs_in_the_sandbox(verified: list[EigenItem[Any]]) -> None:
    instances = [i.payload.instance for i in verified]
    domains = [i.domain for i in verified]
    for item in verified:  # published only after the mutation gate passed it (in the sandbox)
        gate = item.payload.verdict["mutation_gate"]
        assert gate["passed"] and gate["perturbations"] >= 5 and not gate["wrong"]

    async def scenario(pool: SandboxPool) -> list[tuple[bool, bool]]:
        out = []
        for inst, domain in zip(instances, domains, strict=True):
            calls = inst["reference_calls"]
            # The reference outcome passes; the untouched database (nothing done) does not.
            ok = await pool.run(
                verify_program(inst["verify"], inst["initial_state"], _final(inst, domain), calls)
            )
            idle = await pool.run(
                verify_program(inst["verify"], inst["initial_state"], inst["initial_state"], [])
            )
            assert ok.ok and idle.ok, (ok.error, idle.error)
            out.append(
                (
                    Verdict.model_validate(ok.return_value).passed,
                    Verdict.model_validate(idle.return_value).passed,
                )
            )
        return out

    assert sandboxed(scenario) == [(True, False)] * len(instances)


def _final(instance: dict[str, Any], domain: str) -> dict[str, Any]:
    """The reference final state, replayed from the instance's reference calls."""
    _, final = replay_reference(
        load_pack(builtin_pack_path(domain)), instance["initial_state"], instance["reference_calls"]
    )
    return final


def test_outputs_feed_the_trainer_and_hold_out_a_split(
    demo_run: Demo, verified: list[EigenItem[Any]]
) -> None:
    bodies = [i.payload for i in verified]
    train = {b.sample_id for b in bodies if b.split == "train"}
    heldout = {b.sample_id for b in bodies if b.split == "heldout"}
    assert train and heldout  # ARENA_ENVS__HELDOUT_K=3 in the demo fixture
    samples = [VerifiedSample.model_validate(v) for v in values(demo_run.bootstrap, "samples.verified")]
    interactive = [s for s in samples if s.kind == "interactive"]
    assert {s.sample_id for s in interactive} == train  # held-out instances are never published
    for sample in interactive:
        spec = sample.reward_spec
        assert sample.domain in demo_domains() and sample.tools
        assert {"initial_state", "code", "verify", "user_instructions", "user_tools"} <= set(spec)
    catalog = EigenCatalog(ArenaSettings(home=demo_run.home).catalog)
    try:
        rows = catalog.instances()
    finally:
        catalog.dispose()
    assert {r.sample_id for r in rows if r.split == "heldout"} == heldout
    assert {r.sample_id for r in rows if r.split == "train"} == train
    # Accepted dialogues are SFT data for both sides: the agent, and the user simulator.
    sft = [SftSample.model_validate(v) for v in values(demo_run.bootstrap, "samples.sft")]
    eigen = [s for s in sft if s.source == "eigen"]
    assert len([s for s in eigen if s.role_target == "agent"]) == len(train)
    users = [s for s in eigen if s.role_target == "user"]
    assert len(users) == len(train)
    for user_sample in users:
        last = user_sample.messages[-1]
        assert last["role"] == "user" and parse_user_turn(last["content"]).signal == "stop"
        assert MARKERS["stop"] in last["content"]
        assert all(m["role"] != "tool" for m in user_sample.messages)  # the user never sees tool output


def test_pilot_metrics_reach_the_lake_and_versions_the_catalog(demo_run: Demo) -> None:
    records = values(demo_run.bootstrap, "eigen.pilot.metrics")
    lake = lake_json("select prompt_set, iteration, metrics from eigen_pilot_metrics", demo_run.env)
    assert len(lake) == len(records) >= 2
    for row in lake:
        metrics = json.loads(row["metrics"]) if isinstance(row["metrics"], str) else row["metrics"]
        assert {"infeasibility", "tool_call_validity", "quality"} <= set(metrics)
    sets = run_arena(["eigen", "sets"], demo_run.env).stdout
    set_ids = {r["prompt_set"] for r in lake}
    assert all(s in sets for s in set_ids) and "3 generating" in sets
    evolved = [s for s in set_ids if sum(1 for r in lake if r["prompt_set"] == s) > 1]
    assert evolved, "no set needed more than one pilot iteration"
    out = run_arena(["eigen", "critiques", evolved[0], "--json"], demo_run.env).stdout
    critiques = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert critiques and set(critiques[0]["critique"]["scores"]) == {
        "executability",
        "tool_correctness",
        "trajectory_coherence",
        "difficulty_coverage",
    }
    versions = run_arena(["eigen", "versions", evolved[0]], demo_run.env).stdout
    assert "phase 1: initial set" in versions


def test_unrepairable_task_is_rejected_in_the_stream_after_three_rounds(demo_run: Demo) -> None:
    """A task whose customer does not exist: the probe says why, Modify cannot fix it, 3 rounds.

    Only when the intent's prompt set runs Modify: a set whose workflow dropped it (the Planner
    saw no task needing repair in the pilot) rejects after its first verdict, 0 rounds.
    """
    catalog = EigenCatalog(ArenaSettings(home=demo_run.home).catalog)
    runs_modify = {}
    for intent in items(demo_run, "eigen.intents"):
        if intent.prompt_set not in runs_modify:
            current, _ = asyncio.run(load_prompt_set(catalog, intent.prompt_set))
            runs_modify[intent.prompt_set] = current.plan.runs("Modify")
    source = next(
        (i for i in items(demo_run, "eigen.intents") if runs_modify[i.prompt_set]),
        items(demo_run, "eigen.intents")[0],
    )
    rounds = 3 if runs_modify[source.prompt_set] else 0
    body = source.payload
    ghost = body.intent.model_copy(
        update={"known_info": {**body.intent.known_info, "email": "nobody@example.com"}}
    )
    item = make_item(
        EigenIntent,
        None,
        body.model_copy(update={"intent": ghost}),
        domain=source.domain,
        prompt_set=source.prompt_set,
    )
    asyncio.run(publish(demo_run.bootstrap, [Emit("eigen.intents", item.item_id, item)]))
    run_arena(
        # with the lake sink: the shared demo home stays drained (tests/test_lag_drained.py checks it)
        ["worker", "--stage", "eigen-tasks", "--stage", "lake-sink", "--until-drained", "--timeout", "240"],
        demo_run.env,
        timeout=300,
    )
    rejected = [json.loads(r.value) for r in read_all(demo_run.bootstrap, "eigen.intents.rejected")]
    mine = [r for r in rejected if r["subject"] == item.item_id]
    assert len(mine) == 1, rejected
    assert mine[0]["gate"] == "task_validation" and mine[0]["details"]["rounds"] == rounds
    assert "nobody@example.com" in mine[0]["reason"]
    if rounds:
        assert "3 repair round" in mine[0]["reason"]
    tasks = [json.loads(r.value) for r in read_all(demo_run.bootstrap, "eigen.tasks")]
    assert all(t["parent_id"] != item.item_id for t in tasks)

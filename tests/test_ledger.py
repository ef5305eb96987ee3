"""Drained means drained: every record a stage committed past has an entry in ``stages.ledger``.

The fault is injected the way it happened in the chaos run: the stage group's offsets are moved
past two published records that no worker handled. ``arena worker --until-drained`` must then
fail and name them, where lag alone reads 0 pending.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any, cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from starlette.testclient import TestClient

from app.registry import STAGES
from app.ui import create_app
from arena.config import ArenaSettings
from arena.records.common import DeadLetter, DeadLetterKind, Outcome, Rejection
from arena.topics import topic
from consumers.ledger import StageLedger, _add_entry
from streams.runtime import Context, Emit, StageDef, ledger_emit, outcome_of, run_handler
from tests.cli import arena_env, broker_of, read_all, run_arena, stack_stopped_after
from tests.test_pipeline import small_server

STAGE = ["worker", "--stage", "tools-servers", "--until-drained", "--timeout", "180"]


def _publish(tmp_path: Path, env: dict[str, str], names: list[str]) -> None:
    docs = tmp_path / f"docs-{names[0]}"
    docs.mkdir()
    for name in names:
        (docs / f"{name}.json").write_text(json.dumps(small_server(name)))
    run_arena(["publish", "tools", str(docs)], env)


def _commit_to_end(bootstrap: str, group: str, topic: str) -> None:
    """Move ``group``'s offsets on ``topic`` to its end, as a stage that skipped records would.

    Through a transaction (TxnOffsetCommit), as the stages commit: the group keeps its static
    member, so a plain OffsetCommit from outside it is refused.
    """

    async def commit() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"inject-{group}")
        await consumer.start()
        await producer.start()
        try:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            ends = await consumer.end_offsets(tps)
            await producer.begin_transaction()
            await producer.send_offsets_to_transaction(ends, group)
            await producer.commit_transaction()
        finally:
            await producer.stop()
            await consumer.stop()

    asyncio.run(commit())


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_until_drained_names_records_a_stage_committed_past(tmp_path: Path) -> None:
    env = arena_env(tmp_path / "home")
    with stack_stopped_after(env):
        _publish(tmp_path, env, ["kept0", "kept1"])
        first = run_arena(STAGE, env, timeout=240)
        assert "no outcome" not in first.stderr
        bootstrap = broker_of(Path(env["ARENA_HOME"]))
        entries = [json.loads(r.value) for r in read_all(bootstrap, "stages.ledger")]
        assert sorted((e["stage"], e["outcome"]) for e in entries) == [("tools-servers", "emitted")] * 2

        _publish(tmp_path, env, ["skipped0", "skipped1"])
        skipped = {
            r.key.decode(): (r.partition, r.offset)
            for r in read_all(bootstrap, "tools.raw")
            if json.loads(r.value)["server"].startswith("skipped")
        }
        _commit_to_end(bootstrap, "arena-tools-servers", "tools.raw")
        second = run_arena(STAGE, env, timeout=240, check=1)
        said = second.stdout + second.stderr
        assert "2 consumed record(s) have no outcome" in said
        for key, (partition, offset) in skipped.items():
            assert f"tools-servers: tools.raw[{partition}]@{offset} {key}" in said
        # The per-stage ledger counts the topic's records on its own, so the skip shows there too.
        [ledger] = json.loads(run_arena(["stages", "--json", "--track", "tools"], env).stdout)[:1]
        assert ledger["stage"] == "tools-servers"
        assert (ledger["in"], ledger["produced"], ledger["in_flight"]) == (4, 2, 0)
        assert ledger["balanced"] is False
        assert "do not balance: tools-servers" in run_arena(["stages", "--track", "tools"], env).stdout
        # The dashboard's stage ledger says the same and flags the stage.
        cfg = ArenaSettings(home=Path(env["ARENA_HOME"]), broker=bootstrap)
        with TestClient(create_app(cfg, bootstrap)) as client:
            shown = {row["stage"]: row for row in client.get("/api/stages").json()}
        assert set(shown) == {stage.name for stage in STAGES}
        assert {k: shown["tools-servers"][k] for k in ("in", "produced", "in_flight", "balanced")} == {
            "in": 4,
            "produced": 2,
            "in_flight": 0,
            "balanced": False,
        }


@pytest.mark.integration
def test_a_server_that_gives_no_walk_is_a_chains_rejection_with_its_reason(tmp_path: Path) -> None:
    """Tools that feed no other tool make one-tool chains: no walk, and the ledger says why."""
    env = arena_env(tmp_path / "home")
    with stack_stopped_after(env):
        _publish(tmp_path, env, ["lonely"])
        run_arena(
            [
                "worker",
                "--stage",
                "tools-servers",
                "--stage",
                "chains",
                "--until-drained",
                "--timeout",
                "180",
            ],
            env,
            timeout=240,
        )
        ledgers = {row["stage"]: row for row in json.loads(run_arena(["stages", "--json"], env).stdout)}
        chains = ledgers["chains"]
        assert (chains["in"], chains["produced"], chains["rejected"], chains["in_flight"]) == (1, 0, 1, 0)
        assert chains["rejected_by_gate"] == {"no_walk": 1} and chains["balanced"] is True
        assert ledgers["tools-servers"]["produced"] == 1 and ledgers["tools-servers"]["balanced"] is True
        rejections = [
            json.loads(r.value) for r in read_all(broker_of(Path(env["ARENA_HOME"])), "chains.rejected")
        ]
        [no_walk] = [r for r in rejections if r["gate"] == "no_walk"]
        assert no_walk["stage"] == "chains" and no_walk["subject"] == "lonely"
        assert "no walk of 2-4 tools" in no_walk["reason"]


def _emit(topic: str) -> Emit:
    value = (
        DeadLetter(
            stage="s", topic="tasks", kind=DeadLetterKind.crash, reason="r", payload_text="", payload_b64=""
        )
        if topic.endswith(".dlq")
        else Rejection(stage="s", topic="tasks", source_key="k", gate="g", reason="r", subject="x")
    )
    return Emit(topic, "k", value)


def test_outcome_of_names_what_a_stage_made_of_a_record() -> None:
    output = Emit(
        "trajectories",
        "t",
        Rejection(stage="s", topic="tasks", source_key="k", gate="g", reason="r", subject="x"),
    )
    assert outcome_of([output, _emit("tasks.rejected")]) == Outcome.emitted
    assert outcome_of([_emit("tasks.rejected"), _emit("tasks.dlq")]) == Outcome.dead_letter
    assert outcome_of([_emit("trajectories.rejected")]) == Outcome.rejected
    assert outcome_of([]) == Outcome.empty
    assert outcome_of([], stored=True) == Outcome.stored
    assert outcome_of([], duplicate=True) == Outcome.duplicate
    entry = ledger_emit("trajectories", "tasks", 2, 17, "task-1", [output, output], duplicate=False)
    assert entry.topic == "stages.ledger" and entry.source_ids == ("task-1",)
    assert entry.value.model_dump()["outputs"] == {"trajectories": 2}
    # one key per input offset: a record handled again (after a crash) is the same entry
    again = ledger_emit("trajectories", "tasks", 2, 17, "task-1", [], duplicate=True)
    assert again.key == entry.key


def test_ledger_entries_break_rejections_down_by_gate_and_dead_letters_by_kind() -> None:
    reject = _emit("trajectories.rejected")
    dead = _emit("tasks.dlq")
    entry = ledger_emit("trajectories", "tasks", 0, 3, "task-1", [reject, dead, reject], duplicate=False)
    value = entry.value.model_dump()
    assert value["outcome"] == "dead_letter"
    assert value["rejections"] == {"g": 2} and value["dead_letters"] == {"crash": 1}


def _entry(outcome: str, **fields: object) -> dict[str, object]:
    return {
        "stage": "chains",
        "topic": "tools.servers",
        "partition": 0,
        "offset": 0,
        "outcome": outcome,
        **fields,
    }


def test_a_stage_ledger_sums_entries_by_outcome_gate_and_kind() -> None:
    ledger = StageLedger(stage="chains", topic="tools.servers", in_=7)
    for entry in (
        _entry("emitted", outputs={"chains": 3, "chains.rejected": 1}, rejections={"coherence": 1}),
        _entry("stored"),
        _entry("rejected", outputs={"chains.rejected": 2}, rejections={"no_walk": 1, "coherence": 1}),
        _entry("duplicate"),
        _entry("empty"),  # an entry written before empty results became no_output rejections
        _entry("dead_letter", dead_letters={"llm_invalid_output": 2}, rejections={"coherence": 1}),
        _entry("not_addressed"),
    ):
        _add_entry(ledger, entry)
    assert (ledger.produced, ledger.rejected, ledger.dead_lettered, ledger.skipped_replays) == (2, 3, 1, 1)
    assert ledger.outputs == 3 and ledger.outputs_by_topic == {"chains": 3}
    assert ledger.rejected_by_gate == {"no_walk": 1, "duplicate": 1, "no_output": 1}
    assert ledger.dead_lettered_by_kind == {"llm_invalid_output": 1}
    ledger.in_ -= ledger.skipped_replays
    assert ledger.balanced  # 6 = 2 + 3 + 1 + 0
    ledger.in_flight = 1
    assert not ledger.balanced and ledger.accounted == 7
    assert set(ledger.as_json()) >= {
        "in", "produced", "rejected", "dead_lettered", "in_flight", "outputs",
        "rejected_by_gate", "dead_lettered_by_kind", "balanced",
    }  # fmt: skip


@pytest.mark.parametrize("stage", STAGES, ids=lambda stage: stage.name)
def test_a_record_a_stage_makes_nothing_of_is_a_rejection_or_stored(stage: StageDef[Any]) -> None:
    """Every stage: a handler that returns nothing leaves a reason (or, for a store, its effect)."""

    async def nothing(record: Any, ctx: Context) -> list[Emit]:
        return []

    silent = dataclasses.replace(stage, handler=nothing)
    ctx = Context(stage.name, stage.version, topic(stage.input), "src-1", ArenaSettings())
    emits = asyncio.run(run_handler(silent, cast(Any, None), ctx, b"{}"))
    if stage.effect is not None:
        assert emits == [] and outcome_of(emits, stored=True) == Outcome.stored
        return
    [rejection] = emits
    assert rejection.topic == topic(stage.input).rejected
    assert isinstance(rejection.value, Rejection) and rejection.value.gate == "no_output"
    assert stage.name in rejection.value.reason

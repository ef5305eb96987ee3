"""Drained means drained: every record a stage committed past has an entry in ``stages.ledger``.

The fault is injected the way it happened in the chaos run: the stage group's offsets are moved
past two published records that no worker handled. ``arena worker --until-drained`` must then
fail and name them, where lag alone reads 0 pending.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from arena.records.common import DeadLetter, DeadLetterKind, Outcome, Rejection
from streams.runtime import Emit, ledger_emit, outcome_of
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
    assert outcome_of([], duplicate=True) == Outcome.duplicate
    entry = ledger_emit("trajectories", "tasks", 2, 17, "task-1", [output, output], duplicate=False)
    assert entry.topic == "stages.ledger" and entry.source_ids == ("task-1",)
    assert entry.value.model_dump()["outputs"] == {"trajectories": 2}
    # one key per input offset: a record handled again (after a crash) is the same entry
    again = ledger_emit("trajectories", "tasks", 2, 17, "task-1", [], duplicate=True)
    assert again.key == entry.key

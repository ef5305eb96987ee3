"""read_committed readers keep every committed record after an aborted transaction.

The embedded broker lists aborted transactions that ended before a fetch's offset, and a producer
keeps its id after an abort (Arena's abort on a rebalance; a restarted worker fencing its killed
predecessor under the same transactional id). A client then skips that producer's later committed
batches. These tests are the reproduction against the broker alone: each reads a topic from past
the abort marker, where a plain client returns nothing (checked in a fresh process without the
repair), and asserts the repaired clients (``streams.read_committed``) return every committed
record, in order, once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from producers.publish_tools import outgoing
from producers.tool_docs import load_tool_doc_bytes
from streams import read_committed
from streams.runtime import encode
from tests.cli import arena_env, broker_of, read_all, run_arena, stack_stopped_after
from tests.test_pipeline import small_server

pytestmark = pytest.mark.integration


async def _produce(bootstrap: str, topic: str, steps: list[tuple[str, list[str]]], tid: str) -> None:
    """Transactions of one transactional id: ("commit"|"abort"|"fence", values) in order.

    "fence" leaves the values in an open transaction and starts a successor producer under the
    same id (as a worker restarted after ``kill -9`` does), which aborts it.
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
    await producer.start()
    zombies: list[AIOKafkaProducer] = []
    try:
        for action, values in steps:
            await producer.begin_transaction()
            for value in values:
                await (await producer.send(topic, value.encode()))
            if action == "commit":
                await producer.commit_transaction()
            elif action == "abort":
                await producer.abort_transaction()
            else:
                zombies.append(producer)
                producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
                await producer.start()
    finally:
        await producer.stop()
        for zombie in zombies:
            zombie._txn_manager = None  # fenced: closing must not try to end its transaction
            await zombie.client.close()


async def _read_aiokafka(bootstrap: str, topic: str, start: int) -> list[str]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, start)
        values: list[str] = []
        for _ in range(6):
            batch = await consumer.getmany(tp, timeout_ms=300)
            values += [m.value.decode() for m in batch.get(tp, [])]
        return values
    finally:
        await consumer.stop()


def _read_kafka_python(bootstrap: str, topic: str, start: int) -> list[str]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    try:
        tp = KafkaTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, start)
        values: list[str] = []
        for _ in range(6):
            batch = consumer.poll(timeout_ms=300)
            values += [m.value.decode() for m in batch.get(tp, [])]
        return values
    finally:
        consumer.close()


def _plain_client_reads(bootstrap: str, topic: str, start: int) -> list[str]:
    """What an unrepaired aiokafka client reads (a fresh process: the repair is per process)."""
    code = (
        "import asyncio, json, sys; sys.path.insert(0, '.');"
        "from tests.test_read_committed import _read_aiokafka;"
        f"print(json.dumps(asyncio.run(_read_aiokafka({bootstrap!r}, {topic!r}, {start}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.fixture(autouse=True)
def _repaired() -> None:
    read_committed.install()


def test_a_fenced_producers_successor_is_read_from_past_the_marker(
    broker: str, new_topic: Callable[..., str]
) -> None:
    """The loss in the chaos run: a reader positioned past the abort marker of a killed worker."""
    topic = new_topic()
    asyncio.run(
        _produce(broker, topic, [("fence", ["a0", "a1", "a2"]), ("commit", ["b0", "b1", "b2"])], topic)
    )
    # a0..a2 at 0-2, the ABORT marker at 3, b0..b2 at 4-6, the COMMIT marker at 7
    assert _plain_client_reads(broker, topic, 4) == [], (
        "the broker no longer lists stale aborted transactions"
    )
    assert asyncio.run(_read_aiokafka(broker, topic, 4)) == ["b0", "b1", "b2"]
    assert _read_kafka_python(broker, topic, 4) == ["b0", "b1", "b2"]
    assert asyncio.run(_read_aiokafka(broker, topic, 0)) == ["b0", "b1", "b2"]


def test_commits_after_an_abort_by_the_same_producer_are_read(
    broker: str, new_topic: Callable[..., str]
) -> None:
    """Arena aborts open transactions on a rebalance and goes on with the same producer."""
    topic = new_topic()
    steps = [("abort", ["x"]), ("commit", ["c0"]), ("commit", ["c1"]), ("abort", ["y"]), ("commit", ["c2"])]
    asyncio.run(_produce(broker, topic, steps, topic))
    # x@0 ABORT@1 c0@2 COMMIT@3 c1@4 COMMIT@5 y@6 ABORT@7 c2@8 COMMIT@9
    expected = {0: ["c0", "c1", "c2"], 2: ["c0", "c1", "c2"], 4: ["c1", "c2"], 6: ["c2"], 8: ["c2"]}
    for start, values in expected.items():
        assert asyncio.run(_read_aiokafka(broker, topic, start)) == values, start
        assert _read_kafka_python(broker, topic, start) == values, start


def test_a_batch_whose_marker_is_past_the_stable_offset_waits_for_it(
    broker: str, new_topic: Callable[..., str]
) -> None:
    """Committed data of an aborted-before producer whose marker is not in range yet is held, not dropped."""
    topic = new_topic()

    async def scenario() -> tuple[list[str], list[str]]:
        p = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=f"{topic}-p")
        q = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=f"{topic}-q")
        await p.start()
        await q.start()
        try:
            await p.begin_transaction()
            await (await p.send(topic, b"x"))
            await p.abort_transaction()  # x@0 ABORT@1: a stale entry for every later read
            await p.begin_transaction()
            await (await p.send(topic, b"p0"))  # p0@2
            await q.begin_transaction()
            await (await q.send(topic, b"q0"))  # q0@3: the stable offset stops here while q is open
            await p.commit_transaction()  # COMMIT@4, past the stable offset
            while_open = await _read_aiokafka(broker, topic, 2)
            await q.commit_transaction()
            after = await _read_aiokafka(broker, topic, 2)
            return while_open, after
        finally:
            await p.stop()
            await q.stop()

    while_open, after = asyncio.run(scenario())
    assert while_open == []  # p0 undecidable yet: held back, and read again once its marker is in range
    assert after == ["p0", "q0"]


def test_repair_keeps_entries_that_begin_inside_the_range() -> None:
    assert read_committed.repair(5, [(7, 5), (7, 9)], b"") == ([0, 1], 0)


def _raw_servers(names: list[str]) -> list[Any]:
    """tools.raw records (key, value, headers) for small MCP servers named ``names``."""
    out = []
    for name in names:
        doc = json.dumps(small_server(name)).encode()
        for emit in outgoing(load_tool_doc_bytes(doc, source=f"{name}.json").servers, []):
            out.append(encode(emit, stage="publish", stage_version="1"))
    return out


async def _publish_in_transactions(bootstrap: str, tid: str, steps: list[tuple[str, list[str]]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid)
    await producer.start()
    try:
        for action, names in steps:
            await producer.begin_transaction()
            for key, value, headers in _raw_servers(names):
                await (await producer.send("tools.raw", value, key=key, headers=headers, partition=0))
            if action == "commit":
                await producer.commit_transaction()
            else:
                await producer.abort_transaction()
    finally:
        await producer.stop()


def test_a_stage_restarted_past_an_abort_marker_handles_every_record(tmp_path: Path) -> None:
    """The chaos run's loss, at stage level: a worker whose committed offset lies past an upstream
    producer's abort marker handled none of that producer's later records, drained, and said so.
    """
    env = arena_env(tmp_path / "home")
    stage = ["worker", "--stage", "tools-servers", "--until-drained", "--timeout", "180"]
    with stack_stopped_after(env):
        run_arena(["topics", "create"], env)
        bootstrap = broker_of(Path(env["ARENA_HOME"]))
        steps = [("commit", ["alpha"]), ("abort", ["ghost"]), ("commit", ["beta"])]
        asyncio.run(_publish_in_transactions(bootstrap, "upstream", steps))
        run_arena(stage, env, timeout=240)  # handles alpha and beta; commits past the abort marker
        asyncio.run(_publish_in_transactions(bootstrap, "upstream", [("commit", ["gamma", "delta"])]))
        out = run_arena(stage, env, timeout=240)
        assert "no outcome" not in out.stderr
        names = sorted(json.loads(r.value)["name"] for r in read_all(bootstrap, "tools.servers"))
        assert names == ["alpha", "beta", "delta", "gamma"]


def test_markers_prove_an_entry_stale_only_between_its_start_and_the_fetch() -> None:
    markers = read_committed.Markers()
    marker = read_committed.Batch(start=0, base_offset=3, producer_id=7, transactional=True, marker=0)
    data = read_committed.Batch(start=0, base_offset=4, producer_id=7, transactional=True, marker=None)
    markers.record(("t", 0), [marker, data])
    assert markers.ended_between(("t", 0), 7, 0, 4)  # began at 0, ended at 3, fetch from 4
    assert not markers.ended_between(("t", 0), 7, 0, 3)  # the marker is not before the fetch offset
    assert not markers.ended_between(("t", 0), 7, 4, 9)  # a transaction that began after it
    assert not markers.ended_between(("t", 1), 7, 0, 4) and not markers.ended_between(("t", 0), 8, 0, 4)

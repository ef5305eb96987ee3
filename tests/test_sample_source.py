"""The trainer's ``SampleSource`` hands out records in one order, whatever the fetch timing.

Records go to ``samples.sft`` (4 partitions) on the real broker in committed transactions (so
commit markers sit between them, as the pipeline's exactly-once stages leave them) plus one aborted
transaction. Sources started at the same offsets then take them with different batch sizes and
pauses: every one gets the same sequence, in (offset, partition) order, without the aborted
records, and a source rewound to a mid-way checkpoint continues exactly where the first left off.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from arena.records.sft import SftSample
from streams.admin import ensure_topics
from streams.runtime import Emit, encode
from trainer.samples_source import SampleSource

pytestmark = pytest.mark.integration

TOPIC = "samples.sft"


def _sample(sample_id: str) -> SftSample:
    return SftSample(
        sample_id=sample_id,
        messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": sample_id}],
        tools=[],
        role_target="agent",
        source="test",
    )


async def _send(producer: AIOKafkaProducer, sample_id: str) -> None:
    key, value, headers = encode(Emit(TOPIC, sample_id, _sample(sample_id)), stage="test", stage_version="1")
    await producer.send(TOPIC, value, key=key, headers=headers)


async def _ends(broker: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=broker, isolation_level="read_committed")
    await consumer.start()
    try:
        parts = [TopicPartition(TOPIC, p) for p in range(4)]
        return {tp.partition: o for tp, o in (await consumer.end_offsets(parts)).items()}
    finally:
        await consumer.stop()


async def _publish(broker: str, txn_id: str, tag: str) -> list[str]:
    """Seven transactions of 8 records, the fourth aborted; the committed ids, in send order."""
    producer = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=txn_id)
    await producer.start()
    committed: list[str] = []
    try:
        for t in range(7):
            ids = [f"{tag}-{t * 8 + i:03d}" for i in range(8)]
            await producer.begin_transaction()
            for sid in ids:
                await _send(producer, sid)
            if t == 3:
                await producer.abort_transaction()
            else:
                await producer.commit_transaction()
                committed += ids
    finally:
        await producer.stop()
    return committed


async def _read(
    broker: str, group: str, start: dict[int, int], sizes: list[int], pause_s: float, limit: int
) -> tuple[list[tuple[int, int, str]], SampleSource[SftSample]]:
    """(offset, partition, sample id) of up to ``limit`` records taken in batches of ``sizes``."""
    producer = AIOKafkaProducer(bootstrap_servers=broker)
    await producer.start()
    source: SampleSource[SftSample] = SampleSource(broker, TOPIC, group_id=group, offsets=start)
    await source.start(producer)
    got: list[tuple[int, int, str]] = []
    try:
        i = 0
        while len(got) < limit:
            taken = await source.take(min(sizes[i % len(sizes)], limit - len(got)), wait_s=2.0)
            if not taken:
                break
            got += [(t.offset, t.partition, t.record.sample_id) for t in taken]
            i += 1
            await asyncio.sleep(pause_s)
    finally:
        await source.stop()
        await producer.stop()
    return got, source


def test_take_order_does_not_depend_on_fetch_timing(broker: str, unique_name: Callable[[str], str]) -> None:
    async def scenario() -> dict[str, Any]:
        await asyncio.to_thread(ensure_topics, broker)
        start = await _ends(broker)
        tag = unique_name("s")
        committed = await _publish(broker, unique_name("txn"), tag)
        one_go, _ = await _read(broker, unique_name("g"), start, [1000], 0.0, 1000)
        dribble, _ = await _read(broker, unique_name("g"), start, [1, 3, 7, 2], 0.05, 1000)
        rng = random.Random(0)
        jumpy, _ = await _read(
            broker, unique_name("g"), start, [rng.randint(1, 9) for _ in range(9)], 0.0, 1000
        )
        half, first = await _read(broker, unique_name("g"), start, [5], 0.0, 17)
        rest, _ = await _read(broker, unique_name("g"), first.offsets, [4], 0.0, 1000)
        runs = {"one_go": one_go, "dribble": dribble, "jumpy": jumpy, "resumed": half + rest}
        # Only this test's records: the session broker's samples.sft is shared.
        return {"committed": committed} | {
            name: [r for r in seq if r[2].startswith(tag)] for name, seq in runs.items()
        }

    runs = asyncio.run(scenario())
    one_go = runs["one_go"]
    assert sorted(sid for _, _, sid in one_go) == sorted(runs["committed"])  # aborted ones skipped
    assert [(o, p) for o, p, _ in one_go] == sorted((o, p) for o, p, _ in one_go)
    assert len({p for _, p, _ in one_go}) > 1  # the keys spread over partitions
    for other in ("dribble", "jumpy", "resumed"):
        assert runs[other] == one_go, other


def test_records_of_an_open_transaction_do_not_stall_take(
    broker: str, unique_name: Callable[[str], str]
) -> None:
    """A stage's transaction still open when the trainer takes: ``take`` returns what is committed
    without waiting on the open records, and hands them out once they are committed."""

    tag = unique_name("o")
    ids = [f"{tag}-{i:03d}" for i in range(8)]

    async def scenario() -> tuple[list[str], float, list[str]]:
        await asyncio.to_thread(ensure_topics, broker)
        start = await _ends(broker)
        producer = AIOKafkaProducer(bootstrap_servers=broker, transactional_id=unique_name("txn"))
        reader = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        await reader.start()
        source: SampleSource[SftSample] = SampleSource(
            broker, TOPIC, group_id=unique_name("g"), offsets=start
        )
        await source.start(reader)
        try:
            await producer.begin_transaction()
            for sid in ids:
                await _send(producer, sid)
            await producer.flush()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            open_taken = await source.take(8, wait_s=1.0)
            waited = loop.time() - t0
            await producer.commit_transaction()
            after = await source.take(8, wait_s=5.0)
            while len(after) < 8 and (more := await source.take(8, wait_s=2.0)):
                after += more
            return [t.record.sample_id for t in open_taken], waited, [t.record.sample_id for t in after]
        finally:
            await source.stop()
            await reader.stop()
            await producer.stop()

    open_taken, waited, after = asyncio.run(scenario())
    assert open_taken == []
    assert waited < 5.0  # the wait asked for, not HEAD_PATIENCE_S on a partition
    assert sorted(after) == ids

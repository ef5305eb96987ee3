"""A version's input against the real broker and lake (``producers.version_input``): a range the topic
no longer holds is read from the lake, record for record, and the copy is one transaction."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient

from arena.records.sft import ServerRef, Task
from arena.topics import topic
from arena.versions import INHERITED_HEADER, wire
from lake.parquet import LakeRow, LakeWriter
from lake.store import ClaimCheck, LocalStore
from producers.version_input import copied, copy_into, input_ranges, read_replayed, written_elsewhere
from streams.admin import ensure_topics
from tests.cli import read_all

pytestmark = pytest.mark.integration


def _version_topic(broker: str, name: str = "tasks") -> str:
    wired = wire(name, "t" + uuid.uuid4().hex[:10])
    ensure_topics(broker, [replace(topic(name), name=wired)])
    return wired


def _task(i: int) -> Task:
    server = ServerRef(server_id="srv", name="srv", domain="d", tools=[])
    return Task(task_id=f"task-{i}", server=server, text=f"task number {i}", language="en", mode="server")


def test_offsets_gone_from_the_topic_are_read_from_the_lake(broker: str, tmp_path: Path) -> None:
    name = _version_topic(broker)
    tasks = [_task(i) for i in range(5)]
    producer = KafkaProducer(bootstrap_servers=broker, acks="all")
    for i, task in enumerate(tasks):
        stage = b"tasks-from-servers" if i % 2 else b"tasks-from-chains"
        producer.send(
            name,
            task.model_dump_json().encode(),
            key=task.task_id.encode(),
            partition=0,
            headers=[("arena-stage", stage)],
        )
    producer.flush()
    producer.close()
    store = LocalStore(tmp_path)
    rows = [
        LakeRow(
            key=r.key.decode(),
            topic=name,
            partition=r.partition,
            offset=r.offset,
            timestamp_ms=r.timestamp,
            headers=r.headers,
            value=r.value,
        )
        for r in read_all(broker, name)
    ]
    LakeWriter(store).write(name, rows)  # what the lake sink did as they were written
    admin = KafkaAdminClient(bootstrap_servers=broker)
    try:
        admin.delete_records({TopicPartition(name, 0): 3})  # retention removed offsets 0-2
    finally:
        admin.close()

    found = asyncio.run(read_replayed(broker, store, name, [(0, 0, 5), (1, 0, 0)]))
    assert [r.key for r in found] == [t.task_id.encode() for t in tasks]
    assert [r.value for r in found] == [t.model_dump_json().encode() for t in tasks]
    assert [r.source for r in found] == ["lake"] * 3 + ["topic"] * 2
    assert all(dict(r.headers)["arena-stage"] for r in found)
    ranges = input_ranges(found, [(0, 0, 5), (1, 0, 0)])
    assert (ranges[0].records, ranges[0].from_lake, ranges[1].records) == (5, 3, 0)

    # what stages outside a version wrote is inherited; what its own stages wrote is not
    outside = [r for r in found if written_elsewhere(["tasks-from-chains"])(r)]
    assert [r.key for r in outside] == [b"task-1", b"task-3"]

    target = _version_topic(broker)
    assert asyncio.run(copied(broker, target, 4)) == 0
    claims = ClaimCheck(store, 1_000_000)
    sent = asyncio.run(
        copy_into(broker, claims, {target: found}, parent="main", transactional_id=f"t-{uuid.uuid4().hex}")
    )
    assert sent == 5 and asyncio.run(copied(broker, target, 4)) == 5
    out = read_all(broker, target)
    assert [(r.partition, r.key, r.value) for r in out] == [(0, x.key, x.value) for x in found]
    assert all((INHERITED_HEADER, b"main") in r.headers for r in out)

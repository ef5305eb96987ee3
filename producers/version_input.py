"""A data version's input: the replayed range and the inherited records, copied into its topics.

``arena replay STAGE --as NAME`` re-runs STAGE over a range of its input topic in the parent
version. The range is copied, record for record (key, value, headers, partition), into the new
version's copy of that topic, and STAGE's worker in the version reads it from there: a version
holds everything it read, so it replays the same way tomorrow, whatever the parent's topic has
retained by then. Offsets the parent's topic no longer holds (retention) are read from the lake,
which the lake sink filled as they were written.

A topic the version's downstream stages read may also be written by stages that do *not* run in
the version (``tasks`` is written by ``tasks-from-chains`` and ``tasks-from-servers``): those
records do not depend on the change, so they are copied too ("inherited"), and the version's
downstream is complete.

Everything goes in one Kafka transaction: a replay killed while copying leaves nothing visible, and
one that committed is found again by ``copied`` (``arena replay`` then only records the version).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import BaseModel

from arena.topics import topic as topic_spec
from arena.versions import INHERITED_HEADER, InputRange, split_wire
from lake.parquet import read_topic, row_value
from lake.store import CLAIM_HEADER, ClaimCheck, ObjectStore
from streams import read_committed

READ_STALL_S = 60.0
"""How long reading a partition may make no progress before the copy gives up."""


class VersionInputError(RuntimeError):
    """The replayed range cannot be read whole (the message says which offsets and why)."""


@dataclass(frozen=True)
class CopiedRecord:
    """One record to copy into the version: where it was, and what it is."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    source: str = "topic"
    """``topic`` (read from the parent's topic) or ``lake`` (retention had removed it)."""


class Bounds(BaseModel):
    """Offsets of one partition of a topic: the first it holds and its read_committed end."""

    partition: int
    earliest: int
    end: int


async def bounds(bootstrap: str, name: str, partitions: int) -> list[Bounds]:
    """``Bounds`` of every partition of topic ``name``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed")
    await consumer.start()
    try:
        tps = [TopicPartition(name, p) for p in range(partitions)]
        first = await consumer.beginning_offsets(tps)
        last = await consumer.end_offsets(tps)
        return [Bounds(partition=tp.partition, earliest=first[tp], end=last[tp]) for tp in tps]
    finally:
        await consumer.stop()


async def offsets_at(bootstrap: str, name: str, partitions: int, when_ms: int) -> dict[int, int | None]:
    """Per partition, the first offset whose record is at or after ``when_ms`` (None: none is)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        tps = [TopicPartition(name, p) for p in range(partitions)]
        found = await consumer.offsets_for_times(dict.fromkeys(tps, when_ms))
        return {tp.partition: (None if found.get(tp) is None else found[tp].offset) for tp in tps}
    finally:
        await consumer.stop()


async def read_range(bootstrap: str, name: str, partition: int, start: int, end: int) -> list[CopiedRecord]:
    """Every committed data record of ``name[partition]`` in ``[start, end)`` the topic holds."""
    if end <= start:
        return []
    read_committed.install()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, isolation_level="read_committed"
    )
    await consumer.start()
    tp = TopicPartition(name, partition)
    found: list[CopiedRecord] = []
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        clock = asyncio.get_running_loop().time
        position, moved_at = start, clock()
        while position < end:
            batch = await consumer.getmany(tp, timeout_ms=500, max_records=1000)
            for record in batch.get(tp, ()):
                if start <= record.offset < end:
                    headers = tuple((k, bytes(v)) for k, v in record.headers or ())
                    found.append(
                        CopiedRecord(partition, record.offset, record.key, record.value or b"", headers)
                    )
            if (at := await consumer.position(tp)) != position:
                position, moved_at = at, clock()
            elif clock() - moved_at > READ_STALL_S:
                raise VersionInputError(f"reading {name}[{partition}] stalled at offset {position}")
    finally:
        await consumer.stop()
    return found


def lake_range(store: ObjectStore, name: str, partition: int, start: int, end: int) -> list[CopiedRecord]:
    """The records of ``name[partition]`` in ``[start, end)`` as the lake holds them (blocking)."""
    if end <= start:
        return []
    table = read_topic(store, name)
    base = split_wire(name)[1]
    found: dict[int, CopiedRecord] = {}
    for row in table.to_pylist():
        offset = int(row["_offset"])
        if row["_partition"] != partition or not start <= offset < end:
            continue
        headers = json.loads(str(row["_headers"] or "{}"))
        pairs = tuple((k, str(v).encode("utf-8")) for k, v in headers.items() if k != CLAIM_HEADER)
        key = str(row["_key"]).encode("utf-8")
        try:
            value = row_value(base, row)
        except ValueError as exc:
            raise VersionInputError(f"{name}[{partition}]@{offset} in the lake: {exc}") from None
        found[offset] = CopiedRecord(partition, offset, key, value, pairs, "lake")
    return [found[o] for o in sorted(found)]


async def read_replayed(
    bootstrap: str, store: ObjectStore, name: str, ranges: Sequence[tuple[int, int, int]]
) -> list[CopiedRecord]:
    """The records of ``name`` in each ``(partition, start, end)``: from the topic, and from the lake
    for the offsets below the topic's earliest (retention removed them)."""
    spec = topic_spec(split_wire(name)[1])
    held = {b.partition: b for b in await bounds(bootstrap, name, spec.partitions)}
    records: list[CopiedRecord] = []
    for partition, start, end in ranges:
        earliest = held[partition].earliest
        if start < earliest:
            records += await asyncio.to_thread(lake_range, store, name, partition, start, min(end, earliest))
        records += await read_range(bootstrap, name, partition, max(start, earliest), end)
    return records


def input_ranges(records: Sequence[CopiedRecord], ranges: Sequence[tuple[int, int, int]]) -> list[InputRange]:
    """What ``records`` cover per replayed ``(partition, start, end)``, for the version's spec."""
    out = []
    for partition, start, end in ranges:
        mine = [r for r in records if r.partition == partition]
        out.append(
            InputRange(
                partition=partition,
                start=start,
                end=end,
                records=len(mine),
                from_lake=sum(1 for r in mine if r.source == "lake"),
            )
        )
    return out


def written_elsewhere(stages: Sequence[str]) -> Callable[[CopiedRecord], bool]:
    """True for a record whose ``arena-stage`` header names none of ``stages`` (a publisher's too)."""
    running = {s.encode() for s in stages}

    def keep(record: CopiedRecord) -> bool:
        return dict(record.headers).get("arena-stage") not in running

    return keep


async def copied(bootstrap: str, name: str, partitions: int) -> int:
    """Committed data records on ``name`` (the version's input): more than 0 after a copy committed."""
    held = await bounds(bootstrap, name, partitions)
    total = 0
    for b in held:
        total += len(await read_range(bootstrap, name, b.partition, b.earliest, b.end))
    return total


async def copy_into(
    bootstrap: str,
    claims: ClaimCheck,
    copies: dict[str, list[CopiedRecord]],
    *,
    parent: str,
    transactional_id: str,
) -> int:
    """Write every record of ``copies`` (target topic -> records) in one transaction; returns how many.

    Each keeps its key, value, headers and partition, plus ``arena-inherited-from: <parent>``. A
    value read from the lake that is too large for the broker travels as a claim, as any value does.
    """
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        transactional_id=transactional_id,
        transaction_timeout_ms=600_000,
    )
    await producer.start()
    sent = 0
    try:
        async with producer.transaction():
            for target, records in copies.items():
                for record in records:
                    kept = [(k, v) for k, v in record.headers if k != INHERITED_HEADER]
                    headers = [*kept, (INHERITED_HEADER, parent.encode())]
                    value = record.value
                    if record.source == "lake":
                        value, headers = await claims.seal_async(value, headers)
                    await producer.send(
                        target, value, key=record.key, headers=headers, partition=record.partition
                    )
                    sent += 1
    finally:
        await producer.stop()
    return sent

"""Every record a stage consumed has an outcome: the check behind `arena worker --until-drained`.

Each stage writes one ``stages.ledger`` entry per input record it handled (``streams.runtime
.ledger_emit``), in the transaction that carries the record's outputs and its offset. So below a
stage group's committed offset, every committed input record has exactly one entry, whatever the
outcome (outputs, rejections, dead letters, a duplicate key, nothing at all). An input record
there without an entry was committed past without being handled: lost. ``check`` reads the input
topics up to the committed offsets and the ledger, and names every such record.

A stage whose group committed offsets but that has no ledger entry at all ran before the ledger
existed (an older home): it is listed as unchecked, not as lost.

Synchronous (kafka-python), like ``consumers.lag``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Mapping

from kafka import KafkaConsumer, TopicPartition
from pydantic import BaseModel, Field

from arena.hashing import content_hash
from consumers.lag import _committed_offsets
from streams import read_committed
from streams.admin import admin_client, partition_counts
from streams.runtime import LEDGER_TOPIC

READ_TIMEOUT_S = 120.0


class Unaccounted(BaseModel):
    """An input record below a stage's committed offset with no ledger entry."""

    stage: str = Field(description="The stage that committed past it.")
    topic: str = Field(description="Its input topic.")
    partition: int
    offset: int
    key: str = Field(description="The record's key.")

    def __str__(self) -> str:
        return f"{self.stage}: {self.topic}[{self.partition}]@{self.offset} {self.key}"


class LedgerCheck(BaseModel):
    """What ``check`` found."""

    checked: dict[str, int] = Field(default_factory=dict, description="Input records checked per stage.")
    missing: list[Unaccounted] = Field(default_factory=list)
    unchecked: list[str] = Field(
        default_factory=list, description="Stages with committed offsets but no ledger entry (older homes)."
    )


def read_below(
    bootstrap: str, ranges: Mapping[TopicPartition, int], timeout_s: float
) -> dict[TopicPartition, list[tuple[int, bytes | None, bytes | None]]]:
    """(offset, key, value) of every committed record below ``ranges[tp]``, per partition."""
    out: dict[TopicPartition, list[tuple[int, bytes | None, bytes | None]]] = defaultdict(list)
    wanted = {tp: end for tp, end in ranges.items() if end > 0}
    if not wanted:
        return out
    read_committed.install()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        max_poll_records=5_000,
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    try:
        consumer.assign(list(wanted))
        consumer.seek_to_beginning(*wanted)
        open_tps = set(wanted)
        deadline = time.monotonic() + timeout_s
        while open_tps:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {sorted(map(str, open_tps))} took over {timeout_s:.0f}s")
            for tp, records in consumer.poll(timeout_ms=200).items():
                out[tp] += [(r.offset, r.key, r.value) for r in records if r.offset < wanted[tp]]
            for tp in list(open_tps):
                if consumer.position(tp) >= wanted[tp]:
                    open_tps.discard(tp)
                    consumer.pause(tp)
    finally:
        consumer.close(autocommit=False)
    return out


def read_to_end(
    bootstrap: str, topics: list[str], timeout_s: float
) -> dict[TopicPartition, list[tuple[int, bytes | None, bytes | None]]]:
    """``read_below`` every partition of ``topics`` (those that exist) to its read_committed end."""
    with admin_client(bootstrap) as admin:
        counts = partition_counts(admin, topics)
    tps = [TopicPartition(name, p) for name, n in counts.items() for p in range(n)]
    if not tps:
        return {}
    probe = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        ends = probe.end_offsets(tps)
    finally:
        probe.close()
    return read_below(bootstrap, ends, timeout_s)


def _ledger(bootstrap: str, timeout_s: float) -> set[tuple[str, str, int, int]]:
    """(stage, topic, partition, offset) of every committed ledger entry."""
    entries: set[tuple[str, str, int, int]] = set()
    for records in read_to_end(bootstrap, [LEDGER_TOPIC], timeout_s).values():
        for _offset, _key, value in records:
            entry = json.loads(value or b"{}")
            entries.add((entry["stage"], entry["topic"], int(entry["partition"]), int(entry["offset"])))
    return entries


def _name(key: bytes | None, value: bytes | None) -> str:
    """A record's key as the stages name it (``streams.app.source_key``)."""
    return key.decode("utf-8", "replace") if key else content_hash(value or b"")


def check(bootstrap: str, stages: Mapping[str, str], *, timeout_s: float = READ_TIMEOUT_S) -> LedgerCheck:
    """Input records each stage (name -> input topic) committed past without a ledger entry."""
    groups = {f"arena-{name}": name for name in stages}
    with admin_client(bootstrap) as admin:
        committed = _committed_offsets(admin, list(groups))
    ledger = _ledger(bootstrap, timeout_s)
    with_entries = {stage for stage, _topic, _p, _o in ledger}
    result = LedgerCheck()
    offsets_of: dict[str, dict[TopicPartition, int]] = {}
    for group, stage in groups.items():
        offsets = {tp: off for tp, off in committed.get(group, {}).items() if tp.topic == stages[stage]}
        if not any(offsets.values()):
            continue
        if stage not in with_entries:
            result.unchecked.append(stage)
            continue
        offsets_of[stage] = offsets
    ranges: dict[TopicPartition, int] = {}
    for offsets in offsets_of.values():
        for tp, offset in offsets.items():
            ranges[tp] = max(ranges.get(tp, 0), offset)
    records = read_below(bootstrap, ranges, timeout_s)
    for stage, offsets in offsets_of.items():
        for tp, end in offsets.items():
            below = [
                (offset, _name(key, value)) for offset, key, value in records.get(tp, []) if offset < end
            ]
            result.checked[stage] = result.checked.get(stage, 0) + len(below)
            for offset, key in below:
                if (stage, tp.topic, tp.partition, offset) not in ledger:
                    result.missing.append(
                        Unaccounted(
                            stage=stage, topic=tp.topic, partition=tp.partition, offset=offset, key=key
                        )
                    )
    result.missing.sort(key=lambda u: (u.stage, u.topic, u.partition, u.offset))
    return result

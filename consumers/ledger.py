"""Every record a stage consumed has an outcome: the check behind `arena worker --until-drained`,
and the per-stage ledger behind `arena stages`.

Each stage writes one ``stages.ledger`` entry per input record it handled (``streams.runtime
.ledger_emit``), in the transaction that carries the record's outputs and its offset. So below a
stage group's committed offset, every committed input record has exactly one entry, whatever the
outcome (outputs, rejections, dead letters, a duplicate key, nothing at all). An input record
there without an entry was committed past without being handled: lost. ``check`` reads the input
topics up to the committed offsets and the ledger, and names every such record.

A stage whose group committed offsets but that has no ledger entry at all ran before the ledger
existed (an older home): it is listed as unchecked, not as lost.

``stage_ledgers`` sums the same entries per stage, ``in = produced + rejected + dead_lettered +
in_flight``, with ``in`` counted independently (the data records on the input topic) so a stage
that skipped a record does not balance.

Synchronous (kafka-python), like ``consumers.lag``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from pydantic import BaseModel, ConfigDict, Field

from arena.hashing import content_hash
from arena.topics import topic as topic_spec
from arena.versions import split_worker, wire, worker_name
from consumers.lag import _committed_offsets, consumer_offsets
from streams import read_committed
from streams.admin import admin_client, partition_counts
from streams.runtime import LEDGER_TOPIC, NO_OUTPUT_GATE

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
        ends = consumer_offsets(probe.end_offsets, tps)
    finally:
        probe.close()
    return read_below(bootstrap, ends, timeout_s)


def _entries(
    bootstrap: str, names: Iterable[str], timeout_s: float
) -> dict[tuple[str, str, int, int], dict[str, Any]]:
    """Every committed ledger entry of the data versions of worker ``names``, by (worker name, input
    topic, partition, offset): a version's stages write its own ledger (``version.<v>.stages.ledger``)
    under their plain stage names, so its entries are named ``<stage>@<version>`` here."""
    versions = sorted({split_worker(name)[1] for name in names})
    ledgers = {wire(LEDGER_TOPIC, version): version for version in versions}
    entries: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    for tp, records in read_to_end(bootstrap, sorted(ledgers), timeout_s).items():
        version = ledgers[tp.topic]
        for _offset, _key, value in records:
            entry = json.loads(value or b"{}")
            name = worker_name(entry["stage"], version)
            entries[(name, entry["topic"], int(entry["partition"]), int(entry["offset"]))] = entry
    return entries


def _name(key: bytes | None, value: bytes | None) -> str:
    """A record's key as the stages name it (``streams.app.source_key``)."""
    return key.decode("utf-8", "replace") if key else content_hash(value or b"")


def check(bootstrap: str, stages: Mapping[str, str], *, timeout_s: float = READ_TIMEOUT_S) -> LedgerCheck:
    """Input records each stage (name -> input topic) committed past without a ledger entry.

    A name may be a data version's stage (``<stage>@<version>``, its input that version's topic).
    """
    groups = {f"arena-{name}": name for name in stages}
    with admin_client(bootstrap) as admin:
        committed = _committed_offsets(admin, list(groups))
    ledger = set(_entries(bootstrap, stages, timeout_s))
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


# -- per-stage ledger (`arena stages`) ---------------------------------------------------------

NOT_ADDRESSED = "not_addressed"
"""Ledger outcome of a dead-letter replay addressed to another stage: not one of this stage's inputs."""


class StageLedger(BaseModel):
    """What one stage made of its input records (``arena stages --json``: one object per stage).

    ``in = produced + rejected + dead_lettered + in_flight`` holds for a stage that accounted for
    every record; ``balanced`` says whether it does.
    """

    model_config = ConfigDict(populate_by_name=True)

    stage: str = Field(description="The stage (consumer group arena-<stage>).")
    topic: str = Field(description="Its input topic.")
    in_: int = Field(
        0,
        alias="in",
        description="Data records on the input topic (read_committed, from the earliest retained "
        "offset), less dead-letter replays addressed to other stages.",
    )
    produced: int = Field(
        0, description="Inputs that made at least one output (or were stored: StageDef.effect)."
    )
    rejected: int = Field(
        0, description="Inputs that ended in rejections only (duplicates and no-output included)."
    )
    dead_lettered: int = Field(0, description="Inputs that ended in dead letters, with no output.")
    in_flight: int = Field(
        0, description="Inputs above the committed offset: not handled yet, or being handled."
    )
    outputs: int = Field(
        0, description="Records emitted to the stage's output topics (an input may make several)."
    )
    rejected_by_gate: dict[str, int] = Field(
        default_factory=dict, description="Rejected inputs by the gate of their first rejection."
    )
    dead_lettered_by_kind: dict[str, int] = Field(
        default_factory=dict, description="Dead-lettered inputs by the kind of their first dead letter."
    )
    outputs_by_topic: dict[str, int] = Field(
        default_factory=dict, description="``outputs`` per output topic."
    )
    skipped_replays: int = Field(
        0, description="Dead-letter replays addressed to another stage (not in ``in``)."
    )
    ran: bool = Field(False, description="The stage's group has committed offsets: it ran.")

    @property
    def accounted(self) -> int:
        return self.produced + self.rejected + self.dead_lettered + self.in_flight

    @property
    def balanced(self) -> bool:
        return self.in_ == self.accounted

    def as_json(self) -> dict[str, Any]:
        return {**self.model_dump(by_alias=True), "balanced": self.balanced}


def _count(counts: dict[str, int], name: str) -> None:
    counts[name] = counts.get(name, 0) + 1


def _add_entry(ledger: StageLedger, entry: Mapping[str, Any]) -> None:
    """Count one ledger entry (raw JSON: entries of every Arena version parse) into ``ledger``."""
    outcome = entry.get("outcome")
    if outcome == NOT_ADDRESSED:
        ledger.skipped_replays += 1
        return
    for name, n in (entry.get("outputs") or {}).items():
        if topic_spec(name).side_of is None:
            ledger.outputs += n
            ledger.outputs_by_topic[name] = ledger.outputs_by_topic.get(name, 0) + n
    if outcome in ("emitted", "stored"):
        ledger.produced += 1
    elif outcome == "dead_letter":
        ledger.dead_lettered += 1
        _count(ledger.dead_lettered_by_kind, next(iter(entry.get("dead_letters") or {}), "unknown"))
    else:
        ledger.rejected += 1
        gates = {"duplicate": "duplicate", "empty": NO_OUTPUT_GATE}
        gate = gates.get(str(outcome)) or next(iter(entry.get("rejections") or {}), "unknown")
        _count(ledger.rejected_by_gate, gate)


def stage_ledgers(
    bootstrap: str, stages: Mapping[str, str], *, timeout_s: float = READ_TIMEOUT_S
) -> list[StageLedger]:
    """The ledger of each stage (name -> input topic), in the order given.

    Reads the input topics and ``stages.ledger`` to their read_committed ends: data records only,
    so transaction markers count nowhere. A data version's stage (``<stage>@<version>``, its input
    that version's topic) is counted from its version's ledger.
    """
    groups = {f"arena-{name}": name for name in stages}
    with admin_client(bootstrap) as admin:
        committed = _committed_offsets(admin, list(groups))
    inputs = read_to_end(bootstrap, sorted(set(stages.values())), timeout_s)
    entries = _entries(bootstrap, stages, timeout_s)
    ledgers = {name: StageLedger(stage=name, topic=source) for name, source in stages.items()}
    for group, name in groups.items():
        ledger = ledgers[name]
        offsets = committed.get(group, {})
        ledger.ran = any(tp.topic == ledger.topic for tp in offsets)
        for tp, records in inputs.items():
            if tp.topic != ledger.topic:
                continue
            done = offsets.get(tp, 0)
            ledger.in_ += len(records)
            ledger.in_flight += sum(1 for offset, _k, _v in records if offset >= done)
    for (name, source, _p, _o), entry in entries.items():
        if name in ledgers and ledgers[name].topic == source:
            _add_entry(ledgers[name], entry)
    for ledger in ledgers.values():
        ledger.in_ -= ledger.skipped_replays
    return list(ledgers.values())

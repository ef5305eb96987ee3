"""Data records per topic, counted incrementally (the dashboard's topic boxes).

An end offset is no record count: a transaction's commit marker occupies an offset and aborted
records are never delivered, so ``samples.sft`` once showed "436 records" for 242 rows. This counter
reads each partition read_committed from its earliest offset up to a given end and keeps where it
stopped, so the next call reads only what was appended since. A call reads for at most
``budget_s``; a partition it could not finish is reported as a lower bound and goes on next call.

Synchronous (kafka-python), like ``consumers.lag``; run it in a thread from async code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kafka import TopicPartition
from pydantic import BaseModel, Field

from consumers.lag import consumer_offsets, counting_consumer

BUDGET_S = 1.5


class TopicRecords(BaseModel):
    """Data records of one topic, partitions summed."""

    topic: str = Field(description="Topic name.")
    records: int = Field(description="Data records from the earliest offset to ``end``.")
    end: int = Field(description="Sum of the end offsets counted up to (markers included).")
    complete: bool = Field(
        description="False: reading has not reached the end yet, records is a lower bound."
    )


@dataclass
class _Partition:
    start: int
    """Earliest offset when counting began: a later earliest (retention) means counting again."""
    position: int
    count: int


class RecordCounter:
    """Counts data records per partition, reading only what was appended since the last call."""

    def __init__(self, bootstrap: str, *, budget_s: float = BUDGET_S) -> None:
        self.bootstrap = bootstrap
        self.budget_s = budget_s
        self._consumer: Any = None
        self._state: dict[TopicPartition, _Partition] = {}
        self._lock = threading.Lock()

    def _client(self) -> Any:
        if self._consumer is None:
            self._consumer = counting_consumer(self.bootstrap, "arena-record-count")
        return self._consumer

    def count(
        self, topics: Iterable[str], ends: Mapping[TopicPartition, int] | None = None
    ) -> dict[str, TopicRecords]:
        """Data records of each existing topic in ``topics``, up to ``ends`` (read_committed ends when missing).

        Give the end offsets a lag computation used and the counts match its figures exactly: a
        group's data records behind it are then ``records - lag``.
        """
        with self._lock:
            consumer = self._client()
            tps = [
                TopicPartition(t, p)
                for t in dict.fromkeys(topics)
                for p in sorted(consumer.partitions_for_topic(t) or [])
            ]
            if not tps:
                return {}
            targets = dict(ends or {})
            missing = [tp for tp in tps if tp not in targets]
            if missing:
                # read_committed: last stable offsets
                targets.update(consumer_offsets(consumer.end_offsets, missing))
            self._restart_trimmed(consumer, tps, targets)
            self._read(consumer, {tp: targets[tp] for tp in tps if self._state[tp].position < targets[tp]})
            out: dict[str, TopicRecords] = {}
            for tp in tps:
                state = self._state[tp]
                done = state.position >= targets[tp]
                was = out.get(tp.topic)
                out[tp.topic] = TopicRecords(
                    topic=tp.topic,
                    records=(was.records if was else 0) + state.count,
                    end=(was.end if was else 0) + targets[tp],
                    complete=(was.complete if was else True) and done,
                )
            return out

    def _restart_trimmed(
        self, consumer: Any, tps: list[TopicPartition], targets: Mapping[TopicPartition, int]
    ) -> None:
        """Count a partition from scratch when it is new, retention removed its head, or it was recreated."""
        earliest = consumer_offsets(consumer.beginning_offsets, tps)
        for tp in tps:
            state = self._state.get(tp)
            if state is None or earliest[tp] > state.start or targets[tp] < state.position:
                self._state[tp] = _Partition(earliest[tp], earliest[tp], 0)

    def _read(self, consumer: Any, targets: dict[TopicPartition, int]) -> None:
        if not targets:
            return
        consumer.assign(list(targets))
        for tp in targets:
            consumer.seek(tp, self._state[tp].position)
        open_tps = set(targets)
        deadline = time.monotonic() + self.budget_s
        try:
            while open_tps and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=50).items():
                    if tp in open_tps:
                        # the end is a snapshot: records appended since wait for the next call
                        self._state[tp].count += sum(1 for r in records if r.offset < targets[tp])
                for tp in list(open_tps):
                    # the position passes commit markers and aborted records too
                    position = consumer.position(tp)
                    self._state[tp].position = min(position, targets[tp])
                    if position >= targets[tp]:
                        open_tps.discard(tp)
                        consumer.pause(tp)
        finally:
            consumer.unsubscribe()

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
                self._consumer = None

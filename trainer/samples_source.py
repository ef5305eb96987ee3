"""Where the trainer's samples come from: a committed-read of ``samples.sft`` / ``samples.verified``.

The checkpoint's offsets are the source of truth, not the broker's committed
offsets: the source is assigned every partition of its topic, seeks to the
offsets it is given (the last full training state) or to the beginning, and
reports the position after the last record *taken* per partition. Offsets are
also committed to the trainer's consumer group after each checkpoint so
``arena lag`` shows how far training got; they are never read back.

A record that does not decode goes to ``<topic>.dlq`` with the reason and
counts as taken, so a bad record is neither lost nor retried forever. A record the
``screen`` turns down (``trainer.decontam``: a near-duplicate of a benchmark test item)
goes to ``<topic>.rejected`` with the reason and counts as taken too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata
from pydantic import BaseModel

from arena.hashing import content_hash
from arena.records.common import Rejection
from arena.topics import topic
from arena.versions import split_wire, wire
from lake.store import ClaimCheck
from streams import fetch_pacing, read_committed
from streams.runtime import Emit, dead_letter_key, decode_async, encode, encode_claimed

T = TypeVar("T", bound=BaseModel)

log = logging.getLogger(__name__)

STAGE = "trainer"
STAGE_VERSION = "1"

HEAD_PATIENCE_S = 30.0
"""How long ``take`` waits on a partition for records the broker says are committed."""

Screen = Callable[[str, BaseModel], dict[str, Any] | None]
"""(topic, sample) -> None to train on it, else the ``Rejection`` fields (gate, subject, reason, details)."""


@dataclass(frozen=True)
class Taken(Generic[T]):
    """One decoded sample and where it came from."""

    record: T
    key: str
    partition: int
    offset: int


class SampleSource(Generic[T]):
    """Reads one topic from given offsets; ``take`` hands out samples in a deterministic order.

    Fetches deliver partitions in whatever order the broker answers, so handing records out as
    they arrive made a run's batches depend on timing. ``take`` instead hands out the records
    committed before it began (below each partition's last stable offset, one ``ListOffsets``
    request) in (offset, partition) order, fetching a partition it is waiting on: the partitions
    interleave evenly, and the same topic and start offsets give the same sequence whatever the
    fetch timing or the sizes asked for. Records committed while a take runs wait for the next.
    """

    def __init__(
        self,
        bootstrap: str,
        name: str,
        *,
        group_id: str,
        offsets: dict[int, int] | None = None,
        poll_ms: int = 500,
        claims: ClaimCheck | None = None,
        screen: Screen | None = None,
    ) -> None:
        self.name = name
        """The Kafka topic: ``samples.sft``, or a data version's copy (``version.<v>.samples.sft``)."""
        self.version, base = split_wire(name)
        self.spec = topic(base)
        self._bootstrap = bootstrap
        self._group_id = group_id
        self._start = dict(offsets or {})
        self._poll_ms = poll_ms
        self._claims = claims
        """Reads claimed (large) samples from the lake and claims large dead letters."""
        self._queues: dict[int, deque[ConsumerRecord[bytes, bytes]]] = {
            p: deque() for p in range(self.spec.partitions)
        }
        """Fetched, not yet taken records per partition, in offset order."""
        self._next: dict[int, int] = dict(self._start)
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self.dead_letters = 0
        self._screen = screen
        self.screened_out = 0
        """Samples the screen sent to ``<topic>.rejected`` instead of training."""

    async def start(self, producer: AIOKafkaProducer) -> None:
        # An idle source (samples.sft all through GRPO) must not re-fetch in a tight loop on a
        # broker that answers empty fetches at once: that took a whole core from the trainer.
        fetch_pacing.install()
        read_committed.install()
        self._producer = producer
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            group_id=self._group_id,
            enable_auto_commit=False,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )
        await consumer.start()
        parts = [TopicPartition(self.name, p) for p in range(self.spec.partitions)]
        consumer.assign(parts)
        for tp in parts:
            if tp.partition in self._start:
                consumer.seek(tp, self._start[tp.partition])
            else:
                await consumer.seek_to_beginning(tp)
        self._consumer = consumer

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    @property
    def offsets(self) -> dict[int, int]:
        """Next offset per partition after everything taken so far (what a checkpoint stores)."""
        return dict(self._next)

    def _partition(self, p: int) -> TopicPartition:
        return TopicPartition(self.name, p)

    async def _fill(self, timeout_ms: int, *partitions: TopicPartition) -> int:
        """Fetch what is there (from ``partitions``, default all), waiting up to ``timeout_ms``."""
        assert self._consumer is not None, "start() the source first"
        batches = await self._consumer.getmany(*partitions, timeout_ms=timeout_ms, max_records=500)
        got = 0
        for tp, records in batches.items():
            self._queues[tp.partition].extend(records)
            got += len(records)
        return got

    async def _stable_ends(self) -> dict[int, int]:
        """Each partition's last stable offset: every record below it is committed (read_committed)."""
        assert self._consumer is not None, "start() the source first"
        ends = await self._consumer.end_offsets([self._partition(p) for p in self._queues])
        return {tp.partition: offset for tp, offset in ends.items()}

    async def pending(self) -> int:
        """Records not yet taken: queued locally plus what the broker still holds past our position."""
        assert self._consumer is not None
        ends = await self._stable_ends()
        behind = 0
        for p, end in ends.items():
            behind += max(0, end - await self._consumer.position(self._partition(p)))
        return sum(len(q) for q in self._queues.values()) + behind

    async def _head(self, p: int, end: int) -> int | None:
        """Offset of partition ``p``'s next record below ``end``, fetching it when it is not queued
        yet; None when the partition holds no more records below ``end``."""
        assert self._consumer is not None
        queue, tp = self._queues[p], self._partition(p)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + HEAD_PATIENCE_S
        while not queue:
            if await self._consumer.position(tp) >= end:  # also past commit markers and aborted records
                return None
            await self._fill(self._poll_ms, tp)
            if not queue and loop.time() > give_up:  # committed records that never come: do not hang
                log.warning("%s[%d]: no record below offset %d in %.0f s", self.name, p, end, HEAD_PATIENCE_S)
                return None
        offset = queue[0].offset
        return offset if offset < end else None

    async def _next_raw(self, ends: dict[int, int]) -> ConsumerRecord[bytes, bytes] | None:
        """The lowest (offset, partition) record below ``ends``, or None when there is none."""
        heads = [(offset, p) for p, end in ends.items() if (offset := await self._head(p, end)) is not None]
        if not heads:
            return None
        return self._queues[min(heads)[1]].popleft()

    async def take(self, n: int, *, wait_s: float = 0.0) -> list[Taken[T]]:
        """Up to ``n`` decoded samples, in (offset, partition) order of the records committed before
        the call; waits up to ``wait_s`` for the first one when there are none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        ends = await self._stable_ends()
        out: list[Taken[T]] = []
        while len(out) < n:
            raw = await self._next_raw(ends)
            if raw is None:
                remaining = deadline - loop.time()
                if out or remaining <= 0:
                    break
                await self._fill(int(min(remaining, self._poll_ms / 1000) * 1000))
                ends = await self._stable_ends()
                continue
            self._next[raw.partition] = raw.offset + 1
            taken = await self._decode(raw)
            if taken is not None:
                out.append(taken)
        return out

    async def _decode(self, raw: ConsumerRecord[bytes, bytes]) -> Taken[T] | None:
        key = raw.key.decode("utf-8", "replace") if raw.key else ""
        decoded = await decode_async(
            self.spec,
            raw.value,
            stage=STAGE,
            source_key=key,
            partition=raw.partition,
            offset=raw.offset,
            headers=raw.headers,
            claims=self._claims,
        )
        if decoded.dead_letter is not None:
            await self._send(Emit(self.spec.dlq, dead_letter_key(decoded.dead_letter), decoded.dead_letter))
            self.dead_letters += 1
            return None
        assert decoded.record is not None
        # In a thread: the screen may embed the sample's text (and load the encoder the first time).
        why = (
            None
            if self._screen is None
            else await asyncio.to_thread(self._screen, self.spec.name, decoded.record)
        )
        if why is not None:
            rejection = Rejection(stage=STAGE, topic=self.name, source_key=key, **why)
            rejection_key = content_hash([key, rejection.gate, rejection.subject])
            await self._send(Emit(self.spec.rejected, rejection_key, rejection, (key,)))
            self.screened_out += 1
            return None
        return Taken(decoded.record, key, raw.partition, raw.offset)  # type: ignore[arg-type]

    async def _send(self, emit: Emit) -> None:
        assert self._producer is not None
        if self._claims is None:
            key, value, headers = encode(emit, stage=STAGE, stage_version=STAGE_VERSION)
        else:
            key, value, headers = await encode_claimed(
                emit, stage=STAGE, stage_version=STAGE_VERSION, claims=self._claims
            )
        target = wire(emit.topic, self.version)  # a version's dead letters stay in the version
        await (await self._producer.send(target, value, key=key, headers=headers))

    async def rewind(self, offsets: dict[int, int]) -> None:
        """Go back to ``offsets`` (from ``offsets`` earlier): what was taken since is taken again."""
        for queue in self._queues.values():
            queue.clear()
        self._next = dict(offsets)
        if self._consumer is None:
            self._start = dict(offsets)
            return
        for p in range(self.spec.partitions):
            tp = TopicPartition(self.name, p)
            if p in offsets:
                self._consumer.seek(tp, offsets[p])
            elif p in self._start:
                self._consumer.seek(tp, self._start[p])
            else:
                await self._consumer.seek_to_beginning(tp)

    async def commit(self, offsets: dict[int, int] | None = None) -> None:
        """Tell the consumer group how far training got (for `arena lag`; restarts use the checkpoint):
        ``offsets`` when given (a checkpoint's, which may lie behind samples already taken for a
        later step), else the position after everything taken."""
        offsets = self._next if offsets is None else offsets
        if self._consumer is None or not offsets:
            return
        await self._consumer.commit(
            {TopicPartition(self.name, p): OffsetAndMetadata(o, "") for p, o in offsets.items()}
        )

"""Skip inputs a stage has already processed, using its own input topic as the record.

Re-publishing the same tool docs re-emits records with the same content-hash
keys. Stages whose work is expensive or touches real services (LLM calls, MCP
servers) must not redo it, or downstream topics would fill with duplicates.

The committed offset of a partition is exact: every record before it was
processed in a committed transaction, together with its outputs. So the set
of processed keys is the set of keys before the committed offset, and the
input topic itself is the changelog (the way Kafka Streams reuses a source
topic). On the first event of a partition the set is rebuilt by reading the
partition's keys up to that event's offset; later events add their key once
handled. A crash loses only the in-memory set, which the next start rebuilds;
a revoked partition's set is dropped and rebuilt when it is assigned again.

A stage handles several records at once (``streams.app.OrderedRunner``), so two records with
the same key can both pass ``seen`` before either is handled; the runner asks ``handled`` again
when it releases a record, in offset order, and drops the later one's outputs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from streams import read_committed

log = logging.getLogger("arena.stage")

KEYS_READ_STALL_S = 120.0
"""How long rebuilding a partition's keys may make no progress before it fails (the worker restarts)."""

REPLAY_HEADER = "arena-replay-of"
"""Header of a record `arena dlq replay` re-published (value: the replay's id, ``<failure id>#<attempt>``).

A replay repeats a key the stage has already handled (it dead-lettered it), so ``seen`` must not
skip it; the replay ledger (``consumers.dlq``) makes sure each attempt is published once. A stage
that fails on the record again names the replay in its dead letter (``DeadLetter.replay_of``).
"""

REPLAY_TARGET_HEADER = "arena-replay-for"
"""Header naming the one stage a replay is for: the stage that dead-lettered the record.

The other stages reading the topic skip the record (ledger outcome ``not_addressed``): they handled
it when it first came. A replay without it (a publisher's letter: the record never reached the
topic) is for every reader.
"""


def _header(headers: Any, name: str) -> str | None:
    value = dict(headers or ()).get(name)
    return None if value is None else bytes(value).decode("utf-8", "replace")


def is_replay(headers: Any) -> bool:
    """True when a message's headers (pairs or a mapping) mark it as a dead-letter replay."""
    return REPLAY_HEADER in dict(headers or ())


def replay_id(headers: Any) -> str | None:
    """The id of the replay a message is (its ``arena-replay-of``), None for an ordinary record."""
    return _header(headers, REPLAY_HEADER)


def addressed_to(stage: str, headers: Any) -> bool:
    """False only for a replay addressed to another stage (``REPLAY_TARGET_HEADER``)."""
    target = _header(headers, REPLAY_TARGET_HEADER)
    return target is None or target == stage


class SeenKeys:
    """Keys of one input topic already handled, per partition."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._seen: dict[int, set[str]] = {}
        self._loads: dict[int, asyncio.Task[set[str]]] = {}
        """Partitions whose set is being rebuilt (concurrent first events share one read)."""

    async def seen(self, partition: int, offset: int, key: str) -> bool:
        """True when ``key`` was handled before ``offset`` in ``partition``."""
        if partition not in self._seen:
            load = self._loads.get(partition)
            if load is None:
                load = self._loads[partition] = asyncio.ensure_future(self._keys_before(partition, offset))
            try:
                keys = await asyncio.shield(load)
            finally:
                if load.done() and self._loads.get(partition) is load:
                    del self._loads[partition]
            self._seen.setdefault(partition, set()).update(keys)
        return key in self._seen[partition]

    def handled(self, partition: int, key: str) -> bool:
        """True when ``key`` is in the partition's set as it stands (no rebuild)."""
        return key in self._seen.get(partition, ())

    def add(self, partition: int, key: str) -> None:
        self._seen.setdefault(partition, set()).add(key)

    def loaded(self, partition: int) -> bool:
        """True when the partition's set is here (read from the topic, or given with ``add``).

        Only then may a handled key be ``add``-ed: a set started by ``add`` alone (a partition
        whose first records were replays, which skip ``seen``) would stand for one that holds
        every key before it, and ``seen`` would never read the partition.
        """
        return partition in self._seen

    def forget(self, partitions: Iterable[int]) -> None:
        """Drop revoked partitions: another worker may handle keys there before they come back."""
        for partition in partitions:
            self._seen.pop(partition, None)
            load = self._loads.pop(partition, None)
            if load is not None:
                load.cancel()

    async def _keys_before(self, partition: int, offset: int) -> set[str]:
        keys: set[str] = set()
        if offset <= 0:
            return keys
        tp = TopicPartition(self._topic, partition)
        read_committed.install()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap,
            isolation_level="read_committed",
            enable_auto_commit=False,
            group_id=None,
        )
        await consumer.start()
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            # Every record before ``offset`` is committed, but a read_committed answer can hold one
            # back until its transaction's marker is in range (streams.read_committed): wait for it
            # rather than answer with part of the keys (which would let a duplicate through).
            stalled_since = time.monotonic()
            while (position := await consumer.position(tp)) < offset:
                batch = await consumer.getmany(tp, timeout_ms=1000, max_records=500)
                if await consumer.position(tp) > position:
                    stalled_since = time.monotonic()
                elif time.monotonic() - stalled_since > KEYS_READ_STALL_S:
                    raise TimeoutError(
                        f"{self._topic}[{partition}]: reading the keys before offset {offset} stalled "
                        f"at {position} for {KEYS_READ_STALL_S:.0f}s"
                    )
                for message in batch.get(tp, []):
                    if message.offset >= offset:
                        break
                    if message.key:
                        keys.add(message.key.decode("utf-8", "replace"))
        finally:
            await consumer.stop()
        log.info(
            "%s[%d]: %d keys already handled before offset %d", self._topic, partition, len(keys), offset
        )
        return keys

"""Keep a worker's offsets honest across rebalances, and turn a silent stall into a restart.

Two replicas of a worker share a consumer group, so partitions move between them while they run.
Faust loses track of offsets in two ways there, and the worker then stops committing with no
error (its lag just stops moving):

- Faust records a commit's offsets as committed even when the commit failed (the group moved on:
  ``IllegalGeneration``) or ended after the partitions were revoked, and ``perform_seek`` only
  overwrites that mark for partitions that have a committed offset at the broker. When such a
  partition comes back, the stale mark is ahead of the records read again, ``Consumer.ack``
  ignores their acks, and the partition never commits again. ``exact_offset_marks`` resets the
  marks (and the acks) of the assigned partitions before each seek, so they are the broker's.
- Faust drops records the Kafka client already returned when a rebalance stops its flow (the
  fetch in flight, the stream's buffer, events of the ended generation), and relies on the seek to
  the committed offsets that follows to read them again. aiokafka seeks only partitions with a
  committed offset above 0, so a partition that never committed (a replica's share handed over
  before its first commit) stays past the dropped records: the worker then waits for records that
  never come, with no error and nothing in flight. ``exact_offset_marks`` seeks those partitions
  to the beginning, where ``auto_offset_reset=earliest`` starts a partition with no commit.
- Anything else that wedges a worker (a transactional request the broker never answers, a group
  coordinator routine that died) is caught by
  ``StallWatchdog``: the process exits and the supervisor restarts it under its static member id.
  A restart is as safe as ``kill -9``: uncommitted transactions are aborted when the new
  producers fence the old ones, and records are handled again from the committed offsets.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("arena.watchdog")

STALL_S = float(os.environ.get("ARENA_STALL_S", "90"))
"""How long acked offsets may wait for a commit before the worker is restarted."""

CHECK_EVERY_S = 5.0
EXIT_STALLED = 75
"""Exit status of a worker the watchdog stopped (the supervisor restarts it)."""


def exact_offset_marks(consumer: Any) -> None:
    """Make ``consumer.perform_seek`` start the assigned partitions from the broker's offsets only."""
    if getattr(consumer, "_arena_exact_marks", False):
        return
    seek = consumer.perform_seek

    async def perform_seek() -> None:
        assigned = consumer.assignment()
        for tp in assigned:
            # Nothing of the new assignment is acked yet: every mark left here is stale.
            consumer._committed_offset.pop(tp, None)
            consumer._acked.pop(tp, None)
            consumer._acked_index.pop(tp, None)
            consumer._gap.pop(tp, None)
        await seek()
        # The seek moved only partitions with a committed offset above 0 (aiokafka skips the others),
        # and Faust marks exactly those as committed. The others start over from the beginning, as
        # ``auto_offset_reset=earliest`` starts them: records the client returned and Faust dropped
        # during the rebalance are behind their position, and nothing else would read them again.
        uncommitted = {tp: 0 for tp in consumer.assignment() if consumer._committed_offset.get(tp) is None}
        if uncommitted:
            log.info("no committed offset, reading from the beginning: %s", sorted(map(str, uncommitted)))
            await consumer.seek_wait(uncommitted)

    # Faust has no hook between an assignment and its seek; Recovery calls this method.
    consumer.perform_seek = perform_seek
    consumer._arena_exact_marks = True


class StallWatchdog:
    """Exits the process when its consumer stops making progress it should be making."""

    def __init__(
        self,
        app: Any,
        *,
        stall_s: float = STALL_S,
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self.app = app
        self.stall_s = stall_s
        self._exit = exit
        self._pending: dict[Any, tuple[int, float]] = {}
        """Per partition: the oldest acked offset waiting for a commit, and since when."""

    def check(self) -> None:
        consumer = self.app._consumer  # not ``app.consumer``: that would create it, from this thread
        if consumer is None:
            return
        reason = self.coordinator_dead(consumer) or self.commit_stuck(consumer)
        if reason:
            log.error("worker stalled (%s); exiting so that the supervisor restarts it", reason)
            for handler in logging.getLogger().handlers:
                handler.flush()
            self._exit(EXIT_STALLED)

    def coordinator_dead(self, consumer: Any) -> str | None:
        """The Kafka client's group routine ended with an error: the worker left its group for good."""
        client = getattr(getattr(consumer, "_thread", None), "_consumer", None)
        task = getattr(getattr(client, "_coordinator", None), "_coordination_task", None)
        if task is None or not task.done() or task.cancelled() or task.exception() is None:
            return None
        return f"the group coordinator routine failed: {task.exception()!r}"

    def commit_stuck(self, consumer: Any) -> str | None:
        """Acked offsets of a partition have waited longer than ``stall_s`` for a commit they could get.

        Offsets acked behind a record still in flight (an earlier offset of the same partition,
        waiting on a slow model) cannot be committed yet: that is waiting, not a stall.
        """
        now = time.monotonic()
        in_flight: dict[Any, int] = {}
        try:  # this thread reads what the event loop changes: a round that races is skipped
            unacked = list(consumer._unacked_messages)
        except RuntimeError:
            return None
        for message in unacked:
            if message.tp not in in_flight or message.offset < in_flight[message.tp]:
                in_flight[message.tp] = message.offset
        pending: dict[Any, tuple[int, float]] = {}
        for tp, acked in list(consumer._acked.items()):
            if not acked:
                continue
            oldest = min(acked)
            if tp in in_flight and in_flight[tp] < oldest:
                continue
            previous = self._pending.get(tp)
            pending[tp] = previous if previous is not None and previous[0] == oldest else (oldest, now)
        self._pending = pending
        stuck = {tp: offset for tp, (offset, since) in pending.items() if now - since > self.stall_s}
        if not stuck:
            return None
        return f"acked offsets not committed for {self.stall_s:.0f}s: {stuck}"


def install(app: Any) -> StallWatchdog:
    """Check ``app``'s consumer every few seconds, from a daemon thread.

    A thread, not a Faust timer: Faust starts its timers once the worker is ready, after its first
    partition assignment, and the stall it must catch can come before that one.
    """
    watchdog = StallWatchdog(app)

    def watch() -> None:
        while True:
            time.sleep(CHECK_EVERY_S)
            watchdog.check()

    threading.Thread(target=watch, name="stall-watchdog", daemon=True).start()
    return watchdog

"""streams.watchdog: a wedged worker exits (the supervisor restarts it); offset marks come from the broker."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from streams.watchdog import EXIT_STALLED, StallWatchdog, exact_offset_marks


class _Consumer:
    """The Faust consumer attributes the watchdog reads (a real Faust consumer needs a broker)."""

    def __init__(self) -> None:
        self._acked: dict[str, list[int]] = {}
        self._acked_index: dict[str, set[int]] = {}
        self._committed_offset: dict[str, int] = {}
        self._gap: dict[str, list[int]] = {}
        self._thread = SimpleNamespace(
            _consumer=SimpleNamespace(_coordinator=SimpleNamespace(_coordination_task=None))
        )
        self.seeks = 0

    def assignment(self) -> set[str]:
        return {"t-0", "t-1"}

    async def perform_seek(self) -> None:
        self.seeks += 1


def _watchdog(consumer: Any, exits: list[int]) -> StallWatchdog:
    return StallWatchdog(SimpleNamespace(_consumer=consumer), stall_s=0.05, exit=exits.append)


def test_offsets_acked_but_never_committed_stop_the_worker() -> None:
    consumer, exits = _Consumer(), []
    watchdog = _watchdog(consumer, exits)
    consumer._acked["t-0"] = [7, 8]
    watchdog.check()
    assert exits == []  # waiting, not yet too long
    asyncio.run(asyncio.sleep(0.1))
    watchdog.check()
    assert exits == [EXIT_STALLED]


def test_commits_that_keep_moving_are_not_a_stall() -> None:
    consumer, exits = _Consumer(), []
    watchdog = _watchdog(consumer, exits)
    for oldest in range(5):
        consumer._acked["t-0"] = [oldest, oldest + 1]  # each check: the older ones were committed
        watchdog.check()
        asyncio.run(asyncio.sleep(0.03))
    consumer._acked["t-0"] = []
    watchdog.check()
    assert exits == []


def test_a_dead_group_routine_stops_the_worker() -> None:
    consumer, exits = _Consumer(), []

    async def broken() -> None:
        raise ValueError("unexpected assignment")

    async def run() -> asyncio.Task[None]:
        task = asyncio.ensure_future(broken())
        await asyncio.sleep(0)
        return task

    consumer._thread._consumer._coordinator._coordination_task = asyncio.run(run())
    _watchdog(consumer, exits).check()
    assert exits == [EXIT_STALLED]


def test_a_new_assignment_forgets_marks_the_broker_did_not_commit() -> None:
    consumer = _Consumer()
    consumer._committed_offset.update({"t-0": 40, "other-0": 3})
    consumer._acked["t-1"] = [9]
    exact_offset_marks(consumer)
    exact_offset_marks(consumer)  # installed once
    asyncio.run(consumer.perform_seek())
    assert consumer.seeks == 1
    assert consumer._committed_offset == {"other-0": 3} and "t-1" not in consumer._acked

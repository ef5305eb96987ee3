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
        self._unacked_messages: list[SimpleNamespace] = []
        self._thread = SimpleNamespace(
            _consumer=SimpleNamespace(_coordinator=SimpleNamespace(_coordination_task=None))
        )
        self.seeks = 0
        self.broker_committed: dict[str, int] = {}
        """What the seek to the committed offsets finds at the broker (Faust marks offsets above 0)."""
        self.rewound: list[dict[str, int]] = []

    def assignment(self) -> set[str]:
        return {"t-0", "t-1"}

    async def perform_seek(self) -> None:
        self.seeks += 1
        self._committed_offset.update({tp: o for tp, o in self.broker_committed.items() if o})

    async def seek_wait(self, partitions: dict[str, int]) -> None:
        self.rewound.append(partitions)


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


def test_offsets_acked_behind_a_record_still_in_flight_are_waiting_not_stalled() -> None:
    """A record waiting minutes on a one-slot model server holds back the commit of the records
    after it; the worker must not be restarted for that (it would lose the work in flight)."""
    consumer, exits = _Consumer(), []
    watchdog = _watchdog(consumer, exits)
    slow = SimpleNamespace(tp="t-0", offset=6)
    consumer._unacked_messages = [slow]
    consumer._acked["t-0"] = [7, 8]
    for _ in range(3):
        watchdog.check()
        asyncio.run(asyncio.sleep(0.05))
    assert exits == []
    consumer._unacked_messages = []  # it is done, and the commit does not come: a stall
    watchdog.check()
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


def test_a_partition_that_never_committed_starts_over_after_each_seek() -> None:
    """aiokafka leaves a partition with no committed offset where it was: past records Faust dropped."""
    consumer = _Consumer()
    consumer.broker_committed = {"t-0": 12}  # t-1 never committed
    exact_offset_marks(consumer)
    asyncio.run(consumer.perform_seek())
    assert consumer.rewound == [{"t-1": 0}]
    assert consumer._committed_offset == {"t-0": 12}

    consumer.broker_committed = {"t-0": 12, "t-1": 0}  # committed at 0: aiokafka does not seek it either
    asyncio.run(consumer.perform_seek())
    assert consumer.rewound[-1] == {"t-1": 0}

    consumer.broker_committed = {"t-0": 12, "t-1": 5}
    asyncio.run(consumer.perform_seek())
    assert len(consumer.rewound) == 2  # both partitions were seeked by Faust: nothing to rewind


def test_a_handler_cancelled_before_it_started_frees_its_slot_and_its_successors() -> None:
    """A rebalance can cancel a record's handler before its task first runs: its cleanup must still run.

    Otherwise its slot is lost and every later record of its partition waits for it forever, each
    holding a slot, until the runner has none left and the stage handles nothing at all.
    """
    from arena.config import ArenaSettings
    from arena.llm.core import Caller
    from streams.app import CommitGate, OrderedRunner
    from tests.test_ordered_runner import TOPIC, TP, App, Producer, _event, _stage

    log: list[tuple[str, int, int]] = []
    app = App(Producer(log))

    async def go() -> OrderedRunner:
        runner = OrderedRunner(
            app,  # type: ignore[arg-type]
            _stage({}, []),
            ArenaSettings(),
            CommitGate(),
            None,
            2,
            Caller(),
        )
        await runner.submit(_event(0, 0, log))
        assert runner.cancel({TP(TOPIC, 0)}) == 1  # the same loop step: its task has not started
        app.rebalancing = True  # as during the revocation: what is still submitted is not released
        for offset in range(1, 5):
            await runner.submit(_event(0, offset, log))
        await runner.drain()
        app.rebalancing, app.consumer_generation_id = False, 2  # the next generation's records run
        for offset in range(2):
            await runner.submit(_event(1, offset, log, generation=2))
        await runner.drain()
        return runner

    runner = asyncio.run(asyncio.wait_for(go(), 5))
    assert log == [("send", 1, 0), ("ack", 1, 0), ("send", 1, 1), ("ack", 1, 1)]
    assert runner._slots._value == 2 and not runner._tails and runner.in_flight == 0


def test_the_same_members_get_the_same_partitions_whoever_computes_them() -> None:
    """A group leader restarted under its static id assigns again: it must not move a live replica's share."""
    import faust
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
    from faust.assignor.client_assignment import ClientAssignment, ClientMetadata

    from streams.app import StableAssignor

    app = faust.App("t", PartitionAssignor=StableAssignor, web_enabled=False, canonical_url="http://me:6066")
    assignor = app.assignor
    cluster = SimpleNamespace(partitions_for_topic=lambda topic: {0, 1, 2, 3}, topics=lambda: {"tools.raw"})

    def member(url: str, previous: list[int]) -> Any:
        client = ClientMetadata(
            assignment=ClientAssignment(actives={"tools.raw": previous}, standbys={}),
            url=url,
            changelog_distribution={},
        )
        return ConsumerProtocolMemberMetadata(assignor.version, ["tools.raw"], client.dumps())

    def shares(members: dict[str, Any]) -> dict[str, list[int]]:
        assignment = assignor._perform_assignment(cluster, members)  # type: ignore[attr-defined]
        return {m: sorted(a.assignment[0][1]) for m, a in assignment.items()}

    # Replica r1 led, alone first (all four partitions), then with r0 ...
    first = shares(
        {"id-7": member("http://h-0-s-r1:6066", [0, 1, 2, 3]), "id-3": member("http://h-0-s:6066", [])}
    )
    # ... then r1 was killed and rejoined first, with a new member id and nothing assigned.
    again = shares(
        {"id-1": member("http://h-0-s-r1:6066", []), "id-3": member("http://h-0-s:6066", first["id-3"])}
    )
    assert first["id-3"] == again["id-3"] and first["id-7"] == again["id-1"]
    assert sorted(first["id-3"] + first["id-7"]) == [0, 1, 2, 3] and first["id-3"] and first["id-7"]

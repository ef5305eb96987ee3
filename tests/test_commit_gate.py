"""The commit gate: a commit never lands between an event's sends and its ack."""

from __future__ import annotations

import asyncio

from streams.app import CommitGate


class FakeConsumer:
    """Just the method the gate wraps; records what each commit saw."""

    def __init__(self) -> None:
        self.acked: list[int] = []
        self.snapshots: list[list[int]] = []

    async def force_commit(self, *args: object, **kwargs: object) -> bool:
        self.snapshots.append(list(self.acked))
        await asyncio.sleep(0)  # a commit takes round trips
        return True


def test_commit_waits_for_an_event_in_flight() -> None:
    async def scenario() -> list[list[int]]:
        consumer = FakeConsumer()
        gate = CommitGate()
        gate.install(consumer)
        async with gate.lock:  # an event has sent its outputs but not acked yet
            commit = asyncio.create_task(consumer.force_commit())
            await asyncio.sleep(0.01)
            assert not commit.done(), "the commit ran inside the event's critical section"
            consumer.acked.append(7)
        await commit
        return consumer.snapshots

    assert asyncio.run(scenario()) == [[7]]


def test_install_twice_wraps_once() -> None:
    async def scenario() -> bool:
        consumer = FakeConsumer()
        gate = CommitGate()
        gate.install(consumer)
        gate.install(consumer)  # Faust restarted the agent
        return await asyncio.wait_for(consumer.force_commit(), 1.0)

    assert asyncio.run(scenario())

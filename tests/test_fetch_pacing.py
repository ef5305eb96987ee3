"""Idle consumers do not re-fetch in a tight loop (``streams.fetch_pacing``), the trainer's included.

The embedded broker answers an empty fetch at once instead of holding it for ``fetch_max_wait_ms``;
unpaced, one idle aiokafka consumer sent thousands of fetches a second and took a whole core (the
trainer's ``samples.sft`` source sat idle like that through every GRPO step). Paced, an idle consumer
fetches at most about once per ``MAX_PAUSE_S`` per broker connection once it has idled a second;
until then the pause doubles from ``FIRST_PAUSE_S`` (records end the streak).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.consumer import fetcher

from streams import fetch_pacing
from trainer.samples_source import SampleSource

pytestmark = pytest.mark.integration


async def _fetches_while_idle(source: SampleSource[Any], seconds: float) -> int:
    """Fetch requests the source's consumer sends while it sits at the end of its topic."""
    count = 0
    paced = fetcher.Fetcher._proc_fetch_request

    async def counting(self: Any, assignment: Any, node_id: int, request: Any) -> bool:
        nonlocal count
        count += 1
        got: bool = await paced(self, assignment, node_id, request)
        return got

    fetcher.Fetcher._proc_fetch_request = counting  # type: ignore[method-assign]
    try:
        await asyncio.sleep(seconds)
    finally:
        fetcher.Fetcher._proc_fetch_request = paced  # type: ignore[method-assign]
    return count


def _idle_fetches(broker: str, group: str) -> int:
    """Fetches an idle trainer source sends in 2 s."""

    async def scenario() -> int:
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        # samples.sft exists on the session broker once any stage or the trainer ran; make sure.
        from streams.admin import ensure_topics

        await asyncio.to_thread(ensure_topics, broker)
        source: SampleSource[Any] = SampleSource(broker, "samples.sft", group_id=group)
        try:
            await source.start(producer)  # installs the pacing for the whole process
            assert fetch_pacing._installed
            await source.take(1_000_000, wait_s=1.0)  # read to the end, whatever earlier tests left
            return await _fetches_while_idle(source, 2.0)
        finally:
            await source.stop()
            await producer.stop()

    return asyncio.run(scenario())


def test_an_idle_trainer_source_fetches_at_the_paced_rate(
    broker: str, unique_name: Callable[[str], str]
) -> None:
    fetches = _idle_fetches(broker, unique_name("g"))
    # Idle for a second already (the read to the end): at most ~1 per MAX_PAUSE_S per partition
    # leader; unpaced this was in the thousands, at a steady FIRST_PAUSE_S about 20.
    assert 0 < fetches <= 2.0 / fetch_pacing.MAX_PAUSE_S * 3, fetches


def test_pauses_double_over_an_idle_streak_up_to_the_cap_and_never_outlast_the_wait() -> None:
    pauses = [fetch_pacing.idle_pause(streak, held_s=0.0, max_wait_s=1.5) for streak in range(6)]
    assert pauses == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5, 0.5])
    assert fetch_pacing.idle_pause(10_000, held_s=0.0, max_wait_s=1.5) == 0.5
    # the broker held the request: only the rest of the consumer's fetch_max_wait_ms is slept
    assert fetch_pacing.idle_pause(3, held_s=1.2, max_wait_s=1.5) == pytest.approx(0.3)
    assert fetch_pacing.idle_pause(0, held_s=2.0, max_wait_s=1.5) == 0.0


def test_records_end_the_streak() -> None:
    """A fetch with records resets the fetcher's streak: the next empty one pauses FIRST_PAUSE_S."""
    answers = iter([False, False, False, True, False])
    slept: list[float] = []

    async def original(self: Any, assignment: Any, node_id: int, request: Any) -> bool:
        return next(answers)

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    class FakeFetcher:
        _fetch_max_wait_ms = 1500

    handler = fetch_pacing.paced(original, sleep=sleep)
    fake = FakeFetcher()

    async def run() -> list[bool]:
        return [await handler(fake, None, 0, None) for _ in range(5)]

    assert asyncio.run(run()) == [False, False, False, True, False]
    assert slept == pytest.approx([0.1, 0.2, 0.4, 0.1], abs=0.01)

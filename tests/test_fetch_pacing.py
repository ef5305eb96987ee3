"""Idle consumers do not re-fetch in a tight loop (``streams.fetch_pacing``), the trainer's included.

The embedded broker answers an empty fetch at once instead of holding it for ``fetch_max_wait_ms``;
unpaced, one idle aiokafka consumer sent thousands of fetches a second and took a whole core (the
trainer's ``samples.sft`` source sat idle like that through every GRPO step). Paced, an idle consumer
fetches at most about once per ``MAX_PAUSE_S`` per broker connection.
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
    # At most ~1 per 0.1 s per partition leader; unpaced this was in the thousands.
    assert 0 < fetches <= 2.0 / fetch_pacing.MAX_PAUSE_S * 3, fetches


def test_a_process_may_pace_its_idle_fetches_slower(broker: str, unique_name: Callable[[str], str]) -> None:
    """The lake sink's setting (``set_max_pause``): its idle fetches come at most every 0.5 s."""
    fetch_pacing.set_max_pause(0.5)
    try:
        fetches = _idle_fetches(broker, unique_name("g"))
    finally:
        fetch_pacing.set_max_pause(fetch_pacing.MAX_PAUSE_S)
    assert 0 < fetches <= 2.0 / 0.5 * 3, fetches

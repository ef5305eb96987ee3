"""Client-side long polling for brokers that answer empty fetches at once.

Kafka holds an empty Fetch for ``fetch.max.wait.ms`` before answering; the
embedded noida broker answers immediately, so every idle aiokafka consumer
(Faust's included) re-polls in a tight loop and burns most of a core. With
nine workers on two cores that starves the stages doing real work.

``install`` wraps aiokafka's per-node fetch task: when a fetch brought no
records and came back sooner than ``seconds``, the task sleeps out the rest,
so no new fetch goes to that node meanwhile. Against a real broker the fetch
already took ``fetch.max.wait.ms`` (500 ms by default) and nothing changes.
Records arriving while a consumer is idle are picked up at most ``seconds``
late.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.consumer.fetcher import Fetcher

_MARK = "_arena_idle_backoff"


def install(seconds: float) -> None:
    """Patch aiokafka's fetcher once per process (idempotent)."""
    original = Fetcher._proc_fetch_request
    if seconds <= 0 or getattr(original, _MARK, False):
        return

    async def proc_fetch_request(self: Fetcher, assignment: Any, node_id: int, request: Any) -> bool:
        loop = asyncio.get_running_loop()
        started = loop.time()
        woke: bool = await original(self, assignment, node_id, request)
        left = seconds - (loop.time() - started)
        if not woke and left > 0:
            await asyncio.sleep(left)
        return woke

    setattr(proc_fetch_request, _MARK, True)
    Fetcher._proc_fetch_request = proc_fetch_request  # type: ignore[method-assign]

"""Pace empty fetches the way a Kafka broker's ``fetch.max.wait.ms`` would.

A fetch that finds no new records should be held by the broker for up to
``fetch_max_wait_ms``; the embedded broker answers at once, so every idle
aiokafka consumer re-fetches in a tight loop (measured: one idle consumer
used 85% of a core, and 14 idle stage workers saturate 2 cores). After an
empty answer that came back sooner than the wait, this sleeps out the rest:
``FIRST_PAUSE_S`` after the first empty answer, twice as long after each
further one in a row, at most ``MAX_PAUSE_S``. A stage whose records flow sees
the next one within 0.1 s; one idle for a second or more looks twice a second
(measured: 20 idle stage workers used 0.29 of a core at a steady 0.1 s, 0.16 at
0.5 s). A real broker holds the request itself, so there the pause is zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka.consumer import fetcher

log = logging.getLogger("arena.fetch")

FIRST_PAUSE_S = 0.1
"""The pause after the first empty answer of a streak: how late a stage whose records flow sees the
next one."""
MAX_PAUSE_S = 0.5
"""The longest pause: how late an idle stage sees the record that ends its idleness."""
_installed = False


def idle_pause(streak: int, held_s: float, max_wait_s: float) -> float:
    """Seconds to pause after the ``streak``-th empty answer in a row (0: the first), which the
    broker held ``held_s`` of the consumer's ``fetch_max_wait_ms`` (``max_wait_s``)."""
    return max(0.0, min(FIRST_PAUSE_S * 2 ** min(streak, 16), MAX_PAUSE_S, max_wait_s - held_s))


def paced(
    original: Callable[[Any, Any, int, Any], Awaitable[bool]],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Callable[[Any, Any, int, Any], Awaitable[bool]]:
    """aiokafka's per-request fetch handler ``original``, pausing after each empty answer
    (``idle_pause``); the streak is counted per fetcher and ends with an answer that has records."""

    async def handler(self: Any, assignment: Any, node_id: int, request: Any) -> bool:
        started = time.monotonic()
        got_records: bool = await original(self, assignment, node_id, request)
        if got_records:
            self._arena_empty_streak = 0
            return True
        streak = getattr(self, "_arena_empty_streak", 0)
        self._arena_empty_streak = streak + 1
        pause = idle_pause(streak, time.monotonic() - started, self._fetch_max_wait_ms / 1000)
        if pause > 0:
            try:
                await sleep(pause)
            except asyncio.CancelledError:  # consumer closing or partition revoked
                return False
        return False

    return handler


def install() -> None:
    """Wrap aiokafka's per-request fetch handler once per process (idempotent)."""
    global _installed
    original = getattr(fetcher.Fetcher, "_proc_fetch_request", None)
    if _installed or original is None:
        if original is None:
            log.warning("aiokafka has no Fetcher._proc_fetch_request; idle fetches are not paced")
        return
    fetcher.Fetcher._proc_fetch_request = paced(original)
    _installed = True

"""Pace empty fetches the way a Kafka broker's ``fetch.max.wait.ms`` would.

A fetch that finds no new records should be held by the broker for up to
``fetch_max_wait_ms``; the embedded broker answers at once, so every idle
aiokafka consumer re-fetches in a tight loop (measured: one idle consumer
used 85% of a core, and 14 idle stage workers saturate 2 cores). After an
empty answer that came back sooner than the wait, this sleeps out the rest,
at most ``MAX_PAUSE_S`` so new records are still picked up promptly. A real
broker holds the request itself, so there the pause is zero.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from aiokafka.consumer import fetcher

log = logging.getLogger("arena.fetch")

MAX_PAUSE_S = 0.1
"""The longest pause after an empty fetch: how late a stage may see a record that arrives while it
idles. A process that may see records later sets its own (``set_max_pause``)."""
_installed = False
_max_pause_s = MAX_PAUSE_S


def set_max_pause(seconds: float) -> None:
    """Pause this process's idle fetches for up to ``seconds`` (the lake sink: it holds records for a
    second before it writes them anyway, and its fetches, over every topic's partitions, cost about
    three times a stage's)."""
    global _max_pause_s
    _max_pause_s = seconds


def install() -> None:
    """Wrap aiokafka's per-request fetch handler once per process (idempotent)."""
    global _installed
    original = getattr(fetcher.Fetcher, "_proc_fetch_request", None)
    if _installed or original is None:
        if original is None:
            log.warning("aiokafka has no Fetcher._proc_fetch_request; idle fetches are not paced")
        return

    async def paced(self: Any, assignment: Any, node_id: int, request: Any) -> bool:
        started = time.monotonic()
        got_records: bool = await original(self, assignment, node_id, request)
        if not got_records:
            held = time.monotonic() - started
            pause = min(_max_pause_s, self._fetch_max_wait_ms / 1000 - held)
            if pause > 0:
                try:
                    await asyncio.sleep(pause)
                except asyncio.CancelledError:  # consumer closing or partition revoked
                    return False
        return got_records

    fetcher.Fetcher._proc_fetch_request = paced
    _installed = True

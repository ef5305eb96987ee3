"""Concurrency inside one record: a handler's independent LLM calls run at once.

The runtime handles several records of a stage concurrently; a record that needs many
independent calls (the candidate walks of a server, the augmentations and scores of its tasks)
also runs them concurrently, so that one record keeps more than one call in flight. Results
come back in input order, so a handler emits in the order its sequential loop did.

Calls that depend on an earlier answer (the turns of one rollout) stay sequential. The LLM
client has its own admission control; ``LIMIT`` only keeps a very large record (hundreds of
walks or tasks) from starting all of its work at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

LIMIT = 64
"""Items of one fan-out running at once (1: one after another, as a plain loop)."""


async def map_ordered(
    fn: Callable[[T], Awaitable[R]], items: Iterable[T], limit: int | None = None
) -> list[R]:
    """``[await fn(item) for item in items]``, with up to ``limit`` (default ``LIMIT``) items running at once.

    Each item isolates its own expected failures (a stage returns a dead letter per item, so one
    bad answer does not cost the record's other outputs). An exception that escapes an item ends
    the record as it would in a loop: the other items are cancelled and awaited, and it is raised.
    Cancelling the caller cancels every item.
    """
    gate = asyncio.Semaphore(limit if limit is not None else LIMIT)

    async def bounded(item: T) -> R:
        async with gate:
            return await fn(item)  # the coroutine is made only once it may run

    return await gather_all(bounded(item) for item in items)


async def gather_all(aws: Iterable[Awaitable[R]]) -> list[R]:
    """All results in order; on the first exception the others are cancelled and awaited, then it is raised.

    No orphaned work (a sandbox run, an LLM call) outlives the record that asked for it.
    """
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise

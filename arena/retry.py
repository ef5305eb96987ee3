"""Trying again what a library says may succeed on another try: one policy, bounded and jittered.

Two libraries say so. LanceDB refuses a commit that lost a race with another writer of the same
table version: ``Retryable commit conflict for version N: ... Please retry.``, or ``Too many
concurrent writers`` once its own retries of a merge ran out (plain ``RuntimeError``/``OSError``
messages, so the words are matched). Kafka clients (kafka-python, aiokafka) set ``retriable = True``
on the error classes a later try may not meet: a leader election, a request timeout, a connection
lost. Any other error is a bug or bad input; trying it again would only delay its dead letter.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("arena.retry")

T = TypeVar("T")

LANCE_RETRYABLE = ("Retryable commit conflict", "Too many concurrent writ")
"""Words of LanceDB's errors that a retry on the table's latest version can get past."""


class RetryPolicy(BaseModel):
    """How often and how patiently a retryable failure is tried again."""

    model_config = ConfigDict(frozen=True)

    attempts: Annotated[int, Field(ge=1, description="Tries in all, the first included.")] = 5
    base_s: Annotated[
        float, Field(ge=0, description="Backoff cap before the first retry; doubles per retry.")
    ] = 0.1
    max_s: Annotated[float, Field(ge=0, description="Largest backoff cap.")] = 2.0
    seed: Annotated[
        int | None, Field(description="Seeds the jitter (the same waits every run); None draws fresh ones.")
    ] = None

    def delays(self) -> list[float]:
        """The wait before each retry: half its cap plus a random part of the other half (``equal
        jitter``), so writers that collided once do not collide again in step."""
        rng = random.Random(self.seed)
        caps = [min(self.max_s, self.base_s * 2**n) for n in range(self.attempts - 1)]
        return [cap / 2 + rng.uniform(0, cap / 2) for cap in caps]


def is_retryable(exc: BaseException) -> bool:
    """Whether the library that raised ``exc`` marks it as worth another try (see the module doc)."""
    if getattr(exc, "retriable", False) is True:
        return True
    return isinstance(exc, RuntimeError | OSError) and any(word in str(exc) for word in LANCE_RETRYABLE)


def call_with_retry(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    what: str,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """``fn()``, tried again after a retryable error up to ``policy.attempts`` tries in all.

    ``on_retry`` runs before each new try (reopen a table at its latest version). A non-retryable
    error, or the last try's, is raised as it is.
    """
    delays = policy.delays()
    for attempt in range(policy.attempts):
        try:
            return fn()
        except Exception as exc:
            if attempt == policy.attempts - 1 or not is_retryable(exc):
                raise
            log.warning(
                "%s: %s; try %d of %d in %.2f s", what, exc, attempt + 2, policy.attempts, delays[attempt]
            )
            time.sleep(delays[attempt])
            if on_retry is not None:
                on_retry(exc)
    raise AssertionError("unreachable: the last try returns or raises")

"""How many requests an LLM endpoint really serves at once, learned from how long they take.

``ARENA_LLM_CONCURRENCY`` is a ceiling, not a fact about the server: vLLM batches 256 sequences,
a llama.cpp server on a laptop decodes one. Requests over a server's real capacity wait *inside*
the server, where Arena cannot order them by stage priority, and a request at the back of a long
server-side queue runs into its timeout through no fault of its record. ``CapacityLearner`` keeps
that queue in the admission instead, where waiting costs nothing.

The rule (a delay-gradient limiter in the manner of TCP Vegas and Netflix's concurrency-limits,
adapted to LLM calls, whose service time grows with the tokens they ask for):

* A served request's *cost* is ``completion_tokens + prompt_tokens / PREFILL_RATIO`` (prefill is
  far cheaper per token than decoding) and its *pace* is ``seconds / cost``. ``base`` is the
  smallest pace seen: the server's pace with no queue in front of the request.
* ``ratio = pace / base`` is how many requests' worth of work the server did while this one was
  in flight. On a server with ``k`` slots and ``n > k`` requests in flight it grows like ``n / k``;
  while ``n <= k`` it stays near 1 (batching slows each sequence a little).
* A request whose ratio is over ``TOLERANCE`` *and* that took longer than ``slow_s`` (queueing of
  fast requests is harmless) cuts the limit to ``limit * TOLERANCE / ratio`` (at most by half), as
  does a timeout; only requests admitted after the previous cut may cut again, so one overfull
  burst cuts once, not once per request in it.
* A request served within tolerance while the limit was in use raises the limit, up to the
  ceiling: by one until the first cut (slow start: the limit doubles per round trip), by
  ``1 / limit`` after it (about one per round trip, so the limit cannot outrun the latency signal,
  which arrives a round trip late).
* The limit starts at ``START`` (at most the ceiling), so a one-slot server never receives a first
  burst of 64 requests that would time out behind each other.

At the fixed point on a one-slot server the limit oscillates between 2 and 3: the server always
has the next request waiting, so it never idles, and nothing waits there long enough to time out.
Pure: no clock and no I/O; the admission passes the times in.
"""

from __future__ import annotations

from dataclasses import dataclass

START = 4
"""The limit before anything has been learned (at most the ceiling)."""
TOLERANCE = 2.0
"""Pace up to this multiple of the base counts as no queue."""
PREFILL_RATIO = 8.0
"""Prompt tokens a server processes in the time it decodes one completion token (roughly)."""


@dataclass
class Outcome:
    """How a request that held an admission slot ended: what capacity learning reads."""

    cost: float = 0.0
    """Work the request asked of the server (see ``cost_of``); 0 when unknown (not learned from)."""
    timed_out: bool = False
    """The request ran into its timeout (the strongest sign of a queue at the server)."""

    def served(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Record the usage of a served request."""
        self.cost = cost_of(prompt_tokens, completion_tokens)


def cost_of(prompt_tokens: int, completion_tokens: int) -> float:
    """``completion_tokens + prompt_tokens / PREFILL_RATIO``, at least 1."""
    return max(1.0, completion_tokens + prompt_tokens / PREFILL_RATIO)


class CapacityLearner:
    """The learned in-flight limit of one endpoint, between 1 and ``ceiling``."""

    def __init__(self, ceiling: int, slow_s: float) -> None:
        if ceiling < 1:
            raise ValueError("ceiling must be at least 1")
        self.ceiling = ceiling
        self.slow_s = slow_s
        """Requests faster than this never cut the limit (a queue costs them little)."""
        self.limit = float(min(START, ceiling))
        self.base: float | None = None
        """Smallest pace (seconds per unit of cost) seen."""
        self._cut_at = float("-inf")
        """When the limit was last cut: requests admitted before then cannot cut it again."""
        self.cuts = 0
        self.observed = 0

    @property
    def allowed(self) -> int:
        """Requests that may be in flight now."""
        return max(1, min(self.ceiling, int(self.limit)))

    def raise_ceiling(self, ceiling: int) -> None:
        """A larger ceiling (another process declared more); the limit stays as learned."""
        self.ceiling = max(self.ceiling, ceiling)

    def observe(self, outcome: Outcome, *, admitted_at: float, now: float, in_flight: int) -> None:
        """Learn from one request admitted at ``admitted_at`` and released at ``now``.

        ``in_flight`` counts the requests in flight when it was released, itself included.
        """
        if outcome.timed_out:
            self._cut(0.5, admitted_at, now)
            return
        if outcome.cost <= 0:
            return  # nothing known about the work it asked for
        self.observed += 1
        seconds = max(now - admitted_at, 1e-6)
        pace = seconds / outcome.cost
        if self.base is None or pace < self.base:
            self.base = pace
        ratio = pace / self.base
        if ratio > TOLERANCE:
            if seconds > self.slow_s:
                self._cut(TOLERANCE / ratio, admitted_at, now)
        elif in_flight >= self.allowed:  # the limit was in use and the server kept pace
            step = 1.0 if self.cuts == 0 else 1.0 / self.limit
            self.limit = min(float(self.ceiling), self.limit + step)

    def _cut(self, factor: float, admitted_at: float, now: float) -> None:
        if admitted_at < self._cut_at:
            return  # admitted under the old limit: that limit has already been cut
        self.limit = max(1.0, self.limit * max(factor, 0.5))
        self._cut_at = now
        self.cuts += 1

"""Capacity learning (``arena.llm.capacity``) against simulated servers with k slots.

A discrete-event simulation: the scheduler admits requests, the server serves ``k`` at a time in
arrival order (the rest wait in its own queue, as llama.cpp's and vLLM's do), each for ``L`` s.
"""

from __future__ import annotations

import heapq

import pytest

from arena.llm.admission import Scheduler
from arena.llm.capacity import START, TOLERANCE, CapacityLearner, Outcome, cost_of


def _serve(slots: int, ceiling: int = 32, requests: int = 200, seconds: float = 1.0) -> dict[str, float]:
    scheduler = Scheduler(ceiling)
    scheduler.learn(slow_s=seconds / 2)
    for n in range(requests):
        scheduler.submit(n, "stage", 0)
    now, admitted_at, server_queue, busy = 0.0, {}, [], []
    worst, limits, peak = 0.0, [], 0

    def admit_and_start() -> None:
        nonlocal peak
        for ticket in scheduler.grant(now):
            admitted_at[ticket] = now
            server_queue.append(ticket)
        peak = max(peak, scheduler.in_flight)
        while server_queue and len(busy) < slots:
            heapq.heappush(busy, (now + seconds, server_queue.pop(0)))

    admit_and_start()
    while busy:
        now, ticket = heapq.heappop(busy)
        worst = max(worst, now - admitted_at[ticket])
        scheduler.drop(ticket, Outcome(cost=100), now)
        limits.append(scheduler.limit)
        admit_and_start()
    tail = limits[len(limits) // 2 :]
    return {"wall": now, "worst": worst, "low": min(tail), "high": max(tail), "peak": peak}


def test_a_one_slot_server_stays_busy_behind_a_short_queue() -> None:
    run = _serve(slots=1)
    assert run["wall"] == pytest.approx(200.0)  # never idle: as fast as the server can go
    assert 1 <= run["low"] and run["high"] <= 5  # the limit hovers at one slot plus a short queue
    assert run["worst"] <= 6.0  # no request waits long inside the server (with 32 at once: 32 s)


@pytest.mark.parametrize("slots", [2, 8])
def test_a_few_slots_are_used_without_a_long_queue(slots: int) -> None:
    run = _serve(slots=slots)
    assert run["wall"] <= 200 / slots * 1.1
    assert slots <= run["low"] and run["high"] <= 3 * slots + 2
    assert run["worst"] <= 6.0  # slow start overshoots once; 32 at once would wait 32 / slots s


def test_a_wide_server_gets_the_whole_ceiling_after_slow_start() -> None:
    run = _serve(slots=256, ceiling=32)
    assert run["low"] == run["high"] == run["peak"] == 32
    assert run["wall"] <= 200 / 32 + 3  # slow start costs about three round trips (4 -> 8 -> 16 -> 32)


def test_the_rule_by_hand() -> None:
    learner = CapacityLearner(ceiling=10, slow_s=1.0)
    assert learner.allowed == START == 4
    learner.observe(Outcome(cost=100), admitted_at=0, now=2, in_flight=4)  # pace 0.02 = base
    assert learner.base == 0.02 and learner.allowed == 5  # in use and in pace: +1
    learner.observe(Outcome(cost=100), admitted_at=0, now=4, in_flight=2)  # ratio 2: tolerated
    assert learner.allowed == 5  # not in use: no growth either
    learner.observe(Outcome(cost=100), admitted_at=1, now=9, in_flight=5)  # ratio 4.5 > 2
    assert learner.limit == pytest.approx(5 * max(TOLERANCE / 4.5, 0.5))  # halved at most
    learner.observe(Outcome(cost=100), admitted_at=2, now=12, in_flight=3)  # admitted before the cut
    assert learner.cuts == 1  # one overfull burst cuts once
    learner.observe(Outcome(cost=0.5), admitted_at=20, now=20.9, in_flight=3)  # fast: a queue is harmless
    assert learner.cuts == 1
    learner.observe(Outcome(timed_out=True), admitted_at=13, now=30, in_flight=2)
    assert learner.cuts == 2 and learner.allowed == 1  # 2.5 halved, floored at 1
    learner.observe(Outcome(), admitted_at=31, now=90, in_flight=1)  # cost unknown: not learned from
    assert learner.observed == 5


def test_cost_weighs_prefill_below_decoding() -> None:
    assert cost_of(prompt_tokens=800, completion_tokens=100) == 200.0
    assert cost_of(prompt_tokens=0, completion_tokens=0) == 1.0

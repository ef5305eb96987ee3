"""LLM admission per endpoint: the scheduling rule, one process, and the coordinator shared by processes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.admission_host import AdmissionHost
from app.registry import STAGES, stage_priorities
from arena.config import ArenaSettings
from arena.llm.admission import (
    AdmissionServer,
    LocalAdmission,
    Scheduler,
    SharedAdmission,
    admission_for,
    allocate,
    read_stats,
    send_lag,
    socket_path,
    weight,
)
from arena.llm.backends import make_backend
from arena.llm.backends.openai import OpenAIBackend
from arena.llm.core import CALLER, Caller
from arena.llm.gateway import Gateway
from tests.fixtures.openai_server import ASK, Question, ServerScript, start_openai_server

ROOT = Path(__file__).resolve().parents[1]
ENDPOINT = "http://llm.test/v1 model=m"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A temp folder with a short path (a Unix socket path must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="adm-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# -- the rule, by hand ----------------------------------------------------------


def test_weight_grows_with_priority_and_at_most_doubles_with_lag() -> None:
    assert weight(0, 0) == 1.0
    assert weight(3, 0) == 4.0
    assert weight(0, 100) == 1.5  # lag LAG_HALF: x1.5
    assert weight(2, 300) == 3 * 1.75
    assert 1.99 < weight(0, 10**9) < 2.0


def test_saturated_the_stage_nearer_the_output_gets_the_larger_share() -> None:
    # capacity 4, A p=0 (w=1), B p=3 (w=4), equal lag, both with more waiting than capacity:
    # B (tie 0/1 vs 0/4, larger weight), A (0 < 1/4), B (1/4 < 1/1), B (2/4 < 1/1) -> A 1, B 3.
    assert allocate(4, [("A", 0, 0, 10), ("B", 3, 0, 10)]) == {"A": 1, "B": 3}
    scheduler = Scheduler(4)
    for n in range(10):
        scheduler.submit(("A", n), "A", 0)
        scheduler.submit(("B", n), "B", 3)
    assert scheduler.grant() == [("B", 0), ("A", 0), ("B", 1), ("B", 2)]  # FIFO within a stage
    assert scheduler.grant() == []  # saturated
    assert (scheduler.in_flight, scheduler.waiting) == (4, 16)


def test_a_stage_with_nothing_waiting_gets_nothing_reserved() -> None:
    assert allocate(4, [("A", 0, 0, 10), ("B", 3, 0, 10), ("C", 9, 500, 0)]) == {"A": 1, "B": 3, "C": 0}
    assert allocate(4, [("A", 0, 0, 10), ("C", 9, 0, 0)]) == {"A": 4, "C": 0}  # alone: all of it
    assert allocate(4, [("A", 0, 0, 2), ("B", 3, 0, 1)]) == {"A": 2, "B": 1}  # under capacity: all admitted


def test_lag_raises_a_stage_share() -> None:
    assert allocate(8, [("A", 0, 0, 10), ("B", 0, 0, 10)]) == {"A": 4, "B": 4}
    # A lag 100 -> w 1.5, B w 1. Grants: A (tie, larger w), B (0), A (.67<1), B (1.33>1), A (1.33<2),
    # A (2=2, larger w), B (2.67>2), A (2.67<3) -> A 5, B 3.
    assert allocate(8, [("A", 0, 100, 10), ("B", 0, 0, 10)]) == {"A": 5, "B": 3}
    # lag at most doubles the weight: a p=0 stage with a huge backlog stays below a p=2 one
    assert allocate(8, [("A", 0, 10**6, 10), ("C", 2, 0, 10)]) == {"A": 3, "C": 5}


def test_no_stage_is_starved() -> None:
    # capacity 2, B weight 11 against A weight 1: A still always holds one slot, because a waiting
    # stage with nothing in flight has the smallest in_flight/weight (0) and takes the next free slot.
    scheduler = Scheduler(2)
    for n in range(50):
        scheduler.submit(("A", n), "A", 0)
        scheduler.submit(("B", n), "B", 10)
    held = scheduler.grant()
    assert held == [("B", 0), ("A", 0)]
    rng = random.Random(0)
    for _ in range(40):
        ticket = held.pop(rng.randrange(len(held)))
        assert scheduler.drop(ticket)
        held += scheduler.grant()
        stages = scheduler.stats().stages
        assert stages["A"].in_flight == 1 and stages["B"].in_flight == 1


def test_withdrawn_requests_release_and_declared_capacity() -> None:
    scheduler = Scheduler(1)
    for n in range(3):
        scheduler.submit(n, "A")
    assert scheduler.grant() == [0]
    assert scheduler.drop(1)  # withdrawn while waiting
    assert not scheduler.drop(1)  # unknown now
    assert scheduler.drop(0) and scheduler.grant() == [2]
    scheduler.declare(3)
    scheduler.declare(2)  # the largest declared wins
    assert scheduler.capacity == 3
    with pytest.raises(ValueError, match="already submitted"):
        scheduler.submit(2, "A")


def test_busy_time_counts_spans_with_a_request_in_flight_once() -> None:
    clock = [0.0]
    scheduler = Scheduler(2, clock=lambda: clock[0])
    scheduler.submit("a", "A")
    scheduler.submit("b", "B")
    clock[0] = 1.0
    assert scheduler.grant() == ["a", "b"]  # busy from 1.0
    clock[0] = 3.0
    scheduler.drop("a")  # "b" still in flight: still busy
    clock[0] = 4.0
    scheduler.drop("b")  # idle from 4.0: 3 s so far
    clock[0] = 10.0
    scheduler.submit("c", "A")
    assert scheduler.busy_s == 3.0  # waiting is not busy
    scheduler.grant()
    clock[0] = 12.5
    assert scheduler.stats().busy_s == 5.5  # the open span counts
    scheduler.drop("c")
    clock[0] = 20.0
    assert scheduler.busy_s == 5.5


def test_stage_priorities_follow_the_pipeline() -> None:
    priorities = stage_priorities()
    assert set(priorities) == {stage.name for stage in STAGES}
    assert priorities["samples-sft"] > priorities["chains"]
    assert priorities["tools-servers"] == priorities["qa-traces"] == priorities["eigen-intents"] == 0
    assert priorities["samples-sft"] == 5  # tools-servers, chains, tasks-from-chains, trajectories, scored
    by_name = {stage.name: stage for stage in STAGES}
    for upstream in STAGES:
        for downstream in STAGES:
            if downstream.input in upstream.outputs and upstream is not downstream:
                assert priorities[upstream.name] < priorities[downstream.name], (
                    upstream.name,
                    downstream.name,
                )
    assert by_name["samples-sft"].input == "trajectories.scored"


# -- one process ---------------------------------------------------------------


def test_local_admission_never_exceeds_capacity() -> None:
    async def run() -> LocalAdmission:
        admission = LocalAdmission(5)
        state = {"now": 0, "max": 0}

        async def one(n: int) -> None:
            CALLER.set(Caller("early" if n % 2 else "late", 0 if n % 2 else 4))
            async with admission.slot(ENDPOINT):
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
                await asyncio.sleep(random.random() * 0.005)
                state["now"] -= 1

        await asyncio.gather(*(one(n) for n in range(200)))
        assert state["max"] == 5  # reached, never exceeded
        return admission

    stats = asyncio.run(run()).stats().endpoints[ENDPOINT]
    assert (stats.capacity, stats.max_in_flight, stats.granted, stats.in_flight, stats.waiting) == (
        5,
        5,
        200,
        0,
        0,
    )
    assert stats.stages["early"].granted == stats.stages["late"].granted == 100
    assert stats.stages["late"].priority == 4


def test_cancelled_waiters_leak_no_slot_even_when_granted_first() -> None:
    async def run() -> None:
        admission = LocalAdmission(1)
        release = await admission.acquire(ENDPOINT)
        first = asyncio.create_task(admission.acquire(ENDPOINT))
        second = asyncio.create_task(admission.acquire(ENDPOINT))
        quitter = asyncio.create_task(admission.acquire(ENDPOINT))
        await asyncio.sleep(0)
        quitter.cancel()  # withdrawn while waiting
        await asyncio.sleep(0)
        release()  # grants `first` at once...
        first.cancel()  # ...which is cancelled before it runs: its slot must pass on
        with pytest.raises(asyncio.CancelledError):
            await first
        with pytest.raises(asyncio.CancelledError):
            await quitter
        (await asyncio.wait_for(second, 2))()
        stats = admission.stats().endpoints[ENDPOINT]
        assert (stats.in_flight, stats.waiting) == (0, 0)

    asyncio.run(run())


# -- the coordinator -----------------------------------------------------------

CHILD = """
import asyncio, json, sys
from arena.llm.admission import SharedAdmission
from arena.llm.core import CALLER, Caller

path, endpoint, stage, priority, count, hold_s, capacity = sys.argv[1:]

async def main() -> None:
    admission = SharedAdmission(path, int(capacity))
    CALLER.set(Caller(stage, int(priority)))
    if hold_s == "forever":
        for _ in range(int(count)):
            await admission.acquire(endpoint)
        print(json.dumps({"held": int(count), "connected": admission.connected}), flush=True)
        await asyncio.sleep(3600)
    state = {"now": 0, "max": 0}

    async def one() -> None:
        async with admission.slot(endpoint):
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
            await asyncio.sleep(float(hold_s))
            state["now"] -= 1

    await asyncio.gather(*(one() for _ in range(int(count))))
    print(json.dumps({"max": state["max"], "connected": admission.connected}), flush=True)

asyncio.run(main())
"""


async def _child(
    path: Path, stage: str, priority: int, count: int, hold: str, capacity: int
) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        str(path),
        ENDPOINT,
        stage,
        str(priority),
        str(count),
        hold,
        str(capacity),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )


def test_two_processes_share_one_endpoint_budget(short_dir: Path) -> None:
    path = short_dir / "run" / "admission.sock"

    async def run() -> None:
        server = AdmissionServer(path)
        await server.start()
        try:
            children = [
                await _child(path, "early", 0, 50, "0.01", 4),
                await _child(path, "late", 3, 50, "0.01", 4),
            ]
            for child in children:
                out, _ = await asyncio.wait_for(child.communicate(), 60)
                assert child.returncode == 0
                report = json.loads(out)
                assert report["connected"] and report["max"] <= 4
            stats = server.stats().endpoints[ENDPOINT]
            assert stats.capacity == 4
            assert 1 <= stats.max_in_flight <= 4  # never more than capacity across both processes
            assert (stats.granted, stats.in_flight, stats.waiting) == (100, 0, 0)
            assert stats.stages["early"].granted == stats.stages["late"].granted == 50
            assert stats.stages["late"].priority == 3
            # the same figures, read as the CLI would
            read = await asyncio.to_thread(read_stats, path)
            assert read is not None and read.endpoints[ENDPOINT].granted == 100
        finally:
            await server.close()
        assert not path.exists()
        assert await asyncio.to_thread(read_stats, path) is None

    asyncio.run(run())


def test_a_killed_client_frees_its_slots_at_once(short_dir: Path) -> None:
    path = short_dir / "admission.sock"

    async def run() -> None:
        server = AdmissionServer(path)
        await server.start()
        child = await _child(path, "doomed", 1, 3, "forever", 3)
        try:
            assert child.stdout is not None
            line = await asyncio.wait_for(child.stdout.readline(), 60)
            assert json.loads(line) == {"held": 3, "connected": True}
            assert server.stats().endpoints[ENDPOINT].in_flight == 3
            client = SharedAdmission(path, 3)
            waiting = asyncio.create_task(client.acquire(ENDPOINT))
            await asyncio.sleep(0.2)
            assert not waiting.done() and server.stats().endpoints[ENDPOINT].waiting == 1
            os.kill(child.pid, signal.SIGKILL)
            await child.wait()
            release = await asyncio.wait_for(waiting, 5)
            stats = server.stats()
            assert stats.endpoints[ENDPOINT].in_flight == 1 and stats.clients == 1
            assert stats.endpoints[ENDPOINT].stages["doomed"].in_flight == 0
            release()
            await asyncio.sleep(0.05)
            assert server.stats().endpoints[ENDPOINT].in_flight == 0
        finally:
            if child.returncode is None:
                child.kill()
                await child.wait()
            await server.close()

    asyncio.run(run())


def test_cancelled_shared_acquires_leak_no_slot(short_dir: Path) -> None:
    path = short_dir / "admission.sock"

    async def run() -> None:
        server = AdmissionServer(path)
        await server.start()
        client = SharedAdmission(path, 3)
        rng = random.Random(1)

        async def one() -> None:
            async with client.slot(ENDPOINT):
                await asyncio.sleep(rng.random() * 0.01)

        tasks = [asyncio.create_task(one()) for _ in range(150)]
        for task in tasks[::2]:
            await asyncio.sleep(rng.random() * 0.002)
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(r is None or isinstance(r, asyncio.CancelledError) for r in results)
        assert client.connected
        for _ in range(50):  # the last releases are on their way
            stats = server.stats().endpoints[ENDPOINT]
            if stats.in_flight == 0:
                break
            await asyncio.sleep(0.02)
        assert (stats.in_flight, stats.waiting) == (0, 0) and stats.max_in_flight <= 3
        assert 75 <= stats.granted <= 150
        await server.close()

    asyncio.run(run())


def test_a_missing_coordinator_falls_back_then_reconnects(
    short_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = short_dir / "admission.sock"

    async def use(client: SharedAdmission, count: int) -> int:
        state = {"now": 0, "max": 0}

        async def one() -> None:
            async with client.slot(ENDPOINT):
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
                await asyncio.sleep(0.002)
                state["now"] -= 1

        await asyncio.gather(*(one() for _ in range(count)))
        return state["max"]

    async def run() -> None:
        client = SharedAdmission(path, 2, retry_s=0.1)
        assert await use(client, 20) == 2  # local: still bounded
        assert not client.connected
        assert client.local.stats().endpoints[ENDPOINT].granted == 20
        server = AdmissionServer(path)
        await server.start()
        await asyncio.sleep(0.15)
        assert await use(client, 10) <= 2
        assert client.connected
        assert server.stats().endpoints[ENDPOINT].granted == 10
        # the coordinator goes away while one request holds a slot and another waits
        release = await client.acquire(ENDPOINT)
        waiting = asyncio.create_task(client.acquire(ENDPOINT))
        waiting2 = asyncio.create_task(client.acquire(ENDPOINT))
        await asyncio.sleep(0.05)
        await server.close()
        (await asyncio.wait_for(waiting, 5))()  # admitted locally instead
        (await asyncio.wait_for(waiting2, 5))()
        release()  # nothing to free on a dead connection: no error
        assert not client.connected

    with caplog.at_level(logging.INFO, logger="arena.llm.admission"):
        asyncio.run(run())
    fell_back = [r for r in caplog.records if "not reachable" in r.getMessage()]
    assert len(fell_back) == 2  # once at the start, once when the coordinator went away
    assert any("reachable again" in r.getMessage() for r in caplog.records)


def test_lag_updates_reach_the_weights(short_dir: Path) -> None:
    path = short_dir / "admission.sock"

    async def run() -> None:
        server = AdmissionServer(path)
        await server.start()
        client = SharedAdmission(path, 2)
        CALLER.set(Caller("chains", 1))
        (await client.acquire(ENDPOINT))()
        assert await asyncio.to_thread(send_lag, path, {"chains": 100})
        for _ in range(50):
            if server.lag.get("chains") == 100:
                break
            await asyncio.sleep(0.01)
        stats = await client.stats()
        assert stats is not None
        stage = stats.endpoints[ENDPOINT].stages["chains"]
        assert (stage.lag, stage.weight, stage.granted) == (100, 3.0, 1)  # (1 + 1) * 1.5
        await server.close()

    asyncio.run(run())


def test_one_host_per_home_and_a_standby_takes_over(short_dir: Path) -> None:
    settings = ArenaSettings(home=short_dir)
    first = AdmissionHost(settings, None, poll_s=0.1).start()
    second = AdmissionHost(settings, None, poll_s=0.1).start()
    try:
        assert first.hosting and not second.hosting
        assert read_stats(socket_path(settings)) is not None
        first.stop()
        deadline = time.monotonic() + 5
        while not second.hosting and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second.hosting
        assert read_stats(socket_path(settings)) is not None
    finally:
        first.stop()
        second.stop()
    assert not socket_path(settings).exists()


# -- the openai backend --------------------------------------------------------


def test_the_openai_entry_point_uses_the_process_wide_admission(short_dir: Path) -> None:
    settings = ArenaSettings(home=short_dir, llm="openai://127.0.0.1:9/v1?model=m", llm_concurrency=3)
    backend = make_backend(settings)
    assert isinstance(backend, OpenAIBackend)
    assert backend.admission is admission_for(settings)
    assert isinstance(backend.admission, SharedAdmission) and backend.admission.capacity == 3
    assert backend.admission_key == "http://127.0.0.1:9/v1 model=m"
    assert isinstance(OpenAIBackend("http://x/v1", "m", concurrency=2).admission, LocalAdmission)
    asyncio.run(backend.aclose())


@pytest.mark.integration
def test_backends_sharing_a_coordinator_share_the_endpoint_budget(short_dir: Path) -> None:
    path = short_dir / "admission.sock"
    with start_openai_server() as llm:
        llm.configure(ServerScript(latency_s=0.05))

        async def run() -> None:
            server = AdmissionServer(path)
            await server.start()
            # two clients (two connections, as two stage processes would have) of capacity 3
            gateways = [
                Gateway(
                    OpenAIBackend(
                        llm.base_url, "test-model", concurrency=3, admission=SharedAdmission(path, 3)
                    )
                )
                for _ in range(2)
            ]
            calls = [
                g.call(ASK, Question(text=f"q{g_n}-{n}")) for g_n, g in enumerate(gateways) for n in range(12)
            ]
            answers = await asyncio.gather(*calls)
            assert all(a.output.answer == "ok" for a in answers)
            stats = server.stats().endpoints[f"{llm.base_url.rstrip('/')} model=test-model"]
            assert stats.granted == 24 and stats.max_in_flight == 3
            for gateway in gateways:
                await gateway.aclose()
            await server.close()

        asyncio.run(run())
        assert llm.stats().max_in_flight == 3  # the server saw the shared budget, not 2 x 3

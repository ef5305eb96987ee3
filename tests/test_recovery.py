"""`kill -9` of the stage workers mid-stream: nothing lost, nothing duplicated.

The supervisor (`arena worker`) restarts the killed workers; the check is on
the committed topic (exactly-once: no duplicate output even in Kafka) and on
the lake (no duplicate rows). The stage handles many records at once (ARENA_STAGE_CONCURRENCY,
default 32), released in offset order.

Two replicas of the stage in one group (`--replicas 2`) are not tested here: on the embedded
broker, after the rebalance that shares the partitions, a replica sometimes handles nothing of its
new assignment (no request hangs, no error; see the README's scale-out section and
``streams.watchdog`` for the two failures that are handled).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli import (
    ARENA,
    arena_env,
    broker_of,
    children_of,
    committed,
    lake_json,
    read_all,
    run_arena,
    stack_stopped_after,
)
from tests.test_pipeline import small_server

pytestmark = pytest.mark.integration

N_SERVERS = 300


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_kill9_workers_mid_stream_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = arena_env(home)
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(N_SERVERS):
        (docs / f"s{i:04d}.json").write_text(json.dumps(small_server(f"svc{i:04d}")))
    with stack_stopped_after(env):
        run_arena(["publish", "tools", str(docs)], env)
        bootstrap = broker_of(home)
        sup = subprocess.Popen(
            [
                ARENA,
                "worker",
                "--stage",
                "tools-servers",
                "--stage",
                "lake-sink",
                "--until-drained",
                "--timeout",
                "300",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:

            def progress() -> int:
                return sum(committed(bootstrap, "arena-tools-servers").values())

            wait_for(lambda: progress() >= 10, 180, "the stage to commit some records")
            done_at_kill = progress()
            victims = {pid: cmd for pid, cmd in children_of(sup.pid).items() if "app.run" in cmd}
            assert len(victims) == 2, victims
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            assert done_at_kill < N_SERVERS, "the stage finished before the kill; raise N_SERVERS"
            _, err = sup.communicate(timeout=400)
        finally:
            if sup.poll() is None:
                sup.kill()
        assert sup.returncode == 0, err[-3000:]
        assert "restarting" in err

        # Kafka: every input produced exactly one committed output (aborted transactions are invisible).
        outputs = read_all(bootstrap, "tools.servers")
        names = sorted(json.loads(r.value)["name"] for r in outputs)
        assert names == [f"svc{i:04d}" for i in range(N_SERVERS)]
        # Lake: every server once.
        counts = lake_json(
            "select count(*) as n, count(distinct _key) as keys, count(distinct name) as names from tools_servers",
            env,
        )[0]
        assert counts == {"n": N_SERVERS, "keys": N_SERVERS, "names": N_SERVERS}
        raw = lake_json("select count(*) as n, count(distinct _key) as keys from tools_raw", env)[0]
        assert raw == {"n": N_SERVERS, "keys": N_SERVERS}

"""`kill -9` of the stage workers mid-stream: nothing lost, nothing duplicated.

The stage runs as two replicas in one consumer group (`--replicas 2`, the way to add capacity),
each handling many records at once. One replica and the lake sink are killed; the supervisor
(`arena worker`) restarts them; the check is on the committed topic (exactly-once: no duplicate
output even in Kafka) and on the lake (no duplicate rows).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

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


def _partitions_held(assignment: bytes) -> int:
    """Partitions in a consumer-protocol member assignment: int16 version, then per topic a string and int32s."""
    if len(assignment) < 6:
        return 0
    pos, held = 2, 0
    topics = int.from_bytes(assignment[pos : pos + 4], "big", signed=True)
    pos += 4
    for _ in range(max(topics, 0)):
        name_len = int.from_bytes(assignment[pos : pos + 2], "big", signed=True)
        pos += 2 + max(name_len, 0)
        count = int.from_bytes(assignment[pos : pos + 4], "big", signed=True)
        pos += 4 + 4 * max(count, 0)
        held += max(count, 0)
    return held


def members_with_partitions(bootstrap: str, group: str) -> list[str]:
    """Member ids of ``group`` that hold at least one partition now (DescribeGroups)."""

    async def describe() -> list[str]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            (response,) = await admin.describe_consumer_groups([group])
        finally:
            await admin.close()
        members = response.groups[0][-1]
        return [m[0] for m in members if _partitions_held(m[-1]) > 0]

    return asyncio.run(describe())


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
                "--replicas",
                "2",
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
            wait_for(
                lambda: len(members_with_partitions(bootstrap, "arena-tools-servers")) == 2,
                60,
                "both replicas",
            )
            done_at_kill = progress()
            workers = {pid: cmd for pid, cmd in children_of(sup.pid).items() if "app.run" in cmd}
            assert sorted(cmd.split()[-1] for cmd in workers.values()) == [
                "lake-sink",
                "lake-sink",
                "tools-servers",
                "tools-servers",
            ], workers
            victims = [next(p for p, c in workers.items() if c.split()[-1] == "tools-servers")]
            victims += [next(p for p, c in workers.items() if c.split()[-1] == "lake-sink")]
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

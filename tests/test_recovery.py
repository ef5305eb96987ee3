"""`kill -9` of the stage workers mid-stream: nothing lost, nothing duplicated.

The supervisor (`arena worker`) restarts the killed workers; the check is on
the committed topic (exactly-once: no duplicate output even in Kafka) and on
the lake (no duplicate rows). The stage handles many records at once (ARENA_STAGE_CONCURRENCY,
default 32), released in offset order.

`test_replicas_share_partitions_and_survive_kill9` runs two replicas of the stage in one consumer
group (`--replicas 2`, the documented way to add capacity) and SIGKILLs one of them mid-run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from app.stack import descendants_of
from tests.cli import (
    ARENA,
    arena_env,
    broker_of,
    committed,
    lake_json,
    read_all,
    run_arena,
    stack_stopped_after,
)
from tests.test_pipeline import small_server

pytestmark = pytest.mark.integration

N_SERVERS = 300
STAGES = ["--stage", "tools-servers", "--stage", "lake-sink"]


def assert_restarted_exactly_once(
    code: int | None, err: str, bootstrap: str, env: dict[str, str], n: int
) -> None:
    """The supervisor restarted a killed worker and ended cleanly; each of the n servers is out once."""
    assert code == 0, err[-3000:]
    assert "restarting" in err
    # Kafka: every input produced exactly one committed output (aborted transactions are invisible).
    outputs = read_all(bootstrap, "tools.servers")
    names = sorted(json.loads(r.value)["name"] for r in outputs)
    assert names == [f"svc{i:04d}" for i in range(n)]
    # Lake: every server once (one query: each `arena lake query` starts a process).
    counts = lake_json(
        "select (select count(*) from tools_servers) as n,"
        " (select count(distinct _key) from tools_servers) as keys,"
        " (select count(distinct name) from tools_servers) as names,"
        " (select count(*) from tools_raw) as raw_n,"
        " (select count(distinct _key) from tools_raw) as raw_keys",
        env,
    )[0]
    assert counts == {"n": n, "keys": n, "names": n, "raw_n": n, "raw_keys": n}


def wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def publish_servers(tmp_path: Path, env: dict[str, str], n: int) -> str:
    """Publish n small tool docs to tools.raw; returns the broker's bootstrap address."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(n):
        (docs / f"s{i:04d}.json").write_text(json.dumps(small_server(f"svc{i:04d}")))
    run_arena(["publish", "tools", str(docs)], env)
    return broker_of(Path(env["ARENA_HOME"]))


def start_workers(env: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    """The supervisor of the tools-servers and lake-sink workers, until the topics are drained."""
    return subprocess.Popen(
        [ARENA, "worker", *STAGES, *extra, "--until-drained", "--timeout", "300"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_kill9_workers_mid_stream_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    env = arena_env(tmp_path / "home")
    with stack_stopped_after(env):
        bootstrap = publish_servers(tmp_path, env, N_SERVERS)
        sup = start_workers(env)
        try:

            def progress() -> int:
                return sum(committed(bootstrap, "arena-tools-servers").values())

            wait_for(lambda: progress() >= 10, 180, "the stage to commit some records")
            done_at_kill = progress()
            victims = {pid: cmd for pid, cmd in descendants_of(sup.pid).items() if "app.run" in cmd}
            assert len(victims) == 2, victims
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            assert done_at_kill < N_SERVERS, "the stage finished before the kill; raise N_SERVERS"
            _, err = sup.communicate(timeout=400)
        finally:
            if sup.poll() is None:
                sup.kill()
        assert_restarted_exactly_once(sup.returncode, err, bootstrap, env, N_SERVERS)


def _last_assignment(log: Path) -> set[int]:
    """The partitions of ``tools.raw`` in the last assignment a worker logged (empty when none yet)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    assignments = text.split("Setting newly assigned partitions")
    if len(assignments) < 2:
        return set()
    found = re.search(r"\| tools\.raw +\| \{([^}]*)\}", assignments[-1].split("for group", 1)[0])
    partitions: set[int] = set()
    for part in found.group(1).split(",") if found else []:  # Faust writes {0-1} or {0, 2}
        low, _, high = part.strip().partition("-")
        partitions.update(range(int(low), int(high or low) + 1))
    return partitions


def _shared(logs: list[Path]) -> bool:
    """Each replica's last assignment is a non-empty share, disjoint from the others'."""
    shares = [_last_assignment(log) for log in logs]
    return all(shares) and sum(len(s) for s in shares) == len(set().union(*shares))


def _log_of(pid: int) -> Path:
    """The log file a worker process writes (its stdout): one per stage replica."""
    return Path(os.readlink(f"/proc/{pid}/fd/1"))


def test_replicas_share_partitions_and_survive_kill9(tmp_path: Path) -> None:
    """Two processes of a stage share its partitions; one killed mid-run loses and duplicates nothing."""
    n = 200
    home = tmp_path / "home"
    env = arena_env(home)
    logs = [home / "logs" / "worker-tools-servers.log", home / "logs" / "worker-tools-servers-r1.log"]
    with stack_stopped_after(env):
        bootstrap = publish_servers(tmp_path, env, n)
        sup = start_workers(env, "--replicas", "2")
        try:

            def progress() -> int:
                return sum(committed(bootstrap, "arena-tools-servers").values())

            # Both replicas hold a share of the partitions and the stage is committing.
            wait_for(lambda: _shared(logs), 120, "both replicas to get a share of the partitions")
            wait_for(lambda: progress() >= 10, 120, "the stage to commit some records")
            assert _shared(logs), [_last_assignment(log) for log in logs]
            done_at_kill = progress()
            replicas = {
                _log_of(pid): pid
                for pid, cmd in descendants_of(sup.pid).items()
                if "app.run tools-servers" in cmd
            }
            assert len(replicas) == 2, replicas
            victim = replicas[logs[1].resolve()]
            os.kill(victim, signal.SIGKILL)
            assert done_at_kill < n, "the stage finished before the kill; raise n"
            _, err = sup.communicate(timeout=300)
        finally:
            if sup.poll() is None:
                sup.kill()
        assert_restarted_exactly_once(sup.returncode, err, bootstrap, env, n)

"""The fork server `arena worker` starts its stage processes from (app/forkserver.py).

Real processes, no broker: a worker told of a broker nobody listens on keeps retrying, which is
all these tests need of it. End-to-end behaviour under a supervisor (restart after kill -9,
replicas, drains) is tests/test_recovery.py's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.forkserver import ForkServer
from app.stack import descendants_of


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARENA_")}
    env.update(ARENA_HOME=str(home), OMP_NUM_THREADS="1", **extra)
    return env


def _wait(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_forked_worker_has_its_own_process_group_title_log_and_exit_code(tmp_path: Path) -> None:
    env = _env(tmp_path / "home", ARENA_BROKER=f"127.0.0.1:{_closed_port()}")
    server = ForkServer(env)
    try:
        log = tmp_path / "worker-chains.log"
        proc = server.spawn("chains", log, {**env, "ARENA_WORKER_INSTANCE": "test-0-chains"})
        assert proc.poll() is None
        assert os.getpgid(proc.pid) == proc.pid  # its own process group: `arena worker` signals it
        below = descendants_of(os.getpid())
        assert "app.run chains" in below[proc.pid], below[proc.pid]
        _wait(lambda: log.exists() and log.stat().st_size > 0, 60, "the worker to write its log")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        server.close()
    assert not server.alive()


def test_a_worker_that_cannot_start_reports_its_exit_code_and_reason(tmp_path: Path) -> None:
    env = _env(tmp_path / "home")  # no ARENA_BROKER: app.run refuses to start
    server = ForkServer(env)
    try:
        log = tmp_path / "worker.log"
        assert server.spawn("chains", log, env).wait(timeout=60) == 1
        assert "ARENA_BROKER is not set" in log.read_text()
        unknown = tmp_path / "unknown.log"
        assert (
            server.spawn("no-such-stage", unknown, {**env, "ARENA_BROKER": "127.0.0.1:1"}).wait(timeout=60)
            == 1
        )
        assert "unknown stage 'no-such-stage'" in unknown.read_text()
    finally:
        server.close()


@pytest.mark.timeout(120)
def test_the_server_ends_when_its_supervisor_closes_it_and_its_workers_stop(tmp_path: Path) -> None:
    env = _env(tmp_path / "home", ARENA_BROKER=f"127.0.0.1:{_closed_port()}", ARENA_SUPERVISED="1")
    server = ForkServer(env)
    proc = server.spawn("tasks-from-servers", tmp_path / "w.log", env)
    server.close()  # as when the supervisor dies: the workers notice their parent is gone
    _wait(
        lambda: not Path(f"/proc/{proc.pid}").exists() or _zombie(proc.pid), 90, "the orphaned worker to stop"
    )


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


_FORKED_SCRIPT = """
import json, os, signal, sys, threading, time
from pathlib import Path
from app.forkserver import ForkServer
from app.stack import descendants_of

env, log = json.loads(sys.argv[1]), Path(sys.argv[2])
assert threading.active_count() == 1
server = ForkServer(env, fork_this_process=True)
proc = server.spawn("chains", log, env)
deadline = time.monotonic() + 60
while not (log.exists() and log.stat().st_size > 0) and time.monotonic() < deadline:
    time.sleep(0.2)
below = descendants_of(os.getpid())  # the worker has named itself by the time it logs
os.kill(proc.pid, signal.SIGKILL)
code = proc.wait(timeout=30)
server.close()
print(json.dumps({"below": below, "worker": proc.pid, "code": code, "alive": server.alive(),
                  "environ_home": os.environ.get("ARENA_HOME")}))
"""


def test_arena_worker_forks_its_server_from_itself_once_single_threaded(tmp_path: Path) -> None:
    """`arena worker`'s way (``fork_this_process``): the server is a child of the supervisor named
    ``python -m app.forkserver``, its stage processes name themselves and report their exit codes
    as with an exec'd server, and the supervisor's own environment is left as it was."""
    home = tmp_path / "home"
    env = _env(home, ARENA_BROKER=f"127.0.0.1:{_closed_port()}", ARENA_SUPERVISED="1")
    log = tmp_path / "worker-chains.log"
    done = subprocess.run(
        [sys.executable, "-c", _FORKED_SCRIPT, json.dumps(env), str(log)],
        env={k: v for k, v in env.items() if k != "ARENA_HOME"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    titles = {int(pid): title for pid, title in out["below"].items()}
    assert "app.run chains" in titles[out["worker"]]
    assert any("-m app.forkserver" in t for t in titles.values()), titles
    assert out["code"] == -signal.SIGKILL and out["alive"] is False
    assert out["environ_home"] is None  # the supervisor's own environment is left as it was

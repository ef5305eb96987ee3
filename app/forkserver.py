"""Stage processes forked from one process that imported the stage code once (a fork server).

A stage process spends 2-5 CPU-seconds importing Faust, the gateway, the catalog and every stage
module before it reads a record; `arena worker` starts one per stage and replica, and again after
each crash. So the supervisor starts one fork server: it imports what ``app.run`` needs while
it is still single-threaded and holds no socket, then forks one stage process per request.
`arena worker` forks the server from itself once it did those imports (most of them its own
anyway); otherwise (``arena demo``'s supervisor, which runs threads by then) it starts
``python -m app.forkserver``. Each child starts its own session (the supervisor signals its process
group as before), writes to its own log, takes the environment the supervisor gave it, names
itself ``python -m app.run NAME`` (what ``ps``, the chaos bench and the tests look for) and runs
``app.run.main``.

Protocol, one JSON object per line: the supervisor writes ``SpawnRequest``s to the server's
stdin; the server answers each with ``{"id", "pid"}`` (or ``{"id", "error"}``) and reports every
child that ends as ``{"exited": pid, "code": code}`` (negative: killed by that signal, as
``subprocess`` says it). When its stdin closes (the supervisor ended, even by SIGKILL) the
server exits, and its children stop themselves (``app.run.exit_with_parent``).
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import queue
import selectors
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import setproctitle
from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from arena.config import ArenaSettings

READY_TIMEOUT_S = 120.0
"""How long the first request may wait for the server's imports (a loaded 2-core machine)."""


class SpawnRequest(BaseModel):
    """One stage process to start."""

    id: int = Field(description="Echoed in the answer.")
    name: str = Field(description="The worker to run (``app.registry`` name).")
    log: str = Field(description="File the process appends its stdout and stderr to.")
    env: dict[str, str] = Field(description="The process's whole environment.")


class ForkServerError(RuntimeError):
    """The fork server did not start a process (the supervisor then execs one instead)."""


# -- the server process -------------------------------------------------------------------


def _preload() -> None:
    """Import what a stage process imports before its first record.

    Not the MCP SDK (about 1 CPU-second, on the way to every worker's first record): only a stage
    that calls an MCP server's tools imports it (``synthesis.tools.mcp_client``), on its first call.
    """
    import app.run  # noqa: F401  (the registry: every stage module, Faust, the gateway)
    import streams.app  # noqa: F401
    import synthesis.tools.mcp_client  # noqa: F401
    from streams import fetch_pacing, read_committed

    # What app.run.main installs first: done here, the children find it done. read_committed's
    # import of kafka-python was 0.3 of the 0.5 CPU-s a stage process spent before its event loop.
    fetch_pacing.install()
    read_committed.install()


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _child(request: SpawnRequest, started: int) -> int:
    """In the forked child: become the stage process and run it; returns its exit code."""
    os.setsid()
    os.write(started, b".")  # from now on the supervisor can signal the process group
    os.close(started)
    log = os.open(request.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    from app.run import main, process_title

    sys.argv = ["app.run", request.name]
    # Before the environment changes: the title may reuse the memory of the original environment.
    setproctitle.setproctitle(process_title(request.name))
    os.environ.clear()
    os.environ.update(request.env)

    try:
        main([request.name])
    except SystemExit as exc:
        return _exit_code(exc)
    return 0


def _fork(request: SpawnRequest, server_fds: list[int]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    started, child_started = os.pipe()
    pid = os.fork()
    if pid:
        os.close(child_started)
        os.read(started, 1)  # answered once the child has its own session (or has died)
        os.close(started)
        return pid
    code = 1
    try:
        os.close(started)
        for fd in server_fds:  # the answer pipe and the selector: the server's, not the stage's
            os.close(fd)
        code = _child(request, child_started)
        atexit._run_exitfuncs()  # what a normal interpreter exit runs; os._exit below skips it
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _answer(out: IO[bytes], message: dict[str, Any]) -> None:
    out.write(json.dumps(message).encode() + b"\n")
    out.flush()


def _reap(out: IO[bytes]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _answer(out, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve() -> None:
    """The server's loop: fork on each request, report each child that ends, stop at EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # the preload's stray prints must not corrupt the answers
    # No collection while importing: the imports allocate long-lived objects only, and the
    # collector's passes over them were 30% of the import's CPU (1.85 -> 1.3 CPU-s here, once per
    # `arena worker`).
    gc.disable()
    _preload()
    gc.freeze()  # the imported heap: no child's collections walk it, and its pages stay shared
    gc.enable()
    _answer(out, {"ready": os.getpid()})
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    pending = b""
    while True:
        if selector.select(timeout=0.2):
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return  # the supervisor is gone
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = SpawnRequest.model_validate_json(line)
                try:
                    pid = _fork(request, [out.fileno(), selector.fileno()])
                    _answer(out, {"id": request.id, "pid": pid})
                except OSError as exc:
                    _answer(out, {"id": request.id, "error": str(exc)})
        _reap(out)


# -- the supervisor's side ----------------------------------------------------------------


def supervised_env(home: Path) -> dict[str, str]:
    """This process's environment, as the fork server and the stage processes of home ``home`` get
    it; the supervisor adds the broker and the metrics folder (``app.worker.Supervisor``)."""
    env = dict(os.environ)
    env["ARENA_HOME"] = str(home)
    env["ARENA_SUPERVISED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


class ForkedProcess:
    """A stage process the fork server started: the part of ``subprocess.Popen`` the supervisor uses."""

    def __init__(self, pid: int, server: ForkServer) -> None:
        self.pid = pid
        self._server = server

    @property
    def returncode(self) -> int | None:
        return self._server.exit_code(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        return _wait_for_exit(self.poll, timeout, f"app.run (pid {self.pid})")


def _wait_for_exit(poll: Callable[[], int | None], timeout: float | None, what: str) -> int:
    """``Popen.wait`` for a process this one cannot wait on through ``subprocess``: ``poll`` until
    it gives an exit code, ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while (code := poll()) is None:
        if deadline is not None and time.monotonic() > deadline:
            raise subprocess.TimeoutExpired(what, timeout or 0.0)
        time.sleep(0.05)
    return code


class _ServerProcess(Protocol):
    """The fork server's process, as the supervisor holds it (``subprocess.Popen`` is one)."""

    stdin: IO[bytes] | None
    stdout: IO[bytes] | None

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class _ForkedServerProcess:
    """A fork server forked from this process (``_fork_server``): the part of Popen ForkServer uses."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid = pid
        self.stdin: IO[bytes] | None = stdin
        self.stdout: IO[bytes] | None = stdout
        self._code: int | None = None

    def poll(self) -> int | None:
        if self._code is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: gone all the same
                self._code = 1
                return self._code
            if pid:
                self._code = os.waitstatus_to_exitcode(status)
        return self._code

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None) -> int:
        return _wait_for_exit(self.poll, timeout, f"app.forkserver (pid {self.pid})")


def _exec_server(env: dict[str, str]) -> _ServerProcess:
    return subprocess.Popen(
        [sys.executable, "-m", "app.forkserver"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=None,  # the supervisor's stderr: an import error there is worth seeing
    )


def _fork_server(env: dict[str, str]) -> _ServerProcess:
    """The fork server as a fork of this process, after this process did the server's imports.

    `arena worker` imports most of them anyway (the registry); a server of its own imported them all
    again (about 2 CPU-s per `arena worker`). Only safe while this process runs one thread: the
    caller checks. The imports run with the server's environment defaults (``supervised_env``:
    OpenBLAS sizes its thread pool from ``OMP_NUM_THREADS`` when numpy loads).
    """
    for key in ("OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM"):
        if key in env:
            os.environ.setdefault(key, env[key])
    gc.disable()  # as in serve(): no collector passes over the imports' long-lived objects
    try:
        _preload()
    finally:
        gc.enable()
    requests, requests_in = os.pipe()
    answers_out, answers = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the server: stdin and stdout are its pipes, as when exec'd
        code = 0
        try:
            os.dup2(requests, 0)
            os.dup2(answers, 1)
            for fd in (requests, requests_in, answers_out, answers):
                os.close(fd)
            # The title first: setproctitle sets itself up on its first call, from the environment's
            # memory, and cannot once the environment was replaced.
            setproctitle.setproctitle(f"{sys.executable} -m app.forkserver")
            os.environ.clear()
            os.environ.update(env)
            serve()
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)  # never this process's exit handlers (the supervisor's)
    os.close(requests)
    os.close(answers)
    return _ForkedServerProcess(pid, os.fdopen(requests_in, "wb"), os.fdopen(answers_out, "rb"))


class ForkServer:
    """Asks a fork server for stage processes: ``python -m app.forkserver`` started with ``env``, or,
    with ``fork_this_process`` and while this process runs one thread, a fork of this process."""

    def __init__(self, env: dict[str, str], *, fork_this_process: bool = False) -> None:
        single_threaded = threading.active_count() == 1
        self._proc = _fork_server(env) if fork_this_process and single_threaded else _exec_server(env)
        self._codes: dict[int, int] = {}
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 0
        self._ready = threading.Event()
        threading.Thread(target=self._read, name="forkserver-answers", daemon=True).start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            if "ready" in message:
                self._ready.set()
            elif "exited" in message:
                with self._lock:
                    self._codes[int(message["exited"])] = int(message["code"])
            else:
                self._answers.put(message)

    def alive(self) -> bool:
        return self._proc.poll() is None

    def spawn(self, name: str, log_path: Path, env: dict[str, str]) -> ForkedProcess:
        """A new stage process ``name``; ``ForkServerError`` when the server cannot start one."""
        if not self.alive() or self._proc.stdin is None:
            raise ForkServerError("the fork server is not running")
        if not self._ready.wait(READY_TIMEOUT_S):
            raise ForkServerError(f"the fork server did not finish its imports in {READY_TIMEOUT_S:.0f}s")
        self._next_id += 1
        request = SpawnRequest(id=self._next_id, name=name, log=str(log_path), env=env)
        try:
            self._proc.stdin.write(request.model_dump_json().encode() + b"\n")
            self._proc.stdin.flush()
            answer = self._answers.get(timeout=30.0)
        except (OSError, queue.Empty) as exc:
            raise ForkServerError(f"the fork server did not answer: {exc!r}") from None
        if "pid" not in answer or answer.get("id") != request.id:
            raise ForkServerError(f"the fork server answered {answer}")
        return ForkedProcess(int(answer["pid"]), self)

    def exit_code(self, pid: int) -> int | None:
        """The exit code of a process it started, None while it runs.

        Once the server is gone its children are no longer reported (they stop themselves when it
        ends): one that is gone then counts as failed.
        """
        with self._lock:
            if pid in self._codes:
                return self._codes[pid]
        if self.alive():
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return 1
        except PermissionError:
            pass
        return None

    def kill(self) -> None:
        """End a server that started no process (its imports need not finish first)."""
        self._proc.kill()
        self.close()

    def close(self) -> None:
        """End the server (after its children: the caller stops them first)."""
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=10.0)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def start_fork_server(settings: ArenaSettings) -> ForkServer | None:
    """A fork server for `arena worker` to start first: forked from it, once it imported what the
    server needs (``_fork_server``), before any thread or connection exists.

    None when workers are exec'd (``worker_fork`` false) or /metrics is served: the server must
    import ``prometheus_client`` with the metrics folder in place, and the supervisor makes that
    folder later (it then starts the server with its first worker, as without this).
    """
    if not settings.worker_fork or settings.metrics.port != 0:
        return None
    return ForkServer(supervised_env(settings.home), fork_this_process=True)


if __name__ == "__main__":
    serve()
    # Nothing to finalize: skipping the interpreter's teardown of the preloaded modules saves the
    # supervisor's stop a few CPU-seconds of waiting.
    sys.stderr.flush()
    os._exit(0)

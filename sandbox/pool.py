"""Sandboxed sessions over one fork server per pool (``sandbox/forkserver.py``).

A session is one environment instance -- one rollout of one task, one verification run -- living
in one sandboxed process for its whole episode: its Python namespaces (an environment's tools and
its state) stay there between calls, so a tool call is a message, not a program. A request that
raises, runs out of memory or over the output cap leaves the session's state as it was; a
committed success becomes its new state. A call that crashes or runs over its wall-clock limit
ends that session (the later requests answer with why), never another.

Each pool slot owns one unprivileged uid (the first free uid at or above ``settings.uid_base``,
claimed with a lock file so two pools never share one) and runs that uid's sessions one at a time,
each a fork of the slot, in the slot's own pid, mount and ipc namespaces (its /proc, its /tmp):
one session cannot see, signal or change another. ``pool_size`` bounds the sessions open at once;
``open_session`` waits for a free slot (back-pressure). ``run`` is the one-off form: a session for
one program, closed afterwards.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import itertools
import json
import os
import pwd
import signal
import site
import socket
import struct
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pydantic import BaseModel, Field

from arena import metrics
from arena.config import SandboxSettings

FORKSERVER = Path(__file__).with_name("forkserver.py")
LOCK_DIR = Path("/run/arena-sandbox")
UID_SEARCH = 4096
"""How many uids above uid_base a pool may look at for free ones."""
SITE_DIRS = [d for d in site.getsitepackages() if os.path.isdir(d)]
"""Installed packages stay importable by sessions (the server runs without ``site``)."""
READY_TIMEOUT_S = 30.0
KILL_GRACE_S = 2.0
FRAME_SLACK = 1 << 20
CLOSE = struct.pack(">I", 15) + b'{"op": "close"}'
"""The frame that ends an idle session (its process exits)."""
MAX_STATE_BYTES = 1 << 30
"""Largest value ``Session.read`` returns (an environment's whole state)."""
WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
"""The fork server's whole environment: nothing of the parent's (secrets) is inherited."""

ErrorType = Literal[
    "timeout", "cpu_time", "memory", "output_limit", "exception", "crash", "killed", "sandbox_error"
]


PRELOAD_TIMEOUT_S = 180.0
"""Extra time the fork server gets to import a preload (tau2 and litellm: seconds, more on a busy box)."""


class Preload(BaseModel, frozen=True):
    """What every session of a pool would import itself: imported once by the fork server instead,
    so each session forks with it (a tau2 session saves its domain and evaluator imports, ~7 CPU-s).
    Only for pools dedicated to that code: its modules count in every session's address space."""

    paths: tuple[str, ...] = Field(default=(), description="Directories put first on sys.path.")
    modules: tuple[str, ...] = Field(default=(), description="Modules imported, in order.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Environment set before the imports (e.g. no network lookups)."
    )


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here (not root, no namespaces, no free uid), or its pool is closed."""


class SandboxResult(BaseModel):
    """What one execution (a program, a tool call, a read) did."""

    ok: bool = Field(description="The code ran to its end without an exception or a limit.")
    stdout: str = Field(default="", description="Captured standard output (at most max_output_bytes).")
    stderr: str = Field(
        default="", description="Captured standard error, tracebacks included (at most max_output_bytes)."
    )
    return_value: Any = Field(
        default=None,
        description="Value of the program's trailing expression statement (or of the tool call): JSON, or "
        "its repr when not JSON-able.",
    )
    error_type: ErrorType | None = Field(default=None, description="Why the run is not ok; None when ok.")
    error: str | None = Field(default=None, description="One line saying what went wrong.")
    wall_s: float = Field(default=0.0, description="Seconds from handing over the request until it was over.")
    cpu_s: float = Field(
        default=0.0, description="CPU seconds used by the call and every process it started."
    )
    truncated: bool = Field(default=False, description="Output was cut at max_output_bytes.")


def kill_uid(uid: int, deadline_s: float = KILL_GRACE_S) -> int:
    """SIGKILL every live process whose real, effective or saved uid is ``uid``; returns how many."""
    killed, end = 0, time.monotonic() + deadline_s
    while time.monotonic() < end:
        found = _pids_of(uid)
        if not found:
            return killed
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        time.sleep(0.005)
    return killed


def _pids_of(uid: int) -> list[int]:
    """Live (not zombie) processes of ``uid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        if fields.get("State", "").startswith(("Z", "X")):
            continue
        if str(uid) in fields.get("Uid", "").split()[:3]:
            pids.append(int(entry))
    return pids


def _uid_taken(uid: int) -> bool:
    """A uid that belongs to a real account is never used (its processes would be killed)."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


class _ForkServer:
    """The pool's fork server process and its control socket (SOCK_SEQPACKET, one JSON per message)."""

    def __init__(self, proc: asyncio.subprocess.Process, ctl: socket.socket) -> None:
        self.proc = proc
        self.ctl = ctl
        self.ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.ended: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.slots: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.broken: str | None = None
        self.stderr: collections.deque[str] = collections.deque(maxlen=20)
        self._drain = asyncio.create_task(self._drain_stderr())
        asyncio.get_running_loop().add_reader(ctl.fileno(), self._on_message)

    @classmethod
    async def start(cls, preload: Preload) -> _ForkServer:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-I",
                "-S",  # site's import hooks cost more than they give; its plain directories are passed
                str(FORKSERVER),
                str(theirs.fileno()),
                preload.model_dump_json(),
                *SITE_DIRS,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=WORKER_ENV,
                pass_fds=(theirs.fileno(),),
                cwd="/",
                start_new_session=True,  # no terminal signal of ours reaches the sandbox, nor theirs us
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        server = cls(proc, ours)
        try:
            ready_s = READY_TIMEOUT_S + (PRELOAD_TIMEOUT_S if preload.modules else 0.0)
            message = await asyncio.wait_for(asyncio.shield(server.ready), ready_s)
        except BaseException:
            await server.close()
            raise
        if message.get("kind") != "ready":
            await server.close()
            why = message.get("error") or " | ".join(server.stderr) or "no message"
            raise SandboxUnavailable(f"sandbox setup failed: {why}")
        return server

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            self.stderr.append(line.decode(errors="replace").rstrip())

    def _on_message(self) -> None:
        while True:
            try:
                data = self.ctl.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                data, why = b"", f"control socket: {exc}"
            else:
                why = "the sandbox fork server exited"
            if not data:
                self._fail(why)
                return
            message = json.loads(data)
            kind = message.get("kind")
            if kind in ("ended", "slot", "slot_error"):
                waiting = self.ended if kind == "ended" else self.slots
                future = waiting.pop(str(message.get("id") if kind == "ended" else message.get("uid")), None)
                if future is not None and not future.done():
                    future.set_result(message)
            elif not self.ready.done():
                self.ready.set_result(message)
            elif message.get("kind") == "setup_error":
                self._fail(str(message.get("error")))
                return

    def _fail(self, why: str) -> None:
        """The server is gone: every open session has ended with it."""
        if self.broken is None:
            self.broken = why
            asyncio.get_running_loop().remove_reader(self.ctl.fileno())
        if not self.ready.done():
            self.ready.set_result({"kind": "setup_error", "error": " | ".join(self.stderr) or why})
        for future in [*self.ended.values(), *self.slots.values()]:
            if not future.done():
                future.set_result({"kind": "ended", "error": why})
        self.ended.clear()
        self.slots.clear()

    async def _send(self, data: bytes, fds: list[int]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                socket.send_fds(self.ctl, [data], fds)
                return
            except BlockingIOError:
                writable = loop.create_future()
                loop.add_writer(self.ctl.fileno(), writable.set_result, None)
                try:
                    await writable
                finally:
                    loop.remove_writer(self.ctl.fileno())

    async def add_slot(self, uid: int) -> _Channel:
        """Have the server make ``uid``'s slot, with the pipes every session of it will use."""
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        made: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.slots[str(uid)] = made
        try:
            await self._send(json.dumps({"op": "slot", "uid": uid}).encode(), [requests_r, answers_w])
        finally:
            os.close(requests_r)
            os.close(answers_w)
        channel = _Channel(answers_r, requests_w)
        async with asyncio.timeout(READY_TIMEOUT_S):
            reply = await made
        if reply.get("kind") != "slot":
            channel.close()
            raise SandboxUnavailable(f"sandbox setup failed: slot for uid {uid}: {reply.get('error')}")
        return channel

    async def open(self, sid: str, settings: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        """Ask for a session in the slot of ``settings["uid"]``; the future is set to the server's
        ``ended`` report (how the session's process ended, or why it could not start) once its
        processes are all gone."""
        if self.broken is not None:
            raise SandboxUnavailable(f"the sandbox is not running: {self.broken}")
        ended: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.ended[sid] = ended
        await self._send(json.dumps({"op": "open", "id": sid, **settings}).encode(), [])
        return ended

    async def kill(self, sid: str) -> None:
        if self.broken is None and sid in self.ended:
            with contextlib.suppress(OSError):
                await self._send(json.dumps({"op": "kill", "id": sid}).encode(), [])

    async def close(self) -> None:
        """Closing the control socket makes the server kill every session and exit."""
        if self.broken is None:
            self._fail("the sandbox pool closed")
        with contextlib.suppress(OSError):
            self.ctl.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), KILL_GRACE_S)
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        self._drain.cancel()
        with contextlib.suppress(BaseException):
            await self._drain


class _Slot:
    """A uid, its lock file and its slot's pipes (made once the fork server runs)."""

    def __init__(self, uid: int, lock_fd: int) -> None:
        self.uid = uid
        self.lock_fd = lock_fd
        self.channel: _Channel | None = None


class _Ended(Exception):
    """The session's process is gone (the server said so, or the slot's pipes closed)."""


class _Channel:
    """A slot's pipes, ours ends: answers in, requests out -- non-blocking, on the event loop.

    One session at a time uses them; between sessions the slot drains the request pipe and we
    ``reset`` the answer side, so nothing of one session reaches the next."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        self.read_fd, self.write_fd = read_fd, write_fd
        self.buffer = bytearray()

    async def write(self, data: bytes, ended: asyncio.Future[Any]) -> None:
        view = memoryview(data)
        while view:
            if ended.done():  # never a byte more once the session is over: the pipe is the slot's
                raise _Ended
            try:
                view = view[os.write(self.write_fd, view) :]
            except BlockingIOError:
                await self._wait(self.write_fd, ended, writing=True)
            except BrokenPipeError:
                raise _Ended from None

    async def read_exactly(self, n: int, ended: asyncio.Future[Any]) -> bytes:
        while len(self.buffer) < n:
            try:
                chunk = os.read(self.read_fd, max(1 << 16, n - len(self.buffer)))
            except BlockingIOError:
                await self._wait(self.read_fd, ended, writing=False)
                continue
            if not chunk:
                raise _Ended
            self.buffer += chunk
        data = bytes(self.buffer[:n])
        del self.buffer[:n]
        return data

    async def _wait(self, fd: int, ended: asyncio.Future[Any], *, writing: bool) -> None:
        """Until ``fd`` is ready, or the session has ended (then ``_Ended``; what it wrote before
        ending is still read first)."""
        if ended.done():
            raise _Ended
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def wake(*_: Any) -> None:
            if not waiter.done():
                waiter.set_result(None)

        (loop.add_writer if writing else loop.add_reader)(fd, wake)
        ended.add_done_callback(wake)
        try:
            await waiter
        finally:
            (loop.remove_writer if writing else loop.remove_reader)(fd)
            ended.remove_done_callback(wake)

    def reset(self) -> None:
        """Throw away what the last session left unread (its process is gone)."""
        self.buffer.clear()
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 1 << 16):
                pass

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


class Session:
    """One environment instance in its own sandboxed process; calls on it run one at a time, in order.

    Namespaces (``space``) hold globals between calls: ``run`` executes statements in one (after
    binding ``bind``'s JSON values as globals), ``call`` runs one of its functions, ``read`` returns
    one of its globals. With ``commit=False`` a request's effects are thrown away even when it
    succeeds; a request that fails never has effects. Results never raise for what the code does.
    """

    def __init__(
        self,
        pool: SandboxPool,
        sid: str,
        slot: _Slot,
        ended: asyncio.Future[dict[str, Any]],
        timeout_s: float,
    ) -> None:
        assert slot.channel is not None
        self._pool = pool
        self.sid = sid
        self._slot = slot
        self._channel = slot.channel
        self._ready = False
        """The session's process has said it is ready (nothing is written to it before)."""
        self._ended = ended
        self.timeout_s = timeout_s
        """The per-call wall-clock limit (a call may ask for less or more)."""
        self._lock = asyncio.Lock()
        self._dead: tuple[ErrorType, str] | None = None
        self._closed = False

    @property
    def uid(self) -> int:
        """The unprivileged uid the session's processes run as."""
        return self._slot.uid

    @property
    def alive(self) -> bool:
        """The session can still take calls (not closed, its processes not gone)."""
        return not self._closed and self._dead is None

    async def run(
        self,
        source: str,
        *,
        bind: dict[str, Any] | None = None,
        space: str = "main",
        commit: bool = True,
        timeout_s: float | None = None,
    ) -> SandboxResult:
        """Execute ``source`` in ``space``; its trailing expression's value is the return value."""
        request = {"op": "run", "source": source, "bind": bind or {}, "space": space, "commit": commit}
        return await self._request(request, timeout_s)

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        space: str = "main",
        commit: bool = True,
        timeout_s: float | None = None,
    ) -> SandboxResult:
        """``tool(**arguments)`` with ``tool`` a function of ``space``; arguments travel as JSON, never as code."""
        request = {"op": "call", "tool": tool, "arguments": arguments, "space": space, "commit": commit}
        return await self._request(request, timeout_s)

    async def read(self, name: str, *, space: str = "main") -> SandboxResult:
        """The value of the global ``name`` of ``space`` (e.g. an environment's whole state), as JSON."""
        request = {"op": "read", "name": name, "space": space, "max_value_bytes": MAX_STATE_BYTES}
        return await self._request(request, None)

    async def _request(self, request: dict[str, Any], timeout_s: float | None) -> SandboxResult:
        timeout = float(timeout_s if timeout_s is not None else self.timeout_s)
        cap = self._pool.settings.max_output_bytes
        request.update(max_output_bytes=cap, timeout_s=timeout)
        limit = 3 * cap + int(request.get("max_value_bytes") or cap) + FRAME_SLACK
        body = json.dumps(request, ensure_ascii=False).encode()
        async with self._lock:
            if self._closed:
                return SandboxResult(ok=False, error_type="sandbox_error", error="the session is closed")
            if self._dead is not None:
                return SandboxResult(ok=False, error_type=self._dead[0], error=self._dead[1])
            start = time.monotonic()
            try:
                async with asyncio.timeout(timeout):  # no extra task per request, unlike wait_for
                    if not self._ready:
                        answer = await self._answer(FRAME_SLACK)
                        self._ready = answer.get("ready") is True
                        if not self._ready:  # it could not set the session up: that is the answer
                            self._dead = (
                                answer.get("error_type") or "sandbox_error",
                                str(answer.get("error")),
                            )
                    if self._ready:
                        await self._channel.write(struct.pack(">I", len(body)) + body, self._ended)
                        answer = await self._answer(limit)
            except TimeoutError:
                await self._end("timeout", f"wall-clock timeout after {timeout:g} s")
            except _TooBig:
                await self._end("output_limit", f"an answer over {limit} bytes; the session was stopped")
            except _Ended:
                self._dead = _death(await self._how_ended(), timeout)
            wall = round(time.monotonic() - start, 4)
            if self._dead is not None:
                return SandboxResult(ok=False, error_type=self._dead[0], error=self._dead[1], wall_s=wall)
            return SandboxResult.model_validate({**answer, "wall_s": wall})

    async def _answer(self, limit: int) -> dict[str, Any]:
        (size,) = struct.unpack(">I", await self._channel.read_exactly(4, self._ended))
        if size > limit:
            raise _TooBig
        answer = json.loads(await self._channel.read_exactly(size, self._ended))
        if not isinstance(answer, dict) or not ("ok" in answer or "ready" in answer):
            raise _TooBig
        return answer

    async def _how_ended(self) -> dict[str, Any]:
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(self._ended), KILL_GRACE_S)
        return {"error": "its socket closed but its process did not end"}

    async def _end(self, kind: ErrorType, error: str) -> None:
        self._dead = (kind, error)
        await self._pool._server_kill(self.sid)

    async def close(self) -> None:
        """End the session: its processes are gone and its uid is free again when this returns."""
        if not self._closed:
            self._closed = True
            metrics.sandbox_closed("ok" if self._dead is None else self._dead[0])
            await asyncio.shield(self._shutdown())

    async def _shutdown(self) -> None:
        # An idle session's process exits when its socket closes; one busy with a request (or one
        # that stopped answering) is killed -- as is an idle one that does not exit in time.
        try:
            if self._ready and not self._lock.locked() and self._dead is None:
                with contextlib.suppress(_Ended):
                    await self._channel.write(CLOSE, self._ended)
            else:
                await self._pool._server_kill(self.sid)
            if await self._gone():
                return
            await self._pool._server_kill(self.sid)
            if not await self._gone():
                await asyncio.to_thread(kill_uid, self.uid)
        finally:
            self._channel.reset()
            if self._ended.done() and self._ended.result().get("error"):
                await self._pool._revive(self._slot)  # its slot process is gone: make a new one
            self._pool._release(self._slot)

    async def _gone(self) -> bool:
        """Wait (a while) for the server's report that the session's processes are all gone."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(KILL_GRACE_S):
                await asyncio.shield(self._ended)
            return True
        return False

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _death(ended: dict[str, Any], timeout: float) -> tuple[ErrorType, str]:
    """Why a session's process is gone, from the server's report of how it ended."""
    sig, cpu = ended.get("signal"), float(ended.get("cpu_s") or 0.0)
    if ended.get("error"):
        return "sandbox_error", f"the session could not run: {ended['error']}"
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= max(1.0, timeout)):
        return "cpu_time", "the session's CPU time limit was exceeded"
    if sig:
        return ("killed" if sig == signal.SIGKILL else "crash"), f"killed by {_signal_name(int(sig))}"
    return (
        "exception",
        f"the session's process exited with status {ended.get('exit_code')} before it answered",
    )


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class _TooBig(Exception):
    """The session sent more than an answer may be (or not an answer at all)."""


class SandboxPool:
    """One fork server and ``pool_size`` uids: sessions and one-off runs, isolated from each other."""

    def __init__(self, settings: SandboxSettings, preload: Preload | None = None) -> None:
        self.settings = settings
        self.preload = preload or Preload()
        self._slots: list[_Slot] = []
        self._free: asyncio.Queue[_Slot] = asyncio.Queue()
        self._server: _ForkServer | None = None
        self._started = False
        self._closing = False
        self._start_lock = asyncio.Lock()
        self._ids = itertools.count()

    @property
    def uids(self) -> list[int]:
        """The unprivileged uids this pool's sessions run as."""
        return [slot.uid for slot in self._slots]

    async def start(self) -> None:
        """Claim one uid per slot and start the fork server."""
        async with self._start_lock:
            if self._started:
                return
            if self._closing:
                raise SandboxUnavailable("the sandbox pool is closed")
            if os.geteuid() != 0:
                raise SandboxUnavailable(
                    "the sandbox must run as root to switch sessions to unprivileged uids and build their "
                    "namespaces (fix: run the pipeline/tests as root, as CI does)"
                )
            self._slots = await asyncio.to_thread(self._claim_uids, self.settings.pool_size)
            try:
                self._server = await _ForkServer.start(self.preload)
                for slot in self._slots:
                    slot.channel = await self._server.add_slot(slot.uid)
            except BaseException:
                if self._server is not None:
                    await self._server.close()
                    self._server = None
                self._release_uids()
                raise
            for slot in self._slots:
                self._free.put_nowait(slot)
            self._started = True

    def _claim_uids(self, count: int) -> list[_Slot]:
        LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        slots: list[_Slot] = []
        base = self.settings.uid_base
        for uid in range(base, base + UID_SEARCH):
            if len(slots) == count:
                break
            if _uid_taken(uid):
                continue
            fd = os.open(LOCK_DIR / f"uid-{uid}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # another pool's slot
            kill_uid(uid)  # leftovers of a pool that died without cleaning up
            slots.append(_Slot(uid, fd))
        if len(slots) < count:
            for slot in slots:
                os.close(slot.lock_fd)
            raise SandboxUnavailable(
                f"no {count} free sandbox uids in [{base}, {base + UID_SEARCH}) "
                "(fix: set ARENA_SANDBOX__UID_BASE to an unused range)"
            )
        return slots

    async def open_session(self, *, timeout_s: float | None = None, memory_mb: int | None = None) -> Session:
        """A new session (waits while ``pool_size`` are open); close it, or use it as ``async with``.

        ``timeout_s``: each call's wall-clock limit (a call may set its own); ``memory_mb``: the
        session's address-space cap (defaults: the settings')."""
        await self.start()
        slot = await self._free.get()
        try:
            if self._closing or self._server is None:
                raise SandboxUnavailable("the sandbox pool is closed")
            timeout = float(timeout_s if timeout_s is not None else self.settings.timeout_s)
            memory = int(memory_mb if memory_mb is not None else self.settings.memory_mb)
            sid = str(next(self._ids))
            limits = {
                "uid": slot.uid,
                "max_procs": self.settings.max_procs,
                "timeout_s": timeout,
                "memory_mb": memory,
                "cpu_s": self.settings.session_cpu_s,
            }
            ended = await self._server.open(sid, limits)
        except BaseException:
            self._release(slot)
            raise
        metrics.sandbox_opened()
        return Session(self, sid, slot, ended, timeout)

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> SandboxResult:
        """Execute ``code`` in a session of its own, closed afterwards; never raises for what the code does."""
        session = await self.open_session(timeout_s=timeout_s, memory_mb=memory_mb)
        try:
            return await session.run(code, commit=False)
        finally:
            await session.close()

    async def _server_kill(self, sid: str) -> None:
        if self._server is not None:
            await self._server.kill(sid)

    async def _revive(self, slot: _Slot) -> None:
        """A new slot process (and pipes) for ``slot``'s uid after its old one died."""
        if self._closing or self._server is None or self._server.broken is not None:
            return
        try:
            channel = await self._server.add_slot(slot.uid)
        except (SandboxUnavailable, TimeoutError, OSError):
            return  # the next session on it fails with a clear error, and tries again
        if slot.channel is not None:
            slot.channel.close()
        slot.channel = channel

    def _release(self, slot: _Slot) -> None:
        self._free.put_nowait(slot)

    def _release_uids(self) -> None:
        for slot in self._slots:
            kill_uid(slot.uid)
            os.close(slot.lock_fd)
            if slot.channel is not None:
                slot.channel.close()
        self._slots = []

    async def close(self) -> None:
        """Stop the fork server (every session ends with it) and release the uids."""
        self._closing = True
        if self._server is not None:
            await self._server.close()
            self._server = None
        await asyncio.to_thread(self._release_uids)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


async def run_once(
    code: str, settings: SandboxSettings, *, timeout_s: float | None = None, memory_mb: int | None = None
) -> SandboxResult:
    """Run one program in a one-slot pool that is closed afterwards (the CLI's path)."""
    async with SandboxPool(settings.model_copy(update={"pool_size": 1})) as pool:
        return await pool.run(code, timeout_s=timeout_s, memory_mb=memory_mb)

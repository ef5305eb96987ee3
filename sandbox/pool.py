"""A pool of warm sandbox workers that run untrusted Python, one job per process.

Each pool slot owns one unprivileged uid (the first free uid at or above
``settings.uid_base``, claimed with a lock file so two pools never share one): the
RLIMIT_NPROC cap then counts only that slot, and after every job whatever still runs under
the uid is SIGKILLed. A slot always has a worker (``sandbox/worker.py``) pre-spawned and
waiting on its stdin: namespaces built, filesystem locked, job dir made -- a job only pays
for a fork. After the job the worker is gone and a fresh one is spawned in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import pwd
import signal
import site
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pydantic import BaseModel, Field

from arena.config import SandboxSettings

WORKER = Path(__file__).with_name("worker.py")
LOCK_DIR = Path("/run/arena-sandbox")
UID_SEARCH = 4096
"""How many uids above uid_base a pool may look at for free ones."""
SITE_DIRS = [d for d in site.getsitepackages() if os.path.isdir(d)]
"""Installed packages stay importable by jobs (the worker runs without ``site``)."""
READY_TIMEOUT_S = 30.0
KILL_GRACE_S = 2.0
CTL_SLACK = 1 << 20
WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
"""The worker's whole environment: nothing of the parent's (secrets) is inherited."""

ErrorType = Literal[
    "timeout", "cpu_time", "memory", "output_limit", "exception", "crash", "killed", "sandbox_error"
]


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot run here (not root, no namespaces, no free uid)."""


class SandboxResult(BaseModel):
    """What one execution did."""

    ok: bool = Field(description="The program ran to its end without an exception or a limit.")
    stdout: str = Field(description="Captured standard output (at most max_output_bytes).")
    stderr: str = Field(
        description="Captured standard error, tracebacks included (at most max_output_bytes)."
    )
    return_value: Any = Field(
        default=None,
        description="Value of the program's trailing expression statement: JSON, or its repr when not JSON-able.",
    )
    error_type: ErrorType | None = Field(default=None, description="Why the run is not ok; None when ok.")
    error: str | None = Field(default=None, description="One line saying what went wrong.")
    wall_s: float = Field(description="Seconds from handing over the job until it was over.")
    cpu_s: float = Field(description="CPU seconds used by the job and every process it started.")
    truncated: bool = Field(default=False, description="Output was cut at max_output_bytes.")


class _Worker:
    """One spawned worker process and the messages it sent on its control pipe."""

    def __init__(self, proc: asyncio.subprocess.Process, ctl: asyncio.StreamReader, ctl_cap: int) -> None:
        self.proc = proc
        self.messages: list[dict[str, Any]] = []
        self.ready = asyncio.get_running_loop().create_future()
        self.ctl_overflow = False
        self.reader = asyncio.create_task(self._read(ctl, ctl_cap))

    async def _read(self, ctl: asyncio.StreamReader, cap: int) -> None:
        buf, total = b"", 0
        while chunk := await ctl.read(1 << 16):
            total += len(chunk)
            if total > cap:
                self.ctl_overflow = True
                break
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                self._message(line)
        self._message(buf)
        if not self.ready.done():
            self.ready.set_result(None)

    def _message(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return  # empty separators, or bytes the job wrote on the pipe
        if isinstance(msg, dict) and "kind" in msg:
            self.messages.append(msg)
            if msg["kind"] in ("ready", "setup_error") and not self.ready.done():
                self.ready.set_result(msg)

    def last(self, kind: str) -> dict[str, Any] | None:
        return next((m for m in reversed(self.messages) if m["kind"] == kind), None)

    def init_pid(self) -> int | None:
        msg = self.last("spawned")
        return int(msg["init_pid"]) if msg else None

    async def kill(self) -> None:
        """SIGKILL the namespace's pid 1 (the kernel kills everything inside), then the worker."""
        # The worker outlives its init only to report init's rusage (the job's CPU time): give it
        # a moment to do so before killing it too.
        for pid, grace in ((self.init_pid(), KILL_GRACE_S / 4), (self.proc.pid, KILL_GRACE_S)):
            if pid is not None and self.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(self.proc.wait()), grace)
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.reader, KILL_GRACE_S)


async def _spawn(uid: int, ctl_cap: int) -> _Worker:
    """Start a worker for ``uid`` and wait until it waits for its job."""
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",  # site's import hooks cost more than the job; its plain directories are passed instead
            str(WORKER),
            str(uid),
            str(write_fd),
            *SITE_DIRS,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=WORKER_ENV,
            pass_fds=(write_fd,),
            cwd="/",
        )
    finally:
        os.close(write_fd)
    loop = asyncio.get_running_loop()
    ctl = asyncio.StreamReader(limit=ctl_cap)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(ctl), os.fdopen(read_fd, "rb", 0))
    worker = _Worker(proc, ctl, ctl_cap)
    try:
        msg = await asyncio.wait_for(asyncio.shield(worker.ready), READY_TIMEOUT_S)
    except BaseException:
        await worker.kill()
        raise
    if not msg or msg["kind"] != "ready":
        await worker.kill()
        err = (await proc.stderr.read()).decode(errors="replace").strip() if proc.stderr else ""
        why = msg["error"] if msg else f"worker exited before it was ready: {err[-500:] or 'no message'}"
        raise SandboxUnavailable(f"sandbox setup failed: {why}")
    return worker


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


async def _read_capped(
    stream: asyncio.StreamReader | None, cap: int, over: asyncio.Event
) -> tuple[bytes, bool]:
    """Read until EOF, keeping ``cap`` bytes; sets ``over`` once more than ``cap`` arrived.

    Keeps draining past the cap: asyncio only reports the process as exited once all its
    pipes are closed, which a paused (unread) pipe never is."""
    if stream is None:
        return b"", False
    kept = bytearray()
    while chunk := await stream.read(1 << 16):
        if len(kept) <= cap:
            kept += chunk
            if len(kept) > cap:
                over.set()
    return bytes(kept[:cap]), len(kept) > cap


class _Slot:
    """A uid, its lock and the warm worker waiting for its next job."""

    def __init__(self, uid: int, lock_fd: int) -> None:
        self.uid = uid
        self.lock_fd = lock_fd
        self.next: asyncio.Task[_Worker] | None = None


class SandboxPool:
    """Warm, isolated workers; ``run`` executes one program in one of them."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self._slots: list[_Slot] = []
        self._free: asyncio.Queue[_Slot] = asyncio.Queue()
        self._started = False
        self._closing = False
        self._start_lock = asyncio.Lock()

    @property
    def uids(self) -> list[int]:
        """The unprivileged uids this pool's slots run jobs as."""
        return [slot.uid for slot in self._slots]

    @property
    def _ctl_cap(self) -> int:
        return 2 * self.settings.max_output_bytes + CTL_SLACK

    async def start(self) -> None:
        """Claim one uid per slot and pre-spawn ``pool_size`` warm workers."""
        async with self._start_lock:
            if self._started:
                return
            if os.geteuid() != 0:
                raise SandboxUnavailable(
                    "the sandbox must run as root to switch jobs to unprivileged uids and build their "
                    "namespaces (fix: run the pipeline/tests as root, as CI does)"
                )
            self._slots = await asyncio.to_thread(self._claim_uids, self.settings.pool_size)
            for slot in self._slots:
                slot.next = asyncio.create_task(_spawn(slot.uid, self._ctl_cap))
            try:
                await asyncio.gather(*(slot.next for slot in self._slots if slot.next))
            except BaseException:
                await self.close()
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

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> SandboxResult:
        """Execute ``code`` in a fresh isolated process; never raises for what the code does."""
        await self.start()
        if self._closing:
            raise SandboxUnavailable("the sandbox pool is closed")
        timeout = float(timeout_s if timeout_s is not None else self.settings.timeout_s)
        memory = int(memory_mb if memory_mb is not None else self.settings.memory_mb)
        slot = await self._free.get()
        try:
            assert slot.next is not None
            worker = await slot.next
            slot.next = None
            return await self._execute(worker, slot.uid, code, timeout, memory)
        finally:
            if not self._closing:
                slot.next = asyncio.create_task(self._replace(slot))
            self._free.put_nowait(slot)

    async def _replace(self, slot: _Slot) -> _Worker:
        """Make sure nothing of the last job survives, then spawn the slot's next worker."""
        await asyncio.to_thread(kill_uid, slot.uid)
        return await _spawn(slot.uid, self._ctl_cap)

    async def _execute(
        self, worker: _Worker, uid: int, code: str, limit_s: float, memory: int
    ) -> SandboxResult:
        cap = self.settings.max_output_bytes
        job = {
            "code": code,
            "timeout_s": limit_s,
            "memory_mb": memory,
            "max_procs": self.settings.max_procs,
            "max_output_bytes": cap,
        }
        over = asyncio.Event()
        out_task = asyncio.create_task(_read_capped(worker.proc.stdout, cap, over))
        err_task = asyncio.create_task(_read_capped(worker.proc.stderr, cap, over))
        start = time.monotonic()
        assert worker.proc.stdin is not None
        worker.proc.stdin.write(json.dumps(job).encode() + b"\n")
        with contextlib.suppress(ConnectionError):
            await worker.proc.stdin.drain()
        worker.proc.stdin.close()
        done: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(worker.proc.wait(), worker.reader))
        over_wait: asyncio.Future[Any] = asyncio.create_task(over.wait())
        finished, _ = await asyncio.wait(
            {done, over_wait}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED
        )
        over_wait.cancel()
        timed_out = not finished
        if done not in finished:
            await worker.kill()
            await asyncio.to_thread(kill_uid, uid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done, KILL_GRACE_S)
        wall = time.monotonic() - start
        streams = []
        for task in (out_task, err_task):
            try:
                streams.append(await asyncio.wait_for(task, KILL_GRACE_S))
            except TimeoutError:
                streams.append((b"", True))
        (out, out_cut), (err, err_cut) = streams
        return _verdict(
            worker,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
            truncated=out_cut or err_cut,
            timed_out=timed_out and not over.is_set(),
            timeout=limit_s,
            cap=cap,
            wall=wall,
        )

    async def close(self) -> None:
        """Kill the warm workers and release the uids."""
        self._closing = True
        for slot in self._slots:
            if slot.next is not None:
                slot.next.cancel()
                with contextlib.suppress(BaseException):
                    worker = await slot.next
                    await worker.kill()
                slot.next = None
            await asyncio.to_thread(kill_uid, slot.uid)
            os.close(slot.lock_fd)
        self._slots = []

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _uid_taken(uid: int) -> bool:
    """A uid that belongs to a real account is never used (its processes would be killed)."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _verdict(
    worker: _Worker,
    *,
    stdout: str,
    stderr: str,
    truncated: bool,
    timed_out: bool,
    timeout: float,
    cap: int,
    wall: float,
) -> SandboxResult:
    """Turn the worker's messages and what the parent saw into one result."""
    exit_msg = worker.last("exit")
    cpu = float(exit_msg["cpu_s"]) if exit_msg else 0.0
    base = {
        "stdout": stdout,
        "stderr": stderr,
        "truncated": truncated,
        "wall_s": round(wall, 4),
        "cpu_s": cpu,
    }

    def fail(kind: ErrorType, error: str) -> SandboxResult:
        return SandboxResult(ok=False, error_type=kind, error=error, **base)

    if timed_out:
        return fail("timeout", f"wall-clock timeout after {timeout:g} s")
    if truncated or worker.ctl_overflow:
        return fail("output_limit", f"output over the {cap}-byte limit; the job was stopped")
    status, result = worker.last("status"), worker.last("result")
    setup = worker.last("setup_error")
    if setup:
        return fail("sandbox_error", setup["error"])
    if status is None:
        return fail("sandbox_error", "the sandbox ended without reporting the job's status")
    sig = status.get("signal")
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= max(1.0, timeout)):
        return fail("cpu_time", f"CPU time limit of {max(1, int(-(-timeout // 1)))} s exceeded")
    if sig == signal.SIGKILL:
        return fail("killed", "killed by SIGKILL")
    if sig:
        return fail("crash", f"killed by {_signal_name(sig)}")
    if result is None:
        return fail(
            "exception", f"the process exited with status {status.get('exit_code')} before it finished"
        )
    if not result.get("ok"):
        return fail(result.get("error_type") or "exception", str(result.get("error") or "failed"))
    return SandboxResult(ok=True, return_value=result.get("return_value"), **base)


async def run_once(
    code: str, settings: SandboxSettings, *, timeout_s: float | None = None, memory_mb: int | None = None
) -> SandboxResult:
    """Run one program in a one-slot pool that is closed afterwards (the CLI's path)."""
    async with SandboxPool(settings.model_copy(update={"pool_size": 1})) as pool:
        return await pool.run(code, timeout_s=timeout_s, memory_mb=memory_mb)

"""Hosting the LLM admission coordinator (``arena.llm.admission``) inside the worker supervisor.

The supervisor is synchronous, so the coordinator's asyncio server runs in a daemon thread.
Several supervisors may run against one ``ARENA_HOME`` (a second ``arena worker --stage X`` adds
capacity): the one that holds ``flock`` on ``$ARENA_HOME/run/admission.lock`` hosts the server on
``$ARENA_HOME/run/admission.sock``; the others leave their stage processes to use that socket and
poll the lock every ``poll_s``, so one of them takes over when the host dies (the kernel drops a
dead process's lock; clients fall back to per-process limits meanwhile and reconnect).

The host feeds each stage's consumer lag (records pending on its input, from
``consumers.lag.compute_lag``, stage = consumer group without ``arena-``) to the scheduler every
``lag_every_s``; the scheduling rule is in ``arena.llm.admission``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from app.registry import STAGES, topics_by_group
from arena.config import ArenaSettings
from arena.llm.admission import AdmissionServer, lock_path, socket_path
from consumers.lag import CountMemo, compute_lag

log = logging.getLogger(__name__)

LAG_CAP = 1_000
"""Pending records counted per partition at most (the weight saturates long before)."""

LAG_TIMEOUT_S = 5.0

T = TypeVar("T")


class AdmissionHost:
    """Runs the coordinator when this process wins the lock; otherwise waits to take over."""

    def __init__(
        self,
        settings: ArenaSettings,
        bootstrap: str | None,
        *,
        lag_every_s: float = 5.0,
        poll_s: float = 1.0,
        socket: Path | None = None,
        lock: Path | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        """Kafka bootstrap servers for the lag feed; None feeds no lag."""
        self.lag_every_s = lag_every_s
        self.poll_s = poll_s
        self.socket = socket or socket_path(settings)
        self.lock = lock or lock_path(settings)
        self.server: AdmissionServer | None = None
        """The coordinator, while this process hosts it."""
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._halt = threading.Event()
        self._lock_fd: int | None = None

    @property
    def hosting(self) -> bool:
        return self.server is not None

    def start(self, wait_s: float = 2.0) -> AdmissionHost:
        """Start the host thread; wait up to ``wait_s`` for the first election (hosting or not)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="admission-host", daemon=True)
            self._thread.start()
            self._ready.wait(wait_s)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving (clients fall back or move to the next host) and release the lock."""
        thread, loop, stopping = self._thread, self._loop, self._stopping
        if thread is None:
            return
        self._halt.set()
        if loop is not None and stopping is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopping.set)
        thread.join(timeout_s)
        self._thread = None

    # -- the thread ----------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception:
            log.exception("the admission host stopped")
        finally:
            self._ready.set()
            self._unlock()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = stopping = asyncio.Event()
        feed: asyncio.Task[None] | None = None
        try:
            while not (stopping.is_set() or self._halt.is_set()):
                if self.server is None and self._try_lock():
                    server = AdmissionServer(self.socket)
                    try:
                        await server.start()
                    except OSError as exc:  # e.g. a socket path too long for AF_UNIX (~107 bytes)
                        log.warning(
                            "cannot host the LLM admission coordinator at %s (%s); stage processes "
                            "limit LLM requests each on their own",
                            self.socket,
                            exc,
                        )
                        return
                    self.server = server
                    log.info("hosting the LLM admission coordinator at %s", self.socket)
                    if self.bootstrap is not None:
                        feed = asyncio.create_task(self._feed_lag(server, self.bootstrap))
                self._ready.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_s):
                        await stopping.wait()
        finally:
            if feed is not None:
                feed.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feed
            if self.server is not None:
                await self.server.close()
                self.server = None
            self._unlock()

    def _try_lock(self) -> bool:
        """Take the host lock without blocking; True when this process now holds it."""
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    async def _feed_lag(self, server: AdmissionServer, bootstrap: str) -> None:
        groups = topics_by_group([stage.name for stage in STAGES])
        counted: CountMemo = {}  # every stage's partitions each time: count only the ranges that moved
        while True:
            try:
                rows = await _in_daemon_thread(
                    lambda: compute_lag(
                        bootstrap,
                        list(groups),
                        topics_by_group=groups,
                        pending_cap=LAG_CAP,
                        timeout_s=LAG_TIMEOUT_S,
                        memo=counted,
                    )
                )
            except Exception as exc:  # the broker may be down or starting; try again later
                log.debug("admission lag feed: %s", exc)
            else:
                lag = {group.removeprefix("arena-"): 0 for group in groups}
                for row in rows:
                    if row.group in groups:
                        lag[row.group.removeprefix("arena-")] += row.pending
                server.set_lag(lag)
            await asyncio.sleep(self.lag_every_s)


async def _in_daemon_thread(work: Callable[[], T]) -> T:
    """``work()`` in a daemon thread (a slow broker call never holds up the process's exit)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(outcome: Callable[[], None]) -> None:
        if not done.done():
            outcome()

    def run() -> None:
        outcome: Callable[[], None]
        try:
            result = work()
            outcome = functools.partial(done.set_result, result)
        except BaseException as exc:
            outcome = functools.partial(done.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=run, name="admission-lag", daemon=True).start()
    return await done


def start_admission_host(settings: ArenaSettings, bootstrap: str | None) -> AdmissionHost:
    """Start hosting (or standing by to host) the coordinator of ``settings.home``."""
    return AdmissionHost(settings, bootstrap).start()

"""Admission control per LLM endpoint, shared by every stage process.

An *endpoint* is one LLM server and model (the ``openai`` backend keys it as base URL plus model).
Its *capacity* is how many requests may be in flight to it at once, over all the processes of a
deployment: each pipeline stage runs in its own process, and a per-process limit lets N stages
send N times the server's budget. A backend holds one slot of its endpoint for the duration of a
request (``Admission.slot``); who asks comes from ``arena.llm.core.CALLER`` (stage, priority).

Pieces:

- ``Scheduler``: pure (no I/O, no clock) bookkeeping of one endpoint: who is in flight, who waits,
  and who gets a freed slot.
- ``LocalAdmission``: schedulers inside one process (asyncio), used alone or as the fallback.
- ``AdmissionServer``: the coordinator, an asyncio server on a Unix domain socket (by default
  ``$ARENA_HOME/run/admission.sock``; ``app.admission_host`` runs it in the worker supervisor)
  that holds one scheduler per endpoint for every process.
- ``SharedAdmission``: the client each process uses (``admission_for`` gives the process-wide
  one). It connects lazily; while no coordinator answers it falls back to a ``LocalAdmission`` of
  the same capacity (logged once) and tries again every ``retry_s``.

Scheduling rule (weighted fair share with priority and lag)
-----------------------------------------------------------
A stage ``s`` of an endpoint has a priority ``p_s >= 0`` (its depth in the pipeline: higher is
nearer the output; from the latest request of the stage), a consumer lag ``L_s >= 0`` (records
waiting on its input topic, fed by the coordinator's host every few seconds; 0 when unknown), the
number ``f_s`` of its requests in flight, and a FIFO queue of waiting requests. Its weight is::

    w_s = (1 + p_s) * (1 + L_s / (L_s + LAG_HALF))        LAG_HALF = 100 records

so weight grows linearly with pipeline depth and, at most two-fold, with lag (lag 0 -> x1,
lag 100 -> x1.5, a deep backlog -> x2): a stage with a backlog in front of it gets more, but a
first stage with a huge input backlog cannot outweigh the stages that drain the pipeline.

While fewer than ``capacity`` requests are in flight, the next one admitted is the head of the
queue of the waiting stage with the smallest ``f_s / w_s``; ties go to the larger ``w_s``, then the
larger ``p_s``, then the request that has waited longest. Consequences:

- When saturated, waiting stages converge to shares of the capacity proportional to ``w_s``
  (capacity 4, stage A ``p=0`` and stage B ``p=3`` waiting with equal lag: weights 1 and 4, B holds
  3 slots and A 1), so a pipeline drains instead of piling work up in its first stages.
- Nothing is reserved: a stage with no waiting request takes no part, and an idle endpoint
  admits whoever asks, up to capacity.
- No stage is starved: a waiting stage with nothing in flight has ``f_s / w_s = 0``, the smallest
  possible, so it gets the next freed slot (after the other such stages, by weight).
- Requests of one stage are admitted in arrival order.

Wire protocol (one JSON object per line, both ways)::

    -> {"op": "acquire", "id": 7, "endpoint": E, "capacity": 64, "stage": S, "priority": 2}
    <- {"op": "granted", "id": 7}
    -> {"op": "release", "id": 7, "outcome": {"cost": 310.5, "timed_out": false}}
                                      # frees a granted slot, or withdraws a waiting request
    -> {"op": "stats", "id": 8}
    <- {"op": "stats", "id": 8, "stats": {...AdmissionStats...}}
    -> {"op": "lag", "lag": {"chains": 120, ...}}
    <- {"op": "error", "id": ..., "error": "..."}   # a malformed message

``id`` is chosen by the client, unique per connection. An endpoint's capacity is the largest any
client declared. An acquire with ``"learn": SLOW_S`` turns on capacity learning for its endpoint
(``arena.llm.capacity``): from then on at most the learned limit is in flight, and each release's
``outcome`` (optional) teaches it, timed by the coordinator's clock from grant to release. When a connection closes (its process exited or was SIGKILLed) every slot it held
is released and every request it had waiting withdrawn, at once. While the coordinator is
unreachable each process enforces the capacity on its own, so the deployment may briefly admit
more than the capacity in total.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, Field

from arena.llm.capacity import CapacityLearner, Outcome
from arena.llm.core import CALLER

if TYPE_CHECKING:
    from arena.config import ArenaSettings

log = logging.getLogger(__name__)

LAG_HALF = 100
"""Consumer lag (records) at which a stage's weight is 1.5 times its lag-free weight."""

SOCKET_NAME = "admission.sock"
LOCK_NAME = "admission.lock"

Release = Callable[..., None]
"""Frees a slot that an acquire returned (call it exactly once), with the request's ``Outcome``
when it has one (what capacity learning reads)."""


class Admission(Protocol):
    """Admission control of LLM requests, per endpoint."""

    def slot(self, endpoint: str) -> contextlib.AbstractAsyncContextManager[Outcome]:
        """Hold one in-flight request slot of ``endpoint`` for the duration of the request.

        The caller's stage and priority come from ``arena.llm.core.CALLER``; the ``Outcome`` it
        yields is for the caller to fill in (usage, timeout) and goes back with the slot.
        """
        ...


def weight(priority: int, lag: int) -> float:
    """A stage's share weight: ``(1 + p) * (1 + L / (L + LAG_HALF))`` (see the module docstring)."""
    p = max(priority, 0)
    lag = max(lag, 0)
    return (1 + p) * (1 + lag / (lag + LAG_HALF))


# -- stats ---------------------------------------------------------------------


class StageStats(BaseModel):
    """One stage's use of one endpoint."""

    priority: int = Field(description="Latest priority the stage asked with (pipeline depth).")
    lag: int = Field(description="Consumer lag last reported for the stage (0 when unknown).")
    weight: float = Field(description="Share weight from priority and lag.")
    in_flight: int = Field(description="Slots the stage holds now.")
    max_in_flight: int = Field(description="Most slots the stage held at once.")
    granted: int = Field(description="Slots granted to the stage so far.")
    waiting: int = Field(description="Requests of the stage waiting now.")


class EndpointStats(BaseModel):
    """One endpoint: totals and per-stage lines."""

    capacity: int
    limit: int = Field(
        default=0, description="Requests allowed in flight now: the learned limit, else the capacity."
    )
    learning: bool = Field(default=False, description="Whether the limit is learned from latency.")
    base_pace_ms: float | None = Field(
        default=None, description="Fastest pace seen, in ms per unit of cost (learning only)."
    )
    in_flight: int
    max_in_flight: int
    granted: int
    waiting: int
    busy_s: float = Field(
        default=0.0,
        description="Seconds with at least one request in flight: how long the endpoint had Arena's "
        "work (a one-slot server computes all that time; its idle time is the rest).",
    )
    stages: dict[str, StageStats]


class AdmissionStats(BaseModel):
    """What a coordinator (or a ``LocalAdmission``) reports."""

    endpoints: dict[str, EndpointStats] = Field(default_factory=dict)
    clients: int = Field(default=0, description="Connected client processes (coordinator only).")


# -- the scheduler (pure) ------------------------------------------------------


@dataclass
class _Stage:
    priority: int = 0
    queue: dict[Hashable, None] = field(default_factory=dict)
    """Waiting tickets in arrival order (a dict: ordered, O(1) removal)."""
    in_flight: int = 0
    max_in_flight: int = 0
    granted: int = 0


class Scheduler:
    """Who is in flight and who waits at one endpoint, and who gets a freed slot.

    Tickets are any hashable the caller picks, unique while submitted. Pure bookkeeping: the
    caller submits, drops and asks ``grant()`` for the tickets to admit now.
    """

    def __init__(
        self,
        capacity: int,
        lag: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.lag: Mapping[str, int] = lag if lag is not None else {}
        """Consumer lag per stage (may be shared with other schedulers and updated in place)."""
        self.learner: CapacityLearner | None = None
        """Learns the endpoint's real capacity under ``capacity`` (``learn``); None: fixed."""
        self._stages: dict[str, _Stage] = {}
        self._tickets: dict[Hashable, tuple[str, float | None]] = {}
        """ticket -> (stage, when granted; None while waiting)."""
        self.in_flight = 0
        self.max_in_flight = 0
        self.granted = 0
        self._clock = clock
        """Times the busy spans only (the learner takes the caller's ``now``)."""
        self._busy_s = 0.0
        self._busy_since: float | None = None

    @property
    def busy_s(self) -> float:
        """Seconds so far with at least one ticket granted and not yet released."""
        open_span = self._clock() - self._busy_since if self._busy_since is not None else 0.0
        return self._busy_s + open_span

    def declare(self, capacity: int) -> None:
        """Raise the capacity to ``capacity`` if that is more (the largest declared wins)."""
        if capacity >= 1:
            self.capacity = max(self.capacity, capacity)
            if self.learner is not None:
                self.learner.raise_ceiling(self.capacity)

    def learn(self, slow_s: float) -> None:
        """Learn the limit from latency from now on (``arena.llm.capacity``); once is enough."""
        if self.learner is None:
            self.learner = CapacityLearner(self.capacity, slow_s)

    @property
    def limit(self) -> int:
        """Requests allowed in flight now."""
        return self.capacity if self.learner is None else self.learner.allowed

    @property
    def waiting(self) -> int:
        return len(self._tickets) - self.in_flight

    def weight(self, stage: str) -> float:
        entry = self._stages.get(stage)
        return weight(entry.priority if entry else 0, self.lag.get(stage, 0))

    def submit(self, ticket: Hashable, stage: str, priority: int = 0) -> None:
        """Queue ``ticket`` for ``stage``; the stage's priority becomes ``priority``."""
        if ticket in self._tickets:
            raise ValueError(f"ticket {ticket!r} is already submitted")
        entry = self._stages.setdefault(stage, _Stage())
        entry.priority = priority
        entry.queue[ticket] = None
        self._tickets[ticket] = (stage, None)

    def drop(self, ticket: Hashable, outcome: Outcome | None = None, now: float = 0.0) -> bool:
        """Release a granted ticket or withdraw a waiting one; False when ``ticket`` is unknown.

        A released ticket's ``outcome`` (at time ``now``) teaches the learner, if any.
        """
        found = self._tickets.pop(ticket, None)
        if found is None:
            return False
        stage, admitted_at = found
        entry = self._stages[stage]
        if admitted_at is not None:
            if self.learner is not None and outcome is not None:
                self.learner.observe(outcome, admitted_at=admitted_at, now=now, in_flight=self.in_flight)
            entry.in_flight -= 1
            self.in_flight -= 1
            if self.in_flight == 0 and self._busy_since is not None:
                self._busy_s += self._clock() - self._busy_since
                self._busy_since = None
        else:
            del entry.queue[ticket]
        return True

    def pick(self) -> str | None:
        """The stage whose head request is admitted next (None when nobody waits)."""
        best: tuple[float, float, int, int] | None = None
        chosen: str | None = None
        for order, (name, entry) in enumerate(self._stages.items()):
            if not entry.queue:
                continue
            w = weight(entry.priority, self.lag.get(name, 0))
            key = (entry.in_flight / w, -w, -entry.priority, order)
            if best is None or key < best:
                best, chosen = key, name
        return chosen

    def grant(self, now: float = 0.0) -> list[Hashable]:
        """Admit waiting tickets (at time ``now``) while under the limit; the admitted tickets, in order."""
        admitted: list[Hashable] = []
        while self.in_flight < self.limit:
            name = self.pick()
            if name is None:
                break
            entry = self._stages[name]
            ticket = next(iter(entry.queue))
            del entry.queue[ticket]
            self._tickets[ticket] = (name, now)
            entry.in_flight += 1
            entry.granted += 1
            entry.max_in_flight = max(entry.max_in_flight, entry.in_flight)
            if self.in_flight == 0:
                self._busy_since = self._clock()
            self.in_flight += 1
            self.granted += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            admitted.append(ticket)
        return admitted

    def stats(self) -> EndpointStats:
        learner = self.learner
        return EndpointStats(
            capacity=self.capacity,
            limit=self.limit,
            learning=learner is not None,
            base_pace_ms=round(learner.base * 1000, 3) if learner and learner.base is not None else None,
            in_flight=self.in_flight,
            max_in_flight=self.max_in_flight,
            granted=self.granted,
            waiting=self.waiting,
            busy_s=round(self.busy_s, 3),
            stages={
                name: StageStats(
                    priority=entry.priority,
                    lag=self.lag.get(name, 0),
                    weight=round(weight(entry.priority, self.lag.get(name, 0)), 4),
                    in_flight=entry.in_flight,
                    max_in_flight=entry.max_in_flight,
                    granted=entry.granted,
                    waiting=len(entry.queue),
                )
                for name, entry in sorted(self._stages.items())
            },
        )


def allocate(capacity: int, stages: Iterable[tuple[str, int, int, int]]) -> dict[str, int]:
    """How ``capacity`` free slots split among ``(stage, priority, lag, waiting)``: a dry run of the rule."""
    lag: dict[str, int] = {}
    shares: dict[str, int] = {}
    scheduler = Scheduler(capacity, lag)
    for name, priority, stage_lag, waiting in stages:
        lag[name] = stage_lag
        shares[name] = 0
        for n in range(waiting):
            scheduler.submit((name, n), name, priority)
    for ticket in scheduler.grant():
        assert isinstance(ticket, tuple)
        shares[ticket[0]] += 1
    return shares


# -- one process ---------------------------------------------------------------


class LocalAdmission:
    """The scheduler inside one process: slots of each endpoint, ``capacity`` at a time.

    Used from one event loop at a time (the process's). Lag is 0 unless ``set_lag`` says otherwise.
    With ``learn_slow_s`` each endpoint's limit is learned under ``capacity`` (``arena.llm.capacity``).
    """

    def __init__(self, capacity: int, learn_slow_s: float | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.learn_slow_s = learn_slow_s
        self._lag: dict[str, int] = {}
        self._schedulers: dict[str, Scheduler] = {}
        self._waiters: dict[Hashable, asyncio.Future[None]] = {}
        self._ids = itertools.count(1)

    def __repr__(self) -> str:
        return f"LocalAdmission(capacity={self.capacity})"

    def slot(self, endpoint: str) -> contextlib.AbstractAsyncContextManager[Outcome]:
        return _hold(self.acquire, endpoint)

    def set_lag(self, lag: Mapping[str, int]) -> None:
        self._lag.update({str(k): int(v) for k, v in lag.items()})

    def _scheduler(self, endpoint: str) -> Scheduler:
        scheduler = self._schedulers.get(endpoint)
        if scheduler is None:
            scheduler = self._schedulers[endpoint] = Scheduler(self.capacity, self._lag)
            if self.learn_slow_s is not None:
                scheduler.learn(self.learn_slow_s)
        return scheduler

    async def acquire(self, endpoint: str) -> Release:
        """Wait for a slot of ``endpoint``; returns the function that frees it."""
        caller = CALLER.get()
        scheduler = self._scheduler(endpoint)
        ticket = next(self._ids)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = waiter
        scheduler.submit(ticket, caller.stage, caller.priority)
        self._dispatch(scheduler)
        try:
            await waiter
        except asyncio.CancelledError:
            # Withdraws the request, or frees the slot if the grant raced the cancellation.
            self._waiters.pop(ticket, None)
            scheduler.drop(ticket)
            self._dispatch(scheduler)
            raise
        return functools.partial(self._release, scheduler, ticket)

    def _release(self, scheduler: Scheduler, ticket: int, outcome: Outcome | None = None) -> None:
        if scheduler.drop(ticket, outcome, time.monotonic()):
            self._dispatch(scheduler)

    def _dispatch(self, scheduler: Scheduler) -> None:
        for ticket in scheduler.grant(time.monotonic()):
            waiter = self._waiters.pop(ticket, None)
            # A cancelled waiter's slot is freed by its own ``except`` branch.
            if waiter is not None and not waiter.done():
                waiter.set_result(None)

    def stats(self) -> AdmissionStats:
        return AdmissionStats(endpoints={e: s.stats() for e, s in sorted(self._schedulers.items())})


@contextlib.asynccontextmanager
async def _hold(acquire: Callable[[str], Any], endpoint: str) -> AsyncIterator[Outcome]:
    release: Release = await acquire(endpoint)
    outcome = Outcome()
    try:
        yield outcome
    finally:
        release(outcome)


# -- the coordinator -----------------------------------------------------------


def _line(message: Mapping[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


@dataclass
class _Peer:
    """One client connection of the coordinator."""

    id: int
    writer: asyncio.StreamWriter
    handler: asyncio.Task[Any] | None = None
    tickets: dict[Hashable, str] = field(default_factory=dict)
    """ticket -> endpoint, for every request of this connection waiting or in flight."""

    def send(self, message: Mapping[str, Any]) -> None:
        if not self.writer.is_closing():
            self.writer.write(_line(message))


class AdmissionServer:
    """The coordinator: one ``Scheduler`` per endpoint for every client on a Unix socket."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.lag: dict[str, int] = {}
        self._schedulers: dict[str, Scheduler] = {}
        self._peers: dict[int, _Peer] = {}
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen on ``path`` (a stale socket file there is replaced; the caller holds the lock)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        """Stop listening, drop every client, remove the socket file."""
        if self._server is None:
            return
        self._server.close()
        handlers = [peer.handler for peer in self._peers.values() if peer.handler is not None]
        for peer in list(self._peers.values()):
            peer.writer.close()
        await self._server.wait_closed()
        if handlers:  # each sees its connection end and cleans up
            await asyncio.wait(handlers, timeout=5)
        self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def set_lag(self, lag: Mapping[str, int]) -> None:
        """Consumer lag per stage (records); weights use it from the next grant on."""
        self.lag.update({str(k): max(int(v), 0) for k, v in lag.items()})

    def stats(self) -> AdmissionStats:
        return AdmissionStats(
            endpoints={e: s.stats() for e, s in sorted(self._schedulers.items())}, clients=len(self._peers)
        )

    def _scheduler(self, endpoint: str, capacity: int, learn_slow_s: Any) -> Scheduler:
        scheduler = self._schedulers.get(endpoint)
        if scheduler is None:
            scheduler = self._schedulers[endpoint] = Scheduler(max(capacity, 1), self.lag)
        else:
            scheduler.declare(capacity)
        if learn_slow_s is not None:
            scheduler.learn(float(learn_slow_s))
        return scheduler

    def _dispatch(self, endpoint: str) -> None:
        for ticket in self._schedulers[endpoint].grant(time.monotonic()):
            assert isinstance(ticket, tuple)
            peer_id, request_id = ticket
            self._peers[peer_id].send({"op": "granted", "id": request_id})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _Peer(next(self._ids), writer, handler=asyncio.current_task())
        self._peers[peer.id] = peer
        try:
            while line := await reader.readline():
                self._handle(peer, line)
        except (ConnectionError, OSError, ValueError, asyncio.IncompleteReadError):
            pass  # a broken client: its slots are released below
        except asyncio.CancelledError:
            # The event loop is ending: end quietly (asyncio's stream callback of Python 3.11
            # logs a cancelled connection handler as an error).
            pass
        finally:
            del self._peers[peer.id]
            touched = set()
            for ticket, endpoint in peer.tickets.items():
                self._schedulers[endpoint].drop(ticket)
                touched.add(endpoint)
            for endpoint in sorted(touched):
                self._dispatch(endpoint)
            writer.close()

    def _handle(self, peer: _Peer, line: bytes) -> None:
        request_id: Any = None
        try:
            message = json.loads(line)
            request_id = message.get("id")
            op = message["op"]
            if op == "acquire":
                ticket = (peer.id, request_id)
                endpoint = str(message["endpoint"])
                if ticket in peer.tickets:
                    raise ValueError(f"request id {request_id!r} is in use")
                scheduler = self._scheduler(endpoint, int(message.get("capacity") or 1), message.get("learn"))
                scheduler.submit(ticket, str(message.get("stage") or "-"), int(message.get("priority") or 0))
                peer.tickets[ticket] = endpoint
                self._dispatch(endpoint)
            elif op == "release":
                ticket = (peer.id, request_id)
                released = peer.tickets.pop(ticket, None)
                outcome = _outcome(message.get("outcome"))
                if released is not None and self._schedulers[released].drop(
                    ticket, outcome, time.monotonic()
                ):
                    self._dispatch(released)
            elif op == "stats":
                peer.send({"op": "stats", "id": request_id, "stats": self.stats().model_dump(mode="json")})
            elif op == "lag":
                self.set_lag(message["lag"])
            else:
                raise ValueError(f"unknown op {op!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            peer.send({"op": "error", "id": request_id, "error": f"{type(exc).__name__}: {exc}"})


def _outcome(wire: Any) -> Outcome | None:
    """A release message's ``outcome`` field (``{"cost": 310.5, "timed_out": false}``), if any."""
    if not isinstance(wire, dict):
        return None
    return Outcome(cost=float(wire.get("cost") or 0.0), timed_out=bool(wire.get("timed_out")))


def read_stats(path: Path | str, timeout_s: float = 2.0) -> AdmissionStats | None:
    """The coordinator's stats at ``path``, or None when none answers (blocking: CLI, threads)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            sock.sendall(_line({"op": "stats", "id": 1}))
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    return None
                data += chunk
    except OSError:
        return None
    message = json.loads(data)
    return AdmissionStats.model_validate(message["stats"])


def send_lag(path: Path | str, lag: Mapping[str, int], timeout_s: float = 2.0) -> bool:
    """Tell the coordinator at ``path`` the consumer lag per stage; False when none answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(str(path))
            sock.sendall(_line({"op": "lag", "lag": dict(lag)}))
    except OSError:
        return False
    return True


# -- the client ----------------------------------------------------------------


class _Refused(Exception):
    """The coordinator answered a request with an error (a protocol mismatch, never in normal use)."""


class _Link:
    """One connection to the coordinator: many concurrent acquires, multiplexed by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.loop = asyncio.get_running_loop()
        self.reader = reader
        self.writer = writer
        self.closed = False
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self.task = self.loop.create_task(self._read(), name="admission-link")

    async def _read(self) -> None:
        try:
            while line := await self.reader.readline():
                message = json.loads(line)
                waiter = self.pending.pop(message.get("id"), None)
                # A grant for an id no longer pending was cancelled; its release is on the way.
                if waiter is None or waiter.done():
                    continue
                op = message.get("op")
                if op == "granted":
                    waiter.set_result(None)
                elif op == "stats":
                    waiter.set_result(message.get("stats"))
                else:
                    waiter.set_exception(_Refused(f"admission coordinator: {message.get('error')}"))
        except (OSError, ValueError, TypeError, AttributeError, asyncio.IncompleteReadError):
            pass  # a broken connection or a garbled line: drop the link, fall back
        finally:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for waiter in self.pending.values():
            if not waiter.done():
                waiter.set_exception(ConnectionError("connection to the admission coordinator lost"))
        self.pending.clear()
        with contextlib.suppress(RuntimeError, OSError):  # RuntimeError: its loop is closed
            self.writer.close()

    def _send(self, message: Mapping[str, Any]) -> None:
        if self.closed or self.writer.is_closing():
            raise ConnectionError("connection to the admission coordinator lost")
        self.writer.write(_line(message))

    async def request(self, message: dict[str, Any]) -> tuple[int, Any]:
        """Send ``message`` with a fresh id and wait for its answer; (id, answer)."""
        request_id = next(self._ids)
        waiter: asyncio.Future[Any] = self.loop.create_future()
        self.pending[request_id] = waiter
        try:
            self._send({**message, "id": request_id})
            return request_id, await waiter
        finally:
            self.pending.pop(request_id, None)

    async def acquire(self, endpoint: str, capacity: int, learn_slow_s: float | None = None) -> Release:
        caller = CALLER.get()
        message: dict[str, Any] = {
            "op": "acquire",
            "endpoint": endpoint,
            "capacity": capacity,
            "stage": caller.stage,
            "priority": caller.priority,
        }
        if learn_slow_s is not None:
            message["learn"] = learn_slow_s
        request_id = next(self._ids)
        waiter: asyncio.Future[Any] = self.loop.create_future()
        self.pending[request_id] = waiter
        try:
            self._send({**message, "id": request_id})
            await waiter
        except asyncio.CancelledError:
            # Withdraws the request, or frees the slot if the grant raced the cancellation.
            self._release(request_id)
            raise
        finally:
            self.pending.pop(request_id, None)
        return functools.partial(self._release, request_id)

    def _release(self, request_id: int, outcome: Outcome | None = None) -> None:
        message: dict[str, Any] = {"op": "release", "id": request_id}
        if outcome is not None:
            message["outcome"] = {"cost": round(outcome.cost, 3), "timed_out": outcome.timed_out}
        # On a closed link there is nothing to free: the coordinator released it all.
        with contextlib.suppress(ConnectionError, RuntimeError):
            self._send(message)


class SharedAdmission:
    """The client of the coordinator at ``path``; a ``LocalAdmission`` while none answers.

    One connection per process (per event loop), opened at the first request and multiplexing
    every concurrent one. When the socket is missing or the connection breaks, requests go
    through ``local`` (same capacity, this process only), logged once per outage, and connecting
    is tried again ``retry_s`` later. A request waiting when the connection breaks is admitted
    locally instead.
    """

    def __init__(
        self,
        path: Path | str,
        capacity: int,
        *,
        learn_slow_s: float | None = None,
        retry_s: float = 2.0,
        connect_timeout_s: float = 1.0,
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.path = Path(path)
        self.capacity = capacity
        self.learn_slow_s = learn_slow_s
        """When set, endpoints' limits are learned under ``capacity`` (``arena.llm.capacity``)."""
        self.retry_s = retry_s
        self.connect_timeout_s = connect_timeout_s
        self.local = LocalAdmission(capacity, learn_slow_s)
        self._link: _Link | None = None
        self._retry_at = 0.0
        self._falling_back = False
        self._connecting: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def __repr__(self) -> str:
        return f"SharedAdmission({str(self.path)!r}, capacity={self.capacity})"

    @property
    def connected(self) -> bool:
        """True while a connection to the coordinator is open."""
        return self._link is not None and not self._link.closed

    def slot(self, endpoint: str) -> contextlib.AbstractAsyncContextManager[Outcome]:
        return _hold(self.acquire, endpoint)

    async def acquire(self, endpoint: str) -> Release:
        """Wait for a slot of ``endpoint`` (shared, else local); returns the function that frees it."""
        link = await self._connection()
        if link is not None:
            try:
                return await link.acquire(endpoint, self.capacity, self.learn_slow_s)
            except ConnectionError as exc:
                self._lost(link, exc)
            except _Refused as exc:
                log.warning("%s; admitting this request locally", exc)
        return await self.local.acquire(endpoint)

    async def stats(self) -> AdmissionStats | None:
        """The coordinator's stats, or None when it is not reachable."""
        link = await self._connection()
        if link is None:
            return None
        try:
            _, stats = await link.request({"op": "stats"})
        except ConnectionError as exc:
            self._lost(link, exc)
            return None
        except _Refused:
            return None
        return AdmissionStats.model_validate(stats)

    def _lost(self, link: _Link, exc: BaseException) -> None:
        link.close()
        if self._link is link:
            self._link = None
        self._retry_at = time.monotonic() + self.retry_s
        self._fall_back(exc)

    def _fall_back(self, exc: BaseException) -> None:
        if self._falling_back:
            return
        self._falling_back = True
        level = logging.INFO if isinstance(exc, FileNotFoundError) else logging.WARNING
        log.log(
            level,
            "admission coordinator not reachable at %s (%s); limiting LLM requests in this process "
            "alone (%d per endpoint) until it is",
            self.path,
            exc,
            self.capacity,
        )

    def _lock(self, loop: asyncio.AbstractEventLoop) -> asyncio.Lock:
        if self._connecting is None or self._connecting[0] is not loop:
            self._connecting = (loop, asyncio.Lock())
        return self._connecting[1]

    async def _connection(self) -> _Link | None:
        loop = asyncio.get_running_loop()
        link = self._link
        if link is not None and link.loop is loop and not link.closed:
            return link
        if link is not None:
            link.close()  # broken, or left by an earlier event loop
            self._link = None
        if time.monotonic() < self._retry_at:
            return None
        async with self._lock(loop):
            link = self._link
            if link is not None and link.loop is loop and not link.closed:
                return link
            if time.monotonic() < self._retry_at:
                return None
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    reader, writer = await asyncio.open_unix_connection(str(self.path))
            except (OSError, TimeoutError) as exc:
                self._retry_at = time.monotonic() + self.retry_s
                self._fall_back(exc)
                return None
            self._link = _Link(reader, writer)
            if self._falling_back:
                log.info("admission coordinator at %s reachable again; sharing its limits", self.path)
                self._falling_back = False
            return self._link


def socket_path(settings: ArenaSettings) -> Path:
    """Where the coordinator listens: ``$ARENA_HOME/run/admission.sock``."""
    return settings.home / "run" / SOCKET_NAME


def lock_path(settings: ArenaSettings) -> Path:
    """The file whose ``flock`` elects the coordinator's host: ``$ARENA_HOME/run/admission.lock``."""
    return settings.home / "run" / LOCK_NAME


_SHARED: dict[tuple[Path, int, float | None], SharedAdmission] = {}
_SHARED_LOCK = threading.Lock()


def learn_slow_s(settings: ArenaSettings) -> float | None:
    """How slow a request must be for a queue at the server to matter, when learning capacity:
    a tenth of the request timeout (None: ``llm_learn_capacity`` is off)."""
    return settings.llm_timeout_s / 10 if settings.llm_learn_capacity else None


def admission_for(settings: ArenaSettings, capacity: int | None = None) -> SharedAdmission:
    """The process-wide admission of ``settings``' home (capacity ``llm_concurrency`` unless given;
    limits learned from latency under it unless ``llm_learn_capacity`` is off)."""
    key = (
        socket_path(settings),
        capacity if capacity is not None else settings.llm_concurrency,
        learn_slow_s(settings),
    )
    with _SHARED_LOCK:
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED[key] = SharedAdmission(key[0], key[1], learn_slow_s=key[2])
        return shared

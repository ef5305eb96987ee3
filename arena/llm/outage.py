"""An endpoint that stopped answering is not a record's fault: wait for it, never dead-letter.

The gateway reports to an ``EndpointHealth`` when a call's attempts all ended in transport
failures (refused connections, timeouts, HTTP 429/5xx) or the endpoint refused the request
whatever its content (``EndpointRejected``: HTTP 401/403/404). From then on every call waits
(``wait_up``) instead of spending its attempts, one task probes the endpoint with backoff
(``first_probe_s`` doubling to ``max_probe_s``), and the first successful probe lets every
waiting call go on. A stage worker therefore pauses without committing anything and resumes by
itself; its records are never dead-lettered for the endpoint's sake.

A request that fails while the endpoint serves others is the request's fault, not an outage: the
gateway counts those rounds per call and dead-letters the record after a bounded number
(``Gateway.call``), so one poison request cannot stall a stage forever.

``EndpointState`` is what a worker publishes about it (``on_change``): ``arena status`` and
``arena lag`` show a stage as waiting on its endpoint, and the supervisor reports an endpoint
that rejects the credentials once, clearly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from arena.llm.core import EndpointRejected

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[None]]
"""Raises when the endpoint does not serve (any exception); returns when it does."""


class EndpointState(BaseModel):
    """What one process knows about its LLM endpoint."""

    endpoint: Annotated[str, Field(description="Endpoint as shown to users (no credentials).")]
    state: Annotated[Literal["up", "waiting"], Field(description="'waiting': calls wait for the endpoint.")]
    reason: Annotated[str, Field(description="Why it is waiting (the last failure), empty when up.")] = ""
    rejected: Annotated[
        bool, Field(description="The endpoint refused the request itself (credentials, URL, model name).")
    ] = False
    status: Annotated[
        int | None, Field(description="HTTP status of the last failure, when there was one.")
    ] = None
    since: Annotated[datetime, Field(description="When the state began (UTC).")]
    stage: Annotated[str, Field(description="Stage of the process ('-' outside a stage worker).")] = "-"
    pid: Annotated[int, Field(description="Process id of the worker.")] = 0


class EndpointHealth:
    """Up or waiting, for one endpoint in one process; the waiting side probes until it answers."""

    def __init__(
        self,
        endpoint: str,
        probe: Probe | None,
        *,
        first_probe_s: float = 1.0,
        max_probe_s: float = 10.0,
        on_change: Callable[[EndpointState], None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._probe = probe
        self.first_probe_s = first_probe_s
        self.max_probe_s = max_probe_s
        self._on_change = on_change
        self._up = asyncio.Event()
        self._up.set()
        self._prober: asyncio.Task[None] | None = None
        self.successes = 0
        """Requests the endpoint served (a call that fails while this grows is the request's fault)."""
        self.outages = 0
        self.state = EndpointState(endpoint=endpoint, state="up", since=datetime.now(UTC))

    @property
    def up(self) -> bool:
        return self._up.is_set()

    @property
    def can_wait(self) -> bool:
        """Whether this endpoint can be waited for (it has a probe: a remote server)."""
        return self._probe is not None

    def served(self) -> None:
        """Count one request the endpoint answered."""
        self.successes += 1

    async def wait_up(self) -> None:
        """Return once the endpoint is up (at once when it is)."""
        if not self._up.is_set():
            await self._up.wait()

    def report(self, reason: str, *, stage: str = "-", error: BaseException | None = None) -> None:
        """The endpoint failed a call: mark it waiting (logged once per outage) and start probing."""
        if not self.can_wait:
            return
        rejected = isinstance(error, EndpointRejected)
        status = error.status if isinstance(error, EndpointRejected) else None
        if self._up.is_set():
            self._up.clear()
            self.outages += 1
            log.error(
                "LLM endpoint %s is not serving: %s; calls wait and it is probed until it answers",
                self.endpoint,
                reason,
            )
        self._publish(
            EndpointState(
                endpoint=self.endpoint,
                state="waiting",
                reason=reason[:500],
                rejected=rejected,
                status=status,
                since=self.state.since if self.state.state == "waiting" else datetime.now(UTC),
                stage=stage,
            )
        )
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_until_up(), name=f"probe {self.endpoint}")

    async def _probe_until_up(self) -> None:
        assert self._probe is not None
        delay = self.first_probe_s
        started = time.monotonic()
        while True:
            await asyncio.sleep(delay)
            try:
                await self._probe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # still down: say why, wait longer
                self._publish(
                    self.state.model_copy(
                        update={
                            "reason": f"{type(exc).__name__}: {exc}"[:500],
                            "rejected": isinstance(exc, EndpointRejected),
                            "status": exc.status if isinstance(exc, EndpointRejected) else None,
                        }
                    )
                )
                delay = min(self.max_probe_s, delay * 2)
                continue
            log.warning(
                "LLM endpoint %s answers again after %.0fs; resuming",
                self.endpoint,
                time.monotonic() - started,
            )
            self._publish(
                EndpointState(
                    endpoint=self.endpoint, state="up", since=datetime.now(UTC), stage=self.state.stage
                )
            )
            self._up.set()
            return

    def _publish(self, state: EndpointState) -> None:
        self.state = state
        if self._on_change is not None:
            try:
                self._on_change(state)
            except OSError as exc:  # a status file that cannot be written must not stop the calls
                log.warning("could not publish the endpoint state: %s", exc)

    async def aclose(self) -> None:
        if self._prober is not None and not self._prober.done():
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober


STATE_DIR = Path("run") / "llm-endpoints"
"""Under ``$ARENA_HOME``: one ``<pid>.json`` per worker process whose endpoint state is known."""


def state_writer(home: Path, endpoint: int = 0) -> Callable[[EndpointState], None]:
    """An ``on_change`` that writes the state to ``$ARENA_HOME/run/llm-endpoints/<pid>.json`` atomically
    (``<pid>-<endpoint>.json`` for a process's further endpoints, e.g. a judge's own model)."""
    folder = home / STATE_DIR

    def write(state: EndpointState) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        name = f"{pid}.json" if endpoint == 0 else f"{pid}-{endpoint}.json"
        target = folder / name
        temp = folder / f".{name}.tmp"
        temp.write_text(state.model_copy(update={"pid": pid}).model_dump_json())
        temp.replace(target)

    return write


def read_states(home: Path) -> list[EndpointState]:
    """The endpoint states of live processes (files of dead ones are removed), by stage."""
    folder = home / STATE_DIR
    states: list[EndpointState] = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            state = EndpointState.model_validate_json(path.read_text())
        except (OSError, ValueError):
            continue
        if not _alive(state.pid):
            path.unlink(missing_ok=True)
            continue
        states.append(state)
    return sorted(states, key=lambda s: (s.stage, s.pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

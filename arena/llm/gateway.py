"""The LLM gateway: the one place stages call an LLM role through.

``await gateway.call(ROLE, inputs)`` renders the role's prompt, asks the backend, extracts and
validates the JSON answer against the role's output model, retries, caches valid answers and
counts usage per role. The role's prompt is registered in the catalog once per gateway, so the
``prompt_version`` in every answer (and in lineage) names a catalog row.

Retries, up to ``max_attempts`` backend requests per call:

* ``TransientError`` (HTTP 429/5xx, connection errors) and timeouts: exponential backoff with
  jitter (at least the server's ``Retry-After`` when it sent a small one), then retry;
* text that is not JSON, fails validation, or a rule raising ``Undecidable``: retry at once
  with ``attempt + 1`` (backends reseed by it);
* ``EndpointRejected`` (HTTP 401/403/404: credentials, URL, model name): no retry;
* anything else (``BackendError`` such as HTTP 400, a missing rule) propagates at once.

An endpoint that stops serving is not the record's fault (``arena.llm.outage``): when a call's
attempts all ended in transport failures, or the endpoint rejected the request itself, the
endpoint is marked waiting and the call (with every other call) waits until a probe finds the
endpoint serving again, then starts over; nothing is dead-lettered for it. A call that keeps
failing while the endpoint serves other calls is the request's fault: after ``max_attempts`` such
rounds it raises ``InvalidOutput``. Backends without a probe (in-process ones) never wait.

When every attempt failed the call raises ``InvalidOutput`` with the last raw text. Only valid
answers are cached, and an identical call made while one is in flight (same cache key) waits for
that call's answer instead of sending the same request again. ``Answer.usage`` is the tokens every
attempt of the call spent (for a cache hit: what producing the cached answer spent); the gateway's
counters count only tokens spent by this process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from pydantic import BaseModel, Field, ValidationError

from arena.hashing import content_hash
from arena.llm.cache import ResponseCache
from arena.llm.core import (
    CALLER,
    Answer,
    Backend,
    CompletionRequest,
    EndpointRejected,
    In,
    InvalidOutput,
    Out,
    Role,
    Sampling,
    TransientError,
    Undecidable,
    Usage,
)
from arena.llm.outage import EndpointHealth, EndpointState, state_writer

if TYPE_CHECKING:
    from arena.config import ArenaSettings

log = logging.getLogger(__name__)

CACHE_FILE = "llm-cache.db"
MAX_JSON_CANDIDATES = 64
"""Opening braces tried when looking for the first JSON object in a reply."""


class NoJsonObject(ValueError):
    """A reply holds no parseable JSON object."""


def extract_json(text: str) -> dict[str, Any]:
    """The first JSON object in ``text``: tolerates ```json fences and prose around it."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    tried = 0
    while start != -1 and tried < MAX_JSON_CANDIDATES:
        tried += 1
        try:
            value, _end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    raise NoJsonObject("no JSON object in the reply")


def parse_output(role: Role[Any, Out], text: str) -> Out:
    """Extract and validate ``role``'s output from a reply; raises NoJsonObject or ValidationError."""
    return role.output.model_validate(extract_json(text))


def cache_key(role: Role[Any, Any], inputs: BaseModel, backend: str, model: str, sampling: Sampling) -> str:
    """Content hash of everything that determines an answer.

    The output schema is part of it besides the prompt version (which hashes only the prompt
    text): changing a role's output model must not serve answers shaped for the old one.
    """
    return content_hash(
        {
            "role": role.name,
            "prompt_version": role.version,
            "output_schema": role.output_schema(),
            "inputs": inputs.model_dump(mode="json"),
            "backend": backend,
            "model": model,
            "sampling": sampling.model_dump(mode="json"),
        },
        prefix="llm-",
    )


def _validation_summary(exc: ValidationError, limit: int = 5) -> str:
    parts = [f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()]
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


class RoleUsage(BaseModel):
    """What one role cost this process."""

    calls: Annotated[int, Field(ge=0, description="gateway.call invocations (cache hits included).")] = 0
    cache_hits: Annotated[int, Field(ge=0, description="Calls answered from the cache.")] = 0
    shared: Annotated[
        int, Field(ge=0, description="Calls answered by an identical call that was already in flight.")
    ] = 0
    attempts: Annotated[int, Field(ge=0, description="Backend requests made.")] = 0
    retries: Annotated[int, Field(ge=0, description="Backend requests beyond the first of a call.")] = 0
    transient_errors: Annotated[
        int, Field(ge=0, description="Attempts that failed with a transient error or timeout.")
    ] = 0
    invalid_outputs: Annotated[
        int, Field(ge=0, description="Attempts whose reply was not valid JSON for the role, or undecidable.")
    ] = 0
    failures: Annotated[
        int, Field(ge=0, description="Calls that raised (InvalidOutput or a non-retryable error).")
    ] = 0
    endpoint_waits: Annotated[
        int, Field(ge=0, description="Times a call waited for its endpoint to serve again (an outage).")
    ] = 0
    prompt_tokens: Annotated[int, Field(ge=0, description="Prompt tokens spent (cache hits spend none).")] = 0
    completion_tokens: Annotated[int, Field(ge=0, description="Completion tokens spent.")] = 0

    def plus(self, other: RoleUsage) -> RoleUsage:
        """Field-wise sum."""
        return RoleUsage(
            **{name: getattr(self, name) + getattr(other, name) for name in RoleUsage.model_fields}
        )


class GatewayUsage(BaseModel):
    """A snapshot of a gateway's usage counters."""

    backend: Annotated[str, Field(description="Backend kind, e.g. 'openai'.")]
    model: Annotated[str, Field(description="Model id as recorded in lineage.")]
    roles: Annotated[dict[str, RoleUsage], Field(description="Counters per role name (all stages).")]
    stages: Annotated[
        dict[str, dict[str, RoleUsage]],
        Field(default_factory=dict, description="Counters per stage name, then role name (CALLER's stage)."),
    ]

    @property
    def total(self) -> RoleUsage:
        """All roles together."""
        total = RoleUsage()
        for usage in self.roles.values():
            total = total.plus(usage)
        return total


@dataclass
class _Counters:
    """Mutable per-role counters (only touched on the event loop, so no lock)."""

    values: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RoleUsage.model_fields, 0))

    def add(self, **deltas: int) -> None:
        for name, delta in deltas.items():
            self.values[name] += delta


@dataclass
class _Attempts:
    """What the attempts of one call produced so far."""

    errors: list[str] = field(default_factory=list)
    raw: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    unserved: BaseException | None = None
    """Set when the last attempt failed because the endpoint did not serve (not the reply's fault)."""
    answer: Answer[Any] | None = None
    """The valid answer, when an attempt gave one."""

    @property
    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)


class PromptVersionRef(Protocol):
    """A registered prompt version: its id is the content hash of (role, prompt text)."""

    @property
    def id(self) -> str: ...


class PromptCatalog(Protocol):
    """Where the gateway records each role's prompt text once (the SQL catalog, ``lake.catalog``)."""

    def register_prompt(self, role: str, text: str) -> PromptVersionRef:
        """The version of ``role``'s prompt with this exact text, created if new."""
        ...

    def dispose(self) -> None:
        """Release the catalog's connections."""
        ...


def backend_health(
    backend: Backend, on_change: Callable[[EndpointState], None] | None = None
) -> EndpointHealth:
    """The health tracker of ``backend``'s endpoint: it waits out outages when the backend has a
    ``probe`` (remote servers); in-process backends have none and never wait."""
    endpoint = getattr(backend, "endpoint", None) or backend.name
    probe = getattr(backend, "probe", None)
    return EndpointHealth(endpoint, probe, on_change=on_change)


class Gateway:
    """Typed, validated, retried, cached LLM calls on one backend."""

    def __init__(
        self,
        backend: Backend,
        cache: ResponseCache | None = None,
        catalog: PromptCatalog | None = None,
        max_attempts: int = 3,
        seed: int = 0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        health: EndpointHealth | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.backend = backend
        self.health = health if health is not None else backend_health(backend)
        self.cache = cache
        self.catalog = catalog
        self.max_attempts = max_attempts
        self.seed = seed
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._jitter = random.Random(seed)
        self._in_flight: dict[str, asyncio.Future[Any]] = {}
        """Calls being answered, by cache key: an identical call waits for the same answer."""
        self._counters: dict[tuple[str, str], _Counters] = {}
        """Per (stage, role)."""
        self._registered: set[str] = set()
        self._register_lock = asyncio.Lock()
        self._owns_catalog = False

    def __repr__(self) -> str:
        return f"Gateway({self.backend!r}, cache={self.cache!r}, max_attempts={self.max_attempts})"

    @classmethod
    def from_settings(cls, settings: ArenaSettings, catalog: PromptCatalog | None = None) -> Gateway:
        """The gateway ``settings`` describe: backend from ARENA_LLM, cache under home.

        ``catalog`` (``lake.catalog.open_gateway`` passes the SQL catalog) records the prompt versions
        that lineage names; the gateway owns it from then on and disposes of it in ``aclose``.
        """
        from arena.llm.backends import make_backend

        backend = make_backend(settings)
        gateway = cls(
            backend,
            cache=ResponseCache(Path(settings.home) / CACHE_FILE),
            catalog=catalog,
            max_attempts=settings.llm_max_attempts,
            seed=settings.seed,
            health=backend_health(backend, on_change=state_writer(Path(settings.home))),
        )
        gateway._owns_catalog = catalog is not None
        return gateway

    @property
    def usage(self) -> GatewayUsage:
        """A snapshot of the counters per role, and per stage and role."""
        roles: dict[str, RoleUsage] = {}
        stages: dict[str, dict[str, RoleUsage]] = {}
        for (stage, role), counters in sorted(self._counters.items()):
            usage = RoleUsage(**counters.values)
            roles[role] = roles[role].plus(usage) if role in roles else usage
            stages.setdefault(stage, {})[role] = usage
        return GatewayUsage(
            backend=self.backend.name,
            model=self.backend.model,
            roles=dict(sorted(roles.items())),
            stages=stages,
        )

    def _count(self, role: str) -> _Counters:
        return self._counters.setdefault((CALLER.get().stage, role), _Counters())

    async def _register(self, role: Role[Any, Any]) -> None:
        """Record the role's prompt text in the catalog, once per gateway."""
        if self.catalog is None or role.version in self._registered:
            return
        async with self._register_lock:
            if role.version in self._registered:
                return
            registered = await asyncio.to_thread(self.catalog.register_prompt, role.name, role.prompt_text)
            if registered.id != role.version:  # both hash (role, text): a mismatch is a bug
                raise RuntimeError(f"catalog prompt id {registered.id} != role version {role.version}")
            self._registered.add(role.version)

    async def call(self, role: Role[In, Out], inputs: In, sampling: Sampling | None = None) -> Answer[Out]:
        """The validated output of ``role`` for ``inputs``; raises ``InvalidOutput`` when none came."""
        if not isinstance(inputs, role.input):
            raise TypeError(f"role {role.name!r} takes {role.input.__name__}, got {type(inputs).__name__}")
        sampling = sampling if sampling is not None else Sampling(seed=self.seed)
        counters = self._count(role.name)
        counters.add(calls=1)
        try:
            await self._register(role)
            key = cache_key(role, inputs, self.backend.name, self.backend.model, sampling)
            hit = await self._from_cache(role, key)
            if hit is not None:
                counters.add(cache_hits=1)
                return hit
            flight = self._in_flight.get(key)
            if flight is None:
                flight = asyncio.ensure_future(self._served_and_cached(key, role, inputs, sampling, counters))
                self._in_flight[key] = flight
                flight.add_done_callback(lambda done: self._landed(key, done))
            else:
                counters.add(shared=1)
            # Shielded: a caller cancelled (its record was revoked) leaves the request to the others.
            answer: Answer[Out] = await asyncio.shield(flight)
        except Exception:
            counters.add(failures=1)
            raise
        return answer

    def _landed(self, key: str, flight: asyncio.Future[Any]) -> None:
        self._in_flight.pop(key, None)
        if not flight.cancelled():
            flight.exception()  # retrieved: every caller may have been cancelled meanwhile

    async def _served_and_cached(
        self, key: str, role: Role[In, Out], inputs: In, sampling: Sampling, counters: _Counters
    ) -> Answer[Out]:
        answer = await self._served(role, inputs, sampling, counters)
        await self._to_cache(key, answer)
        return answer

    async def _from_cache(self, role: Role[Any, Out], key: str) -> Answer[Out] | None:
        if self.cache is None:
            return None
        try:
            stored = await self.cache.get(key)
        except sqlite3.Error as exc:  # a broken cache must not stop synthesis
            log.warning("LLM cache read failed (%s); asking the backend", exc)
            return None
        if stored is None:
            return None
        try:
            output = parse_output(role, stored.raw)
        except (NoJsonObject, ValidationError):
            return None  # stored under an older output model that validated it: recompute
        return self._answer(role, output, stored.raw, stored.usage, cached=True)

    async def _to_cache(self, key: str, answer: Answer[Any]) -> None:
        if self.cache is None:
            return
        try:
            await self.cache.put(key, answer.role, answer.raw, answer.usage)
        except sqlite3.Error as exc:
            log.warning("LLM cache write failed (%s); the answer is returned uncached", exc)

    def _answer(self, role: Role[Any, Out], output: Out, raw: str, usage: Usage, cached: bool) -> Answer[Out]:
        return Answer(
            output=output,
            role=role.name,
            prompt_version=role.version,
            backend=self.backend.name,
            model=self.backend.model,
            cached=cached,
            usage=usage,
            raw=raw,
        )

    async def _served(
        self, role: Role[In, Out], inputs: In, sampling: Sampling, counters: _Counters
    ) -> Answer[Out]:
        """``_attempts``, waiting out endpoint outages; a request the endpoint alone refuses ends invalid."""
        own_faults: list[str] = []
        while True:
            if not self.health.up:
                counters.add(endpoint_waits=1)
                await self.health.wait_up()
            served_before = self.health.successes
            state = await self._attempts(role, inputs, sampling, counters)
            if state.unserved is None:
                assert state.answer is not None
                return state.answer
            reason = state.errors[-1] if state.errors else str(state.unserved)
            if self.health.successes > served_before and not isinstance(state.unserved, EndpointRejected):
                # The endpoint served other calls meanwhile: this request is what fails.
                own_faults.append(reason)
                if len(own_faults) >= self.max_attempts:
                    raise InvalidOutput(
                        role.name,
                        raw=state.raw,
                        errors=[
                            *state.errors,
                            f"the endpoint failed this request {len(own_faults)} times while serving others",
                        ],
                        attempts=self.max_attempts * len(own_faults),
                    )
            if not self.health.can_wait:
                raise InvalidOutput(role.name, raw=state.raw, errors=state.errors, attempts=self.max_attempts)
            self.health.report(reason, stage=CALLER.get().stage, error=state.unserved)

    async def _attempts(
        self, role: Role[In, Out], inputs: In, sampling: Sampling, counters: _Counters
    ) -> _Attempts:
        """Ask the backend up to ``max_attempts`` times; the first valid output wins.

        Returns the state with ``answer`` set, or with ``unserved`` set when the endpoint did not
        serve the last attempt; raises ``InvalidOutput`` when the replies stayed invalid.
        """
        messages = role.messages(inputs)
        schema = role.output_schema()
        state = _Attempts()
        draw = 0  # replies that came back invalid so far: a transport retry resends the same request
        for attempt in range(self.max_attempts):
            counters.add(attempts=1, retries=1 if attempt else 0)
            request = CompletionRequest(
                role=role,
                inputs=inputs,
                messages=messages,
                json_schema=schema,
                sampling=sampling,
                attempt=draw,
            )
            try:
                completion = await self.backend.complete(request)
            except EndpointRejected as exc:
                counters.add(transient_errors=1)
                state.errors.append(f"attempt {attempt}: endpoint rejected the request: {exc}")
                state.unserved = exc
                return state  # the same request would be rejected again: no retry
            except (TransientError, TimeoutError) as exc:
                counters.add(transient_errors=1)
                state.errors.append(f"attempt {attempt}: transient: {exc or type(exc).__name__}")
                state.unserved = exc
                log.warning("role %s attempt %d: %s", role.name, attempt, state.errors[-1])
                if attempt + 1 < self.max_attempts:
                    await asyncio.sleep(self._backoff(attempt, exc))
                continue
            except Undecidable as exc:
                counters.add(invalid_outputs=1)
                state.errors.append(f"attempt {attempt}: undecidable: {exc}")
                state.unserved = None
                draw += 1
                continue
            self.health.served()
            state.unserved = None
            counters.add(
                prompt_tokens=completion.usage.prompt_tokens,
                completion_tokens=completion.usage.completion_tokens,
            )
            state.raw = completion.text
            state.prompt_tokens += completion.usage.prompt_tokens
            state.completion_tokens += completion.usage.completion_tokens
            try:
                output = parse_output(role, completion.text)
            except NoJsonObject as exc:
                counters.add(invalid_outputs=1)
                state.errors.append(f"attempt {attempt}: {exc}")
                draw += 1
                continue
            except ValidationError as exc:
                counters.add(invalid_outputs=1)
                state.errors.append(f"attempt {attempt}: invalid output: {_validation_summary(exc)}")
                draw += 1
                continue
            state.answer = self._answer(role, output, completion.text, state.usage, cached=False)
            return state
        if state.unserved is not None:
            return state
        log.warning("role %s: no valid output after %d attempt(s)", role.name, self.max_attempts)
        raise InvalidOutput(role.name, raw=state.raw, errors=state.errors, attempts=self.max_attempts)

    def _backoff(self, attempt: int, exc: BaseException) -> float:
        """Exponential backoff with equal jitter; never shorter than a small ``Retry-After``."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        delay = ceiling / 2 + self._jitter.uniform(0, ceiling / 2)
        retry_after = getattr(exc, "retry_after_s", None)
        return max(delay, retry_after) if retry_after is not None else delay

    async def aclose(self) -> None:
        """Close the backend and the cache (and the catalog when ``from_settings`` opened it)."""
        await self.health.aclose()
        await self.backend.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        if self._owns_catalog and self.catalog is not None:
            await asyncio.to_thread(self.catalog.dispose)

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
* anything else (``BackendError`` such as HTTP 401, a missing rule) propagates at once.

When every attempt failed the call raises ``InvalidOutput`` with the last raw text. Only valid
answers are cached. ``Answer.usage`` is the tokens every attempt of the call spent (for a cache
hit: what producing the cached answer spent); the gateway's counters count only tokens spent by
this process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Protocol

from pydantic import BaseModel, Field, ValidationError

from arena.hashing import content_hash
from arena.llm.cache import ResponseCache
from arena.llm.core import (
    Answer,
    Backend,
    CompletionRequest,
    In,
    InvalidOutput,
    Out,
    Role,
    Sampling,
    TransientError,
    Undecidable,
    Usage,
)

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
    roles: Annotated[dict[str, RoleUsage], Field(description="Counters per role name.")]

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
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.backend = backend
        self.cache = cache
        self.catalog = catalog
        self.max_attempts = max_attempts
        self.seed = seed
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._jitter = random.Random(seed)
        self._counters: dict[str, _Counters] = {}
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

        gateway = cls(
            make_backend(settings),
            cache=ResponseCache(Path(settings.home) / CACHE_FILE),
            catalog=catalog,
            max_attempts=settings.llm_max_attempts,
            seed=settings.seed,
        )
        gateway._owns_catalog = catalog is not None
        return gateway

    @property
    def usage(self) -> GatewayUsage:
        """A snapshot of the counters per role."""
        return GatewayUsage(
            backend=self.backend.name,
            model=self.backend.model,
            roles={name: RoleUsage(**c.values) for name, c in sorted(self._counters.items())},
        )

    def _count(self, role: str) -> _Counters:
        return self._counters.setdefault(role, _Counters())

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
            answer = await self._attempts(role, inputs, sampling, counters)
        except Exception:
            counters.add(failures=1)
            raise
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

    async def _attempts(
        self, role: Role[In, Out], inputs: In, sampling: Sampling, counters: _Counters
    ) -> Answer[Out]:
        """Ask the backend up to ``max_attempts`` times; the first valid output wins."""
        messages = role.messages(inputs)
        schema = role.output_schema()
        state = _Attempts()
        for attempt in range(self.max_attempts):
            counters.add(attempts=1, retries=1 if attempt else 0)
            request = CompletionRequest(
                role=role,
                inputs=inputs,
                messages=messages,
                json_schema=schema,
                sampling=sampling,
                attempt=attempt,
            )
            try:
                completion = await self.backend.complete(request)
            except (TransientError, TimeoutError) as exc:
                counters.add(transient_errors=1)
                state.errors.append(f"attempt {attempt}: transient: {exc or type(exc).__name__}")
                log.warning("role %s attempt %d: %s", role.name, attempt, state.errors[-1])
                if attempt + 1 < self.max_attempts:
                    await asyncio.sleep(self._backoff(attempt, exc))
                continue
            except Undecidable as exc:
                counters.add(invalid_outputs=1)
                state.errors.append(f"attempt {attempt}: undecidable: {exc}")
                continue
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
                continue
            except ValidationError as exc:
                counters.add(invalid_outputs=1)
                state.errors.append(f"attempt {attempt}: invalid output: {_validation_summary(exc)}")
                continue
            return self._answer(role, output, completion.text, state.usage, cached=False)
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
        await self.backend.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        if self._owns_catalog and self.catalog is not None:
            await asyncio.to_thread(self.catalog.dispose)

"""The LLM gateway: the one place stages call an LLM role through.

``await gateway.call(ROLE, inputs)`` renders the role's prompt, asks the backend, extracts and
validates the JSON answer against the role's output model, retries, caches valid answers and
counts usage per role. The role's prompt is registered in the catalog once per gateway, so the
``prompt_version`` in every answer (and in lineage) names a catalog row.

Each role has a route (``arena.llm.routing``): its sampling, its endpoint and that endpoint's
context window. Before asking, the gateway fits the input to the window (``arena.llm.fitting``;
what was cut stays on the answer) and sends a long prompt with the reply room left.

Replies are read as real models write them (``read_reply``, ``arena.llm.replies``): reasoning
set apart and kept on the answer, the role's JSON chosen by its schema, an agent role's native or
Hermes tool calls. Retries, up to ``max_attempts`` backend requests per call:

* ``TransientError`` (HTTP 429/5xx, connection errors) and timeouts: exponential backoff with
  jitter (at least the server's ``Retry-After`` when it sent a small one), then the same request;
* a reply cut at ``finish_reason=length``: asked again with twice the ``max_tokens``;
* a reply that is not valid for the role: asked again with the reply and the validation error
  fed back; an empty reply, a refusal or a rule raising ``Undecidable``: asked again. Each of
  these counts ``attempt + 1`` (backends reseed by it);
* ``EndpointRejected`` (HTTP 401/403/404: credentials, URL, model name): no retry;
* anything else (``BackendError`` such as HTTP 400, a missing rule) propagates at once.

An endpoint that stops serving is not the record's fault (``arena.llm.outage``): when a call's
attempts all ended in transport failures, or the endpoint rejected the request itself, the
endpoint is marked waiting and the call (with every other call) waits until a probe finds the
endpoint serving again, then starts over; nothing is dead-lettered for it. A call that keeps
failing while the endpoint serves other calls is the request's fault: after ``max_attempts`` such
rounds it raises ``InvalidOutput``, and so does a call the endpoint answers with the same HTTP
500 every time a probe has found it up again (``_Recurring``: a request the server cannot serve,
not an outage). Backends without a probe (in-process ones) never wait.

When every attempt failed the call raises ``InvalidOutput`` with the last raw text. Only valid
answers are cached, and an identical call made while one is in flight (same cache key) waits for
that call's answer instead of sending the same request again. ``Answer.usage`` is the tokens every
attempt of the call spent (for a cache hit: what producing the cached answer spent); the gateway's
counters count only tokens spent by this process.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Generic, Protocol

from pydantic import BaseModel, Field, ValidationError

from arena import metrics
from arena.hashing import content_hash
from arena.llm.budget import MIN_REPLY_TOKENS, TEMPLATE_MARGIN_TOKENS, ContextBudget, prompt_tokens
from arena.llm.cache import ResponseCache
from arena.llm.core import (
    CALLER,
    Answer,
    Backend,
    Completion,
    CompletionRequest,
    ContextOverflow,
    EndpointRejected,
    In,
    InvalidOutput,
    Out,
    Role,
    Sampling,
    TransientError,
    Undecidable,
    Usage,
    read_prompt_files,
    with_prompt,
)
from arena.llm.fitting import fit_inputs
from arena.llm.outage import EndpointHealth, EndpointState, state_writer
from arena.llm.replies import (
    NoJsonObject,
    Reply,
    ReplyInvalid,
    as_text,
    choose_output,
    split_reasoning,
    text_tool_calls,
    unusable_reason,
)
from arena.llm.routing import RoleRoute, route_of

if TYPE_CHECKING:
    from arena.config import ArenaSettings

log = logging.getLogger(__name__)

CACHE_FILE = "llm-cache.db"
FEEDBACK_PREFIX = "That reply could not be used: "
"""How the gateway's note on an unusable reply opens (a server can tell feedback from the input)."""
FEEDBACK_EXCERPT = 2000
"""Characters of an invalid reply quoted back to the model with the validation error."""


class PromptTooLong(InvalidOutput):
    """The rendered prompt does not fit the role's context budget: refused before it is sent, or
    by the server, whose own tokenizer counted it over the window."""


class _CountedLonger(PromptTooLong):
    """The server counted the prompt longer than its window (it was sent, and refused): the call
    fits its inputs again once with the endpoint's scale that the refusal taught."""


MAX_PROMPT_SCALE = 3.0
"""Most prompt tokens per estimated token an endpoint may be taken to count (a bound on bad data)."""
SCALE_FROM_TOKENS = 512
"""Served prompts this long (estimated) teach the endpoint's scale; shorter ones are mostly template."""


@dataclass(frozen=True)
class ParsedReply(Generic[Out]):
    """A role output read from a reply, with what the reply carried besides."""

    output: Out
    reasoning: str
    raw: str
    """The reply as text: reasoning as ``<think>``, native tool calls as ``<tool_call>`` blocks."""
    repairs: tuple[str, ...] = ()
    """What reading it took besides parsing (``RoleUsage`` counters): ``reasoning_stripped``,
    ``json_unwrapped`` (prose or a fence around the object), ``text_tool_calls``."""


def _unwrapped(visible: str) -> tuple[str, ...]:
    text = visible.strip()
    return () if text.startswith("{") and text.endswith("}") else ("json_unwrapped",)


def _raw_text(completion: Completion, reply: Reply) -> str:
    think = f"<think>{reply.reasoning}</think>\n" if reply.reasoning else ""
    return think + reply.visible + as_text(completion.tool_calls)


def read_reply(
    role: Role[Any, Out], completion: Completion, offered: set[str] | None = None
) -> ParsedReply[Out]:
    """``role``'s output from ``completion``; raises ``NoJsonObject``, ``ReplyInvalid`` or
    ``Unusable`` (empty reply, refusal) with the reason.

    Reasoning is set apart first and never parsed. An agent role's output comes from its native
    tool calls, else tool calls written as text, else a JSON object of its output model (what the
    rules simulator and JSON-speaking models send), else the visible text as a plain answer.
    """
    reply = split_reasoning(completion.text, completion.reasoning)
    raw = _raw_text(completion, reply)
    reason = (
        None
        if completion.tool_calls
        else unusable_reason(
            reply.visible, completion.refusal, reply.reasoning, prose_refusal=role.agent is None
        )
    )
    if reason is not None:
        raise Unusable(reason)
    stripped: tuple[str, ...] = (
        ("reasoning_stripped",) if reply.reasoning and not completion.reasoning else ()
    )
    if role.agent is None:
        output = choose_output(role.output, reply.visible)
        return ParsedReply(output, reply.reasoning, raw, stripped + _unwrapped(reply.visible))
    broken = [c for c in completion.tool_calls if c.error]
    if broken:
        raise ReplyInvalid(f"tool call {broken[0].name!r}: {broken[0].error}")
    calls, rest = list(completion.tool_calls), reply.visible
    if not calls:
        calls, rest = text_tool_calls(reply.visible, offered or set())
        stripped += ("text_tool_calls",) if calls else ()
    if not calls:
        try:
            output = choose_output(role.output, reply.visible)
            return ParsedReply(output, reply.reasoning, raw, stripped + _unwrapped(reply.visible))
        except (NoJsonObject, ReplyInvalid):
            pass  # plain text: the agent's answer or message
    try:
        agent_output = role.agent.reply(rest, calls)
    except ValidationError as exc:
        raise ReplyInvalid(f"invalid reply: {_validation_summary(exc)}") from None
    except ValueError as exc:
        raise ReplyInvalid(f"invalid reply: {exc}") from None
    return ParsedReply(agent_output, reply.reasoning, raw, stripped)


def parse_output(role: Role[Any, Out], text: str) -> Out:
    """``role``'s output from a reply text (see ``read_reply``)."""
    return read_reply(role, Completion(text=text)).output


class Unusable(ValueError):
    """A reply that is empty or a refusal."""


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
    cut_off: Annotated[
        int, Field(ge=0, description="Attempts whose reply was cut at max_tokens (finish_reason=length).")
    ] = 0
    refusals: Annotated[int, Field(ge=0, description="Attempts whose reply was empty or a refusal.")] = 0
    reasoning_stripped: Annotated[
        int, Field(ge=0, description="Valid replies with a think block in the text, set apart.")
    ] = 0
    json_unwrapped: Annotated[
        int, Field(ge=0, description="Valid replies whose JSON object came wrapped in prose or a fence.")
    ] = 0
    text_tool_calls: Annotated[
        int, Field(ge=0, description="Valid agent replies whose tool calls were written as text (Hermes).")
    ] = 0
    inputs_fitted: Annotated[
        int, Field(ge=0, description="Calls whose input was compacted to fit the context budget.")
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


# An HTTP status a server answers with when it failed this one request; the others (429, 502-504,
# 408, 425) say it is busy or cannot reach its upstream, which waiting does fix.
_REQUEST_FAILED_STATUS = frozenset({500, 501})


@dataclass
class _Recurring:
    """Rounds of one call that failed with the same server-answered error right after a probe found
    the endpoint up again (an error that waiting does not fix)."""

    count: int = 0
    signature: str = ""

    def again(self, error: BaseException | None, recovered: bool) -> int:
        status = getattr(error, "status", None)
        if not isinstance(error, TransientError) or status not in _REQUEST_FAILED_STATUS:
            self.count, self.signature = 0, ""
            return 0
        signature = re.sub(r"\d+", "#", str(error))  # ids and timings vary; the refusal does not
        if recovered and signature == self.signature:
            self.count += 1
        elif signature != self.signature:
            self.count = 0
        self.signature = signature
        return self.count


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


@dataclass(frozen=True)
class _Call:
    """One call being answered: what is asked, how, and where."""

    role: Role[Any, Any]
    inputs: BaseModel
    sampling: Sampling
    counters: _Counters
    endpoint: Endpoint
    route: RoleRoute | None


@dataclass(frozen=True)
class _Prompt:
    """A call's rendered prompt: what every attempt sends before any feedback."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    schema: dict[str, Any]
    tokens: int
    """Estimated prompt tokens of messages and tools."""

    def estimate(self, feedback: list[dict[str, Any]]) -> int:
        """Estimated prompt tokens of an attempt that sends this prompt plus ``feedback``."""
        return self.tokens + (prompt_tokens(feedback) if feedback else 0)

    @classmethod
    def of(cls, call: _Call) -> _Prompt:
        messages, tools = call.role.messages(call.inputs), call.role.tools(call.inputs)
        return cls(messages, tools, call.role.schema_for(call.inputs), prompt_tokens(messages, tools))


def _feedback(reply: str, error: str) -> list[dict[str, Any]]:
    """The messages that show the model its unusable reply and why, before it answers again."""
    excerpt = reply if len(reply) <= FEEDBACK_EXCERPT else reply[:FEEDBACK_EXCERPT] + " ..."
    return [
        {"role": "assistant", "content": excerpt},
        {
            "role": "user",
            "content": f"{FEEDBACK_PREFIX}{error}. Answer again, following the required "
            "output format exactly.",
        },
    ]


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


@dataclass
class Endpoint:
    """One model server (or in-process backend) and its health."""

    backend: Backend
    health: EndpointHealth
    prompt_scale: float = 1.0
    """Prompt tokens its tokenizer counts per estimated token (``arena.llm.budget``): learned from
    its usage and context-window refusals, never below 1, so budgets follow its real count."""

    def learn_scale(self, counted: int, estimated: int) -> bool:
        """Raise ``prompt_scale`` to ``counted / estimated`` if that is more; whether it grew."""
        if counted <= 0 or estimated <= 0:
            return False
        scale = min(MAX_PROMPT_SCALE, counted / estimated)
        if scale <= self.prompt_scale * 1.01:
            return False
        log.info(
            "%s counts %.2f prompt tokens per estimated one; context budgets follow its count",
            self.health.endpoint,
            scale,
        )
        self.prompt_scale = scale
        return True


class Gateway:
    """Typed, validated, retried, cached LLM calls, each role on its endpoint with its sampling."""

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
        routes: Callable[[str], RoleRoute] | None = None,
        endpoints: dict[str, Endpoint] | None = None,
        prompts: Mapping[str, str] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.backend = backend
        self.health = health if health is not None else backend_health(backend)
        self.routes = routes
        """Role name -> route (sampling, endpoint, context window); None: every role samples
        ``Sampling(seed=seed)`` on ``backend`` with no context check."""
        self.endpoints: dict[str, Endpoint] = dict(endpoints or {})
        """Further endpoints by their ARENA_LLM form (a route naming another ``llm``)."""
        self._default = Endpoint(backend, self.health)
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
        self.prompts: dict[str, str] = dict(prompts or {})
        """Role name -> prompt text that replaces the role's own (``with_prompt``)."""

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
        endpoints: dict[str, Endpoint] = {}
        for url in sorted({e.llm for e in settings.llm_roles.values() if e.llm and e.llm != settings.llm}):
            other = make_backend(settings.model_copy(update={"llm": url}))
            writer = state_writer(Path(settings.home), endpoint=len(endpoints) + 1)
            endpoints[url] = Endpoint(other, backend_health(other, on_change=writer))
        gateway = cls(
            backend,
            cache=ResponseCache(Path(settings.home) / CACHE_FILE),
            catalog=catalog,
            max_attempts=settings.llm_max_attempts,
            seed=settings.seed,
            health=backend_health(backend, on_change=state_writer(Path(settings.home))),
            routes=lambda role: route_of(settings, role),
            endpoints=endpoints,
            prompts=read_prompt_files(settings.llm_prompt_files),
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
        if role.name in self.prompts:
            role = with_prompt(role, self.prompts[role.name])
        route = self.routes(role.name) if self.routes is not None else None
        sampling = self._sampling(route, sampling)
        endpoint = self._endpoint(route)
        counters = self._count(role.name)
        counters.add(calls=1)
        try:
            return await self._fitted_call(role, inputs, sampling, route, endpoint, counters)
        except _CountedLonger:
            pass  # the server's refusal taught the endpoint's real count: fit and ask once more
        try:
            return await self._fitted_call(role, inputs, sampling, route, endpoint, counters)
        except _CountedLonger:
            counters.add(failures=1)
            raise

    async def _fitted_call(
        self,
        role: Role[In, Out],
        inputs: In,
        sampling: Sampling,
        route: RoleRoute | None,
        endpoint: Endpoint,
        counters: _Counters,
    ) -> Answer[Out]:
        """``call`` with ``inputs`` fitted to the route's budget at the endpoint's current scale."""
        cut: list[str] = []
        if route is not None:
            budget = ContextBudget(route.context_tokens, sampling.max_tokens, endpoint.prompt_scale)
            fit = await asyncio.to_thread(fit_inputs, role, inputs, budget)
            inputs, cut = fit.inputs, fit.cut  # type: ignore[assignment]  # the same input model, compacted
            if cut:
                counters.add(inputs_fitted=1)
                log.debug("role %s: input fitted to its context budget: %s", role.name, "; ".join(cut))
        try:
            await self._register(role)
            key = cache_key(role, inputs, endpoint.backend.name, endpoint.backend.model, sampling)
            hit = await self._from_cache(role, key, endpoint)
            if hit is not None:
                counters.add(cache_hits=1)
                metrics.LLM_CACHE_HITS.labels(role.name).inc()
                return hit
            flight = self._in_flight.get(key)
            if flight is None:
                call = _Call(role, inputs, sampling, counters, endpoint, route)
                flight = asyncio.ensure_future(self._served_and_cached(key, call))
                self._in_flight[key] = flight
                flight.add_done_callback(lambda done: self._landed(key, done))
            else:
                counters.add(shared=1)
            # Shielded: a caller cancelled (its record was revoked) leaves the request to the others.
            answer: Answer[Out] = await asyncio.shield(flight)
        except _CountedLonger:
            raise  # fitted again by ``call``
        except Exception:
            counters.add(failures=1)
            raise
        return replace(answer, cut=cut) if cut else answer

    def _sampling(self, route: RoleRoute | None, given: Sampling | None) -> Sampling:
        """The route's sampling (or the seed default), with the fields the caller set on top."""
        base = route.sampling if route is not None else Sampling(seed=self.seed)
        if given is None:
            return base
        return base.model_copy(update={name: getattr(given, name) for name in given.model_fields_set})

    def _endpoint(self, route: RoleRoute | None) -> Endpoint:
        if route is None or route.llm not in self.endpoints:
            return self._default
        return self.endpoints[route.llm]

    def _landed(self, key: str, flight: asyncio.Future[Any]) -> None:
        self._in_flight.pop(key, None)
        if not flight.cancelled():
            flight.exception()  # retrieved: every caller may have been cancelled meanwhile

    async def _served_and_cached(self, key: str, call: _Call) -> Answer[Any]:
        answer = await self._served(call)
        await self._to_cache(key, answer)
        return answer

    async def _from_cache(self, role: Role[Any, Out], key: str, endpoint: Endpoint) -> Answer[Out] | None:
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
            # Stored native calls are <tool_call> text, read whatever tools are offered.
            parsed = read_reply(role, Completion(text=stored.raw))
        except (NoJsonObject, ReplyInvalid, Unusable):
            return None  # stored under an older output model that validated it: recompute
        return self._answer(role, parsed, stored.usage, endpoint, cached=True)

    async def _to_cache(self, key: str, answer: Answer[Any]) -> None:
        if self.cache is None:
            return
        try:
            await self.cache.put(key, answer.role, answer.raw, answer.usage)
        except sqlite3.Error as exc:
            log.warning("LLM cache write failed (%s); the answer is returned uncached", exc)

    def _answer(
        self, role: Role[Any, Out], parsed: ParsedReply[Out], usage: Usage, endpoint: Endpoint, cached: bool
    ) -> Answer[Out]:
        return Answer(
            output=parsed.output,
            role=role.name,
            prompt_version=role.version,
            backend=endpoint.backend.name,
            model=endpoint.backend.model,
            cached=cached,
            usage=usage,
            raw=parsed.raw,
            reasoning=parsed.reasoning,
        )

    async def _served(self, call: _Call) -> Answer[Any]:
        """``_attempts``, waiting out endpoint outages; a request the endpoint alone refuses ends invalid."""
        health = call.endpoint.health
        own_faults: list[str] = []
        recurring = _Recurring()
        while True:
            recovered = False
            if not health.up:
                call.counters.add(endpoint_waits=1)
                await health.wait_up()
                recovered = True
            served_before = health.successes
            state = await self._attempts(call)
            if state.unserved is None:
                assert state.answer is not None
                return state.answer
            reason = state.errors[-1] if state.errors else str(state.unserved)
            if health.successes > served_before and not isinstance(state.unserved, EndpointRejected):
                # The endpoint served other calls meanwhile: this request is what fails.
                own_faults.append(reason)
                if len(own_faults) >= self.max_attempts:
                    raise InvalidOutput(
                        call.role.name,
                        raw=state.raw,
                        errors=[
                            *state.errors,
                            f"the endpoint failed this request {len(own_faults)} times while serving others",
                        ],
                        attempts=self.max_attempts * len(own_faults),
                    )
            elif recurring.again(state.unserved, recovered) >= self.max_attempts:
                # Nothing else was served either, yet the probe finds the endpoint up each time and
                # it answers this request with the same error: the request, not an outage.
                raise InvalidOutput(
                    call.role.name,
                    raw=state.raw,
                    errors=[
                        *state.errors,
                        f"the endpoint answered its health probe {recurring.count} times, then failed this "
                        f"request the same way each time: {state.unserved}",
                    ],
                    attempts=self.max_attempts * (recurring.count + 1),
                )
            if not health.can_wait:
                raise InvalidOutput(
                    call.role.name, raw=state.raw, errors=state.errors, attempts=self.max_attempts
                )
            health.report(reason, stage=CALLER.get().stage, error=state.unserved)

    def _request(
        self, call: _Call, prompt: _Prompt, draw: int, sampling: Sampling, feedback: list[dict[str, Any]]
    ) -> CompletionRequest:
        """The request of one attempt; refuses a prompt that does not fit the role's context budget."""
        messages = prompt.messages + feedback
        if call.route is not None:
            budget = ContextBudget(call.route.context_tokens, sampling.max_tokens, call.endpoint.prompt_scale)
            needed = prompt.estimate(feedback)
            if budget.too_long(needed):
                raise PromptTooLong(
                    call.role.name,
                    raw="",
                    errors=[
                        f"the prompt needs about {needed} tokens, which leaves {budget.reply_room(needed)} "
                        f"of the {call.route.context_tokens}-token context for the reply (at least "
                        f"{min(sampling.max_tokens, MIN_REPLY_TOKENS)} needed); raise ARENA_LLM_CONTEXT_TOKENS "
                        "if the model has a larger window"
                    ],
                    attempts=0,
                )
            # A long prompt gets the room left: a server refuses prompt + max_tokens over its window.
            sampling = sampling.model_copy(update={"max_tokens": budget.reply_room(needed)})
        return CompletionRequest(
            role=call.role,
            inputs=call.inputs,
            messages=messages,
            json_schema=prompt.schema,
            sampling=sampling,
            attempt=draw,
            tools=prompt.tools,
        )

    def _longer(self, call: _Call, prompt: _Prompt, sampling: Sampling) -> Sampling | None:
        """``sampling`` with twice the reply budget, within the context window (None: no room to grow)."""
        limit = 131072
        if call.route is not None:
            counted = int(prompt.tokens * call.endpoint.prompt_scale)
            limit = min(limit, call.route.context_tokens - counted - TEMPLATE_MARGIN_TOKENS)
        grown = min(sampling.max_tokens * 2, limit)
        return sampling.model_copy(update={"max_tokens": grown}) if grown > sampling.max_tokens else None

    async def _attempts(self, call: _Call) -> _Attempts:
        """Ask the backend up to ``max_attempts`` times; the first valid output wins.

        A reply cut at ``max_tokens`` is asked again with twice the budget; an invalid reply is
        asked again with the validation error fed back (the reply and what was wrong with it as
        two more messages). Returns the state with ``answer`` set, or with ``unserved`` set when
        the endpoint did not serve the last attempt; raises ``InvalidOutput`` when the replies
        stayed unusable.
        """
        role, counters, backend = call.role, call.counters, call.endpoint.backend
        prompt = _Prompt.of(call)  # rendered once: every attempt sends it (plus any feedback)
        offered = {str(t.get("function", {}).get("name")) for t in prompt.tools or []}
        state = _Attempts()
        sampling = call.sampling
        feedback: list[dict[str, Any]] = []
        draw = 0  # replies that came back unusable so far: a transport retry resends the same request
        for attempt in range(self.max_attempts):
            counters.add(attempts=1, retries=1 if attempt else 0)
            request = self._request(call, prompt, draw, sampling, feedback)
            try:
                with metrics.llm_request(role.name, backend.name):
                    completion = await backend.complete(request)
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
            except ContextOverflow as exc:
                grew = exc.prompt_tokens is not None and call.endpoint.learn_scale(
                    exc.prompt_tokens, prompt.estimate(feedback)
                )
                error = f"the server counted the prompt over its {exc.window}-token window: {exc}"
                failure = _CountedLonger if grew else PromptTooLong
                raise failure(
                    role.name, raw="", errors=[*state.errors, error], attempts=attempt + 1
                ) from None
            call.endpoint.health.served()
            if not completion.usage.estimated:
                estimated = prompt.estimate(feedback)
                if estimated >= SCALE_FROM_TOKENS:  # a short prompt is mostly the chat template's tokens
                    counted = completion.usage.prompt_tokens - TEMPLATE_MARGIN_TOKENS
                    call.endpoint.learn_scale(counted, estimated)
            state.unserved = None
            counters.add(
                prompt_tokens=completion.usage.prompt_tokens,
                completion_tokens=completion.usage.completion_tokens,
            )
            state.raw = completion.text
            state.prompt_tokens += completion.usage.prompt_tokens
            state.completion_tokens += completion.usage.completion_tokens
            metrics.llm_tokens(role.name, backend.name, completion.usage)
            draw += 1
            if completion.finish_reason == "length":
                counters.add(cut_off=1)
                metrics.llm_unusable(role.name, backend.name, "cut_off")
                longer = self._longer(call, prompt, sampling)
                room = (
                    f"; retrying with max_tokens={longer.max_tokens}"
                    if longer
                    else "; no room in the context to grow"
                )
                state.errors.append(
                    f"attempt {attempt}: reply cut off at the token limit (finish_reason=length, "
                    f"max_tokens={sampling.max_tokens}){room}"
                )
                if longer is None:
                    break
                sampling, feedback = longer, []
                continue
            try:
                parsed = read_reply(role, completion, offered)
            except Unusable as exc:
                counters.add(refusals=1)
                metrics.llm_unusable(role.name, backend.name, "refusal")
                state.errors.append(f"attempt {attempt}: {exc}")
                continue
            except (NoJsonObject, ReplyInvalid) as exc:
                counters.add(invalid_outputs=1)
                metrics.llm_unusable(role.name, backend.name, "invalid_output")
                state.errors.append(f"attempt {attempt}: {exc}")
                feedback = _feedback(completion.text, str(exc))
                continue
            counters.add(**dict.fromkeys(parsed.repairs, 1))
            state.answer = self._answer(role, parsed, state.usage, call.endpoint, cached=False)
            return state
        if state.unserved is not None:
            return state
        log.warning(
            "role %s: no valid output after %d attempt(s): %s",
            role.name,
            self.max_attempts,
            state.errors[-1:],
        )
        raise InvalidOutput(role.name, raw=state.raw, errors=state.errors, attempts=self.max_attempts)

    def _backoff(self, attempt: int, exc: BaseException) -> float:
        """Exponential backoff with equal jitter; never shorter than a small ``Retry-After``."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2**attempt)
        delay = ceiling / 2 + self._jitter.uniform(0, ceiling / 2)
        retry_after = getattr(exc, "retry_after_s", None)
        return max(delay, retry_after) if retry_after is not None else delay

    async def aclose(self) -> None:
        """Close the backends and the cache (and the catalog when ``from_settings`` opened it)."""
        for endpoint in [self._default, *self.endpoints.values()]:
            await endpoint.health.aclose()
            await endpoint.backend.aclose()
        if self.cache is not None:
            await self.cache.aclose()
        if self._owns_catalog and self.catalog is not None:
            await asyncio.to_thread(self.catalog.dispose)

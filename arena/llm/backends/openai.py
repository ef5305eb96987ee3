"""The ``openai`` backend: any OpenAI-compatible chat-completions server over HTTP.

Bounded concurrency (a slot of the endpoint's admission per request: ``arena.llm.admission``,
shared by every stage process when the coordinator runs), one timeout per request,
guided JSON through ``response_format`` (``json_schema``, strict), token accounting from the
response's ``usage``. Failures a retry can fix (HTTP 408/425/429/5xx, connection errors,
timeouts, a garbled 200 body) raise ``TransientError``; the gateway backs off and retries.
HTTP 401/403/404 raise ``EndpointRejected`` (the endpoint refuses everything: credentials, URL,
model name; the gateway waits for it instead of failing records); other 4xx raise ``BackendError``.

Request shapes a server does not take: servers differ in how they take a JSON schema and tools,
and say so with whatever status they like (vLLM 400, llama.cpp's server 500 to a ``json_schema``
``response_format``). Until a role's requests have been served once, a failed request that carries
an optional part, and is refused with a 400 or a text naming that part, is sent again in the
next shape (``RESPONSE_FORMATS``: OpenAI's ``json_schema``, then llama.cpp's ``json_object`` with
the schema, then none; native ``tools``, then the tools in the prompt the Hermes way). The first
shape that is served is kept for the role for the rest of the process (logged once, with the
server's reason). Where ``json_object`` carried the very schema ``json_schema`` did, and no
``json_schema`` was ever served, the server refused the envelope, not the schema: every role starts
at ``json_object`` from then on. A refusal
is therefore one or two extra requests per role at most, never an outage; a
bare 5xx stays a transient failure (the gateway retries it, then waits for the endpoint). Every role's
prompt states its JSON contract in words and the gateway validates every answer, so unguided
output still ends valid or as ``InvalidOutput``. Servers that silently ignore
``response_format`` (``transformers serve`` 5.x) need nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any

import httpx

from arena.config import redact_url
from arena.llm.admission import Admission, LocalAdmission, admission_for
from arena.llm.backends import BackendError, LlmTarget, RetryAfter
from arena.llm.budget import MIN_REPLY_TOKENS
from arena.llm.core import (
    Completion,
    CompletionRequest,
    ContextOverflow,
    EndpointRejected,
    ToolCall,
    TransientError,
    Usage,
)
from arena.llm.replies import parse_arguments

if TYPE_CHECKING:
    from arena.config import ArenaSettings

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
REJECTING_STATUS = {
    401: "fix: set ARENA_LLM_API_KEY to a key this server accepts",
    403: "fix: use a key allowed to call this model",
    404: "fix: check the URL path (usually /v1) and ?model= in ARENA_LLM",
}
"""Statuses that refuse every request whatever its content: the endpoint's fault, never the record's."""
NOT_A_SHAPE_STATUS = frozenset({*REJECTING_STATUS, 408, 425, 429})
"""Failures that say nothing about the request's shape: a simpler shape is not tried for them."""
RESPONSE_FORMATS = ("json_schema", "json_object", "none")
"""How a role's JSON schema is sent, in the order tried: ``json_schema`` (OpenAI, vLLM, SGLang),
``json_object`` with a ``schema`` (llama.cpp's server constrains decoding to it), none."""
SHAPE_WORDS = ("response_format", "json_schema", "json_object", "schema", "tool")
"""Words by which a refusal names the part of the request it did not take."""
OVERFLOW_PATTERNS = (
    # vLLM, OpenAI, llama-cpp-python's server: "This model's maximum context length is 8192 tokens.
    # However, you requested 9120 tokens (7072 in the messages, 2048 in the completion)."
    re.compile(
        r"maximum context length is (?P<window>\d+) tokens.*?(?:requested|resulted in) (?P<requested>\d+) "
        r"tokens(?: \((?P<prompt>\d+) in the messages)?",
        re.I | re.S,
    ),
    # llama.cpp underneath: "Requested tokens (9120) exceed context window of 8192" (the prompt alone)
    re.compile(r"requested tokens \((?P<prompt>\d+)\) exceed context window of (?P<window>\d+)", re.I),
)
"""How servers say a request exceeds the model's window (their tokenizer counted)."""
OVERFLOW_MARGIN = 16
"""Tokens left spare when ``max_tokens`` is shrunk to the room a server said it has."""


@dataclass(frozen=True)
class Overflow:
    """A server's context-window refusal, in its own token counts."""

    window: int
    prompt: int | None
    """Prompt tokens it counted (None when it said only the total)."""
    requested: int | None
    """Prompt plus ``max_tokens`` (None when it said only the prompt)."""

    def room(self, asked: int) -> int:
        """``max_tokens`` that would fit, given that ``asked`` were asked for."""
        if self.prompt is not None:
            return self.window - self.prompt - OVERFLOW_MARGIN
        assert self.requested is not None
        return asked - (self.requested - self.window) - OVERFLOW_MARGIN


def _too_long(response: httpx.Response) -> bool:
    """Whether ``response`` refuses the request as over the context window (not for its shape)."""
    return response.status_code == 400 and context_overflow(_error_text(response)) is not None


def context_overflow(text: str) -> Overflow | None:
    """The refusal in ``text`` when it is a server's context-window refusal."""
    for pattern in OVERFLOW_PATTERNS:
        found = pattern.search(text)
        if found:
            named = found.groupdict()
            prompt, requested = named.get("prompt"), named.get("requested")
            return Overflow(
                window=int(named["window"]),
                prompt=int(prompt) if prompt else None,
                requested=int(requested) if requested else None,
            )
    return None


def _retry_after_s(response: httpx.Response, limit_s: float) -> float | None:
    """``Retry-After`` in seconds (number or HTTP date), or None when absent, bad or above ``limit_s``."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    if seconds < 0:
        return 0.0
    return seconds if seconds <= limit_s else None


def _error_text(response: httpx.Response) -> str:
    """A short excerpt of an error body (servers put the reason there; never headers)."""
    return " ".join(response.text.split())[:300]


def _model_ids(response: httpx.Response) -> set[str] | None:
    """Model ids of a ``GET /models`` answer, or None when the body is not the usual list."""
    try:
        data = response.json()["data"]
        return {str(item["id"]) for item in data}
    except (ValueError, KeyError, TypeError):
        return None


ATTEMPT_HEADER = "X-Arena-Attempt"
"""The gateway's attempt number (0 first, then retries after invalid output), sent with each request."""
ROLE_HEADER = "X-Arena-Role"
"""The role a request is for (``arena llm serve`` answers native agent requests by it)."""


def _tool_call(call: dict[str, Any]) -> ToolCall:
    """A native tool call; arguments arrive as a JSON string (some servers send an object)."""
    function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else {}
    name = str(function.get("name") or "")
    raw = function.get("arguments")
    arguments = parse_arguments("" if raw is None else raw)
    if arguments is None or not name:
        problem = "no function name" if not name else f"arguments are not a JSON object: {str(raw)[:200]!r}"
        return ToolCall(name=name, arguments={}, id=str(call.get("id") or ""), error=problem)
    return ToolCall(name=name, arguments=arguments, id=str(call.get("id") or ""))


HERMES_TOOLS = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}'
    "\n</tool_call>"
)
"""The tool preamble of Hermes-style chat templates (Qwen 2.5/3, Hermes 2/3)."""


def hermes_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` for a server without native tools: the tools described in the system prompt,
    earlier tool calls as ``<tool_call>`` text and tool results as ``<tool_response>`` user turns."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    preamble = HERMES_TOOLS.format(tools=listing)
    out: list[dict[str, Any]] = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role == "system":
            out.append({"role": "system", "content": f"{content}\n\n{preamble}"})
        elif role == "assistant" and message.get("tool_calls"):
            calls = "".join(
                f"\n<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': _arguments(c)}, ensure_ascii=False)}\n</tool_call>"
                for c in message["tool_calls"]
            )
            out.append({"role": "assistant", "content": f"{content}{calls}".strip()})
        elif role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        else:
            out.append({"role": str(role), "content": content})
    if not out or out[0]["role"] != "system":
        out.insert(0, {"role": "system", "content": preamble})
    return out


def _arguments(call: dict[str, Any]) -> Any:
    """A call's arguments as an object when they parse, else as sent."""
    raw = call.get("function", {}).get("arguments")
    parsed = parse_arguments(raw)
    return raw if parsed is None else parsed


class _TimedOut(TransientError):
    """A request that got no answer within the timeout (retried like any transient failure)."""


class OpenAIBackend:
    """Chat completions against ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout_s: float = 60.0,
        max_retry_after_s: float = 30.0,
        admission: Admission | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.concurrency = concurrency
        """Most requests in flight to this endpoint (the admission's capacity)."""
        self.admission: Admission = admission if admission is not None else LocalAdmission(concurrency)
        """Who admits each request: this backend alone by default, all processes when shared."""
        self.admission_key = f"{redact_url(self.base_url)} model={self.model}"
        """The endpoint's key in the admission: base URL and model, never the API key."""
        self.timeout_s = timeout_s
        self.max_retry_after_s = max_retry_after_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )
        self._format: dict[str, int] = {}
        """Per role, the index in ``RESPONSE_FORMATS`` of the shape its schema is sent in (default 0)."""
        self._first_format = 0
        """The index in ``RESPONSE_FORMATS`` every role starts at: 1 once the server refused
        ``json_schema`` and took ``json_object`` with the same schema (the envelope, not a schema,
        was refused: llama.cpp's server)."""
        self._json_schema_served = False
        """Some role's ``json_schema`` was served: a later refusal of it is then that schema's."""
        self._no_native_tools: set[str] = set()
        """Agent roles whose native ``tools`` this server rejected (tools go in the prompt from then on)."""
        self._refitted: set[str] = set()
        """Roles whose ``max_tokens`` a server's context-window refusal made smaller (logged once)."""
        self._served: set[str] = set()
        """Roles whose requests, in their current shape, this server has answered: a failure of
        theirs is then not the shape's fault."""

    def __repr__(self) -> str:  # no API key here, ever
        return f"OpenAIBackend({redact_url(self.base_url)!r}, model={self.model!r}, concurrency={self.concurrency})"

    def response_format(self, role: str) -> str:
        """How ``role``'s schema is sent to this server now (one of ``RESPONSE_FORMATS``)."""
        return RESPONSE_FORMATS[self._format_level(role)]

    def _format_level(self, role: str) -> int:
        return max(self._format.get(role, 0), self._first_format)

    def body(
        self,
        request: CompletionRequest,
        *,
        response_format: str | None = None,
        native_tools: bool | None = None,
    ) -> dict[str, Any]:
        """The JSON body of ``POST /chat/completions`` for ``request``.

        An agent role offers its tools natively (``tools``, ``tool_choice=auto``; no
        ``response_format``, which would forbid tool calls), or, on a server that refused native
        tools, describes them in the system prompt the Hermes way (``hermes_messages``). Other roles
        send their schema as ``response_format`` says (default: the role's current shape).
        """
        sampling = request.sampling
        role = request.role.name
        if native_tools is None:
            native_tools = role not in self._no_native_tools
        native = request.tools is not None and native_tools
        kind = response_format or self.response_format(role)
        messages = request.messages
        if request.tools is not None and not native:
            messages = hermes_messages(request.messages, request.tools)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            # Retries after invalid output must not replay the same sample.
            "seed": sampling.seed + request.attempt,
        }
        if sampling.stop:
            body["stop"] = sampling.stop
        if native:
            body["tools"] = request.tools
            body["tool_choice"] = "auto"
        elif kind == "json_schema" and request.tools is None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": role, "schema": request.json_schema, "strict": True},
            }
        elif kind == "json_object" and request.tools is None:
            body["response_format"] = {"type": "json_object", "schema": request.json_schema}
        return body

    async def complete(self, request: CompletionRequest) -> Completion:
        role = request.role.name
        async with self.admission.slot(self.admission_key) as outcome:
            body = self.body(request)
            try:
                response = await self._post(body, request)
            except _TimedOut:
                outcome.timed_out = True  # the admission learns the server queues too much
                raise
            if not response.is_success and self._may_be_shape(request, response):
                response = await self._simpler_shapes(request, response)
            elif response.is_success:
                self._served.add(role)
                if (body.get("response_format") or {}).get("type") == "json_schema":
                    self._json_schema_served = True  # what was sent: another role may have moved on
            completion = self._completion(response)
            outcome.served(completion.usage.prompt_tokens, completion.usage.completion_tokens)
        return completion

    def _may_be_shape(self, request: CompletionRequest, response: httpx.Response) -> bool:
        """Whether a failed request was refused for its shape and a simpler shape is left to try.

        A refusal is taken for the shape's when it is a 400 or its text names an optional part
        (``SHAPE_WORDS``), and only until the role has been served: after that, the server took
        the shape, and a failure is a failure.
        """
        role = request.role.name
        if response.status_code in NOT_A_SHAPE_STATUS or role in self._served:
            return False
        reason = _error_text(response).lower()
        if context_overflow(reason) is not None:
            return False  # too long in any shape
        if response.status_code != 400 and not any(word in reason for word in SHAPE_WORDS):
            return False
        if request.tools is not None:
            return role not in self._no_native_tools
        return self._format_level(role) + 1 < len(RESPONSE_FORMATS)

    async def _simpler_shapes(self, request: CompletionRequest, rejected: httpx.Response) -> httpx.Response:
        """Send ``request`` in each simpler shape until one is served, and keep that shape for the
        role (logged once, with the server's reason); the first refusal if none is served."""
        role = request.role.name
        reason = f"HTTP {rejected.status_code}: {_error_text(rejected)}"
        if request.tools is not None:
            retry = await self._post(self.body(request, native_tools=False), request)
            if not retry.is_success and not _too_long(retry):
                return rejected
            self._no_native_tools.add(role)
            self._served.add(role)
            log.warning(
                "LLM server %s refused native tools for role %s (%s); tools go in the prompt (Hermes "
                "<tool_call> format) from now on",
                redact_url(self.base_url),
                role,
                reason,
            )
            return retry
        refused = self._format_level(role)
        for level in range(refused + 1, len(RESPONSE_FORMATS)):
            shape = RESPONSE_FORMATS[level]
            retry = await self._post(self.body(request, response_format=shape), request)
            if not retry.is_success and not _too_long(retry):
                continue
            # Served, or refused only as too long (the server took the shape): the shape is kept.
            self._format[role] = level
            self._served.add(role)
            envelope = (
                RESPONSE_FORMATS[refused] == "json_schema"
                and shape == "json_object"
                and not self._json_schema_served
            )
            if envelope:  # the same schema was taken in the other envelope: no role sends json_schema
                self._first_format = max(self._first_format, level)
            log.warning(
                "LLM server %s refused response_format %s for role %s (%s); sending %s from now on%s",
                redact_url(self.base_url),
                RESPONSE_FORMATS[refused],
                role,
                reason,
                "no response_format (unguided)" if shape == "none" else f"response_format {shape}",
                ", for every role (the same schema was taken as json_object)" if envelope else "",
            )
            return retry
        return rejected

    async def _post(self, body: dict[str, Any], request: CompletionRequest) -> httpx.Response:
        """``_send`` once more with a smaller ``max_tokens`` when the server says prompt plus reply
        exceed its window: its tokenizer counts the prompt, Arena's budget only estimates it."""
        response = await self._send(body, request)
        if response.status_code != 400:
            return response
        found = context_overflow(_error_text(response))
        if found is None:
            return response
        asked = int(body.get("max_tokens") or 0)
        room = found.room(asked)
        if room < min(asked, MIN_REPLY_TOKENS):
            return response  # the prompt itself leaves no room: this request's own failure
        if request.role.name not in self._refitted:
            self._refitted.add(request.role.name)
            log.warning(
                "LLM server %s: role %s's prompt and reply exceed its %d-token window by its own count; "
                "max_tokens %d -> %d (its tokenizer counts more than Arena's estimate)",
                redact_url(self.base_url),
                request.role.name,
                found.window,
                asked,
                room,
            )
        return await self._send({**body, "max_tokens": room}, request)

    async def _send(self, body: dict[str, Any], request: CompletionRequest) -> httpx.Response:
        """One HTTP request under the per-request timeout; transport failures become transient.

        ``ATTEMPT_HEADER`` and ``ROLE_HEADER`` tell a server that cares (``arena llm serve``) which
        retry of which role this is; any other server ignores them.
        """
        url = f"{self.base_url}/chat/completions"
        headers = {ATTEMPT_HEADER: str(request.attempt), ROLE_HEADER: request.role.name}
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._client.post(url, json=body, headers=headers)
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise _TimedOut(f"LLM request timed out after {self.timeout_s:g}s") from exc
        except httpx.TransportError as exc:
            raise TransientError(f"LLM request failed: {type(exc).__name__}: {exc}") from exc

    def _completion(self, response: httpx.Response) -> Completion:
        status = response.status_code
        if status in RETRYABLE_STATUS:
            raise RetryAfter(
                f"LLM server answered HTTP {status}: {_error_text(response)}",
                _retry_after_s(response, self.max_retry_after_s),
                status=status,
            )
        if status in REJECTING_STATUS:
            raise EndpointRejected(
                f"LLM server {redact_url(self.base_url)} answered HTTP {status} for model {self.model!r}: "
                f"{_error_text(response)} ({REJECTING_STATUS[status]})",
                status=status,
            )
        if not response.is_success:
            message = (
                f"LLM server {redact_url(self.base_url)} answered HTTP {status} (not retryable): "
                f"{_error_text(response)}"
            )
            overflow = context_overflow(_error_text(response)) if status == 400 else None
            if overflow is not None:
                raise ContextOverflow(message, prompt_tokens=overflow.prompt, window=overflow.window)
            raise BackendError(message)
        try:
            payload = response.json()
            choice = payload["choices"][0]
            message = choice["message"]
            if not isinstance(message, dict):
                raise TypeError("message is not an object")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise TransientError(f"LLM server sent a malformed completion: {_error_text(response)}") from exc
        usage = payload.get("usage") or {}
        reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
        return Completion(
            text=message.get("content") or "",
            usage=Usage(
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            ),
            reasoning=reasoning if isinstance(reasoning, str) else "",
            finish_reason=choice.get("finish_reason") if isinstance(choice, dict) else None,
            tool_calls=tuple(_tool_call(c) for c in message.get("tool_calls") or [] if isinstance(c, dict)),
            refusal=message.get("refusal") or None,
        )

    @property
    def endpoint(self) -> str:
        """The endpoint as users see it (credentials never appear): base URL and model."""
        return f"{redact_url(self.base_url)} model={self.model}"

    async def probe(self) -> None:
        """Return when the server serves this model (``GET /models``), raise otherwise.

        Used while the endpoint is marked waiting (``arena.llm.outage``); an auth failure raises
        ``EndpointRejected`` so the reason stays visible.
        """
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self._client.get(f"{self.base_url}/models")
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise TransientError(f"no answer within {self.timeout_s:g}s") from exc
        except httpx.TransportError as exc:
            raise TransientError(f"{type(exc).__name__}: {exc}") from exc
        if response.status_code in (401, 403):
            raise EndpointRejected(
                f"HTTP {response.status_code}: {_error_text(response)} ({REJECTING_STATUS[response.status_code]})",
                status=response.status_code,
            )
        if not response.is_success:
            raise TransientError(f"GET /models answered HTTP {response.status_code}: {_error_text(response)}")
        served = _model_ids(response)
        if served is not None and self.model not in served:
            raise EndpointRejected(
                f"the server does not serve model {self.model!r} (it serves: {', '.join(sorted(served)) or 'none'}; "
                f"{REJECTING_STATUS[404]})",
                status=404,
            )

    async def aclose(self) -> None:
        await self._client.aclose()


def from_target(target: LlmTarget, settings: ArenaSettings) -> OpenAIBackend:
    """The ``openai`` entry point: an ``openai://`` / ``openais://`` target with the ``llm_*`` settings."""
    assert target.base_url is not None and target.model is not None
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
    return OpenAIBackend(
        target.base_url,
        target.model,
        api_key=key,
        concurrency=settings.llm_concurrency,
        timeout_s=settings.llm_timeout_s,
        admission=admission_for(settings),
    )

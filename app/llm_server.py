"""`arena llm serve`: any gateway backend behind an OpenAI-compatible HTTP endpoint.

``POST /v1/chat/completions`` and ``GET /v1/models``, so Arena's own ``openai://`` client (or any
OpenAI client) talks to it exactly as it talks to vLLM. ``--latency`` and ``--max-concurrency``
make it behave like a loaded model server: every request waits for one of N slots and holds it
for the backend's time plus the given latency, so a pipeline can be measured for the concurrency it really
keeps in flight without a GPU. ``GET /v1/arena/stats`` reports what the server saw (requests per
role, requests in flight: now, most, and the time-weighted mean).

The ``rules`` simulator needs a role's typed input, not a prompt. Arena's client names the role in
``response_format.json_schema.name`` and renders the input as JSON inside the role's template, so
the server recovers both (``arena.llm.roles.registry``, ``Role.inputs_from``). A request to the
rules model that names no role but offers ``tools`` (any OpenAI client's tool-calling chat: BFCL,
tau2, an application) is answered by the ``agent_policy`` role, the lexical agent that reads only
the messages and tool schemas. Anything else sent to the rules model is answered 400 with what is
missing. Other backends (``hf://``) answer any chat request from its messages. When a request
offers ``tools`` and the answer carries ``tool_calls`` (the agent roles), they come back as OpenAI
``tool_calls`` too.

Agent roles (``Role.agent``) are sent natively: the conversation as chat messages and ``tools``.
Arena's client names the role in the ``X-Arena-Role`` header and the server recovers the typed
input with the role's ``AgentIO.inputs_from``; the answer comes back as ``content`` plus native
``tool_calls``. Feedback the gateway appends on a retry (the invalid reply and why) is set aside.

The rules backend draws a fresh answer per ``attempt`` (0, then each retry after an invalid
answer). Arena's client sends it in the ``X-Arena-Attempt`` header, so the simulator answers over
HTTP exactly as in process; from other clients the request's ``seed`` stands in for it.

``--reply-style`` makes the answers look like a real model's (``REPLY_STYLES``): ``plain`` (the
JSON, native tool calls), ``real`` (a ``<think>`` block holding a decoy object and a decoy tool
call first, the JSON in prose and a fence, tool calls as Hermes ``<tool_call>`` text), or
``reasoning`` (reasoning in ``reasoning_content``, fenced JSON, native tool calls). A reply longer
than the request's ``max_tokens`` is cut there with ``finish_reason=length``, as a real server does.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from arena.llm.backends.openai import ATTEMPT_HEADER, ROLE_HEADER
from arena.llm.budget import prompt_tokens
from arena.llm.core import (
    Backend,
    Completion,
    CompletionRequest,
    Role,
    Sampling,
    ToolCall,
    Undecidable,
    Usage,
)
from arena.llm.gateway import FEEDBACK_PREFIX
from arena.llm.replies import as_text
from arena.llm.roles.agent import AGENT_POLICY
from arena.llm.roles.registry import roles

ReplyStyle = Literal["plain", "real", "reasoning"]
REPLY_STYLES: tuple[str, ...] = ("plain", "real", "reasoning")
CHARS_PER_TOKEN = 4
"""What the server counts as a token when it cuts a reply at ``max_tokens`` (it has no tokenizer)."""


class ChatInput(BaseModel):
    """The input of a request that names no Arena role: the chat messages themselves."""

    messages: Annotated[list[dict[str, Any]], Field(description="OpenAI chat messages, as sent.")]


class ChatOutput(BaseModel):
    """Free text: what a plain chat request asks for."""

    content: Annotated[str, Field(description="The assistant's reply.")] = ""


CHAT: Role[ChatInput, ChatOutput] = Role(
    name="chat", input=ChatInput, output=ChatOutput, system="", template="{input}"
)
"""The role of a request that names none (served by backends that read messages, not inputs)."""


class RequestError(ValueError):
    """A request this server cannot answer; sent back as HTTP 400 with the message."""


@dataclass
class ServerStats:
    """Requests seen and requests in flight, as the server saw them."""

    started: float = field(default_factory=time.monotonic)
    requests: int = 0
    errors: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    by_role: dict[str, int] = field(default_factory=dict)
    max_prompt_tokens: dict[str, int] = field(default_factory=dict)
    """Largest prompt seen per role, in ``arena.llm.budget``'s estimate (what budgets are checked in)."""
    cut: int = 0
    """Replies cut at max_tokens."""
    _area: float = 0.0
    _since: float = field(default_factory=time.monotonic)

    def _advance(self) -> None:
        now = time.monotonic()
        self._area += self.in_flight * (now - self._since)
        self._since = now

    def enter(self, role: str, prompt: int = 0) -> None:
        self._advance()
        self.max_prompt_tokens[role] = max(self.max_prompt_tokens.get(role, 0), prompt)
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.by_role[role] = self.by_role.get(role, 0) + 1

    def leave(self) -> None:
        self._advance()
        self.in_flight -= 1

    def snapshot(self) -> dict[str, Any]:
        self._advance()
        elapsed = max(self._since - self.started, 1e-9)
        return {
            "requests": self.requests,
            "errors": self.errors,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "mean_in_flight": round(self._area / elapsed, 3),
            "seconds": round(elapsed, 3),
            "by_role": dict(sorted(self.by_role.items())),
            "max_prompt_tokens": dict(sorted(self.max_prompt_tokens.items())),
            "cut": self.cut,
        }


def approx_tokens(text: str) -> int:
    """A rough token count (about four bytes a token): the rules backend has no tokenizer."""
    return (len(text.encode("utf-8")) + 3) // 4


def _json_schema(body: dict[str, Any]) -> dict[str, Any]:
    """``response_format.json_schema`` of ``body`` ({} when absent or not an object)."""
    fmt = body.get("response_format")
    spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
    return spec if isinstance(spec, dict) else {}


def _offers_tools(body: dict[str, Any]) -> bool:
    """Whether ``body`` is a tool-calling chat: a non-empty ``tools`` list of function tools."""
    tools = body.get("tools")
    return isinstance(tools, list) and bool(tools) and all(isinstance(t, dict) for t in tools)


def _role_of(body: dict[str, Any], needs_role: bool, named: str | None = None) -> Role[Any, Any]:
    known = roles()
    if named in known:
        return known[named]
    name = _json_schema(body).get("name")
    if isinstance(name, str) and name in known:
        return known[name]
    if needs_role and _offers_tools(body) and not name:
        # Any OpenAI client's tool-calling chat (BFCL, tau2, an app): the lexical agent reads exactly
        # the messages and tool schemas, so it needs no Arena role to answer one.
        return AGENT_POLICY
    if needs_role:
        got = f"role {name!r} is unknown" if name else "no role named in response_format.json_schema.name"
        raise RequestError(
            f"this model answers Arena's roles, or a chat that offers tools, only ({got}, and no 'tools'); "
            "send requests through Arena's openai:// client or offer tools, or serve a model that reads "
            "chat messages (arena llm serve --llm hf:///path)"
        )
    return CHAT


def _sampling(body: dict[str, Any]) -> Sampling:
    fields = {
        k: body[k] for k in ("temperature", "top_p", "max_tokens", "seed", "stop") if body.get(k) is not None
    }
    if isinstance(fields.get("stop"), str):
        fields["stop"] = [fields["stop"]]
    try:
        return Sampling(**fields)
    except ValidationError as exc:
        raise RequestError(f"invalid sampling parameters: {exc.errors()[:3]}") from None


def _without_feedback(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` less the gateway's retry feedback (the invalid reply and the note on it)."""
    last = messages[-1] if messages else {}
    if last.get("role") == "user" and str(last.get("content") or "").startswith(FEEDBACK_PREFIX):
        return messages[:-2]
    return messages


def _inputs(role: Role[Any, Any], messages: list[dict[str, Any]], body: dict[str, Any]) -> Any:
    if role is CHAT:
        return ChatInput(messages=messages)
    tools = body.get("tools")
    if role.agent is not None and isinstance(tools, list):
        return role.agent.inputs_from(_without_feedback(messages), tools)
    return role.inputs_from(messages)  # JSON mode (an agent role without tools answers one object)


def completion_request(
    body: dict[str, Any], needs_role: bool, attempt: int | None = None, named: str | None = None
) -> CompletionRequest:
    """What ``body`` asks the backend for; ``RequestError`` says why it cannot be answered.

    ``attempt`` is the gateway's attempt number (Arena's client sends it as ``X-Arena-Attempt``);
    without it the request's ``seed`` stands in, so a retry still gets a fresh draw. ``named`` is
    the role Arena's client names in ``X-Arena-Role``.
    """
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise RequestError("'messages' must be a list of message objects")
    role = _role_of(body, needs_role, named)
    try:
        inputs = _inputs(role, messages, body)
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    sampling = _sampling(body)
    schema = _json_schema(body).get("schema")
    return CompletionRequest(
        role=role,
        inputs=inputs,
        messages=messages,
        json_schema=schema if isinstance(schema, dict) else {},
        sampling=sampling,
        attempt=sampling.seed if attempt is None else attempt,
        tools=body["tools"] if role.agent is not None and isinstance(body.get("tools"), list) else None,
    )


def _native_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]


def _reply_parts(request: CompletionRequest, text: str) -> tuple[str, list[ToolCall]]:
    """An agent role's answer as (content, tool calls); any other role's is its text."""
    agent = request.role.agent
    if agent is None or request.tools is None:
        return text, []
    try:
        output = request.role.output.model_validate_json(text)
    except ValueError:
        return text, []  # not the role's output (e.g. "I cannot answer"): send it as it is
    return agent.as_reply(output)


def _styled(
    style: ReplyStyle, request: CompletionRequest, content: str, calls: list[ToolCall]
) -> dict[str, Any]:
    """The assistant message of one answer in ``style``."""
    if style == "plain":
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = _native_calls(calls)
        return message
    agent = request.role.agent is not None and request.tools is not None
    body = (
        content
        if agent
        else f"Here is the result you asked for:\n```json\n{content}\n```\nLet me know if anything should change."
    )
    if style == "reasoning":
        message = {"role": "assistant", "content": body, "reasoning_content": _thoughts(request)}
        if calls:
            message["tool_calls"] = _native_calls(calls)
        return message
    written = ""
    if calls:  # Hermes text, every other reply inside a fence (models do both)
        blocks = "\n".join(as_text([c]) for c in calls)
        fenced = len(request.messages) % 2 == 0
        written = f"\n```xml\n{blocks}\n```" if fenced else f"\n{blocks}"
    think = f"<think>\n{_thoughts(request)}\n</think>\n\n"
    return {"role": "assistant", "content": f"{think}{body}{written}".strip()}


def _thoughts(request: CompletionRequest) -> str:
    """Reasoning with decoys in it: a draft JSON object and a tool call that must never be parsed."""
    decoy_call = as_text([ToolCall(name="draft_call", arguments={"note": "not a real call"})])
    return (
        f"The request is for {request.role.name}. A first draft could be "
        '{"draft": true, "answer": "not final"} but let me check it once more. '
        f"Maybe I should call something like {decoy_call}. No: I will answer properly."
    )


def chat_completion(
    model: str, request: CompletionRequest, completion: Completion, style: ReplyStyle = "plain"
) -> dict[str, Any]:
    """The OpenAI ``chat.completion`` object for ``completion`` (cut at ``max_tokens`` like a server)."""
    content, calls = _reply_parts(request, completion.text)
    message = _styled(style, request, content, calls)
    # A backend's estimate counted its own text, not this styled reply: count what is sent.
    counted = completion.usage if not completion.usage.estimated else Usage()
    answer = counted.completion_tokens or approx_tokens(
        str(message.get("content") or "") + json.dumps(message.get("tool_calls") or [])
    )
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    limit = request.sampling.max_tokens * CHARS_PER_TOKEN
    text = str(message.get("content") or "")
    if len(text) > limit:
        message = {"role": "assistant", "content": text[:limit]}
        finish, answer = "length", request.sampling.max_tokens
    prompt = counted.prompt_tokens or prompt_tokens(request.messages, request.tools)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": answer, "total_tokens": prompt + answer},
    }


class LlmServer:
    """One backend behind the OpenAI chat-completions API, with a latency and a concurrency limit."""

    def __init__(
        self,
        backend: Backend,
        *,
        model: str,
        latency_s: float = 0.0,
        max_concurrency: int = 64,
        api_key: str | None = None,
        reply_style: ReplyStyle = "plain",
    ) -> None:
        if latency_s < 0:
            raise ValueError("latency must be >= 0")
        if max_concurrency < 1:
            raise ValueError("max concurrency must be at least 1")
        self.backend = backend
        self.model = model
        self.latency_s = latency_s
        self.max_concurrency = max_concurrency
        self.needs_role = backend.name == "rules"
        self.api_key = api_key
        """When set, every /v1 request must carry ``Authorization: Bearer <api_key>`` (like vLLM's --api-key)."""
        self.reply_style: ReplyStyle = reply_style
        """How answers are written (see the module docstring)."""
        self.stats = ServerStats()
        self._slots = asyncio.Semaphore(max_concurrency)

    async def chat(
        self, body: Any, attempt: int | None = None, role: str | None = None
    ) -> tuple[int, dict[str, Any]]:
        """HTTP status and JSON body for one ``POST /v1/chat/completions`` (``attempt``, ``role``:
        see ``completion_request``)."""
        try:
            if not isinstance(body, dict):
                raise RequestError("the request body must be a JSON object")
            request = completion_request(body, self.needs_role, attempt, role)
        except RequestError as exc:
            self.stats.errors += 1
            return 400, {"error": {"message": str(exc), "type": "invalid_request_error"}}
        self.stats.enter(request.role.name, prompt_tokens(request.messages, request.tools))
        try:
            async with self._slots:
                try:
                    completion = await self.backend.complete(request)
                except Undecidable as exc:
                    # What a model that cannot answer writes: no JSON, so the client retries.
                    completion = Completion(text=f"I cannot answer this request ({exc}).")
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
        finally:
            self.stats.leave()
        payload = chat_completion(self.model, request, completion, self.reply_style)
        if payload["choices"][0]["finish_reason"] == "length":
            self.stats.cut += 1
        return 200, payload

    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "arena"}]}

    def asgi(self) -> Any:
        """The Starlette app serving this server's routes."""
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        def refused(request: Request) -> JSONResponse | None:
            if self.api_key is None or request.headers.get("authorization") == f"Bearer {self.api_key}":
                return None
            self.stats.errors += 1
            return JSONResponse(
                {"error": {"message": "invalid API key", "type": "authentication_error"}}, 401
            )

        async def chat(request: Request) -> JSONResponse:
            if (denied := refused(request)) is not None:
                return denied
            try:
                body = await request.json()
            except ValueError:
                return JSONResponse(
                    {"error": {"message": "the body is not JSON", "type": "invalid_request_error"}}, 400
                )
            header = request.headers.get(ATTEMPT_HEADER, "")
            status, payload = await self.chat(
                body, int(header) if header.isdigit() else None, request.headers.get(ROLE_HEADER) or None
            )
            return JSONResponse(payload, status)

        async def models(request: Request) -> JSONResponse:
            if (denied := refused(request)) is not None:
                return denied
            return JSONResponse(self.models())

        async def stats(_: Request) -> JSONResponse:
            return JSONResponse(self.stats.snapshot())

        async def health(_: Request) -> JSONResponse:
            return JSONResponse({"status": "ok"})

        return Starlette(
            routes=[
                Route("/v1/chat/completions", chat, methods=["POST"]),
                Route("/v1/models", models, methods=["GET"]),
                Route("/v1/arena/stats", stats, methods=["GET"]),
                Route("/health", health, methods=["GET"]),
            ]
        )

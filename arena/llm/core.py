"""The gateway's vocabulary: roles, requests, completions and the backend Protocol.

A *role* is one LLM step of a stage (chain synthesis, a trajectory judge, the
agent policy, ...): a typed input, a typed output and a prompt whose text is
versioned in the catalog. Backends turn a ``CompletionRequest`` into text; the
gateway (``arena.llm.gateway``) renders prompts, validates, retries and caches.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Generic, Protocol, TypeVar

from pydantic import AfterValidator, BaseModel, Field, ValidationError

from arena.hashing import content_hash

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out", bound=BaseModel)


PROMPT_SEPARATOR = "\n---\n"
"""Between a role's system prompt and its user template in ``Role.prompt_text`` (and prompt files)."""


@dataclass(frozen=True)
class Role(Generic[In, Out]):
    """One LLM step: typed input, typed output, versioned prompt."""

    name: str
    """Stable role name, e.g. ``chain_synthesis``; the catalog keys prompt versions by it."""
    input: type[In]
    output: type[Out]
    system: str
    """System prompt text (instructions, output contract)."""
    template: str
    """User prompt; ``{input}`` is replaced by the input record as JSON."""
    agent: AgentIO[In, Out] | None = None
    """Set for agent roles: they speak the chat API natively (conversation and ``tools`` out,
    ``tool_calls`` back) instead of one JSON object in text."""
    narrow: Callable[[In, dict[str, Any]], dict[str, Any]] | None = None
    """The output schema made tighter for one input (e.g. tool names as an ``enum`` of the input's
    tools): a server that constrains decoding to the schema can then only name what exists. The
    reply is still validated against ``output``, so narrowing never loosens a check."""

    @property
    def prompt_text(self) -> str:
        """What is versioned: system prompt and template together."""
        return f"{self.system}{PROMPT_SEPARATOR}{self.template}"

    @property
    def version(self) -> str:
        """Content hash of the prompt text (the catalog also numbers versions per role)."""
        return content_hash({"role": self.name, "text": self.prompt_text}, prefix="pv-", length=24)

    def messages(self, inputs: In) -> list[dict[str, Any]]:
        """Chat messages sent to a text backend for ``inputs`` (an agent role: its conversation)."""
        if self.agent is not None:
            return self.agent.conversation(inputs)
        payload = json.dumps(inputs.model_dump(mode="json"), ensure_ascii=False, indent=1)
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.template.replace("{input}", payload)},
        ]

    def inputs_from(self, messages: Sequence[Mapping[str, Any]]) -> In:
        """The input that ``messages`` rendered: the inverse of ``messages`` on its first user message.

        Raises ``ValueError`` (with what did not match) when the messages were not rendered from
        this role's template, or the JSON inside does not validate as the role's input.
        """
        users = [m for m in messages if m.get("role") == "user"]
        if not users or not isinstance(users[0].get("content"), str):
            raise ValueError(f"role {self.name!r}: no user message with text content")
        text: str = users[0]["content"]  # later user messages are the gateway's feedback on a retry
        head, _, tail = self.template.partition("{input}")
        if not (text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail)):
            raise ValueError(f"role {self.name!r}: the user message does not follow the role's template")
        payload = text[len(head) : len(text) - len(tail)]
        try:
            return self.input.model_validate_json(payload)
        except ValidationError as exc:
            raise ValueError(f"role {self.name!r}: the input does not validate: {exc.errors()[:3]}") from None

    def output_schema(self) -> dict[str, Any]:
        """JSON Schema of the output, for guided decoding: a fresh copy (``narrow`` may change it)."""
        schema: dict[str, Any] = json.loads(_schema_json(self.output))
        return schema

    def schema_for(self, inputs: In) -> dict[str, Any]:
        """The output schema sent with a call on ``inputs``: ``narrow``-ed where the role says how,
        bounded numbers as a few values (``decodable``)."""
        schema = self.output_schema()
        return decodable(schema if self.narrow is None else self.narrow(inputs, schema))

    def tools(self, inputs: In) -> list[dict[str, Any]] | None:
        """OpenAI tools an agent role offers for ``inputs`` (None for other roles)."""
        return None if self.agent is None else self.agent.tools(inputs)


@cache
def _schema_json(model: type[BaseModel]) -> str:
    """``model``'s JSON Schema, made once per process: pydantic builds it anew on every call, and
    every LLM call (its cache key, its prompt) asks for it (a few CPU-seconds of a demo run)."""
    return json.dumps(model.model_json_schema())


NUMBER_STEPS = 20
"""A bounded ``number`` in a decoding schema becomes this many + 1 evenly spaced values."""


def decodable(schema: Any) -> Any:
    """``schema`` with every ``number`` that has a minimum and a maximum turned into an ``enum`` of
    ``NUMBER_STEPS + 1`` evenly spaced values in that range.

    A JSON-schema grammar (llama.cpp's, xgrammar's) bounds neither a number's range nor its digits,
    so a small model can spend its whole ``max_tokens`` on one score's decimals (SmolLM2-135M did,
    on ``score_task``). Each value is valid for the role's model, which still validates the reply.
    """
    if isinstance(schema, list):
        return [decodable(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: decodable(value) for key, value in schema.items()}
    low, high = (
        out.get("minimum", out.get("exclusiveMinimum")),
        out.get("maximum", out.get("exclusiveMaximum")),
    )
    if (
        out.get("type") == "number"
        and isinstance(low, int | float)
        and isinstance(high, int | float)
        and high > low
    ):
        values = [round(low + (high - low) * i / NUMBER_STEPS, 6) for i in range(NUMBER_STEPS + 1)]
        if "exclusiveMinimum" in out:
            values = values[1:]
        if "exclusiveMaximum" in out:
            values = values[:-1]
        out = {
            k: v
            for k, v in out.items()
            if k not in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
        }
        out["enum"] = values
    return out


JUDGE_REASON_CHARS = 600
"""Longest reason a judge's reply carries (a prompt asks for one or two sentences)."""


def _clip_reason(text: str) -> str:
    return text[:JUDGE_REASON_CHARS]


JudgeReason = Annotated[
    str,
    Field(min_length=1, json_schema_extra={"maxLength": JUDGE_REASON_CHARS}),
    AfterValidator(_clip_reason),
]
"""A judge's free-text reason. Guided decoding stops it at ``JUDGE_REASON_CHARS`` (``maxLength``:
a small model otherwise writes on until ``max_tokens`` and the whole verdict is cut, as
SmolLM2-135M did on ``score_task``); an unguided reply that runs longer is clipped, not refused."""


class PromptError(ValueError):
    """A prompt override a role cannot take (the message names the role and the fix)."""


def with_prompt(role: Role[In, Out], text: str) -> Role[In, Out]:
    """``role`` with its prompt replaced by ``text``: ``Role.prompt_text``'s form (system prompt, a
    ``---`` line, user template), or a system prompt alone (the template stays).

    The new role's ``version`` is the new text's hash, so lineage names the prompt that made a record.
    """
    if role.agent is not None:
        raise PromptError(
            f"role {role.name!r} speaks the chat API natively (its conversation is built from the "
            "record); its prompt cannot be replaced by a file (fix: change its code, or drop the override)"
        )
    # A file ends with a newline where a role's text does not: `arena llm prompt ROLE > file`
    # read back unchanged is the role's own prompt (same version, same cache entries).
    system, sep, template = text.rstrip("\n").rpartition(PROMPT_SEPARATOR)
    if not sep:
        system, template = text.rstrip("\n"), role.template
    if "{input}" not in template:
        raise PromptError(
            f"role {role.name!r}: the user template after the '---' line has no {{input}} placeholder "
            "(fix: keep {input} where the record goes, or leave out the '---' line to replace the system prompt only)"
        )
    return replace(role, system=system, template=template)


def read_prompt_files(files: Mapping[str, Path]) -> dict[str, str]:
    """Role name -> prompt text, read from the files ``llm_prompt_files`` names."""
    texts: dict[str, str] = {}
    for role, path in files.items():
        try:
            texts[role] = Path(path).expanduser().read_text(encoding="utf-8")
        except OSError as exc:
            raise PromptError(
                f"prompt file of role {role!r}: {exc} (fix: correct llm_prompt_files / ARENA_LLM_PROMPT_FILES)"
            ) from None
    return texts


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a reply: native ``tool_calls`` or parsed from text."""

    name: str
    arguments: dict[str, Any]
    id: str = ""
    """The server's call id (empty when parsed from text)."""
    error: str = ""
    """Why the server's call could not be read (its arguments were not a JSON object); '' when fine."""


TRACE_ONLY_KEYS = frozenset({"reasoning_content"})
"""Message keys the trace keeps but a conversation never sends back (a model's earlier reasoning)."""


def sendable(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` as sent to a server: without the trace-only keys."""
    return {k: v for k, v in message.items() if k not in TRACE_ONLY_KEYS}


@dataclass(frozen=True)
class AgentIO(Generic[In, Out]):
    """How an agent role speaks the chat API: its input as a conversation plus tools, and a reply
    (text and tool calls) as its output. ``inputs_from`` and ``as_reply`` are the inverses that let
    ``arena llm serve`` answer native requests with the rules simulator."""

    conversation: Callable[[In], list[dict[str, Any]]]
    """The chat messages to send (system prompt first)."""
    tools: Callable[[In], list[dict[str, Any]]]
    """The OpenAI tools to offer."""
    reply: Callable[[str, list[ToolCall]], Out]
    """The output from the reply's visible text and its tool calls (raises ValueError when unusable)."""
    inputs_from: Callable[[list[dict[str, Any]], list[dict[str, Any]]], In]
    """The input that rendered (messages, tools); raises ValueError when they were not Arena's."""
    as_reply: Callable[[Out], tuple[str, list[ToolCall]]]
    """The reply (text, tool calls) a model would send for an output."""


class Sampling(BaseModel):
    """Sampling parameters; part of the cache key."""

    temperature: Annotated[float, Field(ge=0, le=2, description="Sampling temperature.")] = 0.7
    top_p: Annotated[float, Field(gt=0, le=1, description="Nucleus sampling mass.")] = 0.95
    max_tokens: Annotated[int, Field(ge=1, le=131072, description="Most tokens to generate.")] = 1024
    seed: Annotated[int, Field(ge=0, description="Sampling seed (backends that take one).")] = 0
    stop: Annotated[
        list[str] | None, Field(max_length=8, description="Stop sequences (None: the model's own).")
    ] = None


@dataclass(frozen=True)
class CompletionRequest:
    """What a backend receives."""

    role: Role[Any, Any]
    inputs: BaseModel
    """The typed input (the ``rules`` backend works on it directly)."""
    messages: list[dict[str, Any]]
    """Rendered chat messages (text backends)."""
    json_schema: dict[str, Any]
    """Output schema for guided JSON decoding."""
    sampling: Sampling
    tools: list[dict[str, Any]] | None = None
    """OpenAI tools offered (agent roles); the reply may carry ``tool_calls``."""
    attempt: int = 0
    """How many replies to this request came back invalid (0 first); backends reseed by it.

    A retry after a transport error or timeout resends the same request with the same number, so an
    endpoint that fails for a while changes no answer (runs stay reproducible)."""


@dataclass(frozen=True)
class Usage:
    """Token accounting of one completion."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: bool = False
    """The counts are ``arena.llm.budget``'s tokenizer-free estimate (the ``rules`` backend, which
    has no tokenizer), not what a server's tokenizer counted."""


@dataclass(frozen=True)
class Completion:
    """What a backend produced: the reply text and what the server said about it."""

    text: str
    usage: Usage = field(default_factory=Usage)
    reasoning: str = ""
    """Reasoning the server returned apart from the text (``reasoning_content``)."""
    finish_reason: str | None = None
    """``stop``, ``length`` (cut at max_tokens), ``tool_calls``...; None when the backend does not say."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Native tool calls of the reply."""
    refusal: str | None = None
    """The server's refusal message (OpenAI ``message.refusal``), when it refused."""


class Backend(Protocol):
    """An LLM backend: ``rules``, ``openai``, ``hf`` or ``vllm``."""

    name: str
    """Backend kind as recorded in lineage, e.g. ``rules``."""
    model: str
    """Model id as recorded in lineage (``rules-v1`` for the rules backend)."""

    async def complete(self, request: CompletionRequest) -> Completion:
        """Produce the raw text for one request; raise ``TransientError`` for retryable failures."""
        ...

    async def aclose(self) -> None:
        """Release clients, engines and connections."""
        ...


class TransientError(Exception):
    """A retryable backend failure (connection reset, HTTP 429/5xx, timeout)."""

    def __init__(self, message: str = "", *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status the server answered with; ``None`` when it did not answer (transport)."""


class ContextOverflow(Exception):
    """The server refused the request as longer than its context window, by its own tokenizer's count.

    The gateway learns the endpoint's tokens per estimated token from it and fits the prompt again.
    """

    def __init__(self, message: str, *, prompt_tokens: int | None, window: int) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens
        """Prompt tokens the server counted (None when it said only prompt plus reply)."""
        self.window = window


class EndpointRejected(Exception):
    """The endpoint refuses every request, whatever its content: HTTP 401/403 (credentials), 404 (URL or model).

    Not a record's fault, so never dead-lettered: the gateway treats it like an outage (it waits
    for the endpoint, see ``arena.llm.outage``), and the message says what to fix.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status that said so, when there was one."""


@dataclass(frozen=True)
class Caller:
    """Who is asking: the stage a call is made for (accounting, admission priority)."""

    stage: str = "-"
    """Stage name (``-`` outside any stage: CLI commands, tests)."""
    priority: int = 0
    """Position of the stage in the pipeline: higher is nearer the output, served first when saturated."""


CALLER: ContextVar[Caller] = ContextVar("arena_llm_caller", default=Caller())  # noqa: B039  # frozen
"""Set by the stage runtime around each record; tasks a handler spawns inherit it."""


class Undecidable(Exception):
    """A rules judge or generator cannot decide from its input; retried, then dead-lettered."""


class InvalidOutput(Exception):
    """A role's output stayed invalid (or the backend kept failing) after every attempt."""

    def __init__(self, role: str, raw: str, errors: list[str], attempts: int) -> None:
        self.role = role
        self.raw = raw
        """The last raw text the backend produced (empty when it never answered)."""
        self.errors = errors
        self.attempts = attempts
        super().__init__(f"role {role!r}: no valid output after {attempts} attempt(s): {errors[-1:]}")


@dataclass(frozen=True)
class Answer(Generic[Out]):
    """A validated role output and where it came from (for lineage)."""

    output: Out
    role: str
    prompt_version: str
    backend: str
    model: str
    cached: bool
    usage: Usage
    raw: str
    """The reply as text (native tool calls written as ``<tool_call>`` blocks, reasoning as ``<think>``)."""
    reasoning: str = ""
    """The reply's reasoning (``<think>`` or ``reasoning_content``), kept for the trace, never parsed."""
    cut: list[str] = field(default_factory=list)
    """What was left out of the input to fit the context budget (``arena.llm.fitting``); empty: nothing."""

"""The gateway's vocabulary: roles, requests, completions and the backend Protocol.

A *role* is one LLM step of a stage (chain synthesis, a trajectory judge, the
agent policy, ...): a typed input, a typed output and a prompt whose text is
versioned in the catalog. Backends turn a ``CompletionRequest`` into text; the
gateway (``arena.llm.gateway``) renders prompts, validates, retries and caches.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Annotated, Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, Field, ValidationError

from arena.hashing import content_hash

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out", bound=BaseModel)


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

    @property
    def prompt_text(self) -> str:
        """What is versioned: system prompt and template together."""
        return f"{self.system}\n---\n{self.template}"

    @property
    def version(self) -> str:
        """Content hash of the prompt text (the catalog also numbers versions per role)."""
        return content_hash({"role": self.name, "text": self.prompt_text}, prefix="pv-", length=24)

    def messages(self, inputs: In) -> list[dict[str, str]]:
        """Chat messages sent to a text backend for ``inputs``."""
        payload = json.dumps(inputs.model_dump(mode="json"), ensure_ascii=False, indent=1)
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.template.replace("{input}", payload)},
        ]

    def inputs_from(self, messages: Sequence[Mapping[str, Any]]) -> In:
        """The input that ``messages`` rendered: the inverse of ``messages`` on its last user message.

        Raises ``ValueError`` (with what did not match) when the messages were not rendered from
        this role's template, or the JSON inside does not validate as the role's input.
        """
        users = [m for m in messages if m.get("role") == "user"]
        if not users or not isinstance(users[-1].get("content"), str):
            raise ValueError(f"role {self.name!r}: no user message with text content")
        text: str = users[-1]["content"]
        head, _, tail = self.template.partition("{input}")
        if not (text.startswith(head) and text.endswith(tail) and len(text) >= len(head) + len(tail)):
            raise ValueError(f"role {self.name!r}: the user message does not follow the role's template")
        payload = text[len(head) : len(text) - len(tail)]
        try:
            return self.input.model_validate_json(payload)
        except ValidationError as exc:
            raise ValueError(f"role {self.name!r}: the input does not validate: {exc.errors()[:3]}") from None

    def output_schema(self) -> dict[str, Any]:
        """JSON Schema of the output, for guided decoding."""
        return self.output.model_json_schema()


class Sampling(BaseModel):
    """Sampling parameters; part of the cache key."""

    temperature: Annotated[float, Field(ge=0, le=2, description="Sampling temperature.")] = 0.7
    top_p: Annotated[float, Field(gt=0, le=1, description="Nucleus sampling mass.")] = 0.95
    max_tokens: Annotated[int, Field(ge=1, le=131072, description="Most tokens to generate.")] = 1024
    seed: Annotated[int, Field(ge=0, description="Sampling seed (backends that take one).")] = 0


@dataclass(frozen=True)
class CompletionRequest:
    """What a backend receives."""

    role: Role[Any, Any]
    inputs: BaseModel
    """The typed input (the ``rules`` backend works on it directly)."""
    messages: list[dict[str, str]]
    """Rendered chat messages (text backends)."""
    json_schema: dict[str, Any]
    """Output schema for guided JSON decoding."""
    sampling: Sampling
    attempt: int = 0
    """How many replies to this request came back invalid (0 first); backends reseed by it.

    A retry after a transport error or timeout resends the same request with the same number, so an
    endpoint that fails for a while changes no answer (runs stay reproducible)."""


@dataclass(frozen=True)
class Usage:
    """Token accounting of one completion."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class Completion:
    """Raw text a backend produced."""

    text: str
    usage: Usage = field(default_factory=Usage)


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

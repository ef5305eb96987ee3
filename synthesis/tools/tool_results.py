"""What a tool call returns, and the session protocol every tool back-end implements.

The tool pool (``synthesis.sft.tool_pool``) opens sessions; the emulator and the MCP client are its two
back-ends. All three share these types, so they live here, below them.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Annotated, Any, Literal, Protocol, Self

import jsonschema
from pydantic import BaseModel, Field

log = logging.getLogger(__name__)

ErrorKind = Literal["timeout", "unreachable", "tool_error", "unknown_tool", "bad_arguments"]
"""Why a call failed; ``timeout`` and ``unreachable`` are transient, the others are the caller's or the tool's."""


class ToolResult(BaseModel):
    """What one tool call returned, as the agent sees it plus what the reward needs."""

    ok: Annotated[bool, Field(description="True when the tool returned a valid response (S_i = 1 in TCS).")]
    content: Annotated[
        str,
        Field(
            description="The tool message content: the result as JSON text, or the error text when not ok."
        ),
    ]
    error_kind: Annotated[
        ErrorKind | None,
        Field(description="timeout, unreachable, tool_error, unknown_tool or bad_arguments; None when ok."),
    ] = None
    source: Annotated[
        Literal["mcp", "emulator", "none"],
        Field(
            description="Who answered: the real MCP server, the emulator, or none (rejected before any call: "
            "unknown tool or arguments that violate the input schema)."
        ),
    ]
    latency_ms: Annotated[float, Field(ge=0, description="Wall time of the call in milliseconds.")] = 0.0


class ToolSession(Protocol):
    """A per-rollout tool session; also an async context manager that closes itself."""

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call tool ``name``; never raises for tool, argument or transport failures."""
        ...

    async def aclose(self) -> None:
        """Release the connection / server process; idempotent."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


def schema_errors(value: Any, schema: dict[str, Any], limit: int = 5) -> list[str]:
    """Violations of ``schema`` by ``value`` as short messages ([] = valid); formats are not checked.

    A schema the validator cannot use (invalid, unresolvable ``$ref``) yields no
    violations: a broken doc must not block every call of its tool.
    """
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        errors = sorted(cls(schema).iter_errors(value), key=lambda e: [str(p) for p in e.absolute_path])
    except Exception as exc:  # jsonschema raises several unrelated types for unusable schemas
        log.debug("unusable schema, not validating: %s: %s", type(exc).__name__, exc)
        return []
    out = []
    for err in errors[:limit]:
        where = ".".join(str(p) for p in err.absolute_path)
        out.append(f"{where}: {err.message}" if where else err.message)
    return out

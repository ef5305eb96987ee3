"""The tool pool of ASTRA §2.1.4: the one interface the agent loop calls tools through.

A server with an endpoint is *deployed*: every call goes to the real MCP
server (one client session, and for stdio one server process, per rollout). A
doc-only server is answered by the stateful emulator, which injects transient
failures at ``sft.emulator_failure_rate``. Either way a call never raises: it
returns a ``ToolResult`` whose ``error_kind`` says what went wrong.

    session = await open_session(server, gateway, settings, session_id)
    async with session:
        result = await session.call("get_note", {"note_id": "note_3f9a1c2b"})
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, Self

import jsonschema
from pydantic import BaseModel, Field

from arena.config import ArenaSettings
from arena.records.sft import ServerRef

if TYPE_CHECKING:
    from arena.llm.gateway import Gateway

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


async def open_session(
    server: ServerRef, gateway: Gateway, settings: ArenaSettings, session_id: str
) -> ToolSession:
    """A tool session for one rollout on ``server``: real MCP when deployed, the emulator otherwise.

    Opening a deployed server's session tries to connect; when the server cannot
    be reached the session still opens and each call answers ``unreachable``
    (after one reconnection attempt), so a rollout records the outage instead of crashing.
    """
    # Imported here: both back-ends import ToolResult from this module.
    from streams.sft.emulator import Emulator
    from streams.sft.mcp_client import McpToolSession, McpUnreachable

    if server.endpoint is None:
        return Emulator(
            server.tools,
            gateway,
            session_id,
            failure_rate=settings.sft.emulator_failure_rate,
            seed=settings.seed,
            server=server.name,
        )
    session = McpToolSession(server.endpoint, timeout_s=settings.sft.tool_timeout_s)
    try:
        await session.connect()
    except McpUnreachable:
        pass  # every call retries the connection and reports `unreachable` if it still fails
    return session

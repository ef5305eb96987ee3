"""MCP client for deployed tool servers: one session per rollout, failures as ``ToolResult``s.

A stdio endpoint spawns its own server process per session (fresh state per
rollout); an http endpoint opens a streamable-HTTP session to a running server.
The SDK's ``Client`` lives in a background task that enters and leaves it, so
a session may be opened, called (concurrently) and closed from different tasks.

Failures map to ``ToolResult.error_kind``: the request clock running out ->
``timeout``; no connection, a dropped connection or a dead process ->
``unreachable``; an ``isError`` result or a protocol error -> ``tool_error``
(``bad_arguments`` when the server rejected the arguments); a name the server
does not list -> ``unknown_tool`` and arguments violating the listed input
schema -> ``bad_arguments``, both without calling the server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import ValidationError

from arena.records.tools import McpEndpoint
from synthesis.tools.normalize import sanitize_tool_name
from synthesis.tools.tool_results import ErrorKind, ToolResult, schema_errors

if TYPE_CHECKING:  # the SDK takes ~1 s to import: only a process that opens a session pays for it
    from mcp import Client, StdioServerParameters
    from mcp.shared.exceptions import MCPError
    from mcp.types import CallToolResult

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0
"""How long closing waits for the SDK to shut a session (and a stdio process) down."""
_VALIDATION_MARKERS = ("validation error for", "Input validation error", "Invalid arguments")
"""Texts by which servers report rejected arguments in an isError result."""


class McpUnreachable(Exception):
    """The MCP server could not be reached (spawn failed, connection refused, handshake timed out)."""


def _target(endpoint: McpEndpoint) -> StdioServerParameters | str:
    from mcp import StdioServerParameters

    if endpoint.transport == "stdio":
        command = endpoint.command or []
        return StdioServerParameters(command=command[0], args=list(command[1:]))
    return str(endpoint.url)


def _describe(exc: BaseException) -> str:
    """One line naming the innermost causes (the SDK wraps transport errors in exception groups)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def tool_entry(tool: Any) -> dict[str, Any]:
    """A tools/list entry as plain JSON, with MCP's camelCase keys (``inputSchema``, ``outputSchema``)."""
    entry: dict[str, Any] = tool.model_dump(mode="json", by_alias=True, exclude_none=True)
    return entry


class McpToolSession:
    """One client session to one deployed MCP server."""

    def __init__(
        self, endpoint: McpEndpoint, *, timeout_s: float = 20.0, connect_timeout_s: float | None = None
    ):
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        """Per-call request timeout."""
        self.connect_timeout_s = connect_timeout_s if connect_timeout_s is not None else max(timeout_s, 10.0)
        """Budget for spawning/connecting and the handshake plus tools/list."""
        self.server_name: str | None = None
        """Name the server reported, once connected."""
        self.entries: list[dict[str, Any]] = []
        """The server's tools/list entries, once connected."""
        self._client: Client | None = None
        self._owner: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lock = asyncio.Lock()
        self._order = asyncio.Lock()
        """FIFO: the calls of a round reach the server in the order they were made (see ``call``)."""
        self._names: dict[str, str] = {}
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def connect(self) -> None:
        """Connect and list the tools; raises ``McpUnreachable`` when that fails."""
        async with self._lock:
            if self._client is not None:
                return
            await self._stop_owner()
            self._closing = asyncio.Event()
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._owner = asyncio.create_task(self._own(ready), name=f"mcp:{self.endpoint.describe()}")
            try:
                await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout_s)
            except TimeoutError:
                await self._stop_owner()
                raise McpUnreachable(
                    f"MCP server {self.endpoint.describe()!r} unreachable: "
                    f"no session within {self.connect_timeout_s:g}s"
                ) from None
            except McpUnreachable:
                await self._stop_owner()
                raise

    async def _own(self, ready: asyncio.Future[None]) -> None:
        """Hold the SDK client open (entered and left in this one task) until closing."""
        from mcp import Client

        try:
            async with Client(_target(self.endpoint), read_timeout_seconds=self.timeout_s) as client:
                entries = await _list_tools(client)
                self.entries = entries
                self.server_name = client.server_info.name if client.server_info else None
                self._names = _name_map(entries)
                self._client = client
                ready.set_result(None)
                await self._closing.wait()
        except Exception as exc:  # any failure here means the server is gone or never came
            problem = McpUnreachable(f"MCP server {self.endpoint.describe()!r} unreachable: {_describe(exc)}")
            if not ready.done():
                ready.set_exception(problem)
            else:
                log.info("MCP session ended: %s", problem)
        finally:
            self._client = None

    async def _stop_owner(self) -> None:
        owner, self._owner = self._owner, None
        if owner is None:
            return
        self._closing.set()
        try:
            await asyncio.wait_for(owner, CLOSE_TIMEOUT_S)
        except TimeoutError:
            log.warning("MCP session with %s did not close in time", self.endpoint.describe())
        except Exception as exc:  # closing must not fail the caller
            log.info("MCP session close: %s", _describe(exc))

    async def aclose(self) -> None:
        """Close the session (a stdio server process exits with it); idempotent."""
        self._closed = True
        async with self._lock:
            await self._stop_owner()

    async def __aenter__(self) -> Self:
        """Enter without connecting: the first call connects, and an outage is a call result, not a raise."""
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- calls -------------------------------------------------------------------------------

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Call a tool; every failure becomes a ``ToolResult`` with an ``error_kind``.

        Calls made together (one agent turn's) run one after another in the order they were made:
        a deployed server keeps state, and a search racing a create must not see it or not by chance
        (a rollout handled again must get the same results).
        """
        start = time.perf_counter()
        async with self._order:
            result = await self._call(name, arguments)
        return result.model_copy(update={"latency_ms": (time.perf_counter() - start) * 1000})

    async def _call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        from mcp.shared.exceptions import MCPError

        if self._closed:
            return _failure("unreachable", f"Error: the MCP session for {name!r} is closed.", "none")
        client = self._client
        if client is None:  # never connected, or the connection dropped: try once more
            try:
                await self.connect()
            except McpUnreachable as exc:
                return _failure("unreachable", f"Error: {exc}", "mcp")
            client = self._client
            if client is None:
                return _failure("unreachable", "Error: MCP server unreachable: session closed", "mcp")
        rejected = self._precheck(name, arguments)
        if rejected is not None:
            return rejected
        real_name = self._names[name]
        try:
            # The SDK's request clock answers REQUEST_TIMEOUT; the outer guard covers a stuck transport.
            async with asyncio.timeout(self.timeout_s + 5):
                answer = await client.call_tool(real_name, arguments, read_timeout_seconds=self.timeout_s)
        except MCPError as exc:
            return self._protocol_error(name, exc)
        except TimeoutError:
            return _failure("timeout", f"Error: tool {name!r} timed out after {self.timeout_s:g}s.", "mcp")
        except RuntimeError as exc:  # the SDK's output-schema check of structured content
            if "schema" in str(exc) or "structured content" in str(exc):
                return _failure("tool_error", f"Error: tool {name!r} returned invalid output: {exc}", "mcp")
            self._client = None
            return _failure("unreachable", f"Error: MCP server unreachable: {_describe(exc)}", "mcp")
        except ValidationError as exc:  # the server answered something that is not a tool result
            return _failure("tool_error", f"Error: tool {name!r} returned a malformed result: {exc}", "mcp")
        except Exception as exc:  # transport broke under the call
            self._client = None
            return _failure("unreachable", f"Error: MCP server unreachable: {_describe(exc)}", "mcp")
        return _from_result(answer)

    def _precheck(self, name: str, arguments: dict[str, Any]) -> ToolResult | None:
        if name not in self._names:
            known = ", ".join(sorted(self._names)) or "none"
            return _failure(
                "unknown_tool", f"Error: unknown tool {name!r}. Available tools: {known}.", "none"
            )
        schema = self._schema(self._names[name])
        problems = schema_errors(arguments, schema) if schema else []
        if problems:
            text = f"Error: invalid arguments for {name!r}: " + "; ".join(problems)
            return _failure("bad_arguments", text, "none")
        return None

    def _schema(self, real_name: str) -> dict[str, Any] | None:
        for entry in self.entries:
            if entry.get("name") == real_name and isinstance(entry.get("inputSchema"), dict):
                schema: dict[str, Any] = entry["inputSchema"]
                return schema
        return None

    def _protocol_error(self, name: str, exc: MCPError) -> ToolResult:
        from mcp.types import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT

        if exc.code == REQUEST_TIMEOUT:
            return _failure("timeout", f"Error: tool {name!r} timed out after {self.timeout_s:g}s.", "mcp")
        if exc.code == CONNECTION_CLOSED:
            self._client = None
            return _failure("unreachable", f"Error: MCP server unreachable: {exc.message}", "mcp")
        kind: ErrorKind = "bad_arguments" if exc.code == INVALID_PARAMS else "tool_error"
        return _failure(kind, f"Error {exc.code}: {exc.message}", "mcp")


def _failure(kind: ErrorKind, text: str, source: Literal["mcp", "none"]) -> ToolResult:
    return ToolResult(ok=False, content=text, error_kind=kind, source=source)


def _text_of(result: CallToolResult) -> str:
    from mcp.types import TextContent

    parts = [block.text for block in result.content if isinstance(block, TextContent)]
    if parts:
        return "\n".join(parts)
    return json.dumps([block.model_dump(mode="json", by_alias=True) for block in result.content])


def _from_result(result: CallToolResult) -> ToolResult:
    if result.is_error:
        text = _text_of(result)
        kind: ErrorKind = "bad_arguments" if any(m in text for m in _VALIDATION_MARKERS) else "tool_error"
        if text.startswith("Unknown tool"):
            kind = "unknown_tool"
        return _failure(kind, text if text.lower().startswith("error") else f"Error: {text}", "mcp")
    if result.structured_content is not None:
        content = json.dumps(result.structured_content, ensure_ascii=False)
    else:
        content = _text_of(result)
    return ToolResult(ok=True, content=content, source="mcp")


async def _list_tools(client: Client) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(100):  # a server that paginates forever cannot hang us
        page = await client.list_tools(cursor=cursor)
        entries.extend(tool_entry(t) for t in page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return entries


def _name_map(entries: list[dict[str, Any]]) -> dict[str, str]:
    """Name the agent may use -> the server's tool name (normalisation sanitises names)."""
    names: dict[str, str] = {}
    for entry in entries:
        real = entry.get("name")
        if isinstance(real, str) and real:
            names.setdefault(real, real)
            names.setdefault(sanitize_tool_name(real), real)
    return names

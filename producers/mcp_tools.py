"""Tool docs from a live MCP server: its ``tools/list`` as a ``tools.raw`` record.

``arena publish mcp`` wraps ``fetch_mcp_server``. The record keeps the endpoint,
so later stages call the real server instead of emulating it. Entries are the
tools/list entries as the server sent them (MCP camelCase keys): ``name``,
``description``, ``inputSchema`` and, when the server declares one,
``outputSchema`` (the tools-servers stage turns it into
``NormalizedTool.response_schema``).
"""

from __future__ import annotations

from arena.records.tools import McpEndpoint, RawToolServer, ToolDocFormat
from synthesis.tools.mcp_client import McpToolSession

OUTPUT_SCHEMA_KEY = "outputSchema"
"""Key of a tool's output JSON Schema in the entries (MCP's own spelling)."""


async def fetch_mcp_server(
    endpoint: McpEndpoint, name: str | None = None, *, timeout_s: float = 30.0
) -> RawToolServer:
    """Connect to a deployed MCP server, list its tools and describe it as a ``RawToolServer``.

    ``name`` overrides the name the server reports. Raises ``McpUnreachable``
    when the server cannot be reached and ``ValueError`` when it lists no tools.
    """
    session = McpToolSession(endpoint, timeout_s=timeout_s)
    try:
        await session.connect()
        entries = list(session.entries)
        reported = session.server_name
    finally:
        await session.aclose()
    if not entries:
        raise ValueError(f"MCP server {endpoint.describe()!r} lists no tools")
    return RawToolServer(
        server=name or reported or endpoint.describe(),
        source=endpoint.describe(),
        format=ToolDocFormat.mcp,
        entries=entries,
        endpoint=endpoint,
    )

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

from typing import TYPE_CHECKING

from arena.config import ArenaSettings
from arena.records.sft import ServerRef
from synthesis.sft.emulator import Emulator
from synthesis.tools.mcp_client import McpToolSession, McpUnreachable
from synthesis.tools.tool_results import ToolSession

if TYPE_CHECKING:
    from arena.llm.gateway import Gateway


async def open_session(
    server: ServerRef, gateway: Gateway, settings: ArenaSettings, session_id: str
) -> ToolSession:
    """A tool session for one rollout on ``server``: real MCP when deployed, the emulator otherwise.

    Opening a deployed server's session tries to connect; when the server cannot
    be reached the session still opens and each call answers ``unreachable``
    (after one reconnection attempt), so a rollout records the outage instead of crashing.
    """
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

"""The sample MCP servers, the MCP client and ``fetch_mcp_server`` over real stdio and HTTP transports.

Every server runs as its own process: stdio servers are spawned by the client
per session, HTTP servers are started here on a free 127.0.0.1 port and
stopped by PID.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from arena.config import ArenaSettings
from arena.llm.gateway import Gateway
from arena.records.sft import ServerRef
from arena.records.tools import McpEndpoint, RawToolServer, ToolDocFormat
from producers.mcp_tools import OUTPUT_SCHEMA_KEY, fetch_mcp_server
from simulator.backend import RulesBackend
from synthesis.sft.tool_pool import open_session
from synthesis.tools.mcp_client import McpToolSession, McpUnreachable
from synthesis.tools.normalize import normalize_server
from synthesis.tools.tool_results import ToolResult, schema_errors
from tests.fixtures import free_ports

pytestmark = pytest.mark.integration

SERVERS = {"notes": "arena-notes", "library": "arena-library"}


def stdio(module: str) -> McpEndpoint:
    return McpEndpoint(transport="stdio", command=[sys.executable, "-m", f"samples.mcp.{module}"])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGCONT)  # a test may have paused it
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _start_http(module: str) -> tuple[subprocess.Popen[bytes], McpEndpoint]:
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", f"samples.mcp.{module}", "--transport", "http", "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{module} server exited: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, McpEndpoint(transport="http", url=f"http://127.0.0.1:{port}/mcp")
        except OSError:
            time.sleep(0.1)
    _stop(proc)
    raise RuntimeError(f"{module} server did not listen on port {port} within 30 s")


@pytest.fixture(scope="module")
def http_servers() -> Iterator[dict[str, McpEndpoint]]:
    """Both sample servers over streamable HTTP, for the whole module."""
    started = {name: _start_http(name) for name in SERVERS}
    try:
        yield {name: endpoint for name, (_, endpoint) in started.items()}
    finally:
        for proc, _ in started.values():
            _stop(proc)


@pytest.fixture
def own_http_server() -> Iterator[tuple[subprocess.Popen[bytes], McpEndpoint]]:
    """A notes server this test may pause and kill."""
    proc, endpoint = _start_http("notes")
    try:
        yield proc, endpoint
    finally:
        _stop(proc)


def endpoints(http: dict[str, McpEndpoint], module: str) -> list[McpEndpoint]:
    return [stdio(module), http[module]]


def payload(result: ToolResult) -> dict[str, Any]:
    assert result.ok, result.content
    assert result.source == "mcp" and result.error_kind is None
    data: dict[str, Any] = json.loads(result.content)
    return data


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(SERVERS))
def test_fetch_mcp_server_builds_a_raw_server_over_both_transports(
    http_servers: dict[str, McpEndpoint], module: str
) -> None:
    for endpoint in endpoints(http_servers, module):
        raw = asyncio.run(fetch_mcp_server(endpoint))
        assert isinstance(raw, RawToolServer)
        assert raw.server == SERVERS[module] and raw.format == ToolDocFormat.mcp
        assert raw.endpoint == endpoint and raw.source == endpoint.describe()
        assert len(raw.entries) >= 4
        for entry in raw.entries:
            assert {"name", "description", "inputSchema", OUTPUT_SCHEMA_KEY} <= entry.keys()
            assert entry["inputSchema"]["type"] == "object"
            assert all("description" in p for p in entry["inputSchema"].get("properties", {}).values())
        outcome = normalize_server(raw)
        assert not outcome.rejections
        assert all(t.response_schema is not None for t in outcome.tools)
    named = asyncio.run(fetch_mcp_server(stdio(module), name="renamed"))
    assert named.server == "renamed"


def test_fetch_mcp_server_raises_when_unreachable() -> None:
    (port,) = free_ports(1)
    with pytest.raises(McpUnreachable, match="unreachable"):
        asyncio.run(fetch_mcp_server(McpEndpoint(transport="http", url=f"http://127.0.0.1:{port}/mcp")))


def test_notes_chain_over_stdio_and_http(http_servers: dict[str, McpEndpoint]) -> None:
    async def chain(endpoint: McpEndpoint) -> None:
        async with McpToolSession(endpoint, timeout_s=10) as session:
            note = payload(
                await session.call("create_note", {"title": "Trip to Porto", "content": "Pack rain gear"})
            )
            note_id = note["note_id"]
            assert payload(await session.call("get_note", {"note_id": note_id}))["title"] == "Trip to Porto"
            tagged = payload(await session.call("tag_note", {"note_id": note_id, "add": ["travel"]}))
            assert tagged["tags"] == ["travel"]
            hits = payload(await session.call("search_notes", {"query": "porto rain", "tag": "travel"}))
            assert [m["note_id"] for m in hits["matches"]] == [note_id]
            listed = payload(await session.call("list_notes", {"tag": "travel"}))
            assert note_id in [n["note_id"] for n in listed["notes"]]
            assert payload(await session.call("delete_note", {"note_id": note_id}))["deleted"] is True
            gone = await session.call("get_note", {"note_id": note_id})
            assert not gone.ok and gone.error_kind == "tool_error" and gone.source == "mcp"
            assert note_id in gone.content and "not found" in gone.content

    for endpoint in endpoints(http_servers, "notes"):
        asyncio.run(chain(endpoint))


def test_library_chain_reserves_and_cancels(http_servers: dict[str, McpEndpoint]) -> None:
    async def chain(endpoint: McpEndpoint) -> None:
        async with McpToolSession(endpoint, timeout_s=10) as session:
            found = payload(await session.call("search_books", {"query": "frankenstein"}))
            (book,) = found["books"]
            book_id = book["book_id"]
            assert payload(await session.call("get_book", {"book_id": book_id}))["author"] == "Mary Shelley"
            stock = payload(await session.call("check_availability", {"book_id": book_id}))
            branch = next(b["branch"] for b in stock["branches"] if b["copies_available"] > 0)
            args = {"book_id": book_id, "patron_id": "P20417", "branch": branch}
            reservation = payload(await session.call("reserve_book", args))
            assert reservation["status"] == "active"
            mine = payload(await session.call("list_reservations", {"patron_id": "P20417"}))
            assert reservation["reservation_id"] in [r["reservation_id"] for r in mine["reservations"]]
            rid = {"reservation_id": reservation["reservation_id"]}
            assert payload(await session.call("cancel_reservation", rid))["status"] == "cancelled"
            again = await session.call("cancel_reservation", rid)
            assert again.error_kind == "tool_error" and "already cancelled" in again.content
            for output, tool in ((stock, "check_availability"), (reservation, "reserve_book")):
                schema = next(e[OUTPUT_SCHEMA_KEY] for e in session.entries if e["name"] == tool)
                assert schema_errors(output, schema) == []

    for endpoint in endpoints(http_servers, "library"):
        asyncio.run(chain(endpoint))


def test_calls_the_server_cannot_take_map_to_errors(http_servers: dict[str, McpEndpoint]) -> None:
    async def check() -> None:
        async with McpToolSession(http_servers["library"], timeout_s=10) as session:
            unknown = await session.call("renew_loan", {"book_id": "x"})
            assert (unknown.ok, unknown.error_kind, unknown.source) == (False, "unknown_tool", "none")
            assert "search_books" in unknown.content
            missing = await session.call("reserve_book", {"book_id": "bk_1"})
            assert (missing.error_kind, missing.source) == ("bad_arguments", "none")
            assert "patron_id" in missing.content and "branch" in missing.content
            wrong = await session.call("search_books", {"query": "x", "limit": "ten"})
            assert wrong.error_kind == "bad_arguments" and "limit" in wrong.content
            enum = await session.call("check_availability", {"book_id": "bk_1", "branch": "moon"})
            assert enum.error_kind == "bad_arguments"
            bad_id = await session.call("get_book", {"book_id": "bk_missing"})
            assert (bad_id.error_kind, bad_id.source) == ("tool_error", "mcp")
            assert "bk_missing" in bad_id.content
            assert all(r.latency_ms >= 0 for r in (unknown, missing, wrong, bad_id))

    asyncio.run(check())


def test_stdio_sessions_each_get_their_own_server_process() -> None:
    async def check() -> None:
        async with McpToolSession(stdio("notes")) as first, McpToolSession(stdio("notes")) as second:
            payload(await first.call("create_note", {"title": "Only here", "content": "x"}))
            assert payload(await first.call("list_notes", {}))["total"] == 4
            assert payload(await second.call("list_notes", {}))["total"] == 3

    asyncio.run(check())


def test_paused_server_times_out_and_dead_server_is_unreachable(
    own_http_server: tuple[subprocess.Popen[bytes], McpEndpoint],
) -> None:
    proc, endpoint = own_http_server

    async def check() -> None:
        session = McpToolSession(endpoint, timeout_s=1.0)
        await session.connect()
        payload(await session.call("list_notes", {}))
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            stalled = await session.call("list_notes", {})
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert (stalled.ok, stalled.error_kind, stalled.source) == (False, "timeout", "mcp")
        assert 900 <= stalled.latency_ms < 10_000
        payload(await session.call("list_notes", {}))  # transient: the next call works
        _stop(proc)
        for _ in range(2):  # the broken session, then the failed reconnection
            dead = await session.call("list_notes", {})
            assert (dead.ok, dead.error_kind) == (False, "unreachable")
        await session.aclose()
        closed = await session.call("list_notes", {})
        assert closed.error_kind == "unreachable"

    asyncio.run(check())


def test_open_session_uses_mcp_for_deployed_servers(http_servers: dict[str, McpEndpoint]) -> None:
    raw = asyncio.run(fetch_mcp_server(http_servers["notes"]))
    ref = ServerRef(
        server_id="srv-notes",
        name=raw.server,
        domain="productivity",
        tools=normalize_server(raw).tools,
        endpoint=raw.endpoint,
    )
    settings = ArenaSettings(sft={"tool_timeout_s": 5})

    async def check() -> None:
        gateway = Gateway(RulesBackend(seed=0))
        async with await open_session(ref, gateway, settings, session_id="t-1") as session:
            assert isinstance(session, McpToolSession)
            listed = payload(await session.call("list_notes", {"limit": 2}))
            assert len(listed["notes"]) == 2
        down = ref.model_copy(
            update={"endpoint": McpEndpoint(transport="stdio", command=["/nonexistent/server"])}
        )
        async with await open_session(down, gateway, settings, session_id="t-2") as session:
            failed = await session.call("list_notes", {})
            assert (failed.error_kind, failed.source) == ("unreachable", "mcp")
        await gateway.aclose()

    asyncio.run(check())


def test_a_logical_clock_makes_a_sessions_timestamps_repeat() -> None:
    """``--clock``: each stdio session starts at the same instant and advances 1 s per reading."""
    command = [sys.executable, "-m", "samples.mcp.notes", "--clock", "2026-01-01T00:00:00+00:00"]
    endpoint = McpEndpoint(transport="stdio", command=command)

    async def session_stamps() -> list[str]:
        async with McpToolSession(endpoint, timeout_s=10) as session:
            note = payload(await session.call("create_note", {"title": "Clock", "content": "tick"}))
            tagged = payload(await session.call("tag_note", {"note_id": note["note_id"], "add": ["x"]}))
            return [note["created_at"], tagged["updated_at"]]

    first, second = asyncio.run(session_stamps()), asyncio.run(session_stamps())
    assert first == second
    assert first[0].startswith("2026-01-01T00:00:") and first[1] > first[0]


def test_calls_made_together_reach_the_server_in_order() -> None:
    """One agent turn's calls (made at once): a search after a create always finds the note."""

    async def turn() -> list[dict[str, Any]]:
        async with McpToolSession(stdio("notes"), timeout_s=10) as session:
            await session.connect()
            send = session._call

            async def slow_create(name: str, arguments: dict[str, Any]) -> Any:
                if name == "create_note":  # the first call is held up on its way (a busy loop, a slow pipe)
                    await asyncio.sleep(0.3)
                return await send(name, arguments)

            session._call = slow_create  # type: ignore[method-assign]
            results = await asyncio.gather(
                session.call("create_note", {"title": "Porto", "content": "packing list"}),
                session.call("search_notes", {"query": "packing list"}),
                session.call("list_notes", {}),
            )
            return [payload(r) for r in results]

    for _ in range(2):
        created, found, listed = asyncio.run(turn())
        assert [m["note_id"] for m in found["matches"]] == [created["note_id"]]
        assert created["note_id"] in [n["note_id"] for n in listed["notes"]]

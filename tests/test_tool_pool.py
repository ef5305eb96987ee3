"""The tool pool: doc-only servers open an emulator session wired to the settings; results fit the records."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from arena.config import ArenaSettings
from arena.llm.gateway import Gateway
from arena.records.sft import CallStatus, ServerRef
from producers.tool_docs import load_tool_docs
from simulator.backend import RulesBackend
from synthesis.sft.emulator import Emulator
from synthesis.sft.tool_pool import open_session
from synthesis.tools.normalize import normalize_server
from synthesis.tools.tool_results import ToolResult

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "tools" / "good"


def notes_server() -> ServerRef:
    (raw,) = load_tool_docs([SAMPLES / "notes_mcp.json"]).servers
    return ServerRef(
        server_id="srv-notes", name=raw.server, domain="productivity", tools=normalize_server(raw).tools
    )


def test_tool_result_fields_are_described_and_fit_call_status() -> None:
    schema = ToolResult.model_json_schema()
    assert all(field.get("description") for field in schema["properties"].values())
    result = ToolResult(ok=False, content="Error: x", error_kind="timeout", source="emulator", latency_ms=3.5)
    status = CallStatus(call_id="call_1_0", tool="get_note", **result.model_dump(exclude={"content"}))
    assert (status.ok, status.error_kind, status.source, status.latency_ms) == (
        False,
        "timeout",
        "emulator",
        3.5,
    )


def test_doc_only_server_opens_an_emulator_with_the_settings() -> None:
    server = notes_server()
    args = {"title": "Standup", "content": "Notes from Monday"}

    async def check() -> None:
        gateway = Gateway(RulesBackend(seed=0))
        never = ArenaSettings(seed=5, sft={"emulator_failure_rate": 0.0})
        always = ArenaSettings(seed=5, sft={"emulator_failure_rate": 1.0})
        async with await open_session(server, gateway, never, session_id="s-1") as session:
            assert isinstance(session, Emulator)
            assert (session.failure_rate, session.seed, session.server) == (0.0, 5, "notes-server")
            results = [await session.call("create_note", args) for _ in range(20)]
            assert all(r.ok and r.source == "emulator" for r in results)
        async with await open_session(server, gateway, always, session_id="s-1") as session:
            failed = [await session.call("create_note", args) for _ in range(20)]
            assert all(r.error_kind in ("timeout", "unreachable") for r in failed)
        default = await open_session(server, gateway, ArenaSettings(), session_id="s-1")
        assert isinstance(default, Emulator) and default.failure_rate == 0.2
        await default.aclose()
        await gateway.aclose()

    asyncio.run(check())


def test_a_parallel_round_is_applied_in_call_order() -> None:
    server = notes_server()
    settings = ArenaSettings(sft={"emulator_failure_rate": 0.25})

    async def rollout() -> list[str]:
        gateway = Gateway(RulesBackend(seed=0))
        session = await open_session(server, gateway, settings, session_id="parallel")
        first = await asyncio.gather(
            *(
                session.call("create_note", {"title": f"Note {i}", "content": "x", "tags": ["t"]})
                for i in range(4)
            )
        )
        ids = [json.loads(r.content)["note_id"] for r in first if r.ok]
        second = await asyncio.gather(
            session.call("search_notes", {"query": "note", "tag": "t"}),
            *(session.call("get_note", {"note_id": i}) for i in ids),
        )
        await session.aclose()
        await gateway.aclose()
        return [r.content for r in (*first, *second)]

    once = asyncio.run(rollout())
    assert asyncio.run(rollout()) == once
    assert any(c.startswith("Error") for c in once) and any(c.startswith("{") for c in once)

"""The stateful tool emulator and its rules synthesiser, through the real gateway and rules backend."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from arena.llm.gateway import Gateway
from arena.records.tools import NormalizedTool
from producers.tool_docs import load_tool_docs
from simulator import RULES
from simulator.backend import RulesBackend
from simulator.emulation import emulate
from synthesis.sft.emulated_results import Generator, finish
from synthesis.sft.emulator import Emulator
from synthesis.sft.roles.emulation import TOOL_EMULATION, EmulationInput, EntityView, noun_of, operation_of
from synthesis.tools.normalize import normalize_server
from synthesis.tools.tool_results import ToolResult, schema_errors

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "tools" / "good"
T = TypeVar("T")


@pytest.fixture(scope="module")
def servers() -> dict[str, list[NormalizedTool]]:
    loaded = load_tool_docs(sorted(SAMPLES.iterdir()))
    return {s.server: normalize_server(s).tools for s in loaded.servers}


def run(factory: Callable[[Gateway], Awaitable[T]]) -> T:
    """Run ``factory(gateway)`` on a fresh rules-backed gateway."""

    async def main() -> T:
        gateway = Gateway(RulesBackend(seed=0))
        try:
            return await factory(gateway)
        finally:
            await gateway.aclose()

    return asyncio.run(main())


def valid_arguments(tool: NormalizedTool, variant: int) -> dict[str, Any]:
    """Arguments that satisfy the tool's parameter schema (drawn by the same schema-driven generator)."""
    seed_input = EmulationInput(tool=tool, arguments={"variant": variant}, operation="read", variant=variant)
    args: dict[str, Any] = Generator(seed_input).value(tool.function.parameters)
    assert schema_errors(args, tool.function.parameters) == [], (tool.function.name, args)
    return args


def data(result: ToolResult) -> Any:
    assert result.ok, result.content
    assert result.source == "emulator" and result.error_kind is None
    return json.loads(result.content)


# ---------------------------------------------------------------------------------------------
# failures


def test_failure_rate_is_twenty_percent_reproducible_and_transient(
    servers: dict[str, list[NormalizedTool]],
) -> None:
    async def sweep(gateway: Gateway, seed: int) -> list[ToolResult]:
        results = []
        for name, tools in servers.items():
            for session in range(12):
                emulator = Emulator(tools, gateway, f"{name}/{session}", seed=seed)
                for tool in tools:
                    results.append(await emulator.call(tool.function.name, valid_arguments(tool, session)))
        return results

    first = run(lambda gw: sweep(gw, seed=0))
    again = run(lambda gw: sweep(gw, seed=0))
    other = run(lambda gw: sweep(gw, seed=1))
    assert len(first) >= 500
    failed = [r for r in first if not r.ok]
    assert all(r.error_kind in ("timeout", "unreachable") and r.source == "emulator" for r in failed)
    assert 0.15 <= len(failed) / len(first) <= 0.25
    assert {r.error_kind for r in failed} == {"timeout", "unreachable"}
    assert any("504 Gateway Timeout" in r.content or "timed out" in r.content for r in failed)
    assert any("ECONNREFUSED" in r.content or "Unavailable" in r.content for r in failed)
    assert [r.content for r in again] == [r.content for r in first]  # reproducible
    assert [r.ok for r in other] != [r.ok for r in first]  # the seed decides which calls fail


def test_failures_are_not_cached_and_bad_calls_are_not_failures(
    servers: dict[str, list[NormalizedTool]],
) -> None:
    tool = next(t for t in servers["weather_openai"] if t.function.name == "get_current_weather")
    args = {"latitude": 45.76, "longitude": 4.84}

    async def check(gateway: Gateway) -> None:
        emulator = Emulator([tool], gateway, "retry", failure_rate=0.5, seed=3)
        results = [await emulator.call("get_current_weather", args) for _ in range(12)]
        successes = {r.content for r in results if r.ok}
        assert len(successes) == 1  # every success of the same call is the same answer
        assert any(not r.ok for r in results) and any(r.ok for r in results)
        assert emulator.calls == 12 and emulator.injected == sum(not r.ok for r in results)
        rejected = [
            await emulator.call("get_current_weather", {"latitude": 45.76}),
            await emulator.call("get_current_weather", {"latitude": "north", "longitude": 4.8}),
            await emulator.call("get_weather", args),
        ]
        assert [r.error_kind for r in rejected] == ["bad_arguments", "bad_arguments", "unknown_tool"]
        assert all(r.source == "none" and not r.ok for r in rejected)
        assert "longitude" in rejected[0].content and "required" in rejected[0].content
        assert "latitude" in rejected[1].content and "get_current_weather" in rejected[2].content
        assert emulator.calls == 12  # rejected calls never draw a failure

    run(check)


# ---------------------------------------------------------------------------------------------
# state


def test_same_call_same_result_and_sessions_differ(servers: dict[str, list[NormalizedTool]]) -> None:
    tools = servers["Hotel Booking API"]
    search = {"city": "Lyon", "check_in": "2025-07-01", "check_out": "2025-07-03"}

    async def check(gateway: Gateway) -> None:
        one = Emulator(tools, gateway, "session-a", failure_rate=0)
        two = Emulator(tools, gateway, "session-b", failure_rate=0)
        first = data(await one.call("searchHotels", search))
        assert data(await one.call("searchHotels", search)) == first
        assert data(await two.call("searchHotels", search)) != first
        hotels = first["hotels"]
        assert hotels and all(h["city"] == "Lyon" and "Lyon" in h["name"] for h in hotels)
        assert len({h["hotel_id"] for h in hotels}) == len(hotels)
        # an id from a listing reads back consistently in a later call
        detail = data(await one.call("getHotel", {"hotel_id": hotels[0]["hotel_id"]}))
        assert {k: detail[k] for k in hotels[0]} == hotels[0]

    run(check)


def test_reads_see_writes_on_notes(servers: dict[str, list[NormalizedTool]]) -> None:
    tools = servers["notes-server"]

    async def check(gateway: Gateway) -> None:
        em = Emulator(tools, gateway, "notes", failure_rate=0)
        created = data(
            await em.call("create_note", {"title": "Budget plan", "content": "Q3 draft", "tags": ["work"]})
        )
        note_id = created["note_id"]
        assert note_id.startswith("note_")
        assert (
            data(
                await em.call(
                    "create_note", {"title": "Budget plan", "content": "Q3 draft", "tags": ["work"]}
                )
            )
            == created
        )
        note = data(await em.call("get_note", {"note_id": note_id}))
        assert (note["title"], note["content"], note["tags"]) == ("Budget plan", "Q3 draft", ["work"])
        assert note["updated_at"] == created["created_at"]
        assert data(await em.call("add_tag", {"note_id": note_id, "tag": "finance"}))["tags"] == [
            "work",
            "finance",
        ]
        data(await em.call("update_note", {"note_id": note_id, "content": "Q3 final"}))
        note = data(await em.call("get_note", {"note_id": note_id}))
        assert (note["content"], note["tags"]) == ("Q3 final", ["work", "finance"])
        found = data(await em.call("search_notes", {"query": "budget", "tag": "finance"}))
        assert found["notes"][0]["note_id"] == note_id and found["notes"][0]["title"] == "Budget plan"
        unrelated = data(await em.call("search_notes", {"query": "holiday"}))
        assert note_id not in [n["note_id"] for n in unrelated["notes"]]
        assert data(await em.call("delete_note", {"note_id": note_id})) == {"deleted": True}
        gone = await em.call("get_note", {"note_id": note_id})
        assert (gone.ok, gone.error_kind, gone.source) == (False, "tool_error", "emulator")
        assert "404" in gone.content and note_id in gone.content
        after = data(await em.call("search_notes", {"query": "budget", "tag": "finance"}))
        assert note_id not in [n["note_id"] for n in after["notes"]]

    run(check)


def test_reads_see_writes_on_bookings_files_and_carts(servers: dict[str, list[NormalizedTool]]) -> None:
    async def check(gateway: Gateway) -> None:
        hotels = Emulator(servers["Hotel Booking API"], gateway, "trip", failure_rate=0)
        booking = data(
            await hotels.call(
                "createBooking",
                {
                    "hotel_id": "hotel_1a2b",
                    "room_id": "room_9",
                    "check_in": "2025-07-01",
                    "check_out": "2025-07-03",
                    "guest_name": "Ana Lima",
                    "guest_email": "ana@example.com",
                },
            )
        )
        assert (booking["status"], booking["hotel_id"]) == ("confirmed", "hotel_1a2b")
        key = {"booking_id": booking["booking_id"]}
        assert data(await hotels.call("getBooking", key))["status"] == "confirmed"
        assert data(await hotels.call("cancelBooking", key))["status"] == "cancelled"
        again = data(await hotels.call("getBooking", key))
        assert (again["status"], again["room_id"], again["check_in"]) == ("cancelled", "room_9", "2025-07-01")

        files = Emulator(servers["filesystem"], gateway, "fs", failure_rate=0)
        path = "/docs/todo.md"
        data(await files.call("write_file", {"path": path, "content": "- call Dana"}))
        assert data(await files.call("read_file", {"path": path}))["content"] == "- call Dana"
        listing = data(await files.call("list_directory", {"path": "/docs"}))
        assert path in [e["path"] for e in listing["entries"]]

        shop = Emulator(servers["shop_catalog"], gateway, "shop", failure_rate=0)
        cart = data(await shop.call("add_to_cart", {"product_id": "prod_77", "quantity": 2}))
        order = data(
            await shop.call(
                "checkout",
                {
                    "cart_id": cart["cart_id"],
                    "shipping_address": {
                        "street": "1 Main St",
                        "city": "Ghent",
                        "postal_code": "9000",
                        "country": "BE",
                    },
                    "payment_method": "card",
                },
            )
        )
        assert (
            data(await shop.call("track_order", {"order_id": order["order_id"]}))["order_id"]
            == order["order_id"]
        )

    run(check)


def test_results_follow_response_schemas(servers: dict[str, list[NormalizedTool]]) -> None:
    async def check(gateway: Gateway) -> int:
        checked = 0
        for name, tools in servers.items():
            for variant in range(3):
                em = Emulator(tools, gateway, f"{name}:{variant}", failure_rate=0)
                for tool in tools:
                    result = await em.call(tool.function.name, valid_arguments(tool, variant))
                    if not result.ok:  # a 404 after an emulated delete of the same id
                        assert result.error_kind == "tool_error"
                        continue
                    value = json.loads(result.content)
                    if tool.response_schema is None:
                        assert isinstance(value, dict) and value
                    else:
                        assert schema_errors(value, tool.response_schema) == [], (tool.function.name, value)
                    checked += 1
        return checked

    assert run(check) >= 100


def test_doc_without_response_schema_echoes_the_arguments(servers: dict[str, list[NormalizedTool]]) -> None:
    base = next(t for t in servers["notes-server"] if t.function.name == "create_note")
    tool = base.model_copy(update={"response_schema": None})

    async def check(gateway: Gateway) -> None:
        em = Emulator([tool], gateway, "echo", failure_rate=0)
        value = data(await em.call("create_note", {"title": "Groceries", "content": "milk"}))
        assert value["title"] == "Groceries" and value["content"] == "milk"
        assert value["note_id"].startswith("note_") and value["status"] == "created"

    run(check)


# ---------------------------------------------------------------------------------------------
# role and rule


def test_role_is_registered_and_renders(servers: dict[str, list[NormalizedTool]]) -> None:
    assert RULES[TOOL_EMULATION.name] is emulate
    tool = servers["notes-server"][0]
    inputs = EmulationInput(
        tool=tool, arguments={"title": "x", "content": "y"}, operation="create", variant=4
    )
    system, user = TOOL_EMULATION.messages(inputs)
    assert "response_schema" in system["content"] and '"result"' in system["content"]
    assert '"create_note"' in user["content"]
    assert (noun_of("getHotel"), noun_of("add_to_cart"), noun_of("list_notes")) == ("hotel", "cart", "note")
    assert [operation_of(n) for n in ("cancelBooking", "delete_note", "reserve_table", "search_files")] == [
        "update",
        "delete",
        "create",
        "read",
    ]


def test_rule_is_deterministic_and_finish_repairs_llm_answers(
    servers: dict[str, list[NormalizedTool]],
) -> None:
    tool = next(t for t in servers["Hotel Booking API"] if t.function.name == "getBooking")
    assert tool.response_schema is not None
    subject = EntityView(
        kind="booking",
        key_field="booking_id",
        key="booking_42",
        fields={"status": "cancelled", "room_id": "r1"},
    )
    inputs = EmulationInput(
        tool=tool, arguments={"booking_id": "booking_42"}, operation="read", subject=subject, variant=9
    )
    first = emulate(inputs, random.Random(0)).model_dump()
    assert emulate(inputs, random.Random(1)).model_dump() == first
    value = first["result"]
    assert (value["booking_id"], value["status"], value["room_id"]) == ("booking_42", "cancelled", "r1")
    assert schema_errors(value, tool.response_schema) == []
    # what a sloppy LLM might answer: wrong types, an invalid enum value, a stale status
    sloppy = {"booking_id": "booking_42", "status": "pending", "total_price": "129.5", "check_in": 20250701}
    repaired = finish(sloppy, inputs)
    assert schema_errors(repaired, tool.response_schema) == []
    assert repaired["total_price"] == 129.5 and repaired["status"] == "cancelled"
    assert repaired["check_in"] == "20250701" and repaired["room_id"] == "r1"

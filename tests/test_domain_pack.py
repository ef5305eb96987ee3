"""Domain packs (issue 6): the format, the loader's errors, the built-in customer-service pack.

The pack's tools run in a real sandbox session as EigenData runs them (``load_tools`` and
``call_tool`` of ``synthesis.eigen.dialog_loop``); its policy rules fire on violating calls.
"""

from __future__ import annotations

import asyncio
import copy
import json
import shutil
from pathlib import Path
from typing import Any, Literal

import pytest

from arena.config import SandboxSettings
from sandbox import SandboxPool
from synthesis.eigen.dialog_loop import call_tool, load_tools
from synthesis.eigen.packs import DomainPack, DomainPackError, builtin_pack_path, load_pack, schema_of
from synthesis.eigen.verification import field_class, replay_reference

pytestmark = pytest.mark.timeout(60)

POOL = SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 5.0})
READS = {
    "find_user_by_email",
    "get_user_details",
    "list_user_orders",
    "get_order_details",
    "get_product_details",
    "search_products",
    "get_refund_status",
}


@pytest.fixture(scope="module")
def pack() -> DomainPack:
    return load_pack(builtin_pack_path("customer_service"))


def _namespace(source: str, state: dict[str, Any] | None = None) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "under_test"}
    if state is not None:
        namespace["STATE"] = state
    exec(source, namespace)
    return namespace


# --------------------------------------------------------------------------- the built-in pack


def test_builtin_pack_loads_with_derived_schemas(pack: DomainPack) -> None:
    assert pack.name == "customer_service" and "Northwind" in pack.description
    assert "30 days" in pack.policy_text and "50 USD" in pack.policy_text
    names = pack.agent_tool_names
    assert len(names) >= 12 and len(set(names)) == len(names)
    assert READS <= set(names)
    writes = set(names) - READS
    assert {"cancel_order", "return_items", "exchange_item", "update_order_address", "issue_refund"} <= writes
    assert {"issue_store_credit", "transfer_to_human"} <= writes
    assert set(pack.user_tool_names) == {"confirm_identity_code", "report_damage", "approve_charge"}
    assert len(pack.rules) >= 6 and all(r.description and r.function == f"rule_{r.name}" for r in pack.rules)

    # The schemas are derived from the functions, not written by hand.
    tools = _namespace(pack.tools_source, {})
    for spec in pack.agent_tools + pack.user_tools:
        assert spec == schema_of(tools[spec["function"]["name"]])
    by_name = {t["function"]["name"]: t["function"] for t in pack.agent_tools}
    orders = by_name["list_user_orders"]["parameters"]
    assert orders["required"] == ["user_id"]
    assert orders["properties"]["status"]["enum"] == [
        "pending",
        "processing",
        "shipped",
        "delivered",
        "cancelled",
    ]
    returns = by_name["return_items"]["parameters"]["properties"]
    assert returns["item_ids"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": returns["item_ids"]["description"],
    }
    assert returns["reason"]["enum"][0] == "damaged"
    refund = by_name["issue_refund"]["parameters"]
    assert refund["properties"]["amount"]["type"] == "number" and refund["required"] == [
        "order_id",
        "amount",
        "reason",
    ]
    address = by_name["update_order_address"]["parameters"]
    assert address["properties"]["line2"]["default"] == "" and "line2" not in address["required"]
    assert address["additionalProperties"] is False
    assert by_name["search_products"]["parameters"]["properties"]["max_results"] == {
        "type": "integer",
        "description": "The most products returned.",
        "default": 5,
    }


def test_schema_of_types_and_docstrings() -> None:
    def book(
        title: str,
        copies: int,
        price: float,
        gift: bool,
        tags: list[str],
        shelf: Literal["a", "b"],
        note: str | None = None,
        rush: bool = False,
    ) -> dict[str, Any]:
        """Book a title.

        Longer explanation.

        Args:
            title: The title,
                over two lines.
            copies (int): How many.
            price: Unit price.
            gift: Gift-wrapped.
            tags: Labels.
            shelf: Which shelf.
            note: A note.
            rush: Express.

        Returns:
            Something.
        """
        return {}

    spec = schema_of(book)["function"]
    assert spec["name"] == "book" and spec["description"] == "Book a title. Longer explanation."
    props = spec["parameters"]["properties"]
    assert props["title"]["description"] == "The title, over two lines."
    assert [props[k]["type"] for k in props] == [
        "string",
        "integer",
        "number",
        "boolean",
        "array",
        "string",
        "string",
        "boolean",
    ]
    assert props["tags"]["items"] == {"type": "string"} and props["shelf"]["enum"] == ["a", "b"]
    assert "default" not in props["note"] and props["rush"]["default"] is False
    assert spec["parameters"]["required"] == ["title", "copies", "price", "gift", "tags", "shelf"]

    def untyped(order_id, amount: float) -> None:  # type: ignore[no-untyped-def]
        """Refund.

        Args:
            order_id: Order.
            amount: Amount.
        """

    with pytest.raises(DomainPackError, match="'order_id' of untyped has no type hint") as info:
        schema_of(untyped)
    assert "annotate it" in info.value.fix

    def undocumented(order_id: str) -> None:
        """Refund."""

    with pytest.raises(DomainPackError, match="'order_id' of undocumented is not described"):
        schema_of(undocumented)


# --------------------------------------------------------------------------- loader errors


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "pack"
    shutil.copytree(builtin_pack_path(), folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def _error(folder: Path) -> DomainPackError:
    with pytest.raises(DomainPackError) as info:
        load_pack(folder)
    return info.value


def test_loader_errors_name_file_field_and_fix(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    assert load_pack(folder).name == "customer_service"
    manifest = (folder / "domain.yaml").read_text()

    (folder / "domain.yaml").write_text("name: shop\nagent_tools: [a, b\n")
    error = _error(folder)
    assert error.file == "domain.yaml" and "invalid YAML at line" in str(error) and "Fix:" in str(error)

    (folder / "domain.yaml").write_text(manifest.replace("description:", "summary:", 1))
    error = _error(folder)
    assert error.file == "domain.yaml" and error.field in ("description", "summary")

    (folder / "domain.yaml").write_text(
        manifest.replace("  - approve_charge", "  - approve_charge\n  - waive_fee")
    )
    error = _error(folder)
    assert (error.file, error.field) == ("tools.py", "user_tools")
    assert "waive_fee" in str(error) and "define def waive_fee" in error.fix

    # A tool without type hints.
    (folder / "tools.py").write_text(
        (folder / "tools.py").read_text()
        + '\n\ndef waive_fee(order_id):\n    """Waive a fee.\n\n    Args:\n        order_id: The order.\n    """\n'
    )
    error = _error(folder)
    assert (error.file, error.field) == ("tools.py", "waive_fee")
    assert "no type hint" in error.problem and "annotate" in error.fix
    (folder / "domain.yaml").write_text(manifest)

    tools = (folder / "tools.py").read_text()
    (folder / "tools.py").write_text("import requests\n" + tools)
    error = _error(folder)
    assert error.file == "tools.py" and "not in the standard library" in str(error)
    (folder / "tools.py").write_text(
        tools.replace('STATE: dict[str, Any] = globals().setdefault("STATE", {})', "STATE = {}")
    )
    error = _error(folder)
    assert (error.file, error.field) == ("tools.py", "STATE") and "setdefault" in error.fix
    (folder / "tools.py").write_text(tools)

    (folder / "policy.py").unlink()
    error = _error(folder)
    assert error.file == "policy.py" and "missing" in str(error) and "generator.py" in error.fix

    assert "not a folder" in str(_error(tmp_path / "nowhere"))
    with pytest.raises(DomainPackError, match="no built-in domain pack 'airline'"):
        builtin_pack_path("airline")


# --------------------------------------------------------------------------- generator


def test_generator_is_seeded(pack: DomainPack) -> None:
    first = pack.generate(7)
    assert first == pack.generate(7)
    assert first != pack.generate(8)
    assert json.loads(json.dumps(first)) == first
    medium = pack.generate(7, "medium")
    assert len(medium["users"]) > len(first["users"]) and len(first["users"]) == 8
    assert {"users", "orders", "products", "session", "refunds", "credits", "damage_reports"} <= set(first)
    with pytest.raises(ValueError, match="size must be one of"):
        pack.generate(7, "huge")
    for seed in range(10):  # every seed's database carries the demo task
        assert pack.reference_task(pack.generate(seed), seed)["calls"]


# --------------------------------------------------------------------------- tools in the sandbox


async def _run_calls(
    pool: SandboxPool, code: str, state: dict[str, Any], calls: list[dict[str, Any]]
) -> tuple[list[bool], list[Any], dict[str, Any]]:
    """Run ``calls`` in one session from ``state``: whether each ran, its value or error, the final state."""
    oks: list[bool] = []
    values: list[Any] = []
    async with await pool.open_session() as session:
        loaded = await load_tools(session, code, state)
        assert loaded.ok, loaded.error
        for call in calls:
            run = await call_tool(session, call["name"], call["arguments"])
            oks.append(run.ok)
            values.append(run.value if run.ok else run.result.error)
        final = await session.read("STATE")
    assert final.ok and isinstance(final.return_value, dict)
    return oks, values, final.return_value


def _without_skipped(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_skipped(v) for k, v in value.items() if field_class(k) != "SKIP"}
    if isinstance(value, list):
        return [_without_skipped(v) for v in value]
    return value


def test_tools_run_in_the_sandbox(pack: DomainPack) -> None:
    state = pack.generate(1)
    task = pack.reference_task(copy.deepcopy(state), 1)
    calls = task["calls"]
    user_id = calls[1]["arguments"]["user_id"]
    refund = next(c for c in calls if c["name"] == "issue_refund")["arguments"]
    extra = [
        {"name": "issue_refund", "arguments": {**refund, "amount": 10_000.0}},  # refused: more than the order
        {"name": "get_user_details", "arguments": {"user_id": user_id}},
        {"name": "list_user_orders", "arguments": {"user_id": user_id, "status": "delivered"}},
        {"name": "cancel_order", "arguments": {"order_id": "O-0", "reason": "other"}},  # refused: no order
    ]

    async def main() -> None:
        async with SandboxPool(POOL) as pool:
            oks, values, final = await _run_calls(pool, pack.tools_source, state, calls + extra)
            assert oks == [True] * len(calls) + [False, True, True, False]
            assert "left to refund" in values[len(calls)]
            assert "sms_code" not in values[len(calls) + 1]  # the code reaches only the phone
            assert all(o["status"] == "delivered" for o in values[len(calls) + 2])
            assert final["session"]["verified_user_id"] == user_id
            assert final["refunds"][0]["amount"] == refund["amount"] and final["refunds"][0]["uuid"]
            # The sandbox's run equals the in-process replay except for timestamps and uuids.
            records, replayed = replay_reference(pack, state, calls)
            assert all(r["ok"] for r in records)
            assert replayed["refunds"][0]["uuid"] != final["refunds"][0]["uuid"]
            assert _without_skipped(replayed) == _without_skipped(final)

    asyncio.run(main())


# --------------------------------------------------------------------------- policy rules


def _violations(
    pack: DomainPack, state: dict[str, Any], calls: list[dict[str, Any]]
) -> list[tuple[int, str]]:
    """(call index, rule) for every rule that fires, with in-process replay for the states."""
    rules = _namespace(pack.policy_source)
    tools = _namespace(pack.tools_source, {})
    out: list[tuple[int, str]] = []
    for n, call in enumerate(calls):
        tools["STATE"] = copy.deepcopy(state)
        tools[call["name"]](**call["arguments"])
        after = tools["STATE"]
        record = {"actor": call.get("actor", "agent"), "ok": True, "changed_state": after != state, **call}
        out += [(n, r.name) for r in pack.rules if rules[r.function](state, record, after)]
        state = after
    return out


def test_policy_rules_fire_on_violating_calls(pack: DomainPack) -> None:
    state = pack.generate(2)
    task = pack.reference_task(copy.deepcopy(state), 2)
    assert _violations(pack, state, task["calls"]) == []  # the reference complies

    user_id = task["calls"][1]["arguments"]["user_id"]
    code = state["users"][user_id]["sms_code"]
    login = [
        {"name": "send_verification_code", "arguments": {"user_id": user_id}},
        {"name": "confirm_identity_code", "arguments": {"user_id": user_id, "code": code}, "actor": "user"},
    ]
    mine = [o for o in state["orders"].values() if o["user_id"] == user_id]
    pending = next(o for o in mine if o["status"] in ("pending", "processing"))
    delivered = next(o for o in mine if o["status"] == "delivered")
    # A shipped order and an old delivery of the same customer.
    shipped = copy.deepcopy(pending) | {"order_id": "O-77777", "status": "shipped"}
    old = copy.deepcopy(delivered) | {"order_id": "O-88888", "delivered_on": "2020-01-01"}
    state["orders"].update({"O-77777": shipped, "O-88888": old})
    address = {"line1": "1 New Street", "city": "Boise", "zip_code": "83701"}
    item = delivered["items"][0]["item_id"]

    def fired(*calls: dict[str, Any]) -> set[str]:
        return {rule for _, rule in _violations(pack, state, [*login, *calls])}

    assert (
        fired({"name": "cancel_order", "arguments": {"order_id": pending["order_id"], "reason": "other"}})
        == set()
    )
    assert fired({"name": "cancel_order", "arguments": {"order_id": "O-77777", "reason": "other"}}) == {
        "no_cancel_after_shipment"
    }
    assert fired({"name": "update_order_address", "arguments": {"order_id": "O-77777", **address}}) == {
        "address_before_shipment"
    }
    twice = {"name": "update_order_address", "arguments": {"order_id": pending["order_id"], **address}}
    assert fired(twice, twice) == {"one_address_change_per_order"}
    assert fired(
        {
            "name": "return_items",
            "arguments": {"order_id": "O-88888", "item_ids": [item], "reason": "damaged"},
        }
    ) == {"return_exchange_window"}
    refund = {
        "name": "issue_refund",
        "arguments": {"order_id": delivered["order_id"], "amount": 1.0, "reason": "x"},
    }
    assert fired(refund) == {"refund_needs_damage_report"}
    report = {
        "name": "report_damage",
        "arguments": {"order_id": delivered["order_id"], "item_id": item, "description": "torn"},
    }
    assert fired(report, refund) == set()
    big = copy.deepcopy(state["orders"][pending["order_id"]])
    state["orders"][pending["order_id"]]["total"] = 900.0
    assert "refund_limit" in fired(
        {**refund, "arguments": {"order_id": pending["order_id"], "amount": 600.0, "reason": "x"}}
    )
    state["orders"][pending["order_id"]] = big
    credit = {
        "name": "issue_store_credit",
        "arguments": {"user_id": user_id, "amount": 30.0, "reason": "sorry"},
    }
    state["credits"] = [c for c in state["credits"] if c["user_id"] != user_id]
    assert fired(credit) == set()
    assert fired(credit, credit) == {"monthly_credit_cap"}  # 60 USD in the month of today
    # Without the one-time code confirmed, writes violate the identity rule.
    assert {rule for _, rule in _violations(pack, state, [twice])} == {"verified_identity"}

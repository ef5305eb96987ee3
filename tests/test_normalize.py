"""Schema normalisation and quality gates (synthesis/tools/normalize.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arena.records.common import Rejection
from arena.records.tools import NormalizedTool, RawToolServer, ToolDocFormat, ToolFunction
from producers.tool_docs import load_tool_docs
from synthesis.tools.normalize import (
    GATES,
    cap_utf8,
    count_words,
    normalize_server,
    sanitize_tool_name,
    schema_problems,
    server_gate,
    server_id,
)

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "tools"


def raw(entries: list[Any], fmt: ToolDocFormat = ToolDocFormat.openai, **context: Any) -> RawToolServer:
    return RawToolServer(server="srv", source="test", format=fmt, entries=entries, context=context)


def one(entry: Any, fmt: ToolDocFormat = ToolDocFormat.openai, **context: Any) -> dict[str, Any]:
    """Normalise a single entry that must pass; returns the OpenAI tool dict + response schema."""
    out = normalize_server(raw([entry], fmt, **context))
    assert not out.rejections, out.rejections
    tool = out.tools[0]
    return {**tool.openai(), "response_schema": tool.response_schema}


def drops(entry: Any, fmt: ToolDocFormat = ToolDocFormat.openai, **context: Any) -> list[tuple[str, str]]:
    out = normalize_server(raw([entry], fmt, **context))
    assert not out.tools
    return [(d.gate, d.reason) for d in out.rejections]


DESC = "Get the current weather for a city."


# --------------------------------------------------------------------------------- per format


def test_openai_wrapped_is_kept_as_valid_schema() -> None:
    params = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name."},
            "units": {"type": "string", "enum": ["metric", "imperial"], "default": "metric"},
        },
        "required": ["city"],
        "additionalProperties": False,
    }
    got = one(
        {"type": "function", "function": {"name": "get_weather", "description": DESC, "parameters": params}}
    )
    assert got == {
        "type": "function",
        "function": {"name": "get_weather", "description": DESC, "parameters": params},
        "response_schema": None,
    }


def test_bare_openai_without_parameters_gets_empty_object() -> None:
    got = one({"name": "list_all", "description": "List every item in the store."})
    assert got["function"]["parameters"] == {"type": "object", "properties": {}}


def test_properties_without_type_are_an_object() -> None:
    got = one({"name": "f", "description": DESC, "parameters": {"properties": {"a": {"type": "string"}}}})
    assert got["function"]["parameters"] == {"type": "object", "properties": {"a": {"type": "string"}}}


def test_bfcl_types_and_response() -> None:
    entry = {
        "name": "math.stats",
        "description": "Compute statistics of a sample. Note that the provided function is in Python 3 syntax.",
        "parameters": {
            "type": "dict",
            "properties": {
                "values": {"type": "array", "items": {"type": "float"}, "description": "Sample."},
                "pair": {"type": "tuple", "items": {"type": "integer"}},
                "n": {"type": "int", "default": 3},
                "flag": {"type": "bool"},
                "label": {"type": "str", "enum": ["a", "b"]},
                "extra": {"type": "any", "description": "Anything.", "default": None},
                "opts": {"type": "dict", "properties": {"x": {"type": "list", "items": {"type": "string"}}}},
            },
            "required": ["values"],
        },
        "response": {"type": "dict", "properties": {"mean": {"type": "float"}}},
    }
    got = one(entry, ToolDocFormat.bfcl)
    assert got["function"]["name"] == "math.stats"
    assert got["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "values": {"type": "array", "items": {"type": "number"}, "description": "Sample."},
            "pair": {"type": "array", "items": {"type": "integer"}},
            "n": {"type": "integer", "default": 3},
            "flag": {"type": "boolean"},
            "label": {"type": "string", "enum": ["a", "b"]},
            "extra": {"description": "Anything.", "default": None},
            "opts": {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "string"}}}},
        },
        "required": ["values"],
    }
    assert got["response_schema"] == {"type": "object", "properties": {"mean": {"type": "number"}}}


def test_mcp_input_and_output_schema_with_defs() -> None:
    entry = {
        "name": "create_event",
        "title": "Create event",
        "description": "Create a calendar event for an attendee.",
        "inputSchema": {
            "type": "object",
            "$defs": {
                "Person": {
                    "type": "object",
                    "properties": {"email": {"type": "string"}},
                    "required": ["email"],
                }
            },
            "properties": {"title": {"type": "string"}, "attendee": {"$ref": "#/$defs/Person"}},
            "required": ["title"],
        },
        "outputSchema": {"type": "object", "properties": {"event_id": {"type": "string"}}},
        "annotations": {"readOnlyHint": False},
    }
    got = one(entry, ToolDocFormat.mcp)
    assert got["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "attendee": {
                "type": "object",
                "properties": {"email": {"type": "string"}},
                "required": ["email"],
            },
        },
        "required": ["title"],
    }
    assert got["response_schema"] == {"type": "object", "properties": {"event_id": {"type": "string"}}}


PETSTORE_CONTEXT: dict[str, Any] = {
    "components": {
        "parameters": {
            "PetId": {
                "name": "pet_id",
                "in": "path",
                "required": True,
                "description": "Pet id.",
                "schema": {"type": "integer"},
            }
        },
        "requestBodies": {
            "NewPet": {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewPet"}}},
            }
        },
        "schemas": {
            "NewPet": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "id": {"type": "integer", "readOnly": True},
                    "name": {"type": "string", "description": "Pet name."},
                    "tag": {"type": "string", "nullable": True},
                },
            },
            "Pet": {
                "allOf": [
                    {"$ref": "#/components/schemas/NewPet"},
                    {"type": "object", "properties": {"owner": {"$ref": "#/components/schemas/Owner"}}},
                ]
            },
            "Owner": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "pets": {"type": "array", "items": {"$ref": "#/components/schemas/Pet"}},
                },
            },
        },
    }
}


def op_entry(path: str, method: str, op: dict[str, Any], shared: list[Any] | None = None) -> dict[str, Any]:
    return {"path": path, "method": method, "operation": op, "path_parameters": shared or []}


def test_openapi_params_ref_and_request_body_merge() -> None:
    entry = op_entry(
        "/stores/{store_id}/pets",
        "post",
        {
            "operationId": "addPet",
            "summary": "Add a pet to a store",
            "parameters": [
                {"name": "store_id", "in": "path", "schema": {"type": "string"}},
                {"name": "dry_run", "in": "query", "required": False, "schema": {"type": "boolean"}},
                {"name": "X-Trace", "in": "header", "schema": {"type": "string"}, "description": "Trace id."},
                {"name": "Authorization", "in": "header", "schema": {"type": "string"}},
                {"name": "session", "in": "cookie", "schema": {"type": "string"}},
            ],
            "requestBody": {"$ref": "#/components/requestBodies/NewPet"},
            "responses": {
                "201": {
                    "description": "ok",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Pet"}}},
                },
                "400": {"description": "bad"},
            },
        },
    )
    got = one(entry, ToolDocFormat.openapi, **PETSTORE_CONTEXT)
    fn = got["function"]
    assert fn["name"] == "addPet"
    assert fn["description"] == "Add a pet to a store"
    assert fn["parameters"] == {
        "type": "object",
        "properties": {
            "store_id": {"type": "string"},
            "dry_run": {"type": "boolean"},
            "X-Trace": {"type": "string", "description": "Trace id."},
            "name": {"type": "string", "description": "Pet name."},
            "tag": {"type": ["string", "null"]},
        },
        "required": ["store_id", "name"],
    }
    # The response: allOf flattened, the recursive Owner -> Pet -> Owner cycle cut off.
    resp = got["response_schema"]
    assert resp["type"] == "object"
    assert set(resp["properties"]) == {"id", "name", "tag", "owner"}
    pets_items = resp["properties"]["owner"]["properties"]["pets"]["items"]
    assert pets_items == {"description": "recursive reference to #/components/schemas/Pet"}
    assert schema_problems(resp, top_level=False) == []


def test_openapi_path_level_params_and_generated_name() -> None:
    entry = op_entry(
        "/pets/{pet_id}",
        "get",
        {"description": "Find a single pet by its identifier.", "responses": {}},
        shared=[{"$ref": "#/components/parameters/PetId"}],
    )
    got = one(entry, ToolDocFormat.openapi, **PETSTORE_CONTEXT)
    assert got["function"]["name"] == "get_pets_pet_id"
    assert got["function"]["parameters"] == {
        "type": "object",
        "properties": {"pet_id": {"type": "integer", "description": "Pet id."}},
        "required": ["pet_id"],
    }
    assert got["response_schema"] is None


def test_openapi_non_object_or_clashing_body_becomes_one_argument() -> None:
    body = {
        "required": True,
        "content": {"application/json": {"schema": {"type": "array", "items": {"type": "string"}}}},
    }
    got = one(
        op_entry(
            "/tags",
            "put",
            {"operationId": "setTags", "description": "Replace all tags of the pet.", "requestBody": body},
        ),
        ToolDocFormat.openapi,
    )
    assert got["function"]["parameters"] == {
        "type": "object",
        "properties": {"body": {"type": "array", "items": {"type": "string"}}},
        "required": ["body"],
    }
    clash = {
        "content": {
            "application/json": {"schema": {"type": "object", "properties": {"q": {"type": "integer"}}}}
        }
    }
    op = {
        "operationId": "find",
        "description": "Find things matching a query.",
        "parameters": [{"name": "q", "in": "query", "schema": {"type": "string"}}],
        "requestBody": clash,
    }
    params = one(op_entry("/find", "post", op), ToolDocFormat.openapi)["function"]["parameters"]
    assert params["properties"]["q"] == {"type": "string"}
    assert params["properties"]["body"] == {"type": "object", "properties": {"q": {"type": "integer"}}}
    assert "required" not in params  # the body is optional


def test_openapi_unresolvable_ref_is_a_schema_drop() -> None:
    entry = op_entry(
        "/x",
        "get",
        {
            "operationId": "getX",
            "description": "Get the X resource.",
            "parameters": [{"$ref": "#/components/parameters/Nope"}],
        },
    )
    ((gate, reason),) = drops(entry, ToolDocFormat.openapi, components={})
    assert gate == "schema"
    assert "does not resolve" in reason


def test_openapi_operation_not_an_object() -> None:
    ((gate, reason),) = drops(
        {"path": "/x", "method": "get", "operation": [], "path_parameters": [], "location": "paths./x.get"},
        ToolDocFormat.openapi,
    )
    assert gate == "schema" and "(paths./x.get)" in reason
    ((gate, _reason),) = drops(
        {"path": "/x", "method": "get", "operation": "oops", "path_parameters": []}, ToolDocFormat.openapi
    )
    assert gate == "schema"


def test_list_style_parameters_and_draft3_required() -> None:
    got = one(
        {
            "name": "find",
            "description": "Find users by name.",
            "parameters": [
                {"name": "q", "type": "string", "required": True},
                {"name": "limit", "type": "int"},
            ],
        }
    )
    assert got["function"]["parameters"] == {
        "type": "object",
        "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["q"],
    }
    got = one(
        {
            "name": "find",
            "description": "Find users by name.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "required": True}}},
        }
    )
    assert got["function"]["parameters"]["required"] == ["q"]


def test_ref_expansion_bomb_is_refused() -> None:
    defs = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}},
        }
        for i in range(25)
    }
    defs["d25"] = {"type": "string"}
    params = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d0"}}}
    ((gate, reason),) = drops(
        {"name": "bomb", "description": "A schema that explodes when inlined.", "parameters": params}
    )
    assert gate == "schema" and "nodes" in reason


# --------------------------------------------------------------------------------- gates


@pytest.mark.parametrize(
    ("description", "gate"),
    [
        (None, "description_missing"),
        ("", "description_missing"),
        ("   \n", "description_missing"),
        (42, "description_missing"),
        (["a", "b"], "description_missing"),
        ("Weather.", "description_too_short"),
        ("Gets weather", "description_too_short"),
        ("get weather", "description_is_name"),
        ("Get-Weather", "description_is_name"),
        ("GET_WEATHER", "description_is_name"),
    ],
)
def test_description_gates(description: Any, gate: str) -> None:
    ((got_gate, reason),) = drops({"name": "get_weather", "description": description, "parameters": {}})
    assert got_gate == gate
    assert reason


def test_too_short_reason_has_the_count() -> None:
    out = normalize_server(raw([{"name": "f", "description": "Does stuff", "parameters": {}}]))
    (d,) = out.rejections
    assert d.reason.startswith("description has 2 word(s)")
    assert d.details["words"] == 2
    assert d.subject == "srv/f"
    assert d.record == {"name": "f", "description": "Does stuff", "parameters": {}}


def test_cjk_words_count_per_character() -> None:
    assert count_words("获取天气") == 4
    assert count_words("hello, world") == 2
    one({"name": "weather", "description": "获取城市天气", "parameters": {}})


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"type": "object", "properties": {"a": {"type": "banana"}}}, "unknown type 'banana'"),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
            "not defined in properties",
        ),
        ({"type": "object", "properties": {"a": {"type": "string", "enum": []}}}, "non-empty list"),
        ({"type": "string"}, "object schema"),
        ({"type": "object", "properties": ["a"]}, "'properties' must be an object"),
        ("not a schema", "a schema must be an object"),
        (
            {"type": "object", "properties": {"a": {"$ref": "http://example.com/x.json"}}},
            "not a local reference",
        ),
    ],
)
def test_schema_gate(params: Any, fragment: str) -> None:
    ((gate, reason),) = drops(
        {"name": "f", "description": "A perfectly fine tool description.", "parameters": params}
    )
    assert gate == "schema"
    assert fragment in reason


@pytest.mark.parametrize(
    "entry",
    [
        42,
        "tool",
        None,
        [1, 2],
        {"description": "A tool without a name at all."},
        {"name": "!!!", "description": "A tool with an unusable name."},
    ],
)
def test_non_tools_are_schema_drops(entry: Any) -> None:
    out = normalize_server(raw([entry]))
    assert [d.gate for d in out.rejections] == ["schema"]
    assert out.rejections[0].subject.startswith("srv/")


def test_duplicate_names_keep_the_first_survivor() -> None:
    entries = [
        {"name": "dup", "description": "x"},  # fails a description gate: not a survivor
        {"name": "dup", "description": "The first good definition."},
        {"name": "dup", "description": "The second good definition."},
        {"name": "other", "description": "Another good tool here."},
    ]
    out = normalize_server(raw(entries))
    assert [t.function.description for t in out.tools] == [
        "The first good definition.",
        "Another good tool here.",
    ]
    assert [d.gate for d in out.rejections] == ["description_too_short", "duplicate_name"]
    assert out.rejections[1].details["first_index"] == 1
    assert out.dropped_tools == ["dup", "dup"]


def test_names_are_sanitised() -> None:
    assert sanitize_tool_name("get weather/now!") == "get_weather_now"
    assert sanitize_tool_name("math.factorial") == "math.factorial"
    assert sanitize_tool_name("x" * 100) == "x" * 64
    assert sanitize_tool_name("天气") == ""
    got = one({"name": "Get Weather Now", "description": "Current weather at a place."})
    assert got["function"]["name"] == "Get_Weather_Now"


def tool(name: str) -> NormalizedTool:
    return NormalizedTool(
        function=ToolFunction(
            name=name,
            description=f"Tool {name} does things.",
            parameters={"type": "object", "properties": {}},
        )
    )


def test_min_tools_gate() -> None:
    drop = server_gate("tiny", [tool("a"), tool("b")])
    assert drop is not None
    assert drop.gate == "min_tools"
    assert "2 usable tool(s)" in drop.reason
    assert drop.details == {"tools": 2, "min_tools": 3, "tool_names": ["a", "b"]}
    assert drop.subject == "tiny"
    zero = server_gate("empty", [])
    assert zero is not None and "0 usable" in zero.reason
    assert server_gate("ok", [tool("a"), tool("b"), tool("c")]) is None


def test_gate_drop_to_rejection() -> None:
    drop = server_gate("tiny", [tool("a")])
    assert drop is not None
    rej = drop.to_rejection(stage="tools-servers", topic="tools.raw", source_key="k1")
    assert isinstance(rej, Rejection)
    assert (rej.gate, rej.subject, rej.source_key) == ("min_tools", "tiny", "k1")


def test_server_id_is_stable_and_order_insensitive() -> None:
    a, b, c = tool("a"), tool("b"), tool("c")
    assert server_id("s", [a, b, c]) == server_id("s", [c, a, b])
    assert server_id("s", [a, b, c]) != server_id("t", [a, b, c])
    assert server_id("s", [a, b]) != server_id("s", [a, b, c])
    assert len(server_id("s", [a])) == 32


# --------------------------------------------------------------------------------- capping


def test_cap_at_utf8_boundary() -> None:
    text = "a" + "€" * 10  # € is 3 bytes
    capped, cut = cap_utf8(text, 8)  # 1 + 2*3 = 7 bytes fit, the third € would straddle byte 8
    assert cut and capped == "a€€"
    assert cap_utf8("short", 8) == ("short", False)


def test_long_description_is_capped_and_flagged() -> None:
    desc = "Describes the tool in great detail. " + "Ünïcödé détails — 😀 " * 6000  # > 100 KiB
    out = normalize_server(raw([{"name": "big", "description": desc}]), max_description_bytes=8192)
    (t,) = out.tools
    data = t.function.description.encode("utf-8")
    assert t.description_truncated
    assert 8192 - 4 < len(data) <= 8192
    assert desc.startswith(t.function.description)


@given(st.text(max_size=300), st.integers(min_value=0, max_value=400))
def test_cap_utf8_property(text: str, limit: int) -> None:
    capped, cut = cap_utf8(text, limit)
    assert text.startswith(capped)
    assert len(capped.encode("utf-8", "surrogatepass")) <= max(limit, 0) or not cut
    assert cut == (len(text.encode("utf-8", "surrogatepass")) > limit)


# --------------------------------------------------------------------------------- validator


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"type": "nope"}}},
        {"type": "object", "properties": {}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"enum": []}}},
        {"type": "object", "properties": {"a": {"minLength": -1}}},
        {"type": "object", "properties": {"a": {"pattern": "("}}},
        {"type": "object", "properties": {"a": {"anyOf": []}}},
        {"type": "array"},
        [],
    ],
)
def test_schema_problems_finds_invalid_schemas(schema: Any) -> None:
    assert schema_problems(schema)


# --------------------------------------------------------------------------------- samples


def test_bundled_samples_outcomes() -> None:
    loaded = load_tool_docs([SAMPLES])
    accepted: dict[str, int] = {}
    rejected: dict[str, str] = {}
    tool_gates: list[tuple[str, str]] = []
    truncated: list[str] = []
    for server in loaded.servers:
        out = normalize_server(server)
        tool_gates += [(d.subject, d.gate) for d in out.rejections]
        truncated += [t.function.name for t in out.tools if t.description_truncated]
        drop = server_gate(server.server, out.tools)
        if drop is None:
            accepted[server.server] = len(out.tools)
            # Every accepted sample tool documents its output, so chains can be built from it.
            assert all(t.response_schema is not None for t in out.tools)
        else:
            rejected[server.server] = drop.gate
    assert accepted == {
        "weather_openai": 6,
        "notes-server": 7,
        "filesystem": 6,
        "finance_bfcl": 7,
        "Hotel Booking API": 6,
        "shop_catalog": 6,
        "restaurants": 5,
    }
    assert rejected == {"url_shortener": "min_tools", "misc-helpers": "min_tools"}
    # The loader already merged misc-helpers' second `format_timestamp` (a LoadNotice), so no
    # duplicate_name drop is left for the normaliser.
    assert sorted(tool_gates) == [
        ("misc-helpers/do_stuff", "description_too_short"),
        ("misc-helpers/fetch_record", "schema"),
        ("misc-helpers/get_data", "description_is_name"),
        ("misc-helpers/ping_service", "description_missing"),
    ]
    assert truncated == ["get_fx_rate_history"]


# --------------------------------------------------------------------------------- properties

JSON_LEAF = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=30)
JSON = st.recursive(
    JSON_LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=25,
)
SCHEMA_KEYS = st.sampled_from(
    [
        "type",
        "properties",
        "required",
        "items",
        "enum",
        "$ref",
        "description",
        "default",
        "allOf",
        "anyOf",
        "nullable",
        "minimum",
    ]
)
SCHEMA_TYPES = st.sampled_from(
    ["object", "dict", "string", "float", "tuple", "any", "banana", "array", "integer"]
)
SCHEMAISH = st.recursive(
    st.fixed_dictionaries({"type": SCHEMA_TYPES}) | JSON_LEAF,
    lambda inner: (
        st.dictionaries(SCHEMA_KEYS, inner | SCHEMA_TYPES | st.lists(inner, max_size=3), max_size=4)
        | st.fixed_dictionaries(
            {"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=6), inner, max_size=3)}
        )
    ),
    max_leaves=20,
)
DESCRIPTIONS = (
    st.none()
    | st.text(max_size=40)
    | st.just("Fetch a thing by id.")
    | st.integers()
    | st.builds(lambda n: "word " * n, st.integers(0, 30_000))
)
ENTRY = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"name": st.text(max_size=12) | JSON_LEAF, "description": DESCRIPTIONS, "parameters": SCHEMAISH}
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["a", "b", "a b"]),
                    "description": DESCRIPTIONS,
                    "parameters": SCHEMAISH,
                }
            ),
        }
    ),
    st.fixed_dictionaries(
        {
            "name": st.sampled_from(["a", "b"]),
            "description": DESCRIPTIONS,
            "inputSchema": SCHEMAISH,
            "outputSchema": SCHEMAISH,
        }
    ),
    st.fixed_dictionaries(
        {
            "path": st.text(max_size=10) | JSON_LEAF,
            "method": st.sampled_from(["get", "post"]) | JSON_LEAF,
            "operation": st.fixed_dictionaries(
                {
                    "operationId": st.text(max_size=8),
                    "description": DESCRIPTIONS,
                    "parameters": JSON,
                    "requestBody": JSON,
                    "responses": JSON,
                }
            )
            | JSON,
            "path_parameters": JSON,
        }
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(ENTRY, max_size=6),
    st.sampled_from(list(ToolDocFormat)),
    JSON,
    st.integers(min_value=64, max_value=400),
)
def test_normalize_never_raises_and_accounts_for_every_entry(
    entries: list[Any], fmt: ToolDocFormat, context: Any, cap: int
) -> None:
    server = RawToolServer(
        server="s", source="x", format=fmt, entries=entries, context={"components": context}
    )
    out = normalize_server(server, max_description_bytes=cap)
    assert len(out.tools) + len(out.rejections) == len(entries)
    for d in out.rejections:
        assert d.gate in GATES and d.reason and d.subject.startswith("s/")
        assert not d.details.get("internal_error"), d.reason
        json.dumps(d.model_dump(mode="json"))
    for t in out.tools:
        assert schema_problems(t.function.parameters) == []
        assert len(t.function.description.encode("utf-8")) <= cap
        json.dumps(t.model_dump(mode="json"))
    drop = server_gate("s", out.tools)
    assert (drop is None) == (len(out.tools) >= 3)
    server_id("s", out.tools)


def test_function_doc_in_an_openapi_server_still_converts() -> None:
    got = one({"name": "get_weather", "description": DESC, "parameters": {}}, ToolDocFormat.openapi)
    assert got["function"]["name"] == "get_weather"

"""Tool-doc loader (producers/tool_docs.py): formats, file types, folders, errors."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from arena.records.tools import ToolDocFormat
from producers.tool_docs import LoadError, LoadResult, detect_format, load_tool_doc_bytes, load_tool_docs

SAMPLES = Path(__file__).resolve().parents[1] / "arena" / "samples" / "tools"

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def write(tmp: Path, name: str, content: str | bytes) -> Path:
    path = tmp / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def load(tmp: Path, name: str, content: str | bytes) -> LoadResult:
    return load_tool_docs([write(tmp, name, content)])


# --------------------------------------------------------------------------------- formats


def test_openai_wrapped_list(tmp_path: Path) -> None:
    doc = [
        {"type": "function", "function": WEATHER},
        {"type": "function", "function": {**WEATHER, "name": "w2"}},
    ]
    res = load(tmp_path, "weather.json", json.dumps(doc))
    assert res.errors == []
    (s,) = res.servers
    assert (s.server, s.format, s.entries) == ("weather", ToolDocFormat.openai, doc)
    assert s.source.endswith("weather.json")


def test_single_bare_function(tmp_path: Path) -> None:
    (s,) = load(tmp_path, "one.json", json.dumps(WEATHER)).servers
    assert s.entries == [WEATHER] and s.format == ToolDocFormat.openai


def test_legacy_functions_key(tmp_path: Path) -> None:
    (s,) = load(tmp_path, "legacy.json", json.dumps({"functions": [WEATHER]})).servers
    assert s.entries == [WEATHER]


def test_mcp_tools_list_with_server_info(tmp_path: Path) -> None:
    tool = {"name": "read", "description": "Read a file.", "inputSchema": {"type": "object"}}
    doc = {"serverInfo": {"name": "fs-server"}, "tools": [tool]}
    (s,) = load(tmp_path, "x.json", json.dumps(doc)).servers
    assert (s.server, s.format, s.entries) == ("fs-server", ToolDocFormat.mcp, [tool])


def test_mcp_jsonrpc_wrapped_and_empty(tmp_path: Path) -> None:
    tool = {"name": "read", "description": "Read a file.", "inputSchema": {"type": "object"}}
    (s,) = load(
        tmp_path, "fs.json", json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"tools": [tool]}})
    ).servers
    assert (s.server, s.format, s.entries) == ("fs", ToolDocFormat.mcp, [tool])
    # Zero tools is a valid MCP answer: it loads, and the min_tools gate rejects it later.
    (empty,) = load(tmp_path, "none.json", json.dumps({"result": {"tools": []}})).servers
    assert (empty.format, empty.entries) == (ToolDocFormat.mcp, [])


def test_jsonrpc_error_is_a_load_error(tmp_path: Path) -> None:
    res = load(
        tmp_path,
        "err.json",
        json.dumps({"jsonrpc": "2.0", "id": 1, "error": {"code": -32601, "message": "Method not found"}}),
    )
    (err,) = res.errors
    assert "JSON-RPC error" in err.problem and "Method not found" in err.problem


def test_bfcl_functions_and_question_records(tmp_path: Path) -> None:
    fn = {
        "name": "calc_area",
        "description": "Area of a triangle.",
        "parameters": {"type": "dict", "properties": {"base": {"type": "float"}}, "required": ["base"]},
    }
    (s,) = load(tmp_path, "bfcl.json", json.dumps([fn])).servers
    assert s.format == ToolDocFormat.bfcl
    lines = [
        {"id": "simple_0", "question": [[{"role": "user", "content": "hi"}]], "function": [fn]},
        {"id": "simple_1", "question": [], "function": [{**fn, "name": "calc_volume"}]},
    ]
    (q,) = load(tmp_path, "questions.jsonl", "\n".join(map(json.dumps, lines))).servers
    assert [e["name"] for e in q.entries] == ["calc_area", "calc_volume"]
    assert q.format == ToolDocFormat.bfcl


OPENAPI = """
openapi: 3.0.3
info: {title: Pet Store, version: "1.0"}
paths:
  /pets:
    parameters:
      - {name: limit, in: query, schema: {type: integer}}
    get:
      operationId: listPets
      summary: List all pets in the store.
    post:
      operationId: createPet
      summary: Create a new pet record.
      requestBody:
        content:
          application/json:
            schema: {$ref: '#/components/schemas/Pet'}
  /pets/{id}:
    get:
      summary: Info for a specific pet.
    x-internal: true
components:
  schemas:
    Pet: {type: object, properties: {name: {type: string}}}
"""


def test_openapi_operations_become_entries(tmp_path: Path) -> None:
    (s,) = load(tmp_path, "pets.yaml", OPENAPI).servers
    assert (s.server, s.format) == ("Pet Store", ToolDocFormat.openapi)
    assert [(e["path"], e["method"]) for e in s.entries] == [
        ("/pets", "get"),
        ("/pets", "post"),
        ("/pets/{id}", "get"),
    ]
    assert s.entries[0]["path_parameters"] == [
        {"name": "limit", "in": "query", "schema": {"type": "integer"}}
    ]
    assert s.entries[0]["operation"]["operationId"] == "listPets"
    assert s.context["components"]["schemas"]["Pet"] == {
        "type": "object",
        "properties": {"name": {"type": "string"}},
    }
    assert s.context["openapi"] == "3.0.3"
    assert [e["location"] for e in s.entries] == [
        "paths./pets.get",
        "paths./pets.post",
        "paths./pets/{id}.get",
    ]


def test_openapi_end_to_end_with_normalizer(tmp_path: Path) -> None:
    from streams.sft.normalize import normalize_server

    (s,) = load(tmp_path, "pets.yaml", OPENAPI).servers
    out = normalize_server(s)
    assert out.rejections == []
    assert [t.function.name for t in out.tools] == ["listPets", "createPet", "get_pets_id"]
    assert out.tools[1].function.parameters == {
        "type": "object",
        "properties": {"limit": {"type": "integer"}, "name": {"type": "string"}},
    }


def test_openapi_multi_document_yaml_and_name_clash(tmp_path: Path) -> None:
    res = load(tmp_path, "two.yml", OPENAPI + "\n---\n" + OPENAPI)
    assert [s.server for s in res.servers] == ["Pet Store", "Pet Store-2"]


def test_openapi_bad_paths_and_swagger(tmp_path: Path) -> None:
    (err,) = load(tmp_path, "bad.yaml", "openapi: 3.1.0\ninfo: {title: X}\npaths: [1, 2]\n").errors
    assert err.entry == "paths" and "mapping" in err.problem
    (err,) = load(tmp_path, "old.yaml", "swagger: '2.0'\ninfo: {title: X}\npaths: {}\n").errors
    assert "Swagger" in err.problem and "OpenAPI 3" in err.fix
    (err,) = load(tmp_path, "v2.json", json.dumps({"openapi": "2.5", "paths": {}})).errors
    assert "need 3.x" in err.problem


def test_detect_format() -> None:
    assert detect_format([{"type": "function", "function": WEATHER}]) == ToolDocFormat.openai
    assert detect_format({"tools": [{"name": "a", "inputSchema": {}}]}) == ToolDocFormat.mcp
    assert detect_format({"openapi": "3.0.0", "paths": {}}) == ToolDocFormat.openapi
    assert detect_format([{"name": "a", "parameters": {"type": "dict"}}]) == ToolDocFormat.bfcl
    assert detect_format({"hello": 1}) is None
    assert detect_format(42) is None


# --------------------------------------------------------------------------------- file types


def test_jsonl_one_server_bad_line_is_an_error_rest_loads(tmp_path: Path) -> None:
    good2 = {**WEATHER, "name": "get_forecast"}
    content = json.dumps(WEATHER) + "\n" + '{"name": "broken", "descr' + "\n\n" + json.dumps(good2) + "\n"
    res = load(tmp_path, "shop.jsonl", content)
    (s,) = res.servers
    assert [e["name"] for e in s.entries] == ["get_weather", "get_forecast"]
    (err,) = res.errors
    assert err.file.endswith("shop.jsonl") and err.entry == "line 2"
    assert "truncated" in err.problem
    assert err.raw == b'{"name": "broken", "descr'
    assert err.fix


def test_jsonl_content_in_a_json_file(tmp_path: Path) -> None:
    content = "\n".join(
        json.dumps({"type": "function", "function": {**WEATHER, "name": f"t{i}"}}) for i in range(3)
    )
    res = load(tmp_path, "tools.json", content)
    assert res.errors == []
    (s,) = res.servers
    assert [e["function"]["name"] for e in s.entries] == ["t0", "t1", "t2"]


def test_pretty_json_in_a_jsonl_file(tmp_path: Path) -> None:
    (s,) = load(tmp_path, "pretty.jsonl", json.dumps([WEATHER], indent=2)).servers
    assert s.entries == [WEATHER]


def test_truncated_json_names_file_and_problem(tmp_path: Path) -> None:
    content = json.dumps([WEATHER, WEATHER], indent=2)[:-40]
    res = load(tmp_path, "cut.json", content)
    assert res.servers == []
    (err,) = res.errors
    assert err.file.endswith("cut.json") and err.entry is None
    assert "truncated" in err.problem and "line" in err.problem
    assert "cut off" in err.fix
    assert err.raw == content.encode()


def test_non_utf8_bytes(tmp_path: Path) -> None:
    data = json.dumps([{**WEATHER, "description": "Météo à Zürich"}], ensure_ascii=False).encode("latin-1")
    (err,) = load(tmp_path, "latin.json", data).errors
    assert "not UTF-8" in err.problem and "0xe9" in err.problem
    assert "iconv" in err.fix
    assert err.raw == data
    # LoadError keeps arbitrary bytes through JSON (base64).
    assert LoadError.model_validate_json(err.model_dump_json()).raw == data


def test_bom_is_tolerated(tmp_path: Path) -> None:
    (s,) = load(tmp_path, "bom.json", b"\xef\xbb\xbf" + json.dumps([WEATHER]).encode()).servers
    assert s.entries == [WEATHER]


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("empty.json", "", "empty"),
        ("blank.yaml", "  \n\n", "empty"),
        ("nothing.yaml", "---\n---\n", "no YAML documents"),
        ("unknown.yaml", "services:\n  web: {image: nginx}\n", "unknown document format"),
        ("ints.json", "[1, 2, 3]", "none of its items looks like a tool"),
        ("emptylist.json", "[]", "empty list"),
        ("scalar.json", '"hello"', "not a tool document"),
        ("nan.json", '[{"name": "a", "description": "b", "parameters": {"default": NaN}}]', "NaN"),
        ("deep.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("bad.yaml", "tools: [\n  - a\n", "invalid YAML"),
        ("tools_dict.json", '{"tools": {"a": 1}}', "'tools' must be a list"),
    ],
)
def test_unloadable_files_are_errors(tmp_path: Path, name: str, content: str, fragment: str) -> None:
    res = load(tmp_path, name, content)
    assert res.servers == []
    (err,) = res.errors
    assert fragment in err.problem
    assert err.file.endswith(name) and err.fix


def test_yaml_dates_keys_and_alias_cycles(tmp_path: Path) -> None:
    doc = "- name: when\n  description: Pick a date for it.\n  parameters: {type: object, properties: {d: {type: string, default: 2024-01-31}}}\n  1: yes\n"
    (s,) = load(tmp_path, "dates.yaml", doc).servers
    assert s.entries[0]["parameters"]["properties"]["d"]["default"] == "2024-01-31"
    assert s.entries[0]["1"] is True
    (err,) = load(tmp_path, "cycle.yaml", "&a [*a, {name: x, description: y}]\n").errors
    assert "cycle" in err.problem
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8)
    )
    (err,) = load(tmp_path, "bomb.yaml", bomb).errors
    assert "nodes" in err.problem


def test_unknown_extension_is_sniffed(tmp_path: Path) -> None:
    (s,) = load(tmp_path, "tools.txt", json.dumps([WEATHER])).servers
    assert s.entries == [WEATHER]
    (s,) = load(tmp_path, "tools.conf", "- name: a\n  description: Does a thing well.\n").servers
    assert s.entries == [{"name": "a", "description": "Does a thing well."}]


def test_load_bytes_entry_point() -> None:
    res = load_tool_doc_bytes(json.dumps([WEATHER]).encode(), source="stdin", suffix=".json")
    assert [s.server for s in res.servers] == ["stdin"]


# --------------------------------------------------------------------------------- folders


def test_folder_recursive_sorted_filtered(tmp_path: Path) -> None:
    write(tmp_path, "b/z.json", json.dumps([WEATHER]))
    write(tmp_path, "a.yaml", "- " + json.dumps(WEATHER))
    write(tmp_path, "b/a.jsonl", json.dumps(WEATHER))
    write(tmp_path, "b/notes.txt", "not a tool doc")
    write(tmp_path, ".hidden/x.json", "{broken")
    write(tmp_path, "c/.x.json", "{broken")
    res = load_tool_docs([tmp_path])
    assert res.errors == []
    assert [Path(s.source).relative_to(tmp_path).as_posix() for s in res.servers] == [
        "a.yaml",
        "b/a.jsonl",
        "b/z.json",
    ]
    # The same file via its folder and by name is loaded once.
    assert len(load_tool_docs([tmp_path, tmp_path / "a.yaml"]).servers) == 3


def test_missing_path_and_empty_folder(tmp_path: Path) -> None:
    (empty := tmp_path / "empty").mkdir()
    res = load_tool_docs([tmp_path / "nope.json", empty])
    assert [e.problem for e in res.errors] == [
        "no such file or folder",
        "folder contains no tool docs (looked for .json, .jsonl, .yaml, .yml)",
    ]


def test_bundled_samples_load() -> None:
    res = load_tool_docs([SAMPLES])
    by_name = {s.server: s for s in res.servers}
    assert {name: (s.format.value, len(s.entries)) for name, s in by_name.items()} == {
        "filesystem": ("mcp", 6),
        "finance_bfcl": ("bfcl", 7),
        "Hotel Booking API": ("openapi", 6),
        "notes-server": ("mcp", 7),
        "restaurants": ("openai", 5),
        "shop_catalog": ("openai", 6),
        "weather_openai": ("openai", 6),
        "misc-helpers": ("mcp", 7),
        "url_shortener": ("openai", 2),
    }
    errors = sorted((Path(e.file).name, e.entry, e.problem.split(":")[0]) for e in res.errors)
    assert errors == [
        ("legacy_latin1.json", "line 4", "not UTF-8"),
        ("not_tools.yaml", None, "unknown document format (top-level keys"),
        ("shop_catalog.jsonl", "line 4", "invalid JSON"),
        ("truncated_calendar.json", None, "invalid JSON"),
    ]
    assert all(e.raw for e in res.errors)


# --------------------------------------------------------------------------------- properties

SAMPLE_BYTES = sorted(
    p.read_bytes()
    for p in SAMPLES.rglob("*")
    if p.is_file() and p.suffix in {".json", ".jsonl", ".yaml", ".yml"}
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "description",
                    "parameters",
                    "tools",
                    "type",
                    "function",
                    "openapi",
                    "paths",
                    "result",
                    "inputSchema",
                    "x",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


def _check(res: LoadResult) -> None:
    for err in res.errors:
        assert err.file and err.problem and err.fix
    for s in res.servers:
        json.dumps(s.model_dump(mode="json"))  # what is published must serialise


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLE_BYTES), st.data(), st.sampled_from([".json", ".jsonl", ".yaml", ".txt"]))
def test_truncated_or_corrupted_samples_never_raise(data: bytes, draw: st.DataObject, suffix: str) -> None:
    cut = draw.draw(st.integers(min_value=0, max_value=len(data)))
    noise = draw.draw(st.binary(max_size=8))
    _check(load_tool_doc_bytes(data[:cut] + noise, source=f"f{suffix}"))


@settings(max_examples=80, deadline=None)
@given(
    st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
    st.sampled_from([".json", ".jsonl", ".yaml", ".yml", ""]),
)
def test_arbitrary_bytes_never_raise(data: bytes, suffix: str) -> None:
    _check(load_tool_doc_bytes(data, source=f"f{suffix}"))


@settings(max_examples=80, deadline=None)
@given(JSONISH, st.sampled_from([".json", ".jsonl", ".yaml"]))
def test_arbitrary_documents_never_raise(doc: Any, suffix: str) -> None:
    res = load_tool_doc_bytes(json.dumps(doc).encode(), source=f"f{suffix}")
    _check(res)
    assert res.servers or res.errors


def test_files_on_disk_never_raise() -> None:
    # One pass through the real file path (permissions, big descriptions, 0-tool servers).
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        write(tmp, "big.json", json.dumps([{**WEATHER, "description": "x " * 60_000}]))
        write(tmp, "zero.json", json.dumps({"tools": []}))
        write(tmp, "wrong.json", json.dumps([{"name": 5, "description": [], "parameters": "no"}]))
        res = load_tool_docs([tmp])
        assert len(res.servers) == 3 and res.errors == []

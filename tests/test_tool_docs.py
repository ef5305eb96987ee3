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

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "tools"

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
    from synthesis.tools.normalize import normalize_server

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
    # Swagger 2.0 is ingested (see test_swagger2_spec); older Swagger versions are not.
    (err,) = load(tmp_path, "old.yaml", "swagger: '1.2'\ninfo: {title: X}\npaths: {}\n").errors
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
        # Its two `format_timestamp` definitions differ: the loader keeps the richer one.
        "misc-helpers": ("mcp", 6),
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
    (notice,) = res.notices
    assert "format_timestamp" in notice.message and "'parameters'" in notice.message
    assert notice.file.endswith("misc_helpers.yaml") and notice.entry
    assert res.stats.conflicts == 1


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


# --------------------------------------------------------------------------------- real collections

COLLECTIONS = Path(__file__).resolve().parent / "fixtures" / "tool_collections"


def _accepted(servers: list[Any]) -> dict[str, list[str]]:
    from synthesis.tools.normalize import normalize_server, server_gate

    out = {}
    for s in servers:
        tools = normalize_server(s).tools
        if server_gate(s.server, tools) is None:
            out[s.server] = [t.function.name for t in tools]
    return out


def test_swagger2_spec() -> None:
    from synthesis.tools.normalize import normalize_server

    res = load_tool_docs([COLLECTIONS / "petstore_swagger2.json"])
    assert res.errors == []
    (s,) = res.servers
    assert (s.server, s.format, s.context["swagger"]) == ("Swagger Petstore", ToolDocFormat.openapi, "2.0")
    out = normalize_server(s)
    assert out.rejections == []
    tools = {t.function.name: t for t in out.tools}
    # in: body -> the definition's fields; readOnly id dropped; #/parameters and formData resolved.
    assert tools["addPet"].function.parameters["required"] == ["name", "photoUrls"]
    assert "id" not in tools["addPet"].function.parameters["properties"]
    assert tools["updatePetWithForm"].function.parameters["required"] == ["petId"]
    assert set(tools["updatePetWithForm"].function.parameters["properties"]) == {"petId", "name", "status"}
    assert tools["findPetsByStatus"].function.parameters["properties"]["status"]["type"] == "array"
    assert tools["getPetById"].response_schema is not None  # Swagger 2 response `schema`


def test_registry_dump_with_envelope_and_duplicate_listing() -> None:
    res = load_tool_docs([COLLECTIONS / "registry_dump.jsonl"])
    assert res.errors == [] and res.notices == []
    assert _accepted(res.servers) == {
        "@acme/weather-mcp": ["get_forecast", "get_alerts", "get_current"],
        "@acme/notes": ["create_note", "search_notes", "delete_note", "list_notes"],
    }
    assert res.stats.duplicates_merged == 3  # the weather tools are listed twice
    assert all(s.format == ToolDocFormat.mcp for s in res.servers)


def test_registry_records_in_a_list_and_under_servers(tmp_path: Path) -> None:
    records = [json.loads(line) for line in (COLLECTIONS / "registry_dump.jsonl").read_text().splitlines()]
    for content in (records, {"servers": records, "total": 2}):
        res = load(tmp_path, "dump.json", json.dumps(content))
        assert res.errors == []
        assert sorted(s.server for s in res.servers) == ["@acme/notes", "@acme/weather-mcp"]


def test_mcp_capture_and_xlam_json_string_tools() -> None:
    res = load_tool_docs([COLLECTIONS / "mcp_tools_list.json", COLLECTIONS / "xlam_style.jsonl"])
    assert res.errors == []
    assert _accepted(res.servers) == {
        "git-server": ["git_status", "git_diff_unstaged", "git_commit", "git_log"],
        "xlam_style": ["find_n_largest_numbers", "is_power_of_two", "calculate_median"],
    }
    (xlam,) = [s for s in res.servers if s.server == "xlam_style"]
    from synthesis.tools.normalize import normalize_server

    median = normalize_server(xlam).tools[2].function.parameters
    assert median["required"] == ["numbers"]  # "int, optional" with a default is not required
    assert median["properties"]["numbers"]["type"] == "array"


def test_bfcl_dataset_groups_by_namespace_and_cooccurrence() -> None:
    res = load_tool_docs([COLLECTIONS / "bfcl_like.jsonl"])
    assert res.errors == []
    groups = {s.server: sorted(e["name"] for e in s.entries) for s in res.servers}
    assert groups == {
        # math.factorial and spotify.play are offered together in line 1: one server.
        "bfcl_like:math": sorted(
            [
                "math.factorial",
                "math.gcd",
                "math.hypot",
                "spotify.next_track",
                "spotify.pause",
                "spotify.play",
            ]
        ),
        "bfcl_like:calculate": [
            "calculate_circle_area",
            "calculate_circumference",
            "calculate_triangle_area",
        ],
        "bfcl_like:weather": ["weather.get_air_quality", "weather.get_current", "weather.get_forecast"],
    }
    # Identical schema, reworded description: merged, the longer description kept.
    (math,) = [s for s in res.servers if s.server == "bfcl_like:math"]
    (fact,) = [e for e in math.entries if e["name"] == "math.factorial"]
    assert fact["description"] == "Calculates the factorial of a given non-negative number."
    # Same name, another schema: the richer one kept, and a notice naming both lines and the field.
    (notice,) = res.notices
    assert "line 10" in notice.message and notice.entry == "line 11, entry 0"
    assert "'parameters'" in notice.message and "units" in notice.message
    assert (res.stats.duplicates_merged, res.stats.conflicts, res.stats.tools_read) == (2, 1, 15)


def test_declared_server_over_the_bound_is_split(tmp_path: Path) -> None:
    tools = [
        {**WEATHER, "name": f"tool_{i:03d}", "description": f"Does thing number {i} well."}
        for i in range(150)
    ]
    res = load_tool_docs(
        [write(tmp_path, "big.json", json.dumps({"serverInfo": {"name": "big"}, "tools": tools}))]
    )
    assert [(s.server, len(s.entries)) for s in res.servers] == [("big:1", 50), ("big:2", 50), ("big:3", 50)]
    assert "split into 3 servers" in res.notices[0].message
    from producers.tool_docs import LoadOptions

    whole = load_tool_docs([tmp_path / "big.json"], LoadOptions(max_server_tools=200))
    assert [len(s.entries) for s in whole.servers] == [150] and whole.notices == []


def test_format_override_reads_a_spec_without_version_key(tmp_path: Path) -> None:
    from producers.tool_docs import LoadOptions

    spec = {
        "info": {"title": "Bare"},
        "paths": {"/x": {"get": {"operationId": "getX", "summary": "Get the x."}}},
    }
    path = write(tmp_path, "bare.json", json.dumps(spec))
    assert load_tool_docs([path]).errors  # not recognised on its own
    (s,) = load_tool_docs([path], LoadOptions(format=ToolDocFormat.openapi)).servers
    assert (s.server, s.format, len(s.entries)) == ("Bare", ToolDocFormat.openapi, 1)


def test_large_generated_collection_forms_bounded_servers_fast(tmp_path: Path) -> None:
    import time

    from tests.fixtures.tool_collection import write_collection

    path = write_collection(tmp_path / "collection.jsonl")
    assert len(path.read_text().splitlines()) >= 1000
    start = time.perf_counter()
    res = load_tool_docs([path])
    elapsed = time.perf_counter() - start
    assert res.errors == [] and res.stats.tools_read >= 4000
    assert all(3 <= len(s.entries) <= 64 for s in res.servers)
    accepted = _accepted(res.servers)
    assert len(accepted) == len(res.servers) >= 50
    names = [n for tools in accepted.values() for n in tools]
    assert len(names) == len(set(names)) >= 400  # every distinct function lands in exactly one server
    assert max(len(s.model_dump_json()) for s in res.servers) < 100_000  # records stay small
    assert elapsed < 30, elapsed


def test_cli_publishes_a_collection_with_a_summary(tmp_path: Path, broker: str) -> None:
    import shutil

    from tests.cli import arena_env, read_all, run_arena
    from tests.fixtures.tool_collection import write_collection

    docs = tmp_path / "docs"
    shutil.copytree(COLLECTIONS, docs)
    write_collection(docs / "collection.jsonl", lines=300)
    (docs / "cut.json").write_text('{"tools": [{"name": "a", "descr')
    env = arena_env(tmp_path / "home", ARENA_BROKER=broker)
    proc = run_arena(["publish", "tools", str(docs)], env, check=1)
    assert "Traceback" not in proc.stderr
    assert "cut.json" in proc.stderr and "truncated" in proc.stderr
    assert "duplicates merged" in proc.stdout and "servers formed" in proc.stdout
    # the session's broker: other tests' records are there too (replayed garbage, claims); keep ours
    records = [_json_object(r.value) for r in read_all(broker, "tools.raw")]
    mine = [r for r in records if str(r.get("source", "")).startswith(str(docs))]
    assert {"Swagger Petstore", "git-server", "@acme/notes"} <= {r["server"] for r in mine}
    assert sum(r["source"].endswith("collection.jsonl") for r in mine) >= 15
    assert f"{len(mine)} servers published, 1 rejected" in proc.stdout
    letters = [_json_object(r.value) for r in read_all(broker, "tools.raw.dlq")]
    assert any(str(docs / "cut.json") in str(v.get("reason", "")) for v in letters)


def _json_object(value: bytes | None) -> dict[str, Any]:
    try:
        found = json.loads(value or b"")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


# --------------------------------------------------------------------------------- big collections


def test_json_documents_skip_the_deep_copy_only_when_it_would_change_nothing() -> None:
    from producers.tool_docs import _json_doc, _jsonable, _parse
    from tests.fixtures.tool_collection import collection_lines

    # A dataset line is already JSON-safe: it takes the no-copy path (the copy cost ~2/3 of a load).
    text = "\n".join(json.dumps(r) for r in collection_lines(lines=60)) + "\n"
    docs = _parse(text, text.encode(), source="c.jsonl", suffix=".jsonl").docs
    assert len(docs) == 60 and all(d.safe for d in docs)
    assert all(_jsonable(d.value) == d.value for d in docs)
    # Whatever the copy would change, or refuse, still goes through it.
    deep = "[" * 201 + "]" * 201
    for risky in ('{"a": "\\ud800"}', '{"a": 1e999}', '{"a": -1E400}', deep):
        assert _json_doc(risky)[1] is False, risky
    assert _json_doc('{"a": "\\\\u00e9", "b": "[[[{{{", "c": 1e30}')[1] is True
    # Past MAX_NODES characters the values are counted: strings count once, whatever they hold.
    assert _json_doc(json.dumps({"tools": [WEATHER], "pad": "[, " * 1_000_000}))[1] is True
    zeros = "[" + ",".join(["0"] * 1_999_999) + "]"  # 2,000,000 values with the list: the limit
    assert _json_doc(zeros)[1] is True and _json_doc(zeros[:-1] + ",0]")[1] is False
    # The guarded results are what the copy gives: text repaired, overflow nulled, depth refused.
    lines = [
        json.dumps(
            {"question": "q", "function": [{**WEATHER, "name": "a", "description": "Bad \ud800 text."}]}
        ),
        '{"question": "q", "function": [{"name": "b", "description": "Big default value.", '
        '"parameters": {"type": "object", "properties": {"n": {"type": "number", "default": 1e999}}}}]}',
        '{"question": "q", "function": [{"name": "c", "parameters": ' + deep + "}]}",
    ]
    res = load_tool_doc_bytes("\n".join(lines).encode(), source="risky.jsonl")
    (server,) = res.servers
    assert [e["description"] for e in server.entries] == ["Bad \ufffd text.", "Big default value."]
    assert server.entries[1]["parameters"]["properties"]["n"]["default"] is None
    (err,) = res.errors
    assert err.entry == "line 3" and "nested more than 200 levels" in err.problem


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=8)
        | st.sampled_from(["\ud800", "\\ud800", "[{", "1e999"]),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
        max_leaves=40,
    ),
    st.booleans(),
)
def test_no_copy_path_is_taken_only_for_values_the_copy_keeps(doc: Any, ascii_only: bool) -> None:
    from producers.tool_docs import _json_doc, _jsonable

    text = json.dumps(doc, ensure_ascii=ascii_only).replace('"1e999"', "1e999")
    try:
        value, safe = _json_doc(text)
    except ValueError:  # Infinity (from a float strategy) is not JSON; unencodable lone surrogates
        return
    if safe:
        assert _jsonable(value) == value


def test_each_distinct_entry_and_schema_is_fingerprinted_once(tmp_path: Path) -> None:
    from synthesis.tools.normalize import _schema_fingerprint
    from tests.fixtures.tool_collection import write_collection

    path = write_collection(tmp_path / "collection.jsonl", lines=400)
    entries = [f for line in path.read_text().splitlines() for f in json.loads(line)["function"]]
    distinct = {json.dumps(e, sort_keys=True) for e in entries}
    schemas = {json.dumps(e["parameters"]) for e in entries}
    _schema_fingerprint.cache_clear()
    res = load_tool_docs([path])
    info = _schema_fingerprint.cache_info()
    assert res.stats.tools_read == len(entries) > 2 * len(distinct)
    # One fingerprint per distinct entry, not per line it is repeated in; one conversion per schema.
    assert info.hits + info.misses == len(distinct) and info.misses == len(schemas) < len(distinct)
    # A huge schema is converted but not kept (the cache stays bounded).
    from synthesis.tools.normalize import entry_fingerprint

    props = {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(200)}
    fp = entry_fingerprint({**WEATHER, "parameters": {"type": "object", "properties": props}})
    assert fp is not None and fp.properties == 200 and _schema_fingerprint.cache_info() == info


def test_packing_thousands_of_distinct_functions_is_blocked_not_quadratic() -> None:
    import random
    import tracemalloc

    from producers.tool_groups import BLOCK, Member, group_tools

    rng = random.Random(5)
    words = "alpha beta gamma delta omega sigma kappa lambda theta zeta".split()
    members = [
        Member(
            name=f"{rng.choice(words)}_{rng.choice(words)}_{i}",
            description=f"Handles {rng.choice(words)} jobs.",
        )
        for i in range(4000)
    ]
    tracemalloc.start()
    try:
        groups = group_tools(members, bound=64, min_size=3, pack_size=8)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert sorted(i for g in groups for i in g.members) == list(range(4000))
    assert all(3 <= len(g.members) <= 8 for g in groups)
    # An all-pairs similarity matrix would take 4000^2 float32 = 64 MB; blocks of BLOCK take ~9 MB.
    assert peak < 4 * BLOCK * BLOCK * 4 < 4000 * 4000 * 4, peak

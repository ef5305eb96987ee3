"""Fuzzing the publish path (load -> records): mutated real-shaped files never crash it, never lose a valid tool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.publish_tools import outgoing
from producers.tool_docs import LoadResult, load_tool_doc_bytes
from tests.fixtures.tool_collection import collection_lines

COLLECTIONS = Path(__file__).resolve().parent / "fixtures" / "tool_collections"
SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "tools" / "good"

JSONL_FILES: dict[str, bytes] = {
    p.name: p.read_bytes() for p in sorted(COLLECTIONS.glob("*.jsonl")) + sorted(SAMPLES.glob("*.jsonl"))
}
JSONL_FILES["generated.jsonl"] = "\n".join(json.dumps(r) for r in collection_lines(seed=3, lines=15)).encode()
WHOLE_FILES: dict[str, bytes] = {
    p.name: p.read_bytes()
    for p in sorted(COLLECTIONS.iterdir()) + sorted(SAMPLES.iterdir())
    if p.suffix in (".json", ".jsonl", ".yaml", ".yml")
}
FUZZ = settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


def _tool_names(value: Any) -> set[str]:
    """Names of every tool entry in a parsed document (as the loader's recognisers see them)."""
    if isinstance(value, str) and value.strip()[:1] == "[":
        try:
            return _tool_names(json.loads(value))
        except ValueError:
            return set()
    if isinstance(value, list):
        return {n for v in value for n in _tool_names(v)}
    if not isinstance(value, dict):
        return set()
    if isinstance(value.get("name"), str) and any(
        k in value for k in ("parameters", "input_schema", "inputSchema")
    ):
        return {value["name"]}
    return {n for k, v in value.items() if k != "question" for n in _tool_names(v)}


def _parsed(line: bytes) -> Any:
    """A line as JSON; None for the lines a sample breaks on purpose."""
    try:
        return json.loads(line)
    except ValueError:
        return None


def _published_names(res: LoadResult) -> set[str]:
    return {n for s in res.servers for n in _tool_names(s.entries)}


def _publishable(res: LoadResult, source: str) -> None:
    """Everything the publisher would send serialises, and every error names the file and a fix."""
    for emit in outgoing(res.servers, res.errors):
        emit.value.model_dump_json()
    for err in res.errors:
        assert err.file == source and err.problem and err.fix


def _mutate(line: bytes, kind: str, at: int, noise: bytes) -> bytes:
    cut = at % (len(line) + 1)
    if kind == "truncate":
        return line[:cut]
    if kind == "flip":
        return line[:cut] + noise + line[cut + len(noise) :]
    if kind == "binary":
        return noise * 8
    doc = _parsed(line)
    text = json.dumps(doc)
    if kind == "wrong_types":
        text = text.replace('"type": "', '"type": 5, "x": "', 1).replace(
            '"parameters": {', '"parameters": [{', 1
        )
    elif kind == "no_names":
        text = text.replace('"name":', '"nom":')
    elif kind == "conflict":  # same names, other schemas
        text = text.replace('"properties": {', '"properties": {"zz_extra": {"type": "string"}, ', 1)
    return text.encode()


@FUZZ
@given(
    st.sampled_from(sorted(JSONL_FILES)),
    st.integers(min_value=0),
    st.sampled_from(["truncate", "flip", "binary", "wrong_types", "no_names", "conflict"]),
    st.integers(min_value=0),
    st.binary(min_size=1, max_size=6),
)
def test_one_broken_line_loses_no_other_tool(name: str, which: int, kind: str, at: int, noise: bytes) -> None:
    lines = [ln for ln in JSONL_FILES[name].split(b"\n") if ln.strip()]
    i = which % len(lines)
    broken = _mutate(lines[i], kind, at, noise)
    data = b"\n".join([*lines[:i], broken, *lines[i + 1 :]])
    res = load_tool_doc_bytes(data, source=name)
    _publishable(res, name)
    expected = {n for j, ln in enumerate(lines) if j != i for n in _tool_names(_parsed(ln))}
    assert expected <= _published_names(res)
    for err in res.errors:  # a line-level problem names the line
        assert err.entry is None or err.entry.startswith(("line", "item"))


@FUZZ
@given(st.sampled_from(sorted(WHOLE_FILES)), st.integers(min_value=0), st.binary(max_size=8), st.booleans())
def test_truncated_or_corrupted_files_never_raise(name: str, at: int, noise: bytes, insert: bool) -> None:
    data = WHOLE_FILES[name]
    cut = at % (len(data) + 1)
    mutated = data[:cut] + noise + (data[cut:] if insert else b"")
    res = load_tool_doc_bytes(mutated, source=name)
    _publishable(res, name)
    assert res.servers or res.errors

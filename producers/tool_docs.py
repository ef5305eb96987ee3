"""Tool-doc loader: files and folders of tool documentation -> candidate servers.

ASTRA §2.1.1 collects tool documents from heterogeneous sources and groups them
by originating service. This module does the collecting and grouping; it keeps
every tool entry exactly as found (``RawToolServer.entries``) and leaves the
conversion to the OpenAI schema to ``streams.sft.normalize``, so that what was
published can always be replayed against a newer normaliser.

Supported inputs (auto-detected per document, whatever the file extension):

- OpenAI tool schemas: ``{"type": "function", "function": {...}}`` or bare
  ``{"name", "description", "parameters"}``, alone or in a list (also the legacy
  ``{"functions": [...]}``);
- MCP ``tools/list`` results: ``{"tools": [{"name", "description", "inputSchema"}]}``,
  optionally wrapped in a JSON-RPC response ``{"result": {...}}``;
- BFCL-style function docs (``"type": "dict"``, ``float``, ``tuple``, ``any``,
  optional ``response``), including BFCL question records ``{"function": [...]}``;
- OpenAPI 3 documents: each path + method operation is one entry.

File types: JSON, JSONL (also JSONL content inside a ``.json`` file, and a
single JSON document inside a ``.jsonl`` file) and YAML (multi-document).

Nothing here raises on bad input: every problem becomes a ``LoadError`` that
names the file, the entry, what is wrong, how to fix it, and carries the raw
bytes so nothing is lost (the publisher sends it to ``tools.raw.dlq``).
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime, time
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from arena.records.common import utcnow
from arena.records.tools import RawToolServer, ToolDocFormat

SUFFIXES: tuple[str, ...] = (".json", ".jsonl", ".yaml", ".yml")
"""Extensions picked up when a folder is loaded (explicit files load whatever their name)."""

OPENAPI_METHODS: tuple[str, ...] = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

MAX_FILE_BYTES = 64 * 1024 * 1024
"""Bigger files are refused: one candidate server travels as one Kafka record."""
MAX_NESTING = 200
"""Deeper documents are refused instead of blowing the interpreter's stack later."""
MAX_NODES = 2_000_000
"""YAML aliases can expand a small file exponentially ("billion laughs"); stop here."""

_SUPPORTED_SHAPES = (
    "use one of: an OpenAI tool list ([{'type': 'function', 'function': {...}}] or bare "
    "{'name', 'description', 'parameters'}), an MCP tools/list result ({'tools': [...]}), "
    "BFCL function docs, or an OpenAPI 3 document ('openapi: 3.x')"
)


class LoadError(BaseModel):
    """A file, document or line that could not be turned into tool entries."""

    # Raw bytes may be any bytes (e.g. Latin-1): base64 keeps the JSON form lossless.
    model_config = ConfigDict(extra="forbid", ser_json_bytes="base64", val_json_bytes="base64")

    file: Annotated[str, Field(description="The file the problem is in.")]
    entry: Annotated[
        str | None,
        Field(description="Where in the file, e.g. 'line 3', 'document 2', 'tools[2]', 'paths./pets.get'."),
    ] = None
    problem: Annotated[str, Field(description="What is wrong, with the measured detail.")]
    fix: Annotated[str, Field(description="How to fix it.")]
    raw: Annotated[bytes, Field(description="The exact bytes concerned: the file, or the offending line.")]

    def describe(self) -> str:
        """One line for humans: ``file [entry]: problem. Fix: fix``."""
        where = self.file + (f" [{self.entry}]" if self.entry else "")
        return f"{where}: {self.problem}. Fix: {self.fix}"


class LoadResult(BaseModel):
    """Everything read from the given paths: candidate servers and load errors."""

    servers: list[RawToolServer] = Field(default_factory=list)
    errors: list[LoadError] = Field(default_factory=list)

    def extend(self, other: LoadResult) -> None:
        self.servers.extend(other.servers)
        self.errors.extend(other.errors)


# ---------------------------------------------------------------------------------------------
# Public entry points


def load_tool_docs(paths: list[Path]) -> LoadResult:
    """Load tool docs from files and folders (folders: recursive, sorted, ``SUFFIXES`` only).

    Each origin file is one candidate server (named after its stem), except that an
    OpenAPI document is its own server (named by ``info.title``) and an MCP result
    with ``serverInfo.name`` is grouped under that name. Never raises on bad input.
    """
    result = LoadResult()
    seen: set[Path] = set()
    for file, error in _expand(paths):
        if error is not None:
            result.errors.append(error)
            continue
        assert file is not None
        key = _resolved(file)
        if key in seen:  # a file named twice (itself and via its folder) is one source
            continue
        seen.add(key)
        result.extend(_load_file(file))
    return result


def load_tool_doc_bytes(data: bytes, *, source: str, suffix: str | None = None) -> LoadResult:
    """Load one document's bytes (e.g. from stdin or an upload) as if read from ``source``.

    ``suffix`` (".json", ".jsonl", ".yaml", ".yml") picks the parser first; by default it
    comes from ``source``, and unknown suffixes are sniffed from the content.
    """
    try:
        name = Path(source).stem or source or "tools"
        suf = (suffix if suffix is not None else Path(source).suffix).lower()
        return _load_bytes(data, source=source, stem=name, suffix=suf)
    except Exception as exc:  # a last line of defence: the publisher must never crash
        return LoadResult(errors=[_err(source, None, f"internal loader error: {exc!r}", _BUG_FIX, data)])


def detect_format(doc: Any) -> ToolDocFormat | None:
    """The doc format of one parsed document, or None if it is not a tool document."""
    try:
        if isinstance(doc, dict) and _openapi_version(doc) is not None:
            return ToolDocFormat.openapi
        found = _container_entries(doc)
        if found.entries is None:
            return None
        return _entries_format(found.entries, found.hint)
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# Files and folders

_BUG_FIX = "this is a bug in the loader; please report it with the file attached"


def _resolved(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path.absolute()


def _expand(paths: list[Path]) -> list[tuple[Path | None, LoadError | None]]:
    out: list[tuple[Path | None, LoadError | None]] = []
    for raw_path in paths:
        path = Path(raw_path)
        if path.is_dir():
            found: list[Path] = []
            # os.walk without followlinks: a symlink loop cannot make this run forever.
            for root, dirs, files in os.walk(path, followlinks=False):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in files:
                    if not name.startswith(".") and name.lower().endswith(SUFFIXES):
                        found.append(Path(root) / name)
            found.sort(key=lambda p: p.relative_to(path).as_posix())
            if not found:
                out.append(
                    (
                        None,
                        _err(
                            str(path),
                            None,
                            f"folder contains no tool docs (looked for {', '.join(SUFFIXES)})",
                            "put tool docs with one of these extensions in the folder, or pass the files",
                            b"",
                        ),
                    )
                )
            out.extend((p, None) for p in found)
        elif path.is_file():
            out.append((path, None))
        else:
            out.append(
                (
                    None,
                    _err(
                        str(path),
                        None,
                        "no such file or folder" if not path.exists() else "not a regular file or folder",
                        "check the path (it is resolved relative to the current directory)",
                        b"",
                    ),
                )
            )
    return out


def _load_file(path: Path) -> LoadResult:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            return LoadResult(
                errors=[
                    _err(
                        str(path),
                        None,
                        f"file is {size} bytes, over the {MAX_FILE_BYTES}-byte limit",
                        "split the file into one file per service",
                        b"",
                    )
                ]
            )
        data = path.read_bytes()
    except OSError as exc:
        return LoadResult(
            errors=[
                _err(str(path), None, f"cannot read file: {exc.strerror or exc}", "check permissions", b"")
            ]
        )
    return load_tool_doc_bytes(data, source=str(path), suffix=path.suffix)


def _err(file: str, entry: str | None, problem: str, fix: str, raw: bytes) -> LoadError:
    return LoadError(file=file, entry=entry, problem=problem, fix=fix, raw=raw)


# ---------------------------------------------------------------------------------------------
# Bytes -> parsed documents


@dataclass
class _Doc:
    """One parsed document and where it came from."""

    value: Any
    where: str | None  # "line 3", "document 2", or None for the whole file
    raw: bytes


@dataclass
class _Parsed:
    docs: list[_Doc] = field(default_factory=list)
    errors: list[LoadError] = field(default_factory=list)


def _load_bytes(data: bytes, *, source: str, stem: str, suffix: str) -> LoadResult:
    if not data.strip():
        return LoadResult(
            errors=[_err(source, None, "file is empty", "add tool docs to the file or remove it", data)]
        )
    try:
        text = data.decode("utf-8-sig")  # -sig: tolerate a byte-order mark from Windows editors
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        bad = data[exc.start : exc.start + 1].hex()
        return LoadResult(
            errors=[
                _err(
                    source,
                    f"line {line}",
                    f"not UTF-8: byte 0x{bad} at offset {exc.start} (line {line}) cannot be decoded",
                    "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`",
                    data,
                )
            ]
        )

    parsed = _parse(text, data, source=source, suffix=suffix)
    result = LoadResult(errors=list(parsed.errors))
    builder = _ServerBuilder(source=source, stem=stem)
    for doc in parsed.docs:
        err = builder.add(doc)
        if err is not None:
            result.errors.append(err)
    result.servers.extend(builder.servers())
    return result


def _parse(text: str, data: bytes, *, source: str, suffix: str) -> _Parsed:
    if suffix == ".jsonl":
        return _parse_jsonl(text, data, source=source, whole_json_fallback=True)
    if suffix == ".json":
        return _parse_json(text, data, source=source)
    if suffix in (".yaml", ".yml"):
        return _parse_yaml(text, data, source=source)
    # Unknown extension: sniff. JSON starts with a bracket; anything else is tried as YAML.
    if text.lstrip()[:1] in ("{", "["):
        return _parse_json(text, data, source=source)
    return _parse_yaml(text, data, source=source)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_loads(text: str) -> Any:
    # NaN/Infinity are Python extensions, not JSON: they would not survive re-serialisation.
    return json.loads(text, parse_constant=_reject_constant)


def _json_problem(exc: Exception, text: str, *, line: bool = False) -> str:
    """A readable parse error; ``line`` for one JSONL line (no line number to report)."""
    if isinstance(exc, json.JSONDecodeError):
        at = f"column {exc.colno}" if line else f"line {exc.lineno} column {exc.colno}"
        # An unterminated string runs to the end of the input, so it is a truncation too.
        if exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string"):
            return f"invalid JSON: the document ends before it is complete (truncated?): {exc.msg} ({at})"
        return f"invalid JSON: {exc.msg} ({at})"
    if isinstance(exc, RecursionError):
        return "invalid JSON: nested too deeply to parse"
    return f"invalid JSON: {exc}"


_TRUNCATED_FIX = (
    "the file looks cut off: re-download or re-export it completely, then check it with "
    "`python -m json.tool FILE`"
)
_JSON_FIX = "fix the syntax at that position (check with `python -m json.tool FILE`), or re-export the file"


def _parse_json(text: str, data: bytes, *, source: str) -> _Parsed:
    try:
        value = _json_loads(text)
    except Exception as exc:  # JSONDecodeError, ValueError (NaN), RecursionError
        # Maybe JSONL content in a .json file: it is when the first line is a whole JSON
        # object or array. (A truncated pretty-printed document starts with a lone bracket.)
        lines = _nonblank_lines(text)
        if len(lines) > 1 and _is_json_container(lines[0]):
            return _parse_jsonl(text, data, source=source, whole_json_fallback=False)
        problem = _json_problem(exc, text)
        fix = _TRUNCATED_FIX if "truncated?" in problem else _JSON_FIX
        return _Parsed(errors=[_err(source, None, problem, fix, data)])
    return _Parsed(docs=[_Doc(value, None, data)])


def _is_json_container(line: str) -> bool:
    try:
        return isinstance(_json_loads(line), dict | list)
    except Exception:
        return False


def _nonblank_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def _parse_jsonl(text: str, data: bytes, *, source: str, whole_json_fallback: bool) -> _Parsed:
    lines = _nonblank_lines(text)
    if whole_json_fallback and lines and not _is_json_container(lines[0]):
        # A pretty-printed JSON document saved as .jsonl: accept it whole if it parses.
        try:
            return _Parsed(docs=[_Doc(_json_loads(text), None, data)])
        except Exception:
            pass
    out = _Parsed()
    # Split the bytes, not the text, so each error carries the line's exact bytes.
    raw_lines = data.split(b"\n")
    text_lines = text.split("\n")
    if len(text_lines) != len(raw_lines):  # cannot happen for UTF-8, but never trust it
        raw_lines = [ln.encode("utf-8", "surrogatepass") for ln in text_lines]
    for number, (line, raw) in enumerate(zip(text_lines, raw_lines, strict=True), start=1):
        if not line.strip():
            continue
        try:
            out.docs.append(_Doc(_json_loads(line), f"line {number}", raw))
        except Exception as exc:
            out.errors.append(
                _err(
                    source,
                    f"line {number}",
                    _json_problem(exc, line, line=True),
                    "each line of a JSONL file must be one complete JSON document; fix or remove this line",
                    raw,
                )
            )
    return out


def _parse_yaml(text: str, data: bytes, *, source: str) -> _Parsed:
    try:
        values = list(yaml.safe_load_all(text))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        at = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or str(exc)
        return _Parsed(
            errors=[
                _err(
                    source,
                    f"line {mark.line + 1}" if mark is not None else None,
                    f"invalid YAML: {problem}{at}",
                    "fix the YAML syntax at that position (indentation, quoting, unclosed brackets)",
                    data,
                )
            ]
        )
    except Exception as exc:  # YAMLError without a mark, RecursionError on absurd nesting
        return _Parsed(errors=[_err(source, None, f"invalid YAML: {exc!r}", "fix the YAML syntax", data)])
    present = [v for v in values if v is not None]  # `---` separators leave empty documents
    if not present:
        return _Parsed(
            errors=[_err(source, None, "file contains no YAML documents", _SUPPORTED_SHAPES, data)]
        )
    many = len(values) > 1
    return _Parsed(
        docs=[
            _Doc(v, f"document {i}" if many else None, data)
            for i, v in enumerate(values, start=1)
            if v is not None
        ]
    )


# ---------------------------------------------------------------------------------------------
# JSON safety: YAML yields dates, non-string keys, shared (aliased) and even cyclic nodes.


class _Unsafe(ValueError):
    pass


_SURROGATES = re.compile("[\ud800-\udfff]")


def _safe_text(s: str) -> str:
    # Lone surrogates (JSON "\\ud800") cannot be encoded as UTF-8 and would break every consumer.
    return _SURROGATES.sub("\ufffd", s)


def _jsonable(value: Any) -> Any:
    """A JSON-safe deep copy; raises ``_Unsafe`` for cycles, absurd depth or size."""
    budget = [MAX_NODES]

    def walk(v: Any, depth: int, stack: set[int]) -> Any:
        budget[0] -= 1
        if budget[0] < 0:
            raise _Unsafe(f"document expands to more than {MAX_NODES} nodes (YAML alias bomb?)")
        if depth > MAX_NESTING:
            raise _Unsafe(f"document is nested more than {MAX_NESTING} levels deep")
        if v is None or isinstance(v, bool | int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, str):
            return _safe_text(v)
        if isinstance(v, datetime | date | time):
            return v.isoformat()  # YAML turns `2024-01-01` into a date; the doc meant the text
        if isinstance(v, bytes):
            return base64.b64encode(v).decode("ascii")  # YAML !!binary
        if isinstance(v, dict | list | tuple | set | frozenset):
            if id(v) in stack:
                raise _Unsafe("document contains a reference cycle (recursive YAML alias)")
            stack.add(id(v))
            try:
                if isinstance(v, dict):
                    return {_key(k): walk(x, depth + 1, stack) for k, x in v.items()}
                items = sorted(v, key=repr) if isinstance(v, set | frozenset) else v
                return [walk(x, depth + 1, stack) for x in items]
            finally:
                stack.discard(id(v))
        return _safe_text(str(v))

    return walk(value, 0, set())


def _key(k: Any) -> str:
    if isinstance(k, str):
        return _safe_text(k)
    if k is None:
        return "null"  # YAML `null:` / `~:` keys
    if isinstance(k, bool):
        return "true" if k else "false"  # YAML 1.1 reads `on:`/`yes:` as True
    return _safe_text(str(k))


# ---------------------------------------------------------------------------------------------
# Documents -> candidate servers


def _is_toolish(v: Any) -> bool:
    """Does this dict look like one tool entry of any supported format?"""
    if not isinstance(v, dict):
        return False
    if v.get("type") == "function" and isinstance(v.get("function"), dict):
        return True
    return "name" in v and any(
        k in v for k in ("description", "parameters", "inputSchema", "input_schema", "response")
    )


def _is_bfcl_question(v: Any) -> bool:
    """A BFCL dataset record: ``{"id", "question", "function": [function docs]}``."""
    if not isinstance(v, dict) or v.get("type") == "function" or "name" in v:
        return False
    fn = v.get("function")
    return (isinstance(fn, list) and any(_is_toolish(f) for f in fn)) or _is_toolish(fn)


def _expand_entries(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if _is_bfcl_question(item):
            fn = item["function"]
            out.extend(fn if isinstance(fn, list) else [fn])
        else:
            out.append(item)
    return out


_BFCL_TYPES = frozenset({"dict", "float", "tuple", "any", "int", "bool", "str", "list", "double", "long"})


def _mentions_bfcl_type(schema: Any, depth: int = 0) -> bool:
    if depth > 20 or not isinstance(schema, dict):
        return False
    t = schema.get("type")
    if isinstance(t, str) and t.lower() in _BFCL_TYPES:
        return True
    props = schema.get("properties")
    if isinstance(props, dict) and any(_mentions_bfcl_type(p, depth + 1) for p in props.values()):
        return True
    return _mentions_bfcl_type(schema.get("items"), depth + 1)


def _entry_format(entry: Any) -> ToolDocFormat | None:
    if not isinstance(entry, dict):
        return None
    if "inputSchema" in entry or "input_schema" in entry:
        return ToolDocFormat.mcp
    if entry.get("type") == "function" and isinstance(entry.get("function"), dict):
        return ToolDocFormat.openai
    if _is_toolish(entry):
        if _mentions_bfcl_type(entry.get("parameters")) or _mentions_bfcl_type(entry.get("response")):
            return ToolDocFormat.bfcl
        return ToolDocFormat.openai
    return None


def _entries_format(entries: list[Any], hint: ToolDocFormat | None = None) -> ToolDocFormat:
    """The most common entry format; ``hint`` when no entry has a recognisable format."""
    return _majority([f for f in map(_entry_format, entries) if f is not None], hint)


def _majority(formats: list[ToolDocFormat], hint: ToolDocFormat | None = None) -> ToolDocFormat:
    if not formats:
        return hint or ToolDocFormat.openai
    counts = Counter(formats)
    # BFCL docs are OpenAI docs with extra types: a mix of the two is BFCL.
    if ToolDocFormat.bfcl in counts and ToolDocFormat.openai in counts:
        counts[ToolDocFormat.bfcl] += counts.pop(ToolDocFormat.openai)
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].value))[0][0]


def _openapi_version(doc: dict[str, Any]) -> str | None:
    v = doc.get("openapi")
    return None if v is None else str(v)


@dataclass
class _Entries:
    """What a non-OpenAPI document holds: entries (None if unrecognised) or the problem."""

    entries: list[Any] | None
    name: str | None = None
    hint: ToolDocFormat | None = None
    problem: str | None = None


def _is_jsonrpc(doc: dict[str, Any]) -> bool:
    if "jsonrpc" in doc:
        return True
    return ("result" in doc or "error" in doc) and "tools" not in doc and not _is_toolish(doc)


def _container_entries(doc: Any) -> _Entries:
    """Recognise any non-OpenAPI document and list its tool entries (kept raw)."""
    if isinstance(doc, list):
        if not doc:
            return _Entries(None, problem="the document is an empty list: there are no tools in it")
        if any(_is_toolish(x) or _is_bfcl_question(x) for x in doc):
            return _Entries(_expand_entries(doc))
        return _Entries(
            None, problem="a list, but none of its items looks like a tool (a 'name' with a schema)"
        )
    if not isinstance(doc, dict):
        return _Entries(None, problem=f"the document is a {type(doc).__name__}, not a tool document")

    if _is_jsonrpc(doc):
        result = doc.get("result")
        if isinstance(result, dict):
            inner = _container_entries(result)
            inner.name = inner.name or _server_name(doc)
            return inner
        err = doc.get("error")
        msg = err.get("message", "") if isinstance(err, dict) else err
        if err is not None:
            return _Entries(
                None, problem=f"a JSON-RPC error response, not a tools/list result ({msg!s:.200})"
            )
        return _Entries(None, problem="a JSON-RPC message without a 'result' object")
    for key in ("tools", "functions"):
        if isinstance(doc.get(key), list):
            # MCP tools/list (or a legacy OpenAI `functions` list); may legitimately be empty.
            hint = ToolDocFormat.mcp if key == "tools" else ToolDocFormat.openai
            return _Entries(_expand_entries(doc[key]), name=_server_name(doc), hint=hint)
    if _is_bfcl_question(doc):
        return _Entries(_expand_entries([doc]))
    if _is_toolish(doc):
        return _Entries([doc])
    for key in ("tools", "functions"):
        if key in doc:
            return _Entries(None, problem=f"'{key}' must be a list of tools, got a {type(doc[key]).__name__}")
    keys = ", ".join(sorted(map(str, doc))[:8])
    return _Entries(None, problem=f"unknown document format (top-level keys: {keys or 'none'})")


def _server_name(doc: dict[str, Any]) -> str | None:
    """MCP ``serverInfo.name``, else a ``server``/``name`` string next to the tool list."""
    info = doc.get("serverInfo") or doc.get("server_info")
    if isinstance(info, dict) and isinstance(info.get("name"), str) and info["name"].strip():
        return str(info["name"]).strip()
    for key in ("server", "server_name", "name"):
        if isinstance(doc.get(key), str) and doc[key].strip():
            return str(doc[key]).strip()
    return None


@dataclass
class _Group:
    name: str
    entries: list[Any] = field(default_factory=list)
    formats: list[ToolDocFormat] = field(default_factory=list)
    explicit_format: ToolDocFormat | None = None
    hint: ToolDocFormat | None = None
    context: dict[str, Any] = field(default_factory=dict)


class _ServerBuilder:
    """Groups a file's documents into candidate servers (file stem / serverInfo / OpenAPI title)."""

    def __init__(self, *, source: str, stem: str) -> None:
        self.source = source
        self.stem = stem
        self._groups: dict[str, _Group] = {}
        self._openapi: list[_Group] = []

    def add(self, doc: _Doc) -> LoadError | None:
        try:
            value = _jsonable(doc.value)
        except (_Unsafe, RecursionError) as exc:
            return _err(self.source, doc.where, str(exc), "simplify the document", doc.raw)
        if isinstance(value, dict) and "swagger" in value and "openapi" not in value:
            return _err(
                self.source,
                doc.where,
                f"Swagger {value.get('swagger')} documents are not supported",
                "convert it to OpenAPI 3 (e.g. `npx swagger2openapi FILE`)",
                doc.raw,
            )
        if isinstance(value, dict) and _openapi_version(value) is not None:
            return self._add_openapi(value, doc)
        found = _container_entries(value)
        if found.entries is None:
            return _err(
                self.source, doc.where, found.problem or "unknown document format", _SUPPORTED_SHAPES, doc.raw
            )
        name = found.name or self.stem
        group = self._groups.setdefault(name, _Group(name=name))
        group.entries.extend(found.entries)
        group.formats.extend(f for f in map(_entry_format, found.entries) if f is not None)
        group.hint = group.hint or found.hint
        return None

    def _add_openapi(self, spec: dict[str, Any], doc: _Doc) -> LoadError | None:
        version = _openapi_version(spec) or ""
        if not version.startswith("3"):
            return _err(
                self.source,
                doc.where,
                f"OpenAPI version {version!r} is not supported (need 3.x)",
                "convert the document to OpenAPI 3.0 or 3.1",
                doc.raw,
            )
        paths = spec.get("paths", {})
        if paths is None:
            paths = {}
        if not isinstance(paths, dict):
            return _err(
                self.source,
                f"{doc.where}: paths" if doc.where else "paths",
                f"'paths' must be a mapping of path -> operations, got a {type(paths).__name__}",
                "see https://spec.openapis.org/oas/v3.0.3#paths-object",
                doc.raw,
            )
        entries: list[Any] = []
        for path, item in paths.items():
            if not isinstance(item, dict):
                # Keep it: the normaliser reports it as an unconvertible entry with its location.
                entries.append(
                    {
                        "path": path,
                        "method": None,
                        "operation": item,
                        "path_parameters": [],
                        "location": f"paths.{path}",
                    }
                )
                continue
            shared = item.get("parameters", [])
            for method in OPENAPI_METHODS:  # spec order, so the result is deterministic
                if method in item:
                    entries.append(
                        {
                            "path": path,
                            "method": method,
                            "operation": item[method],
                            "path_parameters": shared if isinstance(shared, list) else [],
                            "location": f"paths.{path}.{method}",  # for error messages downstream
                        }
                    )
        info = spec.get("info") if isinstance(spec.get("info"), dict) else {}
        assert isinstance(info, dict)
        title = info.get("title")
        name = str(title).strip() if isinstance(title, str) and title.strip() else self.stem
        components = spec.get("components")
        context: dict[str, Any] = {
            "openapi": version,
            "components": components if isinstance(components, dict) else {},
        }
        if isinstance(info.get("version"), str | int | float):
            context["info_version"] = str(info["version"])
        if isinstance(spec.get("servers"), list):
            context["servers"] = spec["servers"]
        self._openapi.append(
            _Group(name=name, entries=entries, explicit_format=ToolDocFormat.openapi, context=context)
        )
        return None

    def servers(self) -> list[RawToolServer]:
        groups = list(self._groups.values()) + self._openapi
        used: Counter[str] = Counter()
        out: list[RawToolServer] = []
        for g in groups:
            used[g.name] += 1
            # Two services with the same name in one file stay apart: suffix the later ones.
            name = g.name if used[g.name] == 1 else f"{g.name}-{used[g.name]}"
            fmt = g.explicit_format or _majority(g.formats, g.hint)
            out.append(
                RawToolServer(
                    server=name,
                    source=self.source,
                    format=fmt,
                    entries=g.entries,
                    context=g.context,
                    published_at=utcnow(),
                )
            )
        return out

"""Tool-doc loader: files and folders of tool documentation -> candidate servers.

ASTRA §2.1.1 collects tool documents from heterogeneous sources and groups them
by originating service. This module does the collecting and grouping; it keeps
every tool entry exactly as found (``RawToolServer.entries``) and leaves the
conversion to the OpenAI schema to ``synthesis.tools.normalize``, so that what was
published can always be replayed against a newer normaliser.

Supported inputs (auto-detected per document, whatever the file extension):

- OpenAI tool schemas: ``{"type": "function", "function": {...}}`` or bare
  ``{"name", "description", "parameters"}``, alone or in a list (also the legacy
  ``{"functions": [...]}``);
- MCP ``tools/list`` results: ``{"tools": [{"name", "description", "inputSchema"}]}``,
  optionally wrapped in a JSON-RPC response ``{"result": {...}}``;
- BFCL-style function docs (``"type": "dict"``, ``float``, ``tuple``, ``any``,
  optional ``response``), including BFCL question records ``{"function": [...]}``;
- OpenAPI 3 and Swagger 2.0 documents: each path + method operation is one entry;
- tool-registry metadata dumps (Smithery / glama style): a server record whose tools sit
  in an envelope (``metadata.remote_server_response.tools``, snake-case ``input_schema``,
  possibly listed twice), alone, one per line, or in a list / ``{"servers": [...]}``;
- function-calling datasets, one record per line or in a list: BFCL question records
  (``{"question", "function": [...]}``), xLAM / Hermes / ToolACE-style records whose
  ``tools`` / ``functions`` field is a list or a JSON string of one.

Grouping (ASTRA groups tools by originating service): a declared service (OpenAPI
``info.title``, MCP ``serverInfo.name``, a registry record's name) is one server; the
loose functions of a file are one server named after the file, unless they come from
dataset lines or exceed ``LoadOptions.max_server_tools``: then ``producers.tool_groups``
groups them by namespace, co-occurrence in a line and lexical similarity. Tools are
deduplicated by name and normalised schema (``synthesis.tools.normalize.entry_fingerprint``);
a same-name tool with another schema keeps the richer one and leaves a ``LoadNotice``.
Every server is bounded (split with a notice), so no record is normally large.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, time
from itertools import accumulate
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from arena.records.common import utcnow
from arena.records.tools import RawToolServer, ToolDocFormat
from producers.tool_groups import Member, chunk, group_tools, namespace
from synthesis.tools.normalize import MIN_TOOLS as MIN_SERVER_TOOLS
from synthesis.tools.normalize import Fingerprint, entry_fingerprint

SUFFIXES: tuple[str, ...] = (".json", ".jsonl", ".yaml", ".yml")
"""Extensions picked up when a folder is loaded (explicit files load whatever their name)."""

OPENAPI_METHODS: tuple[str, ...] = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

MAX_FILE_BYTES = 64 * 1024 * 1024
"""Bigger files are refused (split them): the whole file is parsed in memory."""
MAX_NESTING = 200
"""Deeper documents are refused instead of blowing the interpreter's stack later."""
MAX_NODES = 2_000_000
"""YAML aliases can expand a small file exponentially ("billion laughs"); stop here."""

_SUPPORTED_SHAPES = (
    "use one of: an OpenAI tool list ([{'type': 'function', 'function': {...}}] or bare "
    "{'name', 'description', 'parameters'}), an MCP tools/list result ({'tools': [...]}), "
    "BFCL function docs or dataset records, an OpenAPI 3 / Swagger 2.0 document, or a tool-registry "
    "record with its tools"
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


class LoadNotice(BaseModel):
    """Something worth telling the user that is not an error: a conflict resolved, a server split."""

    model_config = ConfigDict(extra="forbid")

    file: Annotated[str, Field(description="The file concerned.")]
    entry: Annotated[str | None, Field(description="Where in the file, e.g. 'line 12, entry 0'.")] = None
    message: Annotated[str, Field(description="What happened and what the loader did about it.")]

    def describe(self) -> str:
        return self.file + (f" [{self.entry}]" if self.entry else "") + f": {self.message}"


class LoadStats(BaseModel):
    """Counts for the summary table."""

    tools_read: Annotated[int, Field(description="Tool entries found (before deduplication).")] = 0
    duplicates_merged: Annotated[
        int, Field(description="Entries identical in name and normalised schema to one kept.")
    ] = 0
    conflicts: Annotated[
        int, Field(description="Same-name entries with another schema (the richer one is kept).")
    ] = 0
    servers_formed: Annotated[int, Field(description="Candidate servers formed.")] = 0

    def add(self, other: LoadStats) -> None:
        for name in LoadStats.model_fields:
            setattr(self, name, getattr(self, name) + getattr(other, name))


class LoadResult(BaseModel):
    """Everything read from the given paths: candidate servers, load errors, notices and counts."""

    servers: list[RawToolServer] = Field(default_factory=list)
    errors: list[LoadError] = Field(default_factory=list)
    notices: list[LoadNotice] = Field(default_factory=list)
    stats: LoadStats = Field(default_factory=LoadStats)

    def extend(self, other: LoadResult) -> None:
        self.servers.extend(other.servers)
        self.errors.extend(other.errors)
        self.notices.extend(other.notices)
        self.stats.add(other.stats)


# ---------------------------------------------------------------------------------------------
# Public entry points


def load_tool_docs(
    paths: list[Path], options: LoadOptions | None = None, *, progress: Callable[[int], None] | None = None
) -> LoadResult:
    """Load tool docs from files and folders (folders: recursive, sorted, ``SUFFIXES`` only).

    Grouping into candidate servers is described in the module docstring. ``progress``
    is called with the number of bytes just read (for a progress bar over
    ``planned_bytes(paths)``). Never raises on bad input.
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
        result.extend(_load_file(file, options, progress))
    return result


def planned_bytes(paths: list[Path]) -> int:
    """Total size of the files ``load_tool_docs(paths)`` would read."""
    total = 0
    for file, _ in _expand(paths):
        try:
            total += file.stat().st_size if file is not None else 0
        except OSError:
            pass
    return total


def load_tool_doc_bytes(
    data: bytes,
    *,
    source: str,
    suffix: str | None = None,
    options: LoadOptions | None = None,
    progress: Callable[[int], None] | None = None,
) -> LoadResult:
    """Load one document's bytes (e.g. from stdin or an upload) as if read from ``source``.

    ``suffix`` (".json", ".jsonl", ".yaml", ".yml") picks the parser first; by default it
    comes from ``source``, and unknown suffixes are sniffed from the content.
    """
    try:
        name = Path(source).stem or source or "tools"
        suf = (suffix if suffix is not None else Path(source).suffix).lower()
        return _load_bytes(
            data, source=source, stem=name, suffix=suf, options=options or LoadOptions(), progress=progress
        )
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


def _load_file(path: Path, options: LoadOptions | None, progress: Callable[[int], None] | None) -> LoadResult:
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
    return load_tool_doc_bytes(data, source=str(path), suffix=path.suffix, options=options, progress=progress)


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
    safe: bool = False
    """Already what ``_jsonable`` would return (checked by ``_json_doc``): no copy needed."""


@dataclass
class _Parsed:
    docs: list[_Doc] = field(default_factory=list)
    errors: list[LoadError] = field(default_factory=list)


def _load_bytes(
    data: bytes,
    *,
    source: str,
    stem: str,
    suffix: str,
    options: LoadOptions,
    progress: Callable[[int], None] | None,
) -> LoadResult:
    if not data.strip():
        return LoadResult(
            errors=[_err(source, None, "file is empty", "add tool docs to the file or remove it", data)]
        )
    decode_errors: list[LoadError] = []
    try:
        text = data.decode("utf-8-sig")  # -sig: tolerate a byte-order mark from Windows editors
    except UnicodeDecodeError as exc:
        if not _is_jsonl(data, suffix):
            return LoadResult(errors=[_not_utf8(source, data, exc, data)])
        # JSONL: only the lines that do not decode are lost; they are blanked to keep line numbers.
        text, decode_errors = _decode_lines(data, source)
        if suffix != ".jsonl":
            suffix = ".jsonl"

    parsed = _parse(text, data, source=source, suffix=suffix)
    result = LoadResult(errors=decode_errors + list(parsed.errors))
    builder = _ServerBuilder(source=source, stem=stem, options=options)
    done = 0
    for n, doc in enumerate(parsed.docs, start=1):
        result.errors.extend(builder.add(doc))
        if progress is not None and n % 200 == 0:
            step = len(data) * n // len(parsed.docs) - done
            progress(step)
            done += step
    result.servers.extend(builder.servers())
    result.notices.extend(builder.notices)
    result.stats.add(builder.stats)
    if progress is not None:
        progress(len(data) - done)
    return result


_UTF8_FIX = "re-encode the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`"


def _not_utf8(
    source: str, data: bytes, exc: UnicodeDecodeError, raw: bytes, first_line: int = 1
) -> LoadError:
    line = data[: exc.start].count(b"\n") + first_line
    bad = data[exc.start : exc.start + 1].hex()
    at = f"offset {exc.start} (line {line})" if first_line == 1 else f"line {line}, column {exc.start + 1}"
    return _err(source, f"line {line}", f"not UTF-8: byte 0x{bad} at {at} cannot be decoded", _UTF8_FIX, raw)


def _is_jsonl(data: bytes, suffix: str) -> bool:
    """JSON Lines by name, or by content: a first line that is a whole JSON object or array."""
    if suffix == ".jsonl":
        return True
    first = next((ln for ln in data.split(b"\n") if ln.strip()), b"")
    try:
        return data.count(b"\n") > 0 and _is_json_container(first.decode("utf-8-sig"))
    except UnicodeDecodeError:
        return False


def _decode_lines(data: bytes, source: str) -> tuple[str, list[LoadError]]:
    lines: list[str] = []
    errors: list[LoadError] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            lines.append(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
        except UnicodeDecodeError as exc:
            errors.append(_not_utf8(source, raw, exc, raw, first_line=number))
            lines.append("")
    return "\n".join(lines), errors


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


class _NonFinite(Exception):
    pass


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: valid JSON, but Python reads it as infinity
        raise _NonFinite(text)
    return value


_CHECKED_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def _json_doc(text: str) -> tuple[Any, bool]:
    """``_json_loads(text)``, and whether the value is already what ``_jsonable`` would return.

    It is when no float overflows (checked while parsing) and ``_json_is_safe(text)``; then
    the loader skips the deep copy, which costs far more than parsing.
    """
    if text.startswith("\ufeff"):
        return _json_loads(text), False  # json.loads refuses a byte-order mark with its own message
    try:
        value = _CHECKED_DECODER.decode(text)
    except _NonFinite:
        return _json_loads(text), False
    return value, _json_is_safe(text)


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
        value, safe = _json_doc(text)
    except Exception as exc:  # JSONDecodeError, ValueError (NaN), RecursionError
        # Maybe JSONL content in a .json file: it is when the first line is a whole JSON
        # object or array. (A truncated pretty-printed document starts with a lone bracket.)
        lines = _nonblank_lines(text)
        if len(lines) > 1 and _is_json_container(lines[0]):
            return _parse_jsonl(text, data, source=source, whole_json_fallback=False)
        problem = _json_problem(exc, text)
        fix = _TRUNCATED_FIX if "truncated?" in problem else _JSON_FIX
        return _Parsed(errors=[_err(source, None, problem, fix, data)])
    return _Parsed(docs=[_Doc(value, None, data, safe)])


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
            value, safe = _json_doc(text)
            return _Parsed(docs=[_Doc(value, None, data, safe)])
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
            value, safe = _json_doc(line)
            out.docs.append(_Doc(value, f"line {number}", raw, safe))
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


# What json.loads builds has string keys and no NaN; it may still hold lone surrogates ("\\ud800"
# escapes), floats that overflow to infinity (see ``_json_doc``), or be too deep or too big: text
# that might is walked by ``_jsonable`` (a false alarm only costs time).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_JSON_BRACKETS = re.compile(r"[\[\]{}]")
_JSON_EMPTY = re.compile(r"[\[{][ \t\r\n]*[\]}]")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _json_is_safe(text: str) -> bool:
    """Is ``_jsonable(v) == v`` for ``v = json.loads(text)`` (whose floats are all finite)?

    Decided from the text of a document that parsed: no lone surrogate (escaped or not), at most
    ``MAX_NESTING`` brackets open at once and at most ``MAX_NODES`` values. Each value takes
    at least one character and each level one bracket, so short texts need no closer look.
    """
    if "\\u" in text and _SURROGATE_ESCAPE.search(text):
        return False
    if not text.isascii() and _SURROGATES.search(text):  # not from a file (UTF-8 has none), but be sure
        return False
    if len(text) <= MAX_NODES and text.count("[") + text.count("{") <= MAX_NESTING:
        return True
    bare = _JSON_STRING.sub("0", text)  # each string one character: its brackets and commas are text
    depth = max(accumulate(map(_DEPTH_STEP.__getitem__, _JSON_BRACKETS.findall(bare))), default=0)
    if depth > MAX_NESTING:
        return False
    if len(text) <= MAX_NODES:
        return True
    # The values: the document, then one per comma and one more per non-empty container.
    filled = bare.count("[") + bare.count("{") - len(_JSON_EMPTY.findall(bare))
    return 1 + bare.count(",") + filled <= MAX_NODES


def _from_json(text: str) -> Any:
    """``_jsonable(_json_loads(text))``, without the copy when it would change nothing."""
    value, safe = _json_doc(text)
    return value if safe else _jsonable(value)


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


def _swagger_version(doc: dict[str, Any]) -> str | None:
    v = doc.get("swagger")
    return None if v is None or "openapi" in doc else str(v)


# -- recognising documents ---------------------------------------------------------------------

TOOL_LIST_KEYS: tuple[str, ...] = (
    "tools",
    "functions",
    "function",
    "api_list",
    "apis",
    "tool_list",
    "available_tools",
)
"""Keys under which datasets keep candidate tools, as a list or as a JSON string of one."""
_NAME_KEYS = (
    "qualifiedName",
    "qualified_name",
    "server_name",
    "server",
    "name",
    "displayName",
    "display_name",
)
_RECORD_LIST_KEYS = ("servers", "items", "data", "results", "records", "rows")
_SCHEMA_KEYS = ("parameters", "inputSchema", "input_schema")
_MAX_DEPTH_SEARCH = 6
_MAX_EMBEDDED_JSON = 8 * 1024 * 1024


def _embedded_json(value: str) -> Any:
    """A JSON list/object inside a string field (xLAM / Hermes ``"tools": "[...]"``), else None."""
    text = value.strip()
    if text[:1] not in ("[", "{") or len(text) > _MAX_EMBEDDED_JSON:
        return None
    try:
        return _from_json(text)
    except Exception:
        return None


def _tool_lists(v: Any, depth: int = 0, key: str | None = None) -> list[list[Any]]:
    """Every list of tool entries inside ``v`` (not descending into tools), in document order."""
    if depth > _MAX_DEPTH_SEARCH:
        return []
    if isinstance(v, str):
        if key not in TOOL_LIST_KEYS:
            return []
        inner = _embedded_json(v)
        if isinstance(inner, dict) and _is_toolish(inner):
            return [[inner]]
        return _tool_lists(inner, depth + 1) if isinstance(inner, list | dict) else []
    if isinstance(v, list):
        if any(_is_toolish(x) and not _has_tools_below(x, depth) for x in v):
            return [v]
        return [found for x in v[:10_000] for found in _tool_lists(x, depth + 1)]
    if isinstance(v, dict):
        if _is_toolish(v) and any(k in v for k in _SCHEMA_KEYS):
            return []
        if key in TOOL_LIST_KEYS and _is_toolish(v):
            return [[v]]  # BFCL `"function": {...}` (a single doc, not a list)
        return [found for k, x in v.items() for found in _tool_lists(x, depth + 1, k)]
    return []


def _has_tools_below(v: Any, depth: int) -> bool:
    """A registry record (name, description, and tools in an envelope) is not itself a tool."""
    if not isinstance(v, dict) or any(k in v for k in _SCHEMA_KEYS) or v.get("type") == "function":
        return False
    return any(_tool_lists(x, depth + 1, k) for k, x in v.items() if k != "name")


def _is_tool(v: Any) -> bool:
    return _is_toolish(v) and not _has_tools_below(v, 0)


def _is_record(v: Any) -> bool:
    """A dataset line or registry record: a dict that holds tools without being one."""
    return isinstance(v, dict) and not _is_tool(v) and bool(_tool_lists(v))


def _records(value: Any) -> list[Any] | None:
    """Top-level collections of records: ``[record, ...]`` or ``{"servers": [record, ...]}``."""
    items: Any = value
    if isinstance(value, dict) and not _is_record(value):
        return None
    if isinstance(value, dict):
        found = [value[k] for k in _RECORD_LIST_KEYS if isinstance(value.get(k), list)]
        if len(value) > 3 or not found:
            return None
        items = found[0]
    if not isinstance(items, list) or not items or any(_is_tool(x) for x in items):
        return None
    return items if any(_is_record(x) for x in items) else None


@dataclass
class _Entries:
    """What a non-OpenAPI document holds: entries (None if unrecognised) or the problem."""

    entries: list[Any] | None
    name: str | None = None
    hint: ToolDocFormat | None = None
    problem: str | None = None
    dataset: bool = False
    """A dataset line (its tools were offered together): a co-occurrence unit for grouping."""


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
    name = _server_name(doc)
    for key in ("tools", "functions"):
        if isinstance(doc.get(key), list):
            # MCP tools/list (or a legacy OpenAI `functions` list); may legitimately be empty.
            # Registry dumps may list the tools again inside a metadata envelope: take both.
            hint = ToolDocFormat.mcp if key == "tools" else ToolDocFormat.openai
            others = [x for k, v in doc.items() if k != key for x in _tool_lists(v, 1, k)]
            entries = _expand_entries(doc[key]) + [e for lst in others for e in _expand_entries(lst)]
            return _Entries(entries, name=name, hint=hint, dataset=name is None and _is_dataset(doc))
    if _is_bfcl_question(doc):
        return _Entries(_expand_entries([doc]), dataset=True)
    if _is_tool(doc):
        return _Entries([doc])
    lists = _tool_lists(doc)
    if lists:  # registry records (metadata envelopes), dataset lines with JSON-string tool lists
        entries = [e for lst in lists for e in _expand_entries(lst)]
        return _Entries(entries, name=name, hint=_hint(entries), dataset=name is None)
    for key in ("tools", "functions"):
        if key in doc:
            return _Entries(None, problem=f"'{key}' must be a list of tools, got a {type(doc[key]).__name__}")
    keys = ", ".join(sorted(map(str, doc))[:8])
    return _Entries(None, problem=f"unknown document format (top-level keys: {keys or 'none'})")


_DATASET_KEYS = frozenset(
    {"question", "query", "answers", "answer", "messages", "conversations", "conversation", "chat", "system"}
    | {"instruction", "prompt", "ground_truth", "execution_result", "id"}
)


def _is_dataset(doc: dict[str, Any]) -> bool:
    return bool(_DATASET_KEYS & set(doc))


def _hint(entries: list[Any]) -> ToolDocFormat | None:
    snake = any(isinstance(e, dict) and "input_schema" in e for e in entries)
    return ToolDocFormat.mcp if snake else None


def _server_name(doc: dict[str, Any]) -> str | None:
    """MCP ``serverInfo.name``, else a registry / ``server`` / ``name`` string next to the tools."""
    for key in ("serverInfo", "server_info", "server"):
        info = doc.get(key)
        if isinstance(info, dict) and isinstance(info.get("name"), str) and info["name"].strip():
            return str(info["name"]).strip()
    for key in _NAME_KEYS:
        if isinstance(doc.get(key), str) and doc[key].strip():
            return str(doc[key]).strip()[:200]
    return None


# -- building servers --------------------------------------------------------------------------


@dataclass
class LoadOptions:
    """How the loader groups and labels what it reads."""

    max_server_tools: int = 64
    """Bound on tools per candidate server; bigger groups are split (with a notice)."""
    min_server_tools: int = MIN_SERVER_TOOLS
    """Grouping packs loose functions into servers of at least this many tools."""
    pack_size: int = 8
    """Largest server formed by packing loose functions of a collection together."""
    format: ToolDocFormat | None = None
    """Overrides format detection (``--format``)."""


@dataclass
class _Item:
    """One raw entry and where it was found."""

    entry: Any
    where: str
    unit: int | None = None


@dataclass
class _Group:
    name: str
    items: list[_Item] = field(default_factory=list)
    formats: list[ToolDocFormat] = field(default_factory=list)
    explicit_format: ToolDocFormat | None = None
    hint: ToolDocFormat | None = None
    context: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Tool:
    """A distinct tool after deduplication: the entry kept and every line it was offered in."""

    item: _Item
    fp: Fingerprint | None
    units: set[int] = field(default_factory=set)


class _ServerBuilder:
    """Groups a file's documents into candidate servers (declared services, namespaces, clusters)."""

    def __init__(self, *, source: str, stem: str, options: LoadOptions | None = None) -> None:
        self.source = source
        self.stem = stem
        self.options = options or LoadOptions()
        self._groups: dict[str, _Group] = {}
        self._openapi: list[_Group] = []
        self._pool = _Group(name=stem)
        self._units = 0
        self._documents = 0
        self.stats = LoadStats()
        self.notices: list[LoadNotice] = []
        # Entry JSON -> fingerprint: datasets repeat the same entries thousands of times.
        self._fingerprints: dict[str, Fingerprint | None] = {}

    def add(self, doc: _Doc) -> list[LoadError]:
        """Add one parsed document; the problems found in it (the valid part is kept)."""
        try:
            value = doc.value if doc.safe else _jsonable(doc.value)
        except (_Unsafe, RecursionError) as exc:
            return [_err(self.source, doc.where, str(exc), "simplify the document", doc.raw)]
        records = _records(value) if self.options.format != ToolDocFormat.openapi else None
        if records is None:
            err = self._add_value(value, doc, doc.where)
            return [err] if err is not None else []
        errors: list[LoadError] = []
        for i, record in enumerate(records):
            where = f"{doc.where}, item {i}" if doc.where else f"item {i}"
            err = self._add_value(record, doc, where)
            if err is not None:
                errors.append(err)
        return errors

    def _add_value(self, value: Any, doc: _Doc, where: str | None) -> LoadError | None:
        if isinstance(value, dict) and (
            _openapi_version(value) is not None
            or _swagger_version(value) is not None
            or (self.options.format == ToolDocFormat.openapi and isinstance(value.get("paths"), dict))
        ):
            return self._add_openapi(value, doc, where)
        found = _container_entries(value)
        if found.entries is None:
            return _err(
                self.source, where, found.problem or "unknown document format", _SUPPORTED_SHAPES, doc.raw
            )
        self._documents += 1
        unit: int | None = None
        if found.name is None and found.dataset:
            self._units += 1
            unit = self._units
        group = self._pool if found.name is None else self._groups.setdefault(found.name, _Group(found.name))
        base = where or "document"
        group.items.extend(_Item(e, f"{base}, entry {i}", unit) for i, e in enumerate(found.entries))
        group.formats.extend(f for f in map(_entry_format, found.entries) if f is not None)
        group.hint = group.hint or found.hint
        self.stats.tools_read += len(found.entries)
        return None

    def _add_openapi(self, spec: dict[str, Any], doc: _Doc, where: str | None) -> LoadError | None:
        swagger = _swagger_version(spec)
        version = swagger or _openapi_version(spec) or "3.0.0"
        if swagger is not None and not swagger.startswith("2"):
            return _err(
                self.source,
                where,
                f"Swagger version {swagger!r} is not supported (need 2.0, or OpenAPI 3.x)",
                "convert the document to OpenAPI 3.0 or 3.1",
                doc.raw,
            )
        if swagger is None and not version.startswith("3"):
            return _err(
                self.source,
                where,
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
                f"{where}: paths" if where else "paths",
                f"'paths' must be a mapping of path -> operations, got a {type(paths).__name__}",
                "see https://spec.openapis.org/oas/v3.0.3#paths-object",
                doc.raw,
            )
        entries = _openapi_entries(paths)
        info = spec.get("info") if isinstance(spec.get("info"), dict) else {}
        assert isinstance(info, dict)
        title = info.get("title")
        name = str(title).strip() if isinstance(title, str) and title.strip() else self.stem
        context = _openapi_context(spec, version, swagger is not None)
        if isinstance(info.get("version"), str | int | float):
            context["info_version"] = str(info["version"])
        base = where or "document"
        items = [_Item(e, f"{base}, {e['location']}") for e in entries]
        self._openapi.append(
            _Group(name=name, items=items, explicit_format=ToolDocFormat.openapi, context=context)
        )
        self.stats.tools_read += len(entries)
        return None

    # -- servers ---------------------------------------------------------------------------
    def servers(self) -> list[RawToolServer]:
        planned: list[tuple[str, _Group, list[_Item]]] = []
        bound = max(1, self.options.max_server_tools)
        for g in self._groups.values():
            tools = self._dedup(g)
            planned.extend(self._split_declared(g, [t.item for t in tools], bound))
        for g in self._openapi:
            planned.extend(self._split_declared(g, g.items, bound))
        planned.extend(self._group_pool(bound))
        used: Counter[str] = Counter()
        out: list[RawToolServer] = []
        for name, g, items in planned:
            used[name] += 1
            # Two services with the same name in one file stay apart: suffix the later ones.
            unique = name if used[name] == 1 else f"{name}-{used[name]}"
            formats = [f for f in map(_entry_format, (i.entry for i in items)) if f is not None]
            fmt = self.options.format or g.explicit_format or _majority(formats or g.formats, g.hint)
            out.append(
                RawToolServer(
                    server=unique,
                    source=self.source,
                    format=fmt,
                    entries=[i.entry for i in items],
                    context=g.context,
                    published_at=utcnow(),
                )
            )
        self.stats.servers_formed = len(out)
        return out

    def _dedup(self, g: _Group) -> list[_Tool]:
        """One tool per name: identical schemas merge (keeping the longer description); different
        schemas keep the richer one, with a notice naming both places."""
        kept: list[_Tool] = []
        by_name: dict[str, int] = {}
        variants: dict[str, set[str]] = {}  # schema hashes seen per name: one notice per variant
        for item in g.items:
            fp = _cached_fingerprint(item.entry, self._fingerprints)
            units = {item.unit} if item.unit is not None else set()
            if fp is None or fp.name not in by_name:
                if fp is not None:
                    by_name[fp.name] = len(kept)
                    variants[fp.name] = {fp.schema_hash}
                kept.append(_Tool(item, fp, units))
                continue
            old = kept[by_name[fp.name]]
            assert old.fp is not None
            old.units |= units
            known = fp.schema_hash in variants[fp.name]
            variants[fp.name].add(fp.schema_hash)
            if old.fp.schema_hash == fp.schema_hash or (known and fp.richness <= old.fp.richness):
                self.stats.duplicates_merged += 1
                if old.fp.schema_hash == fp.schema_hash and len(fp.description) > len(old.fp.description):
                    old.item, old.fp = _Item(item.entry, old.item.where, old.item.unit), fp
                continue
            self.stats.conflicts += 1
            richer = fp.richness > old.fp.richness
            self._conflict(fp, item, old, kept_new=richer)
            if richer:
                old.item, old.fp = item, fp
        return kept

    def _conflict(self, fp: Fingerprint, item: _Item, old: _Tool, *, kept_new: bool) -> None:
        assert old.fp is not None
        a, b = set(old.fp.property_names), set(fp.property_names)
        diff = (
            f"parameters only there: {sorted(a - b)[:5]}, only here: {sorted(b - a)[:5]}"
            if a != b
            else "same parameter names, different types or constraints"
        )
        kept = "this one" if kept_new else f"the one at {old.item.where}"
        self.notices.append(
            LoadNotice(
                file=self.source,
                entry=item.where,
                message=(
                    f"tool {fp.name!r} is also defined at {old.item.where} with a different 'parameters' "
                    f"schema ({diff}); kept {kept} (more parameters, then the longer description)"
                ),
            )
        )

    def _split_declared(
        self, g: _Group, items: list[_Item], bound: int
    ) -> list[tuple[str, _Group, list[_Item]]]:
        if len(items) <= bound:
            return [(g.name, g, items)]
        order = sorted(range(len(items)), key=lambda i: _split_key(items[i].entry, i, self._fingerprints))
        chunks = chunk(order, bound)
        self.notices.append(
            LoadNotice(
                file=self.source,
                entry=None,
                message=(
                    f"server {g.name!r} has {len(items)} tools, more than the bound of {bound}: split into "
                    f"{len(chunks)} servers {g.name}:1..{len(chunks)} (raise --max-server-tools to keep it whole)"
                ),
            )
        )
        return [(f"{g.name}:{n}", g, [items[i] for i in sorted(c)]) for n, c in enumerate(chunks, start=1)]

    def _group_pool(self, bound: int) -> list[tuple[str, _Group, list[_Item]]]:
        pool = self._pool
        if not pool.items:
            # Documents that list zero tools still make a (empty) server: the min_tools gate says why.
            return [(pool.name, pool, [])] if self._documents and not self._busy() else []
        tools = self._dedup(pool)
        has_units = any(t.units for t in tools)
        if not has_units and len(tools) <= bound:
            return [(pool.name, pool, [t.item for t in tools])]
        members = [
            Member(
                name=t.fp.name if t.fp else f"#{i}",
                description=t.fp.description if t.fp else "",
                units=frozenset(t.units),
            )
            for i, t in enumerate(tools)
        ]
        groups = group_tools(
            members,
            bound=bound,
            min_size=self.options.min_server_tools,
            pack_size=self.options.pack_size,
        )
        if len(groups) == 1:
            return [(pool.name, pool, [tools[i].item for i in groups[0].members])]
        return [(f"{pool.name}:{grp.label}", pool, [tools[i].item for i in grp.members]) for grp in groups]

    def _busy(self) -> bool:
        return bool(self._groups or self._openapi)


_KEY_ENCODER = json.JSONEncoder(sort_keys=True, check_circular=False)
"""Entries come out of ``_jsonable`` or the JSON parser: acyclic, so the cycle check is skipped."""


def _cached_fingerprint(entry: Any, cache: dict[str, Fingerprint | None]) -> Fingerprint | None:
    try:
        key = _KEY_ENCODER.encode(entry)
    except (TypeError, ValueError, RecursionError):
        return entry_fingerprint(entry)
    if key not in cache:
        cache[key] = entry_fingerprint(entry)
    return cache[key]


def _split_key(entry: Any, index: int, cache: dict[str, Fingerprint | None]) -> tuple[str, str, int]:
    """Sort key that keeps related tools together when a declared server is split."""
    if isinstance(entry, dict) and "operation" in entry:
        op = entry.get("operation")
        tags = op.get("tags") if isinstance(op, dict) else None
        path = str(entry.get("path", ""))
        tag = str(tags[0]) if isinstance(tags, list) and tags else path.strip("/").split("/")[0]
        return (tag, path, index)
    fp = _cached_fingerprint(entry, cache)
    name = fp.name if fp else ""
    return (namespace(name) or "", name, index)


def _openapi_entries(paths: dict[str, Any]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
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
    return entries


def _openapi_context(spec: dict[str, Any], version: str, swagger: bool) -> dict[str, Any]:
    """What the normaliser needs to resolve ``$ref``s: OpenAPI 3 components, Swagger 2 definitions."""
    if not swagger:
        components = spec.get("components")
        context: dict[str, Any] = {
            "openapi": version,
            "components": components if isinstance(components, dict) else {},
        }
        if isinstance(spec.get("servers"), list):
            context["servers"] = spec["servers"]
        return context
    context = {"swagger": version}
    for key in ("definitions", "parameters", "responses"):
        if isinstance(spec.get(key), dict):
            context[key] = spec[key]
    for key in ("host", "basePath"):
        if isinstance(spec.get(key), str):
            context[key] = spec[key]
    return context

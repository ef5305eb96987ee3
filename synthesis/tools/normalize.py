"""Schema normalisation and quality gates for tool docs (ASTRA §2.1.1).

Pure, deterministic functions; the ``tools.raw -> tools.servers`` stage wraps them.

``normalize_server`` converts every raw entry of a candidate server (OpenAI,
MCP ``tools/list``, BFCL-style or OpenAPI 3 operation) into the OpenAI tool
schema, with parameters as a valid JSON Schema object, and applies the
per-tool gates from the paper:

- *convertible to the unified format* -> gate ``schema``;
- *clear and actionable descriptions* -> gates ``description_missing``,
  ``description_too_short`` (fewer than 3 words), ``description_is_name``;
- one tool per name -> gate ``duplicate_name`` (the first one is kept).

``server_gate`` then applies *sufficient number of tools* (at least 3) ->
gate ``min_tools``. Over-long descriptions are capped at a UTF-8 boundary and
flagged, not rejected.

The schema conversion itself is in ``synthesis.tools.json_schema``; ``schema_problems``
checks what it emits against the JSON Schema meta-schema with ``jsonschema``.

Besides OpenAI / MCP / BFCL entries and OpenAPI 3 operations, entries convert from
Swagger 2.0 operations (``in: body`` / ``formData`` parameters, ``#/definitions``) and
from dataset dumps whose ``parameters`` map names straight to specs with Python-typing
type names (``{"k": {"type": "int, optional"}}``, the xLAM style).
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, Field

from arena.hashing import content_hash
from arena.records.common import Rejection
from arena.records.tools import NormalizedTool, RawToolServer, ToolDocFormat, ToolFunction
from synthesis.sft.lang import count_words
from synthesis.tools.json_schema import COMBINERS, Converter, SchemaError, meta_problems, type_name

MIN_TOOLS = 3
MIN_DESCRIPTION_WORDS = 3

GATES: tuple[str, ...] = (
    "schema",
    "description_missing",
    "description_too_short",
    "description_is_name",
    "duplicate_name",
    "min_tools",
)
"""Every gate name this module can emit."""


class GateDrop(BaseModel):
    """One thing a gate dropped: a tool (``<server>/<tool>``) or a whole server (``<server>``)."""

    gate: Annotated[str, Field(description="Machine-readable gate name, one of GATES.")]
    subject: Annotated[str, Field(description="'<server>' or '<server>/<tool>' ('<server>/#i' if unnamed).")]
    reason: Annotated[str, Field(description="Human-readable explanation with the measured value.")]
    details: Annotated[dict[str, Any], Field(default_factory=dict, description="Measured values.")]
    record: Annotated[dict[str, Any] | None, Field(description="The dropped item as JSON.")] = None

    def to_rejection(self, *, stage: str, topic: str, source_key: str) -> Rejection:
        """The ``<topic>.rejected`` record for this drop."""
        return Rejection.model_validate(
            {
                "stage": stage,
                "topic": topic,
                "source_key": source_key,
                "gate": self.gate,
                "reason": self.reason,
                "subject": self.subject,
                "details": self.details,
                "record": self.record,
            }
        )


class NormalizeOutcome(BaseModel):
    """The tools of one server that passed every per-tool gate, and what was dropped."""

    server: str
    tools: list[NormalizedTool] = Field(default_factory=list)
    rejections: list[GateDrop] = Field(default_factory=list)

    @property
    def dropped_tools(self) -> list[str]:
        """Names (or ``#i`` for unnamed entries) of the tools lost to a gate."""
        return [str(d.details.get("tool", d.subject)) for d in self.rejections]


# ---------------------------------------------------------------------------------------------
# Public API


def normalize_server(raw: RawToolServer, *, max_description_bytes: int = 8192) -> NormalizeOutcome:
    """Convert and gate every entry of ``raw``; never raises.

    Every entry ends up either in ``tools`` or as one ``GateDrop`` in ``rejections``,
    in entry order. Server-level gating is ``server_gate``'s job.
    """
    out = NormalizeOutcome(server=raw.server)
    first_index: dict[str, int] = {}
    for index, entry in enumerate(raw.entries):
        label = f"#{index}"
        try:
            safe = _json_safe(entry)
            label = _entry_label(safe, raw.format, index)
            tool = _convert_entry(safe, raw.format, raw.context, max_description_bytes)
        except _Drop as gate:
            out.rejections.append(_drop(raw.server, label, index, gate, _record_of(entry)))
            continue
        except Exception as exc:  # a stage must not crash on a doc; keep the evidence instead
            problem = f"conversion failed unexpectedly: {type(exc).__name__}: {exc}"
            crash = _Drop("schema", problem, {"problems": [problem], "internal_error": True})
            out.rejections.append(_drop(raw.server, label, index, crash, _record_of(entry)))
            continue
        name = tool.function.name
        if name in first_index:
            dup = _Drop(
                "duplicate_name",
                f"tool name {name!r} already used by entry #{first_index[name]}; the first one is kept",
                {"name": name, "first_index": first_index[name]},
            )
            out.rejections.append(_drop(raw.server, name, index, dup, _record_of(entry)))
            continue
        first_index[name] = index
        out.tools.append(tool)
    return out


def server_gate(name: str, tools: list[NormalizedTool], *, min_tools: int = MIN_TOOLS) -> GateDrop | None:
    """Reject a server left with fewer than ``min_tools`` tools (ASTRA: multi-turn needs >= 3)."""
    if len(tools) >= min_tools:
        return None
    names = [t.function.name for t in tools]
    return GateDrop(
        gate="min_tools",
        subject=name,
        reason=f"server has {len(tools)} usable tool(s) after filtering; at least {min_tools} are needed",
        details={"tools": len(tools), "min_tools": min_tools, "tool_names": names},
        record={"name": name, "tools": [t.model_dump(mode="json") for t in tools]},
    )


def server_id(name: str, tools: list[NormalizedTool]) -> str:
    """Content hash of the server name and its normalised tools (order-insensitive)."""
    dumped = sorted((t.model_dump(mode="json") for t in tools), key=lambda d: (d["function"]["name"], str(d)))
    return content_hash({"name": name, "tools": dumped})


def cap_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= max_bytes:
        return text, False
    # Decoding the prefix with "ignore" drops only the trailing partial character.
    return data[: max(0, max_bytes)].decode("utf-8", "ignore"), True


def sanitize_tool_name(name: str) -> str:
    """An OpenAI-valid tool name (``^[a-zA-Z0-9_.-]{1,64}$``); empty if nothing usable is left."""
    cleaned = re.sub(r"[^a-zA-Z0-9_.-]+", "_", name.strip())
    cleaned = re.sub(r"_{2,}", "_", cleaned).strip("_")
    return cleaned[:64].rstrip("_") or cleaned[:64]


def schema_problems(schema: Any, *, top_level: bool = True) -> list[str]:
    """JSON Schema meta-schema check (``jsonschema``) of what ``normalize_server`` emits ([] = valid).

    With ``top_level`` the schema must be an object schema, as OpenAI function
    parameters must be.
    """
    problems = meta_problems(schema)
    if top_level and isinstance(schema, dict) and schema.get("type") != "object":
        problems.append(f"$: parameters must have type 'object', got {schema.get('type')!r}")
    return problems


# ---------------------------------------------------------------------------------------------
# Entries


class _Drop(Exception):
    """Raised inside conversion: this entry fails ``gate``."""

    def __init__(self, gate: str, reason: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.gate = gate
        self.reason = reason
        self.details = details or {}


def _drop(server: str, label: str, index: int, drop: _Drop, record: dict[str, Any]) -> GateDrop:
    details = {"tool": label, "index": index, **drop.details}
    return GateDrop(
        gate=drop.gate, subject=f"{server}/{label}", reason=drop.reason, details=details, record=record
    )


def _record_of(entry: Any) -> dict[str, Any]:
    try:
        safe = _json_safe(entry)
    except Exception:
        safe = repr(entry)[:10_000]
    return safe if isinstance(safe, dict) else {"entry": safe}


def _entry_label(entry: Any, fmt: ToolDocFormat, index: int) -> str:
    """A readable name for an entry even before it converts (for the rejection subject)."""
    try:
        if (
            fmt == ToolDocFormat.openapi
            and isinstance(entry, dict)
            and ("operation" in entry or "path" in entry)
        ):
            op = entry.get("operation")
            op_id = op.get("operationId") if isinstance(op, dict) else None
            if isinstance(op_id, str) and sanitize_tool_name(op_id):
                return sanitize_tool_name(op_id)
            return sanitize_tool_name(f"{entry.get('method')}_{entry.get('path')}") or f"#{index}"
        fn = _function_part(entry)
        if isinstance(fn.get("name"), str) and sanitize_tool_name(fn["name"]):
            return sanitize_tool_name(fn["name"])
    except Exception:
        pass
    return f"#{index}"


def _function_part(entry: Any) -> dict[str, Any]:
    """The dict holding name/description/parameters: unwraps ``{"type": "function", "function"}``."""
    if not isinstance(entry, dict):
        return {}
    fn = entry.get("function")
    if isinstance(fn, dict) and (entry.get("type") == "function" or "name" not in entry):
        return fn
    return entry


def _convert_entry(entry: Any, fmt: ToolDocFormat, context: Any, max_bytes: int) -> NormalizedTool:
    if not isinstance(entry, dict):
        raise _Drop(
            "schema", f"entry is a {type_name(entry)}, not a tool object", {"problems": ["not an object"]}
        )
    # Dispatch on the entry's shape too: a function doc inside an OpenAPI-labelled server still converts.
    is_operation = fmt == ToolDocFormat.openapi and ("operation" in entry or "path" in entry)
    source = _OpenApiEntry(entry, context) if is_operation else _FunctionEntry(entry)
    # Gate order follows the paper's list: a vague description disqualifies before the schema is tried.
    description, truncated = _gate_description(source.name, source.description, max_bytes)
    try:
        params = source.parameters()
    except (SchemaError, RecursionError) as exc:
        raise _Drop(
            "schema", f"{source.where} cannot be converted to JSON Schema: {exc}", {"problems": [str(exc)]}
        ) from None
    problems = schema_problems(params)
    if problems:  # a converter bug must not leak an invalid schema downstream
        raise _Drop(
            "schema",
            f"produced parameters are not a valid JSON Schema: {problems[0]}",
            {"problems": problems},
        )
    try:
        response = source.response()
    except (SchemaError, RecursionError):
        response = None
    if response is not None and schema_problems(response, top_level=False):
        response = None  # metadata only: an unusable output schema is dropped, not the tool
    return NormalizedTool(
        function=ToolFunction(name=source.name, description=description, parameters=params),
        response_schema=response,
        description_truncated=truncated,
    )


def _tool_name(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Drop(
            "schema", "tool has no name (a non-empty string is required)", {"problems": ["name missing"]}
        )
    name = sanitize_tool_name(value)
    if not name:
        raise _Drop(
            "schema",
            f"tool name {value[:80]!r} has no characters usable in an OpenAI tool name (a-z, 0-9, _ . -)",
            {"problems": ["name unusable"], "name": value[:200]},
        )
    return name


class _FunctionEntry:
    """OpenAI (wrapped or bare), BFCL and MCP entries: they differ only in key names."""

    where = "parameters"

    def __init__(self, entry: dict[str, Any]) -> None:
        self.entry = entry
        self.fn = _function_part(entry)
        self.name = _tool_name(self.fn.get("name"))
        self.description: Any = self.fn.get("description")

    def parameters(self) -> dict[str, Any]:
        fn = self.fn
        if "inputSchema" in fn or "input_schema" in fn:  # MCP (and Anthropic-style) tools
            raw = fn.get("inputSchema", fn.get("input_schema"))
        else:
            raw = fn.get("parameters")
        if isinstance(raw, list):
            raw = _list_parameters(raw)
        elif isinstance(raw, dict) and _is_property_map(raw):
            raw = _property_map_parameters(raw)
        return Converter(raw).parameters(raw)

    def response(self) -> dict[str, Any] | None:
        for holder in (self.fn, self.entry):  # `response` may sit next to `function` when wrapped
            for key in ("response", "outputSchema", "output_schema", "returns"):
                if isinstance(holder.get(key), dict):
                    return Converter(holder[key]).schema(holder[key], key, 0)
        return None


def _list_parameters(items: list[Any]) -> dict[str, Any]:
    """Parameters given as a list of ``{"name", "type", "required", ...}`` (RapidAPI/ToolBench dumps)."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise SchemaError(f"parameters[{i}] must be an object with a string 'name'")
        props[item["name"]] = {k: v for k, v in item.items() if k not in ("name", "required", "in")}
        if item.get("required") is True:
            required.append(item["name"])
    return {"type": "object", "properties": props, "required": required}


_SCHEMA_KEYWORDS = frozenset({"type", "properties", "$ref", "items", "enum", "const", *COMBINERS})


def _is_property_map(raw: Any) -> bool:
    """``{"city": {"type": "str", "description": ...}, ...}``: property specs without the object wrapper."""
    return (
        isinstance(raw, dict)
        and bool(raw)
        and not _SCHEMA_KEYWORDS & set(raw)
        and all(isinstance(v, dict) and ("type" in v or "description" in v) for v in raw.values())
    )


def _property_map_parameters(raw: dict[str, Any]) -> dict[str, Any]:
    """Wrap a property map; a property is required unless it has a default or says ``optional``."""
    required = [
        key
        for key, spec in raw.items()
        if "default" not in spec
        and not (isinstance(spec.get("type"), str) and "optional" in spec["type"].lower())
        and spec.get("required") is not False
        and spec.get("optional") is not True
    ]
    props = {
        key: {k: v for k, v in spec.items() if k not in ("required", "optional")} for key, spec in raw.items()
    }
    return {"type": "object", "properties": props, "required": required}


# ---------------------------------------------------------------------------------------------
# Descriptions


def _squash(text: str) -> str:
    return re.sub(r"[\W_]+", "", text.casefold())


def _gate_description(name: str, value: Any, max_bytes: int) -> tuple[str, bool]:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _Drop("description_missing", "tool has no description", {"description": value})
    if not isinstance(value, str):
        raise _Drop(
            "description_missing",
            f"tool description is a {type_name(value)}, not text",
            {"description_type": type_name(value)},
        )
    text = value.replace("\r\n", "\n").strip()
    if _squash(text) == _squash(name):
        raise _Drop(
            "description_is_name",
            f"description {text[:80]!r} only repeats the tool name {name!r}",
            {"description": text[:200], "name": name},
        )
    words = count_words(text)
    if words < MIN_DESCRIPTION_WORDS:
        raise _Drop(
            "description_too_short",
            f"description has {words} word(s) ({text[:80]!r}); at least {MIN_DESCRIPTION_WORDS} are needed",
            {"words": words, "min_words": MIN_DESCRIPTION_WORDS, "description": text[:200]},
        )
    return cap_utf8(text, max_bytes)


# ---------------------------------------------------------------------------------------------
# OpenAPI operations

_IGNORED_HEADERS = frozenset({"accept", "content-type", "authorization"})
"""OpenAPI 3: header parameters with these names "SHALL be ignored"."""


_REF_ROOTS = ("components", "definitions", "parameters", "responses")
_PARAM_LOCATIONS = ("path", "query", "header", "cookie", "formData", "body")
_PARAM_ONLY_KEYS = frozenset({"name", "in", "required", "collectionFormat", "allowEmptyValue"})


class _OpenApiEntry:
    """One OpenAPI operation as the loader stored it: path, method, operation, path-level parameters."""

    def __init__(self, entry: dict[str, Any], context: Any) -> None:
        self.entry = entry
        path, method, op = entry.get("path"), entry.get("method"), entry.get("operation")
        location = entry.get("location")
        self.where = f"operation {str(method).upper()} {path}" + (
            f" ({location})" if isinstance(location, str) else ""
        )
        if not isinstance(op, dict) or not isinstance(method, str) or not isinstance(path, str):
            raise _Drop(
                "schema",
                f"{self.where} is not an operation object (got a {type_name(op)})",
                {"problems": ["operation is not an object"], "path": str(path)[:200]},
            )
        self.op = op
        op_id = op.get("operationId")
        use_id = isinstance(op_id, str) and bool(sanitize_tool_name(op_id))
        self.name = _tool_name(op_id if use_id else f"{method}_{path}")
        summary, desc = op.get("summary"), op.get("description")
        self.description: Any = desc
        if isinstance(summary, str) and summary.strip():
            if not isinstance(desc, str) or not desc.strip():
                self.description = summary
            elif not desc.strip().startswith(summary.strip().rstrip(".")):
                # Summary is the short form and description the details: keep both.
                self.description = f"{summary.strip().rstrip('.')}. {desc.strip()}"
        # $refs resolve against the spec's reusable parts: OpenAPI 3 `components`, Swagger 2
        # `definitions` / `parameters` / `responses` (the loader keeps them in the context).
        ctx = context if isinstance(context, dict) else {}
        root = {k: ctx[k] for k in _REF_ROOTS if isinstance(ctx.get(k), dict)}
        self.conv = Converter({"components": {}, **root})

    def parameters(self) -> dict[str, Any]:
        return _openapi_parameters(self.conv, self.entry.get("path_parameters"), self.op)

    def response(self) -> dict[str, Any] | None:
        return _openapi_response(self.conv, self.op)


def _openapi_parameters(conv: Converter, shared: Any, op: dict[str, Any]) -> dict[str, Any]:
    """Path/query/header (and Swagger 2 formData) parameters and the JSON request body
    (OpenAPI 3 ``requestBody`` or Swagger 2 ``in: body``), merged into one object schema."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for source in (shared, op.get("parameters")):
        if source is None:
            continue
        if not isinstance(source, list):
            raise SchemaError(f"'parameters' must be a list, got a {type_name(source)}")
        for i, p in enumerate(source):
            param = conv.deref(p, f"parameters[{i}]")
            pname, loc = param.get("name"), param.get("in")
            if not isinstance(pname, str) or not pname or loc not in _PARAM_LOCATIONS:
                raise SchemaError(
                    f"parameters[{i}] needs a string 'name' and 'in' of path/query/header/cookie"
                    " (Swagger 2: also formData/body)"
                )
            merged[(pname, str(loc))] = param  # operation-level overrides path-level (same name + in)

    properties: dict[str, Any] = {}
    required: list[str] = []
    bodies = [param for (_, loc), param in merged.items() if loc == "body"]
    for (pname, loc), param in merged.items():
        if loc == "body":
            continue  # merged below, like an OpenAPI 3 requestBody
        if loc == "cookie" or (loc == "header" and pname.lower() in _IGNORED_HEADERS):
            continue  # session plumbing, not arguments a model should choose
        schema = _parameter_schema(conv, param, pname)
        if isinstance(param.get("description"), str) and "description" not in schema:
            schema["description"] = param["description"]
        if pname in properties:
            raise SchemaError(f"parameter {pname!r} is defined in both {loc} and another location")
        properties[pname] = schema
        if loc == "path" or param.get("required") is True:
            required.append(pname)

    body = op.get("requestBody")
    if body is not None:
        _merge_body(conv, body, properties, required)
    for param in bodies[:1]:  # Swagger 2 allows one body parameter
        schema = conv.schema(param.get("schema", {}), "body parameter", 0)
        _merge_body_schema(schema, param.get("required") is True, properties, required)
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    return out


def _parameter_schema(conv: Converter, param: dict[str, Any], pname: str) -> dict[str, Any]:
    if "schema" in param:
        return conv.schema(param["schema"], f"parameter {pname}", 0)
    content = param.get("content")
    if isinstance(content, dict) and content:
        media = next(iter(content.values()))
        if isinstance(media, dict) and "schema" in media:
            return conv.schema(media["schema"], f"parameter {pname}", 0)
    if "type" in param:  # Swagger 2: the parameter is its own schema (type, items, enum, ...)
        own = {k: v for k, v in param.items() if k not in _PARAM_ONLY_KEYS}
        return conv.schema(own, f"parameter {pname}", 0)
    return {"type": "string"}  # OpenAPI: a parameter without a schema is sent as a string


def _json_media(content: Any) -> Any:
    """The schema of the best request/response media type (JSON first, then forms)."""
    if not isinstance(content, dict):
        return None
    keys = [k for k in content if isinstance(k, str)]
    ranked = (
        [k for k in keys if k.split(";")[0].strip() == "application/json"]
        + [k for k in keys if "json" in k]
        + [k for k in keys if k.startswith(("application/x-www-form-urlencoded", "multipart/form-data"))]
        + [k for k in keys if k == "*/*"]
    )
    for key in ranked:
        media = content[key]
        if isinstance(media, dict) and "schema" in media:
            return media["schema"]
    return None


def _merge_body(conv: Converter, body: Any, properties: dict[str, Any], required: list[str]) -> None:
    body = conv.deref(body, "requestBody")
    raw_schema = _json_media(body.get("content"))
    if raw_schema is None:
        return  # e.g. an octet-stream upload: nothing a model can fill in as JSON
    schema = conv.schema(raw_schema, "requestBody", 0)
    _merge_body_schema(schema, body.get("required") is True, properties, required)


def _merge_body_schema(
    schema: dict[str, Any], body_required: bool, properties: dict[str, Any], required: list[str]
) -> None:
    props = schema.get("properties")
    is_object = schema.get("type") == "object" and isinstance(props, dict)
    if is_object and props and not set(props) & set(properties):
        inner_required = schema.get("required", [])
        for key, sub in props.items():
            if isinstance(sub, dict) and sub.get("readOnly") is True:
                continue  # server-assigned fields (ids, timestamps) are not request arguments
            properties[key] = sub
            if body_required and key in inner_required:
                required.append(key)
        return
    # A non-object body, or one whose fields clash with parameters: pass it as one argument.
    name = "body" if "body" not in properties else "request_body"
    properties[name] = schema
    if body_required:
        required.append(name)


def _openapi_response(conv: Converter, op: dict[str, Any]) -> dict[str, Any] | None:
    responses = op.get("responses")
    if not isinstance(responses, dict):
        return None
    for code in sorted(c for c in responses if isinstance(c, str) and c.startswith("2")):
        resp = conv.deref(responses[code], f"responses.{code}")
        raw_schema = _json_media(resp.get("content"))
        if raw_schema is None and isinstance(resp.get("schema"), dict | bool):
            raw_schema = resp["schema"]  # Swagger 2: the schema sits on the response itself
        if raw_schema is not None:
            return conv.schema(raw_schema, f"responses.{code}", 0)
    return None


# ---------------------------------------------------------------------------------------------
# Helpers

_SURROGATES = re.compile("[\ud800-\udfff]")


def _json_safe(value: Any) -> Any:
    """A JSON-safe deep copy (str keys, finite floats, no lone surrogates); raises ``_Drop``."""
    budget = [200_000]

    def walk(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if depth > 100 or budget[0] < 0:
            raise _Drop(
                "schema", "entry is nested too deeply or is too large to convert", {"problems": ["too deep"]}
            )
        if v is None or isinstance(v, bool | int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else None
        if isinstance(v, str):
            return _SURROGATES.sub("\ufffd", v)
        if isinstance(v, dict):
            return {walk_key(k): walk(x, depth + 1) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [walk(x, depth + 1) for x in v]
        return _SURROGATES.sub("\ufffd", str(v))

    def walk_key(k: Any) -> str:
        return _SURROGATES.sub("\ufffd", k if isinstance(k, str) else str(k))

    return walk(value, 0)


# ---------------------------------------------------------------------------------------------
# Fingerprints (the loader deduplicates by them)


class Fingerprint(BaseModel):
    """What makes two function entries the same tool, and how rich each one is."""

    name: Annotated[str, Field(description="Sanitised tool name.")]
    schema_hash: Annotated[
        str,
        Field(description="Content hash of the normalised parameters (of the raw ones if unconvertible)."),
    ]
    properties: Annotated[int, Field(description="Number of top-level parameters.")]
    property_names: Annotated[list[str], Field(description="Top-level parameter names, for messages.")]
    description: Annotated[str, Field(description="The description as documented ('' when missing).")]

    @property
    def richness(self) -> tuple[int, int]:
        """Compared when two same-name entries differ: more parameters, then a longer description."""
        return (self.properties, len(self.description))


def entry_fingerprint(entry: Any) -> Fingerprint | None:
    """The fingerprint of a function-style entry (OpenAI, MCP, BFCL, dataset dumps); never raises.

    None for entries without a usable name and for OpenAPI operations (their names are
    generated from the path, so duplicates are not the loader's business).
    """
    try:
        if not isinstance(entry, dict) or "operation" in entry:
            return None
        source = _FunctionEntry(_json_safe(entry))
        part = {k: source.fn[k] for k in _SCHEMA_PARTS if k in source.fn}
        key = json.dumps(part)
        cached = len(key) <= _MAX_CACHED_SCHEMA
        schema_hash, names = (_schema_fingerprint if cached else _schema_fingerprint.__wrapped__)(key)
        desc = source.description if isinstance(source.description, str) else ""
        return Fingerprint(
            name=source.name,
            schema_hash=schema_hash,
            properties=len(names),
            property_names=sorted(names)[:50],
            description=desc.strip(),
        )
    except Exception:  # _Drop (no name, too deep) and anything odd: not deduplicated
        return None


_SCHEMA_PARTS = ("parameters", "inputSchema", "input_schema")
"""The keys of a function entry its parameters are converted from."""
_MAX_CACHED_SCHEMA = 16 * 1024
"""Bigger schemas are converted every time: the cache stays under 4096 x 16 KiB."""


@functools.lru_cache(maxsize=4096)
def _schema_fingerprint(part_json: str) -> tuple[str, tuple[str, ...]]:
    """Hash and top-level property names of the parameters converted from ``_SCHEMA_PARTS``.

    Cached by their JSON text (key order kept): datasets repeat one schema under many
    reworded descriptions, and converting is most of a fingerprint's cost.
    """
    part = json.loads(part_json)
    try:  # the same conversion as for a whole entry: the name plays no part in it
        params: Any = _FunctionEntry({"name": "schema", **part}).parameters()
    except (SchemaError, RecursionError):
        params = {"raw": part.get("parameters", part.get("inputSchema", part.get("input_schema")))}
    props = params.get("properties") if isinstance(params, dict) else None
    return content_hash(params), tuple(map(str, props)) if isinstance(props, dict) else ()

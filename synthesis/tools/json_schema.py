"""Tool-doc schemas to the JSON Schema subset of the unified format, and a structural check of it.

``Converter`` maps a raw parameter or response schema (JSON Schema, OpenAPI 3, BFCL / Python-ish
type names) to JSON Schema, inlining local ``$ref``s within a node budget; ``meta_problems``
validates what it emits against the JSON Schema meta-schema with ``jsonschema`` (the validator the
tool pool uses too). ``synthesis.tools.normalize`` runs both on every tool entry.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jsonschema

MAX_SCHEMA_DEPTH = 64
"""Deeper schemas are refused: no tool needs them and they cost stack."""
MAX_SCHEMA_NODES = 20_000
"""Budget of schema nodes after ``$ref`` inlining (a DAG of refs can expand exponentially)."""


class SchemaError(Exception):
    """A schema cannot be mapped to the unified format."""


# ---------------------------------------------------------------------------------------------
# Schema conversion

_TYPE_MAP: dict[str, str | None] = {
    # JSON Schema names map to themselves; BFCL / Python / Java-ish names to theirs; None = any.
    "object": "object",
    "dict": "object",
    "map": "object",
    "hashmap": "object",
    "array": "array",
    "list": "array",
    "tuple": "array",
    "arraylist": "array",
    "set": "array",
    "string": "string",
    "str": "string",
    "char": "string",
    "text": "string",
    "file": "string",
    "number": "number",
    "float": "number",
    "double": "number",
    "decimal": "number",
    "integer": "integer",
    "int": "integer",
    "long": "integer",
    "short": "integer",
    "byte": "integer",
    "bigint": "integer",
    "character": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "null": "null",
    "none": "null",
    "any": None,
    "mixed": None,
}

_TEXT_KEYS = ("description", "title", "format")
_NUMBER_KEYS = ("minimum", "maximum", "multipleOf")
_COUNT_KEYS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_BOOL_KEYS = ("uniqueItems", "readOnly", "writeOnly", "deprecated")
_VALUE_KEYS = ("default", "const")
COMBINERS = ("anyOf", "oneOf", "allOf")


def is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class Converter:
    """Raw schema -> JSON Schema, resolving local ``$ref``s against ``root`` (inlined)."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.budget = MAX_SCHEMA_NODES
        self.stack: list[str] = []

    # -- references ------------------------------------------------------------------------
    def resolve(self, ref: Any) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"$ref {str(ref)[:100]!r} is not a local reference ('#/...')")
        node = self.root
        for raw_part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = raw_part.replace("%25", "%").replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"$ref {ref[:100]!r} does not resolve")
        return node

    def deref(self, node: Any, where: str) -> dict[str, Any]:
        """Follow ``$ref`` chains of a non-schema object (parameter, request body, response)."""
        seen: set[str] = set()
        while isinstance(node, dict) and "$ref" in node:
            ref = node["$ref"]
            if not isinstance(ref, str) or ref in seen:
                raise SchemaError(f"{where}: $ref {str(ref)[:100]!r} loops or is not a string")
            seen.add(ref)
            node = self.resolve(ref)
        if not isinstance(node, dict):
            raise SchemaError(f"{where} must be an object, got a {type_name(node)}")
        return node

    # -- schemas ---------------------------------------------------------------------------
    def parameters(self, node: Any) -> dict[str, Any]:
        """The top-level parameters schema: always ``type: object`` with ``properties``."""
        if node is None or node == {}:
            return {"type": "object", "properties": {}}  # a tool without arguments
        if isinstance(node, dict) and "type" not in node and "$ref" not in node and "properties" in node:
            node = {**node, "type": "object"}  # common omission; the properties say it all
        out = self.schema(node, "parameters", 0)
        if out.get("type") != "object":
            raise SchemaError(f"parameters must be an object schema, got type {out.get('type', 'any')!r}")
        out.setdefault("properties", {})
        return out

    def schema(self, node: Any, where: str, depth: int) -> dict[str, Any]:
        self.budget -= 1
        if self.budget < 0:
            raise SchemaError(f"schema has more than {MAX_SCHEMA_NODES} nodes after $ref expansion")
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaError(f"{where}: nested more than {MAX_SCHEMA_DEPTH} levels deep")
        if node is True:
            return {}
        if not isinstance(node, dict):
            raise SchemaError(f"{where}: a schema must be an object, got a {type_name(node)}")
        if "$ref" in node:
            return self._ref(node, where, depth)

        out: dict[str, Any] = {}
        if "type" in node:
            mapped = self._type(node["type"], where)
            if mapped is not None:
                out["type"] = mapped
        if node.get("nullable") is True and isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]  # OpenAPI 3.0 `nullable` -> JSON Schema type list

        for key in _TEXT_KEYS:
            if isinstance(node.get(key), str):
                out[key] = node[key]
        if isinstance(node.get("pattern"), str) and _compiles(node["pattern"]):
            out["pattern"] = node["pattern"]
        for key in _NUMBER_KEYS:
            if is_number(node.get(key)):
                out[key] = node[key]
        if "multipleOf" in out and out["multipleOf"] <= 0:
            del out["multipleOf"]
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            value, bound = node.get(key), "minimum" if key == "exclusiveMinimum" else "maximum"
            if is_number(value):
                out[key] = value
            elif value is True and bound in out:  # draft-4 / OpenAPI 3.0 boolean form
                out[key] = out.pop(bound)
        for key in _COUNT_KEYS:
            if _is_count(node.get(key)):
                out[key] = node[key]
        for key in _BOOL_KEYS:
            if isinstance(node.get(key), bool):
                out[key] = node[key]
        for key in _VALUE_KEYS:
            if key in node:
                out[key] = node[key]
        if isinstance(node.get("examples"), list):
            out["examples"] = node["examples"]
        if "enum" in node:
            enum = node["enum"]
            if not isinstance(enum, list) or not enum:
                raise SchemaError(f"{where}: 'enum' must be a non-empty list, got {str(enum)[:60]!r}")
            out["enum"] = enum

        if "properties" in node:
            out.update(self._properties(node, where, depth))
        elif "required" in node and isinstance(node["required"], list) and node["required"]:
            raise SchemaError(f"{where}: 'required' lists {node['required'][:5]} but there are no properties")
        if "items" in node:
            items = node["items"]
            if isinstance(items, list):  # draft-4 tuple form
                out["prefixItems"] = [
                    self.schema(s, f"{where}.items[{i}]", depth + 1) for i, s in enumerate(items)
                ]
            elif isinstance(items, dict | bool):
                out["items"] = {} if items is True else self.schema(items, f"{where}.items", depth + 1)
            else:
                raise SchemaError(f"{where}: 'items' must be a schema, got a {type_name(items)}")
        if isinstance(node.get("prefixItems"), list):
            out["prefixItems"] = [
                self.schema(s, f"{where}.prefixItems[{i}]", depth + 1)
                for i, s in enumerate(node["prefixItems"])
            ]
        extra = node.get("additionalProperties")
        if isinstance(extra, bool):
            out["additionalProperties"] = extra
        elif isinstance(extra, dict):
            out["additionalProperties"] = self.schema(extra, f"{where}.additionalProperties", depth + 1)
        for key in COMBINERS:
            if key in node:
                subs = node[key]
                if not isinstance(subs, list) or not subs:
                    raise SchemaError(f"{where}: '{key}' must be a non-empty list of schemas")
                out[key] = [self.schema(s, f"{where}.{key}[{i}]", depth + 1) for i, s in enumerate(subs)]
        if isinstance(node.get("not"), dict):
            out["not"] = self.schema(node["not"], f"{where}.not", depth + 1)

        if "allOf" in out:
            _flatten_all_of(out)
        if "type" not in out and "properties" in out:
            out["type"] = "object"
        # Everything else ($defs after inlining, x-* extensions, xml, discriminator, example,
        # $schema, $id) is dropped: annotations without meaning for a tool-calling model.
        return out

    def _ref(self, node: dict[str, Any], where: str, depth: int) -> dict[str, Any]:
        ref = node["$ref"]
        if isinstance(ref, str) and ref in self.stack:
            # A recursive type (e.g. a tree): stop inlining and accept anything below here.
            return {"description": f"recursive reference to {ref}"}
        target = self.resolve(ref)
        self.stack.append(str(ref))
        try:
            out = dict(self.schema(target, str(ref), depth + 1))
        finally:
            self.stack.pop()
        if isinstance(node.get("description"), str):
            out["description"] = node["description"]  # a sibling description is more specific
        return out

    def _type(self, value: Any, where: str) -> str | list[str] | None:
        names = value if isinstance(value, list) else [value]
        if not names:
            raise SchemaError(f"{where}: 'type' is an empty list")
        mapped: list[str] = []
        for name in names:
            key = typing_name(name) if isinstance(name, str) else None
            if key is None:
                raise SchemaError(f"{where}: unknown type {str(name)[:40]!r}")
            m = _TYPE_MAP[key]
            if m is None:
                return None  # `any` anywhere in the union: no type constraint at all
            if m not in mapped:
                mapped.append(m)
        return mapped[0] if len(mapped) == 1 else mapped

    def _properties(self, node: dict[str, Any], where: str, depth: int) -> dict[str, Any]:
        props = node["properties"]
        if not isinstance(props, dict):
            raise SchemaError(f"{where}: 'properties' must be an object, got a {type_name(props)}")
        out_props: dict[str, Any] = {}
        lifted: list[str] = []
        for key, sub in props.items():
            if isinstance(sub, dict) and isinstance(sub.get("required"), bool):
                # Draft-3 style `required: true` on the property itself: lift it to the parent.
                if sub["required"]:
                    lifted.append(key)
                sub = {k: v for k, v in sub.items() if k != "required"}
            out_props[key] = self.schema(sub, f"{where}.{key}", depth + 1)
        required = node.get("required", [])
        if isinstance(required, bool) or required is None:
            required = []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{where}: 'required' must be a list of property names")
        names = list(dict.fromkeys([*required, *lifted]))
        missing = [r for r in names if r not in out_props]
        if missing:
            raise SchemaError(f"{where}: required {missing[:5]} not defined in properties")
        result: dict[str, Any] = {"properties": out_props}
        if names:
            result["required"] = names
        return result


_GENERIC = re.compile(r"^([A-Za-z_.]+)\s*\[(.*)\]$")
_CONTAINERS: dict[str, str | None] = {
    "list": "array",
    "array": "array",
    "tuple": "array",
    "set": "array",
    "frozenset": "array",
    "sequence": "array",
    "iterable": "array",
    "typing.list": "array",
    "dict": "object",
    "mapping": "object",
    "map": "object",
    "typing.dict": "object",
    "union": None,
    "literal": None,
}


def typing_name(name: str) -> str | None:
    """The ``_TYPE_MAP`` key for a type name, also Python typing / dataset spellings; None if unknown.

    ``"str, optional"`` -> ``str``; ``Optional[int]`` / ``int | None`` -> ``int``;
    ``List[str]`` / ``string[]`` -> ``list``; ``Dict[str, Any]`` -> ``dict``;
    ``Union[...]`` / ``Literal[...]`` -> ``any`` (no constraint).
    """
    text = name.strip().lower()
    if text in _TYPE_MAP:
        return text
    text = re.sub(r",\s*(optional|required)\s*$", "", text).strip()
    if text.endswith("[]"):
        return "list"
    parts = [p.strip() for p in text.split("|") if p.strip() not in ("", "none", "null")]
    if len(parts) > 1:
        return "any"
    text = parts[0] if parts else text
    match = _GENERIC.match(text)
    if match:
        head, inner = match.group(1), match.group(2)
        if head in ("optional", "typing.optional"):
            return typing_name(inner)
        kind = _CONTAINERS.get(head, "")
        if kind == "":
            return None
        return {"array": "list", "object": "dict", None: "any"}[kind]
    return text if text in _TYPE_MAP else None


def _flatten_all_of(out: dict[str, Any]) -> None:
    """Merge ``allOf`` of plain object schemas into one object (what OpenAPI models mean)."""
    parts = out["allOf"]
    plain = all(
        isinstance(p, dict)
        and (p.get("type") == "object" or "properties" in p)
        and not any(k in p for k in (*COMBINERS, "not", "additionalProperties"))
        for p in parts
    )
    if not plain or out.get("type") not in (None, "object"):
        return
    props: dict[str, Any] = dict(out.get("properties", {}))
    required: list[str] = list(out.get("required", []))
    for part in parts:
        for key, sub in part.get("properties", {}).items():
            props.setdefault(key, sub)
        required.extend(r for r in part.get("required", []) if r not in required)
        if "description" in part and "description" not in out:
            out["description"] = part["description"]
    del out["allOf"]
    out["type"] = "object"
    out["properties"] = props
    if required:
        out["required"] = required


def _compiles(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Validation of the emitted schemas: the JSON Schema meta-schema (jsonschema) plus two semantic rules

_META_VALIDATOR = jsonschema.Draft7Validator(
    jsonschema.Draft7Validator.META_SCHEMA, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
)
"""Draft 7's meta-schema: it covers every keyword the converter emits (``prefixItems`` is checked
as draft 7's tuple ``items``) and validates ~7x faster than 2020-12's vocabulary-split one."""


def meta_problems(schema: Any, limit: int = 10) -> list[str]:
    """Where ``schema`` breaks the JSON Schema meta-schema or a rule it cannot express ([] = valid).

    The rules beyond the meta-schema: ``required`` names only defined properties, and
    ``enum`` is non-empty (draft 2020-12 allows ``[]``, but nothing can then validate).
    Each problem is ``$.path: message``.
    """
    try:
        candidate = _as_draft7(schema, 0)
    except RecursionError:
        return ["$: nested too deeply"]
    problems: list[str] = []
    try:
        for error in _META_VALIDATOR.iter_errors(candidate):
            problems.append(f"{_path(error.absolute_path)}: {error.message}")
            if len(problems) >= limit:
                return problems
    except RecursionError:
        return ["$: nested too deeply"]
    _semantic(schema, "$", problems, 0)
    return problems[:limit]


def _path(parts: Any) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _as_draft7(s: Any, depth: int) -> Any:
    """A copy with 2020-12 ``prefixItems`` (+ ``items``) spelled as draft 7 ``items`` (+ ``additionalItems``)."""
    if depth > MAX_SCHEMA_DEPTH * 4:
        raise RecursionError("schema nested too deeply")
    if isinstance(s, list):
        return [_as_draft7(x, depth + 1) for x in s]
    if not isinstance(s, dict):
        return s
    out = {k: _as_draft7(v, depth + 1) for k, v in s.items()}
    if "prefixItems" in out:
        prefix = out.pop("prefixItems")
        if "items" in out:
            out["additionalItems"] = out.pop("items")
        out["items"] = prefix
    return out


def _semantic(s: Any, at: str, problems: list[str], depth: int) -> None:
    if not isinstance(s, dict) or depth > MAX_SCHEMA_DEPTH * 4:
        return
    props = s.get("properties")
    req = s.get("required")
    if isinstance(req, list):
        missing = [r for r in req if not isinstance(props, dict) or r not in props]
        if missing:
            problems.append(f"{at}.required: {missing[:5]} not in properties")
    if "enum" in s and s["enum"] == []:
        problems.append(f"{at}.enum: must be a non-empty list")
    if isinstance(props, dict):
        for key, sub in props.items():
            _semantic(sub, f"{at}.properties.{key}", problems, depth + 1)
    for key in ("items", "additionalProperties", "not", "additionalItems"):
        if isinstance(s.get(key), dict):
            _semantic(s[key], f"{at}.{key}", problems, depth + 1)
    for key in (*COMBINERS, "prefixItems"):
        if isinstance(s.get(key), list):
            for i, sub in enumerate(s[key]):
                _semantic(sub, f"{at}.{key}[{i}]", problems, depth + 1)


def type_name(v: Any) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(v), type(v).__name__
    )

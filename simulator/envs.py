"""Rules for the environment roles: lookup tools generated from the grounded table.

A tool-needing sub-question is grounded in one lookup (table, key column, key,
column), so the rules write ``get_<entity>_<column>(<key param>, ...)`` whose
implementation scans ``DATA[<tool name>]`` for the row whose key matches
(case-insensitively) and returns that row's column value: the answer is read
from the data, never written as a literal. Complexity scaling adds optional
parameters from a fixed pool (the implementation honours them) and widens the
response-format enum. On a first attempt the invocation is, with a small
seeded probability, wrong the way a model gets it wrong (a parameter name the
function does not take, a key copied with trailing punctuation), so the
stage's retry-from-invocation loop is exercised.

A passage-grounded sub-question (prose knowledge) gets a text search tool,
``search_<domain>_passages(query, top_k=3, ...)``: its implementation ranks the
chunks in ``DATA[<tool name>]`` (rows ``{"id", "text"}``) by a small BM25 over
the query's words and returns the best ones, so the answer is in the returned
text and disappears when the data no longer states it. The invocation asks for
"<attribute> of <entity>".
"""

from __future__ import annotations

import json
import keyword
import random
import re
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.records.envs import Grounding
from synthesis.envs.roles.envs import (
    HOMOGENEOUS_GROUPS,
    MERGE_INVOCATION,
    TOOL_IMPLEMENTATION,
    TOOL_INVOCATION,
    TOOL_SCALING,
    TOOL_SPEC,
    HomogeneousGroups,
    HomogeneousInput,
    MergeInvocationInput,
    ToolImplementation,
    ToolImplementationInput,
    ToolInvocation,
    ToolInvocationInput,
    ToolScalingInput,
    ToolSpec,
    ToolSpecInput,
)

WRONG_INVOCATION_RATE = 0.2
"""Share of first-attempt invocations the rules get wrong (a model's typical slips)."""

FORMATS = ["json", "text"]
WIDER_ENUMS: dict[str, list[str]] = {"response_format": ["markdown", "csv"], "language": ["it", "pt", "ja"]}
"""Values complexity scaling adds to the enums it knows (the rules implementation handles them all)."""

EXTRA_PARAMS: dict[str, dict[str, Any]] = {
    "include_source": {
        "type": "boolean",
        "default": False,
        "description": "Also return the name of the table the value comes from.",
    },
    "include_key": {
        "type": "boolean",
        "default": False,
        "description": "Also echo the matched key in the response.",
    },
    "request_id": {
        "type": ["string", "null"],
        "default": None,
        "description": "Client correlation id, echoed back in the response.",
    },
    "language": {
        "type": "string",
        "enum": ["en", "de", "fr", "es"],
        "default": "en",
        "description": "Preferred language of the response; values are returned as stored.",
    },
    "as_of": {
        "type": ["string", "null"],
        "format": "date",
        "default": None,
        "description": "Date (ISO 8601) the value should hold on; the current record when omitted.",
    },
    "max_age_days": {
        "type": ["integer", "null"],
        "minimum": 0,
        "default": None,
        "description": "Accept a cached record at most this many days old.",
    },
}
"""Optional parameters complexity scaling draws from (the rules implementation accepts them all)."""

_PY_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list"}


def ident(text: str) -> str:
    """``text`` as a snake_case Python identifier."""
    out = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower() or "value"
    if out[0].isdigit():
        out = f"v_{out}"
    return f"{out}_" if keyword.iskeyword(out) else out


def _singular(table: str) -> str:
    if table.endswith("ies"):
        return table[:-3] + "y"
    return table[:-1] if table.endswith("s") and not table.endswith("ss") else table


def key_param(entity: str, key_column: str) -> str:
    """Parameter name for the lookup key: ``listing_id`` stays, ``name`` becomes ``agent_name``."""
    param = ident(key_column)
    return param if param.startswith(entity) or param.endswith("_id") else f"{entity}_{param}"


def _grounding(g: Grounding | None, role: str) -> Grounding:
    if g is None:
        raise Undecidable(f"{role}: no grounding; the rules backend only builds table lookups")
    return g


def _lookup_param(spec: ToolSpec) -> str:
    if len(spec.required) != 1:
        raise Undecidable(f"tool {spec.name} takes {len(spec.required)} required parameters, rules need one")
    return spec.required[0]


TOP_K = 3
"""Passages a search tool returns by default."""


def passage_query(g: Grounding) -> str:
    """What a search for a passage grounding's fact asks: ``height of Eiffel Tower``."""
    return f"{g.column} of {g.key}"


def passage_spec(domain: str) -> ToolSpec:
    name = f"search_{ident(domain)}_passages"[:64]
    properties: dict[str, Any] = {
        "query": {"type": "string", "description": "What to look for: an entity and the fact wanted."},
        "top_k": {"type": "integer", "minimum": 1, "default": TOP_K, "description": "Passages to return."},
        "response_format": {
            "type": "string",
            "enum": list(FORMATS),
            "default": "json",
            "description": "json: an object with the passages; text: the passages, one per line.",
        },
    }
    return ToolSpec(
        name=name,
        description=f"Search the {domain.replace('_', ' ')} reference text. Returns "
        '{"passages": [{"id", "text"}, ...]}, the best matches first (plain text for other response '
        "formats), or an object with an 'error' when nothing matches.",
        parameters={"type": "object", "properties": properties, "required": ["query"]},
    )


def tool_spec(inputs: BaseModel, rng: random.Random) -> ToolSpec:
    assert isinstance(inputs, ToolSpecInput)
    g = _grounding(inputs.grounding, "tool_spec")
    if g.is_passage:
        return passage_spec(inputs.domain)
    entity = ident(inputs.entity or _singular(g.table))
    name = f"get_{entity}_{ident(g.column)}"[:64]
    param = key_param(entity, g.key_column)
    examples = [str(r[g.key_column]) for r in inputs.sample_rows[:3] if g.key_column in r]
    shown = f" (e.g. {', '.join(repr(e) for e in examples)})" if examples else ""
    properties: dict[str, Any] = {
        param: {"type": "string", "description": f"The {entity}'s {g.key_column}{shown}."},
        "response_format": {
            "type": "string",
            "enum": list(FORMATS),
            "default": "json",
            "description": "json: an object; text: one 'field: value' line.",
        },
    }
    return ToolSpec(
        name=name,
        description=f"Look up the {g.column} of a {entity} by its {g.key_column}. Returns "
        f'{{"{g.column}": value}} (one line of text for other response formats), or an object with '
        f"an 'error' when no {entity} matches.",
        parameters={"type": "object", "properties": properties, "required": [param]},
    )


def tool_scaling(inputs: BaseModel, rng: random.Random) -> ToolSpec:
    assert isinstance(inputs, ToolScalingInput)
    spec = inputs.spec
    properties = json.loads(json.dumps(spec.properties))  # deep copy, JSON values only
    for name, schema in properties.items():
        if isinstance(schema.get("enum"), list) and name in WIDER_ENUMS:
            schema["enum"] = [*schema["enum"], *(v for v in WIDER_ENUMS[name] if v not in schema["enum"])]
    free = [name for name in EXTRA_PARAMS if name not in properties]
    for name in rng.sample(free, min(inputs.extra_params, len(free))):
        properties[name] = json.loads(json.dumps(EXTRA_PARAMS[name]))
    return ToolSpec(
        name=spec.name,
        description=spec.description,
        parameters={**spec.parameters, "properties": properties, "required": spec.required},
    )


def _call(name: str, param: str, value: str) -> str:
    return f"{name}({param}={value!r})"


def tool_invocation(inputs: BaseModel, rng: random.Random) -> ToolInvocation:
    assert isinstance(inputs, ToolInvocationInput)
    g = _grounding(inputs.grounding, "tool_invocation")
    param = _lookup_param(inputs.spec)
    if g.is_passage:
        slip = inputs.attempt == 1 and rng.random() < WRONG_INVOCATION_RATE
        return ToolInvocation(invocation=_call(inputs.spec.name, "q" if slip else param, passage_query(g)))
    if inputs.attempt == 1 and rng.random() < WRONG_INVOCATION_RATE:
        if rng.random() < 0.5:
            wrong = "id" if param != "id" else "key"  # a generic name the function does not take
            return ToolInvocation(invocation=_call(inputs.spec.name, wrong, g.key))
        return ToolInvocation(
            invocation=_call(inputs.spec.name, param, g.key + ".")
        )  # copied with the period
    return ToolInvocation(invocation=_call(inputs.spec.name, param, g.key))


def _annotation(schema: dict[str, Any]) -> str:
    kinds = schema.get("type", "string")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    names = [_PY_TYPES.get(k, "dict") for k in kinds if k != "null"] or ["str"]
    if "null" in kinds or schema.get("default", "") is None:
        names.append("None")
    return " | ".join(dict.fromkeys(names))


def _signature(spec: ToolSpec) -> str:
    required = [f"{p}: {_annotation(spec.properties[p])}" for p in spec.required]
    optional = [
        f"{p}: {_annotation(s)} = {s.get('default')!r}"
        for p, s in spec.properties.items()
        if p not in spec.required
    ]
    return ", ".join([*required, *(["*", *optional] if optional else [])])


def tool_implementation(inputs: BaseModel, rng: random.Random) -> ToolImplementation:
    assert isinstance(inputs, ToolImplementationInput)
    g = _grounding(inputs.grounding, "tool_implementation")
    spec = inputs.spec
    param = _lookup_param(spec)
    if not inputs.rows:
        raise Undecidable("tool_implementation: no rows given; the rules backend does not invent data")
    if g.is_passage:
        return ToolImplementation(code=search_code(spec, param, inputs.data_key))
    props = spec.properties
    fmt = "response_format" in props
    lines = [
        f"def {spec.name}({_signature(spec)}) -> dict | str:",
        f"    {spec.description!r}",
        f"    wanted = str({param}).casefold()",
        f"    for row in DATA[{inputs.data_key!r}]:",
        f"        if str(row.get({g.key_column!r}, '')).casefold() == wanted:",
        f"            value = row.get({g.column!r})",
        "            break",
        "    else:",
        f"        return {{'error': {f'no record with {g.key_column} '!r} + repr({param})}}",
    ]
    if fmt:
        lines += [
            "    if response_format == 'markdown':",
            f"        return {f'**{g.column}**: '!r} + str(value)",
            "    if response_format != 'json':",
            f"        return {f'{g.column}: '!r} + str(value)",
        ]
    lines.append(f"    result = {{{g.column!r}: value}}")
    if "include_key" in props:
        lines += ["    if include_key:", f"        result[{g.key_column!r}] = row.get({g.key_column!r})"]
    if "include_source" in props:
        lines += ["    if include_source:", f"        result['source'] = {g.table!r}"]
    if "request_id" in props:
        lines += ["    if request_id is not None:", "        result['request_id'] = request_id"]
    lines.append("    return result")
    return ToolImplementation(code="\n".join(lines) + "\n")


def search_code(spec: ToolSpec, param: str, data_key: str) -> str:
    """A passage search over ``DATA[data_key]``: BM25 of the query's words, best passages first."""
    props = spec.properties
    top = "max(1, int(top_k))" if "top_k" in props else str(TOP_K)
    lines = [
        f"def {spec.name}({_signature(spec)}) -> dict | str:",
        f"    {spec.description!r}",
        "    import math",
        "    import re",
        "",
        "    def words(text):",
        "        return re.findall(r'[^\\W_]+', str(text).casefold())",
        "",
        f"    rows = DATA[{data_key!r}]",
        "    docs = [words(row.get('text', '')) for row in rows]",
        "    avg = sum(len(d) for d in docs) / max(1, len(docs))",
        f"    terms = set(words({param})) - {{'of', 'the', 'a', 'an', 'in', 'is', 'what', 'and'}}",
        "    scored = []",
        "    for n, doc in enumerate(docs):",
        "        score = 0.0",
        "        for term in terms:",
        "            tf = doc.count(term)",
        "            if tf:",
        "                df = sum(1 for d in docs if term in d)",
        "                idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))",
        "                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(doc) / (avg or 1)))",
        "        if score > 0:",
        "            scored.append((-score, n))",
        f"    hits = [rows[n] for _, n in sorted(scored)[:{top}]]",
        "    if not hits:",
        f"        return {{'error': 'no passage matches ' + repr({param})}}",
    ]
    if "response_format" in props:
        lines += [
            "    if response_format != 'json':",
            "        return '\\n'.join(str(h.get('text', '')) for h in hits)",
        ]
    lines.append("    result = {'passages': [{'id': h.get('id'), 'text': h.get('text')} for h in hits]}")
    if "include_key" in props:
        lines += ["    if include_key:", f"        result['query'] = {param}"]
    if "include_source" in props:
        lines += ["    if include_source:", "        result['source'] = 'passages'"]
    if "request_id" in props:
        lines += ["    if request_id is not None:", "        result['request_id'] = request_id"]
    lines.append("    return result")
    return "\n".join(lines) + "\n"


def homogeneous_groups(inputs: BaseModel, rng: random.Random) -> HomogeneousGroups:
    """Same (table, key column, column) lookup = same functional intent."""
    assert isinstance(inputs, HomogeneousInput)
    by_intent: dict[tuple[str, str, str], list[int]] = {}
    for view in inputs.sub_questions:
        if view.grounding is not None:
            g = view.grounding
            by_intent.setdefault((g.table, g.key_column, g.column), []).append(view.index)
    groups = sorted((sorted(ix) for ix in by_intent.values() if len(ix) > 1), key=lambda ix: ix[0])
    if not groups:
        return HomogeneousGroups(groups=[], reason="No two sub-questions look up the same field.")
    shared = "; ".join(
        f"{ix} look up {k[2]} of {k[0]} by {k[1]}" for k, ix in by_intent.items() if len(ix) > 1
    )
    return HomogeneousGroups(groups=groups, reason=f"Same lookup, different keys: {shared}.")


def merge_invocation(inputs: BaseModel, rng: random.Random) -> ToolInvocation:
    assert isinstance(inputs, MergeInvocationInput)
    g = _grounding(inputs.grounding, "merge_invocation")
    value = passage_query(g) if g.is_passage else g.key
    return ToolInvocation(invocation=_call(inputs.base.name, _lookup_param(inputs.base), value))


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    TOOL_SPEC.name: tool_spec,
    TOOL_SCALING.name: tool_scaling,
    TOOL_INVOCATION.name: tool_invocation,
    TOOL_IMPLEMENTATION.name: tool_implementation,
    HOMOGENEOUS_GROUPS.name: homogeneous_groups,
    MERGE_INVOCATION.name: merge_invocation,
}

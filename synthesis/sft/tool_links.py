"""Dependency verification of tool chains (ASTRA §2.1.2) and the output->input link rule.

A chain is well formed when every required argument of every step is supported
either by the task specification (the task states a value for it) or by a field
of an earlier step's output. This module is pure and holds the single notion of
"an output field can feed an argument" that the rule-based chain synthesiser
(``simulator.chains``) builds chains with, so a synthesised chain and its
verification agree on what a link is.

Link rule (field ``f`` of an earlier tool's response schema -> argument ``a``),
names compared in snake case (``hotelId`` = ``hotel_id``):

- same name: ``hotel_id`` <- ``hotel_id``, ``path`` <- ``entries[].path``;
- ``<entity>_id`` <- ``id`` when the entity names the field's container or the
  providing tool: ``book_id`` <- ``search_books.results[].id``;
- ``<qualifier>_<name>`` <- ``<name>`` for a role qualifier (from, to, base,
  source, target, parent, ...) and a specific field name:
  ``from_currency`` <- ``currency``, ``base_currency`` <- ``currency`` (but not
  ``guest_name`` <- a hotel's ``name``);

and the JSON types must be compatible (an integer field feeds a number argument;
an untyped side matches anything). Fields inside arrays and nested objects count
(``hotels[].hotel_id``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from arena.records.sft import Dependency, Slot
from arena.records.tools import NormalizedTool

MAX_DEPTH = 8
"""Deepest response-schema nesting searched for fields (output schemas are shallow)."""

QUALIFIERS = frozenset(
    "from to base quote source target src dst origin destination parent primary new old input output".split()
)
"""Role words that qualify an argument name without changing what it is (``from_currency``)."""

GENERIC_FIELDS = frozenset(
    "name title status state type kind value count size total amount price date time description "
    "content text message url email phone address code key label note result data".split()
)
"""Field names too generic to feed a qualified argument (a hotel's ``name`` is no ``new_name``)."""


@dataclass(frozen=True)
class OutputField:
    """One field of a tool's response schema."""

    path: str
    """Where it sits, e.g. ``hotels[].hotel_id``."""
    name: str
    """Snake-case field name, e.g. ``hotel_id``."""
    container: str
    """Snake-case name of the nearest named parent (``hotels``), or '' at the top level."""
    schema: dict[str, Any]


@dataclass(frozen=True)
class Argument:
    """One argument of a tool's input schema."""

    name: str
    """The argument's name as the tool spells it."""
    schema: dict[str, Any]
    required: bool


# ------------------------------------------------------------------------------------- names


def snake(name: str) -> str:
    """``hotelId`` / ``Idempotency-Key`` / ``check in`` -> ``hotel_id`` / ``idempotency_key`` / ``check_in``."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name)
    return re.sub(r"[^a-z0-9]+", "_", spaced.lower()).strip("_")


def singular(word: str) -> str:
    """Crude English singular, enough to compare entity names (``hotels`` -> ``hotel``)."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("ses", "xes", "ches", "shes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith("ss") and len(word) > 3:
        return word[:-1]
    return word


def is_identifier(name: str, schema: dict[str, Any] | None = None) -> bool:
    """An identifier-like argument: ``id``, ``*_id``, ``*_token``, ``uuid``, or a ``uuid`` format.

    A user does not know such values unless they own them; inside a chain they
    come from earlier outputs.
    """
    s = snake(name)
    if s in ("id", "uuid", "token") or s.endswith(("_id", "_token", "_uuid")):
        return True
    return bool(schema) and (schema or {}).get("format") == "uuid"


def entity_of(name: str) -> str | None:
    """``book_id`` -> ``book``; ``parent_note_id`` -> ``note``; ``id`` -> None."""
    s = snake(name)
    if not s.endswith("_id"):
        return None
    words = s[: -len("_id")].split("_")
    return words[-1] if words and words[-1] else None


# ------------------------------------------------------------------------------------ schemas


def arguments(tool: NormalizedTool) -> list[Argument]:
    """Every argument of ``tool`` in schema order, required ones flagged."""
    params = tool.function.parameters
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    required = [r for r in params.get("required", []) if isinstance(r, str)]
    out = [
        Argument(name, schema if isinstance(schema, dict) else {}, name in required)
        for name, schema in (props or {}).items()
    ]
    # A required name without a property schema is still required (untyped).
    out += [Argument(name, {}, True) for name in required if name not in (props or {})]
    return out


def required_arguments(tool: NormalizedTool) -> list[Argument]:
    """The required arguments of ``tool``, in schema order."""
    return [a for a in arguments(tool) if a.required]


def output_fields(tool: NormalizedTool) -> list[OutputField]:
    """Every named field of ``tool``'s response schema, depth first (empty without one)."""
    if not isinstance(tool.response_schema, dict):
        return []
    return list(_fields(tool.response_schema, "", "", 0))


def _fields(schema: dict[str, Any], path: str, container: str, depth: int) -> Iterator[OutputField]:
    if depth > MAX_DEPTH:
        return
    for key in ("anyOf", "oneOf", "allOf"):
        for alt in schema.get(key) or []:
            if isinstance(alt, dict):
                yield from _fields(alt, path, container, depth + 1)
    items = schema.get("items")
    if isinstance(items, dict):
        yield from _fields(items, f"{path}[]", container, depth + 1)
    props = schema.get("properties")
    if not isinstance(props, dict):
        return
    for name, sub in props.items():
        if not isinstance(sub, dict):
            continue
        sub_path = f"{path}.{name}" if path else name
        yield OutputField(sub_path, snake(name), container, sub)
        yield from _fields(sub, sub_path, snake(name), depth + 1)


def json_types(schema: dict[str, Any]) -> set[str]:
    """The JSON types a schema admits; empty means any."""
    raw = schema.get("type")
    types = {raw} if isinstance(raw, str) else {t for t in raw or [] if isinstance(t, str)}
    for key in ("anyOf", "oneOf"):
        for alt in schema.get(key) or []:
            if isinstance(alt, dict):
                types |= json_types(alt)
    if not types and "enum" in schema:
        types = {_json_type(v) for v in schema["enum"]}
    types.discard("null")
    return types


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def types_compatible(field_schema: dict[str, Any], arg_schema: dict[str, Any]) -> bool:
    """A value of the field's type is acceptable to the argument (integer feeds number)."""
    given, wanted = json_types(field_schema), json_types(arg_schema)
    if not given or not wanted:
        return True
    if "integer" in given and "number" in wanted:
        return True
    return bool(given & wanted)


def name_feeds(field: OutputField, arg_name: str, provider: str) -> bool:
    """The link rule on names alone (see the module docstring)."""
    arg = snake(arg_name)
    if field.name == arg:
        return True
    entity = entity_of(arg)
    if entity is not None and field.name == "id":
        context = {singular(w) for w in f"{field.container}_{snake(provider)}".split("_") if w}
        return entity in context
    # A qualified argument (from_currency) takes the plain field (currency); not the reverse.
    qualifier, _, rest = arg.partition("_")
    return qualifier in QUALIFIERS and rest == field.name and field.name not in GENERIC_FIELDS


def feeding_fields(provider: NormalizedTool, arg: Argument) -> list[OutputField]:
    """Fields of ``provider``'s output that can supply ``arg`` (name rule + type compatibility)."""
    return [
        f
        for f in output_fields(provider)
        if name_feeds(f, arg.name, provider.function.name) and types_compatible(f.schema, arg.schema)
    ]


def output_provider(chain: Sequence[NormalizedTool], step: int, arg: Argument) -> str | None:
    """``'i:tool.path'`` of the earliest step before ``step`` whose output can supply ``arg``."""
    for i in range(step):
        found = feeding_fields(chain[i], arg)
        if found:
            return f"{i}:{chain[i].function.name}.{found[0].path}"
    return None


# --------------------------------------------------------------------------------- verification


def _stated(slots: Sequence[Slot], tool: str, argument: str, text_folded: str) -> str | None:
    """The value of a slot for (tool, argument) that really occurs in the text, if any."""
    for slot in slots:
        if slot.tool == tool and slot.argument == argument:
            value = slot.value.strip()
            if value and value.casefold() in text_folded:
                return slot.value
    return None


def arguments_to_state(chain: Sequence[NormalizedTool]) -> list[tuple[str, Argument]]:
    """(tool name, argument) of every required argument on ``chain`` that no earlier step's output
    can supply: what a task for the chain must state, once per (tool, argument), in chain order."""
    seen: set[tuple[str, str]] = set()
    out: list[tuple[str, Argument]] = []
    for step, tool in enumerate(chain):
        for arg in required_arguments(tool):
            key = (tool.function.name, arg.name)
            if key not in seen and output_provider(chain, step, arg) is None:
                seen.add(key)
                out.append((tool.function.name, arg))
    return out


def verify_dependencies(chain: list[NormalizedTool], task_text: str, slots: list[Slot]) -> list[Dependency]:
    """How each required argument of each step is supported, in chain order.

    ``task`` when a slot for (tool, argument) exists and its value occurs in the
    task text (case-insensitive), else ``output`` when an earlier step's response
    schema has a field that feeds it, else ``unsupported``.
    """
    folded = task_text.casefold()
    deps: list[Dependency] = []
    for step, tool in enumerate(chain):
        name = tool.function.name
        for arg in required_arguments(tool):
            value = _stated(slots, name, arg.name, folded)
            if value is not None:
                deps.append(
                    Dependency(step=step, tool=name, argument=arg.name, source="task", provider=value)
                )
                continue
            provider = output_provider(chain, step, arg)
            source = "output" if provider is not None else "unsupported"
            deps.append(Dependency(step=step, tool=name, argument=arg.name, source=source, provider=provider))
    return deps


def failed(deps: list[Dependency]) -> list[Dependency]:
    """The dependencies nothing supports (the chain fails verification when non-empty)."""
    return [d for d in deps if d.source == "unsupported"]

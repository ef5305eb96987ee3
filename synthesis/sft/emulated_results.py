"""What an emulated tool returns: a JSON result from its schema, the arguments and the session state.

Shared by the tool emulator stage (``synthesis.sft.emulator``: ``finish`` makes any backend's answer
schema-valid and state-consistent) and the rules simulator (``simulator.emulation``: the whole
answer). This module is over 800 lines on purpose: it is one recursive value generator
(``Generator``) whose per-type rules call each other; split up, each piece would need the others.

The result is generated from the tool's ``response_schema`` (or, without one,
from a default schema that confirms the call and echoes its arguments):

- fields named like an argument carry the argument's value;
- strings follow the field's name and format (ids that look like real ids,
  ISO dates, e-mails, URLs, titles and text built from the search words);
- numbers fall in plausible ranges for their name (prices, ratings, counts,
  coordinates, temperatures) within the schema's bounds;
- the state wins: the call's ``subject`` overlays its known field values, and
  the ``related`` entities lead every listing whose items they fit.

Randomness comes from the session's ``variant``, the tool name and the
arguments only (not from the rest of the state), so a listing keeps the same
invented items as the session's state grows around it.

``finish`` runs the same conformance and state overlay on an answer from an LLM
backend, so the emulator's guarantees (schema-valid, reads see writes) hold
whichever backend answered.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Any

from arena.hashing import content_hash
from synthesis.sft.roles.emulation import (
    NATURAL_KEYS,
    QUERY_ARGS,
    STATUS_AFTER,
    EmulationInput,
    EntityView,
    is_key_field,
    kind_of_key,
    name_tokens,
    noun_of,
    singular,
    verb_of,
)

MAX_DEPTH = 6
"""Deeper schema levels are answered minimally (no real tool nests that far)."""
MAX_ITEMS = 10
NOW = datetime(2025, 6, 2, 9, 30)
"""The emulated world's clock: results are reproducible, so no wall-clock time."""
LIMIT_ARGS = ("limit", "max_results", "top_k", "page_size", "per_page", "num_results", "count", "n")
_MONEY = frozenset(
    "amount price total value cost principal subtotal balance payment fee npv refund charge".split()
)
TOTAL_FIELDS = frozenset(
    "total total_count count total_results num_results results_count result_count".split()
)
_TOPIC_ARGS = (
    *sorted(QUERY_ARGS),
    "city",
    "location",
    "destination",
    "name",
    "title",
    "category",
    "cuisine",
    "genre",
    "topic",
    "subject",
    "author",
)
_PLACES = frozenset(
    "hotel restaurant venue shop store cafe bar museum park station airport gym clinic branch place "
    "location property office theater cinema hospital school library".split()
)
_ADJECTIVES = ("Grand", "Central", "Riverside", "Golden", "Old Town", "Royal", "Green", "Harbor", "Little")
_TITLE_WORDS = ("overview", "plan", "notes", "checklist", "summary", "draft", "guide", "report")
_PRODUCT_WORDS = ("Pro", "Lite", "Classic", "Max", "Mini", "Plus")
_PEOPLE = ("Alex Martin", "Dana Lee", "Sam Patel", "Maria Rossi", "Jonas Weber", "Aiko Tanaka", "Lena Novak")
_CITIES = ("Lyon", "Porto", "Ghent", "Bologna", "Kraków", "Valencia", "Utrecht", "Tallinn")
_STREETS = ("Rue Mercière", "Harbour Road", "Via Zamboni", "Main Street", "Kanaalstraat", "Calle Mayor")
_FILLERS = (
    "details confirmed and up to date",
    "reviewed last week, nothing pending",
    "follow up with the team on Friday",
    "see the linked documents for the full record",
    "last changed after the latest update",
)
_CATEGORIES = ("general", "featured", "work", "personal", "standard", "archive")
_TEXT_WORDS = frozenset(
    "description content body text summary snippet message notes note instructions details comment "
    "review bio excerpt answer reason explanation".split()
)


# ---------------------------------------------------------------------------------------------
# Public API


def finish(result: Any, inputs: EmulationInput) -> Any:
    """Make any backend's answer valid for the tool's schema and consistent with the session's state."""
    return Generator(inputs).finish(result)


def effective_schema(inputs: EmulationInput) -> dict[str, Any]:
    """The tool's response schema, or the default one (confirmation + echoed arguments)."""
    return Generator(inputs).schema


def fits(value: Any, schema: Any) -> bool:
    """Whether ``value`` satisfies the structural part of ``schema`` (types, enums, bounds, required)."""
    if not isinstance(schema, dict) or not schema:
        return True
    for combo in ("anyOf", "oneOf"):
        if isinstance(schema.get(combo), list) and schema[combo]:
            if not any(fits(value, s) for s in schema[combo]):
                return False
    if isinstance(schema.get("allOf"), list) and not all(fits(value, s) for s in schema["allOf"]):
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if isinstance(schema.get("enum"), list) and value not in schema["enum"]:
        return False
    types = _types(schema)
    if types and not any(_fits_type(value, t, schema) for t in types):
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Schema helpers


def _types(schema: dict[str, Any]) -> list[str]:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list):
        return [t for t in declared if isinstance(t, str)]
    return []


def _fits_type(value: Any, kind: str, schema: dict[str, Any]) -> bool:
    checks: dict[str, Callable[[], bool]] = {
        "null": lambda: value is None,
        "boolean": lambda: isinstance(value, bool),
        "integer": lambda: (
            isinstance(value, int) and not isinstance(value, bool) and _in_bounds(value, schema)
        ),
        "number": lambda: (
            isinstance(value, int | float) and not isinstance(value, bool) and _in_bounds(value, schema)
        ),
        "string": lambda: isinstance(value, str) and _length_ok(value, schema),
        "array": lambda: isinstance(value, list) and _array_ok(value, schema),
        "object": lambda: isinstance(value, dict) and _object_ok(value, schema),
    }
    check = checks.get(kind)
    return check() if check else True


def _in_bounds(value: float, schema: dict[str, Any]) -> bool:
    lo, hi = _bound(schema, "minimum"), _bound(schema, "maximum")
    xlo, xhi = _bound(schema, "exclusiveMinimum"), _bound(schema, "exclusiveMaximum")
    return not (
        (lo is not None and value < lo)
        or (hi is not None and value > hi)
        or (xlo is not None and value <= xlo)
        or (xhi is not None and value >= xhi)
    )


def _bound(schema: dict[str, Any], key: str) -> float | None:
    """A numeric schema keyword (bounds, lengths, item counts), or None when absent or not a number."""
    x = schema.get(key)
    return x if isinstance(x, int | float) and not isinstance(x, bool) else None


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _length_ok(value: str, schema: dict[str, Any]) -> bool:
    lo, hi = schema.get("minLength"), schema.get("maxLength")
    return not ((isinstance(lo, int) and len(value) < lo) or (isinstance(hi, int) and len(value) > hi))


def _array_ok(value: list[Any], schema: dict[str, Any]) -> bool:
    lo, hi = schema.get("minItems"), schema.get("maxItems")
    if (isinstance(lo, int) and len(value) < lo) or (isinstance(hi, int) and len(value) > hi):
        return False
    items = schema.get("items")
    return not isinstance(items, dict) or all(fits(v, items) for v in value)


def _object_ok(value: dict[str, Any], schema: dict[str, Any]) -> bool:
    props = _props(schema)
    required = _required(schema)
    if any(r not in value for r in required):
        return False
    if schema.get("additionalProperties") is False and any(k not in props for k in value):
        return False
    return all(fits(v, props[k]) for k, v in value.items() if k in props)


def _required(schema: dict[str, Any]) -> list[str]:
    required = schema.get("required")
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


def _props(schema: dict[str, Any]) -> dict[str, Any]:
    props = schema.get("properties")
    return props if isinstance(props, dict) else {}


def _branch(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema to generate from: the first non-null branch of anyOf/oneOf, merged allOf parts."""
    for combo in ("anyOf", "oneOf"):
        options = schema.get(combo)
        if isinstance(options, list) and options:
            picked = next((s for s in options if isinstance(s, dict) and _types(s) != ["null"]), options[0])
            rest = {k: v for k, v in schema.items() if k not in (combo, "default")}
            return _branch({**rest, **picked}) if isinstance(picked, dict) else rest
    parts = schema.get("allOf")
    if isinstance(parts, list) and parts:
        merged: dict[str, Any] = {k: v for k, v in schema.items() if k != "allOf"}
        for part in parts:
            if isinstance(part, dict):
                part = _branch(part)
                merged["properties"] = {**_props(merged), **_props(part)}
                merged["required"] = [*merged.get("required", []), *part.get("required", [])]
                merged.update({k: v for k, v in part.items() if k not in ("properties", "required")})
        return merged
    return schema


def _main_type(schema: dict[str, Any]) -> str:
    types = [t for t in _types(schema) if t != "null"]
    if types:
        return types[0]
    if "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        first = schema["enum"][0]
        return {bool: "boolean", int: "integer", float: "number"}.get(type(first), "string")
    return "null" if _types(schema) == ["null"] else "string"


def _humanize(name: str) -> str:
    return " ".join(name_tokens(name)) or "value"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "item"


# ---------------------------------------------------------------------------------------------
# Generator


class Generator:
    """Generates and repairs one call's result; all choices come from one seeded RNG."""

    def __init__(self, inputs: EmulationInput) -> None:
        self.inputs = inputs
        self.args = inputs.arguments
        self.tool = inputs.tool.function.name
        self.noun = noun_of(self.tool)
        self.verb = verb_of(self.tool)
        seed = content_hash({"variant": inputs.variant, "tool": self.tool, "arguments": self.args})
        self.rng = random.Random(seed)
        self.offset = self.rng.randint(0, 99)
        """Start of this call's walk through the word lists (item i takes word offset + i: no repeats)."""
        self.topic = self._topic()
        self.base_date = self._base_date()
        self.schema = inputs.tool.response_schema or self._default_schema()

    # -- context ---------------------------------------------------------------------------

    def _topic(self) -> str | None:
        """The argument text results should talk about (search words, a city, a name)."""
        for name in _TOPIC_ARGS:
            value = self.args.get(name)
            if isinstance(value, str) and value.strip():
                return value.strip()
        for name, value in self.args.items():
            if isinstance(value, str) and value.strip() and not is_key_field(name) and len(value) <= 40:
                if "path" in name or "/" in value:
                    return value.rstrip("/").rsplit("/", 1)[-1] or None
                if not re.fullmatch(r"[\d\-:T.Z+]+", value):
                    return value.strip()
        return None

    def _base_date(self) -> date:
        """The first date of the call's arguments, else a day soon after the emulated "now"."""
        for value in self.args.values():
            if isinstance(value, str) and re.match(r"^\d{4}-\d{2}-\d{2}", value):
                try:
                    return date.fromisoformat(value[:10])
                except ValueError:
                    continue
        return NOW.date() + timedelta(days=self.rng.randint(1, 20))

    def _default_schema(self) -> dict[str, Any]:
        """Without a documented output: confirm the call, echo the arguments, add what a caller needs."""
        params = _props(self.inputs.tool.function.parameters)
        echoed = {k: v for k, v in params.items() if k in self.args and isinstance(v, dict)}
        keys = [k for k in self.args if is_key_field(k)]
        op = self.inputs.operation
        props: dict[str, Any]
        if op == "create":
            new_key = f"{self.noun}_id" if f"{self.noun}_id" not in self.args else "id"
            props = {new_key: {"type": "string"}, **echoed, "status": {"type": "string"}}
            props["created_at"] = {"type": "string", "format": "date-time"}
        elif op == "update":
            props = {
                **echoed,
                "status": {"type": "string"},
                "updated_at": {"type": "string", "format": "date-time"},
            }
        elif op == "delete":
            props = {**echoed, "deleted": {"type": "boolean"}}
        elif self.verb in ("list", "search", "find", "query", "browse", "filter", "lookup") or not keys:
            item = {
                "type": "object",
                "properties": {
                    f"{self.noun}_id": {"type": "string"},
                    "name": {"type": "string"},
                    "description": {"type": "string"},
                },
                "required": [f"{self.noun}_id", "name"],
            }
            props = {**echoed, "results": {"type": "array", "items": item}, "total": {"type": "integer"}}
        else:
            props = {**echoed, "name": {"type": "string"}, "description": {"type": "string"}}
            props["updated_at"] = {"type": "string", "format": "date-time"}
        return {"type": "object", "properties": props, "required": list(props)}

    # -- generation ------------------------------------------------------------------------

    def value(
        self,
        schema: Any,
        name: str = "",
        index: int = 0,
        depth: int = 0,
        kind: str | None = None,
        echo: bool = True,
        item: bool = False,
    ) -> Any:
        """A value for ``schema`` filling field ``name`` (item ``index`` of an array).

        With ``echo`` a field named like an argument takes the argument's value;
        ``item`` marks an element of an array.
        """
        if not isinstance(schema, dict):
            schema = {}
        schema = _branch(schema)
        if echo and name and name in self.args and fits(self.args[name], schema):
            return copy.deepcopy(self.args[name])
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self._enum(schema["enum"], name)
        kind = kind or self.noun
        match _main_type(schema):
            case "object":
                return self._object(schema, index, depth, kind, item) if depth < MAX_DEPTH else {}
            case "array":
                return self._array(schema, name, depth, kind) if depth < MAX_DEPTH else []
            case "integer":
                return self._integer(name, schema, index, kind)
            case "number":
                return self._number(name, schema)
            case "boolean":
                return self._boolean(name)
            case "null":
                return None
            case _:
                return self._string(name, schema, index, kind)

    def _enum(self, options: list[Any], name: str) -> Any:
        if name in ("status", "state") and self.inputs.operation != "read":
            wanted = STATUS_AFTER.get(self.verb) or {"create": "confirmed", "delete": "deleted"}.get(
                self.inputs.operation
            )
            if wanted in options:
                return wanted
        return self.rng.choice(options)

    def _object(
        self, schema: dict[str, Any], index: int, depth: int, kind: str, item: bool = False
    ) -> dict[str, Any]:
        props = _props(schema)
        required = set(_required(schema))
        out: dict[str, Any] = {}
        for field, sub in props.items():
            # Top-level fields are all answered; nested optional ones now and then stay out, as in real APIs.
            essential = depth == 0 or field in required or field in self.args or is_key_field(field)
            if essential or set(name_tokens(field)) & {"name", "title", "date"} or self.rng.random() < 0.85:
                # A listed item's natural key (path, sku) is its own, never the listing's argument.
                echo = not (item and field.lower() in NATURAL_KEYS)
                out[field] = self.value(sub, field, index, depth + 1, kind, echo=echo)
        return out

    def _array(self, schema: dict[str, Any], name: str, depth: int, kind: str) -> list[Any]:
        items = _branch(schema.get("items") or {}) if isinstance(schema.get("items"), dict) else {}
        n = self._count(schema, name, items)
        item_kind = singular(name) if name and name not in ("results", "items", "data") else kind
        out: list[Any] = []
        hint = self.args.get(singular(name)) if name else None
        if hint is not None and fits(hint, items) and n > 0:
            out.append(copy.deepcopy(hint))  # e.g. tags of a search filtered by tag contain that tag
        for _ in range(3 * n):  # scalar items may repeat: a few extra draws to reach n distinct ones
            if len(out) >= n:
                break
            value = self.value(items, singular(name), len(out), depth + 1, item_kind, echo=False, item=True)
            if value in out and not isinstance(value, dict):
                continue
            out.append(value)
        return out

    def _count(self, schema: dict[str, Any], name: str, items: dict[str, Any]) -> int:
        same = self.args.get(name)
        if isinstance(same, int) and not isinstance(same, bool) and same > 0:
            n = same  # e.g. days=5 -> five forecast days
        elif _main_type(items) == "object":
            n = self.rng.randint(2, 4)
        else:
            n = self.rng.randint(1, 3)
        for arg in LIMIT_ARGS:
            limit = self.args.get(arg)
            if isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0:
                n = min(n, limit)
        lo = int(_bound(schema, "minItems") or 0)
        hi = int(_bound(schema, "maxItems") or MAX_ITEMS)
        return max(lo, min(n, hi, MAX_ITEMS))

    def _boolean(self, name: str) -> bool:
        tokens = set(name_tokens(name))
        if "deleted" in tokens or "removed" in tokens:
            return self.inputs.operation == "delete"
        if tokens & {
            "success",
            "ok",
            "available",
            "confirmed",
            "valid",
            "exists",
            "open",
            "enabled",
            "active",
        }:
            return self.rng.random() < 0.85
        if tokens & {"more", "truncated", "error", "failed", "hidden"}:
            return False
        return self.rng.random() < 0.5

    # -- numbers ---------------------------------------------------------------------------

    def _integer(self, name: str, schema: dict[str, Any], index: int, kind: str) -> int:
        if is_key_field(name):
            return self.rng.randint(10_000, 999_999)
        return round(self._clamp(self._magnitude(name, integer=True), schema, integer=True))

    def _number(self, name: str, schema: dict[str, Any]) -> float:
        return float(self._clamp(self._magnitude(name, integer=False), schema, integer=False))

    def _clamp(self, x: float, schema: dict[str, Any], integer: bool) -> float:
        step = 1 if integer else 0.01
        lo, xlo = _bound(schema, "minimum"), _bound(schema, "exclusiveMinimum")
        hi, xhi = _bound(schema, "maximum"), _bound(schema, "exclusiveMaximum")
        if lo is not None:
            x = max(x, lo)
        elif xlo is not None and x <= xlo:
            x = xlo + step
        if hi is not None:
            x = min(x, hi)
        elif xhi is not None and x >= xhi:
            x = xhi - step
        return x

    def _related_number(self, tokens: set[str]) -> float | None:
        """A numeric argument this field derives from (``converted_amount`` from ``amount``, money from money)."""
        for arg, value in self.args.items():
            if not _num(value):
                continue
            arg_tokens = set(name_tokens(arg)) - {"max", "min"}
            if arg_tokens & tokens or (tokens & _MONEY and arg_tokens & _MONEY):
                return float(value)
        return None

    def _magnitude(self, name: str, integer: bool) -> float:
        tokens = set(name_tokens(name))
        r = self.rng
        related = self._related_number(tokens)
        if tokens & {"latitude", "lat"}:
            return round(r.uniform(-45, 65), 4)
        if tokens & {"longitude", "lon", "lng"}:
            return round(r.uniform(-120, 150), 4)
        if related is not None and tokens & _MONEY:
            capped = any(a.startswith("max") for a in self.args)
            low, high = (0.05, 0.4) if "interest" in tokens else (0.4, 0.95) if capped else (0.8, 1.3)
            base = related * r.uniform(low, high)
            return round(base) if integer else round(base, 2)
        if integer and tokens & {"probability", "chance"}:
            return r.randint(0, 100)
        ranges: list[tuple[set[str], tuple[float, float], int]] = [
            ({"rating", "stars"}, (3.2, 4.9), 1),
            ({"score", "relevance", "confidence", "probability"}, (0.55, 0.99), 2),
            (
                {"rate", "irr", "yield"},
                (0.01, 0.12) if tokens & {"annual", "interest", "irr"} else (0.6, 1.4),
                4,
            ),
            ({"temperature", "high", "low", "feels", "temp"}, (-2, 31), 1),
            ({"humidity", "percent", "percentage", "pct", "cloud"}, (20, 95), 0),
            ({"wind", "speed"}, (2, 35), 1),
            ({"aqi", "index"}, (15, 160), 0),
            (
                {"price", "amount", "cost", "fee", "subtotal", "total", "balance", "value", "payment", "npv"},
                (8, 480),
                2,
            ),
            ({"year"}, (1950, 2025), 0),
            ({"pages"}, (90, 850), 0),
            ({"size", "bytes"}, (512, 480_000), 0),
            ({"age"}, (18, 80), 0),
            ({"minutes", "duration", "seconds"}, (5, 180), 0),
            ({"days", "nights"}, (1, 14), 0),
            ({"quantity", "copies", "stock", "seats", "guests", "capacity"}, (1, 12), 0),
            ({"count", "total", "num", "items", "results", "remaining", "available"}, (0, 40), 0),
        ]
        for keys, (lo, hi), digits in ranges:
            if tokens & keys:
                x = r.uniform(lo, hi)
                return round(x) if integer or digits == 0 else round(x, digits)
        if related is not None:
            return round(related) if integer else round(related, 2)
        return r.randint(1, 100) if integer else round(r.uniform(1, 1000), 2)

    # -- strings ---------------------------------------------------------------------------

    def _string(self, name: str, schema: dict[str, Any], index: int, kind: str) -> str:
        text = self._string_for(name, schema, index, kind)
        lo, hi = schema.get("minLength"), schema.get("maxLength")
        if isinstance(hi, int) and len(text) > hi:
            text = text[:hi]
        if isinstance(lo, int) and len(text) < lo:
            text = text + "x" * (lo - len(text))
        return text

    def _string_for(self, name: str, schema: dict[str, Any], index: int, kind: str) -> str:
        tokens = name_tokens(name)
        last = tokens[-1] if tokens else ""
        fmt = str(schema.get("format", ""))
        desc = str(schema.get("description", "")).lower()
        r = self.rng
        if fmt == "date" or last in ("date", "day", "dob") or "yyyy-mm-dd" in desc:
            return (self.base_date + timedelta(days=index)).isoformat()
        if fmt == "date-time" or last in ("at", "timestamp", "datetime") or "iso 8601" in desc:
            return self._moment(tokens)
        if fmt == "time" or "hh:mm" in desc or last == "time":
            minutes = 11 * 60 + 30 * (index + r.randint(0, 6))
            return f"{minutes // 60 % 24:02d}:{minutes % 60:02d}"
        if fmt == "email" or "email" in tokens:
            person = self._person(index)
            return f"{_slug(person).replace('-', '.')}@example.com"
        if fmt in ("uri", "url") or last in ("url", "uri", "link", "href", "website"):
            return f"https://{self.noun}s.example.com/{_slug(self.topic or kind)}-{index + 1}"
        if is_key_field(name):
            return self._key(name, kind, index)
        if "currency" in tokens:
            return self._currency(tokens)
        if last in ("status", "state"):
            return self._status()
        if tokens and tokens[0] in (
            "guest",
            "customer",
            "patron",
            "user",
            "author",
            "owner",
            "contact",
            "host",
        ):
            return self._person(index)
        if last in ("name", "title", "label", "headline"):
            if set(tokens) & {"location", "place", "city"} and self.topic:
                return f"{self.topic}, {r.choice(('France', 'Portugal', 'Belgium', 'Italy'))}"
            return self._title(kind, index)
        if set(tokens) & _TEXT_WORDS:
            return self._sentence(name, kind, index)
        if set(tokens) & {"city", "location", "place", "destination", "origin", "region", "area", "town"}:
            return self.topic if self.topic and self.topic[0].isupper() else r.choice(_CITIES)
        if "country" in tokens:
            return (
                r.choice(("FR", "PT", "BE", "IT")) if "code" in tokens else r.choice(("France", "Portugal"))
            )
        if "address" in tokens:
            return f"{r.randint(2, 180)} {r.choice(_STREETS)}, {self.topic or r.choice(_CITIES)}"
        if set(tokens) & {"phone", "mobile", "tel"}:
            return f"+1-555-01{r.randint(10, 99)}"
        if set(tokens) & {"language", "lang", "locale"}:
            return "en"
        if set(tokens) & {"timezone", "tz"}:
            return r.choice(("Europe/Paris", "Europe/Lisbon", "America/New_York"))
        if set(tokens) & {"path", "file", "filename", "directory", "dir", "folder"}:
            root = next((v for k, v in self.args.items() if isinstance(v, str) and "/" in v), "/data")
            return f"{root.rstrip('/')}/{_slug(self.topic or kind)}_{index + 1}.txt"
        if set(tokens) & {"symbol", "ticker"}:
            return (self.topic or "ACME").upper()[:5]
        if set(tokens) & {"tracking", "confirmation", "reference", "code", "number"}:
            return "".join(r.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(10))
        if "version" in tokens:
            return f"{r.randint(1, 4)}.{r.randint(0, 9)}.{r.randint(0, 20)}"
        if set(tokens) & {"category", "type", "kind", "genre", "cuisine", "tag", "label"}:
            return (self.topic or self._pick(_CATEGORIES, index)).lower()
        if set(tokens) & {"unit", "units"}:
            return "metric"
        if set(tokens) & {"conditions", "condition", "weather", "sky", "forecast"}:
            return r.choice(("clear", "partly cloudy", "light rain", "overcast", "sunny intervals"))
        if "pollutant" in tokens:
            return r.choice(("pm2.5", "o3", "no2", "pm10"))
        if last in ("from", "until", "opens", "closes", "open", "close") or "hours" in tokens:
            return f"{r.randint(7, 16):02d}:00"
        about = f" for {self.topic}" if self.topic else ""
        return f"{_humanize(name).capitalize()}{about}"

    def _moment(self, tokens: list[str]) -> str:
        """Creation/update times are "now" in the emulated world; other times lie before it."""
        if self.inputs.operation in ("create", "update") and set(tokens) & {"created", "updated", "modified"}:
            moment = NOW + timedelta(minutes=self.rng.randint(0, 5))
        elif set(tokens) & {"updated", "modified"} and (created := self._created_time()):
            return created  # never changed since it was created in this session
        else:
            moment = NOW - timedelta(days=self.rng.randint(1, 90), minutes=self.rng.randint(0, 1400))
        return moment.replace(microsecond=0).isoformat() + "Z"

    def _created_time(self) -> str | None:
        subject = self.inputs.subject
        for field, value in (subject.fields if subject is not None else {}).items():
            if "created" in name_tokens(field) and isinstance(value, str):
                return value
        return None

    def _key(self, name: str, kind: str, index: int) -> str:
        key_kind = kind_of_key(name, kind)
        if key_kind == "path":
            root = next((v for v in self.args.values() if isinstance(v, str) and "/" in v), "/data")
            return f"{root.rstrip('/')}/{_slug(self.topic or self.noun)}_{index + 1}.txt"
        if key_kind in ("symbol", "ticker"):
            return (self.topic or "ACME").upper()[:4] + ("" if index == 0 else str(index))
        if key_kind == "isbn":
            return "978" + "".join(str(self.rng.randint(0, 9)) for _ in range(10))
        if key_kind in ("sku", "slug", "username"):
            return f"{_slug(self.topic or self.noun)}-{self.rng.randint(100, 999)}"
        prefix = key_kind if len(key_kind) <= 8 else key_kind[:4]
        return f"{prefix}_{self.rng.getrandbits(32):08x}"

    def _currency(self, tokens: list[str]) -> str:
        for arg, value in self.args.items():
            arg_tokens = name_tokens(arg)
            if (
                "currency" in arg_tokens
                and isinstance(value, str)
                and set(arg_tokens) & set(tokens) - {"currency"}
            ):
                return value
        for arg, value in self.args.items():
            if "currency" in name_tokens(arg) and isinstance(value, str):
                return value
        return "EUR"

    def _status(self) -> str:
        op = self.inputs.operation
        if op == "update":
            return STATUS_AFTER.get(self.verb, "updated")
        if op == "delete":
            return "deleted"
        if op == "create":
            return (
                "confirmed"
                if self.verb in ("book", "reserve", "order", "place", "checkout", "schedule")
                else "created"
            )
        return self.rng.choice(("active", "open", "available"))

    def _person(self, index: int) -> str:
        for arg, value in self.args.items():
            if isinstance(value, str) and ("name" in name_tokens(arg) or arg in ("guest", "customer")):
                if index == 0 and " " in value.strip():
                    return value.strip()
        return self._pick(_PEOPLE, index)

    def _pick(self, words: tuple[str, ...], index: int) -> str:
        return words[(self.offset + index) % len(words)]

    def _title(self, kind: str, index: int) -> str:
        topic = self.topic
        word = kind.replace("_", " ")
        if kind in _PLACES:
            adjective = self._pick(_ADJECTIVES, index)
            middle = f"{topic} " if topic and topic[0].isupper() else ""
            return f"{adjective} {middle}{word.title()}"
        if kind in ("product", "item", "article", "dish"):
            base = topic or word
            return f"{base.title()} {self._pick(_PRODUCT_WORDS, index)}"
        base = topic or word
        return f"{base[:1].upper()}{base[1:]} {self._pick(_TITLE_WORDS, index)}"

    def _sentence(self, name: str, kind: str, index: int) -> str:
        filler = self._pick(_FILLERS, index)
        subject = self.topic or kind.replace("_", " ")
        if "snippet" in name or "excerpt" in name:
            return f"…{subject} — {filler}…"
        keys = ", ".join(
            f"{k} {v}" for k, v in self.args.items() if is_key_field(k) and isinstance(v, str | int)
        )
        about = f" ({keys})" if keys else ""
        return f"{subject[:1].upper()}{subject[1:]}{about}: {filler}."

    # -- repair and state ------------------------------------------------------------------

    def finish(self, result: Any) -> Any:
        """Conform ``result`` to the schema, then let the session's state win."""
        value = self.conform(result, self.schema)
        return self.apply_state(value)

    def conform(
        self, value: Any, schema: Any, name: str = "", depth: int = 0, kind: str | None = None
    ) -> Any:
        """``value`` repaired to fit ``schema``: missing required fields and misfits are generated anew."""
        if not isinstance(schema, dict) or not schema or fits(value, schema):
            return value
        schema = _branch(schema)
        main = _main_type(schema)
        if "enum" in schema or "const" in schema or depth >= MAX_DEPTH:
            return self.value(schema, name, 0, depth, kind)
        if main == "object" and isinstance(value, dict):
            props = _props(schema)
            out = {
                k: self.conform(v, props[k], k, depth + 1, kind) if k in props else v
                for k, v in value.items()
                if k in props or schema.get("additionalProperties") is not False
            }
            for req in _required(schema):
                if req not in out:
                    out[req] = self.value(props.get(req, {}), req, 0, depth + 1, kind)
            return out
        if main == "array" and isinstance(value, list):
            items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
            fixed = [self.conform(v, items, singular(name), depth + 1, kind) for v in value]
            hi = schema.get("maxItems")
            fixed = fixed[:hi] if isinstance(hi, int) else fixed
            while isinstance(schema.get("minItems"), int) and len(fixed) < schema["minItems"]:
                fixed.append(self.value(items, singular(name), len(fixed), depth + 1, kind))
            return fixed
        coerced = _coerce(value, main)
        return coerced if fits(coerced, schema) else self.value(schema, name, 0, depth, kind)

    def apply_state(self, value: Any) -> Any:
        """Overlay the subject's known fields; put related entities first in the listings they fit."""
        subject, related = self.inputs.subject, self.inputs.related
        schema = _branch(self.schema)
        if subject is not None and isinstance(value, dict):
            target, target_schema = value, schema
            nested = value.get(subject.kind)
            if isinstance(nested, dict):
                target, target_schema = nested, _branch(_props(schema).get(subject.kind) or {})
            overlay(target, target_schema, subject)
        if related and isinstance(value, dict):
            for container, field, items_schema in _listings(value, schema):
                self._merge_listing(container, field, items_schema, related)
        return value

    def _merge_listing(
        self, container: dict[str, Any], field: str, items: dict[str, Any], related: list[EntityView]
    ) -> None:
        props = _props(items)
        fitting = [e for e in related if e.key_field in props and not e.deleted]
        if not fitting:
            return
        known = []
        for i, entity in enumerate(fitting):
            item = self.value(items, singular(field), i, 1, entity.kind, echo=False, item=True)
            if isinstance(item, dict):
                overlay(item, items, entity)
                known.append(item)
        keys = {str(e.key) for e in fitting}
        current = container.get(field)
        current = current if isinstance(current, list) else []
        invented = [
            it for it in current if not (isinstance(it, dict) and str(it.get(fitting[0].key_field)) in keys)
        ]
        merged = known + invented
        limit = next(
            (v for a in LIMIT_ARGS if isinstance(v := self.args.get(a), int) and not isinstance(v, bool)),
            None,
        )
        container[field] = merged[:limit] if isinstance(limit, int) and limit > 0 else merged
        for total in TOTAL_FIELDS & container.keys():
            if isinstance(container[total], int) and not isinstance(container[total], bool):
                container[total] = max(container[total], len(container[field]))


def overlay(target: dict[str, Any], schema: dict[str, Any], entity: EntityView) -> None:
    """Copy the entity's known fields (and key) into ``target`` wherever the schema allows them."""
    props = _props(schema)
    open_schema = not props and schema.get("additionalProperties") is not False
    for field, value in entity.fields.items():
        if (field in props and fits(value, props[field])) or (open_schema and field in target):
            target[field] = copy.deepcopy(value)
    key_schema = props.get(entity.key_field)
    if key_schema is not None or (open_schema and entity.key_field in target):
        key: Any = entity.key
        if key_schema is not None and _main_type(_branch(key_schema)) == "integer" and str(key).isdigit():
            key = int(key)
        if key_schema is None or fits(key, key_schema):
            target[entity.key_field] = key


def _listings(
    value: dict[str, Any], schema: dict[str, Any]
) -> list[tuple[dict[str, Any], str, dict[str, Any]]]:
    """(container, field, item schema) of every array of objects at the top or one level down."""
    found: list[tuple[dict[str, Any], str, dict[str, Any]]] = []
    for field, sub in _props(schema).items():
        sub = _branch(sub) if isinstance(sub, dict) else {}
        items = sub.get("items")
        if _main_type(sub) == "array" and isinstance(items, dict) and _main_type(_branch(items)) == "object":
            found.append((value, field, _branch(items)))
        elif _main_type(sub) == "object" and isinstance(value.get(field), dict):
            found.extend(_listings(value[field], sub))
    return found


def _coerce(value: Any, kind: str) -> Any:
    """Obvious type repairs of LLM output: numbers as strings and the like."""
    try:
        if kind == "integer" and isinstance(value, str | float) and not isinstance(value, bool):
            number = float(value)
            return int(number) if number.is_integer() else value
        if kind == "number" and isinstance(value, str):
            return float(value)
        if kind == "string" and isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        if kind == "boolean" and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    except ValueError:
        return value
    return value

"""The value generator: plausible, mutually consistent argument values for synthesised tasks.

``kind_of`` reads the semantic kind of an argument from its name, schema and
description (a date, a city, a person, an identifier, a query...);
``ValueBook`` draws one task's values for those kinds (the same check-in date
across tools, a city with its coordinates, identifiers shaped like the
documented example); ``user_knows`` tells which arguments a user can state.
The chain and task writers (``simulator.task_writer``, ``simulator.chains``,
``simulator.tasks``) state these values in task texts.
"""

from __future__ import annotations

import random
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from arena.records.tools import NormalizedTool
from simulator.text import content_words, name_words
from synthesis.envs.text import fold
from synthesis.sft.tool_links import Argument, entity_of, is_identifier, json_types, singular, snake

CITIES: tuple[tuple[str, float, float, str, str, str], ...] = (
    ("Lisbon", 38.7223, -9.1393, "PT", "1100-048", "Rua Augusta 120"),
    ("Lyon", 45.764, 4.8357, "FR", "69002", "12 Rue de la République"),
    ("Berlin", 52.52, 13.405, "DE", "10115", "Invalidenstraße 43"),
    ("Madrid", 40.4168, -3.7038, "ES", "28013", "Calle de Alcalá 21"),
    ("Toronto", 43.6532, -79.3832, "CA", "M5V 2T6", "220 King Street West"),
    ("Kyoto", 35.0116, 135.7681, "JP", "600-8216", "8 Higashishiokoji"),
    ("Edinburgh", 55.9533, -3.1883, "GB", "EH1 1YZ", "14 Princes Street"),
    ("Milan", 45.4642, 9.19, "IT", "20121", "Via Dante 7"),
    ("Austin", 30.2672, -97.7431, "US", "78701", "501 Congress Avenue"),
    ("Vienna", 48.2082, 16.3738, "AT", "1010", "Kärntner Straße 19"),
)
COUNTRY_NAMES = {
    "PT": "Portugal",
    "FR": "France",
    "DE": "Germany",
    "ES": "Spain",
    "CA": "Canada",
    "JP": "Japan",
    "GB": "United Kingdom",
    "IT": "Italy",
    "US": "United States",
    "AT": "Austria",
}
PEOPLE = (
    "Ana Silva",
    "Jonas Weber",
    "Priya Nair",
    "Marco Rossi",
    "Chloé Martin",
    "Kenji Sato",
    "Laura Gómez",
    "Tom Becker",
    "Amara Okafor",
    "Sofia Lindqvist",
)
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CHF", "CAD")
SYMBOLS = ("AAPL", "MSFT", "NVDA", "ASML", "SAP", "TSLA", "AMZN")
TITLES = (
    "Q3 planning",
    "Trip checklist",
    "Reading list",
    "Team offsite ideas",
    "Budget review",
    "Recipe drafts",
)
CONTENTS = (
    "Book the venue and confirm the catering by Friday.",
    "Pack the charger, passport and rain jacket.",
    "Ask Marco about the revised budget numbers.",
    "Try the lemon tart recipe with less sugar.",
    "Follow up with the supplier about delivery times.",
)
TAGS = ("work", "ideas", "travel", "finance", "personal", "urgent")
QUERIES: dict[str, tuple[str, ...]] = {
    "product": ("wireless headphones", "running shoes", "espresso machine", "desk lamp", "yoga mat"),
    "book": ("Dune", "The Left Hand of Darkness", "Project Hail Mary", "The Name of the Rose"),
    "note": ("budget", "offsite", "packing list", "supplier"),
    "song": ("Bohemian Rhapsody", "Clair de Lune", "Blue in Green"),
    "movie": ("Spirited Away", "Arrival", "Amélie"),
    "file": ("report", "invoice", "summary"),
    "recipe": ("lemon tart", "vegetable curry", "ramen"),
    "job": ("data engineer", "product designer", "nurse"),
}
GENERIC_QUERIES = ("quarterly report", "summer trip", "team budget", "weekly plan")
PHRASES = ("a quiet room on a high floor", "window seat if possible", "late arrival around 22:00")

_END_WORDS = frozenset(("end", "out", "to", "until", "departure", "return", "last", "checkout", "finish"))
_PEOPLE_WORDS = frozenset(
    ("guests", "guest", "people", "persons", "party", "adults", "travelers", "travellers")
)
_PERSON_WORDS = frozenset(
    "guest customer person user contact full first last passenger author owner recipient holder patient "
    "attendee traveler traveller".split()
)
_ID_PREFIX = {
    "booking": "BK",
    "order": "ORD",
    "reservation": "RSV",
    "cart": "CART",
    "hotel": "HTL",
    "room": "RM",
    "product": "PRD",
    "alert": "ALRT",
    "restaurant": "RST",
    "note": "NOTE",
    "user": "USR",
    "account": "ACC",
    "invoice": "INV",
    "ticket": "TCK",
}


def examples(description: str) -> list[str]:
    """Example values a description gives: ``City name, e.g. 'Lyon' or 'San Francisco'.``."""
    match = re.search(r"\b(?:e\.g\.|for example|such as|like)[,:]?\s*(.+)", description, re.I)
    if not match:
        return []
    found = re.findall(r"'([^']+)'|\"([^\"]+)\"", match.group(1))
    return [a or b for a, b in found if (a or b).strip()]


def enum_values(schema: dict[str, Any]) -> list[Any]:
    """Allowed values of an enum, also inside ``anyOf``/``oneOf`` (an optional enum is enum-or-null)."""
    values = [v for v in schema.get("enum") or [] if v is not None]
    for key in ("anyOf", "oneOf"):
        for alt in schema.get(key) or []:
            if isinstance(alt, dict):
                values += [v for v in alt.get("enum") or [] if v is not None and v not in values]
    return values


OWNER_ENTITIES = frozenset(
    "patron user customer member account client employee student passenger guest traveler traveller "
    "subscriber owner player patient card".split()
)


def user_owned(arg: Argument) -> bool:
    """An identifier the user holds themselves (a library card, a customer or account number).

    Identifiers of system objects (a hotel, a booking, a note) come from tool outputs;
    identifiers of the person asking are theirs to state.
    """
    desc = str(arg.schema.get("description") or "").lower()
    owned_words = ("card number", "account number", "membership number", "customer number", "your ")
    return entity_of(arg.name) in OWNER_ENTITIES or any(w in desc for w in owned_words)


def user_knows(arg: Argument) -> bool:
    """A value a user can state: anything but a system identifier."""
    return not is_identifier(arg.name, arg.schema) or user_owned(arg)


def kind_of(arg: Argument) -> str:
    """The semantic kind of an argument, from its name, schema and description."""
    n, s = snake(arg.name), arg.schema
    fmt, types = s.get("format"), json_types(s)
    desc = str(s.get("description") or "").lower()
    words = set(n.split("_"))
    if is_identifier(arg.name, s):
        return "identifier"
    if enum_values(s):
        return "enum"
    if "boolean" in types:
        return "boolean"
    if "object" in types:
        return "object"
    if "array" in types:
        return "array"
    if types & {"number", "integer"}:
        return _numeric_kind(n, words, desc, types)
    return _string_kind(n, words, desc, fmt)


def _numeric_kind(n: str, words: set[str], desc: str, types: set[str]) -> str:
    if words & {"latitude", "lat"}:
        return "latitude"
    if words & {"longitude", "lon", "lng"}:
        return "longitude"
    if words & _PEOPLE_WORDS or n == "party_size":
        return "people"
    if words & {"quantity", "qty", "count", "copies", "units"}:
        return "quantity"
    if "days" in words or "nights" in words:
        return "days"
    if "years" in words:
        return "years"
    if "months" in words:
        return "months"
    if words & {"limit", "top", "results", "size"} and "integer" in types:
        return "limit"
    if "rate" in words or "decimal" in desc or "percent" in desc:
        return "rate"
    money = {"amount", "principal", "price", "budget", "cost", "total", "balance", "salary", "income"}
    if words & money or "eur" in desc or "usd" in desc:
        return "money"
    return "integer" if "integer" in types else "number"


def _string_kind(n: str, words: set[str], desc: str, fmt: Any) -> str:
    if fmt == "date-time" or "date-time" in desc:
        return "datetime"
    dateish = fmt == "date" or "yyyy-mm-dd" in desc or words & {"date", "day", "arrival", "departure"}
    if dateish or n in ("check_in", "check_out", "checkin", "checkout"):
        return "date_end" if words & _END_WORDS else "date"
    rules: tuple[tuple[bool, str], ...] = (
        (fmt == "email" or "email" in words, "email"),
        ("phone" in words or "mobile" in words, "phone"),
        (fmt in ("uri", "url") or "url" in words, "url"),
        ("time" in words or "hh:mm" in desc, "time"),
        (bool(words & {"city", "town"}), "city"),
        ("country" in words and ("code" in words or "alpha-2" in desc or "iso" in desc), "country_code"),
        ("country" in words, "country"),
        ("currency" in words or "iso 4217" in desc, "currency"),
        (bool(words & {"symbol", "ticker"}), "symbol"),
        ("name" in words and bool(words & _PERSON_WORDS), "person"),
        (bool(words & {"title", "subject", "headline"}), "title"),
        (
            bool(words & {"content", "body", "text", "message", "comment", "requests", "notes", "reason"}),
            "content",
        ),
        (bool(words & {"tag", "label"}), "tag"),
        (bool(words & {"query", "q", "search", "keywords", "keyword", "term"}), "query"),
        (bool(words & {"root", "dir", "directory", "folder"}), "dir"),
        (bool(words & {"path", "file", "filename", "source", "destination"}) or "path" in desc, "path"),
        (bool(words & {"pattern", "glob"}), "pattern"),
        (bool(words & {"street", "address"}), "street"),
        (bool(words & {"postal", "zip", "postcode"}), "postal_code"),
        (bool(words & {"language", "locale", "lang"}), "language"),
    )
    return next((kind for hit, kind in rules if hit), "text")


def render(value: Any) -> str:
    """A JSON scalar as a user would write it."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)


SHARED_KINDS = frozenset(
    "identifier date date_end datetime time city country country_code person email phone people "
    "latitude longitude symbol street postal_code currency".split()
)
"""Kinds whose value is one fact of the scenario, the same wherever an argument of that name recurs."""


@dataclass
class ValueBook:
    """Plausible, mutually consistent argument values for one task.

    The same argument name gets the same value across the tools of a task (the
    check-in date of the search is the check-in date of the booking); dates of
    one task cluster around one anchor, cities carry their coordinates.
    """

    rng: random.Random
    values: dict[str, str] = field(default_factory=dict)
    city: tuple[str, float, float, str, str, str] | None = None
    person: str | None = None
    anchor: date | None = None
    used: dict[str, set[str]] = field(default_factory=dict)

    def value(self, arg: Argument, tool: NormalizedTool) -> str:
        """The task's value for ``arg``: shared by name for facts of the scenario (dates, city,
        guest, identifiers), fresh per tool for content (a note's text, a search query)."""
        kind = kind_of(arg)
        key = snake(arg.name) if kind in SHARED_KINDS else f"{tool.function.name}.{snake(arg.name)}"
        if key not in self.values:
            self.values[key] = self._make(arg, tool)
        return self.values[key]

    # -------------------------------------------------------------------------------- pieces

    def _pick(self, group: str, options: Sequence[str]) -> str:
        """A choice not yet used in this task for ``group`` (distinct currencies, names, ...)."""
        used = self.used.setdefault(group, set())
        fresh = [o for o in options if o not in used] or list(options)
        choice = self.rng.choice(fresh)
        used.add(choice)
        return choice

    def _city(self) -> tuple[str, float, float, str, str, str]:
        if self.city is None:
            self.city = self.rng.choice(CITIES)
        return self.city

    def _person(self) -> str:
        if self.person is None:
            self.person = self.rng.choice(PEOPLE)
        return self.person

    def _date(self, end: bool, history: bool) -> str:
        if self.anchor is None:
            base = date(2025, 2, 3) if history else date(2026, 3, 2)
            self.anchor = base + timedelta(days=self.rng.randint(0, 240))
        day = self.anchor + timedelta(days=self.rng.randint(2, 7) if end else 0)
        return day.isoformat()

    def _make(self, arg: Argument, tool: NormalizedTool) -> str:
        kind = kind_of(arg)
        maker = _MAKERS.get(kind)
        if maker is not None:
            return maker(self, arg, tool)
        return self._from_examples(arg) or self._text(arg, tool)

    def _from_examples(self, arg: Argument) -> str | None:
        found = examples(str(arg.schema.get("description") or ""))
        return self.rng.choice(found) if found else None

    def _text(self, arg: Argument, tool: NormalizedTool) -> str:
        if arg.schema.get("default") not in (None, ""):
            return render(arg.schema["default"])
        return self.rng.choice(("standard", "Atlas project", "blue", "weekly summary"))

    def number(self, arg: Argument, low: float, high: float, step: float = 1) -> float:
        lo = max(low, float(arg.schema.get("minimum", low)))
        hi = min(high, float(arg.schema.get("maximum", high)))
        if hi < lo:
            lo, hi = float(arg.schema.get("minimum", low)), float(arg.schema.get("maximum", high))
        steps = max(0, int((hi - lo) // step))
        return lo + step * self.rng.randint(0, steps)


def _num(book: ValueBook, arg: Argument, low: float, high: float, step: float = 1) -> str:
    return render(book.number(arg, low, high, step))


def _among(book: ValueBook, arg: Argument, choices: Sequence[float]) -> str:
    """A typical value (a 10-year term, a 0.045 rate) that the argument's bounds allow."""
    low, high = arg.schema.get("minimum"), arg.schema.get("maximum")
    fitting = [c for c in choices if (low is None or c >= low) and (high is None or c <= high)]
    if not fitting:
        return _num(book, arg, float(low if low is not None else 1), float(high if high is not None else 100))
    return render(book.rng.choice(fitting))


def _identifier(book: ValueBook, arg: Argument, _tool: NormalizedTool) -> str:
    if arg.schema.get("format") == "uuid" or snake(arg.name).endswith("uuid"):
        return str(uuid.UUID(int=book.rng.getrandbits(128), version=4))
    pattern = arg.schema.get("pattern")
    for example in examples(str(arg.schema.get("description") or "")):
        value = mimic(example, book.rng)  # same shape as the documented example: 'P10023' -> 'P48213'
        if not isinstance(pattern, str) or _fullmatch(pattern, value):
            return value
    if snake(arg.name).endswith("token"):
        return "tok_" + "".join(book.rng.choice("0123456789abcdef") for _ in range(16))
    entity = entity_of(arg.name) or "id"
    prefix = _ID_PREFIX.get(entity, entity[:3].upper())
    return f"{prefix}-{book.rng.randint(10000, 99999)}"


def mimic(example: str, rng: random.Random) -> str:
    """A new value shaped like ``example``: its leading letters kept, digits and hex letters redrawn."""
    head = re.match(r"[A-Za-z]*[_-]?", example)
    keep = head.group(0) if head else ""
    if keep == example:  # all letters: nothing to vary safely
        return example
    out = []
    for ch in example[len(keep) :]:
        if ch.isdigit():
            out.append(rng.choice("0123456789"))
        elif ch in "abcdef":
            out.append(rng.choice("0123456789abcdef"))
        elif ch.isalpha():
            out.append(
                rng.choice("abcdefghijklmnopqrstuvwxyz" if ch.islower() else "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
            )
        else:
            out.append(ch)
    return keep + "".join(out)


def _fullmatch(pattern: str, value: str) -> bool:
    try:
        return re.fullmatch(pattern, value) is not None
    except re.error:
        return True  # a pattern Python cannot read says nothing against the value


def _enum(book: ValueBook, arg: Argument, _tool: NormalizedTool) -> str:
    options = [render(v) for v in enum_values(arg.schema)]
    return book.rng.choice(options) if options else "default"


def _query(book: ValueBook, arg: Argument, tool: NormalizedTool) -> str:
    topics = [singular(w) for w in name_words(tool.function.name)] + content_words(tool.function.description)
    for topic in topics:
        if singular(topic) in QUERIES:
            return book.rng.choice(QUERIES[singular(topic)])
    return book._from_examples(arg) or book.rng.choice(GENERIC_QUERIES)


def _path(book: ValueBook, arg: Argument, tool: NormalizedTool) -> str:
    if set(name_words(tool.function.name)) & {"directory", "dir", "folder", "directories"}:
        return book._pick("dir", ("/workspace/reports", "/workspace/notes", "/workspace/data"))
    if snake(arg.name) in ("destination", "target", "dst", "new_path"):
        return book._pick("path", ("/workspace/archive/q3-summary.md", "/workspace/archive/notes-2025.txt"))
    return book._pick(
        "path", ("/workspace/reports/q3-summary.md", "/workspace/notes/todo.txt", "/workspace/data/sales.csv")
    )


def _array(book: ValueBook, arg: Argument, tool: NormalizedTool) -> str:
    items = _sub(arg.schema, "items")
    desc = str(arg.schema.get("description") or "")
    pair = re.search(r"\((\w+),\s*(\w+)\)", desc)
    if pair:  # "(symbol, shares) pairs"
        first = Argument(pair.group(1), {}, True)
        picks = [book._make(first, tool) for _ in range(2)]
        counts = [book.rng.choice((5, 10, 12, 25, 40)) for _ in picks]
        return ", ".join(f"{p} {c}" for p, c in zip(dict.fromkeys(picks), counts, strict=False))
    if enum_values(items):
        options = [render(v) for v in enum_values(items)]
        return ", ".join(book.rng.sample(options, min(2, len(options))))
    item_types = json_types(items)
    if item_types & {"number", "integer"}:
        if "negative" in desc or "investment" in desc:
            start = -book.rng.choice((5000, 10000, 20000))
            return ", ".join(str(v) for v in [start, *(book.rng.randint(2, 7) * 1000 for _ in range(3))])
        return ", ".join(str(book.rng.randint(1, 100)) for _ in range(3))
    item = Argument(singular(snake(arg.name)), items, True)
    made = {book._make(item, tool) for _ in range(3)}
    return ", ".join(sorted(made)[:2])


def _sub(schema: dict[str, Any], key: str) -> dict[str, Any]:
    value = schema.get(key)
    return value if isinstance(value, dict) else {}


def _object(book: ValueBook, arg: Argument, tool: NormalizedTool) -> str:
    props = _sub(arg.schema, "properties")
    required = set(arg.schema.get("required") or props)
    parts = [
        book._make(Argument(name, sub if isinstance(sub, dict) else {}, True), tool)
        for name, sub in props.items()
        if name in required
    ]
    return ", ".join(parts) if parts else book._text(arg, tool)


def _history(tool: NormalizedTool) -> bool:
    text = f"{tool.function.name} {tool.function.description[:300]}".lower()
    return "history" in text or "historical" in text or "past" in text


_MAKERS: dict[str, Callable[[ValueBook, Argument, NormalizedTool], str]] = {
    "identifier": _identifier,
    "enum": _enum,
    "boolean": lambda b, a, t: b.rng.choice(("yes", "no")),
    "object": _object,
    "array": _array,
    "latitude": lambda b, a, t: render(b._city()[1]),
    "longitude": lambda b, a, t: render(b._city()[2]),
    "people": lambda b, a, t: _num(b, a, 2, 6),
    "quantity": lambda b, a, t: _num(b, a, 1, 4),
    "days": lambda b, a, t: _num(b, a, 3, 7),
    "years": lambda b, a, t: _among(b, a, (5, 10, 15, 20)),
    "months": lambda b, a, t: _among(b, a, (12, 24, 36, 60, 240, 360)),
    "limit": lambda b, a, t: _among(b, a, (5, 10, 20)),
    "rate": lambda b, a, t: _among(b, a, (0.035, 0.045, 0.05, 0.07)),
    "money": lambda b, a, t: (
        _num(b, a, 50, 300, 10)
        if "max" in snake(a.name) or "price" in snake(a.name)
        else _among(b, a, (1500, 2500, 12000, 25000, 250000))
    ),
    "integer": lambda b, a, t: _num(b, a, 1, 10),
    "number": lambda b, a, t: _num(b, a, 1, 100),
    "datetime": lambda b, a, t: (
        f"{b._date(False, _history(t))}T{b.rng.choice(('09:30', '14:00', '18:45'))}:00Z"
    ),
    "date": lambda b, a, t: b._date(False, _history(t)),
    "date_end": lambda b, a, t: b._date(True, _history(t)),
    "time": lambda b, a, t: b.rng.choice(("19:30", "12:15", "08:00")),
    "email": lambda b, a, t: fold(b._person()).replace(" ", ".") + "@example.com",
    "phone": lambda b, a, t: f"+44 7700 900{b.rng.randint(100, 999)}",
    "url": lambda b, a, t: b.rng.choice(("https://example.org/menu", "https://example.com/report")),
    "city": lambda b, a, t: b._city()[0],
    "country_code": lambda b, a, t: b._city()[3],
    "country": lambda b, a, t: COUNTRY_NAMES[b._city()[3]],
    "currency": lambda b, a, t: b._pick("currency", CURRENCIES),
    "symbol": lambda b, a, t: b._pick("symbol", SYMBOLS),
    "person": lambda b, a, t: b._person(),
    "title": lambda b, a, t: b._pick("title", TITLES),
    "content": lambda b, a, t: b._pick("content", PHRASES if "request" in snake(a.name) else CONTENTS),
    "tag": lambda b, a, t: b._pick("tag", TAGS),
    "query": _query,
    "dir": lambda b, a, t: b._pick("dir", ("/workspace/reports", "/workspace/notes", "/workspace/data")),
    "path": _path,
    "pattern": lambda b, a, t: b._from_examples(a) or b.rng.choice(("*.md", "*.csv", "report-*.txt")),
    "street": lambda b, a, t: b._city()[5],
    "postal_code": lambda b, a, t: b._city()[4],
    "language": lambda b, a, t: b.rng.choice(("en", "de", "fr")),
}

"""Rules for the chain roles: chain synthesis, chain-conditioned tasks, coherence (ASTRA §2.1.2).

Everything here works from the role input alone (the server's tool schemas,
the chain, the task text) and the seeded ``random.Random``:

- chains grow along type-compatible output -> input links
  (``arena.tool_links``: an earlier tool's response field feeds a later
  tool's required argument, e.g. ``hotels[].hotel_id`` -> ``hotel_id``), starting
  from a tool whose required arguments a user can state;
- task texts come from templates over the schemas: each step is an imperative
  clause drawn from the tool's description, followed by phrases stating
  argument values generated from the argument schemas (enums, formats, ranges,
  examples in descriptions, name conventions). The user states the first
  tool's arguments and every later non-identifier argument that no earlier
  output provides; identifiers of later steps are left to earlier outputs.
  Stated values are returned as slots and occur verbatim in the text;
- coherence is judged from the task text and the chain's docs.

``simulator.tasks`` reuses the value generator and the task writer.
"""

from __future__ import annotations

import random
import re
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

from pydantic import BaseModel

from arena.lang import count_words, detect_language
from arena.llm.core import Undecidable
from arena.llm.roles.chains import (
    CHAIN_COHERENCE,
    CHAIN_SYNTHESIS,
    TASK_FROM_CHAIN,
    ChainSynthesisInput,
    ChainTaskInput,
    CoherenceInput,
    CoherenceVerdict,
    SynthesizedChain,
    TaskDraft,
)
from arena.records.sft import ServerRef, Slot
from arena.records.tools import NormalizedTool
from arena.tool_links import (
    Argument,
    arguments,
    entity_of,
    feeding_fields,
    is_identifier,
    json_types,
    output_fields,
    output_provider,
    required_arguments,
    singular,
    snake,
)

OPTIONAL_RATE = 0.3
"""Chance that the user also states a simple optional argument (an enum, a count, a limit)."""

# ============================================================================== words and terms

VERBS = frozenset(
    (
        "get fetch search find list create add update delete remove cancel reserve book check calculate "
        "compute convert read write move track geocode show send set post put upload download look lookup "
        "query retrieve checkout register subscribe rename copy translate summarize summarise generate run "
        "start stop schedule attach detach replace append estimate compare validate verify resolve "
        "place order open close count measure plan locate browse view edit modify insert transfer pay "
        "submit change tag mark assign approve reject share invite follow rate review reply archive restore "
        "enable disable export import sync scan print apply request notify"
    ).split()
)
STOPWORDS = frozenset(
    (
        "the a an and or of for to in on at by with from into onto this that these those it its their "
        "them they you your our my me we is are be was were been being has have had can could should "
        "would will may might must do does did done not no yes as than then there here when where which "
        "who whom what why how all any each every some such one two both more most other only also just "
        "very per via over under about after before again further once same so too use used using uses "
        "given optional optionally default returns return returned tool function endpoint api call "
        "identifier identifiers value values result results data information info new existing current "
        "get gets list lists show shows please"
    ).split()
)


def fold(text: str) -> str:
    """Lower case without accents (``Hôtel`` -> ``hotel``), for cross-language term matching."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def name_words(name: str) -> list[str]:
    """``searchHotels`` -> ``['search', 'hotels']``."""
    return [w for w in snake(name).split("_") if w]


def stem(word: str) -> str:
    """A crude, language-agnostic stem: folded, singular, cut to 5 letters."""
    return singular(fold(word))[:5]


def content_words(text: str) -> list[str]:
    """Words of ``text`` worth matching on (4+ letters, not stop words), folded."""
    return [w for w in re.findall(r"[^\W\d_]{4,}", fold(text)) if w not in STOPWORDS]


def text_stems(text: str) -> set[str]:
    return {stem(w) for w in re.findall(r"[^\W\d_]{3,}", fold(text))}


def sentences_of(description: str) -> list[str]:
    """Sentences of a tool description, without boilerplate ("Note that the function is in Python")."""
    parts = [p.strip() for p in re.split(r"(?<=[.!?])\s+|\n+", description.strip()) if p.strip()]
    return [p for p in parts if not re.match(r"note(?: that|:)", p, re.IGNORECASE)]


def first_sentences(description: str, count: int = 2) -> str:
    return " ".join(sentences_of(description)[:count])


def tool_terms(tool: NormalizedTool) -> set[str]:
    """Stems naming what ``tool`` is about: its name and the start of its description."""
    words = [w for w in name_words(tool.function.name) if len(w) >= 3 and w not in STOPWORDS]
    words += content_words(first_sentences(tool.function.description))
    return {stem(w) for w in words}


def name_terms(tool: NormalizedTool) -> set[str]:
    return {stem(w) for w in name_words(tool.function.name) if len(w) >= 3 and w not in STOPWORDS}


def humanize(name: str) -> str:
    """``guest_email`` -> ``guest email``; ``check_in`` -> ``check-in``."""
    text = " ".join(name_words(name))
    return re.sub(r"\b(check|sign|log) (in|out)\b", r"\1-\2", text)


# ============================================================================ purpose clauses

_LEADING = re.compile(
    r"^(?:this (?:tool|function|endpoint|api)(?: will| can)?|tool to|used to|use (?:this|it) to|"
    r"allows? (?:you|users|the user) to|can be used to|helps? (?:you )?(?:to )?|lets? you)\s+",
    re.IGNORECASE,
)


def _imperative(word: str) -> str:
    """``Gets`` -> ``get``, ``Searches`` -> ``search``, ``Retrieves`` -> ``retrieve``."""
    w = word.lower()
    if w in VERBS:
        return w
    for suffix in ("es", "s"):  # searches -> search; gets -> get; retrieves -> retrieve
        if w.endswith(suffix) and w[: -len(suffix)] in VERBS:
            return w[: -len(suffix)]
    if w in ("returns", "return"):
        return "get"
    if w.endswith("ies") and w[:-3] + "y" in VERBS:
        return w[:-3] + "y"
    return w


def purpose_clause(tool: NormalizedTool) -> str:
    """An imperative clause saying what ``tool`` does, from its description (or its name).

    "Search hotels in a city ..., cheapest first." -> "search hotels in a city ...";
    "Full catalogue record of a book: author, ..." -> "get the full catalogue record of a book";
    "How many copies of a book are free ..." -> "find out how many copies of a book are free ...".
    """
    sentences = sentences_of(tool.function.description)
    clause = sentences[0] if sentences else ""
    if len(clause.split()) <= 3 and len(sentences) > 1:  # "Get a booking." then the real summary
        clause = sentences[1]
    clause = re.sub(r"\s*\([^)]*\)", "", clause)  # parentheticals
    clause = re.sub(r",?\s+by (?:its|their) [\w-]*(?:identifier|id|name)\b", "", clause)
    clause = _LEADING.sub("", re.split(r";|:\s| - | — ", clause)[0]).strip(" .:,")
    words = clause.split()
    if len(words) > 1 and words[0].lower().endswith("ly") and _imperative(words[1]) in VERBS:
        words = words[1:]  # "Permanently delete a note" -> "delete a note"
    if not words:
        return _name_clause(tool.function.name)
    if _imperative(words[0]) in VERBS:
        words[0] = _imperative(words[0])
        return _trim(words, 12)
    if words[0].lower() in ("how", "what", "which", "whether", "where", "when", "who"):
        return "find out " + _trim([words[0].lower(), *words[1:]], 14)
    phrase = _trim(
        [words[0].lower() if not words[0].isupper() else words[0], *words[1:]], 10, first_comma=True
    )
    named = name_words(tool.function.name)
    if named and named[0] in VERBS and named[0] not in ("get", "fetch", "retrieve", "read", "show", "list"):
        return f"{_name_clause(tool.function.name)} ({phrase})"
    determiner = phrase.split()[0] in ("a", "an", "the", "all", "every", "each", "one", "some", "any", "my")
    return f"get {'' if determiner else 'the '}{phrase}"


_DANGLING = frozenset("a an the and or of for to in on at by with from into as than that which".split())


def _trim(words: list[str], limit: int, first_comma: bool = False) -> str:
    """At most about ``limit`` words: trailing comma segments go first, lists inside stay."""
    if first_comma or len(words) > limit:
        cut = [i for i, w in enumerate(words) if w.endswith(",") and (first_comma or i >= 6)]
        if cut:
            words = words[: (cut[0] if first_comma else cut[-1]) + 1]
    words = words[: limit + 8]
    while words and words[-1].lower().strip(",") in _DANGLING and len(words) > 2:
        words.pop()
    return " ".join(words).rstrip(",")


def _name_clause(name: str) -> str:
    words = name_words(name)
    if words and words[0] in VERBS:
        rest = " ".join(words[1:])
        return f"{words[0]} the {rest}".strip() if rest else words[0]
    return f"get the {' '.join(words)}"


def refer_back(clause: str, entities: Sequence[str]) -> str:
    """Point the clause at results of earlier steps: ``of a hotel`` -> ``of that hotel``."""
    for entity in entities:
        pattern = re.compile(rf"\b(?:a|an|one|the)\s+((?:\w+\s+){{0,2}}?){re.escape(entity)}(s?)\b", re.I)
        clause = pattern.sub(rf"that \1{entity}", clause, count=1)
    return clause


# ================================================================================= values

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

# ============================================================================== phrases


def phrase(arg: Argument, value: str, rng: random.Random) -> str:
    """A phrase stating ``value`` for ``arg``; the value occurs in it verbatim."""
    kind, label = kind_of(arg), humanize(arg.name)
    options: dict[str, tuple[str, ...]] = {
        "city": ("in {v}", "in {v}", "for the city {v}"),
        "date": ("on {v}", "{label} {v}"),
        "date_end": ("until {v}", "{label} {v}"),
        "datetime": ("at {v}",),
        "time": ("at {v}",),
        "people": ("for {v} people", "for a party of {v}") if "guest" not in label else ("for {v} guests",),
        "days": ("for the next {v} days", "covering {v} days"),
        "years": ("over {v} years",),
        "months": ("over {v} months", "for a term of {v} months"),
        "limit": ("showing at most {v} results",),
        "person": ("under the name {v}", "for {v}"),
        "email": ("e-mail {v}", "(contact: {v})"),
        "phone": ("phone {v}",),
        "title": ('titled "{v}"', 'called "{v}"'),
        "content": ('with the text "{v}"', 'saying "{v}"'),
        "tag": ('tag "{v}"', 'with the tag "{v}"'),
        "query": ('matching "{v}"', 'for "{v}"'),
        "pattern": ("matching the pattern {v}",),
        "symbol": ("ticker {v}", "for {v}"),
        "identifier": ("{label} {v}", "my {entity} {v}"),
    }
    choices = options.get(kind, ("{label} {v}", "{label} {v}", "with {label} {v}"))
    if kind in ("array", "text") and not re.search(r"[\d/@]", value):
        choices = ('{label} "{v}"', 'with {label} "{v}"')  # quotes mark where a free-text value ends
    if kind == "currency":  # from_currency / base_currency -> "from EUR"; to / quote -> "into EUR"
        role = snake(arg.name).split("_")[0]
        direction = {"from": "from", "base": "from", "source": "from", "to": "into", "quote": "into"}
        choices = (f"{direction.get(role, 'in')} {{v}}",)
    entity = entity_of(arg.name) or label
    return rng.choice(choices).format(v=value, label=label, entity=entity)


def join_phrases(parts: Sequence[str]) -> str:
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


# ============================================================================ task plans


@dataclass
class Step:
    """What a task says about one chain step."""

    tool: NormalizedTool
    stated: list[tuple[Argument, str]] = field(default_factory=list)
    fed: list[tuple[Argument, str]] = field(default_factory=list)
    """Arguments an earlier output provides, with the provider ('i:tool.path')."""
    missing: list[Argument] = field(default_factory=list)
    """Identifier arguments neither stated nor provided (the user cannot know them)."""


def plan_steps(
    chain: Sequence[NormalizedTool], book: ValueBook, optional_rate: float = OPTIONAL_RATE
) -> list[Step]:
    """Decide per step which arguments the user states and which earlier outputs provide."""
    steps: list[Step] = []
    for i, tool in enumerate(chain):
        step = Step(tool)
        for arg in arguments(tool):
            provider = output_provider(chain, i, arg) if i and takes_output(tool, arg) else None
            if provider is not None and arg.required and _fresh_provider(step, provider, arg):
                step.fed.append((arg, provider))
                continue
            if provider is not None and not arg.required:
                continue
            if arg.required:
                if i and not user_knows(arg):
                    step.missing.append(arg)
                else:
                    step.stated.append((arg, book.value(arg, tool)))
            elif _worth_stating(arg) and book.rng.random() < optional_rate:
                step.stated.append((arg, book.value(arg, tool)))
        _say_what_changes(step, book)
        steps.append(step)
    return steps


CREATE_VERBS = frozenset("create add new post write register make compose send upload insert".split())


def takes_output(tool: NormalizedTool, arg: Argument) -> bool:
    """Whether the task lets an earlier output supply ``arg``.

    Identifiers always; other values too (coordinates from a geocoder, a currency
    from a quote), except the content of something the user creates: a new note's
    title or a file's text is the user's to say, not a copy of whatever came back.
    """
    if is_identifier(arg.name, arg.schema):
        return True
    return not set(name_words(tool.function.name)) & CREATE_VERBS


UPDATE_VERBS = frozenset("update edit modify set change rename tag patch label attach".split())


def _say_what_changes(step: Step, book: ValueBook) -> None:
    """An update whose required arguments are only identifiers states one new value (a title,
    the content, a tag): "update note X" alone is not a request anyone makes."""
    if not set(name_words(step.tool.function.name)) & UPDATE_VERBS:
        return
    if any(not is_identifier(a.name, a.schema) for a, _ in step.stated):
        return
    fed = {a.name for a, _ in step.fed}
    for arg in arguments(step.tool):
        if (
            arg.required
            or arg.name in fed
            or not user_knows(arg)
            or kind_of(arg) in ("boolean", "identifier")
        ):
            continue
        step.stated.append((arg, book.value(arg, step.tool)))
        return


def _fresh_provider(step: Step, provider: str, arg: Argument) -> bool:
    """One output field feeds one argument of a step; a second one (base and quote currency
    both matching ``currency``) is a value the user states, unless it is an identifier."""
    return is_identifier(arg.name, arg.schema) or all(p != provider for _, p in step.fed)


def _worth_stating(arg: Argument) -> bool:
    """Optional arguments a user commonly adds: a choice, a count, a price cap, a period."""
    return kind_of(arg) in ("enum", "people", "limit", "days", "money", "quantity")


def slots_of(steps: Sequence[Step]) -> list[Slot]:
    return [
        Slot(tool=step.tool.function.name, argument=arg.name, value=value)
        for step in steps
        for arg, value in step.stated
    ]


# ============================================================================= task texts

CONTEXTS: dict[str, tuple[str, ...]] = {
    "travel": ("I'm planning a short trip.", "We're travelling for a friend's wedding."),
    "food": ("We're going out for dinner with friends.", "I'm organising a team lunch."),
    "dining": ("We're going out for dinner with friends.",),
    "finance": ("I'm reviewing my investments this week.", "I'm preparing my budget for next year."),
    "weather": ("I'm planning an outdoor weekend.", "I have a long bike ride coming up."),
    "commerce": ("I'm shopping for a birthday present.", "I need to restock my home office."),
    "productivity": ("I'm getting my notes in order before a busy week.",),
    "file": ("I'm tidying up my workspace.", "I'm preparing a report for a meeting."),
}
GENERIC_CONTEXTS = ("I have a few things to sort out today.", "Quick request for today.")
OPENERS = ("Please", "Could you", "Can you", "I need you to", "Help me")


def context_sentence(server: ServerRef, rng: random.Random) -> str:
    key = fold(f"{server.domain} {server.name}")
    for word, options in CONTEXTS.items():
        if word in key:
            return rng.choice(options)
    return rng.choice(GENERIC_CONTEXTS)


def _pick_hint(fed: Sequence[tuple[Argument, str]], chain: Sequence[NormalizedTool]) -> str:
    """Which earlier result to use: the cheapest, the best rated or the first one."""
    for _arg, provider in fed:
        index, _, path = provider.partition(":")
        if "[]" not in path:
            continue
        tool = chain[int(index)]
        container = path[len(tool.function.name) + 1 :].split("[]")[0]
        siblings = {f.name for f in output_fields(tool) if f.path.startswith(f"{container}[]")}
        if siblings & {"price", "price_per_night", "cost", "total"}:
            return "the cheapest one"
        if "rating" in siblings:
            return "the best-rated one"
        return "the first one"
    return ""


def step_sentence(
    step: Step, index: int, total: int, chain: Sequence[NormalizedTool], rng: random.Random
) -> str:
    """One step of the request: connector, purpose clause, value phrases."""
    entities = [e for arg, _ in step.fed if (e := entity_of(arg.name))]
    clause = refer_back(purpose_clause(step.tool), entities) if index else purpose_clause(step.tool)
    if entities and not any(re.search(rf"\b{re.escape(e)}s?\b", clause) for e in entities):
        clause += f" of that {entities[0]}"  # "check the availability" -> "... of that book"
    parts = _value_phrases(step, rng)
    hint = _pick_hint(step.fed, chain) if index else ""
    body = clause
    if parts:
        body += rng.choice((": ", " — ", ", ")) + join_phrases(parts)
    if hint:
        body = f"taking {hint}, {body}"
    if total == 1:
        return body
    if index == 0:
        return rng.choice(("first ", "")) + body
    if index == total - 1:
        return rng.choice(("finally ", "then ", "and after that ")) + body
    return rng.choice(("then ", "next ", "after that ")) + body


def _value_phrases(step: Step, rng: random.Random) -> list[str]:
    stated = list(step.stated)
    parts: list[str] = []
    starts = [(a, v) for a, v in stated if kind_of(a) == "date"]
    ends = [(a, v) for a, v in stated if kind_of(a) == "date_end"]
    if len(starts) == 1 and len(ends) == 1:  # a period: "from X to Y"
        parts.append(f"from {starts[0][1]} to {ends[0][1]}")
        stated = [s for s in stated if s not in (starts[0], ends[0])]
    parts += [phrase(arg, value, rng) for arg, value in stated]
    return parts


def closing_sentence(step: Step, rng: random.Random) -> str:
    """Ask for the key fields of the last step's output (not timestamps, flags or what the user said)."""
    said = {snake(a.name) for a, _ in step.stated}
    fields = [
        f
        for f in output_fields(step.tool)
        if "." not in f.path and not f.name.endswith(("_at", "items")) and f.name not in said
    ]
    fields = [f for f in fields if "boolean" not in json_types(f.schema)]
    fields = [f for f in fields if json_types(f.schema) & {"string", "number", "integer"}] or fields
    if not fields or rng.random() < 0.4:
        return ""
    names = [humanize(f.name) for f in fields[:2]]
    return rng.choice(
        ("Tell me the {x} at the end.", "Let me know the {x}.", "I mainly care about the {x}.")
    ).format(x=" and ".join(names))


def compose_task(
    server: ServerRef,
    chain: Sequence[NormalizedTool],
    steps: Sequence[Step],
    rng: random.Random,
    style: int,
    openers: Sequence[str] = OPENERS,
) -> str:
    """The task text over planned steps, in one of a few styles."""
    sentences = [step_sentence(s, i, len(steps), chain, rng) for i, s in enumerate(steps)]
    opener = rng.choice(openers)
    question = opener.split()[0] in ("Could", "Can", "Would", "Is")
    if style % 3 == 1:  # one sentence per step
        intro = rng.choice(("Here's what I need.", "Please help me with this.", "I need some help."))
        body = intro + " " + " ".join(_capitalise(s.rstrip(".")) + "." for s in sentences)
    else:  # one flowing request, steps joined by commas or semicolons
        glue = ", " if style % 3 == 0 else "; "
        body = f"{opener} {glue.join(sentences)}" + ("?" if question else ".")
    context = context_sentence(server, rng) if rng.random() < 0.6 else ""
    closing = closing_sentence(steps[-1], rng) if steps else ""
    return " ".join(p for p in (context, _capitalise(body), closing) if p)


def _capitalise(text: str) -> str:
    return text[:1].upper() + text[1:] if text else text


def write_task(
    server: ServerRef, chain: Sequence[NormalizedTool], rng: random.Random, style: int
) -> TaskDraft:
    """A task whose solution follows ``chain``, and the values it states."""
    book = ValueBook(rng)
    steps = plan_steps(chain, book)
    return TaskDraft(text=compose_task(server, chain, steps, rng, style), slots=slots_of(steps))


# ============================================================================ chain building


def _sorted_tools(server: ServerRef) -> list[NormalizedTool]:
    return sorted(server.tools, key=lambda t: t.function.name)


def fed_arguments(chain: Sequence[NormalizedTool], tool: NormalizedTool) -> set[str]:
    """Required arguments of ``tool`` the task takes from outputs of ``chain`` (see ``takes_output``)."""
    return {
        a.name
        for a in required_arguments(tool)
        if takes_output(tool, a) and any(feeding_fields(p, a) for p in chain)
    }


def can_follow(chain: Sequence[NormalizedTool], tool: NormalizedTool) -> bool:
    """``tool`` consumes an output of ``chain`` and needs no identifier the user would have to know."""
    fed = fed_arguments(chain, tool)
    if not fed:
        return False
    return all(a.name in fed for a in required_arguments(tool) if not user_knows(a))


def user_can_start(tool: NormalizedTool) -> bool:
    """Every required argument is something a user can state (no system identifiers)."""
    return all(user_knows(a) for a in required_arguments(tool))


def start_order(server: ServerRef) -> list[NormalizedTool]:
    """Candidate first tools in a server-specific order (variants rotate through it).

    Tools a user can start with and that lead somewhere come first; the order is
    a permutation seeded by the server id, independent of the call's rng, so
    consecutive variants start from different tools.
    """
    tools = _sorted_tools(server)
    startable = [t for t in tools if user_can_start(t)]
    leading = [t for t in startable if any(can_follow([t], o) for o in tools if o is not t)]
    pool = leading or startable or tools
    random.Random(server.server_id).shuffle(pool)
    return pool


def build_chain(server: ServerRef, max_length: int, variant: int, rng: random.Random) -> list[NormalizedTool]:
    """A chain along output -> input links, of length in [min(2, max_length), max_length]."""
    tools = _sorted_tools(server)
    order = start_order(server)
    chain = [order[variant % len(order)]]
    target = rng.randint(min(2, max_length), max_length)
    while len(chain) < target:
        candidates = [
            t
            for t in tools
            if t not in chain and can_follow(chain, t) and acts_on_deleted([*chain, t]) is None
        ]
        if not candidates:
            break
        # Prefer a tool that consumes the latest step's output: a real data flow, not a detour.
        weights = [3.0 if fed_arguments(chain[-1:], t) else 1.0 for t in candidates]
        chain.append(rng.choices(candidates, weights)[0])
    return chain


# ================================================================================= rules


def chain_synthesis(inputs: BaseModel, rng: random.Random) -> SynthesizedChain:
    assert isinstance(inputs, ChainSynthesisInput)
    if not inputs.server.tools:
        raise Undecidable("the server has no tools to chain")
    chain = build_chain(inputs.server, inputs.max_length, inputs.variant, rng)
    draft = write_task(inputs.server, chain, rng, inputs.variant)
    return SynthesizedChain(task=draft.text, chain=[t.function.name for t in chain], slots=draft.slots)


def task_from_chain(inputs: BaseModel, rng: random.Random) -> TaskDraft:
    assert isinstance(inputs, ChainTaskInput)
    by_name = {t.function.name: t for t in inputs.server.tools}
    unknown = [name for name in inputs.chain if name not in by_name]
    if unknown:
        raise Undecidable(f"the chain names tools the server does not have: {unknown}")
    chain = [by_name[name] for name in inputs.chain]
    return write_task(inputs.server, chain, rng, inputs.variant)


# ------------------------------------------------------------------------------ coherence

PLACEHOLDER = re.compile(
    r"\{[^{}]*\}|(?i:\[(?:insert|placeholder|todo|your)[^\]]*\])|<[a-z_]+>|(?i:lorem ipsum)"
    r"|(?<![\w/.])(?:TODO|TBD|XXX)(?![\w.])"
)
"""Template leftovers: braces, [insert ...], <slot>, lorem ipsum, TODO."""
STATE_CHANGING = frozenset(
    "create add update delete remove cancel reserve book write move set post put upload checkout place "
    "submit pay transfer attach detach replace append rename register subscribe send insert edit modify".split()
)


def nonsense_problem(text: str) -> str | None:
    """Why ``text`` is not a usable request (None when it is)."""
    words = count_words(text)  # CJK characters count as words: those scripts use no spaces
    if words < 4:
        return f"the task has only {words} word(s)"
    leftover = PLACEHOLDER.search(text)
    if leftover:
        return f"the task contains a template placeholder ({leftover.group(0)!r})"
    visible = [ch for ch in text if not ch.isspace()]
    if sum(ch.isalpha() for ch in visible) < 0.5 * len(visible):
        return "the task is mostly symbols and numbers, not a request"
    tokens = text.casefold().split()
    if len(tokens) >= 8 and max(tokens.count(t) for t in set(tokens)) > 0.4 * len(tokens):
        return "the task repeats one word over and over"
    return None


def _is_state_changing(tool: NormalizedTool) -> bool:
    words = name_words(tool.function.name)
    first = _imperative(tool.function.description.split()[0]) if tool.function.description.split() else ""
    return bool(set(words) & STATE_CHANGING) or first in STATE_CHANGING


def pointless_repeat(chain: Sequence[NormalizedTool]) -> str | None:
    """A tool called again with nothing new in between (consecutive, or no write and no new input)."""
    names = [t.function.name for t in chain]
    for j, tool in enumerate(chain):
        if tool.function.name not in names[:j]:
            continue
        i = max(k for k in range(j) if names[k] == tool.function.name)
        between = chain[i + 1 : j]
        if not between:
            return f"{tool.function.name} is called twice in a row"
        feeds_new = any(feeding_fields(b, a) for b in between for a in required_arguments(tool))
        if not feeds_new and not any(_is_state_changing(b) for b in between):
            return f"{tool.function.name} is repeated although nothing in between changes its inputs or state"
    return None


DESTRUCTIVE = frozenset(("delete", "remove", "destroy", "purge", "erase"))


def acts_on_deleted(chain: Sequence[NormalizedTool]) -> str | None:
    """A step that needs an entity an earlier step deleted, with no new one produced in between
    (``delete_note`` then ``update_note``; but ``delete_note``, ``create_note``, ``update_note`` is fine)."""
    deleted: dict[str, int] = {}  # entity -> step that deleted it
    for j, tool in enumerate(chain):
        for arg in required_arguments(tool):
            entity = entity_of(arg.name)
            if entity not in deleted:
                continue
            since = chain[deleted[entity] + 1 : j]
            if not any(feeding_fields(t, arg) for t in since):
                return f"{tool.function.name} needs the {entity} that {chain[deleted[entity]].function.name} deleted"
        if set(name_words(tool.function.name)) & DESTRUCTIVE:
            for arg in required_arguments(tool):
                if (entity := entity_of(arg.name)) is not None:
                    deleted[entity] = j
    return None


def unreflected_tools(task: str, chain: Sequence[NormalizedTool]) -> list[str]:
    """Tools whose purpose no word of the task reflects.

    A tool is reflected when the task contains a stem of its name or of the start
    of its description that is not just a word of another chain tool's *name*
    (``hotel`` cannot show that a details lookup is wanted when ``searchHotels``
    is also in the chain).
    """
    words = text_stems(task)
    missing: list[str] = []
    distinct = {t.function.name: t for t in chain}
    for name, tool in distinct.items():
        others: set[str] = set()
        for other_name, other in distinct.items():
            if other_name != name:
                others |= name_terms(other)
        own = tool_terms(tool)
        distinctive = own - others or own
        if not distinctive & words:
            missing.append(name)
    return missing


def chain_coherence(inputs: BaseModel, rng: random.Random) -> CoherenceVerdict:
    assert isinstance(inputs, CoherenceInput)
    task = inputs.task.strip()
    if not task or not inputs.chain:
        raise Undecidable("empty task or empty chain: nothing to judge")
    problem = nonsense_problem(task)
    if problem:
        return CoherenceVerdict(coherent=False, reason=f"Ill-posed task: {problem}.")
    repeat = pointless_repeat(inputs.chain)
    if repeat:
        return CoherenceVerdict(coherent=False, reason=f"Redundant step: {repeat}.")
    gone = acts_on_deleted(inputs.chain)
    if gone:
        return CoherenceVerdict(coherent=False, reason=f"Impossible order: {gone}.")
    docs = " ".join(first_sentences(t.function.description) for t in inputs.chain)
    task_lang, docs_lang = detect_language(task), detect_language(docs)
    if task_lang != docs_lang:
        return CoherenceVerdict(
            coherent=True,
            reason=f"Well-formed request without redundant steps; task ({task_lang}) and tool docs "
            f"({docs_lang}) differ in language, so tool purposes were not matched word by word.",
        )
    missing = unreflected_tools(task, inputs.chain)
    if missing:
        return CoherenceVerdict(
            coherent=False,
            reason=f"The task never calls for what {', '.join(missing)} does "
            f"({'; '.join(purpose_clause(t) for t in inputs.chain if t.function.name in missing)}).",
        )
    return CoherenceVerdict(
        coherent=True, reason="Every tool serves a need the task states, with no redundant step."
    )


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    CHAIN_SYNTHESIS.name: chain_synthesis,
    TASK_FROM_CHAIN.name: task_from_chain,
    CHAIN_COHERENCE.name: chain_coherence,
}

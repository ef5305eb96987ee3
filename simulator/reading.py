"""Reading a tool-use trajectory: the toolkit the rules agent and the rules judges share.

Both sides of the simulator read a conversation the same way through this module
(``simulator.agent`` to act on it, ``simulator.judges`` to score it):

- words and terms of a text (tokens, crude stems, synonym classes, stop words);
- concrete values a task states (quoted strings, dates, ids, codes, numbers, names)
  and whether a text mentions a value;
- OpenAI tool schemas (``read_tools``: tools, parameters, identifier parameters);
- chat messages, tool calls and tool results (a failed tool response is a JSON
  object with an ``error`` (or ``isError: true``) or an error / timeout text);
- grounding: whether an argument value comes from the task or an earlier output,
  and why a call is not an executable, grounded step.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------- words and terms

STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for with from into onto about as is are was were be
    been being do does did done have has had it its this that these those there their them they he she
    his her we our you your i me my can could would should will shall may might must please which what
    who whom whose when where why how than then so such not no yes any each some also just only very
    too up out again once here both few other own same via per e g eg ie etc one s""".split()
)
REQUEST_WORDS = frozenset(
    """find get show tell give look check want need know like help let see make sure whether search
    list fetch retrieve lookup would could please me""".split()
)
"""Verbs of asking: not part of what a query is about (ignored by the key terms of a request)."""
ACTION_VERBS = frozenset(
    """convert create add delete remove update change set book reserve cancel order buy send move copy
    write read calculate compute compare track list search find get show check tell give open close
    is are was what which how when where who why can could would please i my we our""".split()
)
"""Words that open a sentence without naming anything (never a proper noun when capitalised)."""

SYNONYMS = {
    "find": "search",
    "found": "search",
    "look": "search",
    "lookup": "search",
    "locate": "search",
    "seek": "search",
    "query": "search",
    "fetch": "get",
    "retrieve": "get",
    "obtain": "get",
    "show": "get",
    "display": "get",
    "view": "get",
    "read": "get",
    "now": "current",
    "currently": "current",
    "detail": "get",
    "details": "get",
    "info": "get",
    "information": "get",
    "verify": "check",
    "confirm": "check",
    "whether": "check",
    "add": "create",
    "new": "create",
    "make": "create",
    "write": "create",
    "compose": "create",
    "remove": "delete",
    "erase": "delete",
    "cancel": "delete",
    "change": "update",
    "modify": "update",
    "edit": "update",
    "rename": "update",
    "cheap": "price",
    "cheapest": "price",
    "cost": "price",
    "costs": "price",
    "expensive": "price",
    "under": "max",
    "below": "max",
    "less": "max",
    "maximum": "max",
    "highest": "max",
    "budget": "max",
    "above": "min",
    "least": "min",
    "minimum": "min",
    "availability": "available",
    "vacancy": "available",
    "free": "available",
    "conversion": "convert",
    "exchange": "convert",
    "folder": "directory",
    "dir": "directory",
    "memo": "note",
}

_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9]*|\d+")
_CAMEL_RE = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def words(text: str) -> list[str]:
    """Lower-case word tokens; snake_case, kebab-case and camelCase names split into their words."""
    return [w.lower() for w in _WORD_RE.findall(_CAMEL_RE.sub(" ", text.replace("_", " ")))]


def stem(word: str) -> str:
    """A crude plural/verb-form stripper; ``similar`` absorbs what it misses."""
    if len(word) <= 3:
        return word
    if word.endswith("ability"):
        return word[: -len("ability")] + "able"
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "xes", "zes", "ches", "shes")):
        return word[:-2]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            return word[: -len(suffix)]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def term(word: str) -> str:
    """The comparable form of one word: synonym class, then stem."""
    return stem(SYNONYMS.get(word, word))


def terms(text: str, *, drop_request: bool = False) -> list[str]:
    """Content terms of a text in order (stopwords, one-letter words and, optionally, request verbs out)."""
    return list(_terms(text, drop_request))


@functools.lru_cache(maxsize=8192)
def _terms(text: str, drop_request: bool) -> tuple[str, ...]:
    # Memoised: the rules read the same tool descriptions and task clauses on every turn.
    out = []
    for w in words(text):
        if w in STOPWORDS or len(w) < 2 or w.isdigit():
            continue
        if drop_request and w in REQUEST_WORDS:
            continue
        out.append(term(w))
    return tuple(out)


def similar(a: str, b: str) -> bool:
    """Two terms match: equal, or one is a prefix of the other that differs by a short suffix."""
    if a == b:
        return True
    short, long_ = sorted((a, b), key=len)
    return len(short) >= 4 and long_.startswith(short) and len(long_) - len(short) <= 3


def has_term(needle: str, haystack: Iterable[str]) -> bool:
    if isinstance(haystack, (set, frozenset)) and needle in haystack:
        return True  # the common case, without a scan
    return any(similar(needle, t) for t in haystack)


# --------------------------------------------------------------------------- values in text

_NUMBER_RE = re.compile(r"(?<![\w.\-/])-?\d+(?:\.\d+)?(?![\w\-/])")
DATE_RE = re.compile(r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?(?:Z|[+-]\d{2}:?\d{2})?)?\b")
_QUOTED_RE = re.compile(r"\"([^\"]{1,200})\"|“([^”]{1,200})”|(?<![\w])'([^']{1,200})'(?![\w])")
_PATH_RE = re.compile(r"(?<![\w])/[\w.\-]+(?:/[\w.\-]+)*/?")
_URL_RE = re.compile(r"https?://[^\s'\"]+")
_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+\.[\w.-]+")
_ID_RE = re.compile(
    r"(?<![\w\-])(?=[\w\-]*\d)(?=[\w\-]*[A-Za-z])[A-Za-z0-9]+(?:[\-_][A-Za-z0-9]+)+(?![\w\-])|"
    r"(?<![\w\-])(?=[A-Za-z]*\d)[A-Za-z]+\d[A-Za-z0-9]*(?![\w\-])"
)
_CODE_RE = re.compile(r"(?<![\w\-])[A-Z]{2,6}(?![\w\-])")
_PROPER_RE = re.compile(
    r"(?<![\w'])[A-Z][a-zA-Z]+(?:[ -](?:[A-Z][a-zA-Z]+|de|da|del|la|le|van|von))*(?![\w])"
)


@dataclass(frozen=True)
class TextValue:
    """A concrete value stated in a text."""

    text: str
    """As written (quotes stripped)."""
    kind: str
    """quoted, date, url, email, path, id, code, number or proper."""
    start: int
    end: int
    before: tuple[str, ...]
    """Up to three words right before the value (lower case)."""
    after: tuple[str, ...]
    """Up to two words right after it."""

    @property
    def number(self) -> float | None:
        try:
            return float(self.text)
        except ValueError:
            return None


def stated_values(text: str) -> list[TextValue]:
    """Values a text states, in order: quoted strings first claim their span, then dates, URLs, ids..."""
    taken: list[tuple[int, int]] = []
    found: list[TextValue] = []

    def free(start: int, end: int) -> bool:
        return all(end <= s or start >= e for s, e in taken)

    def add(kind: str, value: str, start: int, end: int) -> None:
        taken.append((start, end))
        before = tuple(words(text[max(0, start - 40) : start])[-3:])
        after = tuple(words(text[end : end + 30])[:2])
        found.append(TextValue(value, kind, start, end, before, after))

    for m in _QUOTED_RE.finditer(text):
        value = next(g for g in m.groups() if g is not None).strip()
        if value:
            add("quoted", value, m.start(), m.end())
    passes: list[tuple[str, re.Pattern[str]]] = [
        ("date", DATE_RE),
        ("url", _URL_RE),
        ("email", _EMAIL_RE),
        ("path", _PATH_RE),
        ("id", _ID_RE),
        ("number", _NUMBER_RE),
        ("code", _CODE_RE),
    ]
    for kind, pattern in passes:
        for m in pattern.finditer(text):
            value = m.group(0).rstrip(".") if kind == "path" else m.group(0)
            if value and free(m.start(), m.start() + len(value)):
                add(kind, value, m.start(), m.start() + len(value))
    for m in _PROPER_RE.finditer(text):
        if not free(m.start(), m.end()):
            continue
        phrase = _strip_common_words(m.group(0))
        if phrase:
            offset = m.group(0).index(phrase)
            add("proper", phrase, m.start() + offset, m.start() + offset + len(phrase))
    return sorted(found, key=lambda v: v.start)


def _strip_common_words(phrase: str) -> str:
    """Drop capitalised sentence openers such as 'Find' or 'The' from a proper-noun phrase."""
    parts = phrase.split(" ")
    while parts and (
        parts[0].lower() in STOPWORDS
        or parts[0].lower() in REQUEST_WORDS
        or parts[0].lower() in SYNONYMS
        or parts[0].lower() in ACTION_VERBS
    ):
        parts = parts[1:]
    return " ".join(parts)


def number_tokens(text: str) -> set[float]:
    """Every number written in a text (inside ids and dates too), as floats."""
    return {float(m) for m in re.findall(r"\d+(?:\.\d+)?", text)}


def as_number(value: Any) -> float | None:
    """A JSON number (not a bool), or a string that is exactly a number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"-?\d+(?:\.\d+)?", value.strip()):
        return float(value)
    return None


def mentions(text: str, value: Any) -> bool:
    """Whether ``text`` states ``value``: a number as a standalone number, a string as a whole phrase."""
    number = as_number(value)
    if number is not None:
        return any(math.isclose(float(m), number) for m in _NUMBER_RE.findall(text))
    if isinstance(value, bool) or value is None:
        return False
    needle = str(value).strip().casefold()
    if not needle:
        return False
    pattern = r"(?<![a-z0-9])" + re.escape(needle) + r"(?![a-z0-9])"
    return re.search(pattern, text.casefold()) is not None


def format_value(value: Any) -> str:
    """A value as the agent writes it: strings with spaces quoted, booleans as yes/no."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return f"'{value}'" if " " in value else value
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(value, ensure_ascii=False)


# --------------------------------------------------------------------------- tools


@dataclass(frozen=True)
class Param:
    """One parameter of a tool."""

    name: str
    schema: dict[str, Any]
    required: bool

    @property
    def type(self) -> str | None:
        kind = self.schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        return kind if isinstance(kind, str) else None

    @property
    def description(self) -> str:
        return str(self.schema.get("description") or "")

    @property
    def name_words(self) -> list[str]:
        return words(self.name)

    @property
    def is_identifier(self) -> bool:
        """Names a thing by an opaque key, which only an earlier output (or a stated id) can supply."""
        ws = self.name_words
        return bool(ws) and (
            ws[-1] in {"id", "ids", "sku", "uuid", "key"} or "identifier" in words(self.description)
        )

    @property
    def entity(self) -> list[str]:
        """What an identifier points at: ``book_id`` -> ['book']."""
        return [term(w) for w in self.name_words if w not in {"id", "ids", "uuid", "key"}]


@dataclass(frozen=True)
class ToolSpec:
    """The parts of an OpenAI tool the rules read."""

    name: str
    description: str
    params: tuple[Param, ...]

    @property
    def required(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.required)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def name_terms(self) -> list[str]:
        return terms(self.name)

    def description_terms(self) -> list[str]:
        return terms(self.description)

    def param_terms(self) -> list[str]:
        return [t for p in self.params for t in terms(f"{p.name} {p.description}")]

    def all_terms(self) -> frozenset[str]:
        return self._all_terms

    @functools.cached_property
    def _all_terms(self) -> frozenset[str]:  # read for every task term of every turn: built once
        return frozenset({*self.name_terms(), *self.description_terms(), *self.param_terms()})


def read_tools(tools: Sequence[dict[str, Any]]) -> dict[str, ToolSpec]:
    """OpenAI tools (``{"type": "function", "function": {...}}`` or bare functions) by name."""
    specs: dict[str, ToolSpec] = {}
    for tool in tools:
        fn = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        raw_schema = fn.get("parameters")
        schema: dict[str, Any] = raw_schema if isinstance(raw_schema, dict) else {}
        raw_props = schema.get("properties")
        props: dict[str, Any] = raw_props if isinstance(raw_props, dict) else {}
        required = set(schema.get("required") or [])
        params = tuple(
            Param(name, prop if isinstance(prop, dict) else {}, name in required)
            for name, prop in props.items()
        )
        specs[fn["name"]] = ToolSpec(fn["name"], str(fn.get("description") or ""), params)
    return specs


def relevant_to_task(task: str, spec: ToolSpec) -> bool:
    """The tool's documentation shares at least one content term with the task."""
    doc = spec.all_terms()
    return any(has_term(t, doc) for t in set(terms(task)))


# --------------------------------------------------------------------------- messages and results

_TRANSIENT_RE = re.compile(
    r"time[d]?[ -]?out|timed out|unreachable|unavailable|connection (?:refused|reset|error|closed)|"
    r"temporar|try again|\b50[234]\b|\b429\b",
    re.IGNORECASE,
)
_ERROR_TEXT_RE = re.compile(r"^\s*(?:error|exception|failed|failure|traceback)\b", re.IGNORECASE)
_FAILURE_WORDS = frozenset(
    "fail failed failure error errors timeout timed unreachable unavailable retry retrying again could "
    "unable".split()
)


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message (string content or text parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None


def failure_kind(text: str) -> str | None:
    """None for a valid tool response; 'transient' (timeout, unreachable...) or 'error' for a failure.

    A failure is a JSON object with a truthy top-level ``error`` (or ``isError: true``), or a plain-text
    response that starts with an error word or reports a timeout / unreachable service.
    """
    data = parse_json(text)
    if isinstance(data, dict):
        failed = bool(data.get("error")) or data.get("isError") is True
    elif data is not None:
        failed = False
    else:
        failed = bool(_ERROR_TEXT_RE.match(text) or _TRANSIENT_RE.search(text))
    if not failed:
        return None
    return "transient" if _TRANSIENT_RE.search(text) else "error"


def acknowledges_failure(text: str) -> bool:
    """The text says that something failed, timed out or will be retried."""
    return any(w in _FAILURE_WORDS for w in words(text)) or "could not" in text.lower()


@dataclass(frozen=True)
class CallRecord:
    """One tool call issued by an assistant message."""

    index: int
    """0-based position among all tool calls of the messages."""
    message: int
    """Index of the issuing assistant message in the message list."""
    call_id: str
    name: str
    arguments: dict[str, Any] | None
    """Parsed arguments; None when they were not a JSON object."""


@dataclass(frozen=True)
class ResultRecord:
    """One tool message."""

    call_id: str
    name: str
    message: int
    text: str
    data: Any
    failure: str | None
    """None when the call succeeded, else 'transient' or 'error'."""

    @property
    def ok(self) -> bool:
        return self.failure is None


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """OpenAI tool-call arguments (a JSON string, or already a dict) as a dict."""
    data = parse_json(raw) if isinstance(raw, str) else raw
    return data if isinstance(data, dict) else None


def read_calls(messages: Sequence[dict[str, Any]]) -> list[CallRecord]:
    """Every tool call in message order, calls of one message in their listed order."""
    calls: list[CallRecord] = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            calls.append(
                CallRecord(
                    index=len(calls),
                    message=i,
                    call_id=str(call.get("id") or f"call_{len(calls)}"),
                    name=str(fn.get("name") or ""),
                    arguments=parse_arguments(fn.get("arguments")),
                )
            )
    return calls


def read_results(messages: Sequence[dict[str, Any]]) -> dict[str, ResultRecord]:
    """Tool messages by the id of the call they answer."""
    results: dict[str, ResultRecord] = {}
    for i, message in enumerate(messages):
        if message.get("role") != "tool":
            continue
        text = message_text(message)
        call_id = str(message.get("tool_call_id") or "")
        results[call_id] = ResultRecord(
            call_id, str(message.get("name") or ""), i, text, parse_json(text), failure_kind(text)
        )
    return results


def is_round(message: dict[str, Any]) -> bool:
    """An assistant message that issues at least one tool call."""
    return message.get("role") == "assistant" and bool(message.get("tool_calls"))


def first_user_text(messages: Sequence[dict[str, Any]]) -> str:
    return next((message_text(m) for m in messages if m.get("role") == "user"), "")


def canonical_arguments(arguments: dict[str, Any] | None) -> str:
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, default=str)


@dataclass(frozen=True)
class Leaf:
    """A scalar inside a JSON value."""

    path: tuple[str | int, ...]
    key: str
    """Last object key on the path ('' for a bare scalar)."""
    value: Any


def leaves(data: Any, path: tuple[str | int, ...] = ()) -> list[Leaf]:
    """Scalars of a JSON value in document order."""
    if isinstance(data, dict):
        return [leaf for k, v in data.items() for leaf in leaves(v, (*path, str(k)))]
    if isinstance(data, list):
        return [leaf for i, v in enumerate(data) for leaf in leaves(v, (*path, i))]
    key = next((p for p in reversed(path) if isinstance(p, str)), "")
    return [Leaf(path, key, data)]


def informative(leaf: Leaf) -> bool:
    """A leaf worth reporting: a number, or a string of two characters or more (not a bool/null)."""
    if isinstance(leaf.value, bool) or leaf.value is None:
        return False
    if isinstance(leaf.value, int | float):
        return True
    return isinstance(leaf.value, str) and len(leaf.value.strip()) >= 2


def result_key_values(result: ResultRecord, task: str, arguments: dict[str, Any] | None) -> list[Any]:
    """What a successful result tells that its caller did not already know.

    Informative scalars of the result, minus values the task states and values that merely echo the
    call's own arguments (a search result repeating the author asked for says nothing new).
    """
    echoes = [leaf.value for leaf in leaves(arguments or {})]
    out = []
    for leaf in leaves(result.data if result.data is not None else result.text):
        if not informative(leaf) or mentions(task, leaf.value):
            continue
        if any(_same_value(leaf.value, e) for e in echoes):
            continue
        out.append(leaf.value)
    return out


def _same_value(a: Any, b: Any) -> bool:
    na, nb = as_number(a), as_number(b)
    if na is not None and nb is not None:
        return math.isclose(na, nb)
    return str(a).strip().casefold() == str(b).strip().casefold()


# --------------------------------------------------------------------------- grounding


@dataclass
class Evidence:
    """What argument values may legitimately come from: the task and earlier successful outputs."""

    task: str
    outputs: list[Any] = field(default_factory=list)

    def output_strings(self) -> list[str]:
        return [
            str(leaf.value).casefold()
            for data in self.outputs
            for leaf in leaves(data)
            if leaf.value is not None
        ]

    def output_numbers(self) -> list[float]:
        out = []
        for data in self.outputs:
            for leaf in leaves(data):
                number = as_number(leaf.value)
                if number is not None:
                    out.append(number)
        return out

    def tokens(self) -> set[str]:
        found = set(words(self.task))
        for text in self.output_strings():
            found.update(words(text))
        return found


def grounded(value: Any, param: Param | None, evidence: Evidence) -> bool:
    """Whether an argument value is stated in the task, returned by an earlier output or fixed by the schema."""
    schema = param.schema if param else {}
    if isinstance(value, bool) or value is None:
        return True
    if "enum" in schema and value in schema["enum"]:
        return True
    if "default" in schema and value == schema["default"]:
        return True
    if isinstance(value, list):
        item = Param(param.name, schema.get("items") or {}, False) if param else None
        return all(grounded(v, item, evidence) for v in value)
    if isinstance(value, dict):
        return all(grounded(v, None, evidence) for v in value.values())
    number = as_number(value)
    if number is not None:
        known = number_tokens(evidence.task) | set(evidence.output_numbers())
        return any(math.isclose(number, k) for k in known)
    text = str(value).strip()
    if not text or mentions(evidence.task, text):
        return True
    if any(mentions(s, text) for s in evidence.output_strings()):
        return True
    content = [w for w in words(text) if w not in STOPWORDS]
    return bool(content) and set(content) <= evidence.tokens()


def type_ok(value: Any, param: Param) -> bool:
    """The value has the parameter's JSON type (untyped parameters accept anything)."""
    checks: dict[str, Callable[[Any], bool]] = {
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "array": lambda v: isinstance(v, list),
        "object": lambda v: isinstance(v, dict),
    }
    check = checks.get(param.type or "")
    if check is not None and not check(value):
        return False
    enum = param.schema.get("enum")
    return not (isinstance(enum, list) and value not in enum)


def call_problems(call: CallRecord, specs: dict[str, ToolSpec], evidence: Evidence) -> list[str]:
    """Why a call is not an executable, grounded step (empty when it is)."""
    spec = specs.get(call.name)
    if spec is None:
        return [f"{call.name or '<unnamed>'} is not an offered tool"]
    if call.arguments is None:
        return [f"{call.name}: arguments are not a JSON object"]
    problems = [
        f"{call.name}: missing required {p.name}" for p in spec.required if p.name not in call.arguments
    ]
    for name, value in call.arguments.items():
        param = spec.param(name)
        if param is None:
            problems.append(f"{call.name}: unknown argument {name}")
        elif not type_ok(value, param):
            problems.append(f"{call.name}: {name}={format_value(value)} does not fit the schema")
        elif not grounded(value, param, evidence):
            problems.append(
                f"{call.name}: {name}={format_value(value)} appears in neither the task nor an earlier output"
            )
    if not relevant_to_task(evidence.task, spec) and not uses_output(call.arguments, evidence.outputs):
        problems.append(f"{call.name} has nothing to do with the task")
    return problems


def uses_output(arguments: dict[str, Any] | None, outputs: list[Any]) -> bool:
    """Some argument value comes from an earlier output (a chained step, whatever its name says)."""
    only_outputs = Evidence(task="", outputs=outputs)
    return any(
        not isinstance(leaf.value, bool)
        and leaf.value is not None
        and str(leaf.value).strip() != ""
        and grounded(leaf.value, None, only_outputs)
        for leaf in leaves(arguments or {})
    )

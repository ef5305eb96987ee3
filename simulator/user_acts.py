"""What the rules user simulator does in its app: which of its user tools, with which arguments.

Generic over domain packs: it knows no tool names. A tool is wanted when the agent's structured
hint (``action_requests``) names it, or else when the agent's last message asks the user to do
something (a request cue such as "please") and the message's words match the tool's name (or,
failing that, several words of its description); words match on a five-letter prefix, so
"damaged" matches ``report_damage`` and "photos" matches "photo". When the message asks for an
action "in the app" / "on your device" without naming one the user has, the user does the next
planned action it has not done yet.

Arguments, per parameter, from the first source that has a value:

1. the hint's pre-filled arguments (the app fills them in);
2. the user's planned action for that tool (the values the scenario says it would enter);
3. ``known_info`` (a key equal to the parameter, or one ending/starting with it, e.g.
   ``verification_code`` for ``code``);
4. facts in the private instructions: ``key: value`` pairs, "... <word> ... is <value>" and
   "<word> <identifier>" for the parameter's words (``charge_id`` -> "charge CH-0001"), looked up
   in the agent's message first, then in the instructions; a value shaped like the parameter
   description's example (``e.g. "CH-0001"``) in the agent's message;
5. booleans from on/off words in the agent's message, enums by word overlap, and free text from
   the instructions' clause most like the tool's description.

A required parameter without a value means the user cannot do it (``missing``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from arena.llm.roles.user_sim import UserAction, UserSimInput

REQUEST_RE = re.compile(
    r"\b(?:please|could you|can you|would you|will you|go ahead and|you(?:'ll| will)? need to|kindly|"
    r"try to|make sure)\b",
    re.IGNORECASE,
)
_WHERE_RE = re.compile(r"\b(?:in (?:the|your) app|on your (?:device|phone|screen))\b", re.IGNORECASE)
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z0-9'-]*")
_IGNORED = frozenset(
    "the a an and or of to in on at for with from by your their our my me you we it its is are be "
    "this that these those please customer user users app apps application agent can could would "
    "should will shall then also just now first into onto via any some e.g args returns".split()
)
_OFF_RE = re.compile(r"\b(?:off|disable\w*|turn\w* off|switch\w* off|deactivat\w*|stop\w*)\b", re.I)
_ON_RE = re.compile(r"\b(?:on\b(?!\s+(?:your|the|my|a|an|this|that)\b)|enable\w*|activat\w*|start\w*)", re.I)
"""'on' as a state, not a place ('on your phone')."""
_EXAMPLE_RE = re.compile(r"e\.g\.?,?\s*[\"'`]([^\"'`]+)[\"'`]")
_ID_VALUE = r"([A-Z][A-Z0-9]*-\d[\w-]*|[\w.+-]+@[\w-]+\.[\w.]+|\d[\w-]*)"
_CLAUSE_RE = re.compile(r"(?<=[.;!?])\s+|\n+")
_PAIR_RE = re.compile(r"(?:^|[;\n(]|\.\s)\s*([A-Za-z][\w ]{0,30}?):\s*([^;\n)]+)")


def stem(word: str) -> str:
    """A word's comparison key: casefolded, first five letters."""
    return word.casefold()[:5]


def stems(text: str) -> set[str]:
    """The comparison keys of a text's content words."""
    return {stem(w) for w in _WORD_RE.findall(text.replace("_", " ")) if w.casefold() not in _IGNORED}


def tool_name_of(spec: Mapping[str, Any]) -> str:
    return str(spec.get("function", {}).get("name") or "")


def description_of(spec: Mapping[str, Any]) -> str:
    """The tool's description without its ``Args:`` section."""
    text = str(spec.get("function", {}).get("description") or "")
    return text.split("Args:", 1)[0]


def humanize(name: str) -> str:
    return name.replace("_", " ")


@dataclass(frozen=True)
class Wanted:
    """A user tool the agent asked for, with what the app pre-fills."""

    name: str
    prefilled: dict[str, Any]


def wanted_tools(inputs: UserSimInput, message: str) -> list[Wanted]:
    """The user tools the agent's last message asks for (see the module docstring)."""
    offered = {tool_name_of(t) for t in inputs.user_tools}
    if inputs.action_requests:
        return [Wanted(r.name, dict(r.arguments)) for r in inputs.action_requests if r.name in offered]
    if not inputs.user_tools or not REQUEST_RE.search(message):
        return []
    said = stems(message)
    wanted: list[Wanted] = []
    for spec in inputs.user_tools:
        name = tool_name_of(spec)
        name_hits = len(stems(name) & said)
        description_hits = len(stems(description_of(spec)) & said)
        if (name_hits >= 1 and 3 * name_hits + description_hits >= 3) or description_hits >= 3:
            wanted.append(Wanted(name, {}))
    if not wanted and _WHERE_RE.search(message):
        # "Please do that in your app": the next thing the user meant to do there.
        undone = next((p for p in inputs.planned_actions if not _done(inputs, p) and p.name in offered), None)
        if undone is not None:
            wanted.append(Wanted(undone.name, {}))
    return wanted


def facts(instructions: str) -> dict[str, str]:
    """``key: value`` pairs stated in the instructions (keys in snake case)."""
    found: dict[str, str] = {}
    for key, value in _PAIR_RE.findall(instructions):
        found.setdefault("_".join(key.casefold().split()), value.strip().rstrip("."))
    return found


def _param_words(name: str) -> list[str]:
    return [w for w in name.casefold().split("_") if len(w) >= 3 and w not in _IGNORED]


def _from_known(name: str, known: Mapping[str, Any]) -> Any:
    """A known value for parameter ``name``: same key, else a key ending or starting with it."""
    if name in known:
        return known[name]
    for key, value in known.items():
        if key.endswith(name) or name.endswith(key) or key.startswith(name):
            return value
    return None


def _from_text(name: str, description: str, texts: Iterable[str]) -> str | None:
    """A value the texts give for the parameter (its words then 'is', or followed by an identifier)."""
    words = _param_words(name)
    example = _EXAMPLE_RE.search(description)
    shape = None
    if example is not None:
        shape = re.compile(
            (r"\b" if example.group(1)[:1].isalnum() else "")
            + "".join(
                "[A-Z]" if c.isupper() else r"\d" if c.isdigit() else re.escape(c) for c in example.group(1)
            )
            + r"\b"
        )
    for text in texts:
        for word in words:
            said = re.search(rf"\b{re.escape(word)}\b(?:[\w' ]{{0,40}}?)\bis\s+([^\s,;()]+)", text, re.I)
            if said is not None:
                return said.group(1).rstrip(".")
            labelled = re.search(rf"\b{re.escape(word)}s?\b[:#]?\s+{_ID_VALUE}", text, re.I)
            if labelled is not None:
                return labelled.group(1).rstrip(".")
        if shape is not None:
            shaped = shape.search(text)
            if shaped is not None:
                return shaped.group(0)
    return None


def _best_clause(texts: Iterable[str], keys: set[str]) -> str | None:
    best, score = None, 0
    for text in texts:
        for clause in _CLAUSE_RE.split(text):
            for part in clause.split(";"):
                overlap = len(stems(part) & keys)
                if overlap > score and part.strip():
                    best, score = part.strip().rstrip("."), overlap
    return best


def _coerce(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` as the parameter's JSON type (strings from text become numbers when the schema says)."""
    kind = schema.get("type")
    try:
        if kind == "integer" and not isinstance(value, int):
            return int(str(value).replace(",", ""))
        if kind == "number" and not isinstance(value, int | float):
            return float(str(value).replace(",", ""))
    except ValueError:
        return None
    if kind == "string" and not isinstance(value, str):
        return json.dumps(value) if isinstance(value, dict | list) else str(value)
    if kind == "array" and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return value


def _clause_about(message: str, keys: set[str]) -> str:
    """The clause of ``message`` that names the tool most (several asks in one message)."""
    clauses = [c for c in re.split(r"[.;!?,]|\band\b|\bthen\b", message) if c.strip()]
    return max(clauses, key=lambda c: len(stems(c) & keys), default=message)


def _other_value(
    name: str, schema: Mapping[str, Any], message: str, texts: list[str], tool: str, tool_keys: set[str]
) -> Any:
    """Booleans from on/off words, enums by word overlap, free text from the instructions."""
    kind = schema.get("type")
    if kind == "boolean":
        clause = _clause_about(message, stems(tool))
        off, on = _OFF_RE.search(clause), _ON_RE.search(clause)
        if off or on:
            return bool(on) and not (off and (not on or off.start() > on.start()))
        return None
    if "enum" in schema:
        said = stems(message) | stems(" ".join(texts))
        ranked = sorted(schema["enum"], key=lambda v: -len(stems(str(v)) & said))
        return ranked[0] if ranked and stems(str(ranked[0])) & said else None
    if kind in (None, "string"):
        keys = tool_keys | stems(str(schema.get("description") or "")) | stems(name)
        return _best_clause(texts, keys)
    return None


def fill_arguments(
    inputs: UserSimInput, spec: Mapping[str, Any], wanted: Wanted, message: str
) -> tuple[dict[str, Any], list[str], str | None]:
    """(arguments, the names the user entered itself, the first required parameter it has no value for)."""
    name = tool_name_of(spec)
    parameters = spec.get("function", {}).get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or [])
    fitting = [
        p
        for p in inputs.planned_actions
        if p.name == name
        and all(p.arguments.get(k) == v for k, v in wanted.prefilled.items() if k in p.arguments)
    ]
    # The next planned call not done yet; else the last one (asked again, the user means the same).
    undone = [p for p in fitting if not _done(inputs, p)]
    plan = (undone[0] if undone else fitting[-1]).arguments if fitting else {}
    known = {**facts(inputs.instructions), **inputs.known_info}
    texts = [message, inputs.instructions, *inputs.requirements]
    tool_keys = stems(description_of(spec)) | stems(name)
    arguments: dict[str, Any] = {}
    entered: list[str] = []
    for param, schema in properties.items():
        if param in wanted.prefilled:
            arguments[param] = wanted.prefilled[param]
            continue
        value = plan.get(param)
        if value is None:
            value = _from_known(param, known)
        if value is None:
            value = _from_text(param, str(schema.get("description") or ""), texts)
        if value is None and param in required:
            value = _other_value(param, schema, message, texts[1:], name, tool_keys)
        if value is not None:
            value = _coerce(value, schema)
        if value is None:
            if param in required:
                return arguments, entered, param
            continue
        arguments[param] = value
        entered.append(param)
    return arguments, entered, None


def _done(inputs: UserSimInput, action: UserAction) -> bool:
    """The user already ran this call successfully."""
    return any(a.ok and a.name == action.name and a.arguments == action.arguments for a in inputs.own_actions)


def already_done(inputs: UserSimInput, name: str, arguments: Mapping[str, Any]) -> bool:
    return _done(inputs, UserAction(name=name, arguments=dict(arguments)))


def mistype(value: Any) -> Any:
    """The value with its last digit one off (None when it has no digit to get wrong)."""
    text = str(value)
    digits = [i for i, c in enumerate(text) if c.isdigit()]
    if not digits or isinstance(value, bool):
        return None
    at = digits[-1]
    wrong = text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :]
    if isinstance(value, int):
        return int(wrong)
    if isinstance(value, float):
        return float(wrong)
    return wrong

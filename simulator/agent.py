"""Rules agent policy (``agent_policy``): a lexical tool-using agent that sees only the conversation.

Its input is what a deployed model gets: the OpenAI messages so far and the
OpenAI tool schemas. It never sees the chain a task was built from. Per turn it

1. picks, per request of the task (clauses split at commas, 'and', 'then'),
   the tools whose purpose matches it best (IDF-weighted overlap of its words
   with tool names, descriptions and parameter docs), plus the tools that must
   run first to produce an input a picked tool needs (an id from a search,
   coordinates from a geocoder); a state-changing tool (create, book, delete...)
   only when the task asks for that action;
2. fills arguments from values the task states (quoted strings, numbers,
   dates, codes, names, enum values; the words around a value point to its
   parameter, and optional parameters are filled only when so named) and, for
   identifiers the task does not name, from fields of earlier successful tool
   outputs (``id``/``book_id`` of the first search result, ...);
3. calls every tool that is ready and still useful in one parallel round
   (except those the task orders after others with 'then'), retries a call
   that failed with a transient error (timeout, unreachable) at most once,
   never repeats a call that succeeded;
4. answers when nothing useful is left, reporting the key values each tool
   returned and which calls failed.

It reads the conversation with ``simulator.reading``, the toolkit it shares with
the rules judges (``simulator.judges``), so both sides read a trajectory the same way.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.llm.roles.agent import AGENT_POLICY, AgentTurn, AgentTurnInput, PlannedCall
from simulator.reading import (
    ACTION_VERBS,
    DATE_RE,
    REQUEST_WORDS,
    STOPWORDS,
    SYNONYMS,
    CallRecord,
    Param,
    ResultRecord,
    TextValue,
    ToolSpec,
    as_number,
    canonical_arguments,
    first_user_text,
    format_value,
    has_term,
    leaves,
    mentions,
    read_calls,
    read_results,
    read_tools,
    stated_values,
    term,
    terms,
    words,
)

# --------------------------------------------------------------------------- the policy: planning

_SIDE_EFFECTS = frozenset(
    "create update delete set book reserve order buy send move write checkout pay".split()
)
"""A tool named with one of these changes state: the agent calls it only when the task asks for it."""


def tool_relevance(task: str, specs: dict[str, ToolSpec]) -> dict[str, float]:
    """IDF-weighted overlap of task terms with each tool: name x3, description x1, parameter docs x0.5."""
    task_terms = set(terms(task))
    docs = [spec.all_terms() for spec in specs.values()]
    n = max(len(specs), 1)
    idf: dict[str, float] = {}  # a term's document frequency is the same for every tool scored

    def weight_of(t: str) -> float:
        if t not in idf:
            idf[t] = math.log(1 + n / max(sum(1 for doc in docs if has_term(t, doc)), 1))
        return idf[t]

    scores: dict[str, float] = {}
    for name, spec in specs.items():
        places = ((3.0, spec.name_terms()), (1.0, spec.description_terms()), (0.5, spec.param_terms()))
        score = 0.0
        for t in task_terms:
            weight = max((w for w, ts in places if has_term(t, ts)), default=0.0)
            if weight:
                score += weight * weight_of(t)
        scores[name] = score
    return scores


_CLAUSE_RE = re.compile(r",|;|\.(?:\s|$)|\?|!|\b(?:and|then|also|after that)\b", re.IGNORECASE)
_MIN_RELEVANCE = 1.0
"""A clause's best tool must score at least this (one distinctive term in a description is not enough)."""
_NEAR_BEST = 0.75


Span = tuple[int, int]
"""Start and end offsets of a part of the task text."""


def clauses(task: str) -> list[Span]:
    """Spans of the task's requests, split at commas, 'and', 'then'... (quoted values never split)."""
    masked = task
    for value in stated_values(task):
        if value.kind == "quoted":
            masked = masked[: value.start] + "x" * (value.end - value.start) + masked[value.end :]
    cuts = [0, *(m.start() for m in _CLAUSE_RE.finditer(masked)), len(task)]
    return [(a, b) for a, b in itertools.pairwise(cuts) if terms(task[a:b])]


def _clause_picks(task: str, specs: dict[str, ToolSpec]) -> list[tuple[Span, list[str]]]:
    """Per request (clause), in order, the allowed tools that match it best."""
    picks = []
    for start, end in clauses(task) or [(0, len(task))]:
        clause = task[start:end]
        scores = tool_relevance(clause, specs)
        best = max(scores.values(), default=0.0)
        if best < _MIN_RELEVANCE:
            continue
        asked = set(terms(clause)) | set(words(clause))
        names = [n for n, score in scores.items() if score >= _NEAR_BEST * best and _allowed(specs[n], asked)]
        picks.append(((start, end), names))
    return picks


def picked_tools(task: str, specs: dict[str, ToolSpec]) -> dict[str, list[Span]]:
    """The tools matching the task's requests, with the spans of the requests each serves."""
    picked: dict[str, list[Span]] = {}
    for span, names in _clause_picks(task, specs):
        for name in names:
            picked.setdefault(name, []).append(span)
    if not picked:
        scores = tool_relevance(task, specs)
        if scores and max(scores.values()) > 0:
            picked = {max(scores, key=lambda n: scores[n]): []}
    return picked


_SEQUENCE_RE = re.compile(r"^\W*(?:and\s+)?(?:then|after that|afterwards|next|finally)\b", re.IGNORECASE)


def sequenced_after(task: str, specs: dict[str, ToolSpec]) -> dict[str, set[str]]:
    """For a request the task orders after others ("..., then search my notes"): the tools it waits for."""
    waits: dict[str, set[str]] = {}
    earlier: set[str] = set()
    for (start, end), names in _clause_picks(task, specs):
        if _SEQUENCE_RE.match(task[start:end]):
            for name in names:
                if name not in earlier:
                    waits.setdefault(name, set()).update(earlier)
        earlier.update(names)
    return waits


def plan_tools(task: str, specs: dict[str, ToolSpec]) -> list[str]:
    """Tools the task needs: the best match of each of its requests, after the tools producing their inputs."""
    ordered: list[str] = []
    for name in picked_tools(task, specs):
        _with_providers(name, task, specs, ordered, depth=0)
    return ordered


def _allowed(spec: ToolSpec, asked: set[str]) -> bool:
    """A state-changing tool (its name starts with such a verb) only when the request names the action."""
    first = words(spec.name)[:1]
    actions = {w for w in first if w in _SIDE_EFFECTS} | {term(w) for w in first if term(w) in _SIDE_EFFECTS}
    return all(a in asked for a in actions)


def _with_providers(name: str, task: str, specs: dict[str, ToolSpec], ordered: list[str], depth: int) -> None:
    """Append ``name`` after the tools that can produce the required inputs the task does not state."""
    if name in ordered or depth > 3:
        return
    stated = task_arguments(specs[name], task)
    asked = set(terms(task)) | set(words(task))
    providers = []
    for param in specs[name].required:
        if param.name in stated or set(param.name_words) & _QUERY_WORDS:
            continue
        provider = _provider(param, name, specs, asked)
        if provider is None:
            if param.is_identifier:
                return  # nothing the task allows can produce this id: the tool is out of reach
            continue
        providers.append(provider)
    for provider in providers:
        _with_providers(provider, task, specs, ordered, depth + 1)
    if name not in ordered:
        ordered.append(name)


def _provider(param: Param, consumer: str, specs: dict[str, ToolSpec], asked: set[str]) -> str | None:
    """The tool the task allows that likely returns ``param``.

    First one its description names ("Hotel identifier from searchHotels"); for an identifier, a
    search/list tool about its entity; else one whose description promises the value ("... turn a
    place name into latitude/longitude") without needing it itself.
    """
    others = {n: s for n, s in specs.items() if n != consumer and _allowed(s, asked)}
    for other in others:
        if re.search(rf"\b{re.escape(other)}\b", param.description):
            return other
    if param.is_identifier:
        for other, spec in others.items():
            if any(t in {"search", "list"} for t in spec.name_terms()) and all(
                has_term(e, spec.all_terms()) for e in param.entity
            ):
                return other
    wanted = [term(w) for w in param.name_words if w not in {"id", "ids"}]
    for other, spec in others.items():
        if (
            spec.param(param.name) is None
            and wanted
            and all(has_term(w, spec.description_terms()) for w in wanted)
        ):
            return other
    return None


# --------------------------------------------------------------------------- the policy: arguments

_KIND_HINTS: dict[str, frozenset[str]] = {
    kind: frozenset(hints.split())
    for kind, hints in {
        "date": "date day start end from to check in out since until arrival departure when time",
        "path": "path file directory dir folder",
        "code": "code symbol ticker currency iso country language exchange",
        "quoted": "query q title name author keyword keywords term text content search topic subject tag "
        "tags message body",
        "proper": "city name location place country destination origin author title address region town "
        "company query",
        "number": "amount quantity count number value total sum price guests people persons limit size days "
        "nights rating age year",
        "url": "url link website page",
        "email": "email mail recipient to",
    }.items()
}
"""Parameter-name words that suit each kind of stated value."""
_QUERY_WORDS = frozenset({"query", "q", "keyword", "keywords", "term", "search", "text", "topic"})


def _param_hints(param: Param) -> set[str]:
    return {term(w) for w in param.name_words} | {w for w in param.name_words}


def _context_terms(value: TextValue) -> list[str]:
    """Terms around a value: the words before it, and for numbers and dates the words after ("2 guests")."""
    return [term(w) for w in (*value.before, *(value.after if value.kind in {"number", "date"} else ()))]


def _name_hits(value: TextValue, param: Param) -> int:
    """How often the words around a value name the parameter ("author 'X'", "2 guests", "to EUR")."""
    name_terms = _param_hints(param)
    hits = sum(1 for t in set(_context_terms(value)) if has_term(t, name_terms) and t not in STOPWORDS)
    if value.before and value.before[-1] in {"from", "to", "in", "out"} & set(param.name_words):
        hits += 1  # "from 2025-06-01", "to EUR": the preposition names the parameter
    return hits


def _candidate_score(value: TextValue, param: Param, n_numeric_params: int, n_numbers: int) -> float:
    """Evidence that a stated value fills a parameter; 0 when its type cannot."""
    kind = param.type
    number = value.number
    if kind in {"integer", "number"}:
        if number is None or (kind == "integer" and not number.is_integer()):
            return 0.0
    elif kind in {"boolean", "object"}:
        return 0.0
    if param.is_identifier and (
        value.kind not in {"id", "number", "code"}
        and not (value.kind == "quoted" and " " not in value.text and any(c.isdigit() for c in value.text))
    ):
        return 0.0
    score = 1.0
    context = _context_terms(value)
    score += 2.0 * _name_hits(value, param)
    desc_terms = set(terms(re.sub(r"e\.g\..*", "", param.description)))
    score += 0.5 * sum(1 for t in set(context) if t in desc_terms)
    hints = _KIND_HINTS.get(value.kind, frozenset())
    if hints & set(param.name_words) or (
        value.kind == "date" and param.schema.get("format") in {"date", "date-time"}
    ):
        score += 2.0
    if value.kind in {"quoted", "proper"} and set(param.name_words) & _QUERY_WORDS:
        score += 1.0
    if value.kind == "number" and kind in {"integer", "number"} and n_numeric_params == 1 and n_numbers == 1:
        score += 1.0
    example = re.search(r"e\.g\.,?\s*['\"]?([^'\",)]+)", param.description)
    if example and _shape(example.group(1).strip()) == _shape(value.text):
        score += 1.0
    return score


def _shape(text: str) -> str:
    if DATE_RE.fullmatch(text):
        return "date"
    if re.fullmatch(r"[A-Z]{2,6}", text):
        return "code"
    if text.startswith("/"):
        return "path"
    if re.fullmatch(r"-?\d+(?:\.\d+)?", text):
        return "number"
    return "text"


def _convert(value: TextValue, param: Param) -> Any:
    number = value.number
    if param.type == "integer" and number is not None:
        return int(number)
    if param.type == "number" and number is not None:
        return number if not number.is_integer() else int(number)
    if param.type == "array":
        return [value.text]
    return value.text


def task_arguments(spec: ToolSpec, task: str, focus: Sequence[Span] = ()) -> dict[str, Any]:
    """Arguments of ``spec`` that the task states: enum mentions, booleans named by the task, matched values.

    ``focus`` are the spans of the requests the tool serves: values inside them are preferred.
    """
    return _task_arguments(spec, task, focus)[0]


def _task_arguments(spec: ToolSpec, task: str, focus: Sequence[Span]) -> tuple[dict[str, Any], set[str]]:
    """``task_arguments`` and the parameters the task names right next to their value."""
    values = stated_values(task)
    task_words = set(words(task))
    args: dict[str, Any] = {}
    for param in spec.params:
        enum = param.schema.get("enum")
        if isinstance(enum, list) and param.type != "integer" and param.type != "number":
            hit = next((e for e in enum if isinstance(e, str) and mentions(task, e.replace("_", " "))), None)
            hit = hit or next((e for e in enum if isinstance(e, str) and mentions(task, e)), None)
            if hit is not None:
                args[param.name] = hit
        elif param.type == "boolean":
            flag_words = [
                w for w in param.name_words if w not in STOPWORDS and w not in {"include", "is", "only"}
            ]
            if flag_words and set(flag_words) <= task_words:
                args[param.name] = True
    open_params = [p for p in spec.params if p.name not in args and p.type not in {"boolean", "object"}]
    numeric = [p for p in open_params if p.type in {"integer", "number"}]
    numbers = [v for v in values if v.kind == "number"]
    scored = []
    for p_order, param in enumerate(open_params):
        for v_order, value in enumerate(values):
            if (
                isinstance(param.schema.get("enum"), list)
                and _convert(value, param) not in param.schema["enum"]
            ):
                continue
            score = _candidate_score(value, param, len(numeric), len(numbers))
            if score < (2.0 if param.required else 3.0):
                continue
            if not param.required and not _name_hits(value, param):
                continue  # an optional parameter is filled only when the task names it next to the value
            if any(a <= value.start < b for a, b in focus):
                score += 2.0  # ranks values of the tool's own request first; never admits one
            scored.append((-score, p_order, v_order, param, value))
    used: set[str] = set()  # a value stated twice ("patron P10023 ... patron P10023") is still one value
    named: set[str] = set()
    for _, _, _, param, value in sorted(scored, key=lambda s: (s[0], s[1], s[2])):
        if param.name in args or value.text in used:
            continue
        args[param.name] = _convert(value, param)
        used.add(value.text)
        if _name_hits(value, param):
            named.add(param.name)
    return args, named


def output_argument(param: Param, observations: Sequence[tuple[str, Any]]) -> Any:
    """A value for ``param`` from earlier successful outputs (most recent first, first list item first)."""
    best: tuple[float, int, int, Any] | None = None
    param_terms = {term(w) for w in param.name_words}
    for recency, (tool, data) in enumerate(reversed(observations)):
        for position, leaf in enumerate(leaves(data)):
            value = leaf.value
            if value is None or isinstance(value, bool):
                continue
            if param.type in {"integer", "number"} and as_number(value) is None:
                continue
            score = 0.0
            if leaf.key == param.name:
                score = 3.0
            elif param.is_identifier and leaf.key in {"id", "uuid", "key"}:
                context = {term(w) for p in leaf.path if isinstance(p, str) for w in words(p)} | set(
                    terms(tool)
                )
                if all(has_term(e, context) for e in param.entity):
                    score = 2.5
            elif leaf.key and {term(w) for w in words(leaf.key)} == param_terms:
                score = 2.0
            if score and (best is None or (score, -recency, -position) > (best[0], -best[1], -best[2])):
                best = (score, recency, position, value)
    if best is None:
        return None
    value = best[3]
    if param.type == "string" and not isinstance(value, str):
        return json.dumps(value) if not isinstance(value, int | float) else str(value)
    if param.type == "integer" and as_number(value) is not None:
        return int(float(value))
    return value


def _query_phrase(spec: ToolSpec, task: str) -> str | None:
    """For a free-text search parameter the task gives no value for: its first run of topic words.

    Topic words are content words that are neither verbs, nor words of the tool's own doc, nor part
    of a stated value; the run ends at the first word that is not one ("wireless headphones" in
    "Search for wireless headphones under 100 EUR").
    """
    tool_terms = {term(w) for w in words(f"{spec.name} {spec.description}")}
    value_words = {w for v in stated_values(task) for w in words(v.text)}
    run: list[str] = []
    for w in words(task):
        topical = (
            w not in STOPWORDS
            and w not in REQUEST_WORDS
            and w not in ACTION_VERBS
            and w not in SYNONYMS
            and len(w) > 1
            and not w.isdigit()
            and term(w) not in tool_terms
            and w not in value_words
        )
        if topical:
            run.append(w)
        elif run and w not in STOPWORDS:
            break
    return " ".join(run[:4]) or None


def fill_arguments(
    spec: ToolSpec, task: str, observations: Sequence[tuple[str, Any]], focus: Sequence[Span] = ()
) -> tuple[dict[str, Any], list[str]]:
    """Arguments for one call of ``spec`` and the required parameters still without a value."""
    stated, named = _task_arguments(spec, task, focus)
    args: dict[str, Any] = {}
    missing: list[str] = []
    for param in spec.params:
        value = None
        if param.is_identifier:
            # "book bk-23" names the id outright; otherwise the id comes from an earlier output.
            value = stated.get(param.name) if param.name in named else None
            if value is None and param.required:
                value = output_argument(param, observations)
            value = value if value is not None else stated.get(param.name)
        else:
            value = stated.get(param.name)
            if value is None and param.required:
                value = output_argument(param, observations)
            if (
                value is None
                and param.required
                and param.type in {"string", None}
                and set(param.name_words) & _QUERY_WORDS
            ):
                value = _query_phrase(spec, task)
        if value is not None:
            args[param.name] = value
        elif param.required:
            missing.append(param.name)
    return args, missing


# --------------------------------------------------------------------------- the policy: turns


@dataclass(frozen=True)
class Attempt:
    """A call made earlier in the conversation and what came back."""

    call: CallRecord
    result: ResultRecord | None


def _attempts(messages: Sequence[dict[str, Any]]) -> list[Attempt]:
    results = read_results(messages)
    return [Attempt(c, results.get(c.call_id)) for c in read_calls(messages)]


def describe_data(data: Any, *, items: int = 1, limit: int = 6) -> str:
    """Key values of a tool output: top-level scalars and the first ``items`` entries of each list."""
    parts: list[str] = []
    for leaf in leaves(data):
        if any(isinstance(p, int) and p >= items for p in leaf.path):
            continue
        if leaf.value is None or (isinstance(leaf.value, str) and not leaf.value.strip()):
            continue
        if len(parts) >= limit * items:
            break
        label = leaf.key or "value"
        parts.append(f"{label} {format_value(leaf.value)}")
    return ", ".join(parts) if parts else "an empty result"


def _describe_call(name: str, arguments: dict[str, Any] | None) -> str:
    shown = ", ".join(f"{k}={format_value(v)}" for k, v in (arguments or {}).items())
    return f"{name}({shown})"


def _describe_result(attempt: Attempt, *, items: int) -> str:
    result = attempt.result
    if result is None:
        return "gave no response"
    if not result.ok:
        reason = "a timeout or unreachable service" if result.failure == "transient" else "an error"
        return f"failed with {reason}"
    data = result.data if result.data is not None else result.text
    return f"returned {describe_data(data, items=items)}"


def agent_turn(inputs: AgentTurnInput, rng: random.Random) -> AgentTurn:
    """One assistant turn: the next parallel round of useful calls, or the final answer."""
    task = first_user_text(inputs.messages)
    if not task.strip():
        raise Undecidable("no user task in the conversation")
    specs = read_tools(inputs.tools)
    attempts = _attempts(inputs.messages)
    observations = [
        (a.call.name, a.result.data if a.result.data is not None else a.result.text)
        for a in attempts
        if a.result is not None and a.result.ok
    ]
    plan = plan_tools(task, specs)
    focus = picked_tools(task, specs)
    calls: list[PlannedCall] = []
    retries: list[str] = []
    blocked: dict[str, list[str]] = {}
    for name in plan:
        mine = [a for a in attempts if a.call.name == name]
        if any(a.result is not None and a.result.ok for a in mine):
            continue
        if mine:
            last = mine[-1]
            if len(mine) < 2 and last.result is not None and last.result.failure == "transient":
                calls.append(PlannedCall(name=name, arguments=dict(last.call.arguments or {})))
                retries.append(name)
            continue
        args, missing = fill_arguments(specs[name], task, observations, focus.get(name, ()))
        if missing:
            blocked[name] = missing
            continue
        calls.append(PlannedCall(name=name, arguments=args))
    calls, deferred = _in_task_order(_unique(calls), blocked, sequenced_after(task, specs))
    if calls:
        return AgentTurn(
            content=_round_content(task, attempts, calls, retries, [*deferred, *blocked], rng),
            tool_calls=calls,
        )
    return AgentTurn(content=_final_answer(task, attempts, blocked, plan, rng), tool_calls=[])


def _in_task_order(
    calls: list[PlannedCall], blocked: dict[str, list[str]], waits: dict[str, set[str]]
) -> tuple[list[PlannedCall], list[str]]:
    """Hold back calls the task orders after tools that are still running or waiting for inputs.

    When every ready call would be held, none is: the tools they wait for cannot progress anyway.
    """
    unsettled = {c.name for c in calls} | set(blocked)
    held = [c for c in calls if waits.get(c.name, set()) & unsettled]
    if not held or len(held) == len(calls):
        return calls, []
    return [c for c in calls if c not in held], [c.name for c in held]


def _unique(calls: list[PlannedCall]) -> list[PlannedCall]:
    seen: set[str] = set()
    out = []
    for call in calls:
        key = call.name + canonical_arguments(call.arguments)
        if key not in seen:
            seen.add(key)
            out.append(call)
    return out


def _round_content(
    task: str,
    attempts: list[Attempt],
    calls: list[PlannedCall],
    retries: list[str],
    waiting: list[str],
    rng: random.Random,
) -> str:
    lines = []
    if not attempts:
        opener = rng.choice(("I understand the task as:", "The request is:", "You asked:"))
        lines.append(f"{opener} {task.strip()}")
    else:
        last_round = max(a.call.message for a in attempts)
        latest = [a for a in attempts if a.call.message == last_round]
        lines.append(
            "From the latest results: "
            + "; ".join(f"{a.call.name} {_describe_result(a, items=1)}" for a in latest)
            + "."
        )
    planned = [f"{_describe_call(c.name, c.arguments)}" for c in calls if c.name not in retries]
    if planned:
        lines.append(
            "Now I call " + " and ".join(planned) + ("" if len(planned) == 1 else ", in parallel") + "."
        )
    for name in retries:
        lines.append(f"The call to {name} failed, so I retry it once with the same arguments.")
    if waiting:
        lines.append("Then " + " and ".join(waiting) + " with values taken from these results.")
    return "\n".join(lines)


def _final_answer(
    task: str, attempts: list[Attempt], blocked: dict[str, list[str]], plan: list[str], rng: random.Random
) -> str:
    if not plan:
        return (
            f"You asked: {task.strip()}\nNone of the offered tools fits this request, so I cannot answer it "
            "with tool results."
        )
    lines = [f"You asked: {task.strip()}", rng.choice(("Here is what the tools returned:", "Results:"))]
    final: dict[str, Attempt] = {}
    for attempt in attempts:
        key = attempt.call.name + canonical_arguments(attempt.call.arguments)
        previous = final.get(key)
        if previous is None or previous.result is None or not previous.result.ok:
            final[key] = attempt
    for attempt in final.values():
        lines.append(
            f"- {_describe_call(attempt.call.name, attempt.call.arguments)}: {_describe_result(attempt, items=3)}."
        )
    for name, missing in blocked.items():
        lines.append(f"- I could not call {name}: no value for {', '.join(missing)}.")
    return "\n".join(lines)


def _agent_rule(inputs: BaseModel, rng: random.Random) -> BaseModel:
    if not isinstance(inputs, AgentTurnInput):
        raise TypeError(f"agent_policy expects AgentTurnInput, got {type(inputs).__name__}")
    return agent_turn(inputs, rng)


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {AGENT_POLICY.name: _agent_rule}

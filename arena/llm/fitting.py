"""Fitting a role's input into its context budget by compacting the tool documentation it carries.

Tool docs dominate the prompts of the SFT track: a server's tools with their parameter and response
schemas run to tens of kilobytes, while the role needs the names, what each tool does and its
arguments. When a rendered prompt does not leave the role's whole reply budget free
(``ContextBudget.fits``), the gateway calls ``fit_inputs``, which compacts every tool list in the
input step by step and stops at the first step that fits:

1. shorten descriptions (tool 300, parameter 100 characters), drop nested ones and examples;
2. tool descriptions 120, parameter descriptions 40 characters, response schemas without any
   (their property names and types stay: they are how one call feeds the next);
3. leave out tools the input does not name (its ``chain``), last first, until it fits;
4. the last resort, for any input: cut its longest texts (a policy, a long tool result, a worker
   prompt), keeping the head and saying how much was cut; then halve its largest list (rows,
   database entities; a seeded half in order; never chat messages or tools), until it fits.

What was cut comes back as short phrases (the gateway logs them, counts the call as fitted and keeps
them on the answer, ``Answer.cut``). Inputs without tools, or that already fit, come back unchanged,
so at the default budget nothing differs.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from arena.llm.budget import CHARS_PER_TOKEN, ContextBudget, prompt_tokens
from arena.llm.core import Role

Tool = dict[str, Any]
"""A tool as a dict: OpenAI form (``{"type", "function": {...}}``), maybe with ``response_schema``."""


@dataclass(frozen=True)
class Fit:
    """A fitted input and what was cut from it."""

    inputs: BaseModel
    cut: list[str]


def _function(tool: Tool) -> dict[str, Any]:
    function = tool.get("function")
    return function if isinstance(function, dict) else tool


def _name(tool: Tool) -> str:
    return str(_function(tool).get("name") or "")


def _short(text: Any, limit: int) -> Any:
    return text[: limit - 1] + "…" if isinstance(text, str) and len(text) > limit else text


def _trim_schema(schema: Any, limit: int, depth: int = 0) -> Any:
    """``schema`` with descriptions cut to ``limit`` at the top level and dropped below it."""
    if isinstance(schema, list):
        return [_trim_schema(s, limit, depth) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("description", "title"):
            if depth <= 1 and key == "description" and limit > 0:
                out[key] = _short(value, limit)
            continue
        if key in ("examples", "example"):
            continue
        deeper = depth + 1 if key in ("properties", "items") else depth
        out[key] = _trim_schema(value, limit, deeper)
    return out


LIMITS = {1: (300, 100), 2: (120, 40)}
"""Description lengths (tool, parameter) of each compaction level."""


def _step(tools: list[Tool], level: int) -> list[Tool]:
    """The tools compacted to ``level`` (1 or 2): shorter descriptions, schemas kept."""
    tool_limit, param_limit = LIMITS[level]
    out = []
    for tool in copy.deepcopy(tools):
        function = _function(tool)
        function["description"] = _short(function.get("description"), tool_limit)
        if isinstance(function.get("parameters"), dict):
            function["parameters"] = _trim_schema(function["parameters"], param_limit)
        if isinstance(tool.get("response_schema"), dict):  # how calls chain: kept, but terse
            tool["response_schema"] = _trim_schema(tool["response_schema"], param_limit if level == 1 else 0)
        out.append(tool)
    return out


@dataclass
class _Slot:
    """One tool list inside an input: how to read it as dicts and how to write dicts back."""

    get: Callable[[BaseModel], list[Tool]]
    put: Callable[[BaseModel, list[Tool]], BaseModel]
    droppable: bool = True
    """Whether tools may be left out (never those of a ``chain``: they are the subject)."""


def _slots(inputs: BaseModel) -> list[_Slot]:
    """The tool lists of ``inputs``: a ``server`` with ``tools``, or fields that are lists of tools."""
    slots: list[_Slot] = []
    for field, value in inputs:
        if isinstance(value, BaseModel) and isinstance(getattr(value, "tools", None), list):
            slots.append(_server_slot(field, type(value)))
        elif isinstance(value, list) and value and all(_is_tool(v) for v in value):
            slots.append(_list_slot(field, type(value[0]), droppable=field != "chain"))
    return slots


def _is_tool(value: Any) -> bool:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return isinstance(value, dict) and isinstance(_function(value).get("name"), str) and "function" in value


def _dump(values: list[Any]) -> list[Tool]:
    return [v.model_dump(mode="json") if isinstance(v, BaseModel) else dict(v) for v in values]


def _load(kind: type, tools: list[Tool]) -> list[Any]:
    return [kind.model_validate(t) for t in tools] if issubclass(kind, BaseModel) else tools


def _server_slot(field: str, _kind: type) -> _Slot:
    def get(inputs: BaseModel) -> list[Tool]:
        return _dump(getattr(inputs, field).tools)

    def put(inputs: BaseModel, tools: list[Tool]) -> BaseModel:
        server = getattr(inputs, field)
        kind = type(server.tools[0]) if server.tools else dict
        return inputs.model_copy(update={field: server.model_copy(update={"tools": _load(kind, tools)})})

    return _Slot(get, put)


def _list_slot(field: str, kind: type, droppable: bool) -> _Slot:
    def get(inputs: BaseModel) -> list[Tool]:
        return _dump(getattr(inputs, field))

    def put(inputs: BaseModel, tools: list[Tool]) -> BaseModel:
        return inputs.model_copy(update={field: _load(kind, tools)})

    return _Slot(get, put, droppable)


def _named(inputs: BaseModel) -> set[str]:
    """Tool names the input singles out (a ``chain`` of names), kept to the last step."""
    chain = getattr(inputs, "chain", None)
    return {c for c in chain if isinstance(c, str)} if isinstance(chain, list) else set()


def _size(role: Role[Any, Any], inputs: BaseModel) -> int:
    return prompt_tokens(role.messages(inputs), role.tools(inputs))


def fit_inputs(role: Role[Any, Any], inputs: BaseModel, budget: ContextBudget) -> Fit:
    """``inputs`` with its tool docs compacted until the prompt leaves the reply budget free."""
    before = _size(role, inputs)
    if before <= budget.prompt_tokens:  # the common case: one measurement, nothing else
        return Fit(inputs, [])
    slots = _slots(inputs)
    if not slots:
        fitted, notes = _last_resort(role, inputs, budget)
        return Fit(fitted, [*notes, _sizes(before, _size(role, fitted))] if notes else [])
    keep = _named(inputs)
    originals = [slot.get(inputs) for slot in slots]

    def built(lists: list[list[Tool]]) -> BaseModel:
        fitted = inputs
        for slot, tools in zip(slots, lists, strict=True):
            fitted = slot.put(fitted, tools)
        return fitted

    for level in (1, 2):
        current = [_step(tools, level) for tools in originals]
        fitted = built(current)
        if _size(role, fitted) <= budget.prompt_tokens:
            return Fit(fitted, [_level_note(level), _sizes(before, _size(role, fitted))])
    dropped: list[str] = []
    droppable = [slot.droppable for slot in slots]
    while _size(role, fitted) > budget.prompt_tokens:
        victim = _last_droppable(current, keep, droppable)
        if victim is None:
            break
        i, j = victim
        dropped.append(_name(current[i].pop(j)))
        fitted = built(current)
    cut = [_level_note(2)]
    if dropped:
        cut.append(f"{len(dropped)} tool(s) left out: {', '.join(sorted(set(dropped)))}")
    fitted, last = _last_resort(role, fitted, budget)
    return Fit(fitted, [*cut, *last, _sizes(before, _size(role, fitted))])


def _last_resort(
    role: Role[Any, Any], inputs: BaseModel, budget: ContextBudget
) -> tuple[BaseModel, list[str]]:
    """Long texts shortened, then long lists thinned, as far as it takes; what was cut, as phrases."""
    fitted, shortened = _shorten_texts(role, inputs, budget)
    notes = (
        [f"{len(shortened)} long text(s) shortened: {', '.join(sorted(set(shortened))[:6])}"]
        if shortened
        else []
    )
    fitted, thinned = _thin_lists(role, fitted, budget)
    return fitted, notes + thinned


MIN_ITEMS = 4
"""Lists at most this long are never thinned."""


def _lists(value: Any, path: str = "") -> list[tuple[str, list[Any]]]:
    """(path, list) of every list of a dumped input that may be thinned: not chat messages, not tools."""
    found: list[tuple[str, list[Any]]] = []
    if isinstance(value, dict):
        for k, v in value.items():
            found += _lists(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, list):
        structural = any(isinstance(v, dict) and ("role" in v or "function" in v) for v in value)
        if len(value) > MIN_ITEMS and not structural and path != "chain":
            found.append((path, value))
        for i, v in enumerate(value):
            found += _lists(v, f"{path}[{i}]")
    return found


def _thin_lists(
    role: Role[Any, Any], inputs: BaseModel, budget: ContextBudget
) -> tuple[BaseModel, list[str]]:
    """Halve the largest list (a seeded half, in order) until the prompt fits:
    a table of rows, entities of a database, examples. Chat messages and tools are never thinned."""
    data = inputs.model_dump(mode="json")
    current = inputs
    notes: dict[str, tuple[int, int]] = {}
    for _ in range(MAX_ROUNDS * 2):
        if _size(role, current) <= budget.prompt_tokens:
            break
        candidates = _lists(data)
        if not candidates:
            break
        path, items = max(candidates, key=lambda c: len(json.dumps(c[1], ensure_ascii=False)))
        # A seeded half, in order: deterministic, and no stride pattern in the data decides what stays.
        chosen = sorted(random.Random(len(items)).sample(range(len(items)), len(items) // 2))
        kept = [items[i] for i in chosen]
        data = _replaced(data, {path: kept})
        try:
            current = type(inputs).model_validate(data)
        except ValueError:
            return inputs, []
        total = notes.get(_field_of(path), (len(items), len(items)))[0]
        notes[_field_of(path)] = (total, len(kept))
    return current, [f"{field}: {kept} of {total} items kept" for field, (total, kept) in notes.items()]


MIN_TEXT = 400
"""Texts at most this long are never shortened."""


def _texts(value: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, text) of every string leaf of a dumped input."""
    if isinstance(value, str):
        return [(path, value)]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _texts(v, f"{path}.{k}" if path else str(k))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _texts(v, f"{path}[{i}]")]
    return []


def _replaced(value: Any, changes: dict[str, Any], here: str = "") -> Any:
    """``value`` with the texts at the paths of ``changes`` replaced (one walk)."""
    if here in changes:
        return changes[here]
    if isinstance(value, dict):
        return {k: _replaced(v, changes, f"{here}.{k}" if here else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_replaced(v, changes, f"{here}[{i}]") for i, v in enumerate(value)]
    return value


MAX_ROUNDS = 8
"""Rounds of shortening (each measures once); every round cuts what the estimate says is over."""


def _shorten_texts(
    role: Role[Any, Any], inputs: BaseModel, budget: ContextBudget
) -> tuple[BaseModel, list[str]]:
    """The last resort: cut the longest texts (a policy, a tool result, a prompt) until the prompt fits.

    Each round cuts, longest first, about as many characters as the prompt is over (a text keeps
    at least half of itself and ``MIN_TEXT`` characters, and says how much was cut). An input
    whose model refuses a shortened text (a length constraint) is left as it was."""
    data = inputs.model_dump(mode="json")
    shortened: list[str] = []
    current = inputs
    for _ in range(MAX_ROUNDS):
        over = _size(role, current) - budget.prompt_tokens
        if over <= 0:
            break
        want = over * CHARS_PER_TOKEN + 64
        changes: dict[str, str] = {}
        for path, text in sorted(_texts(data), key=lambda leaf: -len(leaf[1])):
            if want <= 0 or len(text) <= MIN_TEXT:
                break
            keep = max(MIN_TEXT, len(text) // 2, len(text) - want)
            changes[path] = f"{text[:keep]} …[{len(text) - keep} characters cut]"
            want -= len(text) - keep
        if not changes:
            break
        data = _replaced(data, changes)
        try:
            current = type(inputs).model_validate(data)
        except ValueError:
            return inputs, []
        shortened.extend(_field_of(path) for path in changes)
    return current, shortened


def _field_of(path: str) -> str:
    """``messages[3].content`` -> ``messages.content``: where, without the positions."""
    return re.sub(r"\[\d+\]", "", path)


def _last_droppable(lists: list[list[Tool]], keep: set[str], droppable: list[bool]) -> tuple[int, int] | None:
    """The last tool of the longest droppable list that the input does not name (lists keep one tool)."""
    order = sorted((i for i in range(len(lists)) if droppable[i]), key=lambda i: -len(lists[i]))
    for i in order:
        for j in range(len(lists[i]) - 1, -1, -1):
            if len(lists[i]) > 1 and _name(lists[i][j]) not in keep:
                return i, j
    return None


def _level_note(level: int) -> str:
    tool_limit, param_limit = LIMITS[level]
    return f"tool descriptions shortened to {tool_limit} characters, parameter descriptions to {param_limit}"


def _sizes(before: int, after: int) -> str:
    return f"prompt {before} -> {after} tokens (estimated)"

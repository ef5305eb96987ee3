"""Reading what real models reply: reasoning apart, the role's JSON by schema, tool calls from text.

A reply from a real model is rarely just the JSON asked for. It may open with reasoning
(``<think>…</think>``, or only a closing ``</think>`` when the chat template opened it), wrap the
JSON in prose or a fence, show a draft object before the final one, or write tool calls as Hermes
``<tool_call>{…}</tool_call>`` text when the server has no tool parser. This module turns such a
reply into a role's output:

* ``split_reasoning``: reasoning and the visible text; nothing inside reasoning is ever parsed.
* ``choose_output``: of every JSON object in the visible text, the first that validates as the
  role's output (so a decoy or draft object does not win by coming first).
* ``text_tool_calls``: Hermes ``<tool_call>`` blocks (fenced or not) and fenced
  ``{"name", "arguments"}`` objects naming an offered tool.
* ``unusable_reason``: an empty reply or a refusal, named as such.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from arena.llm.core import ToolCall

M = TypeVar("M", bound=BaseModel)

MAX_JSON_CANDIDATES = 64
"""JSON objects tried in one reply (a reply is never worth more parsing than this)."""

_THINK_BLOCK = re.compile(r"<(think|thinking|reasoning)>(.*?)</\1>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<(think|thinking|reasoning)>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(think|thinking|reasoning)>", re.IGNORECASE)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*([\w-]*)[ \t]*\n(.*?)```", re.DOTALL)
_REFUSAL = re.compile(
    r"^\s*(?:i'?m sorry|i am sorry|sorry,|i apologi[sz]e)?[,.!\s]*(?:but\s+)?"
    r"(?:i\s+(?:can(?:no|')t|cannot|won'?t|will not|am (?:not able|unable)|'m (?:not able|unable))\s+"
    r"(?:help|assist|comply|do that|provide|fulfil|fulfill|complete|answer|generate|create))",
    re.IGNORECASE,
)


class NoJsonObject(ValueError):
    """A reply holds no parseable JSON object."""


class ReplyInvalid(ValueError):
    """A reply holds JSON, but no object validates as the role's output; says why the best one failed."""


@dataclass(frozen=True)
class Reply:
    """A reply split into what the model reasoned and what it answered."""

    reasoning: str
    visible: str


def split_reasoning(text: str, reasoning: str = "") -> Reply:
    """Reasoning blocks apart from the visible text.

    ``reasoning`` is what the server already separated (``reasoning_content``). A ``</think>``
    without an opening tag closes reasoning the chat template opened; an opening tag never closed
    (the reply was cut inside its reasoning) leaves no visible text.
    """
    parts = [reasoning] if reasoning else []
    opened = _THINK_OPEN.search(text)
    closed = _THINK_CLOSE.search(text)
    if closed and (opened is None or closed.start() < opened.start()):
        parts.append(text[: closed.start()])
        text = text[closed.end() :]
    parts.extend(m.group(2) for m in _THINK_BLOCK.finditer(text))
    text = _THINK_BLOCK.sub("", text)
    dangling = _THINK_OPEN.search(text)
    if dangling:
        parts.append(text[dangling.end() :])
        text = text[: dangling.start()]
    return Reply(reasoning="\n".join(p.strip() for p in parts if p.strip()), visible=text.strip())


def json_objects(text: str) -> list[dict[str, Any]]:
    """Every top-level JSON object in ``text``, in order (objects nested in one are not repeated)."""
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    start = text.find("{")
    tried = 0
    while start != -1 and tried < MAX_JSON_CANDIDATES:
        tried += 1
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            found.append(value)
            start = text.find("{", end)
        else:
            start = text.find("{", start + 1)
    return found


def extract_json(text: str) -> dict[str, Any]:
    """The first JSON object of the visible text (reasoning stripped); ``NoJsonObject`` if none."""
    objects = json_objects(split_reasoning(text).visible)
    if not objects:
        raise NoJsonObject("no JSON object in the reply")
    return objects[0]


def _summary(exc: ValidationError, limit: int = 5) -> str:
    parts = [f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()]
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "; ".join(parts[:limit]) + more


def choose_output(model: type[M], visible: str) -> M:
    """The first JSON object of ``visible`` that validates as ``model``.

    Raises ``NoJsonObject`` when there is no JSON object, ``ReplyInvalid`` (with the validation
    errors of the object that came closest: fewest errors, later on a tie) when none validates.
    """
    objects = json_objects(visible)
    if not objects:
        raise NoJsonObject("no JSON object in the reply")
    best: tuple[int, str] | None = None
    for obj in objects:
        try:
            return model.model_validate(obj)
        except ValidationError as exc:
            if best is None or len(exc.errors()) <= best[0]:
                best = (len(exc.errors()), _summary(exc))
    assert best is not None
    several = f" (none of its {len(objects)} JSON objects validates)" if len(objects) > 1 else ""
    raise ReplyInvalid(f"invalid output{several}: {best[1]}")


def parse_arguments(raw: Any) -> dict[str, Any] | None:
    """Tool-call arguments as an object: given as one, or as a JSON string ('' is no arguments);
    None when they are neither (servers send both forms, models write both)."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        return None
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _call_of(obj: Any) -> ToolCall | None:
    """A tool call from ``{"name", "arguments"}`` (arguments an object or a JSON string)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = parse_arguments(obj.get("arguments", obj.get("parameters", {})))
    return None if arguments is None else ToolCall(name=obj["name"], arguments=arguments)


def text_tool_calls(visible: str, offered: set[str]) -> tuple[list[ToolCall], str]:
    """Tool calls written as text, and the text around them.

    Hermes ``<tool_call>{"name": …, "arguments": …}</tool_call>`` blocks anywhere in the visible
    text (inside a fence too; the last may be unclosed); without any, fenced JSON objects of the
    form ``{"name", "arguments"}`` whose name is an ``offered`` tool. A block that does not parse is
    left in the text (the caller then sees no call and may retry).
    """
    calls: list[ToolCall] = []
    spans: list[tuple[int, int]] = []
    for match in _TOOL_CALL.finditer(visible):
        objects = json_objects(match.group(1))
        parsed = [c for c in map(_call_of, objects) if c is not None]
        if parsed:
            calls.extend(parsed)
            spans.append(match.span())
    if not calls:
        for fence in _FENCE.finditer(visible):
            parsed = [
                c for c in map(_call_of, json_objects(fence.group(2))) if c is not None and c.name in offered
            ]
            if parsed:
                calls.extend(parsed)
                spans.append(fence.span())
    rest = visible
    for start, end in reversed(spans):
        rest = rest[:start] + rest[end:]
    rest = re.sub(r"```[\w-]*\s*```", "", rest)  # fences left empty by a removed block
    return calls, rest.strip()


def as_text(calls: list[ToolCall] | tuple[ToolCall, ...]) -> str:
    """Tool calls as Hermes ``<tool_call>`` blocks (how an answer with native calls is stored)."""
    return "".join(
        f"<tool_call>{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}</tool_call>"
        for c in calls
    )


def unusable_reason(
    visible: str, refusal: str | None = None, reasoning: str = "", *, prose_refusal: bool = True
) -> str | None:
    """Why a reply without usable content is unusable: a refusal or an empty reply (None otherwise).

    ``prose_refusal=False`` (an agent role, whose plain text is its message to the customer) counts
    only the API's ``refusal`` field: "I'm sorry, but I cannot do that" is then the agent declining a
    request as its policy says, not the model declining the task.
    """
    if refusal:
        return f"the model refused: {' '.join(refusal.split())[:200]}"
    if not visible.strip():
        if reasoning:
            return f"empty reply: only reasoning ({len(reasoning)} characters), no answer after it"
        return "empty reply"
    if prose_refusal and _REFUSAL.search(visible) and not json_objects(visible):
        return f"the model refused: {' '.join(visible.split())[:200]}"
    return None

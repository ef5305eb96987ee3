"""Would a person accept this dialogue? Rules over an agent-side customer-service chat.

tau2's evaluator checks the end state, not the way there: a dialogue can reach the goal with
habits an agent should never learn. Each finding names one such habit, found from the messages
alone (never from the reference solution), so a synthesised dialogue that shows one is rejected
with that reason:

- ``lookup_before_identification``: a call on the customer's data (an argument such as an order,
  reservation, user or line id, an e-mail or a phone number) before any customer message said who
  they are (an e-mail, a user id, a phone number or their full name);
- ``repeated_agent_message``: the agent says the same thing word for word twice (a proposal
  repeated after the customer changed the subject, a refusal said twice);
- ``choice_without_asking``: a write on one of several items a tool listed (three lines, five
  orders) that the customer never named or described, with no question from the agent after the
  list;
- ``identity_after_refusal``: the customer answers a refusal with nothing but their name or id;
- ``goal_revealed``: the customer recites their instructions (a run of the scenario's own
  second-person words);
- ``opening_not_first_person`` and ``opening_slip``: the customer's first message is not in the
  first person, or has a template slip ("I mobile data is not working", "the the");
- ``repeated_user_message`` and ``empty_user_turn``.

These are heuristics over English text, sized to the patterns seen in synthesised dialogues; each
has a fixture in ``tests/test_realism.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.llm.replies import parse_arguments
from environments.tau2_tasks import VERBS_AFTER_SUBJECT
from synthesis.eigen.roles.dialogs import grounded_values

Reason = Literal[
    "lookup_before_identification",
    "repeated_agent_message",
    "choice_without_asking",
    "identity_after_refusal",
    "goal_revealed",
    "opening_not_first_person",
    "opening_slip",
    "repeated_user_message",
    "empty_user_turn",
]

DESCRIPTIONS: dict[str, str] = {
    "lookup_before_identification": "the agent looked up the customer's data before they said who they are",
    "repeated_agent_message": "the agent repeats a message word for word",
    "choice_without_asking": "the agent acted on one of several listed items without asking which",
    "identity_after_refusal": "the customer answers a refusal with only their name or id",
    "goal_revealed": "the customer recites their instructions",
    "opening_not_first_person": "the customer's first message is not in the first person",
    "opening_slip": "the customer's first message has a template slip",
    "repeated_user_message": "the customer repeats a message word for word",
    "empty_user_turn": "an empty customer message",
}


class RealismFinding(BaseModel):
    """One habit a person would not accept, where it shows."""

    reason: Annotated[Reason, Field(description="Which habit (see the module docstring).")]
    evidence: Annotated[str, Field(description="The message or call concerned, cut to 200 characters.")]
    turn: Annotated[int, Field(description="Index of the message in the chat (0 is the system message).")]

    @property
    def description(self) -> str:
        return DESCRIPTIONS[self.reason]


PERSONAL_KEYS = re.compile(
    r"(?:^|_)(?:ids?|email|phone(?:_number)?|user|customer|order|reservation|line|account|zip(?:_code)?)$"
)
"""Argument names that point at one customer's data."""
EMAIL = re.compile(r"[\w.+-]+@[\w-]+\.[\w.]+\w")
USER_ID = re.compile(r"\b[a-z]+_[a-z]+_\d{3,}\b")
PHONE = re.compile(r"\b\d{3}[-. ]?\d{3}[-. ]?\d{4}\b")
FULL_NAME = re.compile(r"\b(?i:my name is|i am|i'm|this is)\s+[A-Z][a-z'-]+\s+[A-Z][a-z'-]+")
REFUSAL = re.compile(
    r"\b(?:sorry|unfortunately)\b.*\b(?:cannot|can't|can not|unable|not able|not allowed)\b", re.I
)
FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|we|our|us)\b", re.I)
# "I" then a word that is no verb, then a verb of being: a "You(r) X is ..." template turned into
# "I X is ...". The words a person does put there ("I think it is") are listed.
SLIP = re.compile(r"\bI\s+([a-z]+)\s+(?:[a-z]+\s+)?(?:is|are|isn't|aren't|was|were|has|keeps)\b")
DOUBLED = re.compile(r"\b(\w+)\s+\1\b", re.I)
SECOND_PERSON = re.compile(r"\b(?:you|your|yours)\b", re.I)
RECITED_WORDS = 10
"""Consecutive words of the scenario's own text that make a recital."""


def realism_findings(
    chat: Sequence[dict[str, Any]], *, instructions: str = "", writes: frozenset[str] | set[str] = frozenset()
) -> list[RealismFinding]:
    """Every finding in ``chat`` (OpenAI messages, system first): ``instructions`` is the customer's
    scenario text, ``writes`` the agent tools that change records."""
    messages = list(enumerate(chat))[1:]
    findings = [
        *_before_identification(messages),
        *_repeats(messages, "assistant", "repeated_agent_message"),
        *_repeats(messages, "user", "repeated_user_message"),
        *_choices(chat, messages, set(writes)),
        *_identity_after_refusal(messages),
        *_opening(messages),
        *_recital(messages, instructions),
    ]
    return sorted(findings, key=lambda f: f.turn)


def _finding(reason: Reason, evidence: str, turn: int) -> RealismFinding:
    return RealismFinding(reason=reason, evidence=evidence[:200], turn=turn)


def _calls(message: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        yield str(fn.get("name")), parse_arguments(fn.get("arguments")) or {}


def identifies(text: str) -> bool:
    """Whether a customer message says who they are."""
    return any(p.search(text) for p in (EMAIL, USER_ID, PHONE, FULL_NAME))


def _before_identification(messages: list[tuple[int, dict[str, Any]]]) -> Iterator[RealismFinding]:
    for index, message in messages:
        if message.get("role") == "user" and identifies(str(message.get("content") or "")):
            return
        if message.get("role") != "assistant":
            continue
        for name, arguments in _calls(message):
            personal = [k for k, v in arguments.items() if PERSONAL_KEYS.search(k) and v not in (None, "")]
            if personal:
                yield _finding("lookup_before_identification", f"{name}({', '.join(personal)})", index)
                return


def _norm(text: str) -> str:
    return " ".join(text.casefold().split())


def _repeats(
    messages: list[tuple[int, dict[str, Any]]], role: str, reason: Reason
) -> Iterator[RealismFinding]:
    said: set[str] = set()
    for index, message in messages:
        if message.get("role") != role or message.get("tool_calls"):
            continue
        text = _norm(str(message.get("content") or ""))
        if not text:
            if role == "user":
                yield _finding("empty_user_turn", "", index)
            continue
        if text in said and text != "###stop###":
            yield _finding(reason, text, index)
        said.add(text)


def _said_by_user(messages: list[tuple[int, dict[str, Any]]], before: int) -> str:
    return " ".join(
        str(m.get("content") or "") for i, m in messages if i < before and m.get("role") == "user"
    ).casefold()


def _siblings(value: Any, wanted: str) -> list[Any] | None:
    """The list in a tool result that holds ``wanted`` (as an item, or an item's field) among others."""
    if isinstance(value, dict):
        for item in value.values():
            found = _siblings(item, wanted)
            if found is not None:
                return found
    elif isinstance(value, list):
        for item in value:
            if _is_item(item, wanted):
                return value if len(value) > 1 else None
            found = _siblings(item, wanted)
            if found is not None:
                return found
    return None


def _leaves(node: Any, depth: int = 0) -> Iterator[str]:
    """The short string and number values in a record (nested items too: an order's item names)."""
    if isinstance(node, dict):
        for item in node.values():
            yield from _leaves(item, depth + 1)
    elif isinstance(node, list) and depth < 4:
        for item in node:
            yield from _leaves(item, depth + 1)
    elif isinstance(node, str | int) and not isinstance(node, bool):
        text = str(node).casefold()
        if 3 < len(text) <= 80:
            yield text


def _is_item(item: Any, value: str) -> bool:
    return str(item) == value or (isinstance(item, dict) and value in (str(v) for v in item.values()))


def item_ids(item: Any) -> list[str]:
    """The ids a listed item goes by: itself, or a record's ``id`` / ``*_id`` fields."""
    if not isinstance(item, dict):
        return [str(item)]
    return [
        str(v) for k, v in item.items() if (k == "id" or k.endswith("_id")) and isinstance(v, str | int) and v
    ]


def _item_leaves(item: Any, results: list[tuple[int, Any]]) -> set[str]:
    """What the dialogue showed of one listed item: its own fields and every record of its ids."""
    ids = item_ids(item)
    leaves = set(_leaves(item)) if isinstance(item, dict) else set()
    for key in (i for i in ids if grounded_values(i)):
        leaves.update(leaf for record in _records_with(key, results) for leaf in _leaves(record))
    return leaves - {i.casefold() for i in ids}


def _words(texts: set[str] | str) -> set[str]:
    """The telling words of ``texts``: four characters or more, a plural's "s" dropped."""
    found = re.findall(r"[a-z0-9]+", " ".join(texts) if isinstance(texts, set) else texts.casefold())
    return {w[:-1] if len(w) > 4 and w.endswith("s") else w for w in found if len(w) >= 4}


def _distinguished(value: str, listed: list[Any], results: list[tuple[int, Any]], user_text: str) -> bool:
    """Whether the customer's words single out ``value`` among ``listed``: a word the dialogue showed
    of it (its phone number, an item's name) that they said and that no other candidate has."""
    own: set[str] = set()
    rest: set[str] = set()
    for item in listed:
        (own if _is_item(item, value) else rest).update(_item_leaves(item, results))
    return bool((_words(own) - _words(rest)) & _words(user_text))


def _results(messages: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, Any]]:
    """(index, parsed JSON) of every tool result that parses."""
    parsed: list[tuple[int, Any]] = []
    for index, message in messages:
        if message.get("role") == "tool":
            try:
                parsed.append((index, json.loads(str(message.get("content") or ""))))
            except ValueError:
                continue
    return parsed


def _answered_questions(messages: list[tuple[int, dict[str, Any]]]) -> list[int]:
    """Indices of customer messages that answer an agent question."""
    answered: list[int] = []
    last_agent = ""
    for index, message in messages:
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            last_agent = str(message.get("content") or "")
        elif message.get("role") == "user":
            if "?" in last_agent:
                answered.append(index)
            last_agent = ""
    return answered


def _records_with(value: str, results: list[tuple[int, Any]]) -> Iterator[dict[str, Any]]:
    """Every dict in the tool results that has ``value`` as one of its fields (an item's details)."""

    def walk(node: Any) -> Iterator[dict[str, Any]]:
        if isinstance(node, dict):
            if value in (str(v) for v in node.values() if isinstance(v, str | int)):
                yield node
            for item in node.values():
                yield from walk(item)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    for _, result in results:
        yield from walk(result)


def undecided_choice(
    chat: Sequence[dict[str, Any]], value: str, before: int | None = None
) -> list[Any] | None:
    """The items listed alongside ``value`` when acting on it (before message ``before``) would pick
    one of several that the customer has neither named nor singled out (a detail of it, such as its
    phone number or an item's name, in their words) and that no answered question followed; else None."""
    end = len(chat) if before is None else before
    messages = [(i, m) for i, m in enumerate(chat) if 0 < i < end]
    user_text = _said_by_user(messages, end)
    if value.casefold() in user_text:
        return None
    results = _results(messages)
    for shown_at, result in results:
        listed = _siblings(result, value)
        if listed is None:
            continue
        if any(shown_at < a for a in _answered_questions(messages)):
            return None
        if _distinguished(value, listed, results, user_text):
            return None
        return listed
    return None


def rewrites_all(argument: Any, listed: list[Any]) -> bool:
    """The argument is a list at least as long as the items listed: the write restates all of them
    (a reservation's passengers, one replaced), so it picks none of them."""
    return isinstance(argument, list) and len(argument) >= len(listed)


def picked_without_asking(
    chat: Sequence[dict[str, Any]], argument: Any, before: int | None = None
) -> tuple[str, list[Any]] | None:
    """(value, listed items) when a write's ``argument`` picks one of several items the customer has
    not singled out (``undecided_choice``); None when it picks none or the choice was made."""
    for value in grounded_values(argument):
        listed = undecided_choice(chat, value, before=before)
        if listed and not rewrites_all(argument, listed):
            return value, listed
    return None


def _choices(
    chat: Sequence[dict[str, Any]], messages: list[tuple[int, dict[str, Any]]], writes: set[str]
) -> Iterator[RealismFinding]:
    for index, message in messages:
        if message.get("role") != "assistant":
            continue
        for name, arguments in _calls(message):
            if name not in writes:
                continue
            for argument in arguments.values():
                picked = picked_without_asking(chat, argument, before=index)
                if picked is not None:
                    value, listed = picked
                    yield _finding(
                        "choice_without_asking", f"{name}: {value}, one of {len(listed)} listed", index
                    )
                    return


def _identity_after_refusal(messages: list[tuple[int, dict[str, Any]]]) -> Iterator[RealismFinding]:
    refused = False
    for index, message in messages:
        role, text = message.get("role"), str(message.get("content") or "")
        if role == "assistant" and not message.get("tool_calls"):
            refused = bool(REFUSAL.search(text))
        elif role == "user":
            if refused and identifies(text) and len(text.split()) <= 16 and "?" not in text:
                yield _finding("identity_after_refusal", text, index)
            refused = False


def _opening(messages: list[tuple[int, dict[str, Any]]]) -> Iterator[RealismFinding]:
    first = next(((i, str(m.get("content") or "")) for i, m in messages if m.get("role") == "user"), None)
    if first is None:
        return
    index, text = first
    if len(text.split()) >= 4 and not FIRST_PERSON.search(text):
        yield _finding("opening_not_first_person", text, index)
    slip = next((m for m in SLIP.finditer(text) if m.group(1).casefold() not in VERBS_AFTER_SUBJECT), None)
    hit = slip or DOUBLED.search(text)
    if hit is not None:
        yield _finding("opening_slip", hit.group(0), index)


def _recital(messages: list[tuple[int, dict[str, Any]]], instructions: str) -> Iterator[RealismFinding]:
    words = re.findall(r"[\w'@.-]+", instructions.casefold())
    runs = {
        " ".join(words[i : i + RECITED_WORDS])
        for i in range(len(words) - RECITED_WORDS + 1)
        if SECOND_PERSON.search(" ".join(words[i : i + RECITED_WORDS]))
    }
    if not runs:
        return
    for index, message in messages:
        if message.get("role") != "user":
            continue
        said = re.findall(r"[\w'@.-]+", str(message.get("content") or "").casefold())
        for i in range(len(said) - RECITED_WORDS + 1):
            if " ".join(said[i : i + RECITED_WORDS]) in runs:
                yield _finding("goal_revealed", " ".join(said[i : i + RECITED_WORDS]), index)
                return

"""Rules user simulator (``user_simulator``): reveals the requirements one per turn, acts in its app
when asked, then stops.

Deterministic given its input (the rng only picks a connective; behaviour draws are seeded by
``UserBehaviour.seed`` and the scenario). Per reply, in order:

1. ``turn >= max_turns``: stop (the user gives up);
2. the agent hands over to a human ("transfer you to a human agent"): ``transfer``;
3. the user's own tool calls of this turn have run (``own_actions`` with this ``turn``): report
   what the app showed (each call's output or error), then the next requirement, or a
   confirmation when the agent asked for one;
4. every goal action is among the completed actions -- or, with no goal actions named, some
   state-changing action is done and every requirement has been said: ``stop``;
5. a request stated with a changed detail (``goal_change``) on the last reply: restate it right;
6. the agent says it is done ("done", "has been cancelled", "anything else?") and every requirement
   has been said: ``stop``;
7. the agent asks the user to act in the app (``simulator.user_acts``: its hint, else its words
   matched against the user tools): the calls, with an empty message (the caller runs them and asks
   again, rule 3); calls it already made are not repeated; a value it does not know is said;
8. the agent asks for something the user knows but has not said (a ``known_info`` key, or
   identifiers it withheld, ``incomplete_info``): answer it;
9. a requirement not yet said in an earlier user message: say it (one per turn, in order);
10. the agent asks to confirm an action ("Shall I cancel...?"): confirm;
11. the agent asks anything else: ``out_of_scope`` (the scenario has nothing more to tell);
12. otherwise: one nudge ("Please go ahead."), and ``stop`` if the agent still does nothing.

Requirements come from the input, or else are the sentences of the instructions. A requirement
counts as said when its text (casefolded, whitespace collapsed) -- or the form the behaviours made
of it -- occurs in a user message, so the opening message of a sample that states the first
requirement verbatim is not repeated. The persona's tone (curt, anxious) colours the stock phrases.

Behaviours (``UserBehaviour`` rates, each draw keyed by the scenario and the requirement or tool):
``incomplete_info`` states a requirement without its identifiers (ids like ``O-1001``, emails);
``goal_change`` states it with one number changed and corrects it on the next reply; ``mistakes``
mistypes a digit of a value the user enters on its first try of a tool (the tool refuses it, the
user reports the error, and enters the right value when the agent asks again).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.llm.roles.user_sim import (
    USER_SIMULATOR,
    UserAction,
    UserActionResult,
    UserSimInput,
    UserTurn,
    withhold,
)
from simulator.user_acts import already_done, fill_arguments, humanize, mistype, stems, wanted_tools
from synthesis.envs.text import norm

NUDGE = "Please go ahead."
CONFIRMATION = "Yes, please go ahead."
CONFIRMATIONS = (
    CONFIRMATION,
    "Yes, that's right, go ahead.",
    "Sure, please do.",
    "Okay, yes, please proceed.",
    "Yes, do it.",
    "Yep, go ahead with that.",
)
"""Ways to say yes: a person does not answer every proposal with the same sentence."""
THANKS = "Thank you, that is all I needed."
NO_INFO = "Sorry, I don't have that information."
GIVE_UP = "I have to go now, thanks anyway."
TRANSFERRED = "Okay, I will wait for a human agent."
CHANGED_MIND = "Sorry, I changed my mind: "
DETAILS = "Sorry, here are the details: "
CONNECTIVES = ("", "Also, ", "One more thing: ", "And ")
TONES: dict[str, tuple[str, str]] = {
    "curt": ("Yes.", "Thanks."),
    "anxious": ("Yes, please go ahead, and quickly please.", "Thank you so much, what a relief."),
}
"""Tone -> (confirmation, thanks); other tones use CONFIRMATION and THANKS."""

_TRANSFER_RE = re.compile(
    r"\btransfer\w*\b[^.?!]*\b(?:human|person|representative|supervisor|specialist)\b|\bhuman agent\b",
    re.IGNORECASE,
)
_DONE_RE = re.compile(
    r"\b(?:done|completed?|all set|(?:has|have) been|successfully|anything else)\b", re.IGNORECASE
)
_CONFIRM_RE = re.compile(
    r"\b(?:confirm|shall i|should i|would you like me to|do you want me to|proceed|go ahead)\b",
    re.IGNORECASE,
)
_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+|\n+")
_IDENTIFIER_RE = re.compile(r"\b[A-Z][A-Z0-9]*-\d[\w-]*\b|[\w.+-]+@[\w-]+\.[\w.]+\w")
_NUMBER_RE = re.compile(r"\d[\d.,]*")
MAX_OUTPUT_CHARS = 300


def requirements(inputs: UserSimInput) -> list[str]:
    """The requirements: given ones, else the sentences of the instructions."""
    given = [r.strip() for r in inputs.requirements if r.strip()]
    if given:
        return given
    return [s.strip() for s in _SENTENCE_RE.split(inputs.instructions) if s.strip()]


def identifiers(text: str) -> list[str]:
    """Ids (``O-1001``) and emails in a text: what an incomplete-information user leaves out."""
    return [m.group(0) for m in _IDENTIFIER_RE.finditer(text)]


def changed(text: str) -> str | None:
    """``text`` with the leading digit of its first number changed (None: it has no number)."""
    found = _NUMBER_RE.search(text)
    if found is None:
        return None
    digit = int(text[found.start()])
    new = str(digit + 1) if digit < 9 else "1"
    return text[: found.start()] + new + text[found.start() + 1 :]


def stated(inputs: UserSimInput, index: int, requirement: str) -> str:
    """How the user first states requirement ``index`` under its behaviours."""
    behaviour = inputs.behaviour
    if behaviour.happens(behaviour.goal_change, inputs.instructions, "goal_change", index):
        different = changed(requirement)
        if different is not None:
            return different
    if behaviour.happens(behaviour.incomplete_info, inputs.instructions, "incomplete_info", index):
        return withhold(requirement, identifiers(requirement)) or requirement
    return requirement


def _said(inputs: UserSimInput) -> list[str]:
    return [norm(m.content) for m in inputs.dialogue if m.role == "user"]


def pending(inputs: UserSimInput) -> list[tuple[int, str]]:
    """Requirements no earlier user message has stated yet (in any form), in order."""
    said = _said(inputs)
    return [
        (i, r)
        for i, r in enumerate(requirements(inputs))
        if not any(norm(form) in s for s in said for form in (r, stated(inputs, i, r)))
    ]


def to_correct(inputs: UserSimInput) -> str | None:
    """A requirement stated with a changed detail and not yet restated right."""
    said = _said(inputs)
    for i, r in enumerate(requirements(inputs)):
        form = stated(inputs, i, r)
        if form != r and not any(norm(r) in s for s in said) and any(norm(form) in s for s in said):
            if changed(r) == form:
                return r
    return None


def withheld_details(inputs: UserSimInput) -> list[str]:
    """Requirements stated without their identifiers, whose identifiers the user has not given yet."""
    said = " ".join(_said(inputs))
    out = []
    for i, r in enumerate(requirements(inputs)):
        form = stated(inputs, i, r)
        missing = [v for v in identifiers(r) if norm(v) not in said]
        if form != r and norm(form) in said and missing and changed(r) != form:
            out.append(r)
    return out


def asked_facts(inputs: UserSimInput, last: str) -> list[str]:
    """Known facts the agent's question asks for that no user message has given."""
    said = " ".join(_said(inputs))
    asked = stems(last)
    answers = []
    for key, value in inputs.known_info.items():
        text = str(value)
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if not parts or any(norm(p) in said for p in parts):
            continue
        if stems(key) and stems(key) <= asked:
            answers.append(f"My {humanize(key)} is {text}.")
    return answers


def _tone(inputs: UserSimInput) -> tuple[str, str]:
    """(confirmation, thanks) in the persona's tone; a confirmation already said is varied."""
    words = set(re.findall(r"[a-z]+", f"{inputs.persona} {inputs.instructions[:200]}".casefold()))
    confirmation, thanks = next(
        (phrases for tone, phrases in TONES.items() if tone in words), (CONFIRMATION, THANKS)
    )
    said = set(_said(inputs))
    fresh = [c for c in (confirmation, *CONFIRMATIONS) if norm(c) not in said]
    return (fresh[0] if fresh else confirmation), thanks


def _joined(connective: str, text: str) -> str:
    """``text`` after a connective ("Also, my name is ...", not "Also, My name is ...")."""
    first, _, rest = text.partition(" ")
    if connective and first in ("My", "The", "A", "An", "Our", "We", "It", "This", "That", "There"):
        text = f"{first.lower()} {rest}" if rest else first.lower()
    return connective + text


def _output(action: UserActionResult) -> str:
    text = action.output if isinstance(action.output, str) else json.dumps(action.output, ensure_ascii=False)
    return text if len(text) <= MAX_OUTPUT_CHARS else text[:MAX_OUTPUT_CHARS] + "..."


def report(actions: list[UserActionResult]) -> str:
    """What the user tells the agent about the app actions it just took."""
    parts = []
    for action in actions:
        if action.ok:
            parts.append(f"I did {humanize(action.name)} in the app; it shows: {_output(action)}.")
        else:
            parts.append(f"I tried {humanize(action.name)} in the app, but it says: {_output(action)}.")
    return " ".join(parts)


def act(inputs: UserSimInput, last: str) -> UserTurn | None:
    """The app actions the agent asked for (rule 7), or None when it asked for none."""
    wanted = wanted_tools(inputs, last)
    if not wanted:
        return None
    specs = {str(t.get("function", {}).get("name")): t for t in inputs.user_tools}
    calls: list[UserAction] = []
    unknown: list[str] = []
    repeated: list[str] = []
    for want in wanted:
        arguments, entered, missing = fill_arguments(inputs, specs[want.name], want, last)
        if missing is not None:
            unknown.append(humanize(missing))
            continue
        if already_done(inputs, want.name, arguments):
            repeated.append(want.name)
            continue
        first_try = not any(a.name == want.name for a in inputs.own_actions)
        behaviour = inputs.behaviour
        if first_try and behaviour.happens(behaviour.mistakes, inputs.instructions, "mistakes", want.name):
            for param in reversed(entered):  # the last value typed (a code, not the account id first)
                wrong = mistype(arguments[param])
                if wrong is not None:
                    arguments[param] = wrong
                    break
        calls.append(UserAction(name=want.name, arguments=arguments))
    if calls:
        return UserTurn(message="", signal="continue", tool_calls=calls)
    if unknown:
        return UserTurn(message=f"Sorry, I don't know the {', '.join(unknown)}.", signal="continue")
    if repeated:
        done = [a for a in inputs.own_actions if a.ok and a.name in repeated]
        return UserTurn(message="I already did that. " + report(done[-len(repeated) :]), signal="continue")
    return None


def user_turn(inputs: UserSimInput, rng: random.Random) -> UserTurn:
    """The next user move (see the module docstring for the rule order)."""
    if not inputs.dialogue:
        raise Undecidable("the user simulator needs the dialogue so far")
    last = inputs.dialogue[-1].content if inputs.dialogue[-1].role == "assistant" else ""
    todo = pending(inputs)
    completed = set(inputs.completed_actions)
    confirmation, thanks = _tone(inputs)
    correction = to_correct(inputs)
    if inputs.turn >= inputs.max_turns:
        return UserTurn(message=GIVE_UP, signal="stop")
    if _TRANSFER_RE.search(last):
        return UserTurn(message=TRANSFERRED, signal="transfer")
    fresh = [a for a in inputs.own_actions if a.turn == inputs.turn]
    if fresh:
        follow = ""
        if correction is not None:
            follow = CHANGED_MIND + correction
        elif todo:
            follow = _joined(rng.choice(CONNECTIVES), stated(inputs, *todo[0]))
        elif all(a.ok for a in fresh) and "?" in last and _CONFIRM_RE.search(last):
            follow = confirmation
        return UserTurn(message=f"{report(fresh)} {follow}".strip(), signal="continue")
    if correction is None:
        if inputs.goal_actions and set(inputs.goal_actions) <= completed:
            return UserTurn(message=thanks, signal="stop")
        if not inputs.goal_actions and completed and not todo:
            return UserTurn(message=thanks, signal="stop")
    else:
        return UserTurn(message=CHANGED_MIND + correction, signal="continue")
    if _DONE_RE.search(last) and not todo:
        return UserTurn(message=thanks, signal="stop")
    acted = act(inputs, last)
    if acted is not None:
        return acted
    if "?" in last and not _CONFIRM_RE.search(last):
        answers = asked_facts(inputs, last) + [DETAILS + r for r in withheld_details(inputs)[:1]]
        if answers:
            return UserTurn(message=" ".join(answers), signal="continue")
    if todo:
        connective = rng.choice(CONNECTIVES) if _said(inputs) else ""  # nothing to add to yet
        return UserTurn(message=_joined(connective, stated(inputs, *todo[0])), signal="continue")
    if "?" in last and _CONFIRM_RE.search(last):
        return UserTurn(message=confirmation, signal="continue")
    if "?" in last:
        return UserTurn(message=NO_INFO, signal="out_of_scope")
    previous = [m.content for m in inputs.dialogue if m.role == "user"]
    if previous and previous[-1] == NUDGE:
        return UserTurn(message=thanks, signal="stop")
    return UserTurn(message=NUDGE, signal="continue")


def _user_rule(inputs: BaseModel, rng: random.Random) -> BaseModel:
    if not isinstance(inputs, UserSimInput):
        raise TypeError(f"user_simulator expects UserSimInput, got {type(inputs).__name__}")
    return user_turn(inputs, rng)


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {USER_SIMULATOR.name: _user_rule}

"""Rules user simulator (``user_simulator``): reveals the requirements one per turn, then stops.

Deterministic given its input (the rng only picks a connective). Per reply, in order:

1. ``turn >= max_turns``: stop (the user gives up);
2. the agent hands over to a human ("transfer you to a human agent"): ``transfer``;
3. every goal action is among the completed actions -- or, with no goal actions named, some
   state-changing action is done and every requirement has been said: ``stop``;
4. the agent says it is done ("done", "has been cancelled", "anything else?") and every requirement
   has been said: ``stop``;
5. a requirement not yet said in an earlier user message: say it (one per turn, in order);
6. the agent asks to confirm an action ("Shall I cancel...?"): confirm;
7. the agent asks anything else: ``out_of_scope`` (the scenario has nothing more to tell);
8. otherwise: one nudge ("Please go ahead."), and ``stop`` if the agent still does nothing.

Requirements come from the input, or else are the sentences of the instructions. A requirement
counts as said when its text (casefolded, whitespace collapsed) occurs in a user message, so the
opening message of a sample that states the first requirement verbatim is not repeated.
The rules simulator never calls user tools.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.llm.roles.user_sim import USER_SIMULATOR, UserSimInput, UserTurn
from arena.text import norm

NUDGE = "Please go ahead."
CONFIRMATION = "Yes, please go ahead."
THANKS = "Thank you, that is all I needed."
NO_INFO = "Sorry, I don't have that information."
GIVE_UP = "I have to go now, thanks anyway."
TRANSFERRED = "Okay, I will wait for a human agent."
CONNECTIVES = ("", "Also, ", "One more thing: ", "And ")

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


def requirements(inputs: UserSimInput) -> list[str]:
    """The requirements: given ones, else the sentences of the instructions."""
    given = [r.strip() for r in inputs.requirements if r.strip()]
    if given:
        return given
    return [s.strip() for s in _SENTENCE_RE.split(inputs.instructions) if s.strip()]


def pending(inputs: UserSimInput) -> list[str]:
    """Requirements no earlier user message has stated yet, in order."""
    said = [norm(m.content) for m in inputs.dialogue if m.role == "user"]
    return [r for r in requirements(inputs) if not any(norm(r) in s for s in said)]


def _asks(text: str) -> bool:
    return "?" in text


def user_turn(inputs: UserSimInput, rng: random.Random) -> UserTurn:
    """The next user move (see the module docstring for the rule order)."""
    if not inputs.dialogue:
        raise Undecidable("the user simulator needs the dialogue so far")
    last = inputs.dialogue[-1].content if inputs.dialogue[-1].role == "assistant" else ""
    todo = pending(inputs)
    completed = set(inputs.completed_actions)
    if inputs.turn >= inputs.max_turns:
        return UserTurn(message=GIVE_UP, signal="stop")
    if _TRANSFER_RE.search(last):
        return UserTurn(message=TRANSFERRED, signal="transfer")
    if inputs.goal_actions and set(inputs.goal_actions) <= completed:
        return UserTurn(message=THANKS, signal="stop")
    if not inputs.goal_actions and completed and not todo:
        return UserTurn(message=THANKS, signal="stop")
    if _DONE_RE.search(last) and not todo:
        return UserTurn(message=THANKS, signal="stop")
    if todo:
        return UserTurn(message=rng.choice(CONNECTIVES) + todo[0], signal="continue")
    if _asks(last) and _CONFIRM_RE.search(last):
        return UserTurn(message=CONFIRMATION, signal="continue")
    if _asks(last):
        return UserTurn(message=NO_INFO, signal="out_of_scope")
    previous = [m.content for m in inputs.dialogue if m.role == "user"]
    if previous and previous[-1] == NUDGE:
        return UserTurn(message=THANKS, signal="stop")
    return UserTurn(message=NUDGE, signal="continue")


def _user_rule(inputs: BaseModel, rng: random.Random) -> BaseModel:
    if not isinstance(inputs, UserSimInput):
        raise TypeError(f"user_simulator expects UserSimInput, got {type(inputs).__name__}")
    return user_turn(inputs, rng)


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {USER_SIMULATOR.name: _user_rule}

"""Rules TrajectoryAgent with a reference solution (``TrajectoryAgentInput.reference``).

When synthesis starts from a benchmark task whose solution is known (tau2's train split: its gold
actions and the facts to communicate), the agent's job is to reach that solution through a real
conversation: the calls are known, but an argument may be used only once the conversation has
shown it. It re-derives everything from its input each step and does the first thing still
missing:

1. the reference steps already done are matched in order: an agent step by an assistant call
   with the same name and arguments, a user step by an app event of that user tool;
2. the next step's grounded values -- every string in its arguments that holds a digit or an ``@``
   (ids, codes, dates, emails) -- must occur in an earlier user message, tool result or app event;
   when one does not, the agent first makes a look-up it has not made yet -- one that needs no
   arguments (a catalogue listing), or one whose arguments the customer said ("my phone number is
   ...", "I am Ivan Khan") or, for ids, earlier tools returned (a profile's order ids) -- else asks the
   customer for the arguments that hold them;
3. before it acts for the customer or reads their data (in a domain with customer look-ups), it
   asks who they are -- the identity look-ups' arguments, e.g. e-mail or name and zip -- until a
   customer message says so (``synthesis.eigen.realism.identifies``);
4. a writing agent step on one of several listed items the customer has not singled out (three
   lines, five orders) first looks at each candidate's details (``get_details_by_id``,
   ``get_order_details``: the customer's phone number or an item's name may single one out), and
   asks which one when they do not;
5. a writing agent step is proposed ("Shall I proceed ...?") and run only once the customer's last
   message says yes to that very proposal;
6. a user step is asked for in words, with the structured hint (``user_action_requests``): its
   values are settings the agent prescribes (a network mode), not facts to ground;
7. when every step is done: the facts to tell (``reference_info``), or -- when the solution changes
   nothing and tells nothing -- the look-ups the request allows, then a refusal; and the closing
   question.

It never says the same thing twice word for word: proposals, questions, refusals and closings come
in several wordings, and the first one not said yet is used.

Besides the facts the reference says to tell, it states only values the dialogue has shown (a
proposal names the write's arguments once they are grounded), and it never mentions the reference.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

from arena.llm.replies import parse_arguments
from simulator.user_acts import humanize
from synthesis.eigen.realism import PERSONAL_KEYS, identifies, item_ids, picked_without_asking
from synthesis.eigen.roles.dialogs import (
    YES_RE,
    AgentStep,
    AgentToolCall,
    ReferenceStep,
    TrajectoryAgentInput,
    grounded_values,
)

CLOSINGS = (
    "Is there anything else I can help you with?",
    "Can I help you with anything else?",
    "Is there something else you need today?",
)
CLOSING = CLOSINGS[0]
PROPOSALS = (
    "I can now {action}{shown}. Shall I proceed?",
    "To confirm, I would {action}{shown}. Would you like me to go ahead?",
    "Before I change anything: {action}{shown}. Do you want me to proceed?",
    "Back to your request: I can {action}{shown} now. Shall I go ahead?",
)
"""A proposal in words that vary: the same one is never said twice word for word."""
REFUSALS = (
    "I'm sorry, but I cannot do that under our policy.",
    "I understand, but our policy does not allow that, so I can't make this change.",
    "I'm afraid that is still not something I can do: the policy rules it out.",
)
ASKS = (
    "Could you tell me the {wanted}?",
    "To continue I still need the {wanted}. Could you share it?",
    "I'm missing the {wanted}. Do you have it at hand?",
)
IDENTIFY = (
    "Before I look into this, could you tell me who you are: your {wanted}?",
    "First I need to find your account. What is your {wanted}?",
    "I still need to verify who you are. Could you give me your {wanted}?",
)
WHICH = (
    "I see several {what}: {options}. Which one do you mean?",
    "There is more than one {what} ({options}). Which one is it?",
)
READ_PREFIXES = ("get_", "list_", "find_", "search_", "check_", "lookup_", "show_")
"""How a look-up tool's name starts: the agent may call one without being asked, to find a value."""
MAX_LOOKUPS_PER_TOOL = 8
"""Argument combinations tried per look-up tool (a customer with many orders: the first eight)."""


class _Transcript:
    """What the dialogue has shown so far: calls made, texts seen, the last messages."""

    def __init__(self, inputs: TrajectoryAgentInput) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.seen: list[str] = []
        self.user_texts: list[str] = []
        self.outputs: list[tuple[str, Any]] = []  # (tool, its result: JSON when it parses)
        self.last_user = ""
        self.last_assistant = ""
        self.agent_texts: list[str] = []
        self.identified = False
        """Whether a customer message has said who they are (an e-mail, an id, a phone, a name)."""
        for message in inputs.messages[1:]:  # the system message is the policy, not the conversation
            role, content = message.get("role"), str(message.get("content") or "")
            if role == "assistant":
                for call in message.get("tool_calls") or []:
                    fn = call.get("function", {})
                    self.calls.append((str(fn.get("name")), parse_arguments(fn.get("arguments")) or {}))
                if content and not message.get("tool_calls"):
                    self.last_assistant = content
                    self.agent_texts.append(content)
            elif role == "user":
                self.identified = self.identified or identifies(content)
                self.last_user = content
                self.seen.append(content)
                self.user_texts.append(content)
            elif role == "tool":
                self.seen.append(content)
                self.outputs.append((self.calls[-1][0] if self.calls else "", _parsed(content)))
        for event in inputs.app_events:
            self.seen.append(json.dumps(event.arguments, ensure_ascii=False))
            self.seen.append(
                event.output
                if isinstance(event.output, str)
                else json.dumps(event.output, ensure_ascii=False)
            )
        self.events = [(e.name, dict(e.arguments), e.ok) for e in inputs.app_events]
        self.text = "\n".join(self.seen).casefold()

    def shows(self, value: str) -> bool:
        return value.casefold() in self.text


def _parsed(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content.strip()


_NAME_RE = re.compile(r"\b(?i:my name is|i am|i'm|this is)\s+([A-Z][a-z'-]+)\s+([A-Z][a-z'-]+)")
_FILLERS = r"(?:\s+(?:address|code|number|no\.?))?"


def _id_like(value: str) -> bool:
    return bool(grounded_values(value)) or "_" in value


def said_value(param: str, texts: list[str]) -> str | None:
    """The value the customer gave for ``param``: the id-like word after its name ("my zip code is
    28243", "phone number 555-123-2002", "user id: emma_kim_9957"), or a first / last name after
    "my name is" / "I am"."""
    if param in ("first_name", "last_name"):
        for text in reversed(texts):
            found = _NAME_RE.search(text)
            if found:
                return found.group(1 if param == "first_name" else 2)
        return None
    words = [w for w in param.split("_") if w]
    labels = [words, words[:-1]] if len(words) > 1 and words[-1] == "id" else [words]  # "reservation EHGLP3"
    for label in labels:
        name = r"\s+".join(re.escape(w) for w in label)
        pattern = re.compile(rf"\b{name}{_FILLERS}\s*(?:is|was|:|=)?\s*([#\w@.+-]*\w)", re.IGNORECASE)
        for text in reversed(texts):
            for found in pattern.finditer(text):
                if _id_like(found.group(1)):
                    return found.group(1)
    return None


def _is_id(param: str) -> bool:
    return param == "id" or param.endswith(("_id", "_ids"))


def _keys_for(param: str) -> set[str]:
    stem = param.removesuffix("_id")
    return {param, f"{param}s", f"{stem}s", f"{stem}_ids"}


def output_values(param: str, seen: _Transcript) -> list[str]:
    """Values tools returned for ``param``: under its key (or its plural) in a JSON result, or a bare
    id returned by a tool named after it (``find_user_id_by_email`` -> ``user_id``)."""
    keys = _keys_for(param)
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in keys:
                    items = (
                        item if isinstance(item, list) else list(item) if isinstance(item, dict) else [item]
                    )
                    found.extend(
                        str(v) for v in items if isinstance(v, str | int) and not isinstance(v, bool)
                    )
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for tool, value in seen.outputs:
        what = tool.split("_", 1)[-1]  # find_user_id_by_email -> user_id_by_email
        if isinstance(value, str) and what.startswith(param) and _id_like(value) and " " not in value:
            found.append(value)
        walk(value)
    return list(dict.fromkeys(found))


def _same(step: ReferenceStep, arguments: dict[str, Any]) -> bool:
    return all(arguments.get(k) == v for k, v in step.arguments.items())


def next_step(inputs: TrajectoryAgentInput, seen: _Transcript) -> int:
    """Index of the first reference step not yet done (matched in order)."""
    calls, events = 0, 0
    for i, step in enumerate(inputs.reference or []):
        if step.actor == "agent":
            found = next(
                (
                    j
                    for j in range(calls, len(seen.calls))
                    if seen.calls[j][0] == step.name and _same(step, seen.calls[j][1])
                ),
                None,
            )
            if found is None:
                return i
            calls = found + 1
        else:
            hit = next((j for j in range(events, len(seen.events)) if seen.events[j][0] == step.name), None)
            if hit is None:
                return i
            events = hit + 1
    return len(inputs.reference or [])


def _arguments_text(step: ReferenceStep) -> str:
    return ", ".join(f"{humanize(k)} {json.dumps(v, ensure_ascii=False)}" for k, v in step.arguments.items())


def _proposals(step: ReferenceStep) -> list[str]:
    shown = _arguments_text(step)
    return [p.format(action=humanize(step.name), shown=f" ({shown})" if shown else "") for p in PROPOSALS]


def _fresh(options: Sequence[str], seen: _Transcript) -> str:
    """The first of ``options`` the agent has not said yet (the last one, varied, once all are used)."""
    said = {" ".join(t.casefold().split()) for t in seen.agent_texts}
    for option in options:
        if " ".join(option.casefold().split()) not in said:
            return option
    return f"{options[-1]} ({len(seen.agent_texts) + 1})"


def _lookup(inputs: TrajectoryAgentInput, seen: _Transcript) -> AgentStep | None:
    """A look-up not made yet whose arguments the dialogue has shown (it may show the missing value):
    one needing no arguments, or one whose every required argument the customer said or -- for an
    id -- a tool returned (the customer's words first)."""
    called = [(name, args) for name, args in seen.calls]
    writes = {r.name for r in inputs.reference or [] if r.writes}
    for spec in inputs.tools:
        fn = spec.get("function", {})
        name = str(fn.get("name"))
        if name in writes or not name.startswith(READ_PREFIXES):
            continue
        required = list((fn.get("parameters") or {}).get("required") or [])
        options: list[list[str]] = []
        for param in required:
            said = said_value(param, seen.user_texts)
            returned = output_values(param, seen) if _is_id(param) else []  # not every date and airport
            options.append(list(dict.fromkeys([*([said] if said else []), *returned])))
        if not all(options):
            continue
        for values in itertools.islice(itertools.product(*options), MAX_LOOKUPS_PER_TOOL):
            arguments = dict(zip(required, values, strict=True))
            if (name, arguments) not in called:
                return AgentStep(
                    think=f"{name} may show what I need.",
                    tool_calls=[AgentToolCall(name=name, arguments=arguments)],
                )
    return None


def _careful_lookup(inputs: TrajectoryAgentInput, seen: _Transcript) -> AgentStep | None:
    """``_lookup``, but a look-up of the customer's data waits until they said who they are."""
    looked = _lookup(inputs, seen)
    if looked is not None and any(_personal(c.arguments) for c in looked.tool_calls):
        return _identify(inputs, seen) or looked
    return looked


def _ask_for(step: ReferenceStep, missing: list[str], seen: _Transcript) -> AgentStep:
    names = [humanize(k) for k, v in step.arguments.items() if any(m in grounded_values(v) for m in missing)]
    wanted = ", ".join(names) or "details"
    return AgentStep(
        think=f"{step.name} needs values not given yet.",
        message=_fresh([a.format(wanted=wanted) for a in ASKS], seen),
    )


def _personal(arguments: dict[str, Any]) -> list[str]:
    return [k for k, v in arguments.items() if PERSONAL_KEYS.search(k) and v not in (None, "")]


def _identify(inputs: TrajectoryAgentInput, seen: _Transcript) -> AgentStep | None:
    """Asks who the customer is when the next move would read their data before they said so
    (asked at most as often as there are wordings: a customer who never says is not asked forever)."""
    if seen.identified:
        return None
    asked = sum(1 for t in seen.agent_texts for form in IDENTIFY if t.startswith(form.split("{")[0]))
    if asked >= len(IDENTIFY):
        return None
    wanted = _identity_fields(inputs)
    return AgentStep(
        think="I must know who the customer is before I look at their data.",
        message=_fresh([form.format(wanted=wanted) for form in IDENTIFY], seen),
    )


IDENTITY_PARAMS = frozenset(
    {"user_id", "customer_id", "email", "phone_number", "first_name", "last_name", "zip", "full_name", "dob"}
)
"""What a customer says to be found: a look-up of a user or customer by these alone identifies them."""


def _identity_tools(inputs: TrajectoryAgentInput) -> list[list[str]]:
    """The required arguments of each look-up that finds a customer (by e-mail, by phone, by name
    and zip, or by user id: ``find_user_id_by_email``, ``get_customer_by_phone``, ``get_user_details``)."""
    found: list[list[str]] = []
    for spec in inputs.tools:
        fn = spec.get("function", {})
        name = str(fn.get("name"))
        required = list((fn.get("parameters") or {}).get("required") or [])
        who = "user" in name or "customer" in name
        if name.startswith(("find_", "get_")) and who and required and set(required) <= IDENTITY_PARAMS:
            found.append(required)
    return found


def _identity_fields(inputs: TrajectoryAgentInput) -> str:
    """What identifies a customer here, in words: the identity look-ups' arguments, else a user id."""
    fields = [" and ".join(humanize(p) for p in required) for required in _identity_tools(inputs)]
    return " or ".join(dict.fromkeys(f for f in fields if f)) or "user id"


def _undecided(step: ReferenceStep, chat: list[dict[str, Any]]) -> tuple[str, list[Any]] | None:
    """(argument, listed items) when the step would act on one of several items the customer has
    not singled out (``synthesis.eigen.realism.picked_without_asking``); None when nothing is ambiguous."""
    for key, value in step.arguments.items():
        picked = picked_without_asking(chat, value)
        if picked is not None:
            return key, picked[1]
    return None


def _candidate_ids(options: list[Any]) -> list[str]:
    return list(dict.fromkeys(i for option in options for i in item_ids(option)))


def _inspect(
    inputs: TrajectoryAgentInput, seen: _Transcript, key: str, options: list[Any]
) -> AgentStep | None:
    """A look at the next candidate's details (a read tool taking one id: ``get_details_by_id``,
    ``get_order_details``): what the customer said may single one out."""
    readers: list[tuple[str, str]] = []
    for spec in inputs.tools:
        fn = spec.get("function", {})
        name = str(fn.get("name"))
        required = list((fn.get("parameters") or {}).get("required") or [])
        if name.startswith(READ_PREFIXES) and len(required) == 1 and required[0] in ("id", key):
            readers.append((name, required[0]))
    readers.sort(key=lambda r: "detail" not in r[0])
    for name, param in readers:
        for candidate in _candidate_ids(options):
            if (name, {param: candidate}) not in seen.calls:
                return AgentStep(
                    think=f"Several match; {name} shows which one is the customer's.",
                    tool_calls=[AgentToolCall(name=name, arguments={param: candidate})],
                )
    return None


def _ask_which(key: str, options: list[Any], seen: _Transcript) -> AgentStep:
    shown = ", ".join(_candidate_ids(options)[:6])
    what = humanize(key).removesuffix(" id") + "s"
    return AgentStep(
        think=f"Several {what} match; the customer must say which.",
        message=_fresh([w.format(what=what, options=shown) for w in WHICH], seen),
    )


def guided_step(inputs: TrajectoryAgentInput) -> AgentStep:
    """The agent's next move towards the reference solution (see the module docstring)."""
    seen = _Transcript(inputs)
    reference = inputs.reference or []
    index = next_step(inputs, seen)
    if index >= len(reference):
        return _closing(inputs, reference, seen)
    step = reference[index]
    if step.actor == "user":  # the customer's own device: the agent says what to do, the app pre-fills it
        shown = _arguments_text(step)
        return AgentStep(
            think=f"The customer must {humanize(step.name)} on their side.",
            message=f"Please {humanize(step.name)}{f' ({shown})' if shown else ''} on your device and tell "
            "me what it shows.",
            user_action_requests=[AgentToolCall(name=step.name, arguments=dict(step.arguments))],
        )
    if _personal(step.arguments) or _identity_tools(inputs):  # who is asking, before acting for them
        asked = _identify(inputs, seen)
        if asked is not None:
            return asked
    missing = [v for v in grounded_values(step.arguments) if not seen.shows(v)]
    if missing:
        return _careful_lookup(inputs, seen) or _ask_for(step, missing, seen)
    if step.writes:
        choice = _undecided(step, list(inputs.messages))
        if choice is not None:  # look at each candidate first: one may match what the customer said
            key, options = choice
            return (
                _inspect(inputs, seen, key, options)
                or _careful_lookup(inputs, seen)
                or _ask_which(key, options, seen)
            )
        proposals = _proposals(step)
        if seen.last_assistant not in proposals or not YES_RE.search(seen.last_user):
            return AgentStep(
                think=f"{step.name} changes records: ask first.", message=_fresh(proposals, seen)
            )
    return AgentStep(
        think=f"Next: {step.name}.",
        tool_calls=[AgentToolCall(name=step.name, arguments=dict(step.arguments))],
    )


def _closing(inputs: TrajectoryAgentInput, reference: list[ReferenceStep], seen: _Transcript) -> AgentStep:
    """The last message: the facts to tell, or -- when the solution changes nothing -- a refusal."""
    facts = "; ".join(f.strip() for f in inputs.reference_info if f.strip())
    if seen.calls and seen.calls[-1][0].startswith("transfer"):
        texts = [
            "I have transferred you to a human agent, who will take it from here.",
            "A human agent will continue with you now; I have passed on the details.",
        ]
        return AgentStep(think="Transferred.", message=_fresh(texts, seen))
    if facts:
        texts = [f"Here is what you asked about: {facts}."]
    elif any(r.writes or r.actor == "user" for r in reference):
        texts = ["Everything you asked for is taken care of."]
    else:  # nothing to do: read what the request is about first, then decline it
        looked = (_identify(inputs, seen) if _identity_tools(inputs) else None) or _careful_lookup(
            inputs, seen
        )
        if looked is not None:
            return looked
        texts = list(REFUSALS)
    options = [f"{text} {closing}" for text in texts for closing in CLOSINGS]
    return AgentStep(think="The solution is complete.", message=_fresh(options, seen))

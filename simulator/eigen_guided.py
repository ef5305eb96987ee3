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
3. a writing agent step is proposed ("Shall I proceed ...?") and run only once the customer's last
   message says yes to that very proposal;
4. a user step is asked for in words, with the structured hint (``user_action_requests``): its
   values are settings the agent prescribes (a network mode), not facts to ground;
5. when every step is done: the facts to tell (``reference_info``), or -- when the solution changes
   nothing and tells nothing -- the look-ups the request allows, then a refusal; and the closing
   question.

Besides the facts the reference says to tell, it states only values the dialogue has shown (a
proposal names the write's arguments once they are grounded), and it never mentions the reference.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from arena.llm.replies import parse_arguments
from simulator.user_acts import humanize
from synthesis.eigen.roles.dialogs import (
    YES_RE,
    AgentStep,
    AgentToolCall,
    ReferenceStep,
    TrajectoryAgentInput,
    grounded_values,
)

CLOSING = "Is there anything else I can help you with?"
PROPOSAL = "Shall I proceed?"
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
        for message in inputs.messages[1:]:  # the system message is the policy, not the conversation
            role, content = message.get("role"), str(message.get("content") or "")
            if role == "assistant":
                for call in message.get("tool_calls") or []:
                    fn = call.get("function", {})
                    self.calls.append((str(fn.get("name")), parse_arguments(fn.get("arguments")) or {}))
                if content and not message.get("tool_calls"):
                    self.last_assistant = content
            elif role == "user":
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


def _proposal(step: ReferenceStep) -> str:
    shown = _arguments_text(step)
    return f"I can now {humanize(step.name)}" + (f" ({shown})" if shown else "") + f". {PROPOSAL}"


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


def _ask_for(step: ReferenceStep, missing: list[str]) -> AgentStep:
    names = [humanize(k) for k, v in step.arguments.items() if any(m in grounded_values(v) for m in missing)]
    wanted = ", ".join(names) or "the details"
    return AgentStep(
        think=f"{step.name} needs values not given yet.", message=f"Could you tell me the {wanted}?"
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
    missing = [v for v in grounded_values(step.arguments) if not seen.shows(v)]
    if missing:
        return _lookup(inputs, seen) or _ask_for(step, missing)
    if step.writes:
        proposal = _proposal(step)
        if seen.last_assistant != proposal or not YES_RE.search(seen.last_user):
            return AgentStep(think=f"{step.name} changes records: ask first.", message=proposal)
    return AgentStep(
        think=f"Next: {step.name}.",
        tool_calls=[AgentToolCall(name=step.name, arguments=dict(step.arguments))],
    )


def _closing(inputs: TrajectoryAgentInput, reference: list[ReferenceStep], seen: _Transcript) -> AgentStep:
    """The last message: the facts to tell, or -- when the solution changes nothing -- a refusal."""
    facts = "; ".join(f.strip() for f in inputs.reference_info if f.strip())
    if facts:
        text = f"Here is what you asked about: {facts}."
    elif any(r.writes or r.actor == "user" for r in reference):
        text = "Everything you asked for is taken care of."
    else:  # nothing to do: read what the request is about first, then decline it
        looked = _lookup(inputs, seen)
        if looked is not None:
            return looked
        text = "I'm sorry, but I cannot do that under our policy."
    return AgentStep(think="The solution is complete.", message=f"{text} {CLOSING}")

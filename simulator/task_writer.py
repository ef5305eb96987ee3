"""The task writer: a task text whose solution follows a given tool chain, and the values it states.

Each step is an imperative clause drawn from the tool's description
(``purpose_clause``), followed by phrases stating argument values drawn from
``simulator.values``. The user states the first tool's arguments and every
later non-identifier argument that no earlier output provides; identifiers of
later steps are left to earlier outputs (``plan_steps``). Stated values are
returned as slots and occur verbatim in the text (``write_task``).

Used by the chain rules (``simulator.chains``) and the server-only task rules
(``simulator.tasks``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from arena.records.sft import ServerRef, Slot
from arena.records.tools import NormalizedTool
from simulator.text import VERBS, capitalise, humanize, imperative, join_list, name_words, sentences_of
from simulator.values import ValueBook, kind_of, user_knows
from synthesis.envs.text import fold
from synthesis.sft.roles.chains import TaskDraft
from synthesis.sft.tool_links import (
    Argument,
    arguments,
    entity_of,
    is_identifier,
    json_types,
    output_fields,
    output_provider,
    snake,
)

OPTIONAL_RATE = 0.3
"""Chance that the user also states a simple optional argument (an enum, a count, a limit)."""

# ============================================================================ purpose clauses

_LEADING = re.compile(
    r"^(?:this (?:tool|function|endpoint|api)(?: will| can)?|tool to|used to|use (?:this|it) to|"
    r"allows? (?:you|users|the user) to|can be used to|helps? (?:you )?(?:to )?|lets? you)\s+",
    re.IGNORECASE,
)


def purpose_clause(tool: NormalizedTool) -> str:
    """An imperative clause saying what ``tool`` does, from its description (or its name).

    "Search hotels in a city ..., cheapest first." -> "search hotels in a city ...";
    "Full catalogue record of a book: author, ..." -> "get the full catalogue record of a book";
    "How many copies of a book are free ..." -> "find out how many copies of a book are free ...".
    """
    sentences = sentences_of(tool.function.description)
    clause = sentences[0] if sentences else ""
    if len(clause.split()) <= 3 and len(sentences) > 1:  # "Get a booking." then the real summary
        clause = sentences[1]
    clause = re.sub(r"\s*\([^)]*\)", "", clause)  # parentheticals
    clause = re.sub(r",?\s+by (?:its|their) [\w-]*(?:identifier|id|name)\b", "", clause)
    clause = _LEADING.sub("", re.split(r";|:\s| - | — ", clause)[0]).strip(" .:,")
    words = clause.split()
    if len(words) > 1 and words[0].lower().endswith("ly") and imperative(words[1]) in VERBS:
        words = words[1:]  # "Permanently delete a note" -> "delete a note"
    if not words:
        return _name_clause(tool.function.name)
    if imperative(words[0]) in VERBS:
        words[0] = imperative(words[0])
        return _trim(words, 12)
    if words[0].lower() in ("how", "what", "which", "whether", "where", "when", "who"):
        return "find out " + _trim([words[0].lower(), *words[1:]], 14)
    phrase = _trim(
        [words[0].lower() if not words[0].isupper() else words[0], *words[1:]], 10, first_comma=True
    )
    named = name_words(tool.function.name)
    if named and named[0] in VERBS and named[0] not in ("get", "fetch", "retrieve", "read", "show", "list"):
        return f"{_name_clause(tool.function.name)} ({phrase})"
    determiner = phrase.split()[0] in ("a", "an", "the", "all", "every", "each", "one", "some", "any", "my")
    return f"get {'' if determiner else 'the '}{phrase}"


_DANGLING = frozenset("a an the and or of for to in on at by with from into as than that which".split())


def _trim(words: list[str], limit: int, first_comma: bool = False) -> str:
    """At most about ``limit`` words: trailing comma segments go first, lists inside stay."""
    if first_comma or len(words) > limit:
        cut = [i for i, w in enumerate(words) if w.endswith(",") and (first_comma or i >= 6)]
        if cut:
            words = words[: (cut[0] if first_comma else cut[-1]) + 1]
    words = words[: limit + 8]
    while words and words[-1].lower().strip(",") in _DANGLING and len(words) > 2:
        words.pop()
    return " ".join(words).rstrip(",")


def _name_clause(name: str) -> str:
    words = name_words(name)
    if words and words[0] in VERBS:
        rest = " ".join(words[1:])
        return f"{words[0]} the {rest}".strip() if rest else words[0]
    return f"get the {' '.join(words)}"


def refer_back(clause: str, entities: Sequence[str]) -> str:
    """Point the clause at results of earlier steps: ``of a hotel`` -> ``of that hotel``."""
    for entity in entities:
        pattern = re.compile(rf"\b(?:a|an|one|the)\s+((?:\w+\s+){{0,2}}?){re.escape(entity)}(s?)\b", re.I)
        clause = pattern.sub(rf"that \1{entity}", clause, count=1)
    return clause


# ============================================================================== phrases


def phrase(arg: Argument, value: str, rng: random.Random) -> str:
    """A phrase stating ``value`` for ``arg``; the value occurs in it verbatim."""
    kind, label = kind_of(arg), humanize(arg.name)
    options: dict[str, tuple[str, ...]] = {
        "city": ("in {v}", "in {v}", "for the city {v}"),
        "date": ("on {v}", "{label} {v}"),
        "date_end": ("until {v}", "{label} {v}"),
        "datetime": ("at {v}",),
        "time": ("at {v}",),
        "people": ("for {v} people", "for a party of {v}") if "guest" not in label else ("for {v} guests",),
        "days": ("for the next {v} days", "covering {v} days"),
        "years": ("over {v} years",),
        "months": ("over {v} months", "for a term of {v} months"),
        "limit": ("showing at most {v} results",),
        "person": ("under the name {v}", "for {v}"),
        "email": ("e-mail {v}", "(contact: {v})"),
        "phone": ("phone {v}",),
        "title": ('titled "{v}"', 'called "{v}"'),
        "content": ('with the text "{v}"', 'saying "{v}"'),
        "tag": ('tag "{v}"', 'with the tag "{v}"'),
        "query": ('matching "{v}"', 'for "{v}"'),
        "pattern": ("matching the pattern {v}",),
        "symbol": ("ticker {v}", "for {v}"),
        "identifier": ("{label} {v}", "my {entity} {v}"),
    }
    choices = options.get(kind, ("{label} {v}", "{label} {v}", "with {label} {v}"))
    if kind in ("array", "text") and not re.search(r"[\d/@]", value):
        choices = ('{label} "{v}"', 'with {label} "{v}"')  # quotes mark where a free-text value ends
    if kind == "currency":  # from_currency / base_currency -> "from EUR"; to / quote -> "into EUR"
        role = snake(arg.name).split("_")[0]
        direction = {"from": "from", "base": "from", "source": "from", "to": "into", "quote": "into"}
        choices = (f"{direction.get(role, 'in')} {{v}}",)
    entity = entity_of(arg.name) or label
    return rng.choice(choices).format(v=value, label=label, entity=entity)


# ============================================================================ task plans


@dataclass
class Step:
    """What a task says about one chain step."""

    tool: NormalizedTool
    stated: list[tuple[Argument, str]] = field(default_factory=list)
    fed: list[tuple[Argument, str]] = field(default_factory=list)
    """Arguments an earlier output provides, with the provider ('i:tool.path')."""
    missing: list[Argument] = field(default_factory=list)
    """Identifier arguments neither stated nor provided (the user cannot know them)."""


def plan_steps(
    chain: Sequence[NormalizedTool], book: ValueBook, optional_rate: float = OPTIONAL_RATE
) -> list[Step]:
    """Decide per step which arguments the user states and which earlier outputs provide."""
    steps: list[Step] = []
    for i, tool in enumerate(chain):
        step = Step(tool)
        for arg in arguments(tool):
            provider = output_provider(chain, i, arg) if i and takes_output(tool, arg) else None
            if provider is not None and arg.required and _fresh_provider(step, provider, arg):
                step.fed.append((arg, provider))
                continue
            if provider is not None and not arg.required:
                continue
            if arg.required:
                if i and not user_knows(arg):
                    step.missing.append(arg)
                else:
                    step.stated.append((arg, book.value(arg, tool)))
            elif _worth_stating(arg) and book.rng.random() < optional_rate:
                step.stated.append((arg, book.value(arg, tool)))
        _say_what_changes(step, book)
        steps.append(step)
    return steps


CREATE_VERBS = frozenset("create add new post write register make compose send upload insert".split())


def takes_output(tool: NormalizedTool, arg: Argument) -> bool:
    """Whether the task lets an earlier output supply ``arg``.

    Identifiers always; other values too (coordinates from a geocoder, a currency
    from a quote), except the content of something the user creates: a new note's
    title or a file's text is the user's to say, not a copy of whatever came back.
    """
    if is_identifier(arg.name, arg.schema):
        return True
    return not set(name_words(tool.function.name)) & CREATE_VERBS


UPDATE_VERBS = frozenset("update edit modify set change rename tag patch label attach".split())


def _say_what_changes(step: Step, book: ValueBook) -> None:
    """An update whose required arguments are only identifiers states one new value (a title,
    the content, a tag): "update note X" alone is not a request anyone makes."""
    if not set(name_words(step.tool.function.name)) & UPDATE_VERBS:
        return
    if any(not is_identifier(a.name, a.schema) for a, _ in step.stated):
        return
    fed = {a.name for a, _ in step.fed}
    for arg in arguments(step.tool):
        if (
            arg.required
            or arg.name in fed
            or not user_knows(arg)
            or kind_of(arg) in ("boolean", "identifier")
        ):
            continue
        step.stated.append((arg, book.value(arg, step.tool)))
        return


def _fresh_provider(step: Step, provider: str, arg: Argument) -> bool:
    """One output field feeds one argument of a step; a second one (base and quote currency
    both matching ``currency``) is a value the user states, unless it is an identifier."""
    return is_identifier(arg.name, arg.schema) or all(p != provider for _, p in step.fed)


def _worth_stating(arg: Argument) -> bool:
    """Optional arguments a user commonly adds: a choice, a count, a price cap, a period."""
    return kind_of(arg) in ("enum", "people", "limit", "days", "money", "quantity")


def slots_of(steps: Sequence[Step]) -> list[Slot]:
    return [
        Slot(tool=step.tool.function.name, argument=arg.name, value=value)
        for step in steps
        for arg, value in step.stated
    ]


# ============================================================================= task texts

CONTEXTS: dict[str, tuple[str, ...]] = {
    "travel": ("I'm planning a short trip.", "We're travelling for a friend's wedding."),
    "food": ("We're going out for dinner with friends.", "I'm organising a team lunch."),
    "dining": ("We're going out for dinner with friends.",),
    "finance": ("I'm reviewing my investments this week.", "I'm preparing my budget for next year."),
    "weather": ("I'm planning an outdoor weekend.", "I have a long bike ride coming up."),
    "commerce": ("I'm shopping for a birthday present.", "I need to restock my home office."),
    "productivity": ("I'm getting my notes in order before a busy week.",),
    "file": ("I'm tidying up my workspace.", "I'm preparing a report for a meeting."),
}
GENERIC_CONTEXTS = ("I have a few things to sort out today.", "Quick request for today.")
OPENERS = ("Please", "Could you", "Can you", "I need you to", "Help me")


def context_sentence(server: ServerRef, rng: random.Random) -> str:
    key = fold(f"{server.domain} {server.name}")
    for word, options in CONTEXTS.items():
        if word in key:
            return rng.choice(options)
    return rng.choice(GENERIC_CONTEXTS)


def _pick_hint(fed: Sequence[tuple[Argument, str]], chain: Sequence[NormalizedTool]) -> str:
    """Which earlier result to use: the cheapest, the best rated or the first one."""
    for _arg, provider in fed:
        index, _, path = provider.partition(":")
        if "[]" not in path:
            continue
        tool = chain[int(index)]
        container = path[len(tool.function.name) + 1 :].split("[]")[0]
        siblings = {f.name for f in output_fields(tool) if f.path.startswith(f"{container}[]")}
        if siblings & {"price", "price_per_night", "cost", "total"}:
            return "the cheapest one"
        if "rating" in siblings:
            return "the best-rated one"
        return "the first one"
    return ""


def step_sentence(
    step: Step, index: int, total: int, chain: Sequence[NormalizedTool], rng: random.Random
) -> str:
    """One step of the request: connector, purpose clause, value phrases."""
    entities = [e for arg, _ in step.fed if (e := entity_of(arg.name))]
    clause = refer_back(purpose_clause(step.tool), entities) if index else purpose_clause(step.tool)
    if entities and not any(re.search(rf"\b{re.escape(e)}s?\b", clause) for e in entities):
        clause += f" of that {entities[0]}"  # "check the availability" -> "... of that book"
    parts = _value_phrases(step, rng)
    hint = _pick_hint(step.fed, chain) if index else ""
    body = clause
    if parts:
        body += rng.choice((": ", " — ", ", ")) + join_list(parts)
    if hint:
        body = f"taking {hint}, {body}"
    if total == 1:
        return body
    if index == 0:
        return rng.choice(("first ", "")) + body
    if index == total - 1:
        return rng.choice(("finally ", "then ", "and after that ")) + body
    return rng.choice(("then ", "next ", "after that ")) + body


def _value_phrases(step: Step, rng: random.Random) -> list[str]:
    stated = list(step.stated)
    parts: list[str] = []
    starts = [(a, v) for a, v in stated if kind_of(a) == "date"]
    ends = [(a, v) for a, v in stated if kind_of(a) == "date_end"]
    if len(starts) == 1 and len(ends) == 1:  # a period: "from X to Y"
        parts.append(f"from {starts[0][1]} to {ends[0][1]}")
        stated = [s for s in stated if s not in (starts[0], ends[0])]
    parts += [phrase(arg, value, rng) for arg, value in stated]
    return parts


def closing_sentence(step: Step, rng: random.Random) -> str:
    """Ask for the key fields of the last step's output (not timestamps, flags or what the user said)."""
    said = {snake(a.name) for a, _ in step.stated}
    fields = [
        f
        for f in output_fields(step.tool)
        if "." not in f.path and not f.name.endswith(("_at", "items")) and f.name not in said
    ]
    fields = [f for f in fields if "boolean" not in json_types(f.schema)]
    fields = [f for f in fields if json_types(f.schema) & {"string", "number", "integer"}] or fields
    if not fields or rng.random() < 0.4:
        return ""
    names = [humanize(f.name) for f in fields[:2]]
    return rng.choice(
        ("Tell me the {x} at the end.", "Let me know the {x}.", "I mainly care about the {x}.")
    ).format(x=" and ".join(names))


def compose_task(
    server: ServerRef,
    chain: Sequence[NormalizedTool],
    steps: Sequence[Step],
    rng: random.Random,
    style: int,
    openers: Sequence[str] = OPENERS,
) -> str:
    """The task text over planned steps, in one of a few styles."""
    sentences = [step_sentence(s, i, len(steps), chain, rng) for i, s in enumerate(steps)]
    opener = rng.choice(openers)
    question = opener.split()[0] in ("Could", "Can", "Would", "Is")
    if style % 3 == 1:  # one sentence per step
        intro = rng.choice(("Here's what I need.", "Please help me with this.", "I need some help."))
        body = intro + " " + " ".join(capitalise(s.rstrip(".")) + "." for s in sentences)
    else:  # one flowing request, steps joined by commas or semicolons
        glue = ", " if style % 3 == 0 else "; "
        body = f"{opener} {glue.join(sentences)}" + ("?" if question else ".")
    context = context_sentence(server, rng) if rng.random() < 0.6 else ""
    closing = closing_sentence(steps[-1], rng) if steps else ""
    return " ".join(p for p in (context, capitalise(body), closing) if p)


def write_task(
    server: ServerRef, chain: Sequence[NormalizedTool], rng: random.Random, style: int
) -> TaskDraft:
    """A task whose solution follows ``chain``, and the values it states."""
    book = ValueBook(rng)
    steps = plan_steps(chain, book)
    return TaskDraft(text=compose_task(server, chain, steps, rng, style), slots=slots_of(steps))

"""Rules for the chain roles: chain synthesis, chain-conditioned tasks, coherence (ASTRA §2.1.2).

Everything here works from the role input alone (the server's tool schemas,
the chain, the task text) and the seeded ``random.Random``:

- chains grow along type-compatible output -> input links
  (``synthesis.sft.tool_links``: an earlier tool's response field feeds a later
  tool's required argument, e.g. ``hotels[].hotel_id`` -> ``hotel_id``), starting
  from a tool whose required arguments a user can state;
- task texts come from templates over the schemas (the task writer,
  ``simulator.task_writer``): each step is an imperative clause drawn from the
  tool's description, followed by phrases stating argument values generated
  from the argument schemas (the value generator, ``simulator.values``: enums,
  formats, ranges, examples in descriptions, name conventions). The user states
  the first tool's arguments and every later non-identifier argument that no
  earlier output provides; identifiers of later steps are left to earlier
  outputs. Stated values are returned as slots and occur verbatim in the text;
- coherence is judged from the task text and the chain's docs.

``simulator.tasks`` uses the value generator and the task writer too, and the
chain-building predicates below (``can_follow``, ``user_can_start``,
``acts_on_deleted``) and ``nonsense_problem``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.records.sft import ServerRef
from arena.records.tools import NormalizedTool
from simulator.task_writer import purpose_clause, takes_output, write_task
from simulator.text import first_sentences, imperative, name_terms, name_words, text_stems, tool_terms
from simulator.values import user_knows
from synthesis.sft.lang import count_words, detect_language
from synthesis.sft.roles.chains import (
    CHAIN_COHERENCE,
    CHAIN_SYNTHESIS,
    TASK_FROM_CHAIN,
    ChainSynthesisInput,
    ChainTaskInput,
    CoherenceInput,
    CoherenceVerdict,
    SynthesizedChain,
    TaskDraft,
)
from synthesis.sft.tool_links import entity_of, feeding_fields, required_arguments

# ============================================================================ chain building


def _sorted_tools(server: ServerRef) -> list[NormalizedTool]:
    return sorted(server.tools, key=lambda t: t.function.name)


def fed_arguments(chain: Sequence[NormalizedTool], tool: NormalizedTool) -> set[str]:
    """Required arguments of ``tool`` the task takes from outputs of ``chain`` (see ``takes_output``)."""
    return {
        a.name
        for a in required_arguments(tool)
        if takes_output(tool, a) and any(feeding_fields(p, a) for p in chain)
    }


def can_follow(chain: Sequence[NormalizedTool], tool: NormalizedTool) -> bool:
    """``tool`` consumes an output of ``chain`` and needs no identifier the user would have to know."""
    fed = fed_arguments(chain, tool)
    if not fed:
        return False
    return all(a.name in fed for a in required_arguments(tool) if not user_knows(a))


def user_can_start(tool: NormalizedTool) -> bool:
    """Every required argument is something a user can state (no system identifiers)."""
    return all(user_knows(a) for a in required_arguments(tool))


def start_order(server: ServerRef) -> list[NormalizedTool]:
    """Candidate first tools in a server-specific order (variants rotate through it).

    Tools a user can start with and that lead somewhere come first; the order is
    a permutation seeded by the server id, independent of the call's rng, so
    consecutive variants start from different tools.
    """
    tools = _sorted_tools(server)
    startable = [t for t in tools if user_can_start(t)]
    leading = [t for t in startable if any(can_follow([t], o) for o in tools if o is not t)]
    pool = leading or startable or tools
    random.Random(server.server_id).shuffle(pool)
    return pool


def build_chain(server: ServerRef, max_length: int, variant: int, rng: random.Random) -> list[NormalizedTool]:
    """A chain along output -> input links, of length in [min(2, max_length), max_length]."""
    tools = _sorted_tools(server)
    order = start_order(server)
    chain = [order[variant % len(order)]]
    target = rng.randint(min(2, max_length), max_length)
    while len(chain) < target:
        candidates = [
            t
            for t in tools
            if t not in chain and can_follow(chain, t) and acts_on_deleted([*chain, t]) is None
        ]
        if not candidates:
            break
        # Prefer a tool that consumes the latest step's output: a real data flow, not a detour.
        weights = [3.0 if fed_arguments(chain[-1:], t) else 1.0 for t in candidates]
        chain.append(rng.choices(candidates, weights)[0])
    return chain


# ================================================================================= rules


def chain_synthesis(inputs: BaseModel, rng: random.Random) -> SynthesizedChain:
    assert isinstance(inputs, ChainSynthesisInput)
    if not inputs.server.tools:
        raise Undecidable("the server has no tools to chain")
    chain = build_chain(inputs.server, inputs.max_length, inputs.variant, rng)
    draft = write_task(inputs.server, chain, rng, inputs.variant)
    return SynthesizedChain(task=draft.text, chain=[t.function.name for t in chain], slots=draft.slots)


def task_from_chain(inputs: BaseModel, rng: random.Random) -> TaskDraft:
    assert isinstance(inputs, ChainTaskInput)
    by_name = {t.function.name: t for t in inputs.server.tools}
    unknown = [name for name in inputs.chain if name not in by_name]
    if unknown:
        raise Undecidable(f"the chain names tools the server does not have: {unknown}")
    chain = [by_name[name] for name in inputs.chain]
    return write_task(inputs.server, chain, rng, inputs.variant)


# ------------------------------------------------------------------------------ coherence

PLACEHOLDER = re.compile(
    r"\{[^{}]*\}|(?i:\[(?:insert|placeholder|todo|your)[^\]]*\])|<[a-z_]+>|(?i:lorem ipsum)"
    r"|(?<![\w/.])(?:TODO|TBD|XXX)(?![\w.])"
)
"""Template leftovers: braces, [insert ...], <slot>, lorem ipsum, TODO."""
STATE_CHANGING = frozenset(
    "create add update delete remove cancel reserve book write move set post put upload checkout place "
    "submit pay transfer attach detach replace append rename register subscribe send insert edit modify".split()
)


def nonsense_problem(text: str) -> str | None:
    """Why ``text`` is not a usable request (None when it is)."""
    words = count_words(text)  # CJK characters count as words: those scripts use no spaces
    if words < 4:
        return f"the task has only {words} word(s)"
    leftover = PLACEHOLDER.search(text)
    if leftover:
        return f"the task contains a template placeholder ({leftover.group(0)!r})"
    visible = [ch for ch in text if not ch.isspace()]
    if sum(ch.isalpha() for ch in visible) < 0.5 * len(visible):
        return "the task is mostly symbols and numbers, not a request"
    tokens = text.casefold().split()
    if len(tokens) >= 8 and max(tokens.count(t) for t in set(tokens)) > 0.4 * len(tokens):
        return "the task repeats one word over and over"
    return None


def _is_state_changing(tool: NormalizedTool) -> bool:
    words = name_words(tool.function.name)
    first = imperative(tool.function.description.split()[0]) if tool.function.description.split() else ""
    return bool(set(words) & STATE_CHANGING) or first in STATE_CHANGING


def pointless_repeat(chain: Sequence[NormalizedTool]) -> str | None:
    """A tool called again with nothing new in between (consecutive, or no write and no new input)."""
    names = [t.function.name for t in chain]
    for j, tool in enumerate(chain):
        if tool.function.name not in names[:j]:
            continue
        i = max(k for k in range(j) if names[k] == tool.function.name)
        between = chain[i + 1 : j]
        if not between:
            return f"{tool.function.name} is called twice in a row"
        feeds_new = any(feeding_fields(b, a) for b in between for a in required_arguments(tool))
        if not feeds_new and not any(_is_state_changing(b) for b in between):
            return f"{tool.function.name} is repeated although nothing in between changes its inputs or state"
    return None


DESTRUCTIVE = frozenset(("delete", "remove", "destroy", "purge", "erase"))


def acts_on_deleted(chain: Sequence[NormalizedTool]) -> str | None:
    """A step that needs an entity an earlier step deleted, with no new one produced in between
    (``delete_note`` then ``update_note``; but ``delete_note``, ``create_note``, ``update_note`` is fine)."""
    deleted: dict[str, int] = {}  # entity -> step that deleted it
    for j, tool in enumerate(chain):
        for arg in required_arguments(tool):
            entity = entity_of(arg.name)
            if entity not in deleted:
                continue
            since = chain[deleted[entity] + 1 : j]
            if not any(feeding_fields(t, arg) for t in since):
                return f"{tool.function.name} needs the {entity} that {chain[deleted[entity]].function.name} deleted"
        if set(name_words(tool.function.name)) & DESTRUCTIVE:
            for arg in required_arguments(tool):
                if (entity := entity_of(arg.name)) is not None:
                    deleted[entity] = j
    return None


def unreflected_tools(task: str, chain: Sequence[NormalizedTool]) -> list[str]:
    """Tools whose purpose no word of the task reflects.

    A tool is reflected when the task contains a stem of its name or of the start
    of its description that is not just a word of another chain tool's *name*
    (``hotel`` cannot show that a details lookup is wanted when ``searchHotels``
    is also in the chain).
    """
    words = text_stems(task)
    missing: list[str] = []
    distinct = {t.function.name: t for t in chain}
    for name, tool in distinct.items():
        others: set[str] = set()
        for other_name, other in distinct.items():
            if other_name != name:
                others |= name_terms(other)
        own = tool_terms(tool)
        distinctive = own - others or own
        if not distinctive & words:
            missing.append(name)
    return missing


def chain_coherence(inputs: BaseModel, rng: random.Random) -> CoherenceVerdict:
    assert isinstance(inputs, CoherenceInput)
    task = inputs.task.strip()
    if not task or not inputs.chain:
        raise Undecidable("empty task or empty chain: nothing to judge")
    problem = nonsense_problem(task)
    if problem:
        return CoherenceVerdict(coherent=False, reason=f"Ill-posed task: {problem}.")
    repeat = pointless_repeat(inputs.chain)
    if repeat:
        return CoherenceVerdict(coherent=False, reason=f"Redundant step: {repeat}.")
    gone = acts_on_deleted(inputs.chain)
    if gone:
        return CoherenceVerdict(coherent=False, reason=f"Impossible order: {gone}.")
    docs = " ".join(first_sentences(t.function.description) for t in inputs.chain)
    task_lang, docs_lang = detect_language(task), detect_language(docs)
    if task_lang != docs_lang:
        return CoherenceVerdict(
            coherent=True,
            reason=f"Well-formed request without redundant steps; task ({task_lang}) and tool docs "
            f"({docs_lang}) differ in language, so tool purposes were not matched word by word.",
        )
    missing = unreflected_tools(task, inputs.chain)
    if missing:
        return CoherenceVerdict(
            coherent=False,
            reason=f"The task never calls for what {', '.join(missing)} does "
            f"({'; '.join(purpose_clause(t) for t in inputs.chain if t.function.name in missing)}).",
        )
    return CoherenceVerdict(
        coherent=True, reason="Every tool serves a need the task states, with no redundant step."
    )


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    CHAIN_SYNTHESIS.name: chain_synthesis,
    TASK_FROM_CHAIN.name: task_from_chain,
    CHAIN_COHERENCE.name: chain_coherence,
}

"""Rules for QA synthesis over prose (ASTRA §2.2.1 for a knowledge base of passages).

The passages are chunked (``synthesis.envs.passages``) and read for facts (``simulator.facts``); the facts
form a graph (a fact's value may be another fact's subject), and instances walk it the way
``simulator.qa`` walks tables:

- ``single_hop``: one fact; ``multi_hop``: a chain of facts (born in Warsaw -> capital of Poland),
  q_i naming a_{i-1};
- ``parallel_single_hop`` / ``parallel_multi_hop``: the same attribute (path) for 2-3 subjects,
  then a no-tool leaf (compare numbers, or "same").

Every tool step is grounded in the chunk that states its fact (passage id, entity, attribute,
quote), its answer copied verbatim from the sentence. Flaws are drawn as for tables, from the kinds
that need no table (``PROSE_FLAWS``). A knowledge base with tables is synthesised by
``simulator.qa``; this module registers the ``qa_synthesis`` rule that picks between the two.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.records.envs import STRUCTURES, Grounding, Structure
from simulator.facts import Fact, extract_facts
from simulator.knowledge import Kb, to_number
from simulator.qa import (
    _FALLBACK,
    FREE_FORM,
    Infeasible,
    Instance,
    Step,
    flawed,
    leaf_question,
    synthesize_instance,
    to_draft,
)
from simulator.text import join_list
from synthesis.envs.passages import chunk_passages
from synthesis.envs.roles.qa import QA_SYNTHESIS, QaDraft, QaSynthesisInput
from synthesis.envs.text import norm

PROSE_FLAWS: tuple[str, ...] = ("inner_no_tool", "missing_dependency", "extra_dependency", "misordered")
"""Flaw kinds that do not need a table (the others draw wrong values from table columns)."""
MAX_CHAIN = 4
"""Longest fact chain walked."""

Chain = tuple[Fact, ...]


class FactGraph:
    """The facts of a knowledge base's passages, by subject, and the chains they form."""

    def __init__(self, passages: Sequence[str]) -> None:
        self.facts = extract_facts(chunk_passages(passages))
        self.by_subject: dict[str, list[Fact]] = {}
        for fact in self.facts:
            self.by_subject.setdefault(norm(fact.subject), []).append(fact)

    def chains(self, length: int) -> list[Chain]:
        """Every chain of ``length`` facts, each fact's value the next one's subject, no subject twice."""
        out: list[Chain] = []

        def grow(chain: Chain) -> None:
            if len(chain) == length:
                out.append(chain)
                return
            seen = {norm(f.subject) for f in chain}
            for nxt in self.by_subject.get(norm(chain[-1].value), []):
                if norm(nxt.subject) not in seen and norm(nxt.value) not in seen:
                    grow((*chain, nxt))

        for fact in self.facts:
            grow((fact,))
        return out

    def longest(self) -> int:
        return max((n for n in range(1, MAX_CHAIN + 1) if self.chains(n)), default=0)


def path_phrase(chain: Chain) -> str:
    """``country of the birthplace`` for (birthplace, country)."""
    return " of the ".join(f.attribute for f in reversed(chain))


def lookup_question(fact: Fact) -> str:
    return f"What is the {fact.attribute} of {fact.subject}?"


def grounding(fact: Fact) -> Grounding:
    return Grounding(key=fact.subject, column=fact.attribute, passage=fact.chunk, quote=fact.sentence)


def walk(chains: Sequence[Chain]) -> tuple[list[Step], list[Step]]:
    """The lookup steps of ``chains`` (each step depends on the previous one of its chain), and their ends."""
    steps: list[Step] = []
    ends: list[Step] = []
    for chain in chains:
        previous: Step | None = None
        for fact in chain:
            step = Step(
                sid=len(steps) + 1,
                question=lookup_question(fact),
                answer=fact.value,
                deps=[previous.sid] if previous else [],
                grounding=grounding(fact),
            )
            steps.append(step)
            previous = step
        assert previous is not None
        ends.append(previous)
    return steps, ends


def single(chain: Chain, structure: Structure) -> Instance:
    steps, ends = walk([chain])
    question = f"What is the {path_phrase(chain)} of {chain[0].subject}?"
    return Instance(question, ends[0].answer, structure, steps)


def parallel(chains: Sequence[Chain], structure: Structure, op: str, direction: str | None) -> Instance:
    steps, ends = walk(chains)
    subjects = [c[0].subject for c in chains]
    phrase = path_phrase(chains[0])
    leaf: dict[str, Any] = {
        "op": op,
        "entity": "one",
        "column": phrase,
        "keys": subjects,
        "direction": direction,
        "target": None,
    }
    leaf_q, leaf_a = leaf_question(leaf, [e.answer for e in ends])
    steps.append(Step(len(steps) + 1, leaf_q, leaf_a, [e.sid for e in ends], None, op, leaf))
    if op == "compare":
        question = f"Which has the {direction} {phrase}: {join_list(subjects, 'or')}?"
    else:
        question = f"Do {join_list(subjects, 'and')} have the same {phrase}?"
    return Instance(question, leaf_a, structure, steps)


def _parallel_options(chains: list[Chain], rng: random.Random) -> list[tuple[list[Chain], str]]:
    """Groups of 2-3 chains with one attribute path, distinct subjects and ends, and their operation."""
    by_path: dict[tuple[str, ...], list[Chain]] = {}
    for chain in chains:
        by_path.setdefault(tuple(f.attribute for f in chain), []).append(chain)
    options: list[tuple[list[Chain], str]] = []
    for path in sorted(by_path):
        group = by_path[path]
        rng.shuffle(group)
        picked: list[Chain] = []
        for chain in group:
            used = {norm(f.subject) for c in picked for f in c}
            if not any(norm(f.subject) in used for f in chain):
                picked.append(chain)
        if len(picked) < 2:
            continue
        numeric = all(to_number(c[-1].value) is not None for c in picked)
        distinct = len({norm(c[-1].value) for c in picked}) == len(picked)
        if numeric and distinct:
            options.append((picked[: rng.choice([2, 3])], "compare"))
        options.append((picked[:2], "same"))
    rng.shuffle(options)
    return options


def plan(graph: FactGraph, structure: Structure, hop_budget: int, rng: random.Random) -> Instance | None:
    """A random instance of ``structure``, or None when the facts have no such walk."""
    multi = structure in ("multi_hop", "parallel_multi_hop")
    length = min(max(2, hop_budget), graph.longest()) if multi else 1
    if length < (2 if multi else 1):
        return None
    chains = graph.chains(length)
    if structure in ("single_hop", "multi_hop"):
        return single(rng.choice(chains), structure) if chains else None
    for group, op in _parallel_options(chains, rng):
        try:
            return parallel(
                group, structure, op, rng.choice(["higher", "lower"]) if op == "compare" else None
            )
        except Infeasible:
            continue
    return None


def parse(graph: FactGraph, question: str) -> Instance | None:
    """The instance of a q0 in this module's single/multi-hop grammar, or None."""
    wanted = norm(question)
    for length in range(1, MAX_CHAIN + 1):
        for chain in graph.chains(length):
            structure: Structure = "multi_hop" if length > 1 else "single_hop"
            if norm(single(chain, structure).question) == wanted:
                return single(chain, structure)
    return None


def prose_instance(
    inputs: QaSynthesisInput, rng: random.Random, flaw: str | None = None
) -> tuple[QaDraft, str | None]:
    """The draft for ``inputs`` over the knowledge base's passages, and the flaw it carries."""
    graph = FactGraph(inputs.knowledge.passages)
    if not graph.facts:
        raise Undecidable(
            "the passages state no fact the rules backend can read (e.g. 'The population of X is N.'); "
            "use an LLM backend for free prose"
        )
    inst: Instance | None = None
    if inputs.mode == "question":
        inst = parse(graph, inputs.question or "")
        if inst is None:
            raise Undecidable(FREE_FORM)
    else:
        wanted = inputs.structure or STRUCTURES[inputs.instance % len(STRUCTURES)]
        for structure in _FALLBACK[wanted]:
            inst = plan(graph, structure, inputs.hop_budget, rng)
            if inst is not None:
                break
    if inst is None:
        raise Undecidable("the passages have no facts to ask about")
    kind = None
    kb = Kb(inputs.knowledge)
    if flaw is not None:
        inst, kind = flawed(kb, inst, rng, [flaw])
    elif rng.random() < inputs.flaw_rate:
        inst, kind = flawed(kb, inst, rng, PROSE_FLAWS)
    return to_draft(inst), kind


def any_instance(inputs: QaSynthesisInput, rng: random.Random) -> tuple[QaDraft, str | None]:
    """Tables when the knowledge base has any (``simulator.qa``), else its passages."""
    if not inputs.knowledge.tables and inputs.knowledge.passages:
        return prose_instance(inputs, rng)
    return synthesize_instance(inputs, rng)


def _synthesis_rule(inputs: BaseModel, rng: random.Random) -> BaseModel:
    if not isinstance(inputs, QaSynthesisInput):
        raise TypeError(f"expected QaSynthesisInput, got {type(inputs).__name__}")
    return any_instance(inputs, rng)[0]


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {QA_SYNTHESIS.name: _synthesis_rule}

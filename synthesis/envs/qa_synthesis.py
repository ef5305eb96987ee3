"""QA-instance synthesis (ASTRA §2.2.1): a seed in, decomposed QA traces out.

Unconditional seeds yield ``seed.count`` instances cycling the four dependency
structures (single_hop, parallel_single_hop, multi_hop, parallel_multi_hop);
the instance number is part of the role input, so every instance has its own
cache key and its own seeded draw. Question-mode seeds yield one instance.

A draft is accepted only if it is grounded in the seed's knowledge base: every
table grounding names an existing cell and that cell is the sub-answer, every
passage grounding names an existing chunk that mentions the entity and states
the sub-answer (both by ``synthesis.envs.fuzzy`` matching), so the environment stage can
build its tool over the rows or chunks. A draft that is not is reported like
invalid LLM output (the stage dead-letters it with the reason). The trace
carries only the tables and chunks its groundings use (plus a few distractor
chunks for a passage search tool).

The prompt fits the role's context budget: a knowledge base too large for it is
cut to a seeded neighbourhood of rows and a window of chunks (unconditional
mode) or to what is most relevant to the question (question mode); the cut is
recorded on the trace (``context_cut``).
"""

from __future__ import annotations

import asyncio

from arena.config import ArenaSettings, EnvSettings
from arena.hashing import content_hash
from arena.llm.budget import ContextBudget
from arena.llm.core import Answer, InvalidOutput
from arena.llm.gateway import Gateway
from arena.records.envs import STRUCTURES, ContextCut, Grounding, KnowledgeBase, QaSeed, QaTrace, SubQA
from synthesis.envs.context import role_budget
from synthesis.envs.fuzzy import contains_value, same_value
from synthesis.envs.kb_fit import fit_knowledge, neighbourhood_order, relevance_order
from synthesis.envs.passages import chunk_passages, prune_knowledge
from synthesis.envs.roles.qa import QA_SYNTHESIS, QaDraft, QaSynthesisInput
from synthesis.envs.text import norm

DISTRACTOR_CHUNKS = 3
"""Uncited chunks a prose trace keeps besides the cited ones, so a passage search has to search."""
MAX_CONCURRENT = 8
"""Instances of one seed in flight at once (the backend bounds its own concurrency too)."""

Outcome = tuple[QaTrace, Answer[QaDraft]] | InvalidOutput
"""A trace and the answer it came from (for lineage), or the role's final failure."""


def env_settings(settings: ArenaSettings | EnvSettings) -> EnvSettings:
    return settings.envs if isinstance(settings, ArenaSettings) else settings


def synthesis_inputs(seed: QaSeed, instance: int, flaw_rate: float) -> QaSynthesisInput:
    """The role input of instance ``instance`` (0-based) of ``seed``, with the whole knowledge base."""
    unconditional = seed.mode == "unconditional"
    return QaSynthesisInput(
        knowledge=seed.knowledge,
        mode=seed.mode,
        question=None if unconditional else seed.question,
        hop_budget=seed.hop_budget,
        structure=STRUCTURES[instance % len(STRUCTURES)] if unconditional else None,
        instance=instance,
        flaw_rate=flaw_rate,
    )


def fitted_inputs(
    seed: QaSeed, instance: int, flaw_rate: float, budget: ContextBudget | None
) -> tuple[QaSynthesisInput, ContextCut | None]:
    """``synthesis_inputs`` with the knowledge cut to fit ``budget`` (None: uncut), and the cut."""
    inputs = synthesis_inputs(seed, instance, flaw_rate)
    if budget is None:
        return inputs, None
    unconditional = seed.mode == "unconditional"
    order = (
        neighbourhood_order(seed.knowledge, f"{seed.seed_id}:{instance}")
        if unconditional
        else relevance_order(seed.question or "")
    )
    knowledge, cut = fit_knowledge(
        seed.knowledge,
        lambda kb: QA_SYNTHESIS.messages(inputs.model_copy(update={"knowledge": kb})),
        budget,
        QA_SYNTHESIS.name,
        order,
    )
    return inputs.model_copy(update={"knowledge": knowledge}), cut


def resolve_passages(draft: QaDraft, knowledge: KnowledgeBase) -> QaDraft:
    """``draft`` with each passage grounding naming its chunk's id.

    A model cannot know chunk ids (content hashes); it names a passage by number or label and
    quotes the sentence. The chunk is the one holding the quote, else the one stating both the
    entity and the answer; a grounding no chunk supports is left as it is (and then rejected).
    """
    chunks = chunk_passages(knowledge.passages)
    ids = {c.id for c in chunks}
    subs = []
    for s in draft.sub_qas:
        g = s.grounding
        if g is not None and g.is_passage and g.passage not in ids:
            quote = norm(g.quote or "")
            found = next((c for c in chunks if quote and quote in norm(c.text)), None) or next(
                (c for c in chunks if contains_value(c.text, g.key) and contains_value(c.text, s.answer)),
                None,
            )
            if found is not None:
                s = s.model_copy(update={"grounding": g.model_copy(update={"passage": found.id})})
        subs.append(s)
    return draft.model_copy(update={"sub_qas": subs})


def grounding_problems(draft: QaDraft, knowledge: KnowledgeBase) -> list[str]:
    """Why the draft's tool steps are not facts of ``knowledge`` (empty when they are)."""
    problems = []
    for s in draft.sub_qas:
        g = s.grounding
        if g is None:
            continue
        problem = passage_problem(s, g, knowledge) if g.is_passage else table_problem(s, g, knowledge)
        if problem:
            problems.append(f"sub-QA {s.index}: {problem}")
    return problems


def table_problem(s: SubQA, g: Grounding, knowledge: KnowledgeBase) -> str | None:
    """Why ``g`` is not the cell holding ``s.answer`` (keys by exact text, else fuzzily; values fuzzily)."""
    table = {t.name: t for t in knowledge.tables}.get(g.table)  # a repeated name: the last one, as Kb does
    if table is None:
        return f"grounding table {g.table!r} is not in the knowledge base"
    missing = [c for c in (g.key_column, g.column) if c not in table.columns]
    if missing:
        return f"table {g.table!r} has no column {missing[0]!r}"
    rows = [r for r in table.rows if norm(r.get(g.key_column, "")) == norm(g.key)] or [
        r for r in table.rows if g.key_column in r and same_value(r[g.key_column], g.key)
    ]
    if not rows:
        return f"no row of {g.table!r} has {g.key_column} = {g.key!r}"
    if not any(g.column in r and same_value(r[g.column], s.answer) for r in rows):
        found = [str(r[g.column]) for r in rows if g.column in r]
        return f"answer {s.answer!r} is not {g.table}.{g.column} of {g.key!r} ({found[:1]})"
    return None


def passage_problem(s: SubQA, g: Grounding, knowledge: KnowledgeBase) -> str | None:
    """Why chunk ``g.passage`` does not state ``s.answer`` about ``g.key``."""
    chunk = next((c for c in chunk_passages(knowledge.passages) if c.id == g.passage), None)
    if chunk is None:
        return f"grounding passage {g.passage!r} is not a chunk of the knowledge base"
    if not contains_value(chunk.text, g.key):
        return f"passage {g.passage} does not mention {g.key!r}"
    if not contains_value(g.quote or chunk.text, s.answer) or not contains_value(chunk.text, s.answer):
        return f"passage {g.passage} does not state the answer {s.answer!r}"
    return None


def to_trace(seed: QaSeed, draft: QaDraft, cuts: list[ContextCut] | None = None) -> QaTrace:
    """The trace of ``draft``: content-hashed, with the knowledge pruned to what its groundings use."""
    body = {
        "seed_id": seed.seed_id,
        "structure": draft.structure,
        "question": draft.question,
        "answer": draft.answer,
        "sub_qas": [s.model_dump(mode="json") for s in draft.sub_qas],
    }
    return QaTrace(
        qa_id=content_hash(body, prefix="qa-"),
        seed_id=seed.seed_id,
        domain=seed.domain,
        structure=draft.structure,
        question=draft.question,
        answer=draft.answer,
        sub_qas=draft.sub_qas,
        knowledge=prune_knowledge(seed.knowledge, draft.sub_qas, extra_chunks=DISTRACTOR_CHUNKS),
        context_cut=list(cuts or []),
    )


async def synthesize_one(
    seed: QaSeed, instance: int, gw: Gateway, flaw_rate: float, budget: ContextBudget | None = None
) -> Outcome:
    """Instance ``instance`` of ``seed``."""
    inputs, cut = fitted_inputs(seed, instance, flaw_rate, budget)
    try:
        answer = await gw.call(QA_SYNTHESIS, inputs)
    except InvalidOutput as exc:
        return exc
    draft = resolve_passages(answer.output, seed.knowledge) if seed.knowledge.passages else answer.output
    problems = grounding_problems(draft, seed.knowledge)
    if problems:
        return InvalidOutput(QA_SYNTHESIS.name, raw=answer.raw, errors=problems, attempts=1)
    return to_trace(seed, draft, [cut] if cut else None), answer


async def synthesize(seed: QaSeed, gw: Gateway, settings: ArenaSettings | EnvSettings) -> list[Outcome]:
    """All instances of ``seed``, in instance order: ``seed.count`` (unconditional) or one (question mode)."""
    flaw_rate = env_settings(settings).flaw_rate
    budget = role_budget(settings, QA_SYNTHESIS.name)
    count = seed.count if seed.mode == "unconditional" else 1
    gate = asyncio.Semaphore(MAX_CONCURRENT)

    async def bounded(instance: int) -> Outcome:
        async with gate:
            return await synthesize_one(seed, instance, gw, flaw_rate, budget)

    return list(await asyncio.gather(*(bounded(n) for n in range(count))))

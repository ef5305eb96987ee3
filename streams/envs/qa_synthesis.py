"""QA-instance synthesis (ASTRA §2.2.1): a seed in, decomposed QA traces out.

Unconditional seeds yield ``seed.count`` instances cycling the four dependency
structures (single_hop, parallel_single_hop, multi_hop, parallel_multi_hop);
the instance number is part of the role input, so every instance has its own
cache key and its own seeded draw. Question-mode seeds yield one instance.

A draft is accepted only if it is grounded in the seed's knowledge base: every
grounding names an existing cell and that cell is the sub-answer, so the
environment stage can build its tool over the table. A draft that is not is
reported like invalid LLM output (the stage dead-letters it with the reason).
The trace carries only the tables its groundings use.
"""

from __future__ import annotations

import asyncio

from arena.config import ArenaSettings, EnvSettings
from arena.hashing import content_hash
from arena.llm.core import Answer, InvalidOutput
from arena.llm.gateway import Gateway
from arena.llm.roles.qa import QA_SYNTHESIS, QaDraft, QaSynthesisInput
from arena.records.envs import STRUCTURES, KnowledgeBase, QaSeed, QaTrace, prune_knowledge
from arena.text import norm

MAX_CONCURRENT = 8
"""Instances of one seed in flight at once (the backend bounds its own concurrency too)."""

Outcome = tuple[QaTrace, Answer[QaDraft]] | InvalidOutput
"""A trace and the answer it came from (for lineage), or the role's final failure."""


def env_settings(settings: ArenaSettings | EnvSettings) -> EnvSettings:
    return settings.envs if isinstance(settings, ArenaSettings) else settings


def synthesis_inputs(seed: QaSeed, instance: int, flaw_rate: float) -> QaSynthesisInput:
    """The role input of instance ``instance`` (0-based) of ``seed``."""
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


def grounding_problems(draft: QaDraft, knowledge: KnowledgeBase) -> list[str]:
    """Why the draft's tool steps are not exact facts of ``knowledge`` (empty when they are)."""
    tables = {t.name: t for t in knowledge.tables}
    problems = []
    for s in draft.sub_qas:
        g = s.grounding
        if g is None:
            continue
        table = tables.get(g.table)
        if table is None:
            problems.append(f"sub-QA {s.index}: grounding table {g.table!r} is not in the knowledge base")
            continue
        missing = [c for c in (g.key_column, g.column) if c not in table.columns]
        if missing:
            problems.append(f"sub-QA {s.index}: table {g.table!r} has no column {missing[0]!r}")
            continue
        rows = [r for r in table.rows if norm(r.get(g.key_column, "")) == norm(g.key)]
        if not rows:
            problems.append(f"sub-QA {s.index}: no row of {g.table!r} has {g.key_column} = {g.key!r}")
        elif not any(g.column in r and norm(r[g.column]) == norm(s.answer) for r in rows):
            found = [str(r[g.column]) for r in rows if g.column in r]
            problems.append(
                f"sub-QA {s.index}: answer {s.answer!r} is not {g.table}.{g.column} of {g.key!r} ({found[:1]})"
            )
    return problems


def to_trace(seed: QaSeed, draft: QaDraft) -> QaTrace:
    """The trace of ``draft``: content-hashed, with the knowledge pruned to the tables it uses."""
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
        knowledge=prune_knowledge(seed.knowledge, draft.sub_qas),
    )


async def synthesize_one(seed: QaSeed, instance: int, gw: Gateway, flaw_rate: float) -> Outcome:
    """Instance ``instance`` of ``seed``."""
    try:
        answer = await gw.call(QA_SYNTHESIS, synthesis_inputs(seed, instance, flaw_rate))
    except InvalidOutput as exc:
        return exc
    problems = grounding_problems(answer.output, seed.knowledge)
    if problems:
        return InvalidOutput(QA_SYNTHESIS.name, raw=answer.raw, errors=problems, attempts=1)
    return to_trace(seed, answer.output), answer


async def synthesize(seed: QaSeed, gw: Gateway, settings: ArenaSettings | EnvSettings) -> list[Outcome]:
    """All instances of ``seed``, in instance order: ``seed.count`` (unconditional) or one (question mode)."""
    flaw_rate = env_settings(settings).flaw_rate
    count = seed.count if seed.mode == "unconditional" else 1
    gate = asyncio.Semaphore(MAX_CONCURRENT)

    async def bounded(instance: int) -> Outcome:
        async with gate:
            return await synthesize_one(seed, instance, gw, flaw_rate)

    return list(await asyncio.gather(*(bounded(n) for n in range(count))))

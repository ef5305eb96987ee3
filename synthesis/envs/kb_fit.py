"""Fitting a knowledge base into a role's prompt: choose rows and passage chunks, record the cut.

A prompt never carries a whole knowledge base blindly: when the rendered prompt (``role.messages``
measured with ``arena.llm.budget.prompt_tokens``) exceeds the role's budget, its knowledge is cut
down to the rows and chunks that fit, most relevant first. Three orders say what is relevant:

- ``neighbourhood_order``: for unconditional QA synthesis, a seeded random row, then the rows its
  foreign keys reach (and that reach it), breadth first, so multi-hop walks survive the cut; then a
  seeded window of consecutive passage chunks;
- ``relevance_order``: BM25 of every row and chunk against a question;
- ``grounded_order``: the rows and chunks the groundings use, then the rest by relevance to the
  sub-questions (the later stages only need what the instance looks up).

A knowledge base that fits is passed unchanged (no chunking, no copy), so prompts within the
default window are what they were before budgets existed.
"""

from __future__ import annotations

import json
import logging
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arena.hashing import content_hash
from arena.llm.budget import ContextBudget, fit_texts, prompt_tokens
from arena.records.envs import ContextCut, Grounding, KbTable, KnowledgeBase, SubQA
from synthesis.envs.passages import Bm25, chunk_passages
from synthesis.envs.text import norm

log = logging.getLogger(__name__)

Messages = Sequence[Mapping[str, Any]]
MAX_ROUNDS = 24
"""Re-measurements while shrinking (the per-item estimate ignores JSON indentation)."""


@dataclass(frozen=True)
class Item:
    """One row or chunk that a prompt may carry."""

    table: str | None
    """The row's table; None for a passage chunk."""
    index: int
    """Row index in its table, or chunk index."""
    text: str
    """Its text as a prompt holds it (JSON of the row, or the chunk)."""
    chunk_id: str = ""
    position: int = -1
    """Position of the row's table in the knowledge base (names may repeat)."""


def items_of(kb: KnowledgeBase) -> list[Item]:
    """Every row (table order) and every passage chunk of ``kb``."""
    rows = [
        Item(t.name, i, json.dumps(row, ensure_ascii=False, indent=1), position=p)
        for p, t in enumerate(kb.tables)
        for i, row in enumerate(t.rows)
    ]
    chunks = [Item(None, i, c.text, c.id) for i, c in enumerate(chunk_passages(kb.passages))]
    return rows + chunks


def select(kb: KnowledgeBase, items: Sequence[Item], kept: Sequence[int]) -> KnowledgeBase:
    """``kb`` with only the kept items: tables without a kept row and links to them are dropped."""
    rows: dict[int, set[int]] = {}
    chunks: list[str] = []
    for k in sorted(kept):
        item = items[k]
        if item.table is None:
            chunks.append(item.text)
        else:
            rows.setdefault(item.position, set()).add(item.index)
    tables: list[KbTable] = []
    for p, t in enumerate(kb.tables):
        if p in rows:
            keep = [r for i, r in enumerate(t.rows) if i in rows[p]]
            tables.append(t.model_copy(update={"rows": keep}))
    names = {t.name for t in tables}
    tables = [
        t.model_copy(update={"links": {c: v for c, v in t.links.items() if v in names}}) for t in tables
    ]
    return KnowledgeBase(domain=kb.domain, tables=tables, passages=chunks)


def fit_indices(
    texts: Sequence[str], render: Callable[[list[int]], Messages], budget: ContextBudget, order: Sequence[int]
) -> tuple[list[int], int]:
    """The indices of ``texts`` (taken in ``order``) whose rendering fits ``budget``, and its tokens."""
    limit = budget.prompt_tokens
    base = prompt_tokens(render([]))
    room = limit - base
    kept: list[int] = []
    for _ in range(MAX_ROUNDS):
        if room <= 0:
            return [], base
        kept = fit_texts(texts, room, order).kept
        used = prompt_tokens(render(kept))
        if used <= limit:
            return kept, used
        room -= used - limit + 16  # the estimate was short by the JSON around the items
    return [], base


def fit_knowledge(
    kb: KnowledgeBase,
    render: Callable[[KnowledgeBase], Messages],
    budget: ContextBudget,
    role: str,
    order: Callable[[list[Item]], list[int]],
) -> tuple[KnowledgeBase, ContextCut | None]:
    """``kb`` as it fits the prompt ``render`` makes, and what was cut (None when it fits whole)."""
    if budget.fits(render(kb)):
        return kb, None
    items = items_of(kb)
    kept, used = fit_indices(
        [i.text for i in items], lambda ks: render(select(kb, items, ks)), budget, order(items)
    )
    cut = cut_of(role, items, kept, used, budget)
    log.debug("context cut for %s: %s", role, cut.summary())
    return select(kb, items, kept), cut


def cut_of(
    role: str, items: Sequence[Item], kept: Sequence[int], used: int, budget: ContextBudget
) -> ContextCut:
    keep = set(kept)
    rows = [i for i in items if i.table is not None]
    chunks = [i for i in items if i.table is None]
    row_cut = [i for n, i in enumerate(items) if i.table is not None and n not in keep]
    return ContextCut(
        role=role,
        rows_cut=len(row_cut),
        rows_total=len(rows),
        passages_cut=sum(1 for n, i in enumerate(items) if i.table is None and n not in keep),
        passages_total=len(chunks),
        tables=sorted({str(i.table) for i in row_cut}),
        prompt_tokens=used,
        budget_tokens=budget.prompt_tokens,
    )


def fit_rows(
    rows: Sequence[Mapping[str, Any]],
    render: Callable[[list[int]], Messages],
    budget: ContextBudget,
    role: str,
    first: Callable[[Mapping[str, Any]], bool],
) -> tuple[list[int], ContextCut | None]:
    """Indices of ``rows`` a prompt can carry (those ``first`` picks come first), and the cut."""
    everything = list(range(len(rows)))
    if budget.fits(render(everything)):
        return everything, None
    texts = [json.dumps(r, ensure_ascii=False, indent=1) for r in rows]
    order = [i for i in everything if first(rows[i])] + [i for i in everything if not first(rows[i])]
    kept, used = fit_indices(texts, render, budget, order)
    items = [Item("rows", i, t) for i, t in enumerate(texts)]
    cut = cut_of(role, items, kept, used, budget)
    log.debug("context cut for %s: %s", role, cut.summary())
    return kept, cut


# --------------------------------------------------------------------------- orders


def _row_keys(kb: KnowledgeBase, items: Sequence[Item]) -> dict[tuple[str, str], int]:
    """(table, key text) -> item index."""
    out: dict[tuple[str, str], int] = {}
    for n, item in enumerate(items):
        if item.table is not None:
            t = kb.tables[item.position]
            out.setdefault((t.name, norm(t.rows[item.index].get(t.key, ""))), n)
    return out


def _neighbours(kb: KnowledgeBase, items: Sequence[Item]) -> dict[int, list[int]]:
    """Rows joined by a foreign key, both ways."""
    keys = _row_keys(kb, items)
    edges: dict[int, set[int]] = {}
    for n, item in enumerate(items):
        if item.table is None:
            continue
        t = kb.tables[item.position]
        row = t.rows[item.index]
        for column, target in t.links.items():
            m = keys.get((target, norm(row.get(column, ""))))
            if m is not None:
                edges.setdefault(n, set()).add(m)
                edges.setdefault(m, set()).add(n)
    return {n: sorted(e) for n, e in edges.items()}


def neighbourhood_order(kb: KnowledgeBase, seed: str) -> Callable[[list[Item]], list[int]]:
    """Seeded breadth-first neighbourhoods of rows, then a seeded window of consecutive chunks."""

    def order(items: list[Item]) -> list[int]:
        rng = random.Random(content_hash(seed))
        rows = [n for n, i in enumerate(items) if i.table is not None]
        chunks = [n for n, i in enumerate(items) if i.table is None]
        graph = _neighbours(kb, items)
        out: list[int] = []
        seen: set[int] = set()
        remaining = list(rows)
        while remaining:
            start = rng.choice(remaining)
            queue = deque([start])
            seen.add(start)
            while queue:
                node = queue.popleft()
                out.append(node)
                for nxt in graph.get(node, []):
                    if nxt not in seen:
                        seen.add(nxt)
                        queue.append(nxt)
            remaining = [n for n in remaining if n not in seen]
        if chunks:
            at = rng.randrange(len(chunks))
            out += chunks[at:] + chunks[:at]
        return out

    return order


def relevance_order(query: str) -> Callable[[list[Item]], list[int]]:
    """Every row and chunk by BM25 relevance to ``query`` (ties in knowledge-base order)."""

    def order(items: list[Item]) -> list[int]:
        return Bm25([i.text for i in items]).ranking(query)

    return order


def _grounds(item: Item, g: Grounding, kb: KnowledgeBase) -> bool:
    if g.is_passage:
        return item.table is None and item.chunk_id == g.passage
    if item.table != g.table:
        return False
    return norm(kb.tables[item.position].rows[item.index].get(g.key_column, "")) == norm(g.key)


def grounded_order(kb: KnowledgeBase, sub_qas: Sequence[SubQA]) -> Callable[[list[Item]], list[int]]:
    """The rows and chunks the groundings use, then the rest by relevance to the sub-questions."""
    groundings = [s.grounding for s in sub_qas if s.grounding is not None]
    query = " ".join(s.question for s in sub_qas)

    def order(items: list[Item]) -> list[int]:
        used = [n for n, i in enumerate(items) if any(_grounds(i, g, kb) for g in groundings)]
        rest = [n for n in relevance_order(query)(items) if n not in set(used)]
        return used + rest

    return order

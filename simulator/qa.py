"""Rules for the QA roles (ASTRA §2.2.1-2.2.2): knowledge-base walks and the four quality judges.

Synthesis walks the tables of the knowledge base, so every tool sub-answer is
one cell, copied verbatim, and its grounding names that cell:

- ``single_hop``: one lookup; a0 = a1;
- ``parallel_single_hop``: 2-3 lookups of the same column for different keys
  (homogeneous sub-questions), then a no-tool leaf (compare / sum / count / same);
- ``multi_hop``: a chain of H lookups along foreign keys; q_i names a_{i-1};
- ``parallel_multi_hop``: two such chains, then a no-tool leaf.

Main questions follow a small template grammar (``render_question``); question
mode parses that grammar back (``parse_question``) and builds the same
instance; anything else is ``Undecidable``. With probability ``flaw_rate`` the
draft carries one realistic flaw (``FLAW_KINDS``), and the flaw is kept only if
the judge meant to catch it does: the judges below decide by inspecting the
instance, with no hidden label.

Judges: DC_i = d_i lists exactly the earlier answers q_i names; SA_i = q_i is
one lookup or one operation (no "X and the Y"); SR_i = every dependency comes
earlier and the step feeds the final step; TC = a0 is the final answer, every
operation recomputes from the sub-answers it quotes, and every lookup key
comes from q0 or another answer.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.llm.roles.judges import BinaryJudgement
from arena.llm.roles.qa import (
    QA_ATOMICITY,
    QA_COMPLETENESS,
    QA_DEPENDENCY,
    QA_SEQUENCE,
    QA_SYNTHESIS,
    QA_TOOL_NEED,
    QaDraft,
    QaJudgeInput,
    QaSynthesisInput,
    StepVerdict,
    StepVerdicts,
    ToolNeed,
    ToolNeedInput,
    ToolNeeds,
)
from arena.records.envs import (
    STRUCTURES,
    Cell,
    Grounding,
    KbTable,
    KnowledgeBase,
    Structure,
    SubQA,
    prune_knowledge,
)
from arena.text import norm
from simulator.judges import typed_rule

MAX_LINKS = 7
"""Longest foreign-key path walked (hop budget 8 = 7 links + the final lookup)."""

FLAW_KINDS: dict[str, int] = {
    "inner_no_tool": 3,
    "unsupported_answer": 3,
    "missing_dependency": 1,
    "extra_dependency": 1,
    "non_atomic": 1,
    "superfluous": 1,
    "misordered": 1,
}
"""Flaw kinds and their draw weights. The first two are the ones the gates drop: the leaf rule, and
QS < 0.75 for an unsupported a0 past a single hop (a misquoted aggregation input, or a chain that
loses track: both cost DC_i and TC); the others cost one sub-question's DC, SA or SR."""

FREE_FORM = "rules backend cannot decompose free-form questions; use an LLM backend"

# --------------------------------------------------------------------------- text


def mentions(text: str, value: str) -> bool:
    """Whether ``text`` names ``value`` as a whole token (``3`` is not in ``L-1003``, nor ``4.5`` in ``4.55``)."""
    v = norm(value)
    if not v:
        return False
    return re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-]|\.\d)", norm(text)) is not None


def words(name: str) -> str:
    """``median_home_price`` -> ``median home price``."""
    return " ".join(name.replace("_", " ").split())


def cell_text(value: Cell) -> str:
    """A cell as its answer text (exactly as a tool would print it)."""
    return str(value)


def _num(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _num_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{round(value, 6)}"


def _join(items: Sequence[str], conj: str) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {conj} {items[-1]}"


# --------------------------------------------------------------------------- knowledge view


@dataclass(frozen=True)
class Route:
    """A foreign-key path: start table, then one link column per hop."""

    tables: tuple[str, ...]
    links: tuple[str, ...] = ()

    @property
    def start(self) -> str:
        return self.tables[0]

    @property
    def last(self) -> str:
        return self.tables[-1]


@dataclass(frozen=True)
class Hop:
    """One lookup of a walk: the row ``key`` of ``table`` and its ``column`` value."""

    table: str
    key: str
    column: str
    value: Cell


class Kb:
    """Indexes over a knowledge base: rows by key, phrases, numeric/categorical columns, routes."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self.kb = kb
        self.tables: dict[str, KbTable] = {t.name: t for t in kb.tables}
        self.rows: dict[str, dict[str, dict[str, Cell]]] = {
            t.name: {cell_text(r[t.key]): r for r in t.rows if t.key in r} for t in kb.tables
        }
        self._by_norm = {name: {norm(k): k for k in rows} for name, rows in self.rows.items()}

    def key_of(self, table: str, text: str) -> str | None:
        """The key of ``table`` that ``text`` spells (case- and space-insensitive)."""
        return self._by_norm[table].get(norm(text))

    def entity(self, table: str) -> str:
        return words(self.tables[table].entity)

    def plural(self, table: str) -> str:
        return words(table)

    def column_phrase(self, column: str) -> str:
        return words(column)

    def links(self, table: str) -> list[tuple[str, str]]:
        t = self.tables[table]
        return [(c, target) for c, target in t.links.items() if target in self.tables and c in t.columns]

    def link_phrase(self, table: str, column: str) -> str:
        """How a walk names the row a link points to: ``agent`` for listings.agent_id."""
        target = self.tables[table].links[column]
        if list(self.tables[table].links.values()).count(target) == 1:
            return self.entity(target)
        return re.sub(r" id$", "", words(column))

    def path_phrase(self, route: Route) -> str:
        pairs = list(zip(route.tables[:-1], route.links, strict=True))
        return "".join(f" of the {self.link_phrase(t, c)}" for t, c in reversed(pairs))

    def routes(self, max_links: int = MAX_LINKS) -> list[Route]:
        """Every simple foreign-key path of at most ``max_links`` links, from every table."""
        out: list[Route] = []

        def grow(route: Route) -> None:
            out.append(route)
            if len(route.links) >= max_links:
                return
            for column, target in self.links(route.last):
                if target not in route.tables:
                    grow(Route((*route.tables, target), (*route.links, column)))

        for name in self.tables:
            grow(Route((name,)))
        return out

    def walk(self, route: Route, key: str, column: str) -> list[Hop] | None:
        """The lookups from row ``key`` of the start table to ``column`` of the last; None when broken."""
        hops: list[Hop] = []
        for table, link in [*zip(route.tables[:-1], route.links, strict=True), (route.last, column)]:
            row = self.rows[table].get(key)
            if row is None or link not in row:
                return None
            hops.append(Hop(table, key, link, row[link]))
            key = cell_text(row[link])
        return hops

    def values(self, table: str, column: str) -> list[Cell]:
        return [r[column] for r in self.rows[table].values() if column in r]

    def attributes(self, table: str) -> list[str]:
        """Non-key, non-link columns (facts, not pointers)."""
        t = self.tables[table]
        return [c for c in t.columns if c != t.key and c not in t.links]

    def numeric(self, table: str, column: str) -> bool:
        vals = self.values(table, column)
        return bool(vals) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals)

    def integral(self, table: str, column: str) -> bool:
        return self.numeric(table, column) and all(isinstance(v, int) for v in self.values(table, column))

    def categorical(self, table: str, column: str) -> bool:
        vals = self.values(table, column)
        return bool(vals) and all(isinstance(v, str) for v in vals) and len(set(vals)) < len(vals)

    def all_values(self) -> list[str]:
        """Every cell as text, longest first (for masking entity names inside questions)."""
        vals = {cell_text(v) for t in self.kb.tables for r in t.rows for v in r.values()}
        return sorted((v for v in vals if len(v) >= 2), key=len, reverse=True)

    def all_keys(self) -> list[str]:
        return [k for rows in self.rows.values() for k in rows]


# --------------------------------------------------------------------------- plans and the grammar

Op = str  # "compare" | "sum" | "count" | "same"


@dataclass(frozen=True)
class Plan:
    """What an instance asks, before it is walked: the grammar's parse tree."""

    structure: Structure
    route: Route
    column: str
    keys: tuple[str, ...]
    op: Op | None = None
    direction: str | None = None
    target: str | None = None


class Infeasible(ValueError):
    """The plan cannot be answered from the knowledge base (missing row, tie, text to compare)."""


def render_question(kb: Kb, plan: Plan) -> str:
    """q0 in the template grammar (``parse_question`` reads it back)."""
    cp = kb.column_phrase(plan.column) + kb.path_phrase(plan.route)
    e0, keys = kb.entity(plan.route.start), list(plan.keys)
    if plan.op is None:
        return f"What is the {cp} of the {e0} {keys[0]}?"
    if plan.op == "compare":
        return f"Which {e0} has the {plan.direction} {cp}: {_join(keys, 'or')}?"
    if plan.op == "sum":
        return f"What is the total {cp} of the {kb.plural(plan.route.start)} {_join(keys, 'and')}?"
    if plan.op == "count":
        return f'How many of the {kb.plural(plan.route.start)} {_join(keys, "and")} have the {cp} "{plan.target}"?'
    return f"Do the {e0} {keys[0]} and the {e0} {keys[1]} have the same {cp}?"


def _split_keys(kb: Kb, table: str, text: str, seps: Sequence[str]) -> list[str] | None:
    """``text`` as a list of keys of ``table`` joined by ``seps``; None when it is not one."""
    key = kb.key_of(table, text)
    if key is not None:
        return [key]
    for sep in seps:
        for at in [m.start() for m in re.finditer(re.escape(sep), text)]:
            head = kb.key_of(table, text[:at])
            if head is None:
                continue
            rest = _split_keys(kb, table, text[at + len(sep) :], seps)
            if rest is not None:
                return [head, *rest]
    return None


def parse_question(kb: Kb, question: str) -> Plan | None:
    """The plan of a q0 written in the template grammar, or None."""
    q = " ".join(question.split())
    for route in kb.routes():
        e0, p0 = re.escape(kb.entity(route.start)), re.escape(kb.plural(route.start))
        multi = bool(route.links)
        for column in kb.tables[route.last].columns:
            if column == kb.tables[route.last].key:
                continue
            cp = re.escape(kb.column_phrase(column) + kb.path_phrase(route))
            plan = _parse_with(kb, q, route, column, multi, e0, p0, cp)
            if plan is not None:
                return plan
    return None


def _parse_with(
    kb: Kb, q: str, route: Route, column: str, multi: bool, e0: str, p0: str, cp: str
) -> Plan | None:
    flags = re.IGNORECASE
    single: Structure = "multi_hop" if multi else "single_hop"
    parallel: Structure = "parallel_multi_hop" if multi else "parallel_single_hop"
    if m := re.fullmatch(rf"What is the {cp} of the {e0} (?P<k>.+)\?", q, flags):
        if (key := kb.key_of(route.start, m["k"])) is not None:
            return Plan(single, route, column, (key,))
    if m := re.fullmatch(rf"Which {e0} has the (?P<d>higher|lower) {cp}: (?P<k>.+)\?", q, flags):
        keys = _split_keys(kb, route.start, m["k"], [", ", " or "])
        if keys and len(keys) >= 2:
            return Plan(parallel, route, column, tuple(keys), "compare", m["d"].lower())
    if m := re.fullmatch(rf"What is the total {cp} of the {p0} (?P<k>.+)\?", q, flags):
        keys = _split_keys(kb, route.start, m["k"], [", ", " and "])
        if keys and len(keys) >= 2:
            return Plan(parallel, route, column, tuple(keys), "sum")
    if m := re.fullmatch(rf'How many of the {p0} (?P<k>.+) have the {cp} "(?P<t>.+)"\?', q, flags):
        keys = _split_keys(kb, route.start, m["k"], [", ", " and "])
        if keys and len(keys) >= 2:
            return Plan(parallel, route, column, tuple(keys), "count", target=m["t"])
    if m := re.fullmatch(rf"Do the {e0} (?P<a>.+) and the {e0} (?P<b>.+) have the same {cp}\?", q, flags):
        a, b = kb.key_of(route.start, m["a"]), kb.key_of(route.start, m["b"])
        if a is not None and b is not None:
            return Plan(parallel, route, column, (a, b), "same")
    return None


# --------------------------------------------------------------------------- building instances


@dataclass
class Step:
    """A sub-QA under construction; ``sid`` is stable while steps are inserted and moved."""

    sid: int
    question: str
    answer: str
    deps: list[int] = field(default_factory=list)
    grounding: Grounding | None = None
    operation: str | None = None
    leaf: dict[str, Any] | None = None
    """For an aggregation: how to re-render it (op, entity, column phrase, keys, direction, target)."""

    @property
    def needs_tool(self) -> bool:
        return self.grounding is not None


@dataclass
class Instance:
    question: str
    answer: str
    structure: Structure
    steps: list[Step]

    def next_sid(self) -> int:
        return max(s.sid for s in self.steps) + 1

    def by_sid(self, sid: int) -> Step:
        return next(s for s in self.steps if s.sid == sid)

    def dependents(self, sid: int) -> list[Step]:
        return [s for s in self.steps if sid in s.deps]


def lookup_question(kb: Kb, table: str, key: str, column: str) -> str:
    return f"What is the {kb.column_phrase(column)} of the {kb.entity(table)} {key}?"


def leaf_question(leaf: dict[str, Any], values: Sequence[str]) -> tuple[str, str]:
    """The aggregation's question over ``values`` and the answer it computes from them."""
    op, keys = leaf["op"], leaf["keys"]
    if op == "compare":
        nums = [_num(v) for v in values]
        if any(n is None for n in nums):
            raise Infeasible(f"cannot compare non-numeric values {list(values)}")
        best = (max if leaf["direction"] == "higher" else min)(n for n in nums if n is not None)
        if sum(1 for n in nums if n == best) > 1:
            raise Infeasible(f"the values tie at {_num_text(best)}; nothing to compare")
        pairs = [f"{k} ({v})" for k, v in zip(keys, values, strict=True)]
        question = (
            f"Which {leaf['entity']} has the {leaf['direction']} {leaf['column']}: {_join(pairs, 'or')}?"
        )
        return question, keys[nums.index(best)]
    if op == "sum":
        nums = [_num(v) for v in values]
        if any(n is None for n in nums):
            raise Infeasible(f"cannot add non-numeric values {list(values)}")
        return f"What is the sum of {_join(list(values), 'and')}?", _num_text(
            sum(n for n in nums if n is not None)
        )
    if op == "count":
        hits = sum(1 for v in values if norm(v) == norm(leaf["target"]))
        return f'How many of {_join(list(values), "and")} are "{leaf["target"]}"?', str(hits)
    same = len({norm(v) for v in values}) == 1
    return f"Are {_join(list(values), 'and')} the same {leaf['column']}?", "yes" if same else "no"


def build(kb: Kb, plan: Plan) -> Instance:
    """Walk the plan through the tables: sub-QAs whose tool answers are cells of K."""
    steps: list[Step] = []
    ends: list[Step] = []
    for key in plan.keys:
        hops = kb.walk(plan.route, key, plan.column)
        if hops is None:
            raise Infeasible(f"the walk from {kb.entity(plan.route.start)} {key} breaks off")
        previous: Step | None = None
        for hop in hops:
            t = kb.tables[hop.table]
            step = Step(
                sid=len(steps) + 1,
                question=lookup_question(kb, hop.table, hop.key, hop.column),
                answer=cell_text(hop.value),
                deps=[previous.sid] if previous else [],
                grounding=Grounding(table=hop.table, key_column=t.key, key=hop.key, column=hop.column),
            )
            steps.append(step)
            previous = step
        assert previous is not None
        ends.append(previous)
    question = render_question(kb, plan)
    if plan.op is None:
        return Instance(question, ends[0].answer, plan.structure, steps)
    leaf = {
        "op": plan.op,
        "entity": kb.entity(plan.route.start),
        "column": kb.column_phrase(plan.column),
        "keys": list(plan.keys),
        "direction": plan.direction,
        "target": plan.target,
    }
    leaf_q, leaf_a = leaf_question(leaf, [e.answer for e in ends])
    steps.append(
        Step(len(steps) + 1, leaf_q, leaf_a, [e.sid for e in ends], None, plan.op, leaf),
    )
    return Instance(question, leaf_a, plan.structure, steps)


# --------------------------------------------------------------------------- sampling plans


def _pick_keys(
    kb: Kb, route: Route, column: str, n: int, rng: random.Random, distinct: bool, tries: int = 40
) -> tuple[str, ...] | None:
    keys = [k for k in kb.rows[route.start] if kb.walk(route, k, column) is not None]
    if len(keys) < n:
        return None
    for _ in range(tries):
        chosen = rng.sample(keys, n)
        walks = [h for k in chosen if (h := kb.walk(route, k, column))]
        # Walks that share a row coincide from there on: distinct last rows = disjoint chains.
        rows = {h[-1].key for h in walks}
        finals = {norm(cell_text(h[-1].value)) for h in walks}
        if len(rows) == n and (not distinct or len(finals) == n):
            return tuple(chosen)
    return None


def _routes_for(kb: Kb, hop_budget: int) -> list[Route]:
    """Routes with as many links as the hop budget asks for (fewer when K is shallower), at least one."""
    linked = [r for r in kb.routes() if r.links]
    if not linked:
        return []
    want = min(max(1, hop_budget - 1), max(len(r.links) for r in linked))
    return [r for r in linked if len(r.links) == want]


def _final_columns(kb: Kb, table: str) -> list[str]:
    return kb.attributes(table) or [c for c in kb.tables[table].columns if c != kb.tables[table].key]


def _aggregations(kb: Kb, route: Route, column: str, chains: int | None) -> list[tuple[Op, int]]:
    """(op, number of lookups) pairs the column supports."""
    sizes = [chains] if chains else [2, 3]
    ops: list[tuple[Op, int]] = []
    if kb.numeric(route.last, column) and len(set(kb.values(route.last, column))) >= 2:
        ops += [("compare", n) for n in sizes]
    if kb.integral(route.last, column):
        ops += [("sum", n) for n in sizes]
    if kb.categorical(route.last, column):
        ops.append(("same", 2))
        if chains is None:
            ops.append(("count", 3))
    return ops


def sample_plan(kb: Kb, structure: Structure, hop_budget: int, rng: random.Random) -> Plan | None:
    """A random feasible plan of ``structure``, or None when K has no such walk."""
    if structure == "single_hop":
        tables = [t for t in kb.tables if kb.rows[t]]
        table = rng.choice(tables)
        column = rng.choice(_final_columns(kb, table))
        keys = _pick_keys(kb, Route((table,)), column, 1, rng, distinct=False)
        return Plan(structure, Route((table,)), column, keys) if keys else None
    if structure == "multi_hop":
        options = [(r, c) for r in _routes_for(kb, hop_budget) for c in _final_columns(kb, r.last)]
        rng.shuffle(options)
        for route, column in options:
            if keys := _pick_keys(kb, route, column, 1, rng, distinct=False):
                return Plan(structure, route, column, keys)
        return None
    if structure == "parallel_single_hop":
        routes = [Route((t,)) for t in kb.tables]
        chains: int | None = None
    else:
        routes, chains = _routes_for(kb, hop_budget), 2
    candidates = [
        (route, column, op, n)
        for route in routes
        for column in _final_columns(kb, route.last)
        for op, n in _aggregations(kb, route, column, chains)
    ]
    rng.shuffle(candidates)
    by_op: dict[Op, list[tuple[Route, str, Op, int]]] = {}
    for cand in candidates:
        by_op.setdefault(cand[2], []).append(cand)
    for op in rng.sample(sorted(by_op), len(by_op)):
        for route, column, _, n in by_op[op]:
            keys = _pick_keys(kb, route, column, n, rng, distinct=op == "compare")
            if keys is None:
                continue
            direction = rng.choice(["higher", "lower"]) if op == "compare" else None
            target = None
            if op == "count":
                hops = kb.walk(route, rng.choice(keys), column)
                target = cell_text(hops[-1].value) if hops else None
            return Plan(structure, route, column, keys, op, direction, target)
    return None


_FALLBACK: dict[Structure, tuple[Structure, ...]] = {
    "single_hop": ("single_hop",),
    "multi_hop": ("multi_hop", "single_hop"),
    "parallel_single_hop": ("parallel_single_hop", "single_hop"),
    "parallel_multi_hop": ("parallel_multi_hop", "parallel_single_hop", "single_hop"),
}


def plan_instance(kb: Kb, structure: Structure, hop_budget: int, rng: random.Random) -> Instance:
    """An instance of ``structure`` (or the nearest simpler one K supports)."""
    for wanted in _FALLBACK[structure]:
        for _ in range(8):
            plan = sample_plan(kb, wanted, hop_budget, rng)
            if plan is None:
                break
            try:
                return build(kb, plan)
            except Infeasible:
                continue
    raise Undecidable(f"the knowledge base {kb.kb.domain!r} has no rows to ask about")


# --------------------------------------------------------------------------- flaws


def _flaw_inner_no_tool(kb: Kb, inst: Instance, rng: random.Random) -> Instance | None:
    """A 'restate' step between a lookup and its consumer: a no-tool step at an inner node."""
    fed = [s for s in inst.steps if s.needs_tool and inst.dependents(s.sid)]
    if not fed:
        return None
    src = rng.choice(fed)
    fmt = Step(inst.next_sid(), f"Restate the value {src.answer} in plain form.", src.answer, [src.sid])
    fmt.operation = "format"
    for dep in inst.dependents(src.sid):
        dep.deps = [fmt.sid if d == src.sid else d for d in dep.deps]
    inst.steps.insert(inst.steps.index(src) + 1, fmt)
    return inst


def _flaw_unsupported_answer(kb: Kb, inst: Instance, rng: random.Random) -> Instance | None:
    """An aggregation over a misquoted value, or an a0 the final lookup does not give."""
    final = inst.steps[-1]
    if final.leaf is not None:
        inputs = [inst.by_sid(d) for d in final.deps]
        # Misquote an input whose value no other input shares, so the quote really drops it.
        order = [
            i for i, s in enumerate(inputs) if [norm(t.answer) for t in inputs].count(norm(s.answer)) == 1
        ]
        rng.shuffle(order)
        for i in order:
            g = inputs[i].grounding
            if g is None:
                continue
            pool = sorted({cell_text(v) for v in kb.values(g.table, g.column)} - {inputs[i].answer})
            rng.shuffle(pool)
            for wrong in pool:
                if norm(wrong) in {norm(s.answer) for s in inst.steps}:
                    continue
                values = [wrong if j == i else s.answer for j, s in enumerate(inputs)]
                try:
                    question, answer = leaf_question(final.leaf, values)
                except Infeasible:
                    continue
                if norm(answer) != norm(final.answer):
                    final.question, final.answer = question, answer
                    inst.answer = answer
                    return inst
    g = final.grounding
    if g is not None and final.deps:
        # Lost track of the chain: the last lookup asks about a row no earlier answer names.
        answers = {norm(s.answer) for s in inst.steps}
        rows = [
            (key, cell_text(row[g.column]))
            for key, row in kb.rows[g.table].items()
            if g.column in row and norm(key) not in answers and norm(cell_text(row[g.column])) not in answers
        ]
        if rows:
            key, value = rng.choice(sorted(rows))
            final.question = lookup_question(kb, g.table, key, g.column)
            final.answer = inst.answer = value
            final.grounding = g.model_copy(update={"key": key})
            return inst
    other = _other_answer(kb, final, rng)
    if other is None:
        return None
    inst.answer = other
    return inst


def _other_answer(kb: Kb, final: Step, rng: random.Random) -> str | None:
    """A plausible a0 the final step does not give: another key, count, total, verdict or cell."""
    if final.leaf is not None:
        op, answer = final.leaf["op"], final.answer
        if op == "compare":
            return rng.choice([k for k in final.leaf["keys"] if norm(k) != norm(answer)])
        if op == "same":
            return "no" if answer == "yes" else "yes"
        value = _num(answer) or 0.0
        return _num_text(value + rng.choice([1, 2]) * (1 if op == "count" else max(1.0, abs(value) // 10)))
    g = final.grounding
    if g is None:
        return None
    pool = sorted({cell_text(v) for v in kb.values(g.table, g.column)} - {final.answer})
    return rng.choice(pool) if pool else None


def _flaw_missing_dependency(kb: Kb, inst: Instance, rng: random.Random) -> Instance | None:
    options = []
    for s in inst.steps:
        for d in s.deps:
            value = norm(inst.by_sid(d).answer)
            if not any(norm(inst.by_sid(o).answer) == value for o in s.deps if o != d):
                options.append((s, d))
    if not options:
        return None
    step, dep = rng.choice(options)
    step.deps = [d for d in step.deps if d != dep]
    return inst


def _flaw_extra_dependency(kb: Kb, inst: Instance, rng: random.Random) -> Instance | None:
    options = [
        (s, e)
        for n, s in enumerate(inst.steps)
        for e in inst.steps[:n]
        if e.sid not in s.deps and not mentions(s.question, e.answer)
    ]
    if not options:
        return None
    step, extra = rng.choice(options)
    order = [s.sid for s in inst.steps]
    step.deps = sorted([*step.deps, extra.sid], key=order.index)
    return inst


def _flaw_non_atomic(kb: Kb, inst: Instance, rng: random.Random) -> Instance | None:
    """Two facts in one sub-question ('the price and the bedrooms of ...'); the answer keeps the first."""
    options = []
    for s in inst.steps:
        g = s.grounding
        if g is None:
            continue
        others = [c for c in kb.tables[g.table].columns if c not in (g.column, g.key_column)]
        options += [(s, g, c) for c in others]
    if not options:
        return None
    step, g, other = rng.choice(options)
    entity = kb.entity(g.table)
    step.question = (
        f"What is the {kb.column_phrase(g.column)} and the {kb.column_phrase(other)} of the {entity} {g.key}?"
    )
    return inst


def _flaw_superfluous(kb: Kb, inst: Instance, rng: random.Random) -> Instance | None:
    """A padding lookup about an entity already in play whose answer nothing uses."""
    options = []
    for pos, s in enumerate(inst.steps):
        g = s.grounding
        if g is None:
            continue
        asked = {t.grounding.column for t in inst.steps if t.grounding and t.grounding.key == g.key}
        for column in kb.tables[g.table].columns:
            row = kb.rows[g.table].get(g.key, {})
            if column in asked or column == g.key_column or column not in row:
                continue
            answer = cell_text(row[column])
            if norm(answer) == norm(inst.answer) or any(mentions(t.question, answer) for t in inst.steps):
                continue
            options.append((pos, s, g, column, answer))
    if not options:
        return None
    pos, s, g, column, answer = rng.choice(options)
    pad = Step(
        inst.next_sid(),
        lookup_question(kb, g.table, g.key, column),
        answer,
        list(s.deps),
        Grounding(table=g.table, key_column=g.key_column, key=g.key, column=column),
    )
    inst.steps.insert(min(pos + 1, len(inst.steps) - 1), pad)  # the final step stays last
    return inst


def _flaw_misordered(kb: Kb, inst: Instance, rng: random.Random) -> Instance | None:
    """Two chained steps swapped, so a step comes before the one it depends on."""
    options = [n for n in range(len(inst.steps) - 2) if inst.steps[n].sid in inst.steps[n + 1].deps]
    if not options:
        return None
    n = rng.choice(options)
    inst.steps[n], inst.steps[n + 1] = inst.steps[n + 1], inst.steps[n]
    return inst


_FLAWS: dict[str, Callable[[Kb, Instance, random.Random], Instance | None]] = {
    "inner_no_tool": _flaw_inner_no_tool,
    "unsupported_answer": _flaw_unsupported_answer,
    "missing_dependency": _flaw_missing_dependency,
    "extra_dependency": _flaw_extra_dependency,
    "non_atomic": _flaw_non_atomic,
    "superfluous": _flaw_superfluous,
    "misordered": _flaw_misordered,
}


def to_draft(inst: Instance) -> QaDraft:
    """Renumber the steps 1..m in list order."""
    position = {s.sid: n for n, s in enumerate(inst.steps, start=1)}
    subs = [
        SubQA(
            index=position[s.sid],
            question=s.question,
            answer=s.answer,
            depends_on=sorted(position[d] for d in s.deps),
            needs_tool=s.needs_tool,
            grounding=s.grounding,
            operation=s.operation,
        )
        for s in inst.steps
    ]
    return QaDraft(question=inst.question, answer=inst.answer, structure=inst.structure, sub_qas=subs)


def judge_view(draft: QaDraft, knowledge: KnowledgeBase) -> QaJudgeInput:
    """What the quality judges see: the draft and the tables its groundings use."""
    return QaJudgeInput(
        question=draft.question,
        answer=draft.answer,
        structure=draft.structure,
        sub_qas=draft.sub_qas,
        knowledge=prune_knowledge(knowledge, draft.sub_qas),
    )


def caught(kind: str, draft: QaDraft, knowledge: KnowledgeBase) -> bool:
    """Whether the check meant for flaw ``kind`` rejects ``draft``."""
    view = judge_view(draft, knowledge)
    if kind == "inner_no_tool":
        needs = {
            t.index: t.needs_tool
            for t in tool_needs(
                ToolNeedInput(question=view.question, sub_qas=view.sub_qas, knowledge=view.knowledge)
            ).items
        }
        return any(
            not needs[s.index] for s in draft.sub_qas if any(s.index in o.depends_on for o in draft.sub_qas)
        )
    if kind == "unsupported_answer":
        return completeness(view).score == 0
    judge = {
        "missing_dependency": dependency,
        "extra_dependency": dependency,
        "non_atomic": atomicity,
        "superfluous": sequence,
        "misordered": sequence,
    }[kind]
    return any(v.score == 0 for v in judge(view).verdicts)


def flawed(
    kb: Kb, inst: Instance, rng: random.Random, kinds: Sequence[str] | None = None
) -> tuple[Instance, str | None]:
    """``inst`` with one flaw the matching judge catches (kinds tried in weighted random order)."""
    pool = list(kinds) if kinds is not None else list(FLAW_KINDS)
    order: list[str] = []
    while pool:
        kind = rng.choices(pool, weights=[FLAW_KINDS[k] for k in pool])[0]
        pool.remove(kind)
        order.append(kind)
    for kind in order:
        candidate = _FLAWS[kind](kb, copy.deepcopy(inst), rng)
        if candidate is not None and caught(kind, to_draft(candidate), kb.kb):
            return candidate, kind
    return inst, None


# --------------------------------------------------------------------------- synthesis rule


def synthesize_instance(
    inputs: QaSynthesisInput, rng: random.Random, flaw: str | None = None
) -> tuple[QaDraft, str | None]:
    """The draft for ``inputs`` and the flaw it carries (``flaw`` forces one kind, for tests)."""
    kb = Kb(inputs.knowledge)
    if not kb.tables:
        raise Undecidable(
            "the knowledge base has no tables; the rules backend only walks tables (use an LLM backend for text)"
        )
    if inputs.mode == "question":
        plan = parse_question(kb, inputs.question or "")
        if plan is None:
            raise Undecidable(FREE_FORM)
        try:
            inst = build(kb, plan)
        except Infeasible as exc:
            raise Undecidable(f"cannot answer {inputs.question!r} from the knowledge base: {exc}") from None
    else:
        structure = inputs.structure or STRUCTURES[inputs.instance % len(STRUCTURES)]
        inst = plan_instance(kb, structure, inputs.hop_budget, rng)
    kind = None
    if flaw is not None:
        inst, kind = flawed(kb, inst, rng, [flaw])
    elif rng.random() < inputs.flaw_rate:
        inst, kind = flawed(kb, inst, rng)
    return to_draft(inst), kind


def qa_synthesis(inputs: QaSynthesisInput, rng: random.Random) -> QaDraft:
    return synthesize_instance(inputs, rng)[0]


# --------------------------------------------------------------------------- tool need

OPERATIONS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (op, re.compile(pattern))
    for op, pattern in (
        ("compare", r"^which .+ has the (higher|lower|highest|lowest) .+:.+\(.+\)"),
        ("sum", r"^what is the sum of "),
        ("count", r"^how many of "),
        ("same", r"^are .+ the same "),
        ("format", r"^(restate|rewrite|reformat|convert|express) "),
        ("summarize", r"^(summari[sz]e|describe) "),
        ("recommend", r"^(recommend|suggest|advise) "),
        ("rank", r"^(rank|sort|order) "),
        ("evaluate", r"^(evaluate|assess|rate|judge) "),
    )
)
"""Linguistic operations on known answers: these sub-questions need no tool."""


def operation_of(question: str) -> str | None:
    q = norm(question)
    return next((op for op, pattern in OPERATIONS if pattern.search(q)), None)


def tool_needs(inputs: ToolNeedInput) -> ToolNeeds:
    items = []
    for s in inputs.sub_qas:
        op = operation_of(s.question)
        if op is None:
            items.append(
                ToolNeed(
                    index=s.index, needs_tool=True, reason="asks for a fact only the knowledge base holds"
                )
            )
        else:
            items.append(
                ToolNeed(
                    index=s.index,
                    needs_tool=False,
                    operation=op,
                    reason=f"a {op} operation on answers already known",
                )
            )
    return ToolNeeds(items=items)


# --------------------------------------------------------------------------- judges


def _answers(view: QaJudgeInput) -> dict[int, str]:
    return {s.index: s.answer for s in view.sub_qas}


def dependency(view: QaJudgeInput) -> StepVerdicts:
    """DC_i: every listed dependency's answer is named by q_i, and every earlier answer it names is listed."""
    answers = _answers(view)
    out = []
    for s in view.sub_qas:
        unknown = [d for d in s.depends_on if d not in answers or d == s.index]
        unused = [
            d for d in s.depends_on if d in answers and d != s.index and not mentions(s.question, answers[d])
        ]
        named = {norm(a): j for j, a in answers.items() if j < s.index and mentions(s.question, a)}
        covered = {norm(answers[d]) for d in s.depends_on if d in answers}
        missing = sorted(j for value, j in named.items() if value not in covered)
        problems = (
            [f"d_{s.index} lists unknown {unknown}"] * bool(unknown)
            + [f"q_{s.index} does not use the answers of {unused}"] * bool(unused)
            + [f"q_{s.index} uses the answer of {missing} but d_{s.index} omits it"] * bool(missing)
        )
        out.append(
            StepVerdict(
                index=s.index,
                score=0.0 if problems else 1.0,
                reason="; ".join(problems)
                if problems
                else f"d_{s.index} = {s.depends_on} names exactly what q_{s.index} uses",
            )
        )
    return StepVerdicts(verdicts=out)


_JOINED = re.compile(
    r"\b(and|as well as|along with) (the|what|which|who|whom|whose|how|where|when|its|their|also)\b"
)


def atomicity(view: QaJudgeInput) -> StepVerdicts:
    """SA_i: one lookup or one operation; entity names are masked so 'Smith and Sons' is not a conjunction."""
    values = Kb(view.knowledge).all_values() + sorted({s.answer for s in view.sub_qas}, key=len, reverse=True)
    out = []
    for s in view.sub_qas:
        masked = norm(s.question)
        for v in values:
            if norm(v) in masked:
                masked = re.sub(rf"(?<![\w-]){re.escape(norm(v))}(?![\w-]|\.\d)", "§", masked)
        joined = _JOINED.search(masked)
        several = masked.count("?") > 1
        if joined or several:
            reason = f"q_{s.index} bundles several requests ('{joined.group(0) if joined else '?...?'}')"
            out.append(StepVerdict(index=s.index, score=0.0, reason=reason))
        else:
            kind = "operation" if operation_of(s.question) else "lookup"
            out.append(StepVerdict(index=s.index, score=1.0, reason=f"q_{s.index} is one {kind}"))
    return StepVerdicts(verdicts=out)


def _ancestors(view: QaJudgeInput, index: int) -> set[int]:
    deps = {s.index: s.depends_on for s in view.sub_qas}
    seen: set[int] = set()
    todo = [index]
    while todo:
        node = todo.pop()
        if node in seen or node not in deps:
            continue
        seen.add(node)
        todo += deps[node]
    return seen


def sequence(view: QaJudgeInput) -> StepVerdicts:
    """SR_i: every dependency comes earlier, and the step feeds the final step (no padding)."""
    if not view.sub_qas:
        return StepVerdicts(verdicts=[])
    final = view.sub_qas[-1].index
    feeding = _ancestors(view, final)
    out = []
    for s in view.sub_qas:
        later = [d for d in s.depends_on if d >= s.index]
        if later:
            out.append(
                StepVerdict(
                    index=s.index, score=0.0, reason=f"q_{s.index} runs before {later}, which it depends on"
                )
            )
        elif s.index not in feeding:
            out.append(
                StepVerdict(
                    index=s.index,
                    score=0.0,
                    reason=f"q_{s.index} is superfluous: nothing that leads to a0 uses it",
                )
            )
        else:
            out.append(
                StepVerdict(
                    index=s.index, score=1.0, reason=f"q_{s.index} runs after its dependencies and feeds a0"
                )
            )
    return StepVerdicts(verdicts=out)


def _split_answers(text: str, answers: set[str]) -> list[str] | None:
    """``text`` as a list of known sub-answers joined by ', ' / ' and ' / ' or '; None otherwise."""
    t = norm(text)
    if t in answers:
        return [t]
    for sep in (", ", " and ", " or "):
        for m in re.finditer(re.escape(sep), t):
            head = t[: m.start()]
            if head in answers and (rest := _split_answers(t[m.end() :], answers)) is not None:
                return [head, *rest]
    return None


def recompute(question: str, answers: set[str]) -> tuple[str | None, str]:
    """What an operation yields from the sub-answers it quotes: (result, why); result None = unsupported."""
    q = " ".join(question.split())
    op = operation_of(q)
    m: re.Match[str] | None
    if op == "compare" and (m := re.search(r"has the (higher|lower|highest|lowest) .+?: (.+)\?$", q, re.I)):
        pairs = re.findall(r"(?:^|, | or )(.+?) \(([^()]*)\)", m.group(2))
        if len(pairs) < 2 or any(norm(v) not in answers for _, v in pairs):
            return None, "compares values that are not sub-answers"
        nums = [_num(v) for _, v in pairs]
        if any(n is None for n in nums):
            return None, "compares non-numeric values"
        best = (max if m.group(1).lower() in ("higher", "highest") else min)(n for n in nums if n is not None)
        return pairs[nums.index(best)][0], "compared the quoted sub-answers"
    if op == "sum" and (m := re.search(r"sum of (.+)\?$", q, re.I)):
        parts = _split_answers(m.group(1), answers)
        nums = [_num(p) for p in parts or []]
        if not parts or any(n is None for n in nums):
            return None, "adds values that are not numeric sub-answers"
        return _num_text(sum(n for n in nums if n is not None)), "added the quoted sub-answers"
    if op == "count" and (m := re.search(r'how many of (.+) are "(.+)"\?$', q, re.I)):
        parts = _split_answers(m.group(1), answers)
        if not parts:
            return None, "counts values that are not sub-answers"
        return str(sum(1 for p in parts if p == norm(m.group(2)))), "counted the quoted sub-answers"
    if op == "same" and (m := re.search(r"^are (.+) the same .+\?$", q, re.I)):
        parts = _split_answers(m.group(1), answers)
        if not parts or len(parts) < 2:
            return None, "compares values that are not sub-answers"
        return ("yes" if len(set(parts)) == 1 else "no"), "compared the quoted sub-answers"
    if op == "format" and (m := re.search(r"value (.+) in plain form\.?$", q, re.I)):
        if norm(m.group(1)) not in answers:
            return None, "restates a value that is not a sub-answer"
        return m.group(1), "restated a sub-answer"
    return "", "operation not checkable by rules"


def completeness(view: QaJudgeInput) -> BinaryJudgement:
    """TC: a0 is the final step's answer, operations recompute, every lookup key is supplied."""
    if not view.sub_qas:
        return BinaryJudgement(score=0.0, reason="no sub-questions")
    final = view.sub_qas[-1]
    if norm(view.answer) != norm(final.answer):
        return BinaryJudgement(
            score=0.0, reason=f"a0 {view.answer!r} is not what the final step yields ({final.answer!r})"
        )
    answers = _answers(view)
    for s in view.sub_qas:
        others = {norm(a) for j, a in answers.items() if j != s.index}
        if operation_of(s.question) is not None and s.index in _ancestors(view, final.index):
            result, why = recompute(s.question, others)
            if result is None:
                return BinaryJudgement(score=0.0, reason=f"step {s.index} {why}")
            if result and norm(result) != norm(s.answer):
                return BinaryJudgement(
                    score=0.0, reason=f"step {s.index} answers {s.answer!r} but {why} gives {result!r}"
                )
        g = s.grounding
        if g is not None and not mentions(view.question, g.key) and norm(g.key) not in others:
            return BinaryJudgement(
                score=0.0, reason=f"step {s.index} looks up {g.key!r}, which neither q0 nor any answer gives"
            )
    uncovered = [
        k
        for k in Kb(view.knowledge).all_keys()
        if mentions(view.question, k) and not any(mentions(s.question, k) for s in view.sub_qas)
    ]
    if uncovered:
        return BinaryJudgement(score=0.0, reason=f"q0 names {uncovered[:3]}, which no sub-question handles")
    return BinaryJudgement(score=1.0, reason=f"the sub-answers derive a0 = {view.answer!r}")


# --------------------------------------------------------------------------- registry


def _synthesis_rule(inputs: BaseModel, rng: random.Random) -> BaseModel:
    if not isinstance(inputs, QaSynthesisInput):
        raise TypeError(f"expected QaSynthesisInput, got {type(inputs).__name__}")
    return qa_synthesis(inputs, rng)


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    QA_SYNTHESIS.name: _synthesis_rule,
    QA_TOOL_NEED.name: typed_rule(ToolNeedInput, tool_needs),
    QA_DEPENDENCY.name: typed_rule(QaJudgeInput, dependency),
    QA_ATOMICITY.name: typed_rule(QaJudgeInput, atomicity),
    QA_SEQUENCE.name: typed_rule(QaJudgeInput, sequence),
    QA_COMPLETENESS.name: typed_rule(QaJudgeInput, completeness),
}

"""Rules for QA synthesis (ASTRA §2.2.1): knowledge-base walks, with flaws the QA judges must catch.

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
the judge meant to catch it does. The judges (DC, SA, SR, TC) and the
tool-need rule live in ``simulator.qa_judges`` and decide by inspecting the
instance, with no hidden label; the knowledge-base view (``Kb``) and the
answer-text helpers both sides use live in ``simulator.knowledge``.
"""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from arena.llm.core import Undecidable
from arena.records.envs import STRUCTURES, Grounding, KnowledgeBase, Structure, SubQA
from simulator.knowledge import Kb, Route, cell_text, mentions_token, number_text, to_number
from simulator.qa_judges import atomicity, completeness, dependency, sequence, tool_needs
from simulator.text import join_list
from synthesis.envs.passages import prune_knowledge
from synthesis.envs.roles.qa import QaDraft, QaJudgeInput, QaSynthesisInput, ToolNeedInput
from synthesis.envs.text import norm

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
        return f"Which {e0} has the {plan.direction} {cp}: {join_list(keys, 'or')}?"
    if plan.op == "sum":
        return f"What is the total {cp} of the {kb.plural(plan.route.start)} {join_list(keys, 'and')}?"
    if plan.op == "count":
        return f'How many of the {kb.plural(plan.route.start)} {join_list(keys, "and")} have the {cp} "{plan.target}"?'
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
        nums = [to_number(v) for v in values]
        if any(n is None for n in nums):
            raise Infeasible(f"cannot compare non-numeric values {list(values)}")
        best = (max if leaf["direction"] == "higher" else min)(n for n in nums if n is not None)
        if sum(1 for n in nums if n == best) > 1:
            raise Infeasible(f"the values tie at {number_text(best)}; nothing to compare")
        pairs = [f"{k} ({v})" for k, v in zip(keys, values, strict=True)]
        question = (
            f"Which {leaf['entity']} has the {leaf['direction']} {leaf['column']}: {join_list(pairs, 'or')}?"
        )
        return question, keys[nums.index(best)]
    if op == "sum":
        nums = [to_number(v) for v in values]
        if any(n is None for n in nums):
            raise Infeasible(f"cannot add non-numeric values {list(values)}")
        return f"What is the sum of {join_list(list(values), 'and')}?", number_text(
            sum(n for n in nums if n is not None)
        )
    if op == "count":
        hits = sum(1 for v in values if norm(v) == norm(leaf["target"]))
        return f'How many of {join_list(list(values), "and")} are "{leaf["target"]}"?', str(hits)
    same = len({norm(v) for v in values}) == 1
    return f"Are {join_list(list(values), 'and')} the same {leaf['column']}?", "yes" if same else "no"


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
        value = to_number(answer) or 0.0
        return number_text(value + rng.choice([1, 2]) * (1 if op == "count" else max(1.0, abs(value) // 10)))
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
        if e.sid not in s.deps and not mentions_token(s.question, e.answer)
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
            if norm(answer) == norm(inst.answer) or any(
                mentions_token(t.question, answer) for t in inst.steps
            ):
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
    """The table draft for ``inputs`` (the registered rule, ``simulator.prose_qa``, also reads prose)."""
    return synthesize_instance(inputs, rng)[0]

"""QA quality validation (ASTRA §2.2.2, eq. 13-21).

Order: the tool-need classification (role ``qa_tool_need``) replaces the
draft's own needs_tool claims; a tool step must be grounded; the leaf rule
drops instances where a no-tool step has dependents (it would break the tool
chain); then the four judges score the survivors: DC_i, SA_i, SR_i per
sub-question (binary, averaged over the m sub-questions) and TC per instance
(binary); QS is their mean and the instance is kept when QS >= qs_threshold.

Each role's prompt carries the trace's knowledge cut to the role's context
budget, grounded rows and chunks first; what was cut is added to the trace's
``context_cut``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from arena.config import ArenaSettings, EnvSettings
from arena.llm.core import Answer, Role
from arena.llm.gateway import Gateway
from arena.records.envs import ContextCut, QaTrace, SubQA
from synthesis.envs.context import role_budget
from synthesis.envs.kb_fit import fit_knowledge, grounded_order
from synthesis.envs.qa_synthesis import env_settings
from synthesis.envs.roles.qa import (
    QA_ATOMICITY,
    QA_COMPLETENESS,
    QA_DEPENDENCY,
    QA_SEQUENCE,
    QA_TOOL_NEED,
    QaJudgeInput,
    StepVerdicts,
    ToolNeedInput,
    ToolNeeds,
)

GATE_LEAF = "non_tool_inner_node"
GATE_QUALITY = "quality_below_threshold"
GATE_UNGROUNDED = "ungrounded_tool_step"
"""A sub-question classified as needing a tool that names no table lookup: no tool can be built."""


# --------------------------------------------------------------------------- formulas (eq. 14-21)


def _flags(flags: Sequence[float | bool]) -> list[float]:
    out = [float(f) for f in flags]
    bad = [f for f in out if f not in (0.0, 1.0)]
    if bad:
        raise ValueError(f"per-sub-question indicators are binary (0 or 1), got {bad[:3]}")
    return out


def _mean(flags: Sequence[float | bool]) -> float:
    values = _flags(flags)
    return sum(values) / len(values) if values else 0.0


def dc(flags: Sequence[float | bool]) -> float:
    """Dependency consistency (eq. 15): the mean of DC_i over the m sub-questions; 0 when m = 0."""
    return _mean(flags)


def sa(flags: Sequence[float | bool]) -> float:
    """Sub-question atomicity (eq. 17): the mean of SA_i; 0 when m = 0."""
    return _mean(flags)


def sr(flags: Sequence[float | bool]) -> float:
    """Sequential rationality (eq. 19): the mean of SR_i; 0 when m = 0."""
    return _mean(flags)


def tc(flag: float | bool) -> float:
    """Task completeness (eq. 20): the instance-level binary indicator as a float."""
    return _flags([flag])[0]


def qs(dc: float, sa: float, sr: float, tc: float) -> float:
    """Quality score (eq. 21): the mean of the four dimensions."""
    for name, value in (("DC", dc), ("SA", sa), ("SR", sr), ("TC", tc)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {value}")
    return (dc + sa + sr + tc) / 4


def leaf_rule_violations(sub_qas: Sequence[SubQA]) -> list[int]:
    """Indices of no-tool sub-questions that another sub-question depends on (allowed only at leaves)."""
    used = {d for s in sub_qas for d in s.depends_on}
    return sorted(s.index for s in sub_qas if not s.needs_tool and s.index in used)


# --------------------------------------------------------------------------- validation

In = TypeVar("In", ToolNeedInput, QaJudgeInput)


def fitted(
    role: Role[In, Any], inputs: In, settings: ArenaSettings | EnvSettings, cuts: list[ContextCut]
) -> In:
    """``inputs`` with their knowledge cut to ``role``'s budget (grounded rows first); cuts appended."""
    knowledge, cut = fit_knowledge(
        inputs.knowledge,
        lambda kb: role.messages(inputs.model_copy(update={"knowledge": kb})),
        role_budget(settings, role.name),
        role.name,
        grounded_order(inputs.knowledge, inputs.sub_qas),
    )
    if cut is None:
        return inputs
    cuts.append(cut)
    return inputs.model_copy(update={"knowledge": knowledge})


@dataclass(frozen=True)
class Verdict:
    """What validation decided about one trace."""

    keep: bool
    gate: str | None
    """None when kept; else GATE_LEAF, GATE_UNGROUNDED or GATE_QUALITY."""
    reason: str
    scores: dict[str, float]
    """DC, SA, SR, TC and QS once the judges ran (empty when an earlier gate dropped the trace)."""
    trace: QaTrace
    """The trace with the classified needs_tool/operation per sub-question and the scores."""
    answers: list[Answer[Any]] = field(default_factory=list)
    """Every role answer used, for lineage."""
    failures: dict[str, list[str]] = field(default_factory=dict)
    """Per dimension: the judges' reasons for each 0."""


def classified(sub_qas: Sequence[SubQA], needs: ToolNeeds) -> list[SubQA]:
    """The sub-QAs with needs_tool/operation as the classifier says (unclassified ones keep their claim)."""
    by_index = {n.index: n for n in needs.items}
    out = []
    for s in sub_qas:
        n = by_index.get(s.index)
        if n is None:
            out.append(s)
        else:
            op = None if n.needs_tool else (n.operation or s.operation)
            out.append(s.model_copy(update={"needs_tool": n.needs_tool, "operation": op}))
    return out


def per_step(verdicts: StepVerdicts, indices: Sequence[int]) -> tuple[list[float], list[str]]:
    """One flag per sub-question (a missing verdict counts 0) and the reasons of the zeros."""
    given: dict[int, tuple[float, str]] = {}
    for v in verdicts.verdicts:
        given.setdefault(v.index, (v.score, v.reason))
    flags, why = [], []
    for i in indices:
        score, reason = given.get(i, (0.0, "the judge gave no verdict"))
        flags.append(score)
        if score == 0.0:
            why.append(f"{i}: {reason}")
    return flags, why


async def validate(trace: QaTrace, gw: Gateway, settings: ArenaSettings | EnvSettings) -> Verdict:
    """Tool-need classification -> grounding -> leaf rule -> DC, SA, SR, TC -> QS >= threshold.

    Raises ``InvalidOutput`` when a role's output stays invalid (the stage dead-letters the trace).
    """
    threshold = env_settings(settings).qs_threshold
    cuts: list[ContextCut] = []
    need_in = ToolNeedInput(question=trace.question, sub_qas=trace.sub_qas, knowledge=trace.knowledge)
    need = await gw.call(QA_TOOL_NEED, fitted(QA_TOOL_NEED, need_in, settings, cuts))
    subs = classified(trace.sub_qas, need.output)
    trace = trace.model_copy(update={"sub_qas": subs, "context_cut": [*trace.context_cut, *cuts]})
    cuts = []
    ungrounded = [s.index for s in subs if s.needs_tool and s.grounding is None]
    if ungrounded:
        reason = f"sub-questions {ungrounded} need a tool but name no table lookup to build it from"
        return Verdict(False, GATE_UNGROUNDED, reason, {}, trace, [need])
    inner = leaf_rule_violations(subs)
    if inner:
        ops = ", ".join(f"{i} ({next(s.operation for s in subs if s.index == i)})" for i in inner)
        reason = f"no-tool sub-questions {ops} have dependents; no-tool steps are allowed only at leaves"
        return Verdict(False, GATE_LEAF, reason, {}, trace, [need])
    view = QaJudgeInput(
        question=trace.question,
        answer=trace.answer,
        structure=trace.structure,
        sub_qas=subs,
        knowledge=trace.knowledge,
    )
    dep, atom, seq, comp = await asyncio.gather(
        gw.call(QA_DEPENDENCY, fitted(QA_DEPENDENCY, view, settings, cuts)),
        gw.call(QA_ATOMICITY, fitted(QA_ATOMICITY, view, settings, cuts)),
        gw.call(QA_SEQUENCE, fitted(QA_SEQUENCE, view, settings, cuts)),
        gw.call(QA_COMPLETENESS, fitted(QA_COMPLETENESS, view, settings, cuts)),
    )
    if cuts:
        trace = trace.model_copy(update={"context_cut": [*trace.context_cut, *cuts]})
    indices = [s.index for s in subs]
    failures: dict[str, list[str]] = {}
    flags: dict[str, list[float]] = {}
    for name, answer in (("DC", dep), ("SA", atom), ("SR", seq)):
        flags[name], why = per_step(answer.output, indices)
        if why:
            failures[name] = why
    if comp.output.score == 0.0:
        failures["TC"] = [comp.output.reason]
    scores = {
        "DC": dc(flags["DC"]),
        "SA": sa(flags["SA"]),
        "SR": sr(flags["SR"]),
        "TC": tc(comp.output.score),
    }
    scores["QS"] = qs(scores["DC"], scores["SA"], scores["SR"], scores["TC"])
    keep = scores["QS"] >= threshold
    summary = ", ".join(f"{k} {v:.2f}" for k, v in scores.items())
    faults = "; ".join(f"{k}: {' | '.join(v)}" for k, v in failures.items())
    if keep:
        reason = f"QS {scores['QS']:.3f} >= {threshold} ({summary})" + (f"; {faults}" if faults else "")
    else:
        reason = f"QS {scores['QS']:.3f} < {threshold} ({summary}); {faults}"
    return Verdict(
        keep,
        None if keep else GATE_QUALITY,
        reason,
        scores,
        trace.model_copy(update={"scores": scores}),
        [need, dep, atom, seq, comp],
        failures,
    )

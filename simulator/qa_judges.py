"""Rules for the QA quality roles (ASTRA §2.2.2): tool need and the four quality judges.

Each judge decides by inspecting the instance it is shown, with no hidden label:
DC_i = d_i lists exactly the earlier answers q_i names; SA_i = q_i is one
lookup or one operation (no "X and the Y"); SR_i = every dependency comes
earlier and the step feeds the final step; TC = a0 is the final answer, every
operation recomputes from the sub-answers it quotes, and every lookup key
comes from q0 or another answer. Tool need: a sub-question needs a tool unless
it is a linguistic operation on known answers (``OPERATIONS``).

QA synthesis (``simulator.qa``) keeps a drafted flaw only if the judge meant
to catch it does.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable

from pydantic import BaseModel

from simulator.judges import typed_rule
from simulator.knowledge import Kb, mentions_token, number_text, to_number
from synthesis.envs.roles.qa import (
    QA_ATOMICITY,
    QA_COMPLETENESS,
    QA_DEPENDENCY,
    QA_SEQUENCE,
    QA_TOOL_NEED,
    QaJudgeInput,
    StepVerdict,
    StepVerdicts,
    ToolNeed,
    ToolNeedInput,
    ToolNeeds,
)
from synthesis.envs.text import norm
from synthesis.sft.roles.judges import BinaryJudgement

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
            d
            for d in s.depends_on
            if d in answers and d != s.index and not mentions_token(s.question, answers[d])
        ]
        named = {norm(a): j for j, a in answers.items() if j < s.index and mentions_token(s.question, a)}
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
        nums = [to_number(v) for _, v in pairs]
        if any(n is None for n in nums):
            return None, "compares non-numeric values"
        best = (max if m.group(1).lower() in ("higher", "highest") else min)(n for n in nums if n is not None)
        return pairs[nums.index(best)][0], "compared the quoted sub-answers"
    if op == "sum" and (m := re.search(r"sum of (.+)\?$", q, re.I)):
        parts = _split_answers(m.group(1), answers)
        nums = [to_number(p) for p in parts or []]
        if not parts or any(n is None for n in nums):
            return None, "adds values that are not numeric sub-answers"
        return number_text(sum(n for n in nums if n is not None)), "added the quoted sub-answers"
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
        if g is not None and not mentions_token(view.question, g.key) and norm(g.key) not in others:
            return BinaryJudgement(
                score=0.0, reason=f"step {s.index} looks up {g.key!r}, which neither q0 nor any answer gives"
            )
    uncovered = [
        k
        for k in Kb(view.knowledge).all_keys()
        if mentions_token(view.question, k) and not any(mentions_token(s.question, k) for s in view.sub_qas)
    ]
    if uncovered:
        return BinaryJudgement(score=0.0, reason=f"q0 names {uncovered[:3]}, which no sub-question handles")
    return BinaryJudgement(score=1.0, reason=f"the sub-answers derive a0 = {view.answer!r}")


# --------------------------------------------------------------------------- registry


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    QA_TOOL_NEED.name: typed_rule(ToolNeedInput, tool_needs),
    QA_DEPENDENCY.name: typed_rule(QaJudgeInput, dependency),
    QA_ATOMICITY.name: typed_rule(QaJudgeInput, atomicity),
    QA_SEQUENCE.name: typed_rule(QaJudgeInput, sequence),
    QA_COMPLETENESS.name: typed_rule(QaJudgeInput, completeness),
}

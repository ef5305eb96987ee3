"""Rules judges for the seven trajectory judgements of ASTRA §2.1.5.

Each judge computes its score from the view it is given (never from hidden
knowledge such as the task's chain) and raises ``Undecidable`` when the view
does not allow a decision (no assistant message to judge, a round without the
tool response it should react to, a call that is not where the view says).
The gateway retries an undecidable judge and then dead-letters it, so a judge
never falls back to a default score.

Reading of tasks, tools and tool results is shared with the rules agent
(``simulator.reading``): a failed tool response is a JSON object with an
``error`` (or ``isError: true``) or an error / timeout text.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel

from arena.llm.core import Undecidable
from simulator.reading import (
    CallRecord,
    Evidence,
    ResultRecord,
    acknowledges_failure,
    call_problems,
    canonical_arguments,
    grounded,
    has_term,
    is_round,
    leaves,
    mentions,
    message_text,
    read_calls,
    read_results,
    read_tools,
    relevant_to_task,
    result_key_values,
    stated_values,
    terms,
    uses_output,
    words,
)
from synthesis.sft.roles.judges import (
    ANSWER_CORRELATION,
    ANSWER_SUMMARY,
    CALL_CONCISENESS,
    QUERY_PLANNING,
    QUERY_UNDERSTANDING,
    ROUND_PLANNING,
    ROUND_UNDERSTANDING,
    AnswerView,
    BinaryJudgement,
    CallView,
    GradedJudgement,
    Judgement,
    RoundView,
    TrajectoryView,
)


def _graded(good: int, total: int) -> float:
    """All good -> 1, none -> 0, some -> 0.5."""
    if good == total:
        return 1.0
    return 0.0 if good == 0 else 0.5


def _task_of(messages: Sequence[dict[str, Any]]) -> str:
    if not messages or messages[0].get("role") != "user" or not message_text(messages[0]).strip():
        raise Undecidable("the view does not start with the user task m1")
    return message_text(messages[0])


def _m2(messages: Sequence[dict[str, Any]]) -> dict[str, Any]:
    if len(messages) < 2 or messages[1].get("role") != "assistant":
        raise Undecidable("no assistant response m2 follows the task")
    return messages[1]


def _spoken(message: dict[str, Any], calls: Sequence[CallRecord]) -> str:
    """What an assistant message says and does, as one text: content, call names and argument values."""
    values = [str(leaf.value) for c in calls for leaf in leaves(c.arguments or {}) if leaf.value is not None]
    return "\n".join([message_text(message), *(c.name for c in calls), *values])


def _observations(messages: Sequence[dict[str, Any]], before: int) -> list[Any]:
    """Data of the successful tool results among ``messages[:before]``."""
    results = read_results(messages[:before])
    return [r.data if r.data is not None else r.text for r in results.values() if r.ok]


# --------------------------------------------------------------------------- QU, QP (eq. 3-4)


def query_understanding(view: TrajectoryView) -> GradedJudgement:
    """Does m2 address the request and carry the values it states?"""
    task = _task_of(view.messages)
    m2 = _m2(view.messages)
    calls = [c for c in read_calls(view.messages) if c.message == 1]
    said = _spoken(m2, calls)
    if not said.strip():
        return GradedJudgement(score=0.0, reason="m2 is empty: no text and no tool call")
    values = stated_values(task)
    carried = [v for v in values if mentions(said, v.text)]
    key_terms = set(terms(task, drop_request=True))
    said_terms = terms(said)
    covered = [t for t in key_terms if has_term(t, said_terms)]
    specs = read_tools(view.tools)
    evidence = Evidence(task=task)
    invented = [
        f"{c.name}.{k}"
        for c in calls
        if c.name in specs and c.arguments
        for k, v in c.arguments.items()
        if not grounded(v, specs[c.name].param(k), evidence)
    ]
    value_share = len(carried) / len(values) if values else 1.0
    term_share = len(covered) / len(key_terms) if key_terms else 1.0
    detail = (
        f"m2 carries {len(carried)}/{len(values)} stated values and {len(covered)}/{len(key_terms)} key terms"
        + (f"; invented values in {', '.join(invented)}" if invented else "")
    )
    if (key_terms and not covered) or (values and not carried and invented):
        return GradedJudgement(score=0.0, reason=f"misunderstood: {detail}")
    if value_share == 1.0 and term_share >= 0.5 and not invented:
        return GradedJudgement(score=1.0, reason=f"understood: {detail}")
    return GradedJudgement(score=0.5, reason=f"partly understood: {detail}")


def query_planning(view: TrajectoryView) -> GradedJudgement:
    """Is m2's plan an executable, grounded first step with existing tools?"""
    task = _task_of(view.messages)
    m2 = _m2(view.messages)
    calls = [c for c in read_calls(view.messages) if c.message == 1]
    specs = read_tools(view.tools)
    if not calls:
        named = [name for name in specs if name in message_text(m2)]
        if named:
            return GradedJudgement(
                score=0.5, reason=f"m2 describes a plan with {', '.join(named)} but issues no call"
            )
        return GradedJudgement(score=0.0, reason="m2 issues no tool call and names no offered tool")
    evidence = Evidence(task=task)
    problems = [call_problems(c, specs, evidence) for c in calls]
    good = sum(1 for p in problems if not p)
    issues = "; ".join(p for ps in problems for p in ps)
    score = _graded(good, len(calls))
    reason = f"{good}/{len(calls)} first calls are existing tools with complete, task-grounded arguments"
    return GradedJudgement(score=score, reason=reason + (f" ({issues})" if issues else ""))


# --------------------------------------------------------------------------- TCU, TCP (eq. 5-7)


def _round(view: RoundView) -> tuple[str, list[CallRecord], int]:
    """Task, calls of round j and the index of the previous round's message in the context."""
    context = view.context
    task = _task_of(context)
    if not is_round(context[-1]):
        raise Undecidable("the context does not end with the assistant message issuing round j")
    rounds = [i for i, m in enumerate(context) if is_round(m)]
    if len(rounds) != view.round_index:
        raise Undecidable(f"round_index {view.round_index} but the context holds {len(rounds)} rounds")
    if len(rounds) < 2:
        raise Undecidable("round 1 has no preceding tool response")
    last = len(context) - 1
    calls = [c for c in read_calls(context) if c.message == last]
    return task, calls, rounds[-2]


def _understood(result: ResultRecord, task: str, said: str, arguments: dict[str, Any] | None) -> bool:
    if not result.ok:
        return False
    values = result_key_values(result, task, arguments)
    if values:
        return any(mentions(said, v) for v in values)
    # Nothing new came back (e.g. {"ok": true}): mentioning the tool or a returned field is enough.
    keys = [w for leaf in leaves(result.data) for w in words(leaf.key)]
    return result.name in said or any(has_term(k, terms(said)) for k in keys)


def round_understanding(view: RoundView) -> GradedJudgement:
    """Does round j reflect the tool responses that precede it?"""
    task, calls, previous = _round(view)
    context = view.context
    results = read_results(context)
    prior_calls = {c.call_id: c for c in read_calls(context)}
    preceding = [r for r in results.values() if previous < r.message < len(context) - 1]
    if not preceding:
        raise Undecidable(f"no tool response precedes round {view.round_index}")
    said = _spoken(context[-1], calls)
    verdicts = []
    for result in preceding:
        if result.ok:
            source = prior_calls.get(result.call_id)
            ok = _understood(result, task, said, source.arguments if source else None)
            verdicts.append((ok, f"{result.name}: {'uses' if ok else 'ignores'} the returned data"))
        else:
            ok = any(c.name == result.name for c in calls) or acknowledges_failure(message_text(context[-1]))
            verdicts.append((ok, f"{result.name} failed: {'noticed' if ok else 'acts as if it succeeded'}"))
    good = sum(1 for ok, _ in verdicts if ok)
    return GradedJudgement(
        score=_graded(good, len(verdicts)),
        reason=f"round {view.round_index}: " + "; ".join(text for _, text in verdicts),
    )


def round_planning(view: RoundView) -> GradedJudgement:
    """Are round j's calls existing tools with complete arguments grounded in the task or earlier outputs?"""
    task, calls, _ = _round(view)
    specs = read_tools(view.tools)
    evidence = Evidence(task=task, outputs=_observations(view.context, len(view.context) - 1))
    problems = [call_problems(c, specs, evidence) for c in calls]
    good = sum(1 for p in problems if not p)
    issues = "; ".join(p for ps in problems for p in ps)
    reason = f"round {view.round_index}: {good}/{len(calls)} calls are grounded, complete next steps"
    return GradedJudgement(
        score=_graded(good, len(calls)), reason=reason + (f" ({issues})" if issues else "")
    )


# --------------------------------------------------------------------------- TC_i (eq. 9)


def call_conciseness(view: CallView) -> BinaryJudgement:
    """0 for a repeat of an earlier identical call that succeeded (or is still in flight) or an unrelated call."""
    calls = read_calls(view.context)
    if view.call_index >= len(calls):
        raise Undecidable(f"call {view.call_index} is not in the context ({len(calls)} calls)")
    call = calls[view.call_index]
    claimed_id = view.call.get("id")
    if (
        call.name != view.call.get("name")
        or (claimed_id is not None and claimed_id != call.call_id)
        or call.message != len(view.context) - 1
    ):
        raise Undecidable(f"call {view.call_index} of the context is not the judged call")
    specs = read_tools(view.tools)
    spec = specs.get(call.name)
    if spec is None:
        return BinaryJudgement(score=0.0, reason=f"{call.name} is not an offered tool")
    results = read_results(view.context)
    key = canonical_arguments(call.arguments)
    for earlier in calls[: view.call_index]:
        if earlier.name != call.name or canonical_arguments(earlier.arguments) != key:
            continue
        outcome = results.get(earlier.call_id)
        if outcome is None:
            return BinaryJudgement(
                score=0.0, reason=f"repeats call {earlier.index} issued before any response"
            )
        if outcome.ok:
            return BinaryJudgement(score=0.0, reason=f"repeats call {earlier.index}, which already succeeded")
    outputs = _observations(view.context, len(view.context) - 1)
    if not relevant_to_task(view.task, spec) and not uses_output(call.arguments, outputs):
        return BinaryJudgement(score=0.0, reason=f"{call.name} has nothing to do with the task")
    return BinaryJudgement(score=1.0, reason=f"{call.name} is a new, task-related call")


# --------------------------------------------------------------------------- Corr, Summ (eq. 10)


def answer_correlation(view: AnswerView) -> Judgement:
    """Share of the query's key terms and stated values that the answer addresses."""
    if not view.query.strip():
        raise Undecidable("empty query")
    if not view.answer.strip():
        raise Undecidable("empty answer: nothing to correlate")
    key_terms = set(terms(view.query, drop_request=True))
    answer_terms = terms(view.answer)
    covered = [t for t in key_terms if has_term(t, answer_terms)]
    values = stated_values(view.query)
    carried = [v for v in values if mentions(view.answer, v.text)]
    term_share = len(covered) / len(key_terms) if key_terms else 1.0
    if values:
        score = (term_share + len(carried) / len(values)) / 2
    else:
        score = term_share
    missing = sorted(set(key_terms) - set(covered)) + [v.text for v in values if v not in carried]
    reason = f"answer covers {len(covered)}/{len(key_terms)} key terms and {len(carried)}/{len(values)} stated values"
    return Judgement(score=score, reason=reason + (f"; missing {', '.join(missing)}" if missing else ""))


_ANSWER_VALUE_KINDS = {"quoted", "date", "id", "number", "url", "email", "path"}


def answer_summary(view: TrajectoryView) -> Judgement:
    """Coverage of the successful results by the final answer, times the share of its values that are supported."""
    task = _task_of(view.messages)
    final = view.messages[-1]
    answer = message_text(final)
    if (
        len(view.messages) < 2
        or final.get("role") != "assistant"
        or final.get("tool_calls")
        or not answer.strip()
    ):
        raise Undecidable("the trajectory does not end with a final assistant answer")
    calls = {c.call_id: c for c in read_calls(view.messages)}
    results = list(read_results(view.messages).values())
    succeeded = [r for r in results if r.ok]
    reflected = [
        r
        for r in succeeded
        if _reflected(r, task, answer, calls[r.call_id].arguments if r.call_id in calls else None)
    ]
    if succeeded:
        coverage = len(reflected) / len(succeeded)
        cover_text = f"{len(reflected)}/{len(succeeded)} successful results reflected"
    elif results:
        coverage = 1.0 if acknowledges_failure(answer) else 0.0
        cover_text = "every call failed; the answer " + ("says so" if coverage else "does not say so")
    else:
        coverage, cover_text = 1.0, "no tool results to summarise"
    corpus = "\n".join([task, *(r.text for r in results)])
    stated = [v for v in stated_values(answer) if v.kind in _ANSWER_VALUE_KINDS]
    unsupported = [v.text for v in stated if not _supported(v.text, v.kind, corpus)]
    faithfulness = 1.0 - len(unsupported) / len(stated) if stated else 1.0
    reason = f"{cover_text}; {len(stated) - len(unsupported)}/{len(stated)} stated values supported"
    if unsupported:
        reason += f" (unsupported: {', '.join(unsupported[:5])})"
    return Judgement(score=coverage * faithfulness, reason=reason)


def _reflected(result: ResultRecord, task: str, answer: str, arguments: dict[str, Any] | None) -> bool:
    values = result_key_values(result, task, arguments)
    if values:
        return any(mentions(answer, v) for v in values)
    keys = [w for leaf in leaves(result.data) for w in words(leaf.key)]
    return not keys or any(has_term(k, terms(answer)) for k in set(terms(" ".join(keys))))


def _supported(value: str, kind: str, corpus: str) -> bool:
    if kind == "number":
        return mentions(corpus, value) or any(
            abs(float(value) - float(n)) < 1e-9 for n in re.findall(r"-?\d+(?:\.\d+)?", corpus)
        )
    return value.casefold() in corpus.casefold()


# --------------------------------------------------------------------------- registry


def typed_rule(
    view_type: type[BaseModel], fn: Callable[[Any], BaseModel]
) -> Callable[[BaseModel, random.Random], BaseModel]:
    """A rule from a deterministic function of one input type (judges need no randomness)."""

    def rule(inputs: BaseModel, rng: random.Random) -> BaseModel:
        if not isinstance(inputs, view_type):
            raise TypeError(f"expected {view_type.__name__}, got {type(inputs).__name__}")
        return fn(inputs)

    return rule


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    QUERY_UNDERSTANDING.name: typed_rule(TrajectoryView, query_understanding),
    QUERY_PLANNING.name: typed_rule(TrajectoryView, query_planning),
    ROUND_UNDERSTANDING.name: typed_rule(RoundView, round_understanding),
    ROUND_PLANNING.name: typed_rule(RoundView, round_planning),
    CALL_CONCISENESS.name: typed_rule(CallView, call_conciseness),
    ANSWER_CORRELATION.name: typed_rule(AnswerView, answer_correlation),
    ANSWER_SUMMARY.name: typed_rule(TrajectoryView, answer_summary),
}

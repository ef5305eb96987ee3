"""The 7-dimension trajectory reward of ASTRA §2.1.5 (eq. 2-10), backend-independent.

A trajectory is tau = m0..m(k-1): m0 the system prompt, m1 the user query, then
assistant turns (with ``tool_calls``), tool results and the final answer.
The judges run through the gateway (``await gateway.call(ROLE, view)``), so
the same formulas hold for the ``rules`` backend and for an LLM.

=====  ===========================================================  ==========================
score  formula (paper)                                              judge input
=====  ===========================================================  ==========================
QU     J_understand(tau minus m0), judging m2, in {0, 0.5, 1}        TrajectoryView
QP     J_plan(tau minus m0), judging m2, in {0, 0.5, 1}              TrajectoryView
TCU    1/(J-1) sum_{j=2..J} J_understand(c_j, u_j)                  RoundView per j >= 2
TCP    1/(J-1) sum_{j=2..J} J_plan(c_j, u_j)                        RoundView per j >= 2
TCS    1/n sum_i S_i, S_i from ``Trajectory.call_status``            (no judge)
TC     1/n sum_i TC_i                                               CallView per call
FA     (Corr(m1, m(k-1)) + Summ(tau minus m0)) / 2                  AnswerView, TrajectoryView
=====  ===========================================================  ==========================

``overall`` is the arithmetic mean of the seven. Rounds: every assistant
message with tool calls is one grouped round u_j (its parallel calls merged);
t_j is that message's index in tau and c_j = m1..m(t_j) (eq. 5). Calls are
numbered i = 0..n-1 in message order.

Edge cases the paper leaves open, and the values chosen here:

==============================  =========================  ===============================================
case                            value                      why
==============================  =========================  ===============================================
one round (J = 1, n >= 1)       TCU = TCP = 1 (vacuous)    No round follows a tool response, so no
                                                           response can have been misread or misused;
                                                           scoring 0 would push agents to add rounds a
                                                           one-step task does not need. The single round
                                                           is still judged by QU/QP (it is m2), TCS, TC,
                                                           and FA judges how its results were used.
no tool call (n = 0, J = 0)     TCU = TCP = TCS = TC = 0   The task passed the tool-necessity gate
                                                           (§2.1.3), so answering without tools is the
                                                           failure these four dimensions measure; the
                                                           vacuous reading of J = 1 does not apply since
                                                           the missing rounds are themselves the error.
                                                           QU, QP and FA are judged as usual.
no final answer (the last       FA = 0; Corr and Summ      eq. 10 judges m(k-1) as the answer; without
message is a tool result or a   are not asked              one nothing answers the query or summarises
turn with tool calls, or the                               the results. The other six are scored.
final text is empty; e.g.
``stop_reason = max_turns``)
a call without a CallStatus     S_i = 0                    It never returned a valid response (e.g. the
                                                           loop stopped before executing it).
tau without m0 (system), m1     MalformedTrajectory        Not a trajectory in the sense of eq. 2: it is
(user) and m2                   (ValueError)               rejected before any judge is asked.
==============================  =========================  ===============================================

A judge that stays invalid or undecidable after the gateway's retries raises
``InvalidOutput`` out of ``score_trajectory``: the trajectory is dead-lettered,
never scored by default.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, Field

from arena.llm.core import Answer, In, Out, Role, Sampling
from arena.records.sft import CallStatus, Trajectory
from synthesis.sft.roles.judges import (
    ANSWER_CORRELATION,
    ANSWER_SUMMARY,
    CALL_CONCISENESS,
    QUERY_PLANNING,
    QUERY_UNDERSTANDING,
    ROUND_PLANNING,
    ROUND_UNDERSTANDING,
    AnswerView,
    CallView,
    Judgement,
    RoundView,
    TrajectoryView,
)

DIMENSIONS = ("QU", "QP", "TCU", "TCP", "TCS", "TC", "FA")
"""The seven scores, in the paper's order."""


class MalformedTrajectory(ValueError):
    """The messages are not m0 (system), m1 (user), m2 (assistant), ...: there is nothing to score."""


class JudgeGateway(Protocol):
    """What the reward needs from ``arena.llm.gateway.Gateway``."""

    async def call(
        self, role: Role[In, Out], inputs: In, sampling: Sampling | None = None
    ) -> Answer[Out]: ...


# --------------------------------------------------------------------------- structure of tau


class Round(BaseModel):
    """A grouped tool-call round u_j."""

    index: Annotated[int, Field(ge=1, description="j, 1-based position among the grouped rounds.")]
    message_index: Annotated[
        int, Field(ge=0, description="t_j, index in tau (m0 = 0) of the assistant message issuing u_j.")
    ]
    calls: Annotated[
        list[dict[str, Any]],
        Field(description="The message's tool calls as sent: {'id', 'type', 'function': {name, arguments}}."),
    ]


class CallRef(BaseModel):
    """One tool call i of tau."""

    index: Annotated[int, Field(ge=0, description="i, 0-based position among all calls in message order.")]
    message_index: Annotated[
        int, Field(ge=0, description="Index in tau of the assistant message issuing it.")
    ]
    call_id: Annotated[str, Field(description="The tool_call id.")]
    name: Annotated[str, Field(description="Tool called.")]
    arguments: Annotated[Any, Field(description="Arguments as sent (usually a JSON string).")]


def grouped_rounds(messages: Sequence[dict[str, Any]]) -> list[Round]:
    """u_1..u_J: each assistant message with tool calls is one round (its parallel calls merged)."""
    rounds: list[Round] = []
    for t, message in enumerate(messages):
        if message.get("role") == "assistant" and message.get("tool_calls"):
            rounds.append(Round(index=len(rounds) + 1, message_index=t, calls=list(message["tool_calls"])))
    return rounds


def tool_calls(messages: Sequence[dict[str, Any]]) -> list[CallRef]:
    """All n tool calls of tau in order."""
    calls: list[CallRef] = []
    for rnd in grouped_rounds(messages):
        for call in rnd.calls:
            fn = call.get("function") or {}
            calls.append(
                CallRef(
                    index=len(calls),
                    message_index=rnd.message_index,
                    call_id=str(call.get("id") or ""),
                    name=str(fn.get("name") or ""),
                    arguments=fn.get("arguments"),
                )
            )
    return calls


def final_answer(messages: Sequence[dict[str, Any]]) -> str | None:
    """The text of m(k-1) when it is a final assistant answer (no tool calls, non-empty), else None."""
    if not messages:
        return None
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "assistant" or last.get("tool_calls") or not isinstance(content, str):
        return None
    return content if content.strip() else None


def check_shape(messages: Sequence[dict[str, Any]]) -> None:
    """Raise ``MalformedTrajectory`` unless tau starts m0 system, m1 user, m2 assistant."""
    roles = [m.get("role") for m in messages[:3]]
    if roles != ["system", "user", "assistant"]:
        raise MalformedTrajectory(f"expected m0 system, m1 user, m2 assistant; got {roles}")


# --------------------------------------------------------------------------- judge views


def query_view(trajectory: Trajectory) -> TrajectoryView:
    """tau minus m0, for QU, QP and Summ."""
    return TrajectoryView(messages=list(trajectory.messages[1:]), tools=trajectory.tools)


def round_views(trajectory: Trajectory) -> list[RoundView]:
    """(c_j, u_j) for j = 2..J, c_j = m1..m(t_j) (eq. 5)."""
    return [
        RoundView(
            context=list(trajectory.messages[1 : rnd.message_index + 1]),
            round_index=rnd.index,
            tools=trajectory.tools,
        )
        for rnd in grouped_rounds(trajectory.messages)
        if rnd.index >= 2
    ]


def call_views(trajectory: Trajectory) -> list[CallView]:
    """Per call i: the task, m1 up to the message issuing it, and the call."""
    task = _text(trajectory.messages[1])
    return [
        CallView(
            task=task,
            context=list(trajectory.messages[1 : call.message_index + 1]),
            call={"id": call.call_id, "name": call.name, "arguments": call.arguments},
            call_index=call.index,
            tools=trajectory.tools,
        )
        for call in tool_calls(trajectory.messages)
    ]


def answer_view(trajectory: Trajectory) -> AnswerView | None:
    """(m1, m(k-1)) for Corr; None without a final answer."""
    answer = final_answer(trajectory.messages)
    return None if answer is None else AnswerView(query=_text(trajectory.messages[1]), answer=answer)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


# --------------------------------------------------------------------------- pure formulas


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def tool_response_score(per_round: Sequence[float], n_rounds: int) -> float:
    """TCU or TCP (eq. 6-7) from the judgements of rounds 2..J; J = 1 -> 1 (vacuous), J = 0 -> 0."""
    if n_rounds == 0:
        return 0.0
    if len(per_round) != n_rounds - 1:
        raise ValueError(f"{len(per_round)} round judgements for J = {n_rounds} (need J - 1)")
    return 1.0 if n_rounds == 1 else mean(per_round)


def call_status_score(statuses: Sequence[bool]) -> float:
    """TCS (eq. 8): mean S_i; 0 when there is no call."""
    return mean([1.0 if ok else 0.0 for ok in statuses]) if statuses else 0.0


def conciseness_score(per_call: Sequence[float]) -> float:
    """TC (eq. 9): mean TC_i; 0 when there is no call."""
    return mean(per_call) if per_call else 0.0


def final_answer_score(correlation: float | None, summary: float | None) -> float:
    """FA (eq. 10): (Corr + Summ) / 2; 0 when there is no final answer (both None)."""
    if correlation is None or summary is None:
        if correlation is not None or summary is not None:
            raise ValueError("Corr and Summ are judged together or not at all")
        return 0.0
    return (correlation + summary) / 2


def overall_score(scores: Mapping[str, float]) -> float:
    """The reward: arithmetic mean of the seven dimensions."""
    if set(scores) != set(DIMENSIONS):
        raise ValueError(f"need exactly {DIMENSIONS}, got {sorted(scores)}")
    return mean([scores[d] for d in DIMENSIONS])


class Judged(BaseModel):
    """The raw judge outcomes of one trajectory: everything the formulas combine."""

    qu: Annotated[float, Field(ge=0, le=1, description="J_understand on m2.")]
    qp: Annotated[float, Field(ge=0, le=1, description="J_plan on m2.")]
    n_rounds: Annotated[int, Field(ge=0, description="J, the number of grouped rounds.")]
    round_understanding: list[float] = Field(default_factory=list, description="TCU judgements, j = 2..J.")
    round_planning: list[float] = Field(default_factory=list, description="TCP judgements, j = 2..J.")
    call_ok: list[bool] = Field(default_factory=list, description="S_i per call, i = 0..n-1.")
    call_conciseness: list[float] = Field(default_factory=list, description="TC_i per call.")
    correlation: Annotated[float | None, Field(description="Corr(m1, m(k-1)); None without an answer.")] = (
        None
    )
    summary: Annotated[float | None, Field(description="Summ(tau minus m0); None without an answer.")] = None


def combine(judged: Judged) -> dict[str, float]:
    """The seven scores from the judge outcomes (eq. 3-10 with the edge cases above)."""
    if len(judged.call_ok) != len(judged.call_conciseness):
        raise ValueError("one S_i and one TC_i per call")
    return {
        "QU": judged.qu,
        "QP": judged.qp,
        "TCU": tool_response_score(judged.round_understanding, judged.n_rounds),
        "TCP": tool_response_score(judged.round_planning, judged.n_rounds),
        "TCS": call_status_score(judged.call_ok),
        "TC": conciseness_score(judged.call_conciseness),
        "FA": final_answer_score(judged.correlation, judged.summary),
    }


def call_success(calls: Sequence[CallRef], statuses: Sequence[CallStatus]) -> list[bool]:
    """S_i per call of tau, from the call statuses by call id; a call without a status is 0."""
    by_id = {s.call_id: s.ok for s in statuses}
    return [by_id.get(c.call_id, False) for c in calls]


def edge_cases(n_rounds: int, has_answer: bool) -> list[str]:
    """Which documented edge cases apply (recorded in the details)."""
    cases = []
    if n_rounds == 0:
        cases.append("no tool call: TCU = TCP = TCS = TC = 0")
    elif n_rounds == 1:
        cases.append("single round: TCU = TCP = 1 (vacuous)")
    if not has_answer:
        cases.append("no final answer: FA = 0")
    return cases


# --------------------------------------------------------------------------- details


class JudgementRecord(BaseModel):
    """A judge's score and reason, and which prompt produced it."""

    score: Annotated[float, Field(description="The judge's score.")]
    reason: Annotated[str, Field(description="The judge's reason.")]
    prompt_version: Annotated[str, Field(description="Prompt version of the judge role.")]


class RoundDetail(BaseModel):
    """Judgements of one round j >= 2."""

    j: Annotated[int, Field(ge=2, description="Round index.")]
    message_index: Annotated[int, Field(ge=0, description="t_j.")]
    tools: Annotated[list[str], Field(description="Tools called in the round.")]
    understanding: Annotated[JudgementRecord, Field(description="J_understand(c_j, u_j).")]
    planning: Annotated[JudgementRecord, Field(description="J_plan(c_j, u_j).")]


class CallDetail(BaseModel):
    """Status and conciseness of one call i."""

    i: Annotated[int, Field(ge=0, description="Call index.")]
    call_id: Annotated[str, Field(description="tool_call id.")]
    tool: Annotated[str, Field(description="Tool called.")]
    ok: Annotated[bool, Field(description="S_i.")]
    error_kind: Annotated[str | None, Field(description="From the call status, when it failed.")] = None
    conciseness: Annotated[JudgementRecord, Field(description="TC_i and why.")]


class ScoreDetails(BaseModel):
    """Everything behind the seven scores (stored as ``ScoredTrajectory.details``)."""

    query_understanding: Annotated[JudgementRecord, Field(description="QU judgement on m2.")]
    query_planning: Annotated[JudgementRecord, Field(description="QP judgement on m2.")]
    rounds: Annotated[list[RoundDetail], Field(description="TCU/TCP judgements per round j >= 2.")]
    calls: Annotated[list[CallDetail], Field(description="S_i and TC_i per call.")]
    correlation: Annotated[JudgementRecord | None, Field(description="Corr; None without a final answer.")]
    summary: Annotated[JudgementRecord | None, Field(description="Summ; None without a final answer.")]
    n_rounds: Annotated[int, Field(ge=0, description="J.")]
    n_calls: Annotated[int, Field(ge=0, description="n.")]
    edge_cases: Annotated[list[str], Field(description="Documented edge cases that applied.")]


@dataclass(frozen=True)
class TrajectoryScore:
    """The reward of one trajectory and what it came from."""

    scores: dict[str, float]
    """QU, QP, TCU, TCP, TCS, TC, FA in [0, 1]."""
    overall: float
    """Mean of the seven."""
    details: dict[str, Any]
    """``ScoreDetails`` as JSON: per-round and per-call judgements with reasons."""
    answers: list[Answer[Any]] = field(default_factory=list)
    """Every judge answer behind the scores (for lineage: prompt versions, backend, model)."""


def _record(answer: Answer[Judgement]) -> JudgementRecord:
    return JudgementRecord(
        score=answer.output.score, reason=answer.output.reason, prompt_version=answer.prompt_version
    )


# --------------------------------------------------------------------------- scoring


async def _ask(
    gateway: JudgeGateway, role: Role[Any, Any], view: BaseModel, sampling: Sampling | None
) -> Answer[Judgement]:
    """One judge call; every judge role answers a ``Judgement`` (or a subclass pinning its scale)."""
    answer: Answer[Any] = await gateway.call(role, view, sampling)
    if not isinstance(answer.output, Judgement):
        raise TypeError(f"judge {role.name} answered {type(answer.output).__name__}, not a Judgement")
    return answer


async def _gather(awaitables: Sequence[Awaitable[Answer[Judgement]]]) -> list[Answer[Judgement]]:
    """All answers; the first failure (e.g. ``InvalidOutput``) is raised once every judge has finished."""
    results = await asyncio.gather(*awaitables, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [r for r in results if not isinstance(r, BaseException)]


async def score_trajectory(
    gateway: JudgeGateway, trajectory: Trajectory, sampling: Sampling | None = None
) -> TrajectoryScore:
    """Ask every judge (concurrently) and combine: the seven scores, their mean and the details."""
    check_shape(trajectory.messages)
    whole = query_view(trajectory)
    rounds = grouped_rounds(trajectory.messages)
    calls = tool_calls(trajectory.messages)
    answer = answer_view(trajectory)
    jobs: list[Awaitable[Answer[Judgement]]] = [
        _ask(gateway, QUERY_UNDERSTANDING, whole, sampling),
        _ask(gateway, QUERY_PLANNING, whole, sampling),
    ]
    views = round_views(trajectory)
    for view in views:
        jobs += [
            _ask(gateway, ROUND_UNDERSTANDING, view, sampling),
            _ask(gateway, ROUND_PLANNING, view, sampling),
        ]
    jobs += [_ask(gateway, CALL_CONCISENESS, view, sampling) for view in call_views(trajectory)]
    if answer is not None:
        jobs += [
            _ask(gateway, ANSWER_CORRELATION, answer, sampling),
            _ask(gateway, ANSWER_SUMMARY, whole, sampling),
        ]
    answers = await _gather(jobs)

    qu, qp = answers[0], answers[1]
    per_round = answers[2 : 2 + 2 * len(views)]
    understanding, planning = per_round[0::2], per_round[1::2]
    per_call = answers[2 + 2 * len(views) : 2 + 2 * len(views) + len(calls)]
    closing = answers[2 + 2 * len(views) + len(calls) :]
    correlation, summary = (closing[0], closing[1]) if closing else (None, None)

    ok = call_success(calls, trajectory.call_status)
    judged = Judged(
        qu=qu.output.score,
        qp=qp.output.score,
        n_rounds=len(rounds),
        round_understanding=[a.output.score for a in understanding],
        round_planning=[a.output.score for a in planning],
        call_ok=ok,
        call_conciseness=[a.output.score for a in per_call],
        correlation=correlation.output.score if correlation else None,
        summary=summary.output.score if summary else None,
    )
    scores = combine(judged)
    statuses = {s.call_id: s for s in trajectory.call_status}
    details = ScoreDetails(
        query_understanding=_record(qu),
        query_planning=_record(qp),
        rounds=[
            RoundDetail(
                j=view.round_index,
                message_index=rounds[view.round_index - 1].message_index,
                tools=[
                    str((c.get("function") or {}).get("name")) for c in rounds[view.round_index - 1].calls
                ],
                understanding=_record(u),
                planning=_record(p),
            )
            for view, u, p in zip(views, understanding, planning, strict=True)
        ],
        calls=[
            CallDetail(
                i=call.index,
                call_id=call.call_id,
                tool=call.name,
                ok=good,
                error_kind=statuses[call.call_id].error_kind if call.call_id in statuses else "no_status",
                conciseness=_record(a),
            )
            for call, good, a in zip(calls, ok, per_call, strict=True)
        ],
        correlation=_record(correlation) if correlation else None,
        summary=_record(summary) if summary else None,
        n_rounds=len(rounds),
        n_calls=len(calls),
        edge_cases=edge_cases(len(rounds), answer is not None),
    )
    return TrajectoryScore(
        scores=scores,
        overall=overall_score(scores),
        details=details.model_dump(mode="json"),
        answers=list(answers),
    )

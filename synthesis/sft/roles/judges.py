"""The seven trajectory judges of ASTRA §2.1.5 (eq. 3-10); TCS needs no judge.

Every judge returns a ``Judgement`` (a score and the reason for it). The
subclasses pin the score scale the paper gives each judge, so the gateway
rejects (and retries) an off-scale answer instead of passing it on:
``GradedJudgement`` in {0, 0.5, 1} (QU, QP, TCU, TCP), ``BinaryJudgement`` in
{0, 1} (TC_i), plain ``Judgement`` in [0, 1] (Corr, Summ).

Views are built by ``synthesis.sft.reward`` from a trajectory tau = m0..m(k-1)
(OpenAI chat messages); the system prompt m0 is never part of a view.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator

from arena.llm.core import JudgeReason, Role

GRADED = (0.0, 0.5, 1.0)
BINARY = (0.0, 1.0)


class TrajectoryView(BaseModel):
    """A whole trajectory without its system prompt: tau minus m0."""

    messages: Annotated[
        list[dict[str, Any]],
        Field(
            description="OpenAI chat messages m1..m(k-1): the user task first, then assistant turns "
            "(with tool_calls) and tool results, ending with the final answer if there is one."
        ),
    ]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools the agent was offered.")]


class RoundView(BaseModel):
    """Grouped tool-call round u_j with its history c_j = m1..m(t_j) (eq. 5)."""

    context: Annotated[
        list[dict[str, Any]],
        Field(
            description="Messages m1..m(t_j): the user task, everything before round j, and last the "
            "assistant message m(t_j) that issues round j (all its parallel calls)."
        ),
    ]
    round_index: Annotated[
        int, Field(ge=2, description="j, 1-based position of the round among grouped rounds (from 2).")
    ]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools the agent was offered.")]


class CallView(BaseModel):
    """One tool call and what preceded it, for the conciseness indicator TC_i (eq. 9)."""

    task: Annotated[str, Field(description="The user task m1.")]
    context: Annotated[
        list[dict[str, Any]],
        Field(
            description="Messages m1..m(t): up to and including the assistant message that issues the "
            "call (earlier calls, their results, and calls issued in parallel with it)."
        ),
    ]
    call: Annotated[
        dict[str, Any],
        Field(description="The judged call: {'id': str, 'name': str, 'arguments': object}."),
    ]
    call_index: Annotated[
        int,
        Field(
            ge=0,
            description="0-based position i of the call among all tool calls of the trajectory, in "
            "message order (calls of one round in their listed order).",
        ),
    ]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools the agent was offered.")]


class AnswerView(BaseModel):
    """The user query m1 and the final answer m(k-1), for Corr (eq. 10)."""

    query: Annotated[str, Field(description="The user task m1.")]
    answer: Annotated[str, Field(description="The final assistant answer m(k-1).")]


class Judgement(BaseModel):
    """A judge's verdict: a score in [0, 1] and why."""

    score: Annotated[float, Field(ge=0.0, le=1.0, description="The score; higher is better.")]
    reason: Annotated[
        JudgeReason, Field(description="One or two sentences naming the evidence for the score.")
    ]


class GradedJudgement(Judgement):
    """A verdict on the three-level scale 0 (wrong), 0.5 (partial), 1 (right)."""

    score: Annotated[
        float,
        Field(
            ge=0.0,
            le=1.0,
            description="0 = wrong, 0.5 = partially right, 1 = right; no other value.",
            json_schema_extra={"enum": list(GRADED)},
        ),
    ]

    @field_validator("score")
    @classmethod
    def _graded(cls, value: float) -> float:
        if value not in GRADED:
            raise ValueError(f"score must be one of {GRADED}, got {value}")
        return value


class BinaryJudgement(Judgement):
    """A yes/no verdict: 1 or 0."""

    score: Annotated[
        float,
        Field(
            ge=0.0,
            le=1.0,
            description="1 = yes, 0 = no; no other value.",
            json_schema_extra={"enum": list(BINARY)},
        ),
    ]

    @field_validator("score")
    @classmethod
    def _binary(cls, value: float) -> float:
        if value not in BINARY:
            raise ValueError(f"score must be 0 or 1, got {value}")
        return value


_COMMON = (
    "You evaluate one part of a tool-use trajectory: OpenAI chat messages where assistant turns may "
    "carry `tool_calls` (name + JSON arguments, several calls in one turn run in parallel) and tool "
    "results come back as messages with role 'tool' (a JSON result, or an error such as a timeout). "
    "Judge only from what you are given; do not assume facts that are not in the messages.\n"
)
_GRADED_OUT = (
    'Output: one JSON object {"score": number, "reason": string}; score is exactly 0, 0.5 or 1; '
    "reason names the evidence in one or two sentences."
)
_BINARY_OUT = (
    'Output: one JSON object {"score": number, "reason": string}; score is exactly 0 or 1; reason '
    "names the evidence in one sentence."
)
_CONTINUOUS_OUT = (
    'Output: one JSON object {"score": number, "reason": string}; score is a number from 0 to 1 '
    "(two decimals are enough); reason names the evidence in one or two sentences."
)

QUERY_UNDERSTANDING: Role[TrajectoryView, GradedJudgement] = Role(
    name="judge_query_understanding",
    input=TrajectoryView,
    output=GradedJudgement,
    system=_COMMON
    + "Task: judge QUERY UNDERSTANDING. The first message is the user's task; the second is the "
    "assistant's first response m2. Judge ONLY m2 (its text and its tool calls): does it understand "
    "what the user asks for, including every concrete value the task states (names, quoted strings, "
    "numbers, dates, codes)? Later messages are context only.\n"
    "Scale: 1 = m2 addresses the whole request and carries the stated values correctly; 0.5 = it "
    "addresses part of the request, or drops or alters some stated values; 0 = it misreads the "
    "request (a different goal, wrong or invented values) or says nothing relevant.\n" + _GRADED_OUT,
    template="Trajectory without the system prompt, and the tools offered:\n{input}\n\n"
    "Judge the query understanding shown by m2.",
)

QUERY_PLANNING: Role[TrajectoryView, GradedJudgement] = Role(
    name="judge_query_planning",
    input=TrajectoryView,
    output=GradedJudgement,
    system=_COMMON
    + "Task: judge QUERY PLANNING. The first message is the user's task; the second is the assistant's "
    "first response m2. Judge ONLY the plan m2 proposes and the calls it issues: are they calls to "
    "tools that exist in the tool list, with all required arguments filled with values the task "
    "provides (not invented), and are they a plausible first step towards solving the task?\n"
    "Scale: 1 = an executable, sensible first step (every call exists, is complete and is grounded); "
    "0.5 = partly feasible (some calls are fine, others miss arguments, use invented values or do "
    "not help; or a sound plan described but no call issued); 0 = infeasible or wrong (unknown tools, "
    "no usable call, or a plan that cannot lead to the answer).\n" + _GRADED_OUT,
    template="Trajectory without the system prompt, and the tools offered:\n{input}\n\nJudge the plan of m2.",
)

ROUND_UNDERSTANDING: Role[RoundView, GradedJudgement] = Role(
    name="judge_round_understanding",
    input=RoundView,
    output=GradedJudgement,
    system=_COMMON
    + "Task: judge TOOL-RESPONSE UNDERSTANDING for one grouped round. The last message of the context "
    "is the assistant turn issuing round j; the tool results just before it answer round j-1. Does "
    "the round reflect those results correctly? After a success it should use or mention the "
    "returned data accurately; after a failure (error, timeout, unreachable) it should notice it "
    "and retry or adapt, not act as if data had come back.\n"
    "Scale: 1 = every preceding result is understood correctly; 0.5 = some are, others are ignored "
    "or misread; 0 = the round ignores or misreads the preceding results.\n" + _GRADED_OUT,
    template="Round to judge (context c_j ends with the assistant turn u_j):\n{input}\n\n"
    "Judge how round j understands the preceding tool results.",
)

ROUND_PLANNING: Role[RoundView, GradedJudgement] = Role(
    name="judge_round_planning",
    input=RoundView,
    output=GradedJudgement,
    system=_COMMON
    + "Task: judge TOOL-RESPONSE-CONDITIONED PLANNING for one grouped round. The last message of the "
    "context is the assistant turn issuing round j. Do its calls correctly incorporate the earlier "
    "tool results? Every argument value that the user task does not state must come from an earlier "
    "successful tool result (an id, a name, a number returned before); calls must use existing tools "
    "with their required arguments and be a sensible next step for the task.\n"
    "Scale: 1 = every call is a sound next step with grounded, complete arguments; 0.5 = some calls "
    "are, others use values found nowhere earlier, miss arguments or do not help; 0 = no call of the "
    "round is grounded and useful.\n" + _GRADED_OUT,
    template="Round to judge (context c_j ends with the assistant turn u_j):\n{input}\n\n"
    "Judge the planning of round j.",
)

CALL_CONCISENESS: Role[CallView, BinaryJudgement] = Role(
    name="judge_call_conciseness",
    input=CallView,
    output=BinaryJudgement,
    system=_COMMON
    + "Task: judge whether ONE tool call is necessary and non-redundant, given the user task and "
    "what happened before it. The call is `call`; it is issued by the last message of the context "
    "(possibly next to other calls of the same round).\n"
    "Score 0 when the call repeats an identical call (same tool, same arguments) that already "
    "succeeded earlier or is issued twice in the same round, or when it does not help the task "
    "(an unrelated tool or a tool that is not offered). Score 1 otherwise; retrying a call whose "
    "earlier identical attempt FAILED is not redundant.\n" + _BINARY_OUT,
    template="Call to judge, with the task and the context before it:\n{input}\n\n"
    "Is this call necessary and non-redundant?",
)

ANSWER_CORRELATION: Role[AnswerView, Judgement] = Role(
    name="judge_answer_correlation",
    input=AnswerView,
    output=Judgement,
    system="You evaluate how well a final answer corresponds to the user's request.\n"
    "Task: judge CORRELATION between the query and the answer: does the answer address what the "
    "query asks, in the query's own terms, covering each part of the request and the specific "
    "entities and values it names? Do not judge factual correctness here, only whether the answer "
    "responds to this query.\n"
    "Scale: 1 = addresses every part of the request; around 0.5 = addresses part of it; 0 = "
    "unrelated or empty.\n" + _CONTINUOUS_OUT,
    template="Query and final answer:\n{input}\n\nJudge how well the answer corresponds to the query.",
)

ANSWER_SUMMARY: Role[TrajectoryView, Judgement] = Role(
    name="judge_answer_summary",
    input=TrajectoryView,
    output=Judgement,
    system=_COMMON
    + "Task: judge the final answer (the last message) as a FAITHFUL SUMMARY of the trajectory. "
    "Coverage: each successful tool result should be reflected by its key values (the ids, names, "
    "numbers, dates or yes/no outcomes it returned); failed calls may be reported as failed. "
    "Faithfulness: the answer must not state values that appear nowhere in the task or the tool "
    "results.\n"
    "Scale: 1 = every successful result is reflected and nothing is made up; lower in proportion "
    "to the results left out and to the unsupported values stated; 0 = the answer reflects none of "
    "the results or is mostly made up.\n" + _CONTINUOUS_OUT,
    template="Trajectory without the system prompt, and the tools offered:\n{input}\n\n"
    "Judge how faithfully the final answer summarises the tool results.",
)

JUDGES: tuple[Role[Any, Any], ...] = (
    QUERY_UNDERSTANDING,
    QUERY_PLANNING,
    ROUND_UNDERSTANDING,
    ROUND_PLANNING,
    CALL_CONCISENESS,
    ANSWER_CORRELATION,
    ANSWER_SUMMARY,
)
"""All seven judge roles (for prompt registration)."""

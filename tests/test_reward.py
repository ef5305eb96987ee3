"""The 7-dimension trajectory reward (ASTRA eq. 3-10) on hand-built trajectories.

Every trajectory is a realistic OpenAI conversation over a library server
(search_books / get_book / check_availability). The clean one scores 1 on all
seven dimensions; each injected defect moves exactly its targeted score to the
value computed by hand below, and the six others stay where the clean one is.
Judges run through the real gateway on the rules backend.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest
from pydantic import BaseModel

from arena.llm.core import InvalidOutput
from arena.llm.gateway import Gateway
from arena.records.sft import CallStatus, Trajectory
from simulator import RULES
from simulator.backend import RulesBackend
from synthesis.sft.reward import (
    DIMENSIONS,
    Judged,
    MalformedTrajectory,
    TrajectoryScore,
    call_status_score,
    call_success,
    combine,
    conciseness_score,
    final_answer_score,
    grouped_rounds,
    overall_score,
    round_views,
    score_trajectory,
    tool_calls,
    tool_response_score,
)
from synthesis.sft.roles.judges import QUERY_UNDERSTANDING, ROUND_PLANNING, Judgement

TASK = "Find books by 'Ursula K. Le Guin' and check whether the first result is available."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_books",
            "description": "Search the library catalogue for books by title, author or keyword.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "description": "Title, author name or keyword, e.g. 'Dune'."},
                    "limit": {"type": "integer", "description": "Most results to return.", "default": 5},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_book",
            "description": "Get the full record of a book: title, author, year and page count.",
            "parameters": {
                "type": "object",
                "properties": {
                    "book_id": {"type": "string", "description": "Book identifier from search_books."}
                },
                "required": ["book_id"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "check_availability",
            "description": "Check whether a book has copies available for loan at the library.",
            "parameters": {
                "type": "object",
                "properties": {
                    "book_id": {"type": "string", "description": "Book identifier from search_books."}
                },
                "required": ["book_id"],
            },
        },
    },
]

SEARCH_RESULT = {
    "results": [
        {"book_id": "bk-17", "title": "A Wizard of Earthsea", "year": 1968},
        {"book_id": "bk-23", "title": "The Dispossessed", "year": 1974},
    ]
}
CLEAN_ANSWER = (
    "Books by Ursula K. Le Guin: 'A Wizard of Earthsea' (bk-17, 1968) and 'The Dispossessed' (bk-23, 1974). "
    "The first result, 'A Wizard of Earthsea', is available: 2 copies are on the shelf."
)
ONES = dict.fromkeys(DIMENSIONS, 1.0)


# --------------------------------------------------------------------------- building trajectories


def system() -> dict[str, Any]:
    return {"role": "system", "content": "You are a helpful assistant that uses the tools provided."}


def user(text: str = TASK) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def assistant(content: str, *calls: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def tool(call_id: str, name: str, result: Any) -> dict[str, Any]:
    content = result if isinstance(result, str) else json.dumps(result)
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def trajectory(
    messages: list[dict[str, Any]],
    failed: dict[str, str] | None = None,
    stop_reason: str = "answer",
    statuses: list[CallStatus] | None = None,
) -> Trajectory:
    """A Trajectory record; call statuses follow the tool messages unless given (failed: id -> kind)."""
    failed = failed or {}
    if statuses is None:
        statuses = [
            CallStatus(
                call_id=m["tool_call_id"],
                tool=m["name"],
                ok=m["tool_call_id"] not in failed,
                source="mcp",
                error_kind=failed.get(m["tool_call_id"]),
            )
            for m in messages
            if m["role"] == "tool"
        ]
    return Trajectory(
        trajectory_id="traj-test",
        task_id="task-test",
        task=messages[1]["content"],
        server_id="library",
        messages=messages,
        tools=TOOLS,
        call_status=statuses,
        stop_reason=stop_reason,  # type: ignore[arg-type]
        turns=sum(1 for m in messages if m["role"] == "assistant"),
    )


M2 = assistant(
    "You want books by 'Ursula K. Le Guin' and whether the first result is available. "
    "I search the catalogue first.",
    call("c1", "search_books", query="Ursula K. Le Guin"),
)
M3 = tool("c1", "search_books", SEARCH_RESULT)
ROUND2_TEXT = "The first result is 'A Wizard of Earthsea' (bk-17). I check its availability."
CHECK_OK = {"book_id": "bk-17", "available": True, "copies": 2}


def clean() -> Trajectory:
    return trajectory(
        [
            system(),
            user(),
            M2,
            M3,
            assistant(ROUND2_TEXT, call("c2", "check_availability", book_id="bk-17")),
            tool("c2", "check_availability", CHECK_OK),
            assistant(CLEAN_ANSWER),
        ]
    )


def redundant_call() -> Trajectory:
    """(a) Round 2 repeats the successful search c1 with identical arguments next to the new call."""
    return trajectory(
        [
            system(),
            user(),
            M2,
            M3,
            assistant(
                ROUND2_TEXT,
                call("c2", "check_availability", book_id="bk-17"),
                call("c3", "search_books", query="Ursula K. Le Guin"),
            ),
            tool("c2", "check_availability", CHECK_OK),
            tool("c3", "search_books", SEARCH_RESULT),
            assistant(CLEAN_ANSWER),
        ]
    )


def failed_call() -> Trajectory:
    """(b) A parallel get_book in round 2 times out (last round: nothing reacts to it)."""
    return trajectory(
        [
            system(),
            user(),
            M2,
            M3,
            assistant(
                ROUND2_TEXT,
                call("c2", "check_availability", book_id="bk-17"),
                call("c3", "get_book", book_id="bk-17"),
            ),
            tool("c2", "check_availability", CHECK_OK),
            tool("c3", "get_book", "Error: tool 'get_book' timed out after 10s."),
            assistant(CLEAN_ANSWER),
        ],
        failed={"c3": "timeout"},
    )


def ungrounded_argument() -> Trajectory:
    """(c) Round 2 checks 'bk-99', an id neither the task nor any earlier output contains."""
    return trajectory(
        [
            system(),
            user(),
            M2,
            M3,
            assistant(ROUND2_TEXT, call("c2", "check_availability", book_id="bk-99")),
            tool("c2", "check_availability", {"book_id": "bk-99", "available": True, "copies": 2}),
            assistant(CLEAN_ANSWER),
        ]
    )


def answer_ignores_result() -> Trajectory:
    """(d) The answer drops what check_availability returned (its copies), keeping the query's terms."""
    ignoring = (
        "Books by Ursula K. Le Guin: 'A Wizard of Earthsea' (bk-17, 1968) and 'The Dispossessed' (bk-23, 1974). "
        "The first result is 'A Wizard of Earthsea'; its availability was looked up."
    )
    messages = [*clean().messages[:-1], assistant(ignoring)]
    return trajectory(messages)


def score(traj: Trajectory, gateway: Gateway | None = None) -> TrajectoryScore:
    async def run() -> TrajectoryScore:
        gw = gateway or Gateway(RulesBackend(seed=0))
        try:
            return await score_trajectory(gw, traj)
        finally:
            await gw.aclose()

    return asyncio.run(run())


def assert_scores(result: TrajectoryScore, expected: dict[str, float]) -> None:
    assert set(result.scores) == set(DIMENSIONS)
    for dim in DIMENSIONS:
        assert result.scores[dim] == pytest.approx(expected[dim]), (dim, result.details)
    assert result.overall == pytest.approx(sum(expected.values()) / 7)


# --------------------------------------------------------------------------- structure


def test_grouped_rounds_merge_parallel_calls_and_index_messages() -> None:
    messages = redundant_call().messages
    rounds = grouped_rounds(messages)
    assert [(r.index, r.message_index, len(r.calls)) for r in rounds] == [(1, 2, 1), (2, 4, 2)]
    calls = tool_calls(messages)
    assert [(c.index, c.call_id, c.name, c.message_index) for c in calls] == [
        (0, "c1", "search_books", 2),
        (1, "c2", "check_availability", 4),
        (2, "c3", "search_books", 4),
    ]


def test_round_views_start_at_round_two_with_context_m1_to_tj() -> None:
    views = round_views(clean())
    assert [v.round_index for v in views] == [2]
    context = views[0].context
    assert context[0] == user()  # c_j starts at m1: the system prompt is excluded
    assert context[-1]["tool_calls"][0]["id"] == "c2"  # ... and ends with m(t_j)
    assert len(context) == 4  # m1..m4


# --------------------------------------------------------------------------- pure formulas


def test_tool_response_score_means_rounds_two_to_j() -> None:
    assert tool_response_score([1.0, 0.5], n_rounds=3) == 0.75
    assert tool_response_score([0.0], n_rounds=2) == 0.0
    with pytest.raises(ValueError):
        tool_response_score([1.0, 1.0], n_rounds=2)  # J - 1 judgements, no more


def test_edge_case_single_round_is_vacuously_one_and_no_round_is_zero() -> None:
    assert tool_response_score([], n_rounds=1) == 1.0
    assert tool_response_score([], n_rounds=0) == 0.0


def test_call_level_means_and_zero_calls() -> None:
    assert call_status_score([True, False, True, True]) == 0.75
    assert conciseness_score([1.0, 0.0, 1.0]) == pytest.approx(2 / 3)
    assert call_status_score([]) == 0.0
    assert conciseness_score([]) == 0.0


def test_final_answer_is_mean_of_correlation_and_summary() -> None:
    assert final_answer_score(1.0, 0.5) == 0.75
    assert final_answer_score(None, None) == 0.0
    with pytest.raises(ValueError):
        final_answer_score(1.0, None)


def test_overall_is_the_mean_of_exactly_seven() -> None:
    scores = {"QU": 1.0, "QP": 0.5, "TCU": 1.0, "TCP": 0.5, "TCS": 0.75, "TC": 1.0, "FA": 0.75}
    assert overall_score(scores) == pytest.approx(5.5 / 7)
    with pytest.raises(ValueError):
        overall_score({k: v for k, v in scores.items() if k != "FA"})


def test_combine_hand_computed() -> None:
    judged = Judged(
        qu=1.0,
        qp=0.5,
        n_rounds=3,
        round_understanding=[1.0, 0.5],
        round_planning=[0.0, 1.0],
        call_ok=[True, True, False, True],
        call_conciseness=[1.0, 1.0, 1.0, 0.0],
        correlation=0.8,
        summary=0.6,
    )
    assert combine(judged) == pytest.approx(
        {"QU": 1.0, "QP": 0.5, "TCU": 0.75, "TCP": 0.5, "TCS": 0.75, "TC": 0.75, "FA": 0.7}
    )


def test_call_without_status_counts_as_failed() -> None:
    traj = clean()
    only_first = [s for s in traj.call_status if s.call_id == "c1"]
    assert call_success(tool_calls(traj.messages), only_first) == [True, False]


# --------------------------------------------------------------------------- seeded trajectories


def test_clean_trajectory_scores_one_everywhere() -> None:
    result = score(clean())
    assert_scores(result, ONES)
    assert result.details["n_rounds"] == 2 and result.details["n_calls"] == 2
    assert result.details["edge_cases"] == []
    assert {a.backend for a in result.answers} == {"rules"}
    # QU, QP, one round x (TCU, TCP), two calls, Corr, Summ
    assert len(result.answers) == 2 + 2 + 2 + 2


def test_defect_redundant_call_moves_only_tc() -> None:
    result = score(redundant_call())
    # TC_i = 1, 1, 0 (c3 repeats c1, which succeeded): TC = 2/3.
    assert_scores(result, {**ONES, "TC": 2 / 3})
    assert [c["conciseness"]["score"] for c in result.details["calls"]] == [1.0, 1.0, 0.0]


def test_defect_failed_call_moves_only_tcs() -> None:
    result = score(failed_call())
    # S_i = 1, 1, 0: TCS = 2/3; the timed-out get_book is still a new, relevant call (TC_i = 1).
    assert_scores(result, {**ONES, "TCS": 2 / 3})
    assert [c["ok"] for c in result.details["calls"]] == [True, True, False]
    assert result.details["calls"][2]["error_kind"] == "timeout"


def test_defect_ungrounded_argument_moves_only_tcp() -> None:
    result = score(ungrounded_argument())
    # J = 2, the single call of round 2 is ungrounded: J_plan(c_2, u_2) = 0, TCP = 0/1.
    assert_scores(result, {**ONES, "TCP": 0.0})
    assert "bk-99" in result.details["rounds"][0]["planning"]["reason"]


def test_defect_answer_ignoring_a_result_moves_only_fa() -> None:
    result = score(answer_ignores_result())
    # Corr = 1 (all key terms and the stated author); Summ = 1/2 results reflected x 1 (all values
    # supported) = 0.5; FA = (1 + 0.5) / 2.
    assert_scores(result, {**ONES, "FA": 0.75})
    assert result.details["correlation"]["score"] == 1.0
    assert result.details["summary"]["score"] == 0.5


# --------------------------------------------------------------------------- edge cases


def test_single_round_trajectory_has_vacuous_tcu_tcp() -> None:
    task = "Show me the details of book bk-23."
    result = score(
        trajectory(
            [
                system(),
                user(task),
                assistant(
                    f"You asked: {task} I fetch the record of bk-23.", call("c1", "get_book", book_id="bk-23")
                ),
                tool(
                    "c1",
                    "get_book",
                    {
                        "book_id": "bk-23",
                        "title": "The Dispossessed",
                        "author": "Ursula K. Le Guin",
                        "year": 1974,
                    },
                ),
                assistant(
                    "Details of book bk-23: 'The Dispossessed' by Ursula K. Le Guin, published in 1974."
                ),
            ]
        )
    )
    assert_scores(result, ONES)
    assert result.details["rounds"] == []
    assert result.details["edge_cases"] == ["single round: TCU = TCP = 1 (vacuous)"]


def test_single_round_with_failed_call_keeps_vacuous_tcu_tcp_but_not_tcs() -> None:
    task = "Show me the details of book bk-23."
    result = score(
        trajectory(
            [
                system(),
                user(task),
                assistant(
                    f"You asked: {task} I fetch the record of bk-23.", call("c1", "get_book", book_id="bk-23")
                ),
                tool("c1", "get_book", "Error: MCP server unreachable: connection refused"),
                assistant("I could not get the details of book bk-23: the library service is unreachable."),
            ],
            failed={"c1": "unreachable"},
        )
    )
    # Summ: no successful result, the answer reports the failure (coverage 1), its only value
    # bk-23 is in the task (faithfulness 1).
    assert_scores(result, {**ONES, "TCS": 0.0})


def test_zero_tool_calls_scores_zero_on_tool_dimensions() -> None:
    answer = "I think 'A Wizard of Earthsea' by Ursula K. Le Guin is available."
    result = score(trajectory([system(), user(), assistant(answer)]))
    # QU: m2 carries the stated author and 4/7 key terms (ursula, le, guin, available) -> 1.
    # QP: no call, no tool named -> 0. TCU = TCP = TCS = TC = 0 (n = 0, documented).
    # Corr = (4/7 terms + 1/1 values) / 2 = 11/14; Summ = coverage 1 (nothing to summarise) x
    # faithfulness 0 (the title is in neither the task nor a tool result) = 0. FA = 11/28.
    expected = {"QU": 1.0, "QP": 0.0, "TCU": 0.0, "TCP": 0.0, "TCS": 0.0, "TC": 0.0, "FA": 11 / 28}
    assert_scores(result, expected)
    assert result.details["edge_cases"] == ["no tool call: TCU = TCP = TCS = TC = 0"]


def test_no_final_answer_scores_fa_zero_without_asking_answer_judges() -> None:
    truncated = clean().messages[:-1]  # ends with the check_availability result (max turns hit)
    gateway = Gateway(RulesBackend(seed=0))
    result = score(trajectory(truncated, stop_reason="max_turns"), gateway)
    assert_scores(result, {**ONES, "FA": 0.0})
    assert result.details["correlation"] is None and result.details["summary"] is None
    assert result.details["edge_cases"] == ["no final answer: FA = 0"]
    asked = set(gateway.usage.roles)
    assert "judge_answer_correlation" not in asked and "judge_answer_summary" not in asked


def test_last_turn_with_unexecuted_calls_is_no_answer_and_counts_them_failed() -> None:
    messages = [
        *clean().messages[:4],
        assistant(ROUND2_TEXT, call("c2", "check_availability", book_id="bk-17")),
    ]
    result = score(trajectory(messages, stop_reason="max_turns"))
    # c2 was never executed: no CallStatus, S_2 = 0 -> TCS = 1/2; FA = 0 (no answer).
    assert_scores(result, {**ONES, "TCS": 0.5, "FA": 0.0})
    assert result.details["calls"][1]["error_kind"] == "no_status"


def test_malformed_trajectory_is_rejected_before_judging() -> None:
    with pytest.raises(MalformedTrajectory):
        score(trajectory([system(), user()]))
    with pytest.raises(MalformedTrajectory):
        score(trajectory([user(), assistant("hello")]))


# --------------------------------------------------------------------------- judges that cannot decide


def test_undecidable_judge_dead_letters_instead_of_scoring() -> None:
    # Round 2 is issued without the tool response to round 1: TCU cannot be judged.
    messages = [
        system(),
        user(),
        M2,
        assistant(ROUND2_TEXT, call("c2", "check_availability", book_id="bk-17")),
        tool("c2", "check_availability", CHECK_OK),
        assistant(CLEAN_ANSWER),
    ]
    with pytest.raises(InvalidOutput) as caught:
        score(trajectory(messages))
    assert caught.value.role == "judge_round_understanding"
    assert caught.value.attempts == 3
    assert all("undecidable" in e for e in caught.value.errors)


def test_off_scale_judge_output_dead_letters() -> None:
    def off_scale(inputs: BaseModel, rng: random.Random) -> BaseModel:
        return Judgement(score=0.7, reason="somewhere in between")  # QU allows only 0, 0.5, 1

    gateway = Gateway(RulesBackend(seed=0, rules={**RULES, QUERY_UNDERSTANDING.name: off_scale}))
    with pytest.raises(InvalidOutput) as caught:
        score(clean(), gateway)
    assert caught.value.role == QUERY_UNDERSTANDING.name
    assert '"score":0.7' in caught.value.raw.replace(" ", "")


def test_throwing_judge_produces_no_score() -> None:
    def broken(inputs: BaseModel, rng: random.Random) -> BaseModel:
        raise RuntimeError("judge crashed")

    gateway = Gateway(RulesBackend(seed=0, rules={**RULES, ROUND_PLANNING.name: broken}))
    with pytest.raises(RuntimeError, match="judge crashed"):
        score(clean(), gateway)

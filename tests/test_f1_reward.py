"""The F1 reward (ASTRA eq. 30-31 with ``arena.tool_reward``'s rules) on hand-computed cases and hacks.

Every hack the trainer could learn -- echoing a guessed answer through an error payload, spamming
calls, an answer that is a substring of another number or word, repeating a solved call, one dump
answering several sub-tasks, calling a mixed-in tool -- must score strictly below the honest
trajectory, and F1 never exceeds 1.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arena.tool_reward import CallResult, answer_in, error_payload, f1_score, max_matching
from environments.rewards import F1Parts, ToolResult, f1_reward, reward_value, solved_jobs

JOBS = [
    {"index": 10, "question": "Capital of France?", "answer": "Paris"},
    {"index": 11, "question": "Temperature there?", "answer": "42"},
    {"index": 12, "question": "Colour of the sky?", "answer": "blue"},
]


def ok(*texts: str, name: str = "lookup") -> list[ToolResult]:
    return [ToolResult(name=name, content=t) for t in texts]


def honest() -> F1Parts:
    return f1_reward(JOBS, ok("The capital is Paris.", '{"temp": 42}', '{"sky": "blue"}'), 3)


def test_honest_trajectory_scores_one() -> None:
    parts = honest()
    assert (parts.n, parts.n_hat, parts.c) == (3, 3, 3)
    assert parts.f1 == parts.recall == parts.precision == 1.0


def test_partial_solution_with_invalid_and_failed_calls() -> None:
    # 4 emitted calls: two answer sub-tasks 10 and 11, one invalid block, one failed call.
    results = [*ok("The capital is paris.", '{"temp": 42}')]
    results += [ToolResult(name="", content="error: invalid tool call", ok=False)]
    results += [ToolResult(name="get_sky", content="error: timeout after 5.0s", ok=False)]
    parts = f1_reward(JOBS, results, emitted_calls=4)
    # n = 3, solved = 2, c = 4: r = 2/3, p = 2/4, F1 = 2 * 0.5 * (2/3) / (0.5 + 2/3) = 4/7
    assert (parts.n, parts.n_hat, parts.c) == (3, 2, 4)
    assert parts.recall == pytest.approx(2 / 3)
    assert parts.precision == pytest.approx(0.5)
    assert parts.f1 == pytest.approx(4 / 7)
    assert solved_jobs(JOBS, results) == {10, 11}


def test_calls_that_never_ran_still_count_in_c() -> None:
    fewer = f1_reward(JOBS, ok("paris", "42"), emitted_calls=2)
    more = f1_reward(JOBS, ok("paris", "42"), emitted_calls=5)
    # c = 2: p = 1, r = 2/3, F1 = 0.8;  c = 5: p = 0.4, r = 2/3, F1 = 2 * 0.4 * (2/3) / (16/15) = 0.5
    assert (fewer.precision, fewer.f1) == (pytest.approx(1.0), pytest.approx(0.8))
    assert (more.precision, more.f1) == (pytest.approx(0.4), pytest.approx(0.5))
    with pytest.raises(ValueError, match="emitted calls"):
        f1_reward(JOBS, ok("Paris", "42"), emitted_calls=1)


# --------------------------------------------------------------------------- hacks


def test_echo_guessing_through_error_payloads_earns_nothing() -> None:
    # A generated tool answers a bad lookup with {'error': 'no record with ' + guess}: guessing every
    # answer as an argument reads each one back, but an error payload never solves a sub-task.
    guesses = [
        json.dumps({"error": "no record with city 'Paris'"}),
        "{'error': 'no record with temperature 42'}",  # printed as a Python dict
        'looking up...\n{"error": "no record with colour blue", "code": 404}',  # after printed lines
        "Error: no record with blue",
    ]
    hack = f1_reward(JOBS, ok(*guesses), len(guesses))
    assert hack.n_hat == 0 and hack.f1 == 0.0
    assert hack.f1 < honest().f1


def test_an_error_key_that_is_empty_is_not_a_failure() -> None:
    assert not error_payload('{"error": null, "temp": 42}')
    assert f1_reward(JOBS, ok('{"error": null, "temp": 42}'), 1).n_hat == 1


def test_call_spam_lowers_precision() -> None:
    spam = f1_reward(JOBS, ok("The capital is Paris.", '{"temp": 42}', '{"sky": "blue"}', *["noise"] * 7), 10)
    assert spam.recall == 1.0 and spam.precision == pytest.approx(0.3)
    assert spam.f1 < honest().f1


def test_answer_as_substring_does_not_count() -> None:
    assert not answer_in("3", "13") and not answer_in("3", "room 30") and not answer_in("42", "1423")
    assert not answer_in("Paris", "Parisian cafes") and not answer_in("blue", "bluebird")
    assert answer_in("3", "3.0") and answer_in("3.0", "value: 3") and answer_in("1860000", "1,860,000")
    assert answer_in("$4.5 million", "4500000") and answer_in("Zürich", '{"city": "ZURICH"}')
    assert answer_in("New   York", "new\n\tyork city") and answer_in("北京", "首都是北京市")
    hack = f1_reward(JOBS, ok("Parisian", '{"temp": 142}', "bluebird"), 3)
    assert hack.n_hat == 0 and hack.f1 < honest().f1


def test_repeating_a_solved_call_lowers_precision() -> None:
    repeat = f1_reward(JOBS, ok("Paris", "Paris", "Paris", '{"temp": 42}', '{"sky": "blue"}'), 5)
    # each sub-task is solved once: solved = 3, c = 5 -> p = 0.6, F1 = 2 * 0.6 / 1.6 = 0.75
    assert (repeat.n_hat, repeat.precision, repeat.f1) == (3, pytest.approx(0.6), pytest.approx(0.75))
    assert repeat.f1 < honest().f1


def test_one_call_answering_several_sub_tasks_counts_once() -> None:
    # Before: n_hat = 2 from c = 1 gave p = 2 and F1 = 1.33. One call solves one sub-task now.
    dump = f1_reward(JOBS, ok("Paris: 42 degrees, sky blue"), 1)
    # solved = 1: r = 1/3, p = 1, F1 = 2 * (1/3) / (4/3) = 0.5
    assert (dump.n_hat, dump.precision, dump.f1) == (1, 1.0, pytest.approx(0.5))
    assert dump.f1 < honest().f1
    # the matching is maximum: a dump plus a specific call solve two sub-tasks, whatever their order
    for results in (ok("Paris and 42", "Paris"), ok("Paris", "Paris and 42")):
        assert f1_reward(JOBS, results, 2).n_hat == 2


def test_mixed_in_tools_never_solve() -> None:
    results = [*ok("Paris", '{"temp": 42}'), ToolResult(name="weather_of", content='{"sky": "blue"}')]
    parts = f1_reward(JOBS, results, 3, irrelevant={"weather_of"})
    assert parts.n_hat == 2 and parts.f1 < honest().f1


def test_a_sub_task_listed_twice_is_one() -> None:
    jobs = [*JOBS, {**JOBS[0], "index": 13}]
    parts = f1_reward(jobs, ok("The capital is Paris.", '{"temp": 42}', '{"sky": "blue"}'), 3)
    assert (parts.n, parts.f1) == (3, 1.0)
    assert solved_jobs(jobs, ok("Paris")) == {10}


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.sampled_from(["Paris", "42", "blue", "noise", "Paris 42 blue", '{"error": "42"}']), max_size=8
    ),
    st.integers(min_value=0, max_value=4),
)
def test_f1_never_exceeds_one(texts: list[str], extra: int) -> None:
    parts = f1_reward(JOBS, ok(*texts), len(texts) + extra)
    assert 0.0 <= parts.f1 <= 1.0 and 0.0 <= parts.precision <= 1.0 and 0.0 <= parts.recall <= 1.0
    assert parts.n_hat <= min(parts.n, parts.c)


# --------------------------------------------------------------------------- edges and modes


def test_no_solved_sub_task_is_zero_in_every_mode() -> None:
    parts = f1_reward(JOBS, ok("nothing useful", "still nothing"), emitted_calls=2)
    assert parts == F1Parts(n=3, n_hat=0, c=2, recall=0.0, precision=0.0, f1=0.0)
    assert [reward_value(parts, m) for m in ("f1", "recall", "precision")] == [0.0, 0.0, 0.0]
    assert f1_reward(JOBS, [], emitted_calls=0).f1 == 0.0


def test_empty_answers_never_count() -> None:
    jobs = [
        {"index": 0, "question": "q0", "answer": ""},
        {"index": 1, "question": "q1", "answer": "   \n"},
        {"index": 2, "question": "q2", "answer": "ok"},
    ]
    assert solved_jobs(jobs, ok("anything at all", "")) == set()
    parts = f1_reward(jobs, ok("status OK"), emitted_calls=1)  # r = 1/3, p = 1, F1 = 0.5
    assert parts.n_hat == 1 and parts.f1 == pytest.approx(0.5)


def test_jobs_without_index_use_their_position() -> None:
    jobs = [{"question": "a", "answer": "x1"}, {"question": "b", "answer": "y2"}]
    assert solved_jobs(jobs, ok("y2")) == {1}


def test_recall_and_precision_variants() -> None:
    parts = f1_reward(JOBS, ok("Paris", "noise", "noise", "noise"), emitted_calls=4)
    # solved = 1: r = 1/3, p = 1/4, F1 = 2 * (1/12) / (7/12) = 2/7
    assert reward_value(parts, "recall") == pytest.approx(1 / 3)
    assert reward_value(parts, "precision") == pytest.approx(0.25)
    assert reward_value(parts) == parts.f1 == pytest.approx(2 / 7)


def test_max_matching_is_maximum() -> None:
    # greedy would give call 0 sub-task 0 and leave call 1 unmatched; augmenting finds 2
    assert len(max_matching([[0, 1], [0]])) == 2
    assert f1_score(["a", "b"], [CallResult("t", "a b"), CallResult("t", "a")]).solved == 2

"""F1 reward of ASTRA eq. 30-31 and its recall-only / precision-only variants, on hand-computed cases."""

from __future__ import annotations

import pytest

from environments.rewards import F1Parts, f1_reward, reward_value, solved_jobs

EPS = 1e-8

JOBS = [
    {"index": 10, "question": "Capital of France?", "answer": "Paris"},
    {"index": 11, "question": "Temperature there?", "answer": "42"},
    {"index": 12, "question": "Colour of the sky?", "answer": "blue"},
]


def test_partial_solution_with_invalid_and_mixed_in_calls() -> None:
    # 4 emitted calls: two answered sub-tasks 10 and 11, one invalid call (its output is an error),
    # one call to a mixed-in tool (unrelated output). All four count in c.
    outputs = ["The capital is paris.", '{"temp": 42}', "error: invalid tool call", "stock price 17.5"]
    parts = f1_reward(JOBS, outputs, emitted_calls=4)
    # n = 3, n_hat = 2, c = 4: r = 2/3, p = 2/(4 + 1e-8) ~= 0.5, F1 = 2 * 0.5 * (2/3) / (0.5 + 2/3) = 4/7
    assert (parts.n, parts.n_hat, parts.c) == (3, 2, 4)
    assert parts.recall == pytest.approx(2 / 3, abs=1e-12)
    assert parts.precision == pytest.approx(0.5, abs=1e-8)
    assert parts.f1 == pytest.approx(4 / 7, abs=1e-8)
    assert solved_jobs(JOBS, outputs) == {10, 11}


def test_invalid_calls_without_output_still_count_in_c() -> None:
    # Same two solved sub-tasks; 3 more invalid calls that produced no output: c = 5.
    outputs = ["paris", "42"]
    fewer = f1_reward(JOBS, outputs, emitted_calls=2)
    more = f1_reward(JOBS, outputs, emitted_calls=5)
    # c = 2: p = 2/2 = 1, r = 2/3, F1 = 2 * (2/3) / (5/3) = 0.8
    assert fewer.precision == pytest.approx(1.0, abs=1e-8)
    assert fewer.f1 == pytest.approx(0.8, abs=1e-8)
    # c = 5: p = 2/5 = 0.4, r = 2/3, F1 = 2 * 0.4 * (2/3) / (0.4 + 2/3) = (8/15) / (16/15) = 0.5
    assert more.precision == pytest.approx(0.4, abs=1e-8)
    assert more.f1 == pytest.approx(0.5, abs=1e-8)
    assert more.recall == fewer.recall


def test_everything_solved_with_one_call_each() -> None:
    parts = f1_reward(JOBS, ["Paris", "42 degrees", "BLUE"], emitted_calls=3)
    # r = 1, p = 3/(3 + 1e-8) = 1 - 3.3e-9, F1 ~= 1
    assert parts.n_hat == 3
    assert parts.recall == 1.0
    assert parts.f1 == pytest.approx(1.0, abs=1e-8)
    assert parts.f1 < 1.0  # eps keeps p a hair under 1


def test_one_output_answering_two_sub_tasks_follows_the_formula() -> None:
    # eq. 30 as written: n_hat = 2 from c = 1 call gives p = 2 (> 1); F1 = 2 * 2 * (2/3) / (2 + 2/3) = 1
    parts = f1_reward(JOBS, ["Paris: 42 degrees"], emitted_calls=1)
    assert parts.n_hat == 2
    assert parts.precision == pytest.approx(2.0, abs=1e-7)
    assert parts.f1 == pytest.approx(1.0, abs=1e-7)


def test_no_solved_sub_task_is_zero_in_every_mode() -> None:
    parts = f1_reward(JOBS, ["nothing useful", "still nothing"], emitted_calls=2)
    assert parts == F1Parts(n=3, n_hat=0, c=2, recall=0.0, precision=0.0, f1=0.0)
    for mode in ("f1", "recall", "precision"):
        assert reward_value(parts, mode) == 0.0


def test_no_calls_at_all_is_zero() -> None:
    parts = f1_reward(JOBS, [], emitted_calls=0)
    assert (parts.n_hat, parts.f1, parts.precision) == (0, 0.0, 0.0)


def test_empty_answers_never_count() -> None:
    jobs = [
        {"index": 0, "question": "q0", "answer": ""},
        {"index": 1, "question": "q1", "answer": "   \n"},
        {"index": 2, "question": "q2", "answer": "ok"},
    ]
    # "" is a substring of every string; it must not count as solved.
    assert solved_jobs(jobs, ["anything at all", ""]) == set()
    parts = f1_reward(jobs, ["status OK"], emitted_calls=1)
    # only job 2: n_hat = 1, r = 1/3, p = 1, F1 = 2 * (1/3) / (4/3) = 0.5
    assert parts.n_hat == 1
    assert parts.f1 == pytest.approx(0.5, abs=1e-8)


def test_casefold_and_whitespace_normalisation() -> None:
    jobs = [
        {"index": 0, "question": "street?", "answer": "Straße"},
        {"index": 1, "question": "city?", "answer": "New   York"},
        {"index": 2, "question": "word?", "answer": "Zürich"},
    ]
    outputs = [
        "Address: HAUPTSTRASSE 5",  # casefold("Straße") == "strasse" (lower() would not match)
        "new\n\tyork city",  # whitespace runs collapse to one space on both sides
        '{"city": "zürich"}',
    ]
    assert solved_jobs(jobs, outputs) == {0, 1, 2}
    # Normalisation does not invent matches across words.
    assert solved_jobs(jobs, ["newyork", "strase"]) == set()


def test_jobs_without_index_use_their_position() -> None:
    jobs = [{"question": "a", "answer": "x1"}, {"question": "b", "answer": "y2"}]
    assert solved_jobs(jobs, ["y2"]) == {1}


def test_recall_and_precision_variants() -> None:
    parts = f1_reward(JOBS, ["Paris"] + ["noise"] * 3, emitted_calls=4)
    # n_hat = 1: r = 1/3, p = 1/4, F1 = 2 * (1/12) / (7/12) = 2/7
    assert reward_value(parts, "recall") == pytest.approx(1 / 3, abs=1e-12)
    assert reward_value(parts, "precision") == pytest.approx(0.25, abs=1e-8)
    assert reward_value(parts, "f1") == pytest.approx(2 / 7, abs=1e-8)
    assert reward_value(parts) == parts.f1


def test_more_outputs_than_calls_is_a_counting_bug() -> None:
    with pytest.raises(ValueError, match="emitted calls"):
        f1_reward(JOBS, ["Paris", "42"], emitted_calls=1)


def test_broken_environment_gives_zero_reward() -> None:
    # A deliberately broken environment: every tool call fails or returns data unrelated to the answers,
    # however many calls the policy makes. The reward is 0 in every mode.
    broken_outputs = [
        "Traceback (most recent call last): RuntimeError: tool crashed",
        "",
        "error: timeout after 5.0s",
        '{"result": null}',
    ] * 5
    parts = f1_reward(JOBS, broken_outputs, emitted_calls=len(broken_outputs) + 3)
    assert parts.n_hat == 0
    assert [reward_value(parts, mode) for mode in ("f1", "recall", "precision")] == [0.0, 0.0, 0.0]

"""trainer.benchmarks.report: pass^k / pass@k per group and the do-nothing floor, by hand."""

from __future__ import annotations

import pytest

from trainer.benchmarks.report import TaskResult, bench_report, group_score


def test_group_score_by_hand() -> None:
    # task a: 2 of 4 trials pass -> pass^1 = 0.5, pass^2 = C(2,2)/C(4,2) = 1/6, pass@2 = 1 - C(2,2)/C(4,2) = 5/6
    # task b: 4 of 4 pass -> pass^1 = pass^2 = pass@2 = 1; the do-nothing agent passes b only
    a = TaskResult(task_id="a", group="retail", rewards=[1, 0, 1, 0], baseline_reward=0.0)
    b = TaskResult(task_id="b", group="retail", rewards=[1, 1, 1, 1], baseline_reward=1.0)
    g = group_score("retail", [a, b], k=2, trials=4)
    assert g.pass_hat[1] == pytest.approx((0.5 + 1) / 2)
    assert g.pass_hat[2] == pytest.approx((1 / 6 + 1) / 2)
    assert g.pass_at_k == pytest.approx((5 / 6 + 1) / 2)
    assert g.mean_reward == pytest.approx(6 / 8)
    assert g.baseline_pass == 0.5


def test_partial_reward_is_not_a_pass_and_groups_sort() -> None:
    r1 = TaskResult(task_id="x", group="simple", rewards=[0.99], baseline_reward=0.0)
    r2 = TaskResult(task_id="y", group="multiple", rewards=[1.0], baseline_reward=0.0, errors=[])
    report = bench_report("bfcl", "openai://h/v1?model=m", [r1, r2], k=1, trials=1)
    assert [g.group for g in report.groups] == ["multiple", "simple", "all"]
    assert report.groups[1].pass_hat[1] == 0.0
    assert report.groups[2].pass_hat[1] == 0.5


def test_wrong_trial_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="expected 2"):
        group_score(
            "g", [TaskResult(task_id="t", group="g", rewards=[1.0], baseline_reward=0)], k=1, trials=2
        )

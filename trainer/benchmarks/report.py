"""What a public-benchmark evaluation reports (``arena eval --bench tau2|bfcl``).

A benchmark run scores the evaluated model ``trials`` times on each task with the benchmark's own
checker, and scores a do-nothing agent (no tool call, an empty answer) on the same tasks, so a
figure comes with the floor it has to beat: several tau2 airline tasks reward an agent that does
nothing, and a BFCL irrelevance item rewards one that calls no function.

Groups are a tau2 domain or a BFCL category. pass^k (tau-bench) and pass@k (Chen et al.) use the
unbiased estimators of ``trainer.evaluate``; a group's figure is the mean over its tasks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, Field
from rich.table import Table

from trainer.evaluate import pass_at_k, pass_hat_k

Bench = Literal["tau2", "bfcl"]


class TaskResult(BaseModel):
    """The trials of one benchmark task, scored by the benchmark's checker."""

    task_id: Annotated[str, Field(description="The benchmark's own task id.")]
    group: Annotated[str, Field(description="tau2 domain or BFCL category.")]
    rewards: Annotated[list[float], Field(description="The checker's reward per trial (1.0 = pass).")]
    baseline_reward: Annotated[float, Field(description="The do-nothing agent's reward on the task.")]
    errors: list[str] = Field(
        default_factory=list, description="Trials that failed to run (counted as reward 0), with why."
    )

    @property
    def successes(self) -> int:
        """Trials whose reward is a pass (>= 1.0 - 1e-6, as tau2 counts success)."""
        return sum(1 for r in self.rewards if r >= 1.0 - 1e-6)


class GroupScore(BaseModel):
    """pass^k, pass@k and the do-nothing floor of one group of tasks."""

    group: Annotated[str, Field(description="tau2 domain or BFCL category, or 'all'.")]
    tasks: Annotated[int, Field(description="Tasks scored.")]
    trials: Annotated[int, Field(description="Trials per task (n).")]
    pass_hat: Annotated[dict[int, float], Field(description="j -> mean pass^j over tasks, j = 1..k.")]
    pass_at_k: Annotated[float, Field(description="Mean pass@k over tasks.")]
    mean_reward: Annotated[float, Field(description="Mean checker reward over all trials.")]
    baseline_pass: Annotated[
        float,
        Field(description="Share of tasks a do-nothing agent passes (its pass^1: it is deterministic)."),
    ]
    errors: Annotated[int, Field(description="Trials that failed to run.")] = 0


class BenchReport(BaseModel):
    """What ``arena eval --bench`` prints (``--json``: ``model_dump_json()``)."""

    bench: Annotated[Bench, Field(description="Which benchmark.")]
    model: Annotated[str, Field(description="The evaluated endpoint or model.")]
    k: Annotated[int, Field(description="k of pass^k / pass@k.")]
    trials: Annotated[int, Field(description="Trials per task (n >= k).")]
    groups: Annotated[list[GroupScore], Field(description="One per domain/category, sorted, then 'all'.")]
    tasks: Annotated[list[TaskResult], Field(description="Per-task results.")]
    wall_s: Annotated[float, Field(description="Seconds the evaluation took.")] = 0.0
    split: Annotated[
        str | None, Field(description="tau2: the split scored (test, train or all); None for BFCL.")
    ] = None
    user_simulator: Annotated[
        str | None, Field(description="tau2: who plays the user (gateway: the settings' LLM; endpoint).")
    ] = None
    left_out: Annotated[
        dict[str, int], Field(description="Tasks of the split not scored, by reason (needs_judge, limit).")
    ] = Field(default_factory=dict)


def group_score(group: str, results: Sequence[TaskResult], *, k: int, trials: int) -> GroupScore:
    """Mean pass^j (j = 1..k), pass@k, mean reward and the do-nothing floor over ``results``."""
    if not results:
        raise ValueError(f"group {group!r} has no tasks")
    for r in results:
        if len(r.rewards) != trials:
            raise ValueError(f"task {r.task_id}: {len(r.rewards)} rewards, expected {trials}")
    n = len(results)
    pass_hat = {j: sum(pass_hat_k(trials, r.successes, j) for r in results) / n for j in range(1, k + 1)}
    return GroupScore(
        group=group,
        tasks=n,
        trials=trials,
        pass_hat=pass_hat,
        pass_at_k=sum(pass_at_k(trials, r.successes, k) for r in results) / n,
        mean_reward=sum(sum(r.rewards) for r in results) / (n * trials),
        baseline_pass=sum(1 for r in results if r.baseline_reward >= 1.0 - 1e-6) / n,
        errors=sum(len(r.errors) for r in results),
    )


def bench_report(
    bench: Bench, model: str, results: Sequence[TaskResult], *, k: int, trials: int, wall_s: float = 0.0
) -> BenchReport:
    """Groups sorted by name, then 'all' when there is more than one group."""
    names = sorted({r.group for r in results})
    groups = [group_score(g, [r for r in results if r.group == g], k=k, trials=trials) for g in names]
    if len(groups) > 1:
        groups.append(group_score("all", results, k=k, trials=trials))
    return BenchReport(
        bench=bench, model=model, k=k, trials=trials, groups=groups, tasks=list(results), wall_s=wall_s
    )


def bench_table(report: BenchReport) -> Table:
    """The report as a table: one row per group, the do-nothing floor beside the model's figures."""
    table = Table(title=f"{report.bench}: {report.model} (k={report.k}, n={report.trials})")
    if report.split is not None:
        left = ", ".join(f"{n} {why}" for why, n in sorted(report.left_out.items())) or "none"
        table.caption = (
            f"split {report.split}; user simulator {report.user_simulator}; tasks left out: {left}"
        )
    for column in ("group", "tasks", *(f"pass^{j}" for j in range(1, report.k + 1)), "pass@k"):
        table.add_column(column, justify="left" if column == "group" else "right")
    table.add_column("mean reward", justify="right")
    table.add_column("do-nothing pass", justify="right")
    table.add_column("errors", justify="right")
    for g in report.groups:
        table.add_row(
            g.group,
            str(g.tasks),
            *(f"{g.pass_hat[j]:.3f}" for j in range(1, report.k + 1)),
            f"{g.pass_at_k:.3f}",
            f"{g.mean_reward:.3f}",
            f"{g.baseline_pass:.3f}",
            str(g.errors),
        )
    return table

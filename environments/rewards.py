"""Trajectory rewards for QA environments: the F1 reward of ASTRA §3 (eq. 29-31) and its ablation variants.

A job is the list of sub-tasks (q_i, a_i) of a verified sample (``VerifiedSample.reward_spec["jobs"]``).
A sub-task counts as solved (n_hat) when some tool output of the trajectory contains its answer, with the
same rule the environment verification used (``sandbox.env_runtime.normalise``: casefold + whitespace
collapse; an empty answer never counts). c counts every tool call the policy emitted, including invalid
ones and calls to mixed-in tools, so spamming calls lowers precision.

    r = n_hat / n,   p = n_hat / (c + eps),   F1 = 2pr / (p + r),   all 0 when n_hat == 0.

Recall-only (r) and precision-only (p) are the ablation rewards of ASTRA Fig. 7.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from sandbox.env_runtime import normalise

RewardMode = Literal["f1", "recall", "precision"]


class F1Parts(BaseModel):
    """The parts of the F1 reward of one trajectory."""

    n: Annotated[int, Field(description="sub-tasks in the job")]
    n_hat: Annotated[int, Field(description="sub-tasks whose answer some tool output contains")]
    c: Annotated[int, Field(description="tool calls emitted, invalid and mixed-in ones included")]
    recall: Annotated[float, Field(description="n_hat / n (0 for an empty job)")]
    precision: Annotated[
        float,
        Field(description="n_hat / (c + eps); can exceed 1 when one output answers several sub-tasks"),
    ]
    f1: Annotated[float, Field(description="2pr / (p + r); 0 when n_hat == 0")]


def solved_jobs(jobs: Sequence[dict[str, Any]], tool_outputs: Sequence[str]) -> set[int]:
    """Indices (each job's "index", else its position) of the sub-tasks some tool output answers."""
    return {int(jobs[i].get("index", i)) for i in _solved_positions(jobs, tool_outputs)}


def _solved_positions(jobs: Sequence[dict[str, Any]], tool_outputs: Sequence[str]) -> list[int]:
    outputs = [normalise(text) for text in tool_outputs]
    solved = []
    for position, job in enumerate(jobs):
        wanted = normalise(str(job.get("answer", "")))
        if wanted and any(wanted in text for text in outputs):
            solved.append(position)
    return solved


def f1_reward(
    jobs: Sequence[dict[str, Any]], tool_outputs: Sequence[str], emitted_calls: int, eps: float = 1e-8
) -> F1Parts:
    """ASTRA eq. 30-31 for one trajectory.

    ``tool_outputs`` are the observations of the trajectory's calls (one per executed call), so there are
    never more of them than emitted calls; a caller that breaks this has miscounted c, and we say so.
    """
    if emitted_calls < len(tool_outputs):
        raise ValueError(f"{len(tool_outputs)} tool outputs but only {emitted_calls} emitted calls")
    n = len(jobs)
    # Count positions, not "index" values, so duplicate indices cannot change n_hat.
    n_hat = len(_solved_positions(jobs, tool_outputs))
    if n_hat == 0:
        return F1Parts(n=n, n_hat=0, c=emitted_calls, recall=0.0, precision=0.0, f1=0.0)
    recall = n_hat / n
    precision = n_hat / (emitted_calls + eps)
    f1 = 2 * precision * recall / (precision + recall)
    return F1Parts(n=n, n_hat=n_hat, c=emitted_calls, recall=recall, precision=precision, f1=f1)


def reward_value(parts: F1Parts, mode: RewardMode = "f1") -> float:
    """The scalar reward the policy is trained on: F1 (default), or recall-only / precision-only (ablations)."""
    if mode == "f1":
        return parts.f1
    if mode == "recall":
        return parts.recall
    if mode == "precision":
        return parts.precision
    raise ValueError(f"unknown reward mode {mode!r}")

"""Recorded rollouts: every QA trajectory the trainer scored, as a line ``arena reward score`` reads,
and every tau2 trajectory, as a line ``arena reward tau2`` rescores with tau2's own evaluator.

A GRPO step writes ``trainer/<run>/rollouts/step-NNNNNNNN.jsonl`` in the lake (one atomic put, so a
step redone after a crash overwrites it with the same trajectories): per trajectory the sub-tasks,
the chat messages (failed tool calls carry ``"error": true``), the mixed-in tools, the calls emitted,
and the reward the service trained on. ``arena reward score`` on such a file gives the same rewards,
so anyone can audit what the policy was paid for, and rescore it under another rule.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from arena.records.envs import VerifiedSample
from environments.tau2_environment import Tau2Rollout
from lake.store import ObjectStore
from trainer.checkpoint import step_name
from trainer.rollout import Trajectory


def rollout_line(
    sample: VerifiedSample,
    trajectory: Trajectory,
    *,
    mixed_tools: Collection[str],
    step: int,
    round_: int,
    index: int,
) -> dict[str, Any]:
    """One trajectory as an ``arena reward score`` input line, with what the service scored."""
    jobs = sample.reward_spec.get("jobs") or []
    return {
        "sample_id": sample.sample_id,
        "step": step,
        "round": round_,
        "trajectory": index,
        "subtasks": [{"question": str(j.get("question", "")), "answer": j.get("answer")} for j in jobs],
        "messages": trajectory.messages,
        "mixed_tools": sorted(mixed_tools),
        "emitted_calls": trajectory.tool_calls,
        "reward": trajectory.reward,
        "reward_parts": trajectory.reward_parts,
    }


def tau2_rollout_line(
    trajectory: Trajectory, rollout: Tau2Rollout, *, step: int, round_: int, index: int
) -> dict[str, Any]:
    """One tau2 trajectory as an ``arena reward tau2`` input line: the tau2 messages (the user's own
    tool calls included), how it ended, and the reward the service trained on."""
    return {
        "kind": "tau2",
        "sample_id": trajectory.sample_id,
        "step": step,
        "round": round_,
        "trajectory": index,
        "tau2": rollout.model_dump(mode="json"),
        "messages": trajectory.messages,
        "reward": trajectory.reward,
        "reward_parts": trajectory.reward_parts,
    }


def rollouts_path(prefix: str, step: int) -> str:
    """Where a step's rollouts go under a run's lake prefix (``trainer/<run>``)."""
    return f"{prefix}/rollouts/{step_name(step)}.jsonl"


def save_rollouts(store: ObjectStore, prefix: str, step: int, lines: Sequence[dict[str, Any]]) -> str:
    """Write a step's recorded rollouts (one put); returns the lake path."""
    path = rollouts_path(prefix, step)
    body = "".join(json.dumps(line, ensure_ascii=False, sort_keys=True) + "\n" for line in lines)
    store.put(path, body.encode())
    return path

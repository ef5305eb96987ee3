"""Arena's F1 reward (ASTRA eq. 30-31) for verl: reward.custom_reward_function.name=compute_score.

verl's reward manager passes the decoded response (special tokens skipped), which holds the policy's
<tool_call> blocks and the <tool_response> blocks of the tool outputs. c counts every <tool_call>
block the policy emitted (invalid JSON and an unclosed last block too, as environments.render does); the
closed <tool_response> blocks are the outputs, and as in Arena's rollouts only successful ones count
(error observations -- Arena's "error: ..." and verl's own "Unknown function ..." texts -- never
solve a sub-task); a sub-task is solved when some output contains its answer (casefold + whitespace
collapse; an empty answer never counts).

    r = n_hat / n,   p = n_hat / (c + eps),   F1 = 2pr / (p + r),   all 0 when n_hat == 0.

Works standalone; uses environments.rewards.f1_reward when Arena is importable. reward_kwargs
``mode: recall`` or ``mode: precision`` select the ablation rewards.
"""

from __future__ import annotations

import json
import re
from typing import Any

_arena_f1_reward: Any
try:
    from environments.rewards import f1_reward as _arena_f1_reward
except ImportError:  # standalone: the copy below
    _arena_f1_reward = None

EPS = 1e-8
_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


def normalise(text: str) -> str:
    return " ".join(text.casefold().split())


ERROR_PREFIXES = ("error:", "Unknown function '", "Invalid JSON in arguments for '", "Error executing tool '")
"""Observation texts of failed calls: Arena's environments and verl's ToolAgentLoop._call_tool."""


def parse_response(solution_str: str) -> tuple[int, list[str], int]:
    """(tool calls emitted, successful tool outputs, all tool responses) of a decoded response."""
    responses = [block.strip() for block in _RESPONSE.findall(solution_str)]
    outputs = [r for r in responses if not r.startswith(ERROR_PREFIXES)]
    policy_text = _RESPONSE.sub("", solution_str)
    return len(_CALL.findall(policy_text)), outputs, len(responses)


def f1_parts(
    jobs: list[dict[str, Any]], outputs: list[str], emitted: int, eps: float = EPS
) -> dict[str, Any]:
    """ASTRA eq. 30-31 (the same numbers as environments.rewards.f1_reward)."""
    texts = [normalise(o) for o in outputs]
    wanted = [normalise(str(job.get("answer", ""))) for job in jobs]
    n, n_hat = len(jobs), sum(1 for w in wanted if w and any(w in t for t in texts))
    if n_hat == 0:
        return {"n": n, "n_hat": 0, "c": emitted, "recall": 0.0, "precision": 0.0, "f1": 0.0}
    recall, precision = n_hat / n, n_hat / (emitted + eps)
    f1 = 2 * precision * recall / (precision + recall)
    return {"n": n, "n_hat": n_hat, "c": emitted, "recall": recall, "precision": precision, "f1": f1}


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, mode: str = "f1", **_: Any
) -> dict[str, Any]:
    """verl's custom reward: ``score`` is the F1 (or recall / precision), the parts go to the metrics."""
    spec = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
    jobs = list(spec.get("jobs") or [])
    emitted, outputs, responses = parse_response(solution_str)
    emitted = max(emitted, responses)  # every response answers a call (guards a cut-off text)
    if _arena_f1_reward is not None:
        parts = _arena_f1_reward(jobs, outputs, emitted).model_dump()
    else:
        parts = f1_parts(jobs, outputs, emitted)
    if mode not in ("f1", "recall", "precision"):
        raise ValueError(f"unknown reward mode {mode!r}")
    return {"score": float(parts[mode]), **{k: float(v) for k, v in parts.items()}}

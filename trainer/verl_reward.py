"""Arena's F1 reward (ASTRA eq. 30-31) for verl: reward.custom_reward_function.name=compute_score.

verl's reward manager passes the decoded response (special tokens skipped), which holds the policy's
<tool_call> blocks and the <tool_response> blocks of the tool outputs. c counts every <tool_call>
block the policy emitted (invalid JSON and an unclosed last block too, as environments.render does);
the closed <tool_response> blocks are the executed calls, paired in order with the calls that parse.
A response that is an error observation (Arena's "error: ..." and verl's own "Unknown function ..."
texts) is a failed call. Which sub-tasks are solved, and the F1, come from ``arena.tool_reward``, the
one rule Arena's trainer uses (only successful calls solve, token-boundary matching, numbers as
numbers, calls matched one-to-one to sub-tasks, F1 <= 1):

    r = solved / n,   p = solved / c,   F1 = 2pr / (p + r),   all 0 when nothing is solved.

Arena installed: the rule is imported from it. On a verl-only machine it is the copy that
``arena export verl`` writes next to this file (``arena_tool_reward.py``, the same source file).
reward_kwargs ``mode: recall`` or ``mode: precision`` select the ablation rewards.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

RULE_FILE = "arena_tool_reward.py"
"""The name ``arena export verl`` gives its copy of ``arena/tool_reward.py``."""


def _load_rule() -> tuple[ModuleType, bool]:
    """``arena.tool_reward`` and whether it came from Arena (else from the exported copy)."""
    try:
        import arena.tool_reward as rule
    except ImportError:
        path = Path(__file__).with_name(RULE_FILE)
        spec = importlib.util.spec_from_file_location("arena_tool_reward", path)
        if spec is None or spec.loader is None or not path.exists():
            raise ImportError(
                f"{path} is missing: export with `arena export verl` or install Arena"
            ) from None
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault("arena_tool_reward", module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module, False
    return rule, True


_rule, FROM_ARENA = _load_rule()

_RESPONSE = re.compile(r"<tool_response>(.*?)</tool_response>", re.DOTALL)
_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)

ERROR_PREFIXES = ("error:", "Unknown function '", "Invalid JSON in arguments for '", "Error executing tool '")
"""Observation texts of failed calls: Arena's environments and verl's ToolAgentLoop._call_tool."""


def _call_name(block: str) -> str:
    try:
        call = json.loads(block.strip())
    except ValueError:
        return ""
    name = call.get("name") if isinstance(call, dict) else None
    return name if isinstance(name, str) else ""


def parse_response(solution_str: str) -> tuple[int, list[Any]]:
    """(tool calls emitted, executed calls as ``CallResult``s) of a decoded response."""
    responses = [block.strip() for block in _RESPONSE.findall(solution_str)]
    policy_text = _RESPONSE.sub("", solution_str)
    names = [n for n in (_call_name(b) for b in _CALL.findall(policy_text)) if n]
    emitted = len(_CALL.findall(policy_text))
    results = [
        _rule.CallResult(
            name=names[i] if i < len(names) else "",
            content=text,
            ok=not text.startswith(ERROR_PREFIXES),
        )
        for i, text in enumerate(responses)
    ]
    return max(emitted, len(results)), results  # every response answers a call (guards a cut-off text)


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None, mode: str = "f1", **_: Any
) -> dict[str, Any]:
    """verl's custom reward: ``score`` is the F1 (or recall / precision), the parts go to the metrics."""
    if mode not in ("f1", "recall", "precision"):
        raise ValueError(f"unknown reward mode {mode!r}")
    spec = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
    answers = _rule.job_answers(list(spec.get("jobs") or []))
    emitted, results = parse_response(solution_str)
    parts = _rule.f1_score(answers, results, emitted, irrelevant=set(spec.get("mixed_tools") or []))
    values = {
        "n": parts.n,
        "n_hat": parts.solved,
        "c": parts.calls,
        "recall": parts.recall,
        "precision": parts.precision,
        "f1": parts.f1,
    }
    return {"score": float(values[mode]), **{k: float(v) for k, v in values.items()}}

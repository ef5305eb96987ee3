"""Reference trajectories: a QA package solved by running its own jobs' invocations.

Synthetic SFT data in the sense of ASTRA §3.1, and a warm start for benchmarks: the prompt, one
assistant tool call per job (executed in the environment, so the tool messages hold real
sandbox outputs), then the main answer a0. Only ever built from train-split packages.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from arena import pyast
from arena.records.envs import EnvPackage, VerifiedSample
from arena.records.tools import tool_name
from environments.environment import QaEnvironment


class ReferenceCallFailed(Exception):
    """A job's invocation could not be parsed or did not run ok in the environment."""


def invocation_call(invocation: str, spec: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """``get_x(id='a')`` -> ("get_x", {"id": "a"}); positional args map to ``spec``'s parameters in order."""
    node = pyast.parse(invocation.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain call: {invocation!r}")
    names = list(((spec or {}).get("function", spec or {}).get("parameters") or {}).get("properties") or {})
    if len(node.args) > len(names):
        raise ValueError(f"positional arguments without parameter names in {invocation!r}")
    arguments = {names[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"**kwargs in {invocation!r}")
        arguments[kw.arg] = ast.literal_eval(kw.value)
    return node.func.id, arguments


async def reference_conversation(
    sample: VerifiedSample, package: EnvPackage, env: QaEnvironment
) -> tuple[list[dict[str, Any]], list[str]]:
    """OpenAI messages solving ``sample`` with its jobs' calls, and the tool outputs they produced.

    Jobs run in index order; a repeated invocation (merged tools: one call answers both jobs) is
    called once. Raises ``ReferenceCallFailed`` when a call cannot be parsed or fails.
    """
    specs = {tool_name(t): t for t in package.tools}
    messages: list[dict[str, Any]] = [dict(m) for m in sample.prompt]
    outputs: list[str] = []
    seen: set[str] = set()
    for i, job in enumerate(sorted(package.jobs, key=lambda j: j.index)):
        if job.invocation in seen:
            continue
        seen.add(job.invocation)
        try:
            name, arguments = invocation_call(job.invocation, specs.get(job.tool))
        except (ValueError, SyntaxError) as exc:
            raise ReferenceCallFailed(f"job {job.index}: {exc}") from exc
        observation = await env.call(name, arguments)
        if not observation.ok:
            raise ReferenceCallFailed(f"reference call {job.invocation} failed: {observation.text}")
        call_id = f"call_{i}"
        call = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": call}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "name": name, "content": observation.text})
        outputs.append(observation.text)
    messages.append({"role": "assistant", "content": package.answer})
    return messages, outputs

"""Reference trajectories: a package solved by its own jobs' invocations, run in the real sandbox."""

from __future__ import annotations

import pytest

from environments.environment import QaEnvironment
from environments.render import render_text
from environments.rewards import ToolResult, f1_reward
from sandbox import SandboxPool
from streams.envs.samples_verified import sample_of
from tests.fixtures.domain import sandboxed
from tests.test_environments import library_package
from trainer.reference import ReferenceCallFailed, invocation_call, reference_conversation

SPEC = {"function": {"name": "get_x", "parameters": {"properties": {"a": {}, "b": {}}}}}


def test_invocation_call_parses_literal_calls() -> None:
    assert invocation_call("get_x(a='p', b=2)") == ("get_x", {"a": "p", "b": 2})
    assert invocation_call(" get_x('p', b=[1]) ", SPEC) == ("get_x", {"a": "p", "b": [1]})
    for bad in ("x.y(a=1)", "get_x(**k)", "get_x('p')", "1 + 2"):
        with pytest.raises(ValueError):
            invocation_call(bad)


def test_reference_conversation_solves_the_package_with_sandbox_outputs() -> None:
    package = library_package()
    merged = package.model_copy(
        update={"jobs": [*package.jobs, package.jobs[0].model_copy(update={"index": 3})]}
    )

    async def scenario(pool: SandboxPool) -> None:
        sample = sample_of(merged)
        env = QaEnvironment(sample, merged, pool)
        try:
            messages, outputs = await reference_conversation(sample, merged, env)
        finally:
            await env.close()
        calls = [m for m in messages if m.get("tool_calls")]
        assert len(calls) == 2  # the repeated invocation is called once
        assert [m["role"] for m in messages[-5:]] == ["assistant", "tool", "assistant", "tool", "assistant"]
        assert messages[-1]["content"] == "Portugal"
        results = [ToolResult(name="tool", content=text) for text in outputs]
        parts = f1_reward(sample.reward_spec["jobs"], results, len(outputs))
        # the merged job lists one sub-task twice: it is one sub-task, answered by one call
        assert parts.n_hat == parts.n == 2 and parts.c == 2 and parts.f1 == 1.0
        assert "<tool_call>" in render_text(messages, sample.tools, "agent")

        broken = library_package(code="def get_book_author(book_id):\n    raise KeyError(book_id)\n")
        broken_env = QaEnvironment(sample_of(broken), broken, pool)
        with pytest.raises(ReferenceCallFailed, match="get_book_author"):
            await reference_conversation(sample_of(broken), broken, broken_env)
        await broken_env.close()

    sandboxed(scenario)

"""A sandboxed gate is judged on the program, not on the machine (``sandbox.env_runtime.run_settled``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sandbox.env_runtime import SandboxUnsettled, run_settled
from sandbox.pool import SandboxResult


class Scripted:
    """A runner whose runs end as scripted, in order."""

    def __init__(self, *ends: str | None) -> None:
        self.ends = list(ends)
        self.runs = 0

    async def run(self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None) -> Any:
        self.runs += 1
        end = self.ends.pop(0)
        if end is None:
            return SandboxResult(ok=True, return_value=1)
        return SandboxResult(ok=False, error_type=end, error=f"{end} here")

    async def open_session(self, **kwargs: Any) -> Any:
        raise NotImplementedError


def test_a_run_killed_or_timed_out_runs_again() -> None:
    runner = Scripted("timeout", "killed", None)
    result = asyncio.run(run_settled(runner, "1", timeout_s=1))
    assert result.ok and runner.runs == 3


def test_the_programs_own_failure_is_its_result() -> None:
    runner = Scripted("exception")
    result = asyncio.run(run_settled(runner, "1/0"))
    assert result.error_type == "exception" and runner.runs == 1


def test_a_run_that_keeps_failing_for_machine_reasons_raises() -> None:
    runner = Scripted("timeout", "timeout", "timeout")
    with pytest.raises(SandboxUnsettled, match="3 sandbox runs ended with timeout"):
        asyncio.run(run_settled(runner, "while True: pass"))

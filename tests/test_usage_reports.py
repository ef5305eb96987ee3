"""LLM usage per stage and role: the deltas a worker reports to ``llm.usage``."""

from __future__ import annotations

from datetime import UTC, datetime

from arena.llm.gateway import GatewayUsage, RoleUsage
from streams.usage import usage_records

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)


def _usage(stages: dict[str, dict[str, RoleUsage]]) -> GatewayUsage:
    return GatewayUsage(backend="openai", model="m", roles={}, stages=stages)


def test_records_carry_the_growth_since_the_last_report_per_role() -> None:
    before = {"judge": RoleUsage(calls=2, attempts=2, prompt_tokens=100, completion_tokens=10)}
    now = _usage(
        {
            "chains": {
                "judge": RoleUsage(calls=5, attempts=6, retries=1, prompt_tokens=400, completion_tokens=40),
                "chain_synthesis": RoleUsage(calls=1, attempts=1, failures=1),
            },
            "tasks": {"judge": RoleUsage(calls=9)},  # another stage in the same process: not ours
        }
    )
    records = usage_records("chains", now, before, T0, T1, pid=42)
    assert [
        (r.role, r.calls, r.attempts, r.retries, r.prompt_tokens, r.completion_tokens, r.failures)
        for r in records
    ] == [
        ("chain_synthesis", 1, 1, 0, 0, 0, 1),
        ("judge", 3, 4, 1, 300, 30, 0),
    ]
    assert all(r.stage == "chains" and r.pid == 42 and r.window_end == T1 for r in records)


def test_roles_that_did_not_grow_send_nothing() -> None:
    same = {"judge": RoleUsage(calls=2, attempts=2)}
    assert usage_records("chains", _usage({"chains": same}), same, T0, T1, pid=1) == []
    assert usage_records("chains", _usage({}), {}, T0, T1, pid=1) == []

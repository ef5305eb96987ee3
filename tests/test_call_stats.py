"""Failed observations and grounded arguments of a trajectory (``trainer.call_stats``), by hand."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trainer.call_stats import CallStats, call_stats, grounded
from trainer.evaluate import CaseResult, group_report


def call(name: str, arguments: Any) -> dict[str, Any]:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"type": "function", "id": f"c-{name}", "function": {"name": name, "arguments": raw}}


def turn(*calls: dict[str, Any], content: str = "") -> dict[str, Any]:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def tool(content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "c", "content": content, **extra}


QUESTION = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Which product has the higher supplier rating: SKU-4004 or SKU-4014?"},
]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"product_sku": "SKU-4004"}, True),  # copied from the question
        ({"product_sku": "sku-4014"}, True),  # case folded
        ({"product_sku": "SKU-4008"}, False),  # a plausible id the question never states
        ({"product_sku": "SKU-40"}, False),  # a prefix of a stated id is not on token boundaries
        ({"limit": 4}, False),  # 4 is not 4004: numbers compare as numbers
        ({"ids": ["SKU-4004", "SKU-4014"], "verbose": True, "page": None}, True),  # leaves; no bool/null
        ({"ids": ["SKU-4004", "SKU-9999"]}, False),  # one invented leaf is enough
        ({}, True),  # nothing invented
        ("", True),  # an empty arguments string is no arguments
        ("{not json", False),
        ('["SKU-4004"]', False),  # not an object
    ],
)
def test_grounded_arguments_occur_in_the_context(arguments: Any, expected: bool) -> None:
    context = "\n".join(m["content"] for m in QUESTION)
    assert grounded(call("get_supplier", arguments), context) is expected


def test_values_from_tool_outputs_and_schemas_count_but_the_models_own_words_do_not() -> None:
    schema = {
        "type": "function",
        "function": {
            "name": "get_rating",
            "parameters": {"type": "object", "properties": {"scale": {"enum": ["stars", "percent"]}}},
        },
    }
    messages = [
        *QUESTION,
        turn(call("get_supplier", {"product_sku": "SKU-4004"})),
        tool('{"supplier_id": "SUP-303"}'),
        turn(call("get_rating", {"supplier_id": "SUP-303", "scale": "stars"})),  # output + enum
        tool('{"rating": 4}'),
        turn(content="I think the other one is SUP-777."),  # the model's own claim
        turn(call("get_rating", {"supplier_id": "SUP-777"})),
        tool("error: no record with supplier_id SUP-777", error=True),
    ]
    assert call_stats(messages, [schema]) == CallStats(calls=3, observations=3, failed=1, grounded=2)
    # without the schemas the enum value is not stated anywhere
    assert call_stats(messages).grounded == 1


@pytest.mark.parametrize(
    ("message", "failed"),
    [
        (tool('{"stock": 17}'), False),
        (tool("17 units"), False),
        (tool('{"stock": 17}', error=True), True),  # the environment marked it failed
        (tool('{"error": "no record with sku SKU-1"}'), True),  # an error payload, no flag
        (tool("error: unknown tool 'get_x'; available: ['get_y']"), True),
        (tool('{"error": ""}'), False),  # an empty error field reports nothing
    ],
)
def test_failed_observations_follow_the_rewards_rule(message: dict[str, Any], failed: bool) -> None:
    stats = call_stats([*QUESTION, message])
    assert (stats.observations, stats.failed) == (1, int(failed))


def test_group_shares_pool_the_trials_of_every_case() -> None:
    def case(stats: list[CallStats]) -> CaseResult:
        n = len(stats)
        return CaseResult(
            sample_id="vs",
            env_ref="env",
            domain="d",
            kind="qa",
            trials=n,
            successes=0,
            pass_hat={1: 0.0},
            pass_at_k=0.0,
            f1=[0.0] * n,
            rewards=[0.0] * n,
            turns=[1] * n,
            tool_calls=[s.calls for s in stats],
            call_stats=stats,
        )

    a = case(
        [
            CallStats(calls=2, observations=2, failed=1, grounded=1),
            CallStats(calls=0, observations=0, failed=0, grounded=0),
        ]
    )
    b = case([CallStats(calls=3, observations=4, failed=3, grounded=0)])
    report = group_report("all", [a, b], k=1, seed=0)
    assert report.failed_call_share == pytest.approx(4 / 6)  # 1 + 3 failed of 2 + 4 observations
    assert report.grounded_call_share == pytest.approx(1 / 5)  # 1 grounded of 2 + 3 calls
    silent = group_report(
        "all", [case([CallStats(calls=0, observations=0, failed=0, grounded=0)])], k=1, seed=0
    )
    assert (silent.failed_call_share, silent.grounded_call_share) == (None, None)

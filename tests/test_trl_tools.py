"""bench/trl_tools.py: Arena tools as TRL environment methods keep their schemas; Arena's reward."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from bench.trl_tools import LoopThread, environment_classes, tool_method

TOOL = {
    "type": "function",
    "function": {
        "name": "get_order",
        "description": "Look up an order by its id.",
        "parameters": {
            "type": "object",
            "properties": {
                "order_id": {"type": "string", "description": "The order's id."},
                "limit": {"type": "integer", "description": "Most lines to return."},
                "status": {"type": "string", "description": "Filter.", "enum": ["open", "shipped"]},
            },
            "required": ["order_id"],
        },
    },
}


def test_a_tool_method_renders_the_tools_own_schema() -> None:
    from transformers.utils import get_json_schema

    method = tool_method(TOOL)
    schema = get_json_schema(method)["function"]
    assert schema["name"] == "get_order" and schema["description"] == "Look up an order by its id."
    props = schema["parameters"]["properties"]
    assert props["order_id"] == {"type": "string", "description": "The order's id."}
    assert props["limit"]["type"] == "integer" and props["limit"]["description"] == "Most lines to return."
    assert props["status"]["enum"] == ["open", "shipped"]
    assert schema["parameters"]["required"] == ["order_id"]
    assert inspect.iscoroutinefunction(method)  # TRL runs a rollout's calls concurrently


class _Observation:
    def __init__(self, text: str, ok: bool) -> None:
        self.text, self.ok = text, ok


class _Recorder:
    """Stands in for QaEnvironment.call only: what the method hands the environment."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    async def call(self, name: str, arguments: dict[str, Any]) -> _Observation:
        self.seen.append((name, arguments))
        return _Observation("order 17: 3 lines", ok=True)


class _Clock:
    def __init__(self) -> None:
        self.tool_calls, self.reward_sum, self.completions = 0, 0.0, 0
        self.environments: list[Any] = []


def test_environment_classes_expose_exactly_the_offered_tools_and_pass_given_arguments() -> None:
    loop, clock = LoopThread(), _Clock()
    try:
        classes = environment_classes([object()], [object()], [{}], [[TOOL]], None, loop, clock)
        (cls,) = classes.values()
        public = {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}
        assert public == {"get_order", "reset", "get_reward"}  # what TRL takes for tools: get_order
        env = cls()
        env.env = _Recorder()
        text = asyncio.run(env.get_order(order_id="17"))
        assert text == "order 17: 3 lines" and env.env.seen == [("get_order", {"order_id": "17"})]
        assert env.calls == 1 and clock.tool_calls == 1 and clock.environments == [env]
    finally:
        loop.stop()


def test_tool_names_that_clash_with_the_environment_are_refused() -> None:
    clash = {"type": "function", "function": {"name": "reset", "parameters": {"type": "object"}}}
    with pytest.raises(ValueError, match="clash"):
        environment_classes([object()], [object()], [{}], [[clash]], None, None, None)  # type: ignore[arg-type]

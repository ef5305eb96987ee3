"""Reading real replies (``arena.llm.replies``) and routing roles (``arena.llm.routing``): hand cases."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from arena.config import ArenaSettings
from arena.llm.backends.openai import hermes_messages
from arena.llm.core import ToolCall
from arena.llm.replies import (
    NoJsonObject,
    ReplyInvalid,
    as_text,
    choose_output,
    json_objects,
    split_reasoning,
    text_tool_calls,
    unusable_reason,
)
from arena.llm.routing import KIND_DEFAULTS, kind_of, route_of


class Verdict(BaseModel):
    ok: bool
    reason: str


def test_split_reasoning_cases() -> None:
    assert split_reasoning("<think>a</think>b") == split_reasoning("<THINK>a</THINK> b ")
    reply = split_reasoning("<think>a</think>b")
    assert (reply.reasoning, reply.visible) == ("a", "b")
    assert split_reasoning("x</think>y").reasoning == "x"  # the template opened it
    assert split_reasoning("y<think>cut off here").visible == "y"  # cut inside reasoning
    both = split_reasoning("<think>1</think>mid<thinking>2</thinking>end", reasoning="0")
    assert (both.reasoning, both.visible) == ("0\n1\n2", "midend")
    assert split_reasoning("plain").reasoning == ""


def test_json_objects_skips_nested_and_broken() -> None:
    text = 'a {"x": {"y": 1}} b {broken c {"z": [1, {"w": 2}]}'
    assert json_objects(text) == [{"x": {"y": 1}}, {"z": [1, {"w": 2}]}]
    assert json_objects("[1, 2] and no object") == []


def test_choose_output_picks_by_schema() -> None:
    text = 'Echo {"input": "q"} then {"ok": "maybe"} then {"ok": true, "reason": "fine"}'
    assert choose_output(Verdict, text) == Verdict(ok=True, reason="fine")
    with pytest.raises(ReplyInvalid, match=r"none of its 2 JSON objects validates.*reason"):
        choose_output(Verdict, '{"a": 1} {"ok": true}')  # the closer one's errors are reported
    with pytest.raises(NoJsonObject):
        choose_output(Verdict, "no json")


def test_text_tool_calls_cases() -> None:
    offered = {"f", "g"}
    calls, rest = text_tool_calls('Sure.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>', offered)
    assert calls == [ToolCall("f", {"a": 1})] and rest == "Sure."
    calls, _ = text_tool_calls('<tool_call>{"name": "g", "parameters": "{\\"b\\": 2}"}', offered)  # unclosed
    assert calls == [ToolCall("g", {"b": 2})]
    fenced = 'Call:\n```json\n{"name": "f", "arguments": {}}\n```'
    assert text_tool_calls(fenced, offered) == ([ToolCall("f", {})], "Call:")
    assert text_tool_calls('```json\n{"name": "nope", "arguments": {}}\n```', offered)[0] == []
    broken = '<tool_call>{"name": "f", "arguments": {"a": </tool_call>'
    assert text_tool_calls(broken, offered) == ([], broken)  # left in the text: no call is made
    round_trip = as_text([ToolCall("f", {"a": "é"})])
    assert text_tool_calls(round_trip, offered)[0] == [ToolCall("f", {"a": "é"})]


def test_unusable_reasons() -> None:
    assert unusable_reason("", None, "thoughts") is not None and "only reasoning" in str(
        unusable_reason("", None, "thoughts")
    )
    assert unusable_reason("  ") == "empty reply"
    assert "refused" in str(unusable_reason("I'm sorry, but I cannot help with that."))
    assert "refused" in str(unusable_reason("ok", refusal="policy"))
    assert unusable_reason('I cannot be sure, but {"ok": true, "reason": "x"}') is None  # JSON follows
    assert unusable_reason("Here you go") is None
    # an agent declining a customer's request as its policy says is its message, not a model refusal
    assert unusable_reason("I'm sorry, but I cannot do that under our policy.", prose_refusal=False) is None
    assert "refused" in str(unusable_reason("I'm sorry.", refusal="policy", prose_refusal=False))


def test_hermes_messages_put_tools_in_the_system_prompt_and_calls_in_text() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Do it."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "1", "name": "f", "content": "done"},
    ]
    out = hermes_messages(messages, tools)
    assert (
        out[0]["role"] == "system"
        and out[0]["content"].startswith("Be brief.")
        and "<tools>" in out[0]["content"]
    )
    assert json.dumps(tools[0]) in out[0]["content"]
    assert text_tool_calls(out[2]["content"], {"f"})[0] == [ToolCall("f", {"a": 1})]
    assert out[3] == {"role": "user", "content": "<tool_response>\ndone\n</tool_response>"}


def test_routes_by_kind_then_role() -> None:
    assert kind_of("score_task") == "judge" and kind_of("chain_synthesis") == "generator"
    assert kind_of("tool_emulation") == "emulator" and kind_of("agent_policy") == "agent"
    settings = ArenaSettings(
        seed=4,
        llm="openai://a:1/v1?model=small",
        llm_context_tokens=8192,
        llm_roles={
            "judge": {"temperature": 0.1, "llm": "openai://b:1/v1?model=big", "context_tokens": 65536},
            "score_task": {"max_tokens": 300},
            "chain_synthesis": {"stop": ["END"], "seed": 11},
        },
    )
    score = route_of(settings, "score_task")
    assert (score.sampling.temperature, score.sampling.max_tokens, score.sampling.seed) == (0.1, 300, 4)
    assert score.llm == "openai://b:1/v1?model=big" and score.context_tokens == 65536
    chain = route_of(settings, "chain_synthesis")
    assert chain.llm == settings.llm and chain.context_tokens == 8192
    assert (chain.sampling.stop, chain.sampling.seed) == (["END"], 11)
    assert chain.sampling.temperature == KIND_DEFAULTS["generator"]["temperature"]
    assert route_of(settings, "judge_query_planning").sampling.temperature == 0.1
    assert route_of(ArenaSettings(), "eigen_judge").sampling.temperature == 0.0


def test_unknown_role_names_are_a_clear_error() -> None:
    with pytest.raises(ValidationError, match=r"names no role or kind.*jduge"):
        ArenaSettings(llm_roles={"jduge": {"temperature": 0}})
    with pytest.raises(ValidationError, match="temprature"):
        ArenaSettings(llm_roles={"judge": {"temprature": 0}})

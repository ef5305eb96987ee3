"""Conformance: what real models and servers send, read through Arena's real ``openai://`` client.

A scripted OpenAI-compatible server (a real HTTP process on a loopback port) answers each case the
way real deployments do: fenced JSON, prose around it, several objects, decoys inside ``<think>``,
``reasoning_content``, native and parallel ``tool_calls``, Hermes ``<tool_call>`` text (fenced or
not), replies cut at ``max_tokens``, empty replies, refusals, 429 with ``Retry-After``, 500s and
timeouts. Each case asserts the parsed output, or the reason the call ended invalid (what the
stage dead-letters).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from arena.config import ArenaSettings
from arena.llm.backends.openai import OpenAIBackend
from arena.llm.core import InvalidOutput, Role, Sampling
from arena.llm.gateway import FEEDBACK_PREFIX, Gateway, PromptTooLong
from arena.llm.roles.agent import AGENT_POLICY, AgentTurnInput
from arena.llm.routing import RoleRoute, route_of
from synthesis.eigen.roles.dialogs import (
    APP_ACTION_TOOL,
    EIGEN_TRAJECTORY_AGENT,
    TrajectoryAgentInput,
    dialog_system_message,
)
from tests.fixtures.openai_server import (
    ASK,
    FailSpec,
    OpenAIServer,
    Question,
    ScriptedMessage,
    ServerScript,
    start_openai_server,
)

pytestmark = pytest.mark.integration

GOOD = '{"answer": "Paris", "score": 0.9}'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
AGENT_INPUTS = AgentTurnInput(
    messages=[
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather and time in Lyon?"},
    ],
    tools=[WEATHER, TIME],
)


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with start_openai_server() as running:
        yield running


def _gateway(server: OpenAIServer, timeout_s: float = 10.0, max_attempts: int = 3) -> Gateway:
    backend = OpenAIBackend(server.base_url, "test-model", timeout_s=timeout_s)
    settings = ArenaSettings(llm="rules")  # routes: per-role sampling and the context budget
    return Gateway(
        backend,
        max_attempts=max_attempts,
        backoff_s=0.05,
        max_backoff_s=0.2,
        routes=lambda role: route_of(settings, role),
    )


def _ask(server: OpenAIServer, *messages: ScriptedMessage, timeout_s: float = 10.0, **script: Any) -> Any:
    """Script the server, make one ASK call; the answer, or the InvalidOutput it ended in."""
    server.configure(ServerScript(messages=list(messages), **script))

    async def run() -> Any:
        gateway = _gateway(server, timeout_s)
        try:
            return await gateway.call(ASK, Question(text="Capital of France?"))
        except InvalidOutput as exc:
            return exc
        finally:
            await gateway.aclose()

    return asyncio.run(run())


def _agent(
    server: OpenAIServer,
    *messages: ScriptedMessage,
    role: Any = AGENT_POLICY,
    inputs: Any = AGENT_INPUTS,
    **script: Any,
) -> Any:
    server.configure(ServerScript(messages=list(messages), **script))

    async def run() -> Any:
        gateway = _gateway(server)
        try:
            return await gateway.call(role, inputs)
        except InvalidOutput as exc:
            return exc
        finally:
            await gateway.aclose()

    return asyncio.run(run())


def _text(content: str, **kw: Any) -> ScriptedMessage:
    return ScriptedMessage(content=content, **kw)


def _call(name: str, arguments: dict[str, Any] | str, n: int = 0) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": args}}


# --------------------------------------------------------------------------- JSON roles


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(f"```json\n{GOOD}\n```", id="fenced"),
        pytest.param(f"Sure! Here is the answer you asked for:\n{GOOD}\nHope this helps.", id="prose-around"),
        pytest.param(f'Input was {{"text": "Capital of France?"}}. Answer: {GOOD}', id="two-objects"),
        pytest.param(
            '<think>Draft: {"answer": "Lyon", "score": 0.1} -- no, and maybe '
            '<tool_call>{"name": "x", "arguments": {}}</tool_call></think>\n'
            f"Final answer:\n```json\n{GOOD}\n```",
            id="decoy-in-think",
        ),
        pytest.param(
            f'Thinking about capitals {{"answer": "Lyon", "score": 0.1}} </think>{GOOD}', id="open-think"
        ),
    ],
)
def test_json_is_chosen_by_the_schema_not_by_position(server: OpenAIServer, reply: str) -> None:
    answer = _ask(server, _text(reply))
    assert not isinstance(answer, InvalidOutput), answer
    assert (answer.output.answer, answer.output.score) == ("Paris", 0.9)


def test_reasoning_content_is_kept_apart_and_never_parsed(server: OpenAIServer) -> None:
    decoy = '{"answer": "Lyon", "score": 0.1}'
    answer = _ask(server, _text(GOOD, reasoning_content=f"Maybe {decoy}? No."))
    assert answer.output.answer == "Paris" and decoy in answer.reasoning
    think = _ask(server, _text(f"<think>I recall {decoy}.</think>{GOOD}"))
    assert think.output.answer == "Paris" and "I recall" in think.reasoning


@pytest.mark.parametrize(
    ("reply", "repairs"),
    [
        pytest.param(GOOD, {}, id="bare"),
        pytest.param(f"```json\n{GOOD}\n```", {"json_unwrapped": 1}, id="fenced"),
        pytest.param(f"<think>hm</think>{GOOD}", {"reasoning_stripped": 1}, id="think"),
        pytest.param(
            f"<think>hm</think>Here: {GOOD}", {"reasoning_stripped": 1, "json_unwrapped": 1}, id="both"
        ),
    ],
)
def test_repairs_a_reply_needed_are_counted(
    server: OpenAIServer, reply: str, repairs: dict[str, int]
) -> None:
    server.configure(ServerScript(messages=[_text(reply)]))

    async def run() -> dict[str, int]:
        gateway = _gateway(server)
        try:
            await gateway.call(ASK, Question(text="Capital of France?"))
            usage = gateway.usage.roles[ASK.name]
            return {
                name: getattr(usage, name)
                for name in ("reasoning_stripped", "json_unwrapped", "text_tool_calls")
                if getattr(usage, name)
            }
        finally:
            await gateway.aclose()

    assert asyncio.run(run()) == repairs


def test_a_reply_cut_at_max_tokens_is_asked_again_with_a_larger_budget(server: OpenAIServer) -> None:
    answer = _ask(server, _text('{"answer": "Par', finish_reason="length"), _text(GOOD))
    assert answer.output.answer == "Paris"
    budgets = [body["max_tokens"] for body in server.stats().bodies]
    judge_budget = route_of(ArenaSettings(), ASK.name).sampling.max_tokens
    assert budgets == [judge_budget, 2 * judge_budget]


def test_a_reply_always_cut_ends_invalid_with_that_reason(server: OpenAIServer) -> None:
    failed = _ask(server, _text('{"answer": "Par', finish_reason="length"))
    assert isinstance(failed, InvalidOutput)
    assert "cut off at the token limit (finish_reason=length" in "; ".join(failed.errors)


def test_a_schema_failure_is_retried_with_the_validation_error_fed_back(server: OpenAIServer) -> None:
    answer = _ask(server, _text('{"answer": "Paris", "score": 7}'), _text(GOOD))
    assert answer.output.score == 0.9
    second = server.stats().bodies[1]["messages"]
    assert second[-2] == {"role": "assistant", "content": '{"answer": "Paris", "score": 7}'}
    assert second[-1]["content"].startswith(FEEDBACK_PREFIX) and "score" in second[-1]["content"]


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        pytest.param(_text(""), "empty reply", id="empty"),
        pytest.param(_text("<think>hmm, long thoughts</think>"), "only reasoning", id="only-reasoning"),
        pytest.param(_text("I'm sorry, but I can't help with that request."), "refused", id="refusal-text"),
        pytest.param(ScriptedMessage(refusal="I cannot assist with that."), "refused", id="refusal-field"),
        pytest.param(_text("The capital of France is Paris."), "no JSON object", id="prose-only"),
    ],
)
def test_unusable_replies_are_errors_with_a_reason(
    server: OpenAIServer, message: ScriptedMessage, reason: str
) -> None:
    failed = _ask(server, message)
    assert isinstance(failed, InvalidOutput) and failed.attempts == 3
    assert reason in failed.errors[-1], failed.errors


def test_429_with_retry_after_is_honoured(server: OpenAIServer) -> None:
    started = time.monotonic()
    answer = _ask(server, _text(GOOD), failures=[FailSpec(status=429, retry_after_s=1)])
    assert answer.output.answer == "Paris" and time.monotonic() - started >= 1.0
    assert server.stats().statuses == [429, 200]


def test_500_is_retried(server: OpenAIServer) -> None:
    answer = _ask(server, _text(GOOD), failures=[FailSpec(status=500), FailSpec(status=503)])
    assert answer.output.answer == "Paris" and server.stats().statuses == [500, 503, 200]


def test_a_timeout_is_retried_with_the_same_request(server: OpenAIServer) -> None:
    server.configure(ServerScript(messages=[_text(GOOD)], latency_s=1.5))

    async def run() -> Any:
        gateway = _gateway(server, timeout_s=0.5, max_attempts=2)
        call = asyncio.ensure_future(gateway.call(ASK, Question(text="slow?")))
        await asyncio.sleep(0.8)  # the first attempt has timed out
        await server.aconfigure(ServerScript(messages=[_text(GOOD)]))
        try:
            return await call
        finally:
            await gateway.aclose()

    answer = asyncio.run(run())
    assert answer.output.answer == "Paris"


def test_roles_sample_by_kind(server: OpenAIServer) -> None:
    _ask(server, _text(GOOD))
    body = server.stats().bodies[0]
    assert body["temperature"] == 0.7 and body["response_format"]["json_schema"]["name"] == ASK.name
    score = route_of(ArenaSettings(), "score_task").sampling
    assert score.temperature == 0.0  # judges are deterministic


# --------------------------------------------------------------------------- agent roles


def _calls(turn: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, c.arguments) for c in turn.output.tool_calls]


def test_native_tool_calls_are_sent_and_read(server: OpenAIServer) -> None:
    turn = _agent(
        server,
        ScriptedMessage(
            content=None, tool_calls=[_call("get_weather", {"city": "Lyon"})], finish_reason="tool_calls"
        ),
    )
    assert _calls(turn) == [("get_weather", {"city": "Lyon"})]
    body = server.stats().bodies[0]
    assert body["tools"] == [WEATHER, TIME] and body["tool_choice"] == "auto"
    assert "response_format" not in body and body["messages"] == AGENT_INPUTS.messages


def test_parallel_native_tool_calls(server: OpenAIServer) -> None:
    calls = [_call("get_weather", {"city": "Lyon"}, 0), _call("get_time", {"city": "Lyon"}, 1)]
    turn = _agent(
        server, ScriptedMessage(content="Both at once.", tool_calls=calls, finish_reason="tool_calls")
    )
    assert _calls(turn) == [("get_weather", {"city": "Lyon"}), ("get_time", {"city": "Lyon"})]
    assert turn.output.content == "Both at once."


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(
            'I will look both up.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": {"city": "Lyon"}}</tool_call>',
            id="hermes",
        ),
        pytest.param(
            'I will look both up.\n```xml\n<tool_call>{"name": "get_weather", "arguments": {"city": "Lyon"}}</tool_call>\n'
            '<tool_call>{"name": "get_time", "arguments": "{\\"city\\": \\"Lyon\\"}"}</tool_call>\n```',
            id="hermes-fenced",
        ),
        pytest.param(
            '<think>Should I call <tool_call>{"name": "delete_all", "arguments": {}}</tool_call>? No.</think>'
            'I will look both up.<tool_call>{"name": "get_weather", "arguments": {"city": "Lyon"}}</tool_call>'
            '<tool_call>{"name": "get_time", "arguments": {"city": "Lyon"}}</tool_call>',
            id="hermes-after-think-with-decoy",
        ),
    ],
)
def test_hermes_text_tool_calls_are_read(server: OpenAIServer, content: str) -> None:
    turn = _agent(server, _text(content))
    assert _calls(turn) == [("get_weather", {"city": "Lyon"}), ("get_time", {"city": "Lyon"})]
    assert turn.output.content == "I will look both up."


def test_a_tool_call_inside_think_is_never_made(server: OpenAIServer) -> None:
    turn = _agent(
        server,
        _text('<think><tool_call>{"name": "get_weather", "arguments": {}}</tool_call></think>It is sunny.'),
    )
    assert turn.output.tool_calls == [] and turn.output.content == "It is sunny."
    assert "<tool_call>" in turn.reasoning


def test_malformed_native_arguments_are_fed_back(server: OpenAIServer) -> None:
    broken = ScriptedMessage(tool_calls=[_call("get_weather", '{"city": "Ly')], finish_reason="tool_calls")
    fixed = ScriptedMessage(tool_calls=[_call("get_weather", {"city": "Lyon"})], finish_reason="tool_calls")
    turn = _agent(server, broken, fixed)
    assert _calls(turn) == [("get_weather", {"city": "Lyon"})]
    assert server.stats().bodies[1]["messages"][-1]["content"].startswith(FEEDBACK_PREFIX)


def test_a_server_without_a_tool_parser_gets_the_tools_in_the_prompt(server: OpenAIServer) -> None:
    hermes = '<tool_call>{"name": "get_weather", "arguments": {"city": "Lyon"}}</tool_call>'
    turn = _agent(server, _text(hermes), reject_tools=True)
    assert _calls(turn) == [("get_weather", {"city": "Lyon"})]
    first, second = server.stats().bodies
    assert "tools" in first and "tools" not in second
    assert "<tools>" in second["messages"][0]["content"] and "get_time" in second["messages"][0]["content"]


def test_eigen_agent_speaks_natively_with_app_actions(server: OpenAIServer) -> None:
    pay = {"type": "function", "function": {"name": "pay_invoice", "parameters": {"type": "object"}}}
    lookup = {"type": "function", "function": {"name": "find_user", "parameters": {"type": "object"}}}
    inputs = TrajectoryAgentInput(
        policy="Verify the customer first.",
        today="2026-01-02",
        tools=[lookup],
        user_tools=[pay],
        messages=[
            {"role": "system", "content": dialog_system_message("Verify the customer first.", "2026-01-02")},
            {"role": "user", "content": "I want to pay my invoice."},
        ],
    )
    ask = ScriptedMessage(
        content="Please pay the invoice in the app.",
        tool_calls=[_call(APP_ACTION_TOOL, {"action": "pay_invoice", "arguments": {"invoice": "I-1"}})],
    )
    step = _agent(server, ask, role=EIGEN_TRAJECTORY_AGENT, inputs=inputs)
    assert step.output.message == "Please pay the invoice in the app." and not step.output.tool_calls
    assert [(r.name, r.arguments) for r in step.output.user_action_requests] == [
        ("pay_invoice", {"invoice": "I-1"})
    ]
    body = server.stats().bodies[0]
    assert [t["function"]["name"] for t in body["tools"]] == ["find_user", APP_ACTION_TOOL]
    assert EIGEN_TRAJECTORY_AGENT.agent is not None
    assert EIGEN_TRAJECTORY_AGENT.agent.inputs_from(body["messages"], body["tools"]) == inputs
    look = ScriptedMessage(content="Looking you up.", tool_calls=[_call("find_user", {"email": "a@b.c"})])
    step = _agent(server, look, role=EIGEN_TRAJECTORY_AGENT, inputs=inputs)
    assert [c.name for c in step.output.tool_calls] == [
        "find_user"
    ] and step.output.think == "Looking you up."


def _routed(
    server: OpenAIServer, sampling: Sampling, context: int, role: Any, inputs: Any, given: Any = None
) -> Any:
    """One call on a gateway whose every role has ``sampling`` and a ``context``-token window; the
    answer, or the InvalidOutput it ended in."""
    route = RoleRoute(role=ASK.name, kind="generator", sampling=sampling, llm="rules", context_tokens=context)
    server.configure(ServerScript(messages=[_text(GOOD)]))

    async def run() -> Any:
        gateway = Gateway(OpenAIBackend(server.base_url, "test-model"), routes=lambda _: route)
        try:
            return await gateway.call(role, inputs, given)
        except InvalidOutput as exc:
            return exc
        finally:
            await gateway.aclose()

    return asyncio.run(run())


def test_per_role_sampling_and_stop_reach_the_server(server: OpenAIServer) -> None:
    sampling = Sampling(temperature=0.2, top_p=0.5, max_tokens=77, stop=["END"], seed=9)
    _routed(server, sampling, 32768, ASK, Question(text="x"), Sampling(seed=3))  # the caller's seed wins
    body = server.stats().bodies[0]
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["stop"], body["seed"]) == (
        0.2,
        0.5,
        77,
        ["END"],
        3,
    )


def test_a_prompt_over_the_context_budget_is_never_sent(server: OpenAIServer) -> None:
    failed = _routed(server, Sampling(max_tokens=400), 512, ASK, Question(text="long " * 200))
    assert isinstance(failed, PromptTooLong) and "512-token context" in failed.errors[0]
    assert server.stats().requests == 0


class Items(BaseModel):
    """Many short entries in one mapping: nothing the fitting shortens or thins."""

    items: dict[str, str]


LIST_ASK = Role(
    name="test_ask", input=Items, output=ASK.output, system=ASK.system, template="Items:\n{input}"
)


def test_a_long_prompt_is_sent_with_the_reply_room_left(server: OpenAIServer) -> None:
    inputs = Items(items={f"k{i}": f"item number {i}" for i in range(330)})
    assert _routed(server, Sampling(max_tokens=2048), 4096, LIST_ASK, inputs).output.answer == "Paris"
    (body,) = server.stats().bodies
    assert 256 <= body["max_tokens"] < 2048  # prompt + reply fit the 4096-token window

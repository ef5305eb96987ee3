"""`arena llm serve`: the rules simulator behind an OpenAI-compatible endpoint, through Arena's client.

The server runs as a real process on a free loopback port (stopped by PID); stages reach it
through the ``openai://`` backend exactly as they would reach vLLM.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from app.demo import sample_tools_dir
from app.llm_server import LlmServer
from arena.config import ArenaSettings
from arena.llm.gateway import Gateway
from arena.llm.roles.agent import AGENT_POLICY, AgentTurn, AgentTurnInput, PlannedCall
from arena.topics import topic
from producers.publish_tools import raw_key
from producers.tool_docs import load_tool_docs
from simulator.backend import RulesBackend
from streams import resources
from streams.runtime import Context, Emit, StageDef, run_handler
from streams.sft import chains, tasks
from streams.tools import tools_servers
from synthesis.sft.roles.chains import CHAIN_SYNTHESIS
from tests.fixtures.llm_serve import llm_server

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``arena llm serve`` (rules) on a free port; yields its /v1 URL."""
    with llm_server(tmp_path_factory.mktemp("serve-home"), free_port(), max_concurrency=4) as url:
        yield url


def test_models_and_requests_the_rules_model_cannot_answer(served: str) -> None:
    models = httpx.get(f"{served}/models").json()
    assert models["data"][0]["id"] == "rules-v1"
    post = f"{served}/chat/completions"
    plain = httpx.post(post, json={"model": "rules-v1", "messages": [{"role": "user", "content": "hi"}]})
    assert plain.status_code == 400 and "no role named" in plain.json()["error"]["message"]
    unknown = {"json_schema": {"name": "no_such_role", "schema": {}}}
    resp = httpx.post(post, json={"messages": [{"role": "user", "content": "x"}], "response_format": unknown})
    assert resp.status_code == 400 and "'no_such_role' is unknown" in resp.json()["error"]["message"]
    known = {"json_schema": {"name": CHAIN_SYNTHESIS.name, "schema": {}}}
    resp = httpx.post(post, json={"messages": [{"role": "user", "content": "x"}], "response_format": known})
    assert (
        resp.status_code == 400 and "does not follow the role's template" in resp.json()["error"]["message"]
    )
    bad_input = CHAIN_SYNTHESIS.template.replace("{input}", json.dumps({"server": "not a server"}))
    resp = httpx.post(
        post, json={"messages": [{"role": "user", "content": bad_input}], "response_format": known}
    )
    assert resp.status_code == 400 and "does not validate" in resp.json()["error"]["message"]
    assert httpx.post(post, content=b"{not json").status_code == 400
    odd = {"messages": [{"role": "user", "content": "x"}], "response_format": {"json_schema": "x"}}
    resp = httpx.post(post, json=odd)
    assert resp.status_code == 400 and "no role named" in resp.json()["error"]["message"]


async def _run(
    stage: StageDef[Any], inputs: list[tuple[str, BaseModel]], settings: ArenaSettings
) -> list[Emit]:
    spec = topic(stage.input)
    out: list[Emit] = []
    for key, record in inputs:
        raw = record.model_dump_json().encode()
        out += await run_handler(
            stage, record, Context(stage.name, stage.version, spec, key, settings, raw), raw
        )
    return out


async def _sft_prefix(settings: ArenaSettings) -> dict[str, list[str]]:
    """tools.raw -> tools.servers -> chains -> tasks on three sample servers; output keys per topic."""
    raws = load_tool_docs([sample_tools_dir() / "good"]).servers[:3]
    keys: dict[str, list[str]] = {}
    try:
        emits = await _run(tools_servers.STAGE, [(raw_key(r), r) for r in raws], settings)
        servers = [(e.key, e.value) for e in emits if e.topic == "tools.servers"]
        emits += await _run(chains.STAGE, servers, settings)
        chained = [(e.key, e.value) for e in emits if e.topic == "chains"]
        emits += await _run(tasks.CHAIN_STAGE, chained, settings)
        for emit in emits:
            keys.setdefault(emit.topic, []).append(emit.key)
    finally:
        await resources.gateway_for(settings).aclose()
    return {name: sorted(k) for name, k in keys.items()}


def test_stages_make_the_same_records_over_http_as_in_process(served: str, tmp_path: Path) -> None:
    local = ArenaSettings(home=tmp_path / "local", llm="rules")
    remote = ArenaSettings(
        home=tmp_path / "remote", llm=f"openai://{served.removeprefix('http://')}?model=rules-v1"
    )
    in_process = asyncio.run(_sft_prefix(local))
    over_http = asyncio.run(_sft_prefix(remote))
    assert in_process.get("tasks") and in_process.get("chains")
    assert over_http == in_process
    stats = httpx.get(f"{served}/arena/stats").json()
    assert stats["by_role"].get("chain_synthesis", 0) > 0 and stats["errors"] >= 1


AGENT_INPUTS = AgentTurnInput(
    messages=[{"role": "user", "content": "What is the weather in Lyon?"}],
    tools=[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
)


def agent_body() -> dict[str, Any]:
    """A native agent request, as Arena's client sends it (the role goes in X-Arena-Role)."""
    return {
        "model": "m",
        "messages": AGENT_POLICY.messages(AGENT_INPUTS),
        "tools": AGENT_INPUTS.tools,
        "seed": 0,
    }


def test_tool_calls_come_back_as_openai_tool_calls_when_tools_are_offered() -> None:
    def call_weather(inputs: BaseModel, rng: Any) -> BaseModel:
        assert isinstance(inputs, AgentTurnInput)
        return AgentTurn(
            content="looking it up", tool_calls=[PlannedCall(name="get_weather", arguments={"city": "Lyon"})]
        )

    def final_answer(inputs: BaseModel, rng: Any) -> BaseModel:
        return AgentTurn(content="It is sunny in Lyon.")

    server = LlmServer(RulesBackend(rules={AGENT_POLICY.name: call_weather}), model="m")
    status, reply = asyncio.run(server.chat(agent_body(), role=AGENT_POLICY.name))
    assert status == 200
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Lyon"}
    assert choice["message"]["content"] == "looking it up"
    server = LlmServer(RulesBackend(rules={AGENT_POLICY.name: final_answer}), model="m")
    status, reply = asyncio.run(server.chat(agent_body(), role=AGENT_POLICY.name))
    message = reply["choices"][0]["message"]
    assert "tool_calls" not in message and reply["choices"][0]["finish_reason"] == "stop"
    assert message["content"] == "It is sunny in Lyon."
    assert reply["usage"]["completion_tokens"] > 0 and reply["usage"]["prompt_tokens"] > 0


def test_latency_and_the_concurrency_limit_shape_what_the_server_sees() -> None:
    def answer(inputs: BaseModel, rng: Any) -> BaseModel:
        return AgentTurn(content="done")

    async def burst() -> tuple[float, dict[str, Any], list[int]]:
        server = LlmServer(
            RulesBackend(rules={AGENT_POLICY.name: answer}), model="m", latency_s=0.2, max_concurrency=2
        )
        started = time.monotonic()
        replies = await asyncio.gather(*(server.chat(agent_body(), role=AGENT_POLICY.name) for _ in range(6)))
        return time.monotonic() - started, server.stats.snapshot(), [status for status, _ in replies]

    elapsed, stats, statuses = asyncio.run(burst())
    assert statuses == [200] * 6
    assert elapsed >= 0.6  # 6 requests, 2 at a time, 0.2 s each
    assert stats["requests"] == 6 and stats["max_in_flight"] == 6 and stats["in_flight"] == 0
    assert 0 < stats["mean_in_flight"] <= 6


def test_a_retry_gets_a_fresh_draw_like_in_process() -> None:
    """The attempt (X-Arena-Attempt, else the request's seed) is the rules backend's attempt."""
    seen: list[int] = []

    def answer(inputs: BaseModel, rng: Any) -> BaseModel:
        seen.append(rng.randint(0, 10**9))
        return AgentTurn(content="done")

    server = LlmServer(RulesBackend(rules={AGENT_POLICY.name: answer}), model="m")
    for seed in (0, 1, 0):
        asyncio.run(server.chat({**agent_body(), "seed": seed}, role=AGENT_POLICY.name))
    assert seen[0] == seen[2] != seen[1]
    asyncio.run(server.chat({**agent_body(), "seed": 7}, attempt=0, role=AGENT_POLICY.name))
    assert seen[3] == seen[0]  # the header's attempt wins over the seed

    async def in_process() -> list[int]:
        gateway = Gateway(RulesBackend(rules={AGENT_POLICY.name: answer}))
        await gateway.call(AGENT_POLICY, AGENT_INPUTS)
        return seen[-1:]

    assert asyncio.run(in_process()) == seen[:1]


def test_every_role_the_simulator_answers_can_be_recovered_from_a_request() -> None:
    from arena.llm.roles.registry import roles
    from simulator import RULES

    assert set(roles()) == set(RULES)
    for name, role in roles().items():
        assert role.name == name and "{input}" in role.template


def test_a_callers_sampling_seed_gives_the_same_answer_over_http(served: str) -> None:
    """The rules backend draws by attempt, not by sampling seed; the attempt travels in a header."""
    from arena.llm.backends.openai import OpenAIBackend
    from arena.llm.core import Sampling

    inputs = AGENT_INPUTS  # sent natively: the conversation and tools

    async def both() -> tuple[Any, Any]:
        local = Gateway(RulesBackend(seed=0))
        remote = Gateway(OpenAIBackend(served, "rules-v1"))
        try:
            sampling = Sampling(seed=5)
            mine = await local.call(AGENT_POLICY, inputs, sampling)
            theirs = await remote.call(AGENT_POLICY, inputs, sampling)
            return mine.output, theirs.output
        finally:
            await local.aclose()
            await remote.aclose()

    in_process, over_http = asyncio.run(both())
    assert over_http == in_process

"""``arena llm serve`` (rules) answers any OpenAI client's tool-calling chat with its lexical agent.

A request that names no Arena role but offers ``tools`` is what BFCL, tau2 or an application sends:
the server answers it with the ``agent_policy`` role (the rules agent reads only the messages and
the tool schemas). Driven here with the real ``openai`` client over HTTP, through a whole tool loop;
a request with neither a role nor tools still gets a clear 400.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.fixtures.llm_serve import llm_server
from tests.test_llm_serve import free_port

pytestmark = pytest.mark.integration

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name, e.g. 'Paris'."}},
            "required": ["city"],
        },
    },
}
NOTE: Any = {
    "type": "function",
    "function": {
        "name": "create_note",
        "description": "Create a note with a title.",
        "parameters": {
            "type": "object",
            "properties": {"title": {"type": "string", "description": "Title of the note."}},
            "required": ["title"],
        },
    },
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llm_server(tmp_path_factory.mktemp("serve-home"), free_port(), max_concurrency=4) as url:
        yield url


@pytest.fixture()
def client(served: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=served, api_key="unused", max_retries=0, timeout=30)


def test_a_plain_tool_calling_chat_runs_a_whole_tool_loop(client: openai.OpenAI, served: str) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    first = client.chat.completions.create(model="rules-v1", messages=messages, tools=[WEATHER, NOTE])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    # The side-effecting tool was not asked for: the agent leaves it alone.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "clear"})}
    )
    second = client.chat.completions.create(model="rules-v1", messages=messages, tools=[WEATHER, NOTE])
    final = second.choices[0]
    assert final.finish_reason == "stop" and not final.message.tool_calls
    assert final.message.content and "21" in final.message.content
    stats = httpx.get(f"{served}/arena/stats", timeout=10).json()
    assert stats["by_role"].get("agent_policy", 0) >= 2


def test_requests_with_neither_a_role_nor_tools_get_a_clear_400(client: openai.OpenAI) -> None:
    hello: Any = [{"role": "user", "content": "hello"}]
    with pytest.raises(openai.BadRequestError) as plain:
        client.chat.completions.create(model="rules-v1", messages=hello)
    assert plain.value.status_code == 400
    assert "no role named" in str(plain.value) and "offer tools" in str(plain.value)
    with pytest.raises(openai.BadRequestError) as empty:
        client.chat.completions.create(model="rules-v1", messages=hello, tools=[])
    assert "no 'tools'" in str(empty.value)
    unknown: Any = {"type": "json_schema", "json_schema": {"name": "no_such_role", "schema": {}}}
    with pytest.raises(openai.BadRequestError) as named:
        client.chat.completions.create(
            model="rules-v1",
            messages=hello,
            tools=[WEATHER],
            response_format=unknown,
        )
    assert "'no_such_role' is unknown" in str(named.value)

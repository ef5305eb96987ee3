"""An LLM role sees a server's tools, never where it is deployed.

The deployed MCP servers' endpoints change from run to run (a free port; a module path a refactor
renames). In a role's input they changed the prompt, the response cache key and the rules
backend's seed, so the same tools gave different chains and tasks each run. The roles' inputs
drop the endpoint; the records keep it (trajectories call the server there).
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

import pytest

from arena.records.sft import ServerRef
from arena.records.tools import McpEndpoint
from synthesis.sft.roles.chains import (
    CHAIN_SYNTHESIS,
    TASK_FROM_CHAIN,
    ChainSynthesisInput,
    ChainTaskInput,
    TaskDraft,
)
from synthesis.sft.roles.tasks import TASK_FROM_SERVER, ServerTaskInput
from tests.test_dependencies import tool
from tests.test_tool_index import WEATHER


def _server(endpoint: McpEndpoint | None) -> ServerRef:
    return ServerRef.of(WEATHER).model_copy(update={"endpoint": endpoint})


ENDPOINTS = [
    McpEndpoint(transport="http", url="http://127.0.0.1:40707/mcp"),
    McpEndpoint(transport="http", url="http://127.0.0.1:38407/mcp"),
    McpEndpoint(transport="stdio", command=["python", "-m", "arena.samples.mcp.notes"]),
    None,
]


def _prompts(make: Any, role: Any) -> list[Any]:
    return [role.messages(make(_server(e))) for e in ENDPOINTS]


def test_role_prompts_do_not_depend_on_the_endpoint() -> None:
    for make, role in (
        (lambda s: ChainSynthesisInput(server=s, max_length=3, variant=1), CHAIN_SYNTHESIS),
        (lambda s: ChainTaskInput(server=s, chain=[s.tools[0].function.name], variant=0), TASK_FROM_CHAIN),
        (lambda s: ServerTaskInput(server=s, variant=2), TASK_FROM_SERVER),
    ):
        prompts = _prompts(make, role)
        assert all(p == prompts[-1] for p in prompts), role.name
        assert not any(mark in str(prompts[0]) for mark in ("40707", "38407", "arena.samples.mcp.notes"))


def test_the_record_keeps_the_endpoint() -> None:
    server = _server(ENDPOINTS[0])
    assert server.endpoint == ENDPOINTS[0]
    assert ChainSynthesisInput(server=server, max_length=3, variant=0).server.endpoint is None
    assert server.endpoint == ENDPOINTS[0]  # the caller's copy is untouched


def test_tool_names_are_an_enum_of_the_servers_tools_for_guided_decoding() -> None:
    """Under a server that constrains decoding to the schema (llama.cpp's json_object + schema), a
    weak model then cannot name a tool the server lacks (a 135M model did: `unknown_tool`)."""
    server = _server(None)
    names = [t.function.name for t in server.tools]
    chain = CHAIN_SYNTHESIS.schema_for(ChainSynthesisInput(server=server, max_length=3, variant=0))
    assert chain["properties"]["chain"]["items"] == {"type": "string", "enum": names}
    assert chain["properties"]["chain"]["maxItems"] == 3
    assert chain["$defs"]["Slot"]["properties"]["tool"]["enum"] == names
    served = TASK_FROM_SERVER.schema_for(ServerTaskInput(server=server, variant=0))
    assert served["$defs"]["Slot"]["properties"]["tool"]["enum"] == names
    # the role's own schema (the cache key's, the reply's validation) is untouched
    assert "enum" not in CHAIN_SYNTHESIS.output_schema()["properties"]["chain"]["items"]
    if importlib.util.find_spec("llama_cpp") is not None:  # llama.cpp compiles it to a grammar
        from llama_cpp.llama_grammar import LlamaGrammar

        LlamaGrammar.from_json_schema(json.dumps(chain), verbose=False)


GEO = ServerRef(
    server_id="srv-geo",
    name="geo",
    domain="weather",
    tools=[
        tool(
            "geocode_city",
            {"city": {"type": "string"}},
            ["city"],
            {"type": "object", "properties": {"latitude": {"type": "number"}}},
        ),
        tool(
            "current_weather",
            {"latitude": {"type": "number"}, "units": {"type": "string", "enum": ["metric", "imperial"]}},
            ["latitude", "units"],
            {"type": "object", "properties": {"summary": {"type": "string"}}},
        ),
    ],
)


def test_a_chain_tasks_slots_are_the_values_it_must_state_before_its_text() -> None:
    """SmolLM2-135M's task texts never stated the values its chains needed (every walk rejected at
    `dependency`). Under guided decoding the task's schema now asks, before the text, for exactly
    one slot per required argument no earlier output supplies: tool and argument fixed, the value
    non-empty (one of a string enum's values)."""
    inputs = ChainTaskInput(server=GEO, chain=["geocode_city", "current_weather", "geocode_city"], variant=0)
    schema = TASK_FROM_CHAIN.schema_for(inputs)
    assert list(schema["properties"]) == ["slots", "text"] and schema["required"] == ["slots", "text"]
    slots = schema["properties"]["slots"]
    assert slots["minItems"] == slots["maxItems"] == 2  # latitude comes from geocode_city's output
    fixed = [
        (s["properties"]["tool"]["const"], s["properties"]["argument"]["const"]) for s in slots["prefixItems"]
    ]
    assert fixed == [("geocode_city", "city"), ("current_weather", "units")]
    assert slots["prefixItems"][0]["properties"]["value"] == {"type": "string", "minLength": 1}
    assert slots["prefixItems"][1]["properties"]["value"] == {
        "type": "string",
        "enum": ["metric", "imperial"],
    }
    alone = TASK_FROM_CHAIN.schema_for(ChainTaskInput(server=GEO, chain=["current_weather"], variant=0))
    assert [s["properties"]["argument"]["const"] for s in alone["properties"]["slots"]["prefixItems"]] == [
        "latitude",
        "units",
    ]
    # the role's own schema (the reply's validation) is untouched: text first, any slots
    assert list(TASK_FROM_CHAIN.output_schema()["properties"]) == ["text", "slots"]
    # a reply that follows the narrowed schema is a valid TaskDraft
    draft = TaskDraft.model_validate(
        {"slots": [{"tool": "geocode_city", "argument": "city", "value": "Lyon"}], "text": "Weather in Lyon?"}
    )
    assert draft.slots[0].value == "Lyon"
    if importlib.util.find_spec("llama_cpp") is not None:  # llama.cpp compiles it to a grammar
        from llama_cpp.llama_grammar import LlamaGrammar

        LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)


def test_a_bounded_score_is_a_few_values_for_guided_decoding() -> None:
    """A JSON-schema grammar bounds neither a number's range nor its digits: SmolLM2-135M filled
    `score_task`'s max_tokens with one score's decimals. Under guided decoding a bounded number is
    an enum of 21 values, each valid for the role's model (which still validates the reply)."""
    from arena.llm.core import decodable
    from synthesis.sft.roles.tasks import SCORE_TASK, TaskScoreInput, TaskScores

    server = _server(None)
    schema = SCORE_TASK.schema_for(TaskScoreInput(task="Weather in Oslo?", tools=server.tools))
    values = schema["properties"]["question_quality"]["enum"]
    assert values[:3] == [0.0, 0.05, 0.1] and values[-1] == 1.0 and len(values) == 21
    assert "minimum" not in schema["properties"]["question_quality"]
    for value in values:
        TaskScores(question_quality=value, scenario_realism=value, tool_necessity=value, rationale="ok")
    assert SCORE_TASK.output_schema()["properties"]["question_quality"]["maximum"] == 1  # the role's own
    # exclusive bounds leave their end out; an unbounded number and an integer range stay as they are
    assert decodable({"type": "number", "exclusiveMinimum": 0, "maximum": 2})["enum"][0] == 0.1
    assert decodable({"type": "number", "minimum": 0}) == {"type": "number", "minimum": 0}
    assert decodable({"type": "integer", "minimum": 1, "maximum": 5}) == {
        "type": "integer",
        "minimum": 1,
        "maximum": 5,
    }
    if importlib.util.find_spec("llama_cpp") is not None:  # llama.cpp compiles it to a grammar
        from llama_cpp.llama_grammar import LlamaGrammar

        LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)


def test_a_judges_reason_is_bounded_for_guided_decoding() -> None:
    """Under guided decoding SmolLM2-135M wrote `score_task`'s rationale on until max_tokens (512,
    then 976), so the verdict was cut: every judge's reason carries a maxLength into the grammar,
    and an unguided reply that runs longer is clipped, not refused."""
    from pydantic import BaseModel, ValidationError

    from arena.llm.core import JUDGE_REASON_CHARS
    from synthesis.envs.roles.envs import HomogeneousGroups
    from synthesis.envs.roles.qa import StepVerdict, ToolNeed
    from synthesis.sft.roles.chains import CoherenceVerdict
    from synthesis.sft.roles.judges import Judgement
    from synthesis.sft.roles.tasks import SCORE_TASK, TaskScoreInput, TaskScores

    judged: list[tuple[type[BaseModel], str]] = [
        (TaskScores, "rationale"),
        (CoherenceVerdict, "reason"),
        (Judgement, "reason"),
        (ToolNeed, "reason"),
        (StepVerdict, "reason"),
        (HomogeneousGroups, "reason"),
    ]
    for model, name in judged:
        field = model.model_json_schema()["properties"][name]
        assert (field["maxLength"], field["minLength"]) == (JUDGE_REASON_CHARS, 1), model
        assert field["description"], model  # the field's own description survives
    schema = SCORE_TASK.schema_for(TaskScoreInput(task="Weather in Oslo?", tools=_server(None).tools))
    assert schema["properties"]["rationale"]["maxLength"] == JUDGE_REASON_CHARS
    scores = {"question_quality": 1.0, "scenario_realism": 1.0, "tool_necessity": 1.0}
    assert TaskScores(**scores, rationale="x" * 2000).rationale == "x" * JUDGE_REASON_CHARS
    with pytest.raises(ValidationError):
        TaskScores(**scores, rationale="")
    if importlib.util.find_spec("llama_cpp") is not None:  # llama.cpp compiles the bound to a grammar
        from llama_cpp.llama_grammar import LlamaGrammar

        LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)

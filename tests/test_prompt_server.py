"""An LLM role sees a server's tools, never where it is deployed.

The deployed MCP servers' endpoints change from run to run (a free port; a module path a refactor
renames). In a role's input they changed the prompt, the response cache key and the rules
backend's seed, so the same tools gave different chains and tasks each run. The roles' inputs
drop the endpoint; the records keep it (trajectories call the server there).
"""

from __future__ import annotations

from typing import Any

from arena.records.sft import ServerRef
from arena.records.tools import McpEndpoint
from synthesis.sft.roles.chains import CHAIN_SYNTHESIS, TASK_FROM_CHAIN, ChainSynthesisInput, ChainTaskInput
from synthesis.sft.roles.tasks import TASK_FROM_SERVER, ServerTaskInput
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

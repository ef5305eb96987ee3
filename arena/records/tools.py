"""Tool-doc records: ``tools.raw`` (as published) and ``tools.servers`` (normalised)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from arena.records.common import Record, utcnow


def tool_name(spec: Mapping[str, Any]) -> str:
    """Name of an OpenAI tool spec (``{"type": "function", "function": {...}}`` or the bare function)."""
    return str(spec.get("function", spec).get("name", ""))


class ToolDocFormat(StrEnum):
    openai = "openai"
    """OpenAI tool / function schemas (``{"type": "function", "function": {...}}`` or bare functions)."""
    mcp = "mcp"
    """MCP ``tools/list`` results: ``{"tools": [{"name", "description", "inputSchema"}]}``."""
    bfcl = "bfcl"
    """BFCL-style function docs: ``"type": "dict"``, ``float``, ``tuple``, ``any``, ``response``."""
    openapi = "openapi"
    """OpenAPI 3 documents: each operation is a tool."""


class McpEndpoint(BaseModel):
    """Where a deployed MCP server answers: a command to spawn (stdio) or a streamable-HTTP URL."""

    transport: Annotated[Literal["stdio", "http"], Field(description="MCP transport.")]
    command: Annotated[
        list[str] | None, Field(description="stdio: argv of the server process (one process per session).")
    ] = None
    url: Annotated[
        str | None, Field(description="http: the streamable-HTTP endpoint, e.g. http://127.0.0.1:8000/mcp.")
    ] = None

    @model_validator(mode="after")
    def _target(self) -> McpEndpoint:
        if self.transport == "stdio" and not self.command:
            raise ValueError("a stdio MCP endpoint needs a command")
        if self.transport == "http" and not self.url:
            raise ValueError("an http MCP endpoint needs a url")
        return self

    def describe(self) -> str:
        return " ".join(self.command or []) if self.transport == "stdio" else str(self.url)


class RawToolServer(Record):
    """One candidate server as published; value of ``tools.raw``."""

    server: Annotated[
        str,
        Field(
            min_length=1, description="Candidate server name: the service title or the origin file's stem."
        ),
    ]
    source: Annotated[str, Field(description="Origin file path or URI the entries came from.")]
    format: Annotated[ToolDocFormat, Field(description="Detected doc format of the entries.")]
    entries: Annotated[
        list[Any],
        Field(
            description="Tool entries exactly as found in the source (for OpenAPI: one per operation, with its path and method)."
        ),
    ]
    context: dict[str, Any] = Field(
        default_factory=dict, description="Format context needed to convert entries, e.g. OpenAPI components."
    )
    endpoint: Annotated[
        McpEndpoint | None,
        Field(description="Set when the server is deployed: its tools are called over MCP, not emulated."),
    ] = None
    published_at: datetime = Field(
        default_factory=utcnow, description="When `arena publish` read the source."
    )


class ToolFunction(BaseModel):
    """The ``function`` part of an OpenAI tool."""

    name: Annotated[
        str, Field(pattern=r"^[a-zA-Z0-9_.-]{1,64}$", description="Tool name, OpenAI-compatible.")
    ]
    description: Annotated[str, Field(description="What the tool does, as documented (capped).")]
    parameters: Annotated[dict[str, Any], Field(description="JSON Schema of the arguments (type object).")]


class NormalizedTool(BaseModel):
    """A tool in the unified OpenAI tool-calling schema, plus metadata."""

    type: Literal["function"] = "function"
    function: ToolFunction
    response_schema: Annotated[
        dict[str, Any] | None,
        Field(
            description="JSON Schema of the tool's output, when documented (metadata, not sent to models)."
        ),
    ] = None
    description_truncated: Annotated[
        bool, Field(description="True when the description was capped at the configured size.")
    ] = False

    def openai(self) -> dict[str, Any]:
        """The tool as sent to an OpenAI-compatible client."""
        return {"type": "function", "function": self.function.model_dump()}


class ToolServer(Record):
    """A normalised, filtered server; value of ``tools.servers``."""

    server_id: Annotated[str, Field(description="Content hash of name + normalised tools.")]
    name: Annotated[str, Field(description="Server name.")]
    source: Annotated[str, Field(description="Origin file path or URI.")]
    format: Annotated[ToolDocFormat, Field(description="Format the docs were published in.")]
    domain: Annotated[str, Field(description="Domain from the fixed taxonomy (synthesis.sft.domains).")]
    domain_score: Annotated[
        float, Field(description="Cosine similarity of the server text to the domain label.")
    ]
    tools: Annotated[
        list[NormalizedTool],
        Field(min_length=3, description="The tools that passed every gate (at least 3)."),
    ]
    dropped_tools: list[str] = Field(
        default_factory=list, description="Names of tools this server lost to a gate."
    )
    endpoint: Annotated[
        McpEndpoint | None,
        Field(description="Deployed MCP server (real calls); None for a doc-only server (emulated)."),
    ] = None

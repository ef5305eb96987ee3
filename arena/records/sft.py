"""SFT-track records (ASTRA §2.1.2-2.1.5): chains, tasks, trajectories, samples.

Records are self-contained (a chain carries its server's tools, a task its
chain and tools) so each stage needs nothing but its input record.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field

from arena.hashing import content_hash
from arena.records.common import Record
from arena.records.tools import McpEndpoint, NormalizedTool, ToolServer

AugmentAxis = Literal["diversity", "complexity", "persona"]


class ServerRef(BaseModel):
    """The parts of a ``tools.servers`` record later stages need."""

    server_id: Annotated[str, Field(description="Key of the server in tools.servers.")]
    name: Annotated[str, Field(description="Server name.")]
    domain: Annotated[str, Field(description="Domain from the fixed taxonomy.")]
    tools: Annotated[list[NormalizedTool], Field(description="The server's normalised tools.")]
    endpoint: Annotated[
        McpEndpoint | None, Field(description="Deployed MCP server, or None when calls are emulated.")
    ] = None

    @classmethod
    def of(cls, server: ToolServer) -> ServerRef:
        return cls(
            server_id=server.server_id,
            name=server.name,
            domain=server.domain,
            tools=server.tools,
            endpoint=server.endpoint,
        )

    def tool(self, name: str) -> NormalizedTool | None:
        return next((t for t in self.tools if t.function.name == name), None)

    def without_endpoint(self) -> ServerRef:
        """The server as a prompt shows it: where it is deployed is no part of what it does."""
        return self if self.endpoint is None else self.model_copy(update={"endpoint": None})


PromptServer = Annotated[
    ServerRef,
    AfterValidator(ServerRef.without_endpoint),
    Field(description="The server: name, domain and its normalised tools (never its endpoint)."),
]
"""A server in an LLM role's input. The endpoint (a random port, a module path) would change the
prompt, the response cache key and the rules backend's seed from run to run without changing what
the server does, so the same tools would give different chains and tasks."""


class Slot(BaseModel):
    """An argument value a task states in its text."""

    tool: Annotated[str, Field(description="Tool whose argument this is.")]
    argument: Annotated[str, Field(description="Argument name.")]
    value: Annotated[str, Field(description="The value as written in the task text.")]


class Dependency(BaseModel):
    """How one required argument of a chain step is supported (§2.1.2 dependency verification)."""

    step: Annotated[int, Field(ge=0, description="0-based position of the tool in the chain.")]
    tool: Annotated[str, Field(description="Tool at that step.")]
    argument: Annotated[str, Field(description="Required argument.")]
    source: Annotated[
        Literal["task", "output", "unsupported"],
        Field(description="The task text states it, an earlier tool's output field provides it, or neither."),
    ]
    provider: Annotated[
        str | None,
        Field(description="For 'output': 'step:tool.field' of the earliest provider; for 'task': the value."),
    ] = None


class ToolChain(Record):
    """A verified candidate tool chain for one server; value of ``chains``."""

    chain_id: Annotated[str, Field(description="Content hash of server id + tool sequence.")]
    server: Annotated[ServerRef, Field(description="Server the chain runs on (its tools only).")]
    tools: Annotated[list[str], Field(min_length=1, description="Tool names in call order.")]
    origin: Annotated[
        Literal["synthesised", "random_walk"],
        Field(description="Joint (task, chain) synthesis or a walk on the transition graph."),
    ]
    task: Annotated[str, Field(description="The task the chain was verified against.")]
    slots: list[Slot] = Field(default_factory=list, description="Argument values the task states.")
    dependencies: list[Dependency] = Field(
        default_factory=list, description="Per required argument: what supports it."
    )
    walk_weight: Annotated[
        float,
        Field(ge=0, description="Product of normalised edge weights along the walk (1 for synthesised)."),
    ] = 1.0
    graph_chains: Annotated[
        int, Field(ge=0, description="Synthesised chains in the server's transition graph when walked.")
    ] = 0


class Task(Record):
    """A scored user task for one server; value of ``tasks``."""

    task_id: Annotated[str, Field(description="Content hash of server id + task text.")]
    server: Annotated[ServerRef, Field(description="Server whose tools the task needs.")]
    chain_id: Annotated[
        str | None, Field(description="Chain it was conditioned on (None in server-only mode).")
    ] = None
    chain: list[str] = Field(default_factory=list, description="Tool names of that chain (metadata only).")
    text: Annotated[str, Field(min_length=1, description="The task as a user would ask it.")]
    language: Annotated[str, Field(description="ISO 639-1 language of the text.")]
    mode: Annotated[
        Literal["chain", "server"], Field(description="Chain-conditioned or server-only construction.")
    ]
    augmentation: Annotated[
        Literal["none", "diversity", "complexity", "persona"], Field(description="Augmentation axis applied.")
    ] = "none"
    parent_task_id: Annotated[str | None, Field(description="Original task of an augmented variant.")] = None
    persona: Annotated[str | None, Field(description="Persona of a persona-conditioned variant.")] = None
    scores: dict[str, float] = Field(
        default_factory=dict, description="question_quality, scenario_realism, tool_necessity in [0, 1]."
    )


class CallStatus(BaseModel):
    """Outcome of one tool call in a trajectory."""

    call_id: Annotated[str, Field(description="tool_call id in the messages.")]
    tool: Annotated[str, Field(description="Tool called.")]
    ok: Annotated[bool, Field(description="True when the call returned a valid response (S_i = 1).")]
    source: Annotated[
        Literal["mcp", "emulator", "none"],
        Field(description="Real MCP server, the emulator, or none (unknown tool / bad arguments)."),
    ]
    error_kind: Annotated[
        str | None, Field(description="timeout, unreachable, tool_error, unknown_tool, bad_arguments.")
    ] = None
    latency_ms: Annotated[float, Field(ge=0, description="Wall time of the call.")] = 0.0


class Trajectory(Record):
    """An agent rollout on a task; value of ``trajectories``."""

    trajectory_id: Annotated[
        str,
        Field(
            description="Content hash of task id + agent backend and model: one rollout per task and policy."
        ),
    ]
    task_id: Annotated[str, Field(description="Task that was attempted.")]
    task: Annotated[str, Field(description="Task text (m1).")]
    server_id: Annotated[str, Field(description="Server whose tools were offered.")]
    messages: Annotated[
        list[dict[str, Any]], Field(description="OpenAI chat messages m0..m(k-1), tool calls included.")
    ]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools offered to the agent.")]
    call_status: list[CallStatus] = Field(default_factory=list, description="Per tool call, in order.")
    stop_reason: Annotated[Literal["answer", "max_turns"], Field(description="Why the loop ended.")]
    turns: Annotated[int, Field(ge=0, description="Assistant turns taken.")]


class ScoredTrajectory(Record):
    """A trajectory with its 7-dimension reward; value of ``trajectories.scored``."""

    trajectory_id: Annotated[str, Field(description="Scored trajectory.")]
    scores: Annotated[dict[str, float], Field(description="QU, QP, TCU, TCP, TCS, TC, FA in [0, 1].")]
    overall: Annotated[float, Field(ge=0, le=1, description="Mean of the seven scores.")]
    details: dict[str, Any] = Field(
        default_factory=dict, description="Per-round and per-call judgements behind the scores."
    )
    trajectory: Annotated[Trajectory, Field(description="The trajectory itself.")]


class SftSample(Record):
    """A training conversation; value of ``samples.sft``."""

    sample_id: Annotated[str, Field(description="Content hash of messages + tools.")]
    messages: Annotated[list[dict[str, Any]], Field(description="OpenAI chat messages.")]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools available in the conversation.")]
    role_target: Annotated[
        Literal["agent", "user"], Field(description="Which side's turns are the training target.")
    ]
    source: Annotated[str, Field(description="Producing track, e.g. 'astra' or 'eigen'.")]
    reward: Annotated[float | None, Field(description="Quality score that admitted it, if any.")] = None
    origin_id: Annotated[
        str | None, Field(description="Key of the record it came from (e.g. a trajectory id).")
    ] = None


Side = tuple[Literal["agent", "user"], list[dict[str, Any]], list[dict[str, Any]]]
"""One side of a dialogue: (role_target, its messages, the tools that side calls)."""


def dialogue_samples(sides: list[Side], *, source: str, origin: str) -> list[SftSample]:
    """The training conversations of one accepted dialogue, a sample per side.

    Keyed by origin and side, not content: a dialogue carries its tools' timestamps and uuids, so
    a replayed record would otherwise make a second sample.
    """
    return [
        SftSample(
            sample_id=content_hash({"origin": origin, "target": target}, prefix="sft-", length=24),
            messages=messages,
            tools=tools,
            role_target=target,
            source=source,
            reward=1.0,
            origin_id=origin,
        )
        for target, messages, tools in sides
    ]

"""SFT-track records (ASTRA §2.1.2-2.1.5): chains, tasks, trajectories, samples.

Declared here so the topic registry is complete; the SFT-track stages fill them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from arena.records.common import Record


class ToolChain(Record):
    """A candidate tool chain for one server; value of ``chains``."""

    chain_id: Annotated[str, Field(description="Content hash of server id + tool sequence.")]
    server_id: Annotated[str, Field(description="Server the chain runs on.")]
    tools: Annotated[list[str], Field(min_length=1, description="Tool names in call order.")]
    origin: Annotated[
        Literal["synthesised", "random_walk"],
        Field(description="Joint (task, chain) synthesis or a graph walk."),
    ]
    seed_task: Annotated[
        str | None, Field(description="Task text synthesised jointly with the chain, if any.")
    ] = None
    dependencies: list[dict[str, Any]] = Field(
        default_factory=list, description="Per argument: which task text or earlier output field supports it."
    )


class Task(Record):
    """A user task for one server; value of ``tasks``."""

    task_id: Annotated[str, Field(description="Content hash of the task text + server id.")]
    server_id: Annotated[str, Field(description="Server whose tools the task needs.")]
    chain_id: Annotated[
        str | None, Field(description="Chain it was conditioned on (None in server-only mode).")
    ] = None
    text: Annotated[str, Field(min_length=1, description="The task as a user would ask it.")]
    mode: Annotated[
        Literal["chain", "server"], Field(description="Chain-conditioned or server-only construction.")
    ]
    augmentation: Annotated[
        Literal["none", "diversity", "complexity", "persona"], Field(description="Augmentation axis applied.")
    ] = "none"
    scores: dict[str, float] = Field(
        default_factory=dict, description="question_quality, scenario_realism, tool_necessity."
    )


class Trajectory(Record):
    """An agent rollout on a task; value of ``trajectories``."""

    trajectory_id: Annotated[str, Field(description="Content hash of task id + messages.")]
    task_id: Annotated[str, Field(description="Task that was attempted.")]
    server_id: Annotated[str, Field(description="Server whose tools were offered.")]
    messages: Annotated[list[dict[str, Any]], Field(description="OpenAI chat messages, tool calls included.")]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools offered to the agent.")]
    call_status: list[dict[str, Any]] = Field(
        default_factory=list, description="Per tool call: ok / error, and whether real MCP or emulated."
    )


class ScoredTrajectory(Record):
    """A trajectory with its 7-dimension reward; value of ``trajectories.scored``."""

    trajectory_id: Annotated[str, Field(description="Scored trajectory.")]
    scores: Annotated[dict[str, float], Field(description="QU, QP, TCU, TCP, TCS, TC, FA.")]
    overall: Annotated[float, Field(ge=0, le=1, description="Mean of the seven scores.")]
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

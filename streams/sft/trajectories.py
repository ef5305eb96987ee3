"""Stage ``tasks -> trajectories`` (ASTRA §2.1.4): multi-turn rollouts over real and emulated tools.

Each task runs once through the agent loop against its server: a deployed
MCP server (stdio or streamable HTTP, its own process) is called over MCP; a
doc-only server is answered by the stateful emulator with injected failures.
A rollout that hits ``sft.max_turns`` without a final answer goes to
``trajectories.rejected``.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.hashing import content_hash
from arena.llm.core import InvalidOutput
from arena.records.sft import Task, Trajectory
from streams.resources import gateway_for
from streams.runtime import Context, Emit, StageDef, llm_lineage
from synthesis.sft.agent_loop import AgentLoop
from synthesis.sft.tool_pool import open_session

STAGE_VERSION = "1"


async def handle(record: Task, ctx: Context) -> Sequence[Emit]:
    gw = gateway_for(ctx.settings)
    cfg = ctx.settings.sft
    tid = content_hash(
        {"task": record.task_id, "backend": gw.backend.name, "model": gw.backend.model},
        prefix="traj-",
        length=24,
    )
    openai_tools = [t.openai() for t in record.server.tools]
    session = await open_session(record.server, gw, ctx.settings, session_id=tid)
    try:
        loop = AgentLoop(gw, session, openai_tools, cfg.max_turns)
        result = await loop.run(record.text)
    except InvalidOutput as exc:
        return [ctx.llm_dead_letter(exc, f"agent on {record.task_id}")]
    finally:
        await session.aclose()
    trajectory = Trajectory(
        trajectory_id=tid,
        task_id=record.task_id,
        task=record.text,
        server_id=record.server.server_id,
        messages=result.messages,
        tools=openai_tools,
        call_status=result.call_status,
        stop_reason=result.stop_reason,
        turns=result.turns,
    )
    if result.stop_reason == "max_turns":
        return [
            ctx.reject(
                "no_final_answer",
                tid,
                f"no final answer after {result.turns} turns (sft.max_turns = {cfg.max_turns})",
                details={"calls": len(result.call_status)},
                record=trajectory.model_dump(mode="json"),
                candidate_of="trajectories",
            )
        ]
    return [Emit("trajectories", tid, trajectory, (ctx.source_key,), **llm_lineage(result.answers))]


STAGE = StageDef(
    name="trajectories",
    input="tasks",
    input_model=Task,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("trajectories",),
    description="agent loop over deployed MCP servers and the stateful emulator",
    dedupe=True,
)

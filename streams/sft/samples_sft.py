"""Stage ``trajectories.scored -> samples.sft``: keep trajectories whose reward reaches the threshold.

A sample is the trajectory's OpenAI chat messages and tools with
``role_target = agent``; lower-scoring trajectories go to
``samples.sft.rejected`` with their seven scores.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.hashing import content_hash
from arena.records.sft import ScoredTrajectory, SftSample
from streams.runtime import Context, Emit, StageDef

STAGE_VERSION = "1"


async def handle(record: ScoredTrajectory, ctx: Context) -> Sequence[Emit]:
    threshold = ctx.settings.sft.reward_threshold
    traj = record.trajectory
    if record.overall < threshold:
        return [
            ctx.reject(
                "reward_threshold",
                record.trajectory_id,
                f"overall reward {record.overall:.3f} < {threshold:.3f}",
                details={"scores": record.scores, "overall": record.overall},
                candidate_of="samples.sft",
            )
        ]
    sample_id = content_hash({"messages": traj.messages, "tools": traj.tools}, prefix="sft-", length=24)
    sample = SftSample(
        sample_id=sample_id,
        messages=traj.messages,
        tools=traj.tools,
        role_target="agent",
        source="astra",
        reward=record.overall,
        origin_id=record.trajectory_id,
    )
    return [Emit("samples.sft", sample_id, sample, (ctx.source_key,))]


STAGE = StageDef(
    name="samples-sft",
    input="trajectories.scored",
    input_model=ScoredTrajectory,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("samples.sft",),
    description="trajectories at or above the reward threshold become SFT samples",
)

"""Stage ``trajectories -> trajectories.scored`` (ASTRA §2.1.5): the 7-dimension reward.

The judges run through the gateway (``synthesis.sft.reward``); a judge that
stays invalid or undecidable after its retries dead-letters the trajectory:
it is never scored by default.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.hashing import content_hash
from arena.records.sft import ScoredTrajectory, Trajectory
from streams.resources import gateway_for
from streams.runtime import Context, Emit, StageDef, llm_lineage
from synthesis.sft.reward import score_trajectory

STAGE_VERSION = "1"


def scored_key(trajectory_id: str) -> str:
    """Key of a trajectory's scored record: a key of its own, so lineage keeps the trajectory and
    its scored record as two nodes (under the trajectory's key the edge pointed at itself)."""
    return content_hash({"scored": trajectory_id}, prefix="scored-", length=24)


async def handle(record: Trajectory, ctx: Context) -> Sequence[Emit]:
    gw = gateway_for(ctx.settings)
    score = await score_trajectory(gw, record)  # InvalidOutput -> dead letter (runtime)
    scored = ScoredTrajectory(
        trajectory_id=record.trajectory_id,
        scores=score.scores,
        overall=score.overall,
        details=score.details,
        trajectory=record,
    )
    return [
        Emit(
            "trajectories.scored",
            scored_key(record.trajectory_id),
            scored,
            (ctx.source_key,),
            **llm_lineage(score.answers),
        )
    ]


STAGE = StageDef(
    name="trajectories-scored",
    input="trajectories",
    input_model=Trajectory,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("trajectories.scored",),
    description="QU, QP, TCU, TCP, TCS, TC, FA and their mean (ASTRA eq. 3-10)",
    dedupe=True,
)

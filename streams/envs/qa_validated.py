"""Stage ``qa.traces -> qa.validated`` (ASTRA §2.2.2): the leaf rule and the QA quality score.

A sub-question that needs no tool may only be a leaf; the survivors get DC,
SA, SR and TC (eq. 14-20) and are kept when QS (eq. 21) reaches
``envs.qs_threshold``. Every drop lands in ``qa.traces.rejected`` with its
gate, reason and scores; kept traces carry their scores.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.hashing import content_hash
from arena.llm.core import InvalidOutput
from arena.records.envs import QaTrace
from streams.resources import gateway_for
from streams.runtime import Context, Emit, StageDef, llm_lineage
from synthesis.envs.quality import validate

STAGE_VERSION = "1"


def validated_key(qa_id: str) -> str:
    """Key of a validated trace: a key of its own, so lineage keeps the trace and its validated
    copy as two nodes (under the trace's key the edge pointed at itself)."""
    return content_hash({"validated": qa_id}, prefix="qav-", length=24)


async def handle(record: QaTrace, ctx: Context) -> Sequence[Emit]:
    gw = gateway_for(ctx.settings)
    try:
        verdict = await validate(record, gw, ctx.settings)
    except InvalidOutput as exc:
        return [ctx.llm_dead_letter(exc, f"validating {record.qa_id}")]
    scored = verdict.trace  # with the classifier's tool-need per step and the scores
    if not verdict.keep:
        return [
            ctx.reject(
                verdict.gate or "quality",
                record.qa_id,
                verdict.reason,
                details=dict(verdict.scores),
                record=scored.model_dump(mode="json"),
            )
        ]
    key = validated_key(scored.qa_id)
    return [Emit("qa.validated", key, scored, (ctx.source_key,), **llm_lineage(verdict.answers))]


STAGE = StageDef(
    name="qa-validated",
    input="qa.traces",
    input_model=QaTrace,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("qa.validated",),
    description="no-tool steps only at leaves; DC, SA, SR, TC, keep QS >= threshold",
    dedupe=True,
)

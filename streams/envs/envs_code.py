"""Stage ``qa.validated -> envs.code`` (ASTRA §2.2.3): one executable sub-environment per tool step.

For every tool-needing sub-question: tool spec, complexity scaling, then
invocation and implementation, executed in the sandbox until the output
contains the sub-answer (``envs.synthesis_attempts`` tries, restarting at the
invocation). An instance with a sub-question that never verifies goes to
``envs.code.rejected`` with the failing step and the last sandbox error.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.llm.core import InvalidOutput
from arena.records.envs import QaTrace
from streams.resources import gateway_for, sandbox_pool_for
from streams.runtime import Context, Emit, StageDef, llm_lineage
from synthesis.envs.env_synthesis import synthesize_package

STAGE_VERSION = "1"


async def handle(record: QaTrace, ctx: Context) -> Sequence[Emit]:
    gw = gateway_for(ctx.settings)
    pool = await sandbox_pool_for(ctx.settings)
    try:
        result = await synthesize_package(record, gw, pool, ctx.settings)
    except InvalidOutput as exc:
        return [ctx.llm_dead_letter(exc, f"environment synthesis of {record.qa_id}")]
    if result.package is None:
        return [
            ctx.reject(
                "sandbox_verification",
                record.qa_id,
                result.reason,
                details={"attempts": result.attempts},
                record=record.model_dump(mode="json"),
                candidate_of="envs.code",
            )
        ]
    package = result.package
    return [Emit("envs.code", package.env_id, package, (ctx.source_key,), **llm_lineage(result.answers))]


STAGE = StageDef(
    name="envs-code",
    input="qa.validated",
    input_model=QaTrace,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("envs.code",),
    description="tool spec, complexity scaling, invocation, implementation, verified in the sandbox",
    dedupe=True,
)

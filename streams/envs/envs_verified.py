"""Stage ``envs.code -> envs.verified`` (ASTRA §2.2.4): merge homogeneous sub-environments.

Sub-questions with the same intent and different parameters share one tool:
the base implementation's data is extended with the others' rows, and every
job is re-executed after each insertion. The merged package (version 2)
still answers every sub-question; one that would not is left unmerged.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.llm.core import InvalidOutput
from arena.llm.routing import budget_for
from arena.records.envs import EnvPackage
from sandbox.env_runtime import verify_package
from streams.resources import gateway_for, sandbox_pool_for
from streams.runtime import Context, Emit, StageDef, llm_lineage
from synthesis.envs.merging import merge_package
from synthesis.envs.roles.envs import HOMOGENEOUS_GROUPS

STAGE_VERSION = "1"


async def handle(record: EnvPackage, ctx: Context) -> Sequence[Emit]:
    gw = gateway_for(ctx.settings)
    pool = await sandbox_pool_for(ctx.settings)
    try:
        result = await merge_package(
            record, gw, pool, budget=budget_for(ctx.settings, HOMOGENEOUS_GROUPS.name)
        )
    except InvalidOutput as exc:
        return [ctx.llm_dead_letter(exc, f"merging {record.env_id}")]
    merged = result.package
    # The package is published only if every job passes in a final, independent run.
    failing = [o for o in await verify_package(merged, pool) if not o.passed]
    if failing:
        first = failing[0]
        return [
            ctx.reject(
                "verification",
                merged.env_id,
                f"{len(failing)} of {len(merged.jobs)} jobs fail after merging; job {first.index}: {first.error}",
                record=merged.model_dump(mode="json"),
                candidate_of="envs.verified",
            )
        ]
    return [Emit("envs.verified", merged.env_id, merged, (ctx.source_key,), **llm_lineage(result.answers))]


STAGE = StageDef(
    name="envs-verified",
    input="envs.code",
    input_model=EnvPackage,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("envs.verified",),
    description="merge homogeneous sub-environments, expand their data, re-verify every job",
    dedupe=True,
)

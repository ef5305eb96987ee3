"""Stage ``envs.verified -> samples.verified``: training samples from verified packages.

Every package is recorded in the catalog with its split: held out when the package's
content hash mod ``envs.heldout_k`` is 0, or when it calls a tool of a family held
out by ``envs.heldout_families_k`` or named in ``envs.heldout_families``
(``lake.env_packages.package_split``). Held-out packages
stay in the catalog for evaluation and are never published, so the trainer
cannot see them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from arena.hashing import content_hash
from arena.records.envs import EnvPackage, VerifiedSample
from lake.env_packages import package_split
from streams.resources import env_store_for
from streams.runtime import Context, Emit, StageDef

STAGE_VERSION = "1"

SYSTEM_PROMPT = (
    "You are a helpful assistant with access to tools. Answer the user's question; call tools to "
    "look up every fact you need, then reply with the final answer."
)


def sample_of(package: EnvPackage) -> VerifiedSample:
    """The ``qa`` sample of a package: the main question, its tools, and the jobs the F1 reward checks."""
    return VerifiedSample(
        sample_id=content_hash({"kind": "qa", "env": package.env_id}, prefix="vs-", length=24),
        kind="qa",
        prompt=[
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": package.question},
        ],
        tools=package.tools,
        env_ref=package.env_id,
        reward_spec={
            "jobs": [{"index": j.index, "question": j.question, "answer": j.answer} for j in package.jobs],
            "answer": package.answer,
        },
        domain=package.domain,
    )


async def handle(record: EnvPackage, ctx: Context) -> Sequence[Emit]:
    envs = ctx.settings.envs
    split = package_split(record, envs.heldout_k, envs.heldout_families_k, envs.heldout_families)
    await asyncio.to_thread(env_store_for(ctx.settings).record, record, split)
    if split == "heldout":
        return []
    sample = sample_of(record)
    return [Emit("samples.verified", sample.sample_id, sample, (ctx.source_key,))]


STAGE = StageDef(
    name="samples-verified",
    input="envs.verified",
    input_model=EnvPackage,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("samples.verified",),
    description="catalog every package with its split; publish the training split as qa samples",
    dedupe=True,
    effect="the env catalog (a held-out package is catalogued, not published)",
)

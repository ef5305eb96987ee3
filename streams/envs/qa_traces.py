"""Stage ``qa.seeds -> qa.traces`` (ASTRA §2.2.1): decomposed QA instances from a knowledge source.

Question-conditional seeds decompose their main question; unconditional
seeds generate ``count`` instances needing about H hops, cycling the four
dependency structures. A synthesis whose output stays invalid dead-letters
that one instance, not the seed's others.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.llm.core import InvalidOutput
from arena.records.envs import QaSeed
from streams.resources import gateway_for
from streams.runtime import Context, Emit, StageDef, llm_lineage
from synthesis.envs.qa_synthesis import synthesize

STAGE_VERSION = "1"


async def handle(record: QaSeed, ctx: Context) -> Sequence[Emit]:
    gw = gateway_for(ctx.settings)
    emits: list[Emit] = []
    for number, outcome in enumerate(await synthesize(record, gw, ctx.settings), start=1):
        if isinstance(outcome, InvalidOutput):
            emits.append(ctx.llm_dead_letter(outcome, f"QA instance {number} of {record.seed_id}"))
            continue
        trace, answer = outcome
        emits.append(Emit("qa.traces", trace.qa_id, trace, (ctx.source_key,), **llm_lineage([answer])))
    return emits


STAGE = StageDef(
    name="qa-traces",
    input="qa.seeds",
    input_model=QaSeed,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("qa.traces",),
    description="QA synthesis: (q0, a0) and sub-QAs whose dependencies form a DAG, in four structures",
    dedupe=True,
)

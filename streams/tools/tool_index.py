"""Tool index: embeds each normalised tool doc into LanceDB (``tools`` table).

Upserts are keyed by ``server_id/tool`` so a replay changes nothing. The stage is exactly-once
like the others: LanceDB is outside the transaction (a record handled again upserts the same rows),
its Kafka outputs (dead letters, its ``stages.ledger`` entries) commit with its offsets. A write
that lost a LanceDB commit race to another writer is tried again inside the upsert
(``lake.tool_index.LANCE_WRITES``); only an error LanceDB does not call retryable is dead-lettered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from arena.records.tools import ToolServer
from streams.resources import tool_index_for
from streams.runtime import Context, Emit, StageDef


async def handle(record: ToolServer, ctx: Context) -> Sequence[Emit]:
    index = await tool_index_for(ctx.settings)
    await asyncio.to_thread(index.upsert, record)
    return []


STAGE = StageDef(
    name="tool-index",
    input="tools.servers",
    input_model=ToolServer,
    version="1",
    handler=handle,
    description="embed normalised tool docs into the LanceDB `tools` table",
    effect="the LanceDB tools table",
)

"""Tool index: embeds each normalised tool doc into LanceDB (``tools`` table).

Upserts are keyed by ``server_id/tool`` so a replay changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from pydantic import BaseModel

from arena.config import ArenaSettings
from arena.records.tools import ToolServer
from lake.tool_index import ToolIndex
from streams.runtime import Context, Emit, StageDef

_indexes: dict[int, ToolIndex] = {}


def _index(settings: ArenaSettings) -> ToolIndex:
    """One index connection per settings object (one per worker process)."""
    if id(settings) not in _indexes:
        _indexes[id(settings)] = ToolIndex.from_settings(settings)
    return _indexes[id(settings)]


async def handle(record: BaseModel, ctx: Context) -> Sequence[Emit]:
    assert isinstance(record, ToolServer)
    index = _index(ctx.settings)
    await asyncio.to_thread(index.upsert, record)
    return []


STAGE = StageDef(
    name="tool-index",
    input="tools.servers",
    version="1",
    handler=handle,
    guarantee="at_least_once",
    description="embed normalised tool docs into the LanceDB `tools` table",
)

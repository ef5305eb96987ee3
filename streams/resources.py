"""Per-process resources stage handlers share: LLM gateway, chain-graph store, tool index.

Workers are one process per stage, so one instance per settings object is one
per worker; tests that run handlers in-process get their own per settings.
"""

from __future__ import annotations

from arena.config import ArenaSettings
from arena.llm.gateway import Gateway
from lake.chain_graphs import ChainGraphStore
from lake.tool_index import ToolIndex

_gateways: dict[int, Gateway] = {}
_graphs: dict[int, ChainGraphStore] = {}
_indexes: dict[int, ToolIndex] = {}


def gateway_for(settings: ArenaSettings) -> Gateway:
    if id(settings) not in _gateways:
        _gateways[id(settings)] = Gateway.from_settings(settings)
    return _gateways[id(settings)]


def chain_graphs_for(settings: ArenaSettings) -> ChainGraphStore:
    if id(settings) not in _graphs:
        _graphs[id(settings)] = ChainGraphStore(settings.catalog)
    return _graphs[id(settings)]


def tool_index_for(settings: ArenaSettings) -> ToolIndex:
    if id(settings) not in _indexes:
        _indexes[id(settings)] = ToolIndex.from_settings(settings)
    return _indexes[id(settings)]

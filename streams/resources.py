"""Per-process resources stage handlers share: the LLM gateway and the chain-graph store.

Workers are one process per stage, so one instance per settings object is one
per worker; tests that run handlers in-process get their own per settings.
"""

from __future__ import annotations

from arena.config import ArenaSettings
from arena.llm.gateway import Gateway
from lake.chain_graphs import ChainGraphStore

_gateways: dict[int, Gateway] = {}
_graphs: dict[int, ChainGraphStore] = {}


def gateway_for(settings: ArenaSettings) -> Gateway:
    if id(settings) not in _gateways:
        _gateways[id(settings)] = Gateway.from_settings(settings)
    return _gateways[id(settings)]


def chain_graphs_for(settings: ArenaSettings) -> ChainGraphStore:
    if id(settings) not in _graphs:
        _graphs[id(settings)] = ChainGraphStore(settings.catalog)
    return _graphs[id(settings)]

"""Per-process resources stage handlers share: LLM gateway, catalog stores, tool index, sandbox pool.

Workers are one process per stage, so one instance per settings object is one
per worker; tests that run handlers in-process get their own per settings.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from arena.config import ArenaSettings
from arena.llm.gateway import Gateway
from lake.catalog import open_gateway
from lake.eigen_catalog import EigenCatalog
from lake.env_packages import EnvPackageStore
from sandbox import SandboxPool
from sandbox.env_runtime import Runner
from synthesis.sft.chain_graph_store import ChainGraphStore

if TYPE_CHECKING:  # lancedb takes ~1.5 s to import; only the stages that use the index pay for it
    from lake.tool_index import ToolIndex


class SandboxService(Runner, Protocol):
    """A runner with a lifecycle: the warm ``SandboxPool``, or a benchmark's baseline."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


_owners: dict[int, ArenaSettings] = {}
"""Every settings object a resource was made for, kept alive: the caches below key by ``id(settings)``,
and a freed object's id can be reused by a new one, which would then get a stale store of another home."""
_gateways: dict[int, Gateway] = {}
_graphs: dict[int, ChainGraphStore] = {}
_indexes: dict[int, ToolIndex] = {}
_index_opens: dict[int, asyncio.Future[ToolIndex]] = {}
_env_stores: dict[int, EnvPackageStore] = {}
_eigen_stores: dict[int, EigenCatalog] = {}
_pools: dict[int, SandboxService] = {}
_pool_starts: dict[int, asyncio.Future[None]] = {}


def _key(settings: ArenaSettings) -> int:
    """``id(settings)``, with ``settings`` kept alive so the id stays its own."""
    _owners[id(settings)] = settings
    return id(settings)


def gateway_for(settings: ArenaSettings) -> Gateway:
    if _key(settings) not in _gateways:
        _gateways[id(settings)] = open_gateway(settings)
    return _gateways[id(settings)]


def open_gateway_of(settings: ArenaSettings) -> Gateway | None:
    """The gateway of ``settings`` if a handler opened one (stages without LLM calls have none)."""
    return _gateways.get(id(settings))


def chain_graphs_for(settings: ArenaSettings) -> ChainGraphStore:
    if _key(settings) not in _graphs:
        _graphs[id(settings)] = ChainGraphStore(settings.catalog)
    return _graphs[id(settings)]


async def tool_index_for(settings: ArenaSettings) -> ToolIndex:
    """The worker's tool index, opened once, in a thread: importing LanceDB and opening the table
    take seconds, which on the event loop would stall the worker's heartbeats and commits
    (concurrent callers share the opening)."""
    key = _key(settings)
    if key in _indexes:
        return _indexes[key]
    opening = _index_opens.get(key)
    if opening is None or opening.get_loop() is not asyncio.get_running_loop():
        opening = _index_opens[key] = asyncio.ensure_future(asyncio.to_thread(_open_tool_index, settings))
    try:
        index = await asyncio.shield(opening)
    except Exception:
        if opening.done() and _index_opens.get(key) is opening:
            del _index_opens[key]  # the next record tries again: a failed opening is not kept
        raise
    _indexes[key] = index
    return index


def _open_tool_index(settings: ArenaSettings) -> ToolIndex:
    from lake.tool_index import ToolIndex

    return ToolIndex.from_settings(settings)


def env_store_for(settings: ArenaSettings) -> EnvPackageStore:
    if _key(settings) not in _env_stores:
        _env_stores[id(settings)] = EnvPackageStore(settings.catalog)
    return _env_stores[id(settings)]


def eigen_store_for(settings: ArenaSettings) -> EigenCatalog:
    if _key(settings) not in _eigen_stores:
        _eigen_stores[id(settings)] = EigenCatalog(settings.catalog)
    return _eigen_stores[id(settings)]


async def sandbox_pool_for(settings: ArenaSettings) -> SandboxService:
    """The worker's warm sandbox pool, started once on first use (concurrent callers share the start)."""
    key = _key(settings)
    if key not in _pools:
        _pools[key] = SandboxPool(settings.sandbox)
        _pool_starts[key] = asyncio.ensure_future(_pools[key].start())
    await asyncio.shield(_pool_starts[key])
    return _pools[key]


def use_sandbox_pool(settings: ArenaSettings, pool: SandboxService) -> None:
    """Hand the stages run with ``settings`` an already-built pool (benchmarks compare pool kinds)."""
    _pools[_key(settings)] = pool
    _pool_starts[_key(settings)] = asyncio.ensure_future(pool.start())


async def close_sandbox_pool(settings: ArenaSettings) -> None:
    """Stop the pool of ``settings``, if one was started."""
    pool = _pools.pop(id(settings), None)
    _pool_starts.pop(id(settings), None)
    if pool is not None:
        await pool.close()

"""What flows between the EigenData stages, and what every stage loads to work on it.

Each of the six topics has its own value model (``arena.records.eigen``): the ``EigenItem``
envelope with ``payload`` typed as that topic's payload model, so the runtime validates the
payload on the way in and a payload that does not match is a schema violation of the stage that
reads it (dead-lettered as ``schema_violation``):

    eigen.seeds              EigenSeed       Scenario          which pack, which database, which scenario seed
    eigen.intents            EigenIntent     IntentPayload     RandomPool's draw + UserIntent's task
    eigen.tasks              EigenTask       TaskPayload       the task TaskValidation accepted (after Modify)
    eigen.dialogs            EigenDialog     DialogPayload     DialogSynthesis' dialogue
    eigen.dialogs.validated  EigenValidated  ValidatedPayload  the dialogue TrajectoryValidation passed
    eigen.verified           EigenVerified   VerifiedPayload   the instance with its verification function

Packs are loaded by content hash from the catalog (published by ``arena publish domain``),
prompt sets by id with their current parameters, databases regenerated from their seed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from arena.config import ArenaSettings
from arena.hashing import content_hash
from arena.records.eigen import (
    DialogPayload,
    EigenItem,
    IntentPayload,
    Scenario,
    TaskPayload,
    ValidatedPayload,
)
from lake.eigen_catalog import EigenCatalog, PromptSetRow
from synthesis.eigen.evolution import PromptSet
from synthesis.eigen.packs import DomainPack

ItemT = TypeVar("ItemT", bound=EigenItem[Any])


def make_item(
    model: type[ItemT], item: EigenItem[Any] | None, body: BaseModel, *, domain: str, prompt_set: str
) -> ItemT:
    """A new ``model`` item (a topic's value model) carrying ``body``.

    A seed is keyed by its content, any later item by its parent's key: each stage makes one
    item per input, and from the dialogue on the content carries the tools' timestamps and uuids,
    so a replayed input must get its item's key from the input, not the content: then the replay
    lands on the same key and downstream dedupe and the lake see one item. ``body`` must be the
    model's payload type (pydantic raises otherwise).
    """
    kind = model.kind
    identity: dict[str, Any] = (
        {"kind": kind, "parent": item.item_id}
        if item
        else {"kind": kind, "payload": body.model_dump(mode="json")}
    )
    return model(
        item_id=content_hash(identity, prefix=f"{kind}-", length=24),
        domain=domain,
        prompt_set=prompt_set,
        parent_id=item.item_id if item is not None else None,
        payload=body,
    )


# --------------------------------------------------------------------------- loading


class UnknownPack(LookupError):
    """An item names a pack that was never published to this catalog."""


def pack_id_of(pack: DomainPack) -> str:
    """A pack's content hash (its folder path does not count: the same pack published from anywhere)."""
    return content_hash(pack.model_dump(exclude={"path"}), prefix="pack-", length=20)


@functools.lru_cache(maxsize=32)
def _pack(catalog_url: str, pack_id: str) -> DomainPack:
    store = EigenCatalog(catalog_url)
    try:
        row = store.pack(pack_id)
    finally:
        store.dispose()
    if row is None:
        raise UnknownPack(f"domain pack {pack_id} is not in the catalog (fix: `arena publish domain PATH`)")
    return DomainPack.model_validate_json(row.pack)


async def load_pack(settings: ArenaSettings, pack_id: str) -> DomainPack:
    """The published pack ``pack_id`` (content-hashed, so cached for the process)."""
    return await asyncio.to_thread(_pack, settings.catalog, pack_id)


@functools.lru_cache(maxsize=64)
def _state(catalog_url: str, pack_id: str, seed: int, size: str) -> str:
    return json.dumps(_pack(catalog_url, pack_id).generate(seed, size))


async def load_state(settings: ArenaSettings, scenario: Scenario) -> dict[str, Any]:
    """The scenario's seeded database (generator.py is deterministic: regenerated, then cached)."""
    text = await asyncio.to_thread(
        _state, settings.catalog, scenario.pack_id, scenario.state_seed, scenario.size
    )
    state: dict[str, Any] = json.loads(text)
    return state


def _snapshot(row: PromptSetRow | None) -> PromptSet | None:
    """The set a catalog row stores, or None (no row, or none stored)."""
    if row is None or row.snapshot in ("", "{}"):
        return None
    return PromptSet.model_validate_json(row.snapshot)


async def load_prompt_set(store: EigenCatalog, set_id: str) -> tuple[PromptSet, int]:
    """The set's current snapshot and its phase (1 new, 2 pilot, 3 large-scale generation)."""
    row = await asyncio.to_thread(store.prompt_set, set_id)
    current = _snapshot(row)
    if row is None or current is None:
        raise LookupError(f"prompt set {set_id} is not in the catalog (fix: `arena publish domain PATH`)")
    return current, row.phase


async def generating_set(store: EigenCatalog, set_id: str) -> PromptSet | None:
    """The stored set when it is in phase 3 (large-scale generation), else None (it needs a pilot)."""
    row = await asyncio.to_thread(store.prompt_set, set_id)
    return _snapshot(row) if row is not None and row.phase == 3 else None


W = TypeVar("W", Scenario, IntentPayload, TaskPayload, DialogPayload, ValidatedPayload)


@dataclass(frozen=True)
class OpenItem(Generic[W]):
    """An item's payload and what a stage works on: its pack, its database, its prompt set."""

    body: W
    scenario: Scenario
    pack: DomainPack
    state: dict[str, Any]
    prompt_set: PromptSet
    phase: int


async def open_item(settings: ArenaSettings, store: EigenCatalog, item: EigenItem[W]) -> OpenItem[W]:
    """The item's payload (validated by the runtime) with its pack, database and prompt set."""
    body = item.payload
    scenario = body if isinstance(body, Scenario) else body.scenario
    pack = await load_pack(settings, scenario.pack_id)
    state = await load_state(settings, scenario)
    prompt_set, phase = await load_prompt_set(store, item.prompt_set)
    return OpenItem(body, scenario, pack, state, prompt_set, phase)


def lineage_of(prompt_set: PromptSet, roles: tuple[str, ...]) -> dict[str, str | None]:
    """Lineage fields for an output made with ``roles`` of ``prompt_set``."""
    versions = sorted(
        f"{r}={prompt_set.prompt_versions[r]}" for r in roles if r in prompt_set.prompt_versions
    )
    return {"prompt_version": ";".join(versions) or None}

"""What flows between the EigenData stages, and what every stage loads to work on it.

All six topics carry the one ``EigenItem`` envelope (``arena.records.eigen``); its ``payload`` is
one of the typed models below, validated on the way in by the stage that reads it:

    eigen.seeds              Scenario          which pack, which database, which scenario seed
    eigen.intents            IntentPayload     RandomPool's draw + UserIntent's task
    eigen.tasks              TaskPayload       the task TaskValidation accepted (after Modify)
    eigen.dialogs            DialogPayload     DialogSynthesis' dialogue
    eigen.dialogs.validated  ValidatedPayload  the dialogue TrajectoryValidation passed
    eigen.verified           VerifiedPayload   the instance with its verification function

A payload that does not validate is a schema violation of its stage (the runtime dead-letters
it). Packs are loaded by content hash from the catalog (published by ``arena publish domain``),
prompt sets by id with their current parameters, databases regenerated from their seed.
"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, Field

from arena.config import ArenaSettings
from arena.hashing import content_hash
from arena.llm.roles.eigen import PlanStep, PoolDraw, Repair, UserIntent
from arena.llm.roles.eigen_dialogs import TrajectoryVerdict
from arena.records.eigen import EigenItem
from lake.eigen_catalog import EigenCatalog, PromptSetRow
from streams.eigen.dialogs import Dialog, DialogVerdict
from streams.eigen.evolution import PromptSet
from streams.eigen.packs import DomainPack

P = TypeVar("P", bound=BaseModel)


class Scenario(BaseModel):
    """Where an item comes from; every payload carries it. The payload of ``eigen.seeds``."""

    pack_id: Annotated[str, Field(description="Content hash of the published domain pack.")]
    state_seed: Annotated[int, Field(ge=0, description="Seed of the instance's database (generator.py).")]
    size: Annotated[str, Field(description="Database size: small, medium or large.")]
    seed: Annotated[int, Field(ge=0, description="RandomPool's scenario seed.")]
    set_version: Annotated[int, Field(ge=1, description="Prompt-set parameter version that made it.")] = 1


class IntentPayload(BaseModel):
    """RandomPool + UserIntent output."""

    scenario: Scenario
    draw: Annotated[PoolDraw, Field(description="RandomPool's persona, context and difficulty factors.")]
    intent: Annotated[UserIntent, Field(description="UserIntent's task specification.")]


class TaskPayload(BaseModel):
    """A task TaskValidation found FEASIBLE (possibly after Modify rounds)."""

    scenario: Scenario
    intent: Annotated[UserIntent, Field(description="The task as finally validated.")]
    plan: Annotated[list[PlanStep], Field(description="The probe-backed plan of the FEASIBLE verdict.")]
    repair_rounds: Annotated[int, Field(ge=0, description="Modify rounds it needed (0: feasible as drawn).")]
    first_reasons: Annotated[
        list[str], Field(default_factory=list, description="Why the first verdict was INFEASIBLE, if it was.")
    ]
    repairs: Annotated[
        list[list[Repair]], Field(default_factory=list, description="Edits of each Modify round.")
    ]


class DialogPayload(BaseModel):
    """A synthesized dialogue for a validated task."""

    scenario: Scenario
    intent: UserIntent
    task_repair_rounds: Annotated[int, Field(ge=0, description="Modify rounds of the task stage.")] = 0
    dialog: Dialog


class ValidatedPayload(BaseModel):
    """A dialogue TrajectoryValidation passed (possibly after Modify rounds)."""

    scenario: Scenario
    intent: Annotated[UserIntent, Field(description="The task the passing dialogue was made for.")]
    dialog: Dialog
    verdict: Annotated[DialogVerdict, Field(description="The deterministic checks' verdict.")]
    judged: Annotated[TrajectoryVerdict, Field(description="The TrajectoryValidation role's verdict.")]
    repair_rounds: Annotated[int, Field(ge=0, description="Dialogue repair rounds it needed.")] = 0
    task_repair_rounds: Annotated[int, Field(ge=0, description="Modify rounds of the task stage.")] = 0


class VerifiedPayload(BaseModel):
    """A verified interactive instance: the ``InteractiveSpec`` dict plus where it went."""

    scenario: Scenario
    instance: Annotated[dict[str, Any], Field(description="InteractiveSpec fields + provenance.")]
    sample_id: Annotated[str, Field(description="Its samples.verified id (published or held out).")]
    split: Annotated[str, Field(description="'train' (published) or 'heldout' (arena eval only).")]
    verdict: Annotated[
        dict[str, Any],
        Field(description="The verifier's result on the dialogue's own final state (sandbox)."),
    ]


def payload(item: EigenItem, model: type[P]) -> P:
    """The item's payload as ``model`` (a ``ValidationError`` dead-letters the item)."""
    return model.model_validate(item.payload)


def make_item(
    kind: str, item: EigenItem | None, body: BaseModel, *, domain: str, prompt_set: str
) -> EigenItem:
    """A new item of stage ``kind``: a seed keyed by its content, any later item by its parent's key.

    Each stage makes one item per input, and from the dialogue on the content carries the tools'
    timestamps and uuids, so a replayed input must get its item's key from the input, not the
    content: then the replay lands on the same key and downstream dedupe and the lake see one item.
    """
    data = body.model_dump(mode="json")
    identity: dict[str, Any] = (
        {"kind": kind, "parent": item.item_id} if item else {"kind": kind, "payload": data}
    )
    return EigenItem(
        item_id=content_hash(identity, prefix=f"{kind}-", length=24),
        domain=domain,
        prompt_set=prompt_set,
        parent_id=item.item_id if item is not None else None,
        payload=data,
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


async def open_item(
    settings: ArenaSettings, store: EigenCatalog, item: EigenItem, model: type[W]
) -> OpenItem[W]:
    """Validate the item's payload as ``model`` and load its pack, database and prompt set."""
    body = payload(item, model)
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

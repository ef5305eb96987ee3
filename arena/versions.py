"""Data versions: names, where a version's records live, and what made them.

A data version is a named, immutable description of what produced a set of stage outputs (see
``VersionSpec``). The live pipeline is version ``main``: its records live on the registry's topics
(``arena.topics``). Every other version lives on its own copies of them, named
``version.<name>.<topic>``, written and read by its own consumer groups (``arena-<stage>@<name>``),
so a replay never touches ``main`` or another version, and every per-topic mechanism (the stage
dedupe on its input's keys, the lake sink's skip of keys it has, lineage keyed by topic) is
version-aware for free: a key is unique within a version.

``arena replay`` creates versions (``app.cli_versions``); the lake keeps them apart by folder
(``version=<name>/topic=<topic>/...``) and shows them as one ``version`` column.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from arena.hashing import content_hash

MAIN = "main"
"""The live pipeline's version: the registry's own topics."""

VERSION_HEADER = "arena-version"
"""Header naming the version that produced a record."""

INHERITED_HEADER = "arena-inherited-from"
"""Header of a record a version took over from its parent unchanged (``arena replay``'s copy)."""

_PREFIX = "version."
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")


class VersionNameError(ValueError):
    """A version name Arena cannot use (the message says why and what is allowed)."""


def check_name(name: str, *, new: bool = False) -> str:
    """``name`` when it can name a version; ``new``: it is being created (``main`` is taken)."""
    if not _NAME.match(name):
        raise VersionNameError(
            f"version name {name!r} is not allowed (fix: 1-40 characters of a-z, 0-9, '-' and '_', "
            "starting with a letter or digit)"
        )
    if new and name == MAIN:
        raise VersionNameError("version 'main' is the live pipeline (fix: name the new version otherwise)")
    return name


def wire(topic: str, version: str = MAIN) -> str:
    """The Kafka topic that holds registry topic ``topic`` in ``version``."""
    return topic if version == MAIN else f"{_PREFIX}{version}.{topic}"


def split_wire(name: str) -> tuple[str, str]:
    """(version, registry topic) of a Kafka topic name; the inverse of ``wire``."""
    if not name.startswith(_PREFIX):
        return MAIN, name
    version, _, base = name.removeprefix(_PREFIX).partition(".")
    return version, base


def worker_name(name: str, version: str = MAIN) -> str:
    """A worker's name in ``version`` (``tasks-from-chains@v2``; main's keep their plain names)."""
    return name if version == MAIN else f"{name}@{version}"


def split_worker(name: str) -> tuple[str, str]:
    """(worker name, version) of a versioned worker name; the inverse of ``worker_name``."""
    base, _, version = name.partition("@")
    return base, version or MAIN


class InputRange(BaseModel):
    """The records of one partition of the replayed stage's input that a version replays."""

    model_config = ConfigDict(frozen=True)

    partition: Annotated[int, Field(ge=0, description="Partition of the input topic.")]
    start: Annotated[int, Field(ge=0, description="First offset replayed.")]
    end: Annotated[int, Field(ge=0, description="Offset after the last one replayed.")]
    records: Annotated[int, Field(ge=0, description="Data records in [start, end) (markers not counted).")]
    from_lake: Annotated[
        int, Field(ge=0, description="Of those, how many were read from the lake (gone from the topic).")
    ] = 0


class VersionSpec(BaseModel):
    """What produced a version: the catalog's immutable record of it (``data_versions``)."""

    model_config = ConfigDict(frozen=True)

    name: Annotated[str, Field(description="The version's name (``arena replay --as``).")]
    parent: Annotated[str, Field(description="The version whose input it replayed (usually main).")]
    stage: Annotated[str, Field(description="The stage it re-ran.")]
    stages: Annotated[
        tuple[str, ...], Field(description="Every stage that runs in it: the stage and all downstream of it.")
    ]
    input_topic: Annotated[str, Field(description="The registry topic the stage reads.")]
    topics: Annotated[tuple[str, ...], Field(description="Registry topics the version has its own copy of.")]
    ranges: Annotated[tuple[InputRange, ...], Field(description="What it replayed, per input partition.")]
    inherited: Annotated[
        dict[str, int],
        Field(
            description="Records taken over unchanged from the parent, per topic: those written there "
            "by stages that do not run in the version (their inputs are upstream of the change)."
        ),
    ] = Field(default_factory=dict)
    settings: Annotated[
        dict[str, str], Field(description="Setting overrides (``--set KEY=VALUE``), as environment values.")
    ] = Field(default_factory=dict)
    prompts: Annotated[
        dict[str, str], Field(description="Prompt overrides per role: the full prompt text.")
    ] = Field(default_factory=dict)
    prompt_versions: Annotated[
        dict[str, str], Field(description="The overridden roles' prompt version ids (catalog).")
    ] = Field(default_factory=dict)
    llm: Annotated[str, Field(description="The LLM endpoint the version's stages use (secrets masked).")] = ""
    created_at: Annotated[datetime | None, Field(description="When ``arena replay`` made it (UTC).")] = None

    @property
    def config_hash(self) -> str:
        """Hash of everything that changes the version's outputs (not its name or when it was made)."""
        return content_hash(
            {
                "parent": self.parent,
                "stage": self.stage,
                "ranges": [r.model_dump() for r in self.ranges],
                "settings": self.settings,
                "prompt_versions": self.prompt_versions,
                "llm": self.llm,
            },
            prefix="vcfg-",
            length=20,
        )

    @property
    def records(self) -> int:
        return sum(r.records for r in self.ranges)

    def workers(self) -> list[str]:
        """The worker names that run the version: its stages, then its lake sink."""
        return [worker_name(stage, self.name) for stage in (*self.stages, "lake-sink")]

"""Verified environment packages and their split, in the catalog database.

The ``samples-verified`` stage records every package of ``envs.verified`` here
with its split (``package_split``: content hash mod k, and optionally whole tool
families held out): ``arena env show/verify`` read packages
back by id, and held-out packages, which never reach ``samples.verified``, are
listed from here for evaluation. One row per ``env_id``; recording a package
twice changes nothing (the stage may replay after a crash).

Synchronous (SQLAlchemy): stages call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Literal

from sqlalchemy import Text
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, col, func, select

from arena.hashing import content_hash
from arena.records.envs import EnvPackage, tool_family
from arena.records.tools import tool_name
from lake.catalog import _make_engine, create_tables, insert_ignore

Split = Literal["train", "heldout"]


def split_of(env_id: str, k: int) -> Split:
    """Deterministic split: the package's content hash mod k; bucket 0 is held out."""
    bucket = int(content_hash(env_id, length=16), 16) % k
    return "heldout" if bucket == 0 else "train"


def held_out_family(family: str, k: int) -> bool:
    """Whether a tool family is held out: its hash mod k is 0 (never, when k is 0)."""
    return k > 0 and int(content_hash(family, length=16), 16) % k == 0


def package_split(
    package: EnvPackage, heldout_k: int, heldout_families_k: int = 0, heldout_families: Collection[str] = ()
) -> Split:
    """A package's split. Held out when its hash falls in bucket 0 of ``heldout_k`` (new questions
    and data for tools trained on), or when it calls a tool of a held-out family, so no tool of
    that family ever reaches training: one whose hash is 0 mod ``heldout_families_k`` (0 holds
    none out), or one named in ``heldout_families`` (a ``_2`` suffix there is ignored too)."""
    named = {tool_family(f) for f in heldout_families}
    families = {tool_family(tool_name(t)) for t in package.tools}
    if families & named or any(held_out_family(f, heldout_families_k) for f in families):
        return "heldout"
    return split_of(package.env_id, heldout_k)


class EnvPackageRow(SQLModel, table=True):
    """One verified environment package."""

    __tablename__ = "env_packages"

    env_id: str = Field(primary_key=True, description="Content hash of the package.")
    qa_id: str = Field(index=True, description="QA instance it implements.")
    domain: str = Field(index=True, description="Domain.")
    structure: str = Field(description="single_hop, parallel_single_hop, multi_hop or parallel_multi_hop.")
    version: int = Field(description="Package version (2 once merged).")
    split: str = Field(index=True, description="train or heldout.")
    tools: int = Field(description="Tools in the package.")
    jobs: int = Field(description="Verifiable jobs in the package.")
    package: str = Field(sa_type=Text, description="The EnvPackage as JSON.")
    recorded_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


_TABLES = [EnvPackageRow.__table__]  # type: ignore[attr-defined]


class EnvPackageStore:
    """Records and loads verified packages."""

    def __init__(self, catalog: str | Engine) -> None:
        self.engine = catalog if isinstance(catalog, Engine) else _make_engine(catalog)
        create_tables(self.engine, _TABLES)

    def dispose(self) -> None:
        self.engine.dispose()

    def record(self, package: EnvPackage, split: Split) -> bool:
        """Store ``package`` with its split; False when it was already there (idempotent)."""
        row = {
            "env_id": package.env_id,
            "qa_id": package.qa_id,
            "domain": package.domain,
            "structure": package.structure,
            "version": package.version,
            "split": split,
            "tools": len(package.tools),
            "jobs": len(package.jobs),
            "package": package.model_dump_json(),
            "recorded_at": datetime.now(UTC),
        }
        table = EnvPackageRow.__table__  # type: ignore[attr-defined]
        return insert_ignore(self.engine, table, [row], ["env_id"]) == 1

    def get(self, env_id: str) -> tuple[EnvPackage, Split] | None:
        with Session(self.engine) as session:
            row = session.get(EnvPackageRow, env_id)
        if row is None:
            return None
        split: Split = "heldout" if row.split == "heldout" else "train"
        return EnvPackage.model_validate_json(row.package), split

    def count(self, split: Split | None = None) -> int:
        """How many packages are recorded (cheap: the trainer polls it to refresh its tool pool)."""
        query = select(func.count()).select_from(EnvPackageRow)
        if split is not None:
            query = query.where(EnvPackageRow.split == split)
        with Session(self.engine) as session:
            return int(session.exec(query).one())

    def rows(self, split: Split | None = None) -> list[EnvPackageRow]:
        """Every recorded package (without loading the JSON into models), newest last."""
        query = select(EnvPackageRow).order_by(col(EnvPackageRow.recorded_at))
        if split is not None:
            query = query.where(EnvPackageRow.split == split)
        with Session(self.engine) as session:
            return list(session.exec(query))

"""Persistent per-server transition graphs (ASTRA §2.1.2), in the catalog database.

The ``chains`` stage adds every synthesised chain here and walks the graph it
loads back, so a server's graph keeps growing across records (re-published
docs, new syntheses) and across worker restarts. One row per chain position,
``(server_name, chain_id, position, tool)``, unique on the first three, so
adding a chain twice changes nothing; edges and weights are derived on load by
``TransitionGraph``.

Graphs are keyed by server *name*, not by server id (a content hash of the
tools): a re-published, changed server keeps its history, and ``load`` restricts
the vertex set to the tools the server has now, ignoring edges to tools it lost.

Synchronous (SQLAlchemy): stages call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Text, UniqueConstraint, func
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlmodel import Field, Session, SQLModel, col, select

from lake.catalog import _make_engine
from streams.sft.chain_graph import TransitionGraph


class ChainGraphStep(SQLModel, table=True):
    """Tool ``tool`` at ``position`` of chain ``chain_id`` of server ``server_name``."""

    __tablename__ = "chain_graph_steps"
    __table_args__ = (UniqueConstraint("server_name", "chain_id", "position", name="uq_chain_graph_step"),)

    id: int | None = Field(default=None, primary_key=True)
    server_name: str = Field(index=True, description="Server name (graphs survive tool changes).")
    chain_id: str = Field(description="Chain key (content hash of server id + tools).")
    position: int = Field(description="0-based position of the tool in the chain.")
    tool: str = Field(sa_type=Text, description="Tool name at that position.")


_TABLES = [ChainGraphStep.__table__]  # type: ignore[attr-defined]


class ChainGraphStore:
    """Adds chains to, and loads, the transition graph of a server."""

    def __init__(self, catalog: str | Engine) -> None:
        """``catalog``: the catalog's SQLAlchemy URL (same database, own table) or an engine."""
        self.engine = catalog if isinstance(catalog, Engine) else _make_engine(catalog)
        self._dialect = self.engine.dialect.name
        try:
            SQLModel.metadata.create_all(self.engine, tables=_TABLES)
        except (IntegrityError, ProgrammingError, OperationalError):
            # Two workers creating the table at once: the loser retries and finds it.
            SQLModel.metadata.create_all(self.engine, tables=_TABLES)

    def dispose(self) -> None:
        self.engine.dispose()

    def add(self, server_key: str, chain_id: str, tools: Sequence[str]) -> bool:
        """Record ``chain_id`` for ``server_key``; False when it was already there (idempotent)."""
        rows = [
            {"server_name": server_key, "chain_id": chain_id, "position": i, "tool": tool}
            for i, tool in enumerate(tools)
        ]
        return bool(rows) and self._insert_ignore(rows) > 0

    def _insert_ignore(self, rows: list[dict[str, Any]]) -> int:
        table = ChainGraphStep.__table__  # type: ignore[attr-defined]
        conflict = ["server_name", "chain_id", "position"]
        added = 0
        if self._dialect in ("sqlite", "postgresql"):
            mod = sqlite if self._dialect == "sqlite" else postgresql
            with self.engine.begin() as conn:  # a chain is written whole or not at all
                for row in rows:
                    stmt = mod.insert(table).values(**row).on_conflict_do_nothing(index_elements=conflict)
                    added += conn.execute(stmt).rowcount or 0
            return added
        try:  # other dialects: all or nothing, a duplicate chain rejects the batch
            with self.engine.begin() as conn:
                conn.execute(table.insert(), rows)
            return len(rows)
        except IntegrityError:
            return 0

    def chains(self, server_key: str) -> dict[str, list[str]]:
        """Every stored chain of ``server_key``: chain id -> tools in order."""
        stmt = (
            select(ChainGraphStep)
            .where(ChainGraphStep.server_name == server_key)
            .order_by(col(ChainGraphStep.chain_id), col(ChainGraphStep.position))
        )
        out: dict[str, list[str]] = {}
        with Session(self.engine) as session:
            for step in session.exec(stmt):
                out.setdefault(step.chain_id, []).append(step.tool)
        return out

    def load(self, server_key: str, tools: Iterable[str] | None = None) -> TransitionGraph:
        """The graph of ``server_key``; with ``tools``, restricted to those nodes."""
        graph = TransitionGraph(tools)
        for chain_id, chain in self.chains(server_key).items():
            graph.add_chain(chain_id, chain)
        return graph

    def chain_count(self, server_key: str) -> int:
        stmt = select(func.count(func.distinct(ChainGraphStep.chain_id))).where(
            ChainGraphStep.server_name == server_key
        )
        with Session(self.engine) as session:
            return int(session.exec(stmt).one())

"""Persistent per-server transition graphs (ASTRA §2.1.2), in the catalog database.

The ``chains`` stage adds every synthesised chain here and walks the graph it
loads back, so a server's graph keeps growing across records (re-published
docs, new syntheses) and across worker restarts. One row per chain position,
``(server_name, chain_id, position, tool, recorded_at)``, unique on the first three, so
adding a chain twice changes nothing (the first recording time stays); edges and weights are
derived on load by ``TransitionGraph``.

A record sees the history that existed before it was published (``load(before=...)``): the
chains of versions handled earlier, never those of versions handled beside it. So a record
handled again (after a crash, a rebalance, a replay) walks the same graph, however far the
other records got.

Graphs are keyed by server *name*, not by server id (a content hash of the
tools): a re-published, changed server keeps its history, and ``load`` restricts
the vertex set to the tools the server has now, ignoring edges to tools it lost.

Synchronous (SQLAlchemy): stages call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from sqlalchemy import DateTime, Text, UniqueConstraint, func, inspect, or_, text
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, col, select

from lake.catalog import _make_engine, create_tables, insert_ignore
from synthesis.sft.chain_graph import TransitionGraph


class ChainGraphStep(SQLModel, table=True):
    """Tool ``tool`` at ``position`` of chain ``chain_id`` of server ``server_name``."""

    __tablename__ = "chain_graph_steps"
    __table_args__ = (UniqueConstraint("server_name", "chain_id", "position", name="uq_chain_graph_step"),)

    id: int | None = Field(default=None, primary_key=True)
    server_name: str = Field(index=True, description="Server name (graphs survive tool changes).")
    chain_id: str = Field(description="Chain key (content hash of server id + tools).")
    position: int = Field(description="0-based position of the tool in the chain.")
    tool: str = Field(sa_type=Text, description="Tool name at that position.")
    recorded_at: datetime | None = Field(
        default=None,
        sa_type=DateTime(timezone=True),
        description="When the chain was first recorded (UTC); None for rows of older catalogs.",
    )


_TABLES = [ChainGraphStep.__table__]  # type: ignore[attr-defined]


class ChainGraphStore:
    """Adds chains to, and loads, the transition graph of a server."""

    def __init__(self, catalog: str | Engine) -> None:
        """``catalog``: the catalog's SQLAlchemy URL (same database, own table) or an engine."""
        self.engine = catalog if isinstance(catalog, Engine) else _make_engine(catalog)
        create_tables(self.engine, _TABLES)
        self._add_recorded_at()

    def _add_recorded_at(self) -> None:
        """Catalogs from before ``recorded_at`` get the column (their rows count as old history)."""
        columns = {c["name"] for c in inspect(self.engine).get_columns(ChainGraphStep.__tablename__)}
        if "recorded_at" not in columns:
            with self.engine.begin() as conn:
                conn.execute(text("ALTER TABLE chain_graph_steps ADD COLUMN recorded_at TIMESTAMP"))

    def dispose(self) -> None:
        self.engine.dispose()

    def add(self, server_key: str, chain_id: str, tools: Sequence[str]) -> bool:
        """Record ``chain_id`` for ``server_key``; False when it was already there (idempotent)."""
        now = datetime.now(UTC)
        rows = [
            {"server_name": server_key, "chain_id": chain_id, "position": i, "tool": tool, "recorded_at": now}
            for i, tool in enumerate(tools)
        ]
        table = ChainGraphStep.__table__  # type: ignore[attr-defined]
        conflict = ["server_name", "chain_id", "position"]
        # atomic: a chain is written whole or not at all
        return insert_ignore(self.engine, table, rows, conflict, atomic=True) > 0

    def chains(self, server_key: str, before: datetime | None = None) -> dict[str, list[str]]:
        """Every stored chain of ``server_key`` (with ``before``: first recorded before it): id -> tools."""
        stmt = select(ChainGraphStep).where(ChainGraphStep.server_name == server_key)
        if before is not None:
            recorded = col(ChainGraphStep.recorded_at)
            stmt = stmt.where(or_(recorded.is_(None), recorded < before))
        stmt = stmt.order_by(col(ChainGraphStep.chain_id), col(ChainGraphStep.position))
        out: dict[str, list[str]] = {}
        with Session(self.engine) as session:
            for step in session.exec(stmt):
                out.setdefault(step.chain_id, []).append(step.tool)
        return out

    def load(
        self, server_key: str, tools: Iterable[str] | None = None, before: datetime | None = None
    ) -> TransitionGraph:
        """The graph of ``server_key``; with ``tools``, restricted to those nodes; with ``before``,
        of the chains first recorded before that time."""
        graph = TransitionGraph(tools)
        for chain_id, chain in self.chains(server_key, before).items():
            graph.add_chain(chain_id, chain)
        return graph

    def chain_count(self, server_key: str) -> int:
        stmt = select(func.count(func.distinct(ChainGraphStep.chain_id))).where(
            ChainGraphStep.server_name == server_key
        )
        with Session(self.engine) as session:
            return int(session.exec(stmt).one())

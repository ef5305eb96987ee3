"""Data versions without a broker: names, topic and lake layout, the catalog record, the diff's
statistics, prompt overrides and the replay plan's stage graph (``arena.versions``, ``app.replay``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from app.cli_common import UserError
from app.replay import downstream, inherited_topics, parse_settings, version_topics
from arena.llm.core import PromptError, with_prompt
from arena.llm.roles.registry import roles
from arena.records.sft import Task
from arena.versions import (
    MAIN,
    InputRange,
    VersionNameError,
    VersionSpec,
    check_name,
    split_wire,
    split_worker,
    wire,
    worker_name,
)
from consumers.version_diff import _identity, mean_interval
from lake.catalog import Catalog
from lake.parquet import LakeRow, LakeWriter, read_topic, row_value, topic_prefix
from lake.query import LakeQuery
from lake.store import LocalStore


def test_main_lives_on_the_registry_topics_and_a_version_on_its_own_copies() -> None:
    assert wire("tasks") == "tasks"
    assert wire("tasks.rejected", "v2") == "version.v2.tasks.rejected"
    assert split_wire("version.v2.tasks.rejected") == ("v2", "tasks.rejected")
    assert split_wire("samples.sft") == (MAIN, "samples.sft")
    assert worker_name("trajectories", "v2") == "trajectories@v2"
    assert worker_name("trajectories") == "trajectories"
    assert split_worker("trajectories@v2") == ("trajectories", "v2")
    assert split_worker("lake-sink") == ("lake-sink", MAIN)


@pytest.mark.parametrize("bad", ["", "V2", "a.b", "-x", "x" * 41, "a b", "v2@x"])
def test_a_version_name_is_short_lowercase_and_dotless(bad: str) -> None:
    with pytest.raises(VersionNameError, match="fix:"):
        check_name(bad)


def test_main_cannot_be_made_again() -> None:
    assert check_name("main") == "main"
    with pytest.raises(VersionNameError, match="live pipeline"):
        check_name("main", new=True)


def test_a_replay_of_tasks_from_chains_runs_it_and_everything_downstream_only() -> None:
    stages = downstream("tasks-from-chains")
    assert stages == ("tasks-from-chains", "trajectories", "trajectories-scored", "samples-sft")
    topics = version_topics(stages)
    assert {"chains", "tasks", "trajectories", "samples.sft", "stages.ledger", "llm.usage"} <= set(topics)
    assert "chains.dlq" in topics  # the replayed stage's dead letters stay in the version
    assert "tools.servers" not in topics and "qa.seeds" not in topics
    # tasks-from-servers writes tasks too and does not run: its tasks are inherited
    assert inherited_topics(stages, "chains") == ("tasks",)


def _spec(name: str, topics: tuple[str, ...], ranges: tuple[InputRange, ...]) -> VersionSpec:
    """A version of tasks-from-chains alone, replaying ``ranges`` of chains."""
    return VersionSpec(
        name=name,
        parent=MAIN,
        stage="tasks-from-chains",
        stages=("tasks-from-chains",),
        input_topic="chains",
        topics=topics,
        ranges=ranges,
    )


def test_the_config_hash_ignores_the_name_and_changes_with_any_override() -> None:
    base = _spec("a", ("chains",), (InputRange(partition=0, start=0, end=3, records=3),))
    assert base.model_copy(update={"name": "b"}).config_hash == base.config_hash
    changed = base.model_copy(update={"settings": {"ARENA_SFT__THETA_QUESTION_QUALITY": "0.9"}})
    assert changed.config_hash != base.config_hash
    assert base.workers() == ["tasks-from-chains@a", "lake-sink@a"]


def test_mean_interval_matches_a_hand_computed_t_interval() -> None:
    # values 0.5, 0.7, 0.9: mean 0.7, s = 0.2, t(0.975, 2) = 4.303, half width 4.303 * 0.2 / sqrt 3
    found = mean_interval([0.5, 0.7, 0.9])
    half = 4.303 * 0.2 / math.sqrt(3)
    assert found.n == 3 and found.mean == pytest.approx(0.7)
    assert found.low == pytest.approx(0.7 - half) and found.high == pytest.approx(0.7 + half)
    assert mean_interval([0.4]).low is None and mean_interval([]).mean is None
    # beyond 30 degrees of freedom: the normal quantile
    many = mean_interval([0.0, 1.0] * 20)
    assert many.high - many.mean == pytest.approx(1.96 * math.sqrt(40 / 39 * 0.25) / math.sqrt(40))


def test_outputs_that_differ_only_in_measured_latency_are_the_same_output() -> None:
    a = {"_key": "t1", "call_status": json.dumps([{"tool": "x", "latency_ms": 1.5, "ok": True}])}
    b = {"_key": "t1", "call_status": json.dumps([{"tool": "x", "latency_ms": 900.0, "ok": True}])}
    c = {"_key": "t1", "call_status": json.dumps([{"tool": "x", "latency_ms": 1.5, "ok": False}])}
    assert _identity(a) == _identity(b) != _identity(c)


def test_a_prompt_file_replaces_a_role_prompt_and_the_unchanged_text_is_the_same_version() -> None:
    role = roles()["augment_task"]
    same = with_prompt(role, role.prompt_text + "\n")
    assert same.version == role.version
    system_only = with_prompt(role, "Rewrite the task more politely.")
    assert system_only.system == "Rewrite the task more politely." and system_only.template == role.template
    assert system_only.version != role.version
    with pytest.raises(PromptError, match="no \\{input\\}"):
        with_prompt(role, "system\n---\nno placeholder here")


def test_an_agent_role_prompt_cannot_be_replaced_by_a_file() -> None:
    agent = next(r for r in roles().values() if r.agent is not None)
    with pytest.raises(PromptError, match="chat API natively"):
        with_prompt(agent, "x")


def test_set_overrides_are_checked_against_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_settings(["sft.theta_question_quality=0.9"]) == {"ARENA_SFT__THETA_QUESTION_QUALITY": "0.9"}
    with pytest.raises(UserError, match="no such setting"):
        parse_settings(["sft.theta_question=0.9"])
    with pytest.raises(UserError, match="fix:"):
        parse_settings(["sft.theta_question_quality=7"])  # out of range
    with pytest.raises(UserError, match="same stack"):
        parse_settings(["lake_url=/elsewhere"])
    with pytest.raises(UserError, match="KEY=VALUE"):
        parse_settings(["sft.walks"])


def _task(text: str) -> Task:
    from arena.records.sft import ServerRef

    server = ServerRef(server_id="srv", name="srv", domain="d", tools=[])
    return Task(task_id=f"task-{text}", server=server, text=text, language="en", mode="server")


def _rows(topic: str, tasks: list[Task]) -> list[LakeRow]:
    return [
        LakeRow(
            key=t.task_id,
            topic=topic,
            partition=0,
            offset=i,
            timestamp_ms=1_700_000_000_000,
            headers={"arena-stage": "tasks-from-chains", "arena-version": split_wire(topic)[0]},
            value=t.model_dump_json().encode(),
        )
        for i, t in enumerate(tasks)
    ]


def test_a_version_writes_its_own_lake_folder_and_main_files_stay_as_they_were(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    writer = LakeWriter(store)
    writer.write("tasks", _rows("tasks", [_task("a"), _task("b")]))
    before = {p: store.get(p) for p in store.list("")}
    # the same keys in a version are new there: a key is unique within a version
    result = writer.write(wire("tasks", "v2"), _rows(wire("tasks", "v2"), [_task("a"), _task("c")]))
    assert result.written == 2 and result.skipped_duplicates == 0
    assert {p: store.get(p) for p in before} == before
    assert all(p.startswith("version=v2/topic=tasks/") for p in set(store.list("")) - set(before))
    assert topic_prefix(wire("tasks", "v2")) == "version=v2/topic=tasks/"
    assert [r["_key"] for r in read_topic(store, "tasks").to_pylist()] == ["task-a", "task-b"]

    table = LakeQuery(store).query("select _version, version, _key from tasks order by 1, 3")
    assert table.to_pylist() == [
        {"_version": "main", "version": "main", "_key": "task-a"},
        {"_version": "main", "version": "main", "_key": "task-b"},
        {"_version": "v2", "version": "v2", "_key": "task-a"},
        {"_version": "v2", "version": "v2", "_key": "task-c"},
    ]
    # a table whose records have a version field of their own keeps it; _version is the data version
    envs = LakeQuery(store).query("select * from envs_verified").column_names
    assert "_version" in envs and envs.count("version") == 1


def test_a_lake_row_gives_back_the_record_it_was_made_from(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    task = _task("round trip").model_copy(update={"chain": ["a", "b"], "persona": "a pilot"})
    LakeWriter(store).write("tasks", _rows("tasks", [task]))
    row = read_topic(store, "tasks").to_pylist()[0]
    assert row_value("tasks", row) == task.model_dump_json().encode()


def test_the_catalog_records_a_version_once_and_drops_only_its_rows(tmp_path: Path) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    spec = _spec("v2", ("chains", "tasks"), ())
    assert catalog.record_version(spec) and not catalog.record_version(spec)
    assert catalog.data_version("v2") == spec and [s.name for s in catalog.data_versions()] == ["v2"]
    for topic in ("tasks", wire("tasks", "v2"), wire("tasks", "v22")):
        catalog.record_artifact(
            topic=topic, path=f"{topic}/x.parquet", rows=1, nbytes=1, partition=0, min_offset=0, max_offset=0
        )
    dropped = catalog.drop_version("v2")
    assert dropped == {"artifacts": 1, "lineage_edges": 0, "data_versions": 1}
    assert sorted(a.topic for a in catalog.artifacts()) == ["tasks", wire("tasks", "v22")]
    with pytest.raises(ValueError):
        catalog.drop_version(MAIN)


def test_eval_names_the_data_version_the_newest_start_of_a_run_trained_on(tmp_path: Path) -> None:
    from app.cli import _trained_on
    from arena.config import ArenaSettings

    cfg = ArenaSettings(home=tmp_path, catalog_url=f"sqlite:///{tmp_path / 'catalog.db'}")
    catalog = Catalog(cfg.catalog)
    assert _trained_on(cfg, "r") == "main"  # no start recorded: a run of main
    catalog.start_run("train", "r", {"data_version": "main"})
    catalog.start_run("train", "other", {"data_version": "v9"})
    catalog.start_run("train", "r", {"data_version": "v2"})
    assert _trained_on(cfg, "r") == "v2" and _trained_on(cfg, "other") == "v9"

"""Versioned re-synthesis end to end on the SFT demo: `arena replay`, `arena worker`, `arena diff`,
`arena train --version`, `arena data-versions drop`, against a real broker, lake and catalog.

One home per module (the SFT track of `arena demo`, reduced): a replay adds versions to it, which
the shared demo's readers (``tests/fixtures/demo.py``) must not see.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.stack import descendants_of
from arena.versions import wire
from consumers.version_diff import _identity
from lake.parquet import read_topic
from lake.store import LocalStore
from tests.cli import ARENA, arena_env, broker_of, committed, read_all, run_arena

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

OUTPUT_TOPICS = ("tasks", "trajectories", "trajectories.scored", "samples.sft")
"""What tasks-from-chains and the stages downstream of it write."""
REPLAYED = ("tasks-from-chains", "trajectories", "trajectories-scored", "samples-sft")


@dataclass
class Home:
    path: Path
    env: dict[str, str]
    bootstrap: str

    @property
    def lake(self) -> LocalStore:
        return LocalStore(self.path / "lake")

    def rows(self, topic: str, version: str = "main") -> list[dict[str, Any]]:
        return [r for r in read_topic(self.lake, wire(topic, version)).to_pylist() if r["_valid"]]


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    path = tmp_path_factory.mktemp("replay") / "home"
    # One augmentation axis of three: every task stage still augments and scores (the replay's
    # edited augment prompt and stricter gate act on it), at half the tasks, trajectories and scores.
    env = arena_env(
        path,
        ARENA_SFT__WALKS="1",
        ARENA_SFT__SERVER_TASKS="1",
        ARENA_SFT__CHAIN_SYNTHESES="2",
        ARENA_SFT__AUGMENT_AXES='["diversity"]',
    )
    try:
        run_arena(["demo", "--tracks", "sft", "--timeout", "600"], env, timeout=900)
        yield Home(path, env, broker_of(path))
    finally:
        run_arena(["down"], env, check=None)


def _main_files(home: Home) -> dict[str, str]:
    """Every file of main's lake folders, by content hash."""
    root = home.path / "lake"
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.glob("topic=*/**/*.parquet"))
    }


def _drain(home: Home, version: str, timeout: int = 600) -> str:
    out = run_arena(
        ["worker", "--version", version, "--until-drained", "--timeout", str(timeout)],
        home.env,
        timeout=timeout + 120,
    )
    return out.stderr


def _contents(home: Home, version: str) -> dict[str, set[str]]:
    """Per output topic, each record's key and content (measurements aside)."""
    return {t: {_identity(r) for r in home.rows(t, version)} for t in OUTPUT_TOPICS}


def test_a_replay_with_a_new_prompt_and_gate_runs_only_downstream_into_its_own_version(
    home: Home, tmp_path: Path
) -> None:
    before = _main_files(home)
    usage_before = len(home.rows("llm.usage"))
    prompt = run_arena(["llm", "prompt", "augment_task"], home.env).stdout.rstrip("\n")
    edited = tmp_path / "augment.txt"
    edited.write_text("Keep every variant short and concrete.\n" + prompt + "\n")

    v2 = ["replay", "tasks-from-chains", "--as", "v2", "--all", "--set", "sft.theta_question_quality=0.9"]
    v2 += ["--prompt", f"augment_task={edited}"]
    dry = run_arena([*v2, "--dry-run"], home.env).stdout
    assert "would replay" in dry and "estimated LLM use:" in dry and "calls" in dry
    assert "inherited unchanged from main" in dry
    run_arena(["data-versions", "show", "v2"], home.env, check=2)  # a dry run makes nothing

    run_arena(v2, home.env)
    _drain(home, "v2")

    assert _main_files(home) == before, "a replay changed main's lake files"
    assert len(home.rows("llm.usage")) == usage_before, "main's stages made calls during the replay"
    stages = {r["stage"] for r in home.rows("llm.usage", "v2")}
    assert stages and stages <= set(REPLAYED), stages  # nothing upstream of tasks ran
    for topic in OUTPUT_TOPICS:
        assert home.rows(topic, "v2"), f"v2 has no {topic}"
    versions = {json.loads(r["_headers"]).get("arena-prompt-version", "") for r in home.rows("tasks", "v2")}
    spec = json.loads(run_arena(["data-versions", "show", "v2"], home.env).stdout)
    assert any(spec["prompt_versions"]["augment_task"] in v for v in versions)
    assert spec["settings"] == {"ARENA_SFT__THETA_QUESTION_QUALITY": "0.9"}

    diff = json.loads(run_arena(["diff", "main", "v2", "--json"], home.env).stdout)
    by_stage = {s["stage"]: s for s in diff["stages"]}
    assert list(by_stage) == list(REPLAYED)
    chains = by_stage["tasks-from-chains"]
    assert chains["a"]["records_in"] == chains["b"]["records_in"] > 0
    assert chains["b"]["rejections_by_gate"].get("task_score", 0) > chains["a"]["rejections_by_gate"].get(
        "task_score", 0
    )
    scored = by_stage["trajectories-scored"]["b"]["scores"]
    assert {"QU", "QP", "TCU", "TCP", "TCS", "TC", "FA", "overall"} <= set(scored)
    overall = scored["overall"]
    assert overall["low"] <= overall["mean"] <= overall["high"] and overall["n"] == len(
        home.rows("trajectories.scored", "v2")
    )
    table = run_arena(["diff", "main", "v2", "--stage", "tasks-from-chains"], home.env).stdout
    assert "rejected: task_score" in table and "upstream records" in table

    exported = tmp_path / "v2.jsonl"
    run_arena(["export", "sft", str(exported), "--version", "v2"], home.env)
    assert len(exported.read_text().splitlines()) == len(
        {r["sample_id"] for r in home.rows("samples.sft", "v2")}
    )


def test_a_replay_without_overrides_killed_mid_run_reproduces_main_exactly_once(home: Home) -> None:
    """No override: the same outputs as main, record for record, though its workers were killed -9
    mid-run (no duplicate and no gap within the version: the census per version)."""
    run_arena(["replay", "tasks-from-chains", "--as", "v3", "--all"], home.env)
    sup = subprocess.Popen(
        [ARENA, "worker", "--version", "v3", "--until-drained", "--timeout", "600"],
        env=home.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while sum(committed(home.bootstrap, "arena-trajectories@v3").values()) < 3:
            assert time.monotonic() < deadline, "the replay's trajectories stage never committed"
            time.sleep(0.1)
        victims = [pid for pid, cmd in descendants_of(sup.pid).items() if "app.run" in cmd]
        assert victims
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        _, err = sup.communicate(timeout=900)
    finally:
        if sup.poll() is None:
            sup.kill()
    assert sup.returncode == 0, err[-3000:]
    assert "restarting" in err
    for topic in OUTPUT_TOPICS:
        records = read_all(home.bootstrap, wire(topic, "v3"))
        keys = [r.key for r in records]
        assert len(keys) == len(set(keys)), f"duplicates in v3's {topic}"
    assert _contents(home, "v3") == _contents(home, "main")  # nothing lost, nothing changed
    diff = json.loads(run_arena(["diff", "main", "v3", "--json"], home.env).stdout)
    for stage in diff["stages"]:
        assert stage["only_a"] == stage["only_b"] == 0 and stage["identical"] == stage["both"], stage["stage"]


def test_training_on_a_version_consumes_only_its_samples(home: Home) -> None:
    small = home.env | {"ARENA_TRAIN__SFT_BATCH": "2"}  # which samples, not how many: 2 CPU-s each
    out = run_arena(
        ["train", "--version", "v2", "--tiny", "--steps", "3", "--run", "on-v2"], small, timeout=900
    )
    assert "step" in out.stdout
    with sqlite3.connect(home.path / "catalog.db") as db:
        trained = {
            k for (k,) in db.execute("select sample_key from trainer_step_samples where run = 'on-v2'")
        }
        params = [
            json.loads(p)
            for (p,) in db.execute("select params from runs where kind='train' and name='on-v2'")
        ]
    assert trained and trained <= {r["sample_id"] for r in home.rows("samples.sft", "v2")}
    assert params and all(p["data_version"] == "v2" for p in params)
    switched = run_arena(
        ["train", "--version", "main", "--tiny", "--steps", "4", "--run", "on-v2"], home.env, check=None
    )
    assert switched.returncode != 0 and "never mixes versions" in switched.stderr


def test_dropping_a_version_removes_it_and_nothing_of_main(home: Home) -> None:
    before = _main_files(home)
    assert list((home.path / "lake").glob("version=v3/**/*.parquet"))
    out = run_arena(["data-versions", "drop", "v3", "--yes"], home.env).stdout
    assert "dropped v3" in out
    assert _main_files(home) == before
    assert not list((home.path / "lake").glob("version=v3/**/*.parquet"))
    listed = json.loads(run_arena(["data-versions", "list", "--json"], home.env).stdout)
    assert "v3" not in {v["name"] for v in listed} and "v2" in {v["name"] for v in listed}
    run_arena(["data-versions", "drop", "main", "--yes"], home.env, check=2)
    bad = run_arena(["export", "sft", "x.jsonl", "--version", "v3"], home.env, check=2)
    assert "no data version 'v3'" in bad.stderr
    # the name is free again: a new replay into it starts from nothing
    run_arena(
        ["replay", "tasks-from-chains", "--as", "v3", "--from", "0", "--until", "1", "--dry-run"], home.env
    )

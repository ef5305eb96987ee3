"""`bench/llm_concurrency.py --quick`: the bench runs end to end and prints its JSON.

The smoke run (about 3 minutes on 2 cores) is the SFT track on two sample tool docs, at latency
0 and 0.05 s, against `arena llm serve` through the `openai://` client: a real embedded broker,
real worker processes, a real server per run. It checks the JSON's shape and that the figures
hang together, not how fast anything is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.registry import WORKERS
from arena.llm.roles.registry import ROLES
from bench.llm_concurrency import ALSO_CALLED_BY, ROLE_STAGE, TRACKS

ROOT = Path(__file__).resolve().parent.parent


def test_every_role_and_stage_belongs_to_a_track() -> None:
    stages = {s for track in TRACKS.values() for s in track.stages}
    assert stages <= set(WORKERS)
    assert set(ROLES) <= set(ROLE_STAGE), "map a new role to the stage that calls it"
    assert set(ROLE_STAGE.values()) <= stages
    assert {s for also in ALSO_CALLED_BY.values() for s in also} <= stages


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_quick_run_prints_one_json_object(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # every run's ARENA_HOME goes under tmp_path
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "llm_concurrency.py"), "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=560,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # JSON only on stdout
    assert result["quick"] is True and result["mode"] == "server"
    latency = result["latency_s"]
    assert 0 < latency <= 0.1
    sft = result["tracks"]["sft"]
    labels = ["0s", f"{latency:g}s"]
    for name in ("wall_s", "mean_in_flight", "max_in_flight", "llm_requests", "llm_errors", "samples"):
        assert list(sft[name]) == labels, name
    for label in labels:
        run = sft["runs"][label]
        assert "error" not in run, run
        assert sft["wall_s"][label] > 0
        assert sft["llm_requests"][label] > 0 and sft["llm_errors"][label] == 0
        assert 0 < sft["mean_in_flight"][label] <= sft["max_in_flight"][label]
        assert sft["samples"][label] > 0
        assert run["samples_by_topic"] == {"samples.sft": sft["samples"][label]}
        stages = sft["per_stage"][label]
        assert set(stages) == set(TRACKS["sft"].stages)
        # every request is counted for a stage of the track (the workers' reports also count
        # requests that failed on the way, which the server never saw)
        assert sum(s["calls"] for s in stages.values()) in (
            sft["llm_requests"][label],
            run["reported_requests"],
        )
        assert run["unattributed"] == {}
        assert stages["trajectories"]["calls"] > 0 and stages["trajectories"]["outputs"] > 0
        assert stages["trajectories"]["calls_per_output"] > 0
        assert stages["trajectories"]["tokens_per_output"] > 0
        assert stages["samples-sft"]["outputs"] == sft["samples"][label]
    assert sft["ratio"] == pytest.approx(sft["wall_s"][labels[1]] / sft["wall_s"]["0s"], abs=0.01)
    assert isinstance(sft["samples_differ"], bool)
    assert not list(tmp_path.glob("arena-bench-*")), "a run's ARENA_HOME was left behind"

"""Every benchmark runs as docs/benchmarks.md documents it, in its ``--quick`` smoke mode (CI runs these).

Each bench script runs once as a subprocess exactly as documented -- ``.venv/bin/python
bench/X.py --quick`` from the repository root; ``python -m bench.env_track --help`` checks the
other documented way to run one (the same code, found as a package module). A run must exit 0
and print its JSON object (the last one on stdout) with the keys a full run prints and
``"quick": true``; per bench a few checks that the figures hang together. How fast anything is,
is the benches' business on a quiet machine, not this test's: quick figures are not measurements.

The benches that drive the sandbox need root (CI runs as root); ``bench/trainer.py`` compares with
TRL when the optional ``bench`` extra is installed and otherwise times Arena's side only and says
so (``trl.skipped``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
HELPERS = {"__init__", "latency_proxy", "sft_stages", "trl_tools"}
"""Modules of bench/ that are not benchmarks: a proxy llm_concurrency starts, stages sft_track and
env_track share, the TRL environments trainer.py wraps. Every other ``bench/*.py`` must be in
``BENCHES``."""


@dataclass(frozen=True)
class Bench:
    """One documented bench command and what its quick run must print."""

    argv: tuple[str, ...]
    keys: frozenset[str]
    timeout_s: float = 300  # generous: CI machines are shared, and a loaded one is several times slower
    root: bool = False  # drives the sandbox
    check: Callable[[dict[str, Any]], None] = field(default=lambda result: None)

    @property
    def name(self) -> str:
        return Path(self.argv[-1]).stem


def _check_backbone(r: dict[str, Any]) -> None:
    assert r["servers"] == 8 and r["tool_docs"] > 0
    assert r["arena"]["lake_rows"] and r["arena"]["docs_per_s"] > 0 and r["baseline"]["docs_per_s"] > 0
    assert r["ratio"] == pytest.approx(r["arena"]["docs_per_s"] / r["baseline"]["docs_per_s"], rel=0.01)


def _check_sft_track(r: dict[str, Any]) -> None:
    stages = r["stages"]
    assert set(stages["stages"]) >= {"tools-servers", "chains", "trajectories", "samples-sft"}
    assert stages["end_to_end"]["tool_docs"] == 2 and stages["end_to_end"]["samples_sft"] > 0
    gateway = r["gateway"]
    assert gateway["requests"] == 16 and gateway["concurrency"] == 4
    assert gateway["requests_per_s_concurrency_1"] > 0 and gateway["requests_per_s_concurrency_n"] > 0


def _check_llm_concurrency(r: dict[str, Any]) -> None:
    from bench.llm_concurrency import TRACKS

    assert r["mode"] == "server"
    latency = r["latency_s"]
    assert 0 < latency <= 0.1
    sft = r["tracks"]["sft"]
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


def _check_sandbox_pool(r: dict[str, Any]) -> None:
    for key in ("fresh_calls_per_s", "fork_calls_per_s", "session_calls_per_s", "sessions_opened_per_s"):
        assert r[key] > 0, key
    assert r["fork_vs_fresh"] == pytest.approx(r["fork_calls_per_s"] / r["fresh_calls_per_s"], rel=0.01)
    assert r["session_vs_fresh"] == pytest.approx(r["session_calls_per_s"] / r["fresh_calls_per_s"], rel=0.01)
    for path in ("fresh", "fork", "session"):
        figures = r[path]
        assert figures["calls"] == 40 and 0 < figures["latency_p50_ms"] <= figures["latency_p99_ms"]
    assert 0 < r["environments"]["used"] <= r["environments"]["packages"]


def _check_env_track(r: dict[str, Any]) -> None:
    assert r["instances_per_seed"] == 1
    for mode in ("warm_pool", "fresh_process"):
        run = r[mode]
        assert set(run["stages"]) == {
            "qa-traces",
            "qa-validated",
            "envs-code",
            "envs-verified",
            "samples-verified",
        }
        assert run["stages"]["qa-traces"]["records_in"] > 0 and run["seconds"] > 0
    # same seeds, same deterministic backend: both modes verify the same packages
    assert r["warm_pool"]["verified_packages"] == r["fresh_process"]["verified_packages"] > 0


def _check_eigen(r: dict[str, Any]) -> None:
    from bench.eigen import QUICK_SEEDS

    seeds = QUICK_SEEDS
    assert r["params"]["seeds"] == seeds and r["baseline"]["seeds"] == r["candidate"]["seeds"] == seeds
    assert r["determinism"]["same_outcomes"] and r["determinism"]["same_accepted_dialogues"]
    assert set(r["gates"]) >= {"task_validation", "trajectory_validation", "verification", "dead_letter"}
    assert sum(r["outcomes"].values()) == seeds


def _check_trainer(r: dict[str, Any]) -> None:
    arena = r["arena"]
    assert arena["steps_timed"] == 1 and arena["rollouts_per_step"] == 4
    assert arena["step_s"] > 0 and arena["rollouts_per_s"] > 0
    assert arena["step_s"] == pytest.approx(
        arena["rollout_s"] + arena["reward_s"] + arena["update_s"], rel=0.02, abs=0.01
    )
    assert r["setup"]["packages"]["verified_packages"] >= 2
    if importlib.util.find_spec("trl") is None:  # the optional `bench` extra is not installed
        assert "TRL is missing" in r["trl"]["skipped"] and r["ratio_step_s_arena_over_trl"] is None
    else:
        assert r["trl"]["steps_timed"] == 1 and r["trl"]["step_s"] > 0
        assert r["ratio_step_s_arena_over_trl"] == pytest.approx(
            arena["step_s"] / r["trl"]["step_s"], rel=0.01, abs=0.001
        )
        tools = r["trl_tools"]  # TRL's multi-turn path on Arena's environments
        assert tools["steps_timed"] == 1 and tools["rollouts_per_step"] == 4 and tools["step_s"] > 0
        assert tools["per_rollout"]["generated_tokens_mean"] > 0
        assert r["ratio_step_s_arena_over_trl_tools"] == pytest.approx(
            arena["step_s"] / tools["step_s"], rel=0.01, abs=0.001
        )


def _check_learning(r: dict[str, Any]) -> None:
    assert r["profile"] == "quick"
    for family in ("seen", "unseen"):  # held-out instances of trained tool families, and new families
        assert set(r[family]) == {"base", "sft", "grpo"}, family
        for figures in r[family].values():
            assert set(figures) >= {"f1", "f1_ci", "pass1", "pass4"}
    data = r["data"]
    assert data["heldout_seen_packages"] + data["heldout_unseen_packages"] == data["heldout_packages"]
    assert r["seen"]["base"]["packages"] == data["heldout_seen_packages"]
    assert r["unseen"]["base"]["packages"] == data["unseen_packages_evaluated"]
    for stage in ("base", "sft", "grpo"):
        assert r["heldout_eval"][stage]["packages"] > 0, stage
    assert r["train"]["sft"]["steps"] > 0
    # the F1 GRPO run rolled its packages out and stopped drained (its budget is only a safety net)
    assert r["train"]["grpo"]["stopped_by_time_budget"] is False
    assert set(r["reward_ablation"]) >= {"f1", "recall", "precision"}
    assert Path(r["plot"]).read_bytes().startswith(b"\x89PNG"), r["plot"]  # written under the run's TMPDIR


def _check_vllm_rollouts(r: dict[str, Any]) -> None:
    assert r["prompts"] == 2 and r["prepared"]["model"]["builder"].startswith("trainer.tiny.build_tiny")
    hf = r["backends"]["hf"]  # vllm joins only on a GPU machine with vllm installed
    (step,) = hf["per_step"]
    assert step["generated_tokens"] > 0 and step["rollout_s"] > 0 and step["update_s"] >= 0
    assert 0.0 <= step["reward_mean"] <= 1.0
    if "vllm" in r["backends"]:
        assert r["backends"]["vllm"]["checks"]["rollout_vs_trainer_logprobs"]["tokens"] > 0


def _check_chaos(r: dict[str, Any]) -> None:
    assert r["ok"] and r["clean"]["exit_code"] == 0 and r["plan"]["scale"] > 0
    (run,) = r["runs"]
    assert run["exit_code"] == 0 and run["kills"], run["kills"]
    assert set(run["verdict"].values()) == {0}, run["verdict"]
    topics = run["diff"]["topics"]
    assert topics["samples.sft"]["records"] == topics["samples.sft"]["clean_records"] > 0
    assert topics["stages.ledger"]["records"] > 0 and topics["stages.ledger"]["duplicates"] == 0
    assert r["ratio"] == pytest.approx(run["wall_s"] / r["clean"]["wall_s"], rel=0.01)


def _check_real_model(r: dict[str, Any]) -> None:
    if "skipped" in r:  # CI builds no llama.cpp: the reason says what to install
        assert "local-llm" in r["skipped"], r["skipped"]
        return
    assert r["tracks"] == ["sft"] and r["tracebacks"] == 0, r.get("traceback_files")
    for stage, figures in r["stages"].items():
        assert figures["balanced"] and figures.get("dead_lettered_by_kind", {}).get("crash", 0) == 0, stage
    assert r["llm_requests"] > 0 and r["server_tokens_per_s"] > 0 and r["arena_tokens_per_s"] > 0
    # {} when no admission coordinator answered (e.g. its socket path too long under pytest's tmp_path)
    assert not r["learned_limit"] or (r["learned_limit"]["learning"] and r["learned_limit"]["ceiling"] == 8)


def _check_replay(r: dict[str, Any]) -> None:
    assert r["ok"] is True and r["records_replayed"] > 0
    assert 0 < r["calls_saved_share"] < 1
    assert r["calls_saved_share"] == pytest.approx(
        r["llm_calls_upstream_saved"] / r["llm_calls_main"], abs=1e-3
    )
    assert r["llm_calls_version"] > 0 and 0 <= r["llm_requests_version"] <= r["llm_calls_version"]
    assert r["outputs"]["main"]["samples.sft"] > 0 and r["outputs"]["version"]["samples.sft"] > 0
    assert list(r["diff"]) == r["runs"][0]["stages"] and r["runs"][0]["stages"][0] == r["stage"]
    assert r["ratio"] == pytest.approx(r["replay_s"] / r["from_scratch_s"], rel=0.01)


def _check_tau2_loop(r: dict[str, Any]) -> None:
    if "skipped" in r:  # no .venv-tau2: the reason names the install script
        assert "install_tau2" in r["skipped"], r["skipped"]
        return
    assert r["synthesis"]["environments"] > 0 and r["synthesis"]["sft_samples"] > 0
    screened = r["decontam"]  # the test split's scenarios, screened as the trainer screens
    assert screened["test_items"] > 0 and len(screened["near_duplicates"]) == (
        screened["sft_dropped"] + screened["environments_dropped"]
    )
    assert r["sft"]["steps"] > 0 and r["grpo"] and r["grpo"][0]["groups"] > 0
    assert r["eval"]["split"] == "test"
    k = r["eval"]["k"]
    assert set(r["scores"]) == {"base", "sft", "sft_grpo", "do_nothing"}
    for name, figures in r["scores"].items():
        for j in range(1, k + 1):
            metric = figures[f"pass^{j}"]
            assert metric["ci_low"] <= metric["mean"] <= metric["ci_high"], (name, j)
        assert figures.get("errors", 0) == 0, name  # a trial tau2's evaluator scores otherwise is an error
    floor = r["scores"]["do_nothing"]["pass^1"]["mean"]
    for name, gap in r["above_floor"].items():
        assert gap == pytest.approx(r["scores"][name]["pass^1"]["mean"] - floor, abs=1e-3), name


def _keys(*names: str) -> frozenset[str]:
    return frozenset(("quick", *names))


ENV_TRACK_KEYS = _keys("warm_pool", "fresh_process", "ratio_packages_per_minute_warm_over_fresh")
BENCHES = [
    Bench(
        ("bench/backbone.py",), _keys("arena", "baseline", "ratio", "tool_docs"), 400, check=_check_backbone
    ),
    Bench(("bench/sft_track.py",), _keys("stages", "gateway"), 400, check=_check_sft_track),
    Bench(
        ("bench/llm_concurrency.py",), _keys("tracks", "latency_s", "mode"), 560, check=_check_llm_concurrency
    ),
    Bench(
        ("bench/sandbox_pool.py",),
        _keys(
            "fresh_calls_per_s",
            "fork_calls_per_s",
            "session_calls_per_s",
            "fork_vs_fresh",
            "session_vs_fresh",
        ),
        300,
        root=True,
        check=_check_sandbox_pool,
    ),
    Bench(("bench/env_track.py",), ENV_TRACK_KEYS, 300, root=True, check=_check_env_track),
    Bench(
        ("bench/eigen.py",),
        _keys(
            "accepted_dialogues_per_minute",
            "ratio_accepted_dialogues_per_minute",
            "gates",
            "repair",
            "determinism",
        ),
        300,
        root=True,
        check=_check_eigen,
    ),
    Bench(
        ("bench/trainer.py",),
        _keys("arena", "trl", "ratio_step_s_arena_over_trl", "ratio_rollouts_per_s_arena_over_trl"),
        500,
        root=True,
        check=_check_trainer,
    ),
    Bench(
        ("bench/vllm_rollouts.py",),
        _keys("backends", "prompts", "machine", "versions"),
        300,
        root=True,
        check=_check_vllm_rollouts,
    ),
    Bench(("bench/chaos.py",), _keys("clean", "runs", "ratio", "ok"), 600, check=_check_chaos),
    Bench(
        ("bench/replay.py",),
        _keys(
            "records_replayed",
            "replay_s",
            "from_scratch_s",
            "ratio",
            "llm_calls_main",
            "llm_calls_upstream_saved",
            "llm_calls_version",
            "llm_requests_version",
            "calls_saved_share",
            "outputs",
            "ok",
        ),
        600,
        check=_check_replay,
    ),
    # a real model on CPU: only where the local-llm extra is installed (skipped with the reason on CI)
    Bench(("bench/real_model.py",), _keys("bench"), 900, check=_check_real_model),
    Bench(
        ("bench/tau2_loop.py",),
        _keys("synthesis", "decontam", "scores", "above_floor"),
        600,
        root=True,
        check=_check_tau2_loop,
    ),
    Bench(
        ("bench/learning.py",),
        _keys("heldout_eval", "ordering", "reward_ablation"),
        600,
        root=True,
        check=_check_learning,
    ),
]


def last_json_object(stdout: str) -> dict[str, Any]:
    """The last JSON object on ``stdout`` (the bench's result; anything before it is ignored)."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    at = stdout.find("{")
    while at != -1:
        try:
            value, end = decoder.raw_decode(stdout, at)
        except json.JSONDecodeError:
            at = stdout.find("{", at + 1)
            continue
        if isinstance(value, dict):
            found = value
        at = stdout.find("{", end)
    assert found is not None, f"no JSON object on stdout: {stdout[-2000:]!r}"
    return found


def test_last_json_object_skips_what_comes_before() -> None:
    assert last_json_object('log {"a": 1}\n{"b": {"c": [1, "}"]}}\n') == {"b": {"c": [1, "}"]}}
    with pytest.raises(AssertionError, match="no JSON object"):
        last_json_object("no figures {here")


def test_every_bench_script_has_a_quick_run() -> None:
    scripts = {p.stem for p in (ROOT / "bench").glob("*.py")} - HELPERS
    assert scripts == {b.name for b in BENCHES}, "add the new bench to BENCHES"
    for bench in BENCHES:
        assert "--quick" in (ROOT / bench.argv[0]).read_text(), bench.name


SCRIPT_RUN = """
import contextlib, importlib, json, runpy, sys
from pathlib import Path
bench = Path(sys.argv[1])
for script in ("env_track.py", "trainer.py"):
    sys.path.insert(0, str(bench))  # what `python bench/X.py` does before the script runs
    sys.argv = [str(bench / script), "--help"]
    with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):
        runpy.run_path(str(bench / script), run_name="__main__")
trainer = importlib.import_module("trainer.episodes")
print(json.dumps({"trainer": trainer.__file__, "path": [str(Path(p or ".").resolve()) for p in sys.path]}))
"""


def test_a_script_run_by_path_does_not_shadow_packages(tmp_path: Path) -> None:
    """bench/ off sys.path, the repository root first: `trainer` is the package, not bench/trainer.py."""
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT_RUN, str(ROOT / "bench")],
        cwd=tmp_path,  # any working directory
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = last_json_object(proc.stdout)
    assert Path(result["trainer"]) == ROOT / "trainer" / "episodes.py"
    assert result["path"][0] == str(ROOT) and str(ROOT / "bench") not in result["path"]


def test_a_bench_runs_as_a_module() -> None:
    """``python -m bench.X`` from the repository root, the other documented way to run a bench."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.env_track", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--quick" in proc.stdout


@pytest.mark.integration
@pytest.mark.parametrize(
    "bench",
    [pytest.param(b, marks=pytest.mark.timeout(b.timeout_s + 30), id=" ".join(b.argv)) for b in BENCHES],
)
def test_quick_run_prints_its_figures(bench: Bench, tmp_path: Path) -> None:
    if bench.root and os.geteuid() != 0:
        pytest.skip("the sandbox needs root (CI runs as root)")
    proc = subprocess.run(
        [sys.executable, *bench.argv, "--quick"],
        cwd=ROOT,  # as documented: from the repository root
        env={**os.environ, "TMPDIR": str(tmp_path)},  # every temporary ARENA_HOME under tmp_path
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=bench.timeout_s,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = last_json_object(proc.stdout)
    missing = bench.keys - set(result)
    assert not missing, f"{bench.name} --quick printed no {sorted(missing)}"
    assert result["quick"] is True
    bench.check(result)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(("arena-bench", "arena-learning"))]
    assert not leftovers, f"a run's temporary home was left behind: {leftovers}"

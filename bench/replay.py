"""Replaying one stage into a data version, against running the same stages from scratch.

Usage::

    python bench/replay.py [--repeat 2] [--stage tasks-from-chains]
                           [--set sft.theta_question_quality=0.85] [--timeout 1800] [--keep] [--quick]

Prints ONE JSON object on stdout; progress goes to stderr.

Each repetition runs in a fresh ``ARENA_HOME`` (a temporary folder ``arena-bench-replay-*``), the
way a user runs it:

1. from scratch: ``arena demo --tracks sft`` (the embedded stack, the demo's tool docs and MCP
   servers, every SFT stage drained into version ``main``);
2. the replay: ``arena replay STAGE --as rN --all --set KEY=VALUE`` (STAGE and every stage
   downstream of it re-run over all of STAGE's input in main, into data version ``rN``; the
   setting makes the version differ from main), then ``arena worker --version rN --until-drained``;
3. ``arena data-versions show rN``, ``arena lake query`` (``llm_usage`` and the output topics, by
   ``_version``) and ``arena diff main rN --json``, side by side (they only read); then ``arena down``.

Every lake file of main is hashed before the replay and after the drain.

Figures (the top-level ones are those of the first repetition, timings the mean over
repetitions; ``runs`` has every repetition's):

``records_replayed``
    records of STAGE's input the version replays (``ranges[].records`` of ``arena data-versions
    show``); ``records_inherited``: records the version took over unchanged from main (written by
    stages that do not run: for tasks-from-chains, the tasks of tasks-from-servers), which the
    version's downstream stages process too; ``records_copied``: both, as ``arena replay`` says.
``from_scratch_s``
    the demo's "drained in": seconds from its workers starting until every SFT stage drained
    (the whole SFT track from the tool docs, upstream stages included; the stack's start and the
    publishing are not counted). ``demo_wall_s``: the whole ``arena demo`` command.
``replay_s``
    ``arena replay``'s wall time (planning, copying the input, creating the topics) plus the
    version's "drained in" (``arena worker --version``, the same measure as the demo's).
    ``ratio`` = ``replay_s`` / ``from_scratch_s``.
``llm_calls_main``
    LLM calls of every stage in main (``llm_usage where _version = 'main'``);
    ``llm_calls_upstream_saved``: those of main's stages that do not run in the version (upstream
    of STAGE): calls the replay did not repeat; ``calls_saved_share`` = saved / ``llm_calls_main``.
``llm_calls_same_stages_main``, ``llm_requests_same_stages_main``
    the from-scratch LLM cost of the replayed stages: their calls and requests in main.
``llm_calls_version``, ``llm_requests_version``, ``llm_cache_hits_version``
    the version's calls, the requests it actually sent (attempts: a call answered from the home's
    response cache sends none) and its cache hits. ``estimated_calls``: what ``arena replay``
    estimated beforehand.
``outputs``
    valid lake rows of tasks, trajectories, trajectories.scored and samples.sft, in main and in the
    version.
``diff``
    per stage of the version, from ``arena diff main rN --json``: records in, outputs, LLM calls and
    requests (main, version), and the outputs matched in both, identical, only in main, only in
    the version.
``ok``
    every repetition's demo and version drained and main's lake files are byte for byte what they
    were before the replay.

``--quick`` (CI's smoke run, about 100 s on 2 cores, most of it the demo and the version's drain):
one repetition of the smallest demo (``QUICK_SIZES``: 1 walk, 1 server task, 1 chain synthesis per
server, 1 augmentation axis). A full run uses the demo's default sizes, twice.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from arena.topics import TOPICS
from bench.llm_concurrency import BenchError, arena_command

REPO_ROOT = Path(__file__).resolve().parent.parent
STAGE = "tasks-from-chains"
SETTING = "sft.theta_question_quality=0.85"
"""The version's override: a stricter task gate than main's, so the version's outputs differ."""
QUICK_SIZES = {
    "ARENA_SFT__WALKS": "1",
    "ARENA_SFT__SERVER_TASKS": "1",
    "ARENA_SFT__CHAIN_SYNTHESES": "1",
    "ARENA_SFT__AUGMENT_AXES": '["diversity"]',
}
"""The reduced SFT demo of ``tests/test_replay.py``, one augmentation axis instead of three (every
original task and one variant: half the tasks, trajectories and scorings)."""
OUTPUT_TOPICS = ("tasks", "trajectories", "trajectories.scored", "samples.sft")
STEPS = 5
"""Progress steps per repetition: demo, replay, drain, lake, diff."""
TIMEOUT_S = 1800

err = Console(stderr=True)
LOG_LOCK = threading.Lock()
"""The read-only commands after a drain run side by side; each appends to the log whole."""


def _terminate(signum: int, _frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the stack.
    raise SystemExit(128 + signum)


def env_for(home: Path, quick: bool) -> dict[str, str]:
    """A private ``ARENA_HOME``; no inherited ``ARENA_*`` setting (the demo's defaults: rules backend)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARENA_")}
    env.update(ARENA_HOME=str(home), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    if quick:
        env.update(QUICK_SIZES)
    return env


def arena(
    args: list[str], env: dict[str, str], log: Path, *, timeout_s: float = 600
) -> tuple[str, str, float]:
    """``arena ARGS``: (stdout, stdout and stderr, wall seconds); ``BenchError`` when it exits non-zero.

    Everything it printed is appended to ``log``."""
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [*arena_command(), *args],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"`arena {' '.join(args)}` ran past {timeout_s:.0f}s (log {log})") from exc
    wall = time.monotonic() - started
    text = proc.stdout + proc.stderr
    with LOG_LOCK, log.open("a") as out:
        out.write(f"$ arena {' '.join(args)}  # exit {proc.returncode}, {wall:.1f}s\n{text}\n")
    if proc.returncode != 0:
        raise BenchError(f"`arena {' '.join(args)}` exited {proc.returncode} (log {log}):\n{text[-2000:]}")
    return proc.stdout, text, wall


def drained_in(text: str, fallback: float) -> float:
    """The last "drained in N s" ``arena demo``/``arena worker`` printed (``fallback`` without one)."""
    found = re.findall(r"drained in ([0-9.]+)s", text)
    return float(found[-1]) if found else fallback


def lake(sql: str, env: dict[str, str], log: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(arena(["lake", "query", "--json", sql], env, log)[0])
    return rows


def main_files(home: Path) -> dict[str, str]:
    """Every file of main's lake folders (``lake/topic=*``; versions live under ``lake/version=*``),
    by content hash."""
    root = home / "lake"
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.glob("topic=*/**/*.parquet"))
    }


def usage_by_stage(env: dict[str, str], log: Path, version: str) -> dict[str, dict[str, dict[str, int]]]:
    """Per version (main, ``version``) and stage: LLM calls, requests, cache hits and tokens."""
    rows = lake(
        "select _version as version, stage, sum(calls)::bigint as calls, "
        "sum(attempts)::bigint as requests, sum(cache_hits)::bigint as cache_hits, "
        "sum(prompt_tokens + completion_tokens)::bigint as tokens from llm_usage "
        f"where _valid and _version in ('main', '{version}') group by 1, 2 order by 1, 2",
        env,
        log,
    )
    found: dict[str, dict[str, dict[str, int]]] = {"main": {}, version: {}}
    for r in rows:
        found[r["version"]][r["stage"]] = {
            k: int(r[k] or 0) for k in ("calls", "requests", "cache_hits", "tokens")
        }
    return found


def outputs(env: dict[str, str], log: Path, version: str) -> dict[str, dict[str, int]]:
    """Valid lake rows per output topic, in main and in ``version``."""
    sql = " union all ".join(
        f"select '{name}' as topic, _version as version, count(*)::bigint as n from {TOPICS[name].table} "
        f"where _valid and _version in ('main', '{version}') group by 2"
        for name in OUTPUT_TOPICS
    )
    found: dict[str, dict[str, int]] = {
        "main": dict.fromkeys(OUTPUT_TOPICS, 0),
        "version": dict.fromkeys(OUTPUT_TOPICS, 0),
    }
    for r in lake(sql, env, log):
        found["main" if r["version"] == "main" else "version"][r["topic"]] = int(r["n"])
    return found


def diff_figures(text: str) -> dict[str, dict[str, Any]]:
    """Per stage of ``arena diff main V --json``: (main, version) pairs and the matched outputs."""
    stages: dict[str, dict[str, Any]] = {}
    for s in json.loads(text)["stages"]:
        a, b = s["a"], s["b"]
        stages[s["stage"]] = {
            **{k: [a.get(k), b.get(k)] for k in ("records_in", "outputs", "llm_calls", "llm_requests")},
            "both": s["both"],
            "identical": s["identical"],
            "only_main": s["only_a"],
            "only_version": s["only_b"],
        }
    return stages


def run_once(
    index: int, root: Path, args: argparse.Namespace, progress: Progress, task: Any
) -> dict[str, Any]:
    """One repetition in a fresh home: the demo from scratch, then the replay; the stack stopped after."""
    home = root / f"run{index}"
    home.mkdir(parents=True)
    log = root / f"run{index}.log"
    env = env_for(home, args.quick)
    version = f"r{index}"
    label = f"run {index}/{args.repeat}"

    def step(what: str) -> None:
        progress.update(task, description=f"{label}: {what}")

    try:
        step("arena demo --tracks sft (from scratch)")
        _, demo, demo_wall = arena(
            ["demo", "--tracks", "sft", "--timeout", f"{args.timeout:g}"],
            env,
            log,
            timeout_s=args.timeout + 300,
        )
        from_scratch = drained_in(demo, demo_wall)
        progress.advance(task)

        before = main_files(home)
        step(f"arena replay {args.stage} --as {version}")
        _, replayed, replay_wall = arena(
            ["replay", args.stage, "--as", version, "--all", "--set", args.set], env, log, timeout_s=600
        )
        estimate = re.search(
            r"estimated LLM use:\s+([0-9]+)\s+calls,\s+at\s+most\s+([0-9]+)\s+requests", replayed
        )
        copied = re.search(r"([0-9]+) records copied in", replayed)
        progress.advance(task)

        step(f"arena worker --version {version} --until-drained")
        _, drained, drain_wall = arena(
            ["worker", "--version", version, "--until-drained", "--timeout", f"{args.timeout:g}"],
            env,
            log,
            timeout_s=args.timeout + 300,
        )
        drain = drained_in(drained, drain_wall)
        after = main_files(home)
        progress.advance(task)

        # four read-only commands, side by side (each is mostly its own start-up)
        step(f"arena data-versions show, arena lake query, arena diff main {version}")
        with ThreadPoolExecutor(max_workers=4) as pool:
            shown = pool.submit(arena, ["data-versions", "show", version], env, log)
            used = pool.submit(usage_by_stage, env, log, version)
            counted = pool.submit(outputs, env, log, version)
            diffed = pool.submit(arena, ["diff", "main", version, "--json", "--examples", "0"], env, log)
            spec = json.loads(shown.result()[0])
            usage = used.result()
            rows = counted.result()
            progress.advance(task)
            compared = diffed.result()[0]
            progress.advance(task)
    finally:
        step("arena down")
        try:
            subprocess.run(
                [*arena_command(), "down"],
                env=env,
                capture_output=True,
                timeout=120,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            err.print(f"[yellow]arena down in {home} failed[/yellow]: {exc}")

    stages = set(spec["stages"])
    main_usage, version_usage = usage["main"], usage[version]
    calls_main = sum(u["calls"] for u in main_usage.values())
    saved = sum(u["calls"] for stage, u in main_usage.items() if stage not in stages)
    changed = sorted(
        set(before) ^ set(after) | {p for p in before.keys() & after.keys() if before[p] != after[p]}
    )
    replay_s = replay_wall + drain
    return {
        "version": version,
        "stages": spec["stages"],
        "records_replayed": sum(r["records"] for r in spec["ranges"]),
        "records_inherited": sum(spec["inherited"].values()),
        "records_copied": int(copied.group(1)) if copied else None,
        "from_scratch_s": round(from_scratch, 1),
        "demo_wall_s": round(demo_wall, 1),
        "replay_command_s": round(replay_wall, 1),
        "replay_drain_s": round(drain, 1),
        "replay_worker_wall_s": round(drain_wall, 1),
        "replay_s": round(replay_s, 1),
        "ratio": round(replay_s / from_scratch, 3) if from_scratch else None,
        "llm_calls_main": calls_main,
        "llm_calls_upstream_saved": saved,
        "calls_saved_share": round(saved / calls_main, 4) if calls_main else None,
        "llm_calls_same_stages_main": sum(u["calls"] for s, u in main_usage.items() if s in stages),
        "llm_requests_same_stages_main": sum(u["requests"] for s, u in main_usage.items() if s in stages),
        "llm_calls_version": sum(u["calls"] for u in version_usage.values()),
        "llm_requests_version": sum(u["requests"] for u in version_usage.values()),
        "llm_cache_hits_version": sum(u["cache_hits"] for u in version_usage.values()),
        "estimated_calls": int(estimate.group(1)) if estimate else None,
        "estimated_requests": int(estimate.group(2)) if estimate else None,
        "llm": {"main": main_usage, "version": version_usage},
        "outputs": rows,
        "diff": diff_figures(compared),
        "main_lake_files": len(before),
        "main_lake_files_changed": changed[:10],
        "ok": bool(before) and not changed and "drained" in drained,
    }


TOP_LEVEL = (
    "records_replayed",
    "records_inherited",
    "records_copied",
    "llm_calls_main",
    "llm_calls_upstream_saved",
    "calls_saved_share",
    "llm_calls_same_stages_main",
    "llm_requests_same_stages_main",
    "llm_calls_version",
    "llm_requests_version",
    "llm_cache_hits_version",
    "estimated_calls",
    "outputs",
    "diff",
)
"""Figures the JSON carries at its top level as the first repetition measured them."""
TIMINGS = ("from_scratch_s", "demo_wall_s", "replay_command_s", "replay_drain_s", "replay_s")
"""Figures the JSON carries at its top level as the mean over repetitions."""


def bench(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="arena-bench-replay-"))
    err.print(f"replay bench in {root}: {args.repeat} repetition(s) of demo + replay of {args.stage}")
    runs: list[dict[str, Any]] = []
    failed = True
    try:
        with Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
        ) as progress:
            task = progress.add_task("starting", total=STEPS * args.repeat)
            for index in range(1, args.repeat + 1):
                runs.append(run_once(index, root, args, progress, task))
        failed = False
    finally:
        if args.keep or failed:
            err.print(f"homes and logs kept under {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    first = runs[0]
    timings = {k: round(sum(r[k] for r in runs) / len(runs), 1) for k in TIMINGS}
    return {
        "quick": args.quick,
        "stage": args.stage,
        "set": args.set,
        "sizes": QUICK_SIZES if args.quick else {},  # {}: the demo's defaults
        "repeat": args.repeat,
        **{k: first[k] for k in TOP_LEVEL},
        **timings,
        "ratio": round(timings["replay_s"] / timings["from_scratch_s"], 3)
        if timings["from_scratch_s"]
        else None,
        "ok": all(r["ok"] for r in runs),
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=2, help="repetitions, each in a fresh home (--quick: 1)"
    )
    parser.add_argument("--stage", default=STAGE, help="the stage to replay (its downstream follows)")
    parser.add_argument("--set", default=SETTING, help="the version's setting override, KEY=VALUE")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds a drain may take")
    parser.add_argument("--keep", action="store_true", help="keep the homes and logs (printed)")
    parser.add_argument(
        "--quick", action="store_true", help="CI smoke run: one repetition of a reduced SFT demo"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.repeat = 1
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    signal.signal(signal.SIGTERM, _terminate)
    started = time.monotonic()
    try:
        result = bench(args)
    except BenchError as exc:
        err.print(f"[red]failed[/red]: {exc}")
        return 1
    result["total_s"] = round(time.monotonic() - started, 1)
    err.print(
        f"replay {result['replay_s']}s vs from scratch {result['from_scratch_s']}s (ratio {result['ratio']}); "
        f"{result['llm_calls_upstream_saved']} of {result['llm_calls_main']} calls upstream not repeated; "
        f"version: {result['llm_calls_version']} calls, {result['llm_requests_version']} requests; "
        f"ok {result['ok']}"
    )
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

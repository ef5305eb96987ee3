"""How well the pipeline keeps a real model server busy: the tracks against `arena llm serve`.

Usage::

    python bench/llm_concurrency.py [--tracks sft,env,eigen] [--latency 0.25] [--capacity 64]
                                    [--proxy] [--quick] [--timeout 3600] [--keep]

Prints ONE JSON object on stdout; progress goes to stderr.

Each track runs twice, at latency 0 and at ``--latency``, each time from nothing, the way a user
runs it: a fresh ``ARENA_HOME`` (temp dir: its own embedded broker, lake, catalog and LLM response
cache, so every LLM call really reaches the server), ``arena up``, ``arena llm serve --llm rules
--latency S --max-concurrency N`` on a free loopback port, the track's sample inputs published
with ``arena publish ...``, then ``arena worker --stage <the track's stages> --stage lake-sink
--until-drained`` with ``ARENA_LLM=openai://127.0.0.1:PORT/v1?model=rules-v1`` (the real OpenAI
client path, as with vLLM), then ``arena lake ...`` and ``arena down``.

Tracks and inputs (those of ``arena demo``):

``sft``
    ``arena publish tools samples/tools`` (its malformed files go to the dead-letter topic,
    as in the demo) and the two bundled MCP servers (library over HTTP, notes over stdio);
    stages tools-servers, tool-index, chains, tasks-from-chains, tasks-from-servers,
    trajectories, trajectories-scored, samples-sft. Samples: ``samples.sft``.
``env``
    ``arena publish qa --builtin <each built-in knowledge base> --hops 2 --count
    ARENA_ENVS__DEMO_INSTANCES``; stages qa-traces, qa-validated, envs-code, envs-verified,
    samples-verified. Samples: ``samples.verified``.
``eigen``
    ``arena publish domain customer_service`` (its pilot calls the LLM too: through its own
    server, reported as ``publish``, not counted in the track's figures); stages eigen-intents,
    eigen-tasks, eigen-dialogs, eigen-dialogs-validated, eigen-verified. Samples:
    ``samples.verified`` + ``samples.sft``.

The workers talk to a server of their own (fresh, so its ``max_in_flight`` is theirs); the SFT
and environment tracks' publishes call no LLM and get no server (``publish_llm_requests`` 0). Figures
per track and latency:

``wall_s``
    seconds from ``arena worker`` starting the workers until it found every group drained (its
    own "drained in" figure; stopping the workers afterwards is not counted). ``ratio`` =
    wall at ``--latency`` / wall at 0.
``mean_in_flight``, ``max_in_flight``
    requests in flight as the server saw them (``GET /v1/arena/stats``); the mean is
    time-weighted over ``wall_s``. At latency 0 the rules backend costs CPU, so requests queue
    inside the server: in flight then measures the server's backlog as much as the pipeline.
``effective_concurrency``
    requests * latency / (wall at latency - wall at 0): how many requests' latency the pipeline
    overlapped on average (``capacity`` is the most it could).
``samples``
    rows of the track's sample topics in the lake; ``samples_differ`` when the two latencies
    differ by more than 10% (the rules backend is deterministic; timing may still change what
    e.g. the emulator's injected failures hit).
``per_stage``
    per stage: LLM ``calls`` (requests it sent to the server), ``prompt_tokens``,
    ``completion_tokens``, ``outputs`` (valid rows the stage wrote to its first output topic, from
    the lake's lineage header ``arena-stage``), ``rejected`` and ``dead_letters`` it wrote,
    ``calls_per_output`` and ``tokens_per_output``. ``per_stage_source`` says where calls and
    tokens come from, the first that has them: the workers' own reports on ``llm.usage`` (read
    from the broker once the workers stopped; they add gateway calls, cache hits, calls shared
    with an identical one in flight), used when they add up with the server's count
    (``reported_requests`` less the ones that failed in transport <= ``llm_requests`` <=
    ``reported_requests``); with ``--proxy``, the proxy's count per
    calling worker process; else the server's requests per role with tokens from the response
    cache (valid answers, all their attempts), each role counted for the stage that mainly calls
    it (``shared_roles``: roles another stage of the track calls too, so approximate).

``--proxy`` puts ``bench/latency_proxy.py`` (adds the latency per request, ``--capacity`` slots,
counts in flight itself) in front of ``arena llm serve --latency 0``: the acceptance check "a proxy
that adds 0.25 s per request in front of arena llm serve". In-flight figures are then the proxy's
(the server's are reported too, as ``server``).

``--quick`` (CI's smoke mode, about 1-2 minutes on 2 cores): the SFT track only (unless
``--tracks`` says otherwise) on one sample tool doc without the MCP servers, with fewer walks,
chain syntheses, server tasks and augmentation axes per server (``QUICK_SFT_SIZES``, unless set
in the environment), latency 0.05 s (unless ``--latency``). It proves the bench works; it is not the measurement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

import httpx
from rich.console import Console

REPO_ROOT = Path(__file__).resolve().parent.parent
PROXY_SCRIPT = Path(__file__).resolve().parent / "latency_proxy.py"
MODEL = "rules-v1"
SINK = "lake-sink"
QUICK_LATENCY_S = 0.05
QUICK_TOOL_DOCS = ("good/weather_openai.json",)
QUICK_SFT_SIZES = {
    "ARENA_SFT__WALKS": "1",
    "ARENA_SFT__CHAIN_SYNTHESES": "1",
    "ARENA_SFT__SERVER_TASKS": "1",
    "ARENA_SFT__AUGMENT_AXES": '["diversity"]',
}
"""SFT-track sizes of a quick run (fewer tasks, so fewer trajectories to run and score): one chain
task and one server task, each with one augmented variant; every SFT stage still runs."""
SAMPLES_TOLERANCE = 0.10
DROPPED_ENV = frozenset(
    {
        # the run's own broker, lake, index and catalog live in its fresh ARENA_HOME
        "ARENA_BROKER",
        "ARENA_LAKE_URL",
        "ARENA_LANCEDB_URI",
        "ARENA_CATALOG_URL",
        # the bench sets ARENA_LLM and starts its servers without a key
        "ARENA_LLM",
        "ARENA_LLM_API_KEY",
        "ARENA_LLM_SERVE_API_KEY",
    }
)

err = Console(stderr=True)


@dataclass(frozen=True)
class Track:
    name: str
    stages: tuple[str, ...]
    samples: tuple[str, ...]
    """Topics whose rows are the track's output samples."""
    publish_llm: bool = False
    """Whether publishing the inputs calls the LLM (EigenData's pilot): only then does the publish get
    a server of its own (an `arena llm serve` started for nothing costs seconds of CPU)."""


TRACKS: dict[str, Track] = {
    "sft": Track(
        "sft",
        (
            "tools-servers",
            "tool-index",
            "chains",
            "tasks-from-chains",
            "tasks-from-servers",
            "trajectories",
            "trajectories-scored",
            "samples-sft",
        ),
        ("samples.sft",),
    ),
    "env": Track(
        "env",
        ("qa-traces", "qa-validated", "envs-code", "envs-verified", "samples-verified"),
        ("samples.verified",),
    ),
    "eigen": Track(
        "eigen",
        ("eigen-intents", "eigen-tasks", "eigen-dialogs", "eigen-dialogs-validated", "eigen-verified"),
        ("samples.verified", "samples.sft"),
        publish_llm=True,
    ),
}

ROLE_STAGE: dict[str, str] = {
    # SFT track
    "chain_synthesis": "chains",
    "chain_coherence": "chains",
    "task_from_chain": "tasks-from-chains",
    "task_from_server": "tasks-from-servers",
    "augment_task": "tasks-from-chains",
    "score_task": "tasks-from-chains",
    "agent_policy": "trajectories",
    "tool_emulation": "trajectories",
    "judge_query_understanding": "trajectories-scored",
    "judge_query_planning": "trajectories-scored",
    "judge_round_understanding": "trajectories-scored",
    "judge_round_planning": "trajectories-scored",
    "judge_call_conciseness": "trajectories-scored",
    "judge_answer_correlation": "trajectories-scored",
    "judge_answer_summary": "trajectories-scored",
    # environment track
    "qa_synthesis": "qa-traces",
    "qa_tool_need": "qa-validated",
    "qa_dependency": "qa-validated",
    "qa_atomicity": "qa-validated",
    "qa_sequence": "qa-validated",
    "qa_completeness": "qa-validated",
    "tool_spec": "envs-code",
    "tool_scaling": "envs-code",
    "tool_invocation": "envs-code",
    "tool_implementation": "envs-code",
    "homogeneous_groups": "envs-verified",
    "merge_invocation": "envs-verified",
    # EigenData track (planner, prompt engineer and judge: a re-pilot of a drifting set)
    "eigen_random_pool": "eigen-intents",
    "eigen_user_intent": "eigen-intents",
    "eigen_planner": "eigen-intents",
    "eigen_prompt_engineer": "eigen-intents",
    "eigen_judge": "eigen-intents",
    "eigen_task_validation": "eigen-tasks",
    "eigen_modify": "eigen-tasks",
    "eigen_trajectory_agent": "eigen-dialogs",
    "user_simulator": "eigen-dialogs",
    "eigen_trajectory_validation": "eigen-dialogs-validated",
}
"""Role -> the stage that mainly calls it (the server counts requests per role, not per stage)."""

OFF_STREAM: dict[str, str] = {
    "eigen_tau2_instance": "arena domain synth tau2 D --new N (producers/tau2_instances.py)",
}
"""Roles no stage calls, and what does: this bench's pipeline never requests them."""

ALSO_CALLED_BY: dict[str, tuple[str, ...]] = {
    "task_from_chain": ("chains",),  # joint (task, chain) synthesis
    "augment_task": ("tasks-from-servers",),
    "score_task": ("tasks-from-servers",),
    "eigen_task_validation": ("eigen-intents",),  # a re-pilot
    "eigen_modify": ("eigen-dialogs-validated", "eigen-intents"),  # dialogue repair, a re-pilot
    "eigen_trajectory_agent": ("eigen-dialogs-validated",),  # a repaired dialogue is re-synthesized
    "user_simulator": ("eigen-dialogs-validated",),
}
"""Other stages that call a role too: their calls are counted for ``ROLE_STAGE``'s stage."""


class BenchError(RuntimeError):
    """A step of a run failed; the message says which and where its log is."""


# --- processes ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def arena_command() -> list[str]:
    """The `arena` executable of this interpreter's environment (``python -m app.cli`` without one)."""
    exe = Path(sys.executable).parent / "arena"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "app.cli"]


def arena(args: list[str], env: dict[str, str], *, ok: tuple[int, ...] = (0,), timeout_s: float = 900) -> str:
    """Run ``arena ARGS``; stdout, or ``BenchError`` with the output's tail on an unexpected exit status."""
    proc = subprocess.run(
        [*arena_command(), *args],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )
    if proc.returncode not in ok:
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise BenchError(f"`arena {' '.join(args)}` exited {proc.returncode}:\n{tail}")
    return proc.stdout


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
    """Signal ``proc``'s process group (it runs in a session of its own), then kill what is left."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def log_tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class Endpoint:
    """An OpenAI-compatible endpoint: `arena llm serve`, optionally behind the latency proxy."""

    port: int
    procs: list[tuple[subprocess.Popen[bytes], Path]] = field(default_factory=list)
    server_port: int | None = None
    """With the proxy: the port of the server behind it."""
    pending: list[str] | None = None
    """With the proxy: its command, started by ``wait_ready`` once the server answers."""

    @property
    def arena_llm(self) -> str:
        return f"openai://127.0.0.1:{self.port}/v1?model={MODEL}"

    def stats(self, timeout_s: float = 10.0) -> dict[str, Any]:
        return _get_json(f"http://127.0.0.1:{self.port}/v1/arena/stats", timeout_s)

    def server_stats(self) -> dict[str, Any] | None:
        if self.server_port is None:
            return None
        return _get_json(f"http://127.0.0.1:{self.server_port}/v1/arena/stats", 10.0)

    def wait_ready(self, env: dict[str, str], logs: Path, name: str) -> None:
        """Wait until the server answers, then start the proxy in front of it (if any) and wait for it."""
        try:
            server, log = self.procs[0]
            _wait_healthy(self.server_port or self.port, server, log)
            if self.pending is not None:
                log = logs / f"latency-proxy-{name}.log"
                proc = _spawn(self.pending, env, log)
                self.procs.append((proc, log))
                self.pending = None
                _wait_healthy(self.port, proc, log)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc, _log in reversed(self.procs):
            stop_process(proc)


def _get_json(url: str, timeout_s: float) -> dict[str, Any]:
    response = httpx.get(url, timeout=timeout_s)
    response.raise_for_status()
    data = response.json()
    assert isinstance(data, dict)
    return data


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _wait_healthy(port: int, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"{proc.args!r} exited {proc.returncode}:\n{log_tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.3)
    raise BenchError(f"nothing answered on port {port} after {timeout_s:.0f}s:\n{log_tail(log)}")


def start_endpoint(
    name: str,
    env: dict[str, str],
    logs: Path,
    *,
    latency_s: float,
    capacity: int,
    proxy: bool,
    reply_style: str = "plain",
) -> Endpoint:
    """`arena llm serve` with the latency (or at 0 behind the proxy adding it), started: its
    ``wait_ready`` waits until it answers (so several endpoints start side by side)."""
    port = free_port()
    server_latency = 0.0 if proxy else latency_s
    serve = [
        *arena_command(),
        "llm",
        "serve",
        "--llm",
        "rules",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--latency",
        f"{server_latency:g}",
        "--max-concurrency",
        str(capacity),
        "--reply-style",
        reply_style,
    ]
    endpoint = Endpoint(port)
    log = logs / f"llm-serve-{name}.log"
    endpoint.procs.append((_spawn(serve, env, log), log))
    if proxy:
        endpoint.server_port, endpoint.port = port, free_port()
        endpoint.pending = [
            sys.executable,
            str(PROXY_SCRIPT),
            "--upstream",
            f"http://127.0.0.1:{port}",
            "--port",
            str(endpoint.port),
            "--latency",
            f"{latency_s:g}",
            "--capacity",
            str(capacity),
        ]
    return endpoint


# --- inputs ---------------------------------------------------------------------------------------


@dataclass
class Inputs:
    description: str
    cleanup: list[Any] = field(default_factory=list)
    """Things with a ``stop()`` that must outlive the workers (the deployed MCP server)."""


def publish_inputs(track: Track, env: dict[str, str], logs: Path, quick: bool) -> Inputs:
    """Publish the track's sample inputs with the `arena publish` commands, as ``arena demo`` does."""
    if track.name == "sft":
        return _publish_sft(env, logs, quick)
    if track.name == "env":
        from arena.config import ArenaSettings
        from producers.builtin_knowledge import BUILTIN_DOMAINS

        domains = BUILTIN_DOMAINS[:1] if quick else BUILTIN_DOMAINS
        count = 2 if quick else ArenaSettings().envs.demo_instances
        args = ["publish", "qa", *[f"--builtin={d}" for d in domains], "--hops", "2", "--count", str(count)]
        arena(args, env)
        return Inputs(
            f"qa.seeds: built-in knowledge bases {', '.join(domains)}, hops 2, {count} instances each"
        )
    if track.name == "eigen":
        from app.demo import DEMO_DOMAIN

        args = ["publish", "domain", DEMO_DOMAIN, *(["--instances", "4"] if quick else [])]
        arena(args, env, timeout_s=3600)
        return Inputs(
            f"domain pack {DEMO_DOMAIN} (pilot, then eigen.seeds{', 4 instances' if quick else ''})"
        )
    raise ValueError(track.name)


def _publish_sft(env: dict[str, str], logs: Path, quick: bool) -> Inputs:
    root = Path(str(files("samples") / "tools"))  # app.demo.sample_tools_dir, without importing the demo
    docs = [str(root / p) for p in QUICK_TOOL_DOCS] if quick else [str(root)]
    # exit 1: some files were rejected (the samples include malformed files on purpose)
    arena(["publish", "tools", *docs], env, ok=(0, 1))
    if quick:
        return Inputs(f"tools.raw: {', '.join(QUICK_TOOL_DOCS)} (no MCP servers)")
    from app.demo import start_demo_mcp

    mcp = start_demo_mcp(logs)
    try:
        url = mcp.endpoints["library"].url
        deadline = time.monotonic() + 60
        while True:  # the library server may still be starting
            try:
                arena(["publish", "mcp", "--url", str(url)], env)
                break
            except BenchError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        command = mcp.endpoints["notes"].command or []
        arena(["publish", "mcp", "--stdio", shlex.join(command)], env)
    except BaseException:
        mcp.stop()
        raise
    return Inputs(
        "tools.raw: samples/tools (good, rejected, malformed) + MCP servers library (http), notes (stdio)",
        [mcp],
    )


# --- measuring ------------------------------------------------------------------------------------


def cache_watermark(home: Path) -> int:
    """The response cache's last row id (rows after it are the workers' answers)."""
    from arena.llm.gateway import CACHE_FILE

    path = home / CACHE_FILE
    if not path.exists():
        return 0
    with contextlib.closing(sqlite3.connect(path)) as db:
        try:
            return int(db.execute("select coalesce(max(rowid), 0) from responses").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def cache_tokens(home: Path, after: int) -> dict[str, dict[str, int]]:
    """Per role: answers cached after row ``after`` and the prompt/completion tokens they spent."""
    from arena.llm.gateway import CACHE_FILE

    path = home / CACHE_FILE
    if not path.exists():
        return {}
    with contextlib.closing(sqlite3.connect(path)) as db:
        try:
            rows = db.execute(
                "select role, count(*), sum(prompt_tokens), sum(completion_tokens) from responses "
                "where rowid > ? group by role",
                (after,),
            ).fetchall()
        except sqlite3.OperationalError:
            return {}
    return {
        r: {"answers": n, "prompt_tokens": int(p or 0), "completion_tokens": int(c or 0)}
        for r, n, p, c in rows
    }


USAGE_TOPIC = "llm.usage"
USAGE_FIELDS = (
    "calls",
    "cache_hits",
    "shared",
    "attempts",
    "retries",
    "transient_errors",
    "invalid_outputs",
    "failures",
    "prompt_tokens",
    "completion_tokens",
)


def worker_usage(
    home: Path, timeout_s: float = 30.0, fields: tuple[str, ...] = USAGE_FIELDS
) -> dict[str, dict[str, int]]:
    """Per stage: what the workers reported to ``llm.usage``, summed over roles, windows and processes.

    Read from the broker after the workers stopped (their last window is sent at shutdown, possibly
    after the lake sink's last batch). Empty when the workers report nothing.
    """
    from kafka import KafkaConsumer, TopicPartition

    from app.stack import STATE_FILE

    broker = json.loads((home / STATE_FILE).read_text())["broker"]
    consumer = KafkaConsumer(bootstrap_servers=broker, enable_auto_commit=False, group_id=None)
    totals: dict[str, dict[str, int]] = {}
    try:
        partitions = [
            TopicPartition(USAGE_TOPIC, p) for p in consumer.partitions_for_topic(USAGE_TOPIC) or ()
        ]
        if not partitions:
            return {}
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        end = consumer.end_offsets(partitions)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp] for tp in partitions) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    value = json.loads(record.value)
                    slot = totals.setdefault(value["stage"], dict.fromkeys(fields, 0))
                    for name in fields:
                        slot[name] += int(value.get(name) or 0)
    finally:
        consumer.close()
    return totals


def stage_topics(track: Track) -> dict[str, tuple[str, ...]]:
    """Output topics of each stage of ``track`` (from the stage registry)."""
    from app.registry import STAGES

    by_name = {s.name: s for s in STAGES}
    return {name: by_name[name].outputs for name in track.stages if name in by_name}


def lake_rows(track: Track, env: dict[str, str]) -> list[dict[str, Any]]:
    """Rows per (topic, writing stage, valid) of every topic the track's stages write."""
    from app.registry import STAGES
    from arena.topics import topic

    wanted: set[str] = set(track.samples)
    for stage in STAGES:
        if stage.name in track.stages:
            wanted.update(stage.may_emit)
    # One `arena lake query`: every registered topic is a view, an empty one too (no `arena lake ls`).
    parts = [
        f"select '{name}' as topic, json_extract_string(_headers, '$.\"arena-stage\"') as stage, "
        f"_valid as valid, count(*) as n from {topic(name).table} group by 2, 3"
        for name in sorted(wanted)
    ]
    rows = json.loads(arena(["lake", "query", "--json", " union all ".join(parts)], env))
    assert isinstance(rows, list)
    return rows


def _ratio(num: float, den: float | None, digits: int = 2) -> float | None:
    return round(num / den, digits) if den else None


def per_stage(
    track: Track,
    rows: list[dict[str, Any]],
    calls_by_stage: dict[str, dict[str, int]],
) -> dict[str, dict[str, Any]]:
    outputs = stage_topics(track)
    extra = sorted(
        {k for u in calls_by_stage.values() for k in u} - {"calls", "prompt_tokens", "completion_tokens"}
    )
    figures: dict[str, dict[str, Any]] = {}
    for name in track.stages:
        mine = [r for r in rows if r["stage"] == name]
        first = outputs.get(name, ())[:1]
        out = sum(r["n"] for r in mine if r["valid"] and r["topic"] in first) if first else None
        usage = calls_by_stage.get(name, {})
        calls = usage.get("calls", 0)
        tokens = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        figures[name] = {
            "calls": calls,
            "prompt_tokens": usage.get("prompt_tokens", 0),
            "completion_tokens": usage.get("completion_tokens", 0),
            "output_topic": first[0] if first else None,
            "outputs": out,
            "rejected": sum(r["n"] for r in mine if r["topic"].endswith(".rejected")),
            "dead_letters": sum(r["n"] for r in mine if r["topic"].endswith(".dlq")),
            "calls_per_output": _ratio(calls, out),
            "tokens_per_output": _ratio(tokens, out, 1),
            **{k: usage.get(k, 0) for k in extra},
        }
    return figures


def calls_from_roles(
    track: Track, by_role: dict[str, int], tokens: dict[str, dict[str, int]]
) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Server requests per role and cached tokens per role, counted for each role's main stage."""
    totals: dict[str, dict[str, int]] = {}
    shared: set[str] = set()
    for role in set(by_role) | set(tokens):
        stage = ROLE_STAGE.get(role, "unknown")
        if stage != "unknown" and stage not in track.stages:
            stage = "unknown"
        if set(ALSO_CALLED_BY.get(role, ())) & set(track.stages):
            shared.add(role)
        slot = totals.setdefault(stage, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0})
        slot["calls"] += by_role.get(role, 0)
        slot["prompt_tokens"] += tokens.get(role, {}).get("prompt_tokens", 0)
        slot["completion_tokens"] += tokens.get(role, {}).get("completion_tokens", 0)
    return totals, sorted(shared)


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}


def _area(stats: dict[str, Any]) -> float:
    return float(stats["mean_in_flight"]) * float(stats["seconds"])


def run_workers(
    track: Track, env: dict[str, str], logs: Path, endpoint: Endpoint, label: str, timeout_s: float
) -> tuple[float, float]:
    """``arena worker --until-drained`` over the track's stages; (drained-in seconds, process seconds)."""
    log = logs / "bench-arena-worker.log"
    args = [
        "worker",
        *[f"--stage={s}" for s in (*track.stages, SINK)],
        "--until-drained",
        "--timeout",
        f"{timeout_s:g}",
    ]
    started = time.monotonic()
    proc = _spawn([*arena_command(), *args], env, log)
    try:
        with err.status(f"{label}: starting workers") as status:
            while proc.poll() is None:
                time.sleep(0.5)
                try:
                    s = endpoint.stats(timeout_s=2)
                    figures = (
                        f"{s['requests']} LLM requests, {s['in_flight']} in flight (max {s['max_in_flight']})"
                    )
                except httpx.HTTPError:
                    figures = "LLM endpoint busy"
                status.update(f"{label}: workers running {time.monotonic() - started:.0f}s, {figures}")
    except BaseException:
        stop_process(proc, signal.SIGINT, timeout_s=60)
        raise
    process_s = time.monotonic() - started
    text = log_tail(log, 200_000)
    if proc.returncode != 0:
        raise BenchError(f"`arena {' '.join(args)}` exited {proc.returncode} (log {log}):\n{text[-2000:]}")
    found = re.findall(r"drained in ([0-9.]+)s", text)
    return (float(found[-1]) if found else process_s), process_s


@dataclass
class Options:
    capacity: int
    proxy: bool
    quick: bool
    timeout_s: float
    keep: bool
    reply_style: str = "plain"
    """How the server writes answers in the loaded run (the baseline at latency 0 stays plain)."""


def run_once(track: Track, latency_s: float, opts: Options) -> dict[str, Any]:
    """One track at one latency, from a fresh ARENA_HOME to `arena down`."""
    label = f"{track.name} @ {latency_s:g}s"
    home = Path(tempfile.mkdtemp(prefix=f"arena-bench-{track.name}-"))
    logs = home / "logs"
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    env.update(ARENA_HOME=str(home), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    if opts.quick and track.name == "sft":
        env = QUICK_SFT_SIZES | env  # a setting in the environment wins
    endpoints: list[Endpoint] = []
    inputs: Inputs | None = None
    failed = True
    try:
        with err.status(f"{label}: arena up, arena llm serve ..."):
            arena(["up"], env)
            style = opts.reply_style if latency_s > 0 else "plain"
            publish_ep = None
            if track.publish_llm:
                publish_ep = start_endpoint(
                    "publish",
                    env,
                    logs,
                    latency_s=latency_s,
                    capacity=opts.capacity,
                    proxy=False,
                    reply_style=style,
                )
                endpoints.append(publish_ep)
            workers_ep = start_endpoint(
                "workers",
                env,
                logs,
                latency_s=latency_s,
                capacity=opts.capacity,
                proxy=opts.proxy,
                reply_style=style,
            )
            endpoints.append(workers_ep)
            if publish_ep is not None:
                publish_ep.wait_ready(env, logs, "publish")  # both servers start side by side
            workers_ep.wait_ready(env, logs, "workers")
        started = time.monotonic()
        with err.status(f"{label}: publishing the inputs"):
            publish_env = env if publish_ep is None else {**env, "ARENA_LLM": publish_ep.arena_llm}
            inputs = publish_inputs(track, publish_env, logs, opts.quick)
        publish_s = time.monotonic() - started
        publish_requests = 0  # a publish that calls no LLM
        if publish_ep is not None:
            publish_requests = publish_ep.stats()["requests"]
            publish_ep.stop()
        watermark = cache_watermark(home)
        before = workers_ep.stats()
        wall_s, process_s = run_workers(
            track, {**env, "ARENA_LLM": workers_ep.arena_llm}, logs, workers_ep, label, opts.timeout_s
        )
        after = workers_ep.stats()
        server = workers_ep.server_stats()
        with err.status(f"{label}: reading the lake"):
            rows = lake_rows(track, env)
        tokens = cache_tokens(home, watermark)
        by_role = _delta(after["by_role"], before["by_role"])
        proxy_calls = {
            stage: _delta(usage, before.get("by_stage", {}).get(stage, {}))
            for stage, usage in after.get("by_stage", {}).items()
        }
        requests = after["requests"] - before["requests"]
        reported = worker_usage(home)
        reported_requests = sum(u["attempts"] for u in reported.values())
        lost_in_transport = sum(u["transient_errors"] for u in reported.values())
        # every report arrived: the workers' requests are the server's, plus those lost on the way
        complete = reported_requests - lost_in_transport <= requests <= reported_requests
        shared: list[str] = []
        if reported and complete:
            calls = {
                stage: {
                    "calls": u["attempts"],
                    "prompt_tokens": u["prompt_tokens"],
                    "completion_tokens": u["completion_tokens"],
                    "gateway_calls": u["calls"],
                    "cache_hits": u["cache_hits"],
                    "shared_in_flight": u["shared"],
                    "transient_errors": u["transient_errors"],
                    "invalid_outputs": u["invalid_outputs"],
                    "failures": u["failures"],
                }
                for stage, u in reported.items()
            }
            source = "the workers' llm.usage reports (requests each stage sent, tokens the server reported)"
        elif opts.proxy:
            calls = proxy_calls
            source = "proxy: per calling worker process"
        else:
            calls, shared = calls_from_roles(track, by_role, tokens)
            source = (
                "server requests per role and response-cache tokens per role, each role for its main stage"
            )
        if reported and not complete:
            source += (
                f" (llm.usage does not add up: {reported_requests} requests reported, "
                f"{lost_in_transport} of them failed in transport, {requests} served)"
            )
        samples = {
            name: sum(
                r["n"] for r in rows if r["topic"] == name and r["valid"] and r["stage"] in track.stages
            )
            for name in track.samples
        }
        result: dict[str, Any] = {
            "wall_s": round(wall_s, 1),
            "worker_command_s": round(process_s, 1),
            "publish_s": round(publish_s, 1),
            "llm_requests": requests,
            "llm_errors": after["errors"] - before["errors"],
            "mean_in_flight": round((_area(after) - _area(before)) / wall_s, 2) if wall_s else None,
            "max_in_flight": after["max_in_flight"],
            "max_prompt_tokens": after.get("max_prompt_tokens", {}),
            "replies_cut": after.get("cut", 0) - before.get("cut", 0),
            "requests_per_s": _ratio(requests, wall_s),
            "samples": sum(samples.values()),
            "samples_by_topic": samples,
            "llm_calls_per_sample": _ratio(requests, sum(samples.values())),
            "per_stage_source": source,
            "shared_roles": shared,
            "per_stage": per_stage(track, rows, calls),
            "unattributed": {k: v for k, v in calls.items() if k not in track.stages},
            "requests_by_role": dict(sorted(by_role.items())),
            "publish_llm_requests": publish_requests,
        }
        result["reported_requests"] = reported_requests if reported else None
        if opts.proxy:
            result["proxy"] = {
                **{k: after.get(k) for k in ("connections", "caller_lookup_s")},
                "calls_by_stage": {k: v.get("calls", 0) for k, v in sorted(proxy_calls.items())},
            }
        if server is not None:
            result["server"] = {
                k: server[k] for k in ("requests", "errors", "max_in_flight", "mean_in_flight", "seconds")
            }
        err.print(
            f"[green]{label}[/green]: drained in {wall_s:.1f}s, {requests} LLM requests, mean in flight "
            f"{result['mean_in_flight']}, max {result['max_in_flight']}, {result['samples']} samples "
            f"(published in {publish_s:.1f}s)"
        )
        failed = False
        return {"inputs": inputs.description, **result}
    finally:
        for ep in endpoints:
            ep.stop()
        for thing in inputs.cleanup if inputs else []:
            thing.stop()
        with contextlib.suppress(Exception):
            arena(["down"], env, timeout_s=120)
        if opts.keep or failed:
            err.print(f"{label}: ARENA_HOME kept at {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


def track_figures(track: Track, latency_s: float, opts: Options) -> dict[str, Any]:
    runs: dict[str, dict[str, Any]] = {}
    for lat in (0.0, latency_s):
        key = f"{lat:g}s"
        try:
            runs[key] = run_once(track, lat, opts)
        except BenchError as exc:
            err.print(f"[red]{track.name} @ {key} failed[/red]: {exc}")
            runs[key] = {"error": str(exc)}
    base, loaded = runs["0s"], runs[f"{latency_s:g}s"]
    labels = list(runs)

    def pick(name: str) -> dict[str, Any]:
        return {k: runs[k].get(name) for k in labels}

    out: dict[str, Any] = {
        "inputs": base.get("inputs") or loaded.get("inputs"),
        "stages": [*track.stages, SINK],
        "wall_s": pick("wall_s"),
        "ratio": _ratio(loaded["wall_s"], base["wall_s"])
        if "wall_s" in base and "wall_s" in loaded
        else None,
        "mean_in_flight": pick("mean_in_flight"),
        "max_in_flight": pick("max_in_flight"),
        "llm_requests": pick("llm_requests"),
        "llm_errors": pick("llm_errors"),
        "samples": pick("samples"),
    }
    if "wall_s" in base and "wall_s" in loaded:
        added = loaded["wall_s"] - base["wall_s"]
        out["effective_concurrency"] = (
            _ratio(loaded["llm_requests"] * latency_s, added) if added > 0 else None
        )
        a, b = base["samples"], loaded["samples"]
        out["samples_differ"] = abs(a - b) > SAMPLES_TOLERANCE * max(a, b, 1)
        out["samples_ratio"] = _ratio(b, a) if a else None
    out["per_stage"] = pick("per_stage")
    out["runs"] = {k: {n: v for n, v in r.items() if n != "per_stage"} for k, r in runs.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="LLM concurrency of the tracks against `arena llm serve` (JSON on stdout)."
    )
    parser.add_argument(
        "--tracks", default=None, help="Comma-separated: sft,env,eigen (default all; sft with --quick)."
    )
    parser.add_argument(
        "--latency",
        type=float,
        default=None,
        help="Seconds per request of the loaded run (default 0.25; 0.05 with --quick).",
    )
    parser.add_argument(
        "--capacity", type=int, default=64, help="Requests the server handles at once (--max-concurrency)."
    )
    parser.add_argument(
        "--proxy",
        action="store_true",
        help="Add the latency in bench/latency_proxy.py in front of a latency-0 server.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="Smoke mode: SFT track on one tool doc, latency 0.05 s."
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="Give up on a run's workers after this many seconds."
    )
    parser.add_argument(
        "--keep", action="store_true", help="Keep each run's ARENA_HOME (logs, lake) and say where."
    )
    parser.add_argument(
        "--reply-style",
        default="plain",
        choices=("plain", "real", "reasoning"),
        help="How the server writes answers in the loaded run (real: <think> first, JSON in prose and a "
        "fence, Hermes tool calls); samples_ratio compares its samples with the plain baseline's.",
    )
    args = parser.parse_args(argv)
    names = (args.tracks or ("sft" if args.quick else "sft,env,eigen")).split(",")
    unknown = [n for n in names if n not in TRACKS]
    if unknown:
        parser.error(f"unknown track {unknown[0]!r} (use {', '.join(TRACKS)})")
    latency = args.latency if args.latency is not None else (QUICK_LATENCY_S if args.quick else 0.25)
    if latency <= 0:
        parser.error("--latency must be above 0 (the baseline runs at 0)")
    opts = Options(
        capacity=args.capacity,
        proxy=args.proxy,
        quick=args.quick,
        timeout_s=args.timeout,
        keep=args.keep,
        reply_style=args.reply_style,
    )
    started = time.monotonic()
    tracks = {name: track_figures(TRACKS[name], latency, opts) for name in names}
    result = {
        "bench": "llm_concurrency",
        "mode": "proxy" if args.proxy else "server",
        "latency_where": "bench/latency_proxy.py in front of `arena llm serve --latency 0`"
        if args.proxy
        else "`arena llm serve --latency`",
        "quick": args.quick,
        "latency_s": latency,
        "capacity": args.capacity,
        "reply_style": args.reply_style,
        "arena_llm": f"openai://127.0.0.1:PORT/v1?model={MODEL}",
        "cpus": os.cpu_count(),
        "tracks": tracks,
        "bench_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(result, indent=2))
    failed = any("error" in run for t in tracks.values() for run in t["runs"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

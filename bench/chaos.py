"""Chaos benchmark: `kill -9` stage workers while records are in flight; nothing lost, nothing doubled.

A clean run of ``arena demo`` in a fresh home, then ``--runs`` chaos runs of the same demo, each in
its own fresh home, while a killer sends SIGKILL to a random worker process group (stage workers
and the lake sink) every few seconds: ``--kills`` in all, at most ``--per-stage`` per worker,
preferring workers with records pending. The supervisor restarts each. With ``--scale K`` the runs
are the SFT track over K synthetic tool docs (``bench.backbone.synthetic_servers``) instead.

After each run, a census (read_committed, every topic of the registry, from the beginning) counts
per topic its records, distinct keys and duplicate keys, and compares it with the clean run: keys
missing, keys extra, and keys whose value differs (values are compared without time stamps, uuids,
tokens and measured latencies; the per-process ``llm.usage`` reports and ``trainer.metrics`` are
counted, not compared).
The lake (rows and distinct keys per table), the LanceDB tool index (rows, distinct tools) and the
SQLite catalog (rows per table) are counted the same way. The JSON carries every figure and
``ok``: 0 duplicates and 0 missing keys everywhere, every compared topic identical to the clean
run; the exit status is 1 when it is not. ``ratio`` is the mean chaos run's wall time over the
clean run's.

    python bench/chaos.py [--runs 3] [--kills 12] [--scale K] [--quick]

``--quick`` (CI's smoke run, not a measurement): 20 tool docs (2 servers) through the SFT track, one
chaos run with 1 kill, run side by side with the clean run (so its wall times and ``ratio`` say
nothing about the cost of the kills).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from rich.console import Console
from rich.table import Table

from app.demo import track_workers
from app.registry import WORKERS
from app.stack import descendants_of, free_port
from arena.records.common import MEASURED_FIELDS
from arena.topics import TOPICS
from consumers.lag import compute_lag
from consumers.ledger import read_to_end
from synthesis.eigen.verification import field_class

ARENA = str(Path(sys.executable).parent / "arena")
NOT_COMPARED = {"llm.usage", "trainer.metrics"}
"""Topics whose records depend on the run's processes and timing by design."""
VOLATILE = {"at", *MEASURED_FIELDS}
"""Value fields left out of the comparison besides those ``volatile`` names: Arena's own record time
stamps and measured latencies."""


def volatile(field: str) -> bool:
    """A field whose value a run cannot repeat: a time stamp, a uuid or a token (the fields the
    EigenData verifier skips too: a domain's tools stamp records with the wall clock and uuid4)."""
    return field in VOLATILE or field_class(field) == "SKIP"


LEDGER = "stages.ledger"
"""Keyed by input offsets, which follow the run's interleaving: compared by (stage, input key)."""
CATALOG_NOT_COMPARED = {"artifacts"}
"""One row per Parquet file the lake sink wrote: how records fall into files follows its batching."""
RUN_TIMEOUT_S = 1500
QUICK_DOCS = 20

console = Console(stderr=True)


@dataclass(frozen=True)
class Plan:
    """One chaos benchmark: what runs and how hard it is hit."""

    runs: int = 3
    kills: int = 12
    per_stage: int = 3
    interval_s: tuple[float, float] = (8.0, 20.0)
    tracks: str = "sft,env,eigen"
    scale: int = 0
    """Synthetic tool docs through the SFT track instead of the demo (0: the demo)."""
    seed: int = 0


@dataclass
class Kill:
    at_s: float
    worker: str
    pid: int


@dataclass
class RunResult:
    home: str
    exit_code: int
    wall_s: float
    kills: list[Kill] = field(default_factory=list)
    tool_docs: int = 0
    """Synthetic tool docs published (scaled runs)."""


# -- running --------------------------------------------------------------------------------------


MCP_PORT = free_port()
"""The demo's MCP server listens here in every run: its URL is part of the server's record."""
MCP_CLOCK = "2026-01-01T00:00:00+00:00"
"""The demo's notes server runs on a logical clock from here: its tool results carry timestamps."""


SCALED_SFT = {
    "ARENA_SFT__CHAIN_SYNTHESES": "2",
    "ARENA_SFT__WALKS": "2",
    "ARENA_SFT__SERVER_TASKS": "1",
    "ARENA_SFT__AUGMENT_AXES": "[]",
}
"""A scaled run's fan-out per server (every stage still runs): K tool docs fit in minutes."""


def env_for(home: Path, plan: Plan | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARENA_")}
    env.update(ARENA_HOME=str(home), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    env["ARENA_DEMO_MCP_PORT"] = str(MCP_PORT)
    env["ARENA_DEMO_MCP_CLOCK"] = MCP_CLOCK
    if plan is not None and plan.scale:
        env.update(SCALED_SFT)
    return env


def sft_workers() -> list[str]:
    return track_workers(("sft",))


def publish_scaled(home: Path, docs: int, seed: int) -> int:
    """About ``docs`` synthetic tool docs (8 a server) to tools.raw of ``home``'s stack; returns the count."""
    import asyncio

    from arena.config import ArenaSettings
    from bench.backbone import synthetic_servers
    from lake.store import ClaimCheck
    from producers.publish import publish
    from producers.publish_tools import outgoing

    servers = synthetic_servers(max(1, docs // 8), 8, seed)
    bootstrap = json.loads((home / "stack.json").read_text())["broker"]
    claims = ClaimCheck.from_settings(ArenaSettings(home=home))
    asyncio.run(publish(bootstrap, outgoing(servers, []), claims=claims))
    return sum(len(server.entries) for server in servers)


def command(plan: Plan) -> list[str]:
    if plan.scale:
        stages = [arg for name in sft_workers() for arg in ("--stage", name)]
        return [ARENA, "worker", *stages, "--until-drained", "--timeout", str(RUN_TIMEOUT_S)]
    return [ARENA, "demo", "--tracks", plan.tracks, "--timeout", str(RUN_TIMEOUT_S)]


def worker_processes(parent: int) -> dict[int, str]:
    """Worker processes (``python -m app.run NAME``) below ``parent`` (its fork server's children): pid -> worker name."""
    found: dict[int, str] = {}
    for pid, cmd in descendants_of(parent).items():
        argv = cmd.split()
        if "app.run" in argv[:-1]:
            found[pid] = argv[argv.index("app.run") + 1]
    return found


def busy_workers(home: Path, names: set[str]) -> set[str]:
    """Workers whose consumer group has records pending (best effort: empty when lag cannot be read).

    Their input topics are named, so a group that has not joined yet counts what waits for it too."""
    try:
        bootstrap = json.loads((home / "stack.json").read_text())["broker"]
        groups = {WORKERS[n].group: n for n in names}
        inputs = {WORKERS[n].group: list(WORKERS[n].inputs) for n in names}
        rows = compute_lag(bootstrap, list(groups), topics_by_group=inputs, timeout_s=3.0)
    except Exception:
        return set()
    return {groups[row.group] for row in rows if row.group in groups and row.pending > 0}


def killer(
    proc: subprocess.Popen[bytes], home: Path, plan: Plan, rng: random.Random, started: float
) -> list[Kill]:
    """SIGKILL a random worker's process group every interval until ``plan.kills`` or the run ends."""
    kills: list[Kill] = []
    per_worker: Counter[str] = Counter()
    while len(kills) < plan.kills:
        deadline = time.monotonic() + rng.uniform(*plan.interval_s)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return kills
            time.sleep(0.2)
        live = {
            pid: name for pid, name in worker_processes(proc.pid).items() if per_worker[name] < plan.per_stage
        }
        if not live:
            continue
        busy = busy_workers(home, set(live.values()))
        choices = sorted(pid for pid, name in live.items() if name in busy) or sorted(live)
        pid = rng.choice(choices)
        try:
            os.killpg(pid, signal.SIGKILL)  # the worker and what it started (sandboxes, MCP servers)
        except ProcessLookupError:
            continue
        per_worker[live[pid]] += 1
        kills.append(Kill(round(time.monotonic() - started, 1), live[pid], pid))
        console.print(f"  kill {len(kills)}/{plan.kills}: {live[pid]} (pid {pid}) at {kills[-1].at_s:.0f}s")
    return kills


def run_once(home: Path, plan: Plan, *, chaos: bool, rng: random.Random) -> RunResult:
    """One run in a fresh ``home``; the stack is left up for the census."""
    env = env_for(home, plan)
    home.mkdir(parents=True)
    docs = 0
    if plan.scale:
        subprocess.run([ARENA, "up"], env=env, check=True, capture_output=True)
        subprocess.run([ARENA, "topics", "create"], env=env, check=True, capture_output=True)
        docs = publish_scaled(home, plan.scale, plan.seed)
    log = (home.parent / f"{home.name}.log").open("wb")
    started = time.monotonic()
    proc = subprocess.Popen(
        command(plan), env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    kills = killer(proc, home, plan, rng, started) if chaos else []
    code = proc.wait(timeout=RUN_TIMEOUT_S + 300)
    log.close()
    return RunResult(str(home), code, round(time.monotonic() - started, 1), kills, docs)


# -- census ---------------------------------------------------------------------------------------


def _normalised(value: bytes) -> str:
    """A digest of a record value without its ``volatile`` fields."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not volatile(k)}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    try:
        text = json.dumps(strip(json.loads(value)), sort_keys=True)
    except ValueError:
        text = value.decode("utf-8", "replace")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def topic_census(bootstrap: str) -> dict[str, dict[str, Any]]:
    """Per topic: records, keys, duplicate keys, and each key's value digests (for the comparison)."""
    out: dict[str, dict[str, Any]] = {name: {"records": 0, "values": {}} for name in TOPICS}
    keys: dict[str, set[str]] = {name: set() for name in TOPICS}
    for tp, records in read_to_end(bootstrap, list(TOPICS), timeout_s=600).items():
        entry = out[tp.topic]
        entry["records"] += len(records)
        for _offset, key, value in records:
            name = (key or b"").decode("utf-8", "replace")
            keys[tp.topic].add(name)
            if tp.topic == LEDGER:
                name, value = _ledger_view(value or b"")
            entry["values"].setdefault(name, []).append(_normalised(value or b""))
    for topic_name, entry in out.items():
        for digests in entry["values"].values():
            digests.sort()
        entry["keys"] = len(keys[topic_name])
        entry["duplicates"] = entry["records"] - entry["keys"]
    return out


def _ledger_view(value: bytes) -> tuple[str, bytes]:
    """A ledger entry as (stage:input key, entry without its partition and offset)."""
    entry = json.loads(value)
    view = {k: v for k, v in entry.items() if k not in ("partition", "offset")}
    return f"{entry['stage']}:{entry['key']}", json.dumps(view, sort_keys=True).encode()


def lake_census(home: Path) -> dict[str, dict[str, int]]:
    from arena.config import ArenaSettings
    from lake.query import LakeQuery
    from lake.store import open_store

    query = LakeQuery(open_store(ArenaSettings(home=home)))
    out: dict[str, dict[str, int]] = {}
    # One connection for every table: `query.query` registers every topic's view again per call
    # (a quarter of a second each, some 20 s over the registry); the run has ended, its files stay.
    con = query.connect()
    try:
        for table in query.tables():
            try:
                rel = con.sql(f"select count(*) as n, count(distinct _key) as k from {table}")
                row = rel.to_arrow_table().to_pylist()[0]
            except Exception:
                continue  # no file for that topic
            out[table] = {
                "rows": int(row["n"]),
                "keys": int(row["k"]),
                "duplicates": int(row["n"]) - int(row["k"]),
            }
    finally:
        con.close()
    return out


def side_census(home: Path) -> dict[str, Any]:
    """LanceDB's tool index and the catalog's tables: rows (and for the index, distinct tools)."""
    import lancedb

    out: dict[str, Any] = {"lancedb": {}, "catalog": {}}
    db_path = home / "lancedb"
    if db_path.exists():
        db = lancedb.connect(str(db_path))
        for name in db.list_tables().tables:
            table = db.open_table(name).to_arrow()
            ids = table.column("id").to_pylist() if "id" in table.column_names else []
            out["lancedb"][name] = {"rows": table.num_rows, "keys": len(set(ids)) if ids else table.num_rows}
            out["lancedb"][name]["duplicates"] = out["lancedb"][name]["rows"] - out["lancedb"][name]["keys"]
    catalog = home / "catalog.db"
    if catalog.exists():
        with sqlite3.connect(catalog) as con:
            names = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
            for name in names:
                out["catalog"][name] = int(con.execute(f'select count(*) from "{name}"').fetchone()[0])
    return out


def census(home: Path) -> dict[str, Any]:
    bootstrap = json.loads((home / "stack.json").read_text())["broker"]
    return {"topics": topic_census(bootstrap), "lake": lake_census(home), "side": side_census(home)}


def clean_census(home: Path, plan: Plan, rng: random.Random) -> tuple[RunResult, dict[str, Any]]:
    """The clean run in ``home`` and its census; its stack stopped after."""
    try:
        run = run_once(home, plan, chaos=False, rng=rng)
        return run, census(home)
    finally:
        stop_stack(home)


def stop_stack(home: Path) -> None:
    subprocess.run([ARENA, "down"], env=env_for(home), capture_output=True, timeout=120)


# -- comparing ------------------------------------------------------------------------------------


def compare(clean: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """Per topic, lake table and side store: duplicates, and what differs from the clean run."""
    topics: dict[str, Any] = {}
    for name, got in run["topics"].items():
        want = clean["topics"][name]
        mine, theirs = got["values"], want["values"]
        compared = name not in NOT_COMPARED
        changed = [k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k]]
        topics[name] = {
            "records": got["records"],
            "clean_records": want["records"],
            "keys": got["keys"],
            "duplicates": got["duplicates"],
            "missing": sorted(theirs.keys() - mine.keys())[:10] if compared else [],
            "missing_count": len(theirs.keys() - mine.keys()) if compared else 0,
            "extra_count": len(mine.keys() - theirs.keys()) if compared else 0,
            "changed_count": len(changed) if compared else 0,
            "changed": sorted(changed)[:5] if compared else [],
            "identical": (not compared) or (mine == theirs),
        }
    topic_of = {spec.table: name for name, spec in TOPICS.items()}
    lake = {
        table: {**figures, "topic_keys": run["topics"].get(topic_of.get(table, ""), {}).get("keys", 0)}
        for table, figures in run["lake"].items()
        if topic_of.get(table) not in NOT_COMPARED
    }
    lancedb = {
        name: {**figures, "clean_rows": clean["side"]["lancedb"].get(name, {}).get("rows", 0)}
        for name, figures in run["side"]["lancedb"].items()
    }
    catalog = {
        name: {"rows": rows, "clean_rows": clean["side"]["catalog"].get(name, 0)}
        for name, rows in run["side"]["catalog"].items()
        if name not in CATALOG_NOT_COMPARED
    }
    return {"topics": topics, "lake": lake, "lancedb": lancedb, "catalog": catalog}


def verdict(diff: dict[str, Any]) -> dict[str, int]:
    topics = [t for name, t in diff["topics"].items() if name not in NOT_COMPARED]
    return {
        "duplicate_keys": sum(t["duplicates"] for t in topics),
        "missing_keys": sum(t["missing_count"] for t in topics),
        "extra_keys": sum(t["extra_count"] for t in topics),
        "changed_values": sum(t["changed_count"] for t in topics),
        "lake_duplicates": sum(t["duplicates"] for t in diff["lake"].values()),
        "lake_missing": sum(max(0, t["topic_keys"] - t["keys"]) for t in diff["lake"].values()),
        "lancedb_duplicates": sum(t["duplicates"] for t in diff["lancedb"].values()),
        "lancedb_missing": sum(max(0, t["clean_rows"] - t["rows"]) for t in diff["lancedb"].values()),
        "catalog_rows_differing": sum(t["rows"] != t["clean_rows"] for t in diff["catalog"].values()),
    }


def show(results: list[dict[str, Any]]) -> None:
    table = Table(
        "run", "exit", "wall s", "kills", "dup keys", "missing", "extra", "changed", "lake dup/miss", "ok"
    )
    for r in results:
        v = r["verdict"]
        table.add_row(
            r["name"],
            str(r["exit_code"]),
            f"{r['wall_s']:.0f}",
            str(len(r["kills"])),
            str(v["duplicate_keys"]),
            str(v["missing_keys"]),
            str(v["extra_keys"]),
            str(v["changed_values"]),
            f"{v['lake_duplicates']}/{v['lake_missing']}",
            "yes" if r["ok"] else "[red]no[/red]",
        )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="chaos runs after the clean one")
    parser.add_argument("--kills", type=int, default=12, help="SIGKILLs per chaos run")
    parser.add_argument("--per-stage", type=int, default=3, help="kills of one worker at most, per run")
    parser.add_argument("--scale", type=int, default=0, help="K synthetic tool docs through the SFT track")
    parser.add_argument(
        "--interval", default="8,20", help="seconds between kills: LOW,HIGH (a uniform draw each time)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the run homes (printed)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"CI smoke run: {QUICK_DOCS} tool docs, 1 chaos run with 1 kill, beside the clean run",
    )
    args = parser.parse_args(argv)
    try:
        low, high = (float(x) for x in args.interval.split(","))
    except ValueError:
        parser.error(f"--interval {args.interval!r}: give LOW,HIGH in seconds, e.g. 8,20")
    plan = Plan(
        runs=args.runs,
        kills=args.kills,
        per_stage=args.per_stage,
        interval_s=(low, high),
        scale=args.scale,
        seed=args.seed,
    )
    if args.quick:
        plan = Plan(runs=1, kills=1, per_stage=1, interval_s=(2.0, 4.0), scale=args.scale or QUICK_DOCS)
    if plan.scale:
        plan = replace(plan, tracks="sft")
    root = Path(tempfile.mkdtemp(prefix="arena-chaos-"))
    rng = random.Random(plan.seed)
    order = "beside" if args.quick else "then"
    console.print(f"chaos bench in {root}: clean run, {order} {plan.runs} run(s) x {plan.kills} kills")
    with ThreadPoolExecutor(max_workers=1) as side:
        # --quick: the clean run beside the chaos run (a smoke run's timings are not measurements)
        clean_pass = side.submit(clean_census, root / "clean", plan, rng) if args.quick else None
        if clean_pass is None:
            clean_run, clean = clean_census(root / "clean", plan, rng)
        runs: list[tuple[Path, RunResult, dict[str, Any]]] = []
        for index in range(plan.runs):
            home = root / f"chaos{index + 1}"
            console.print(f"chaos run {index + 1}/{plan.runs}")
            try:
                run = run_once(home, plan, chaos=True, rng=rng)
                runs.append((home, run, census(home)))
            finally:
                stop_stack(home)
        if clean_pass is not None:
            clean_run, clean = clean_pass.result()
    results: list[dict[str, Any]] = []
    for home, run, counted in runs:
        diff = compare(clean, counted)
        v = verdict(diff)
        ok = run.exit_code == 0 and clean_run.exit_code == 0 and not any(v.values())
        results.append(
            {
                "name": home.name,
                "exit_code": run.exit_code,
                "wall_s": run.wall_s,
                "kills": [asdict(k) for k in run.kills],
                "verdict": v,
                "ok": ok,
                "diff": diff,
            }
        )
    show(results)
    clean_topics = {
        name: {"records": t["records"], "keys": t["keys"], "duplicates": t["duplicates"]}
        for name, t in clean["topics"].items()
        if t["records"]
    }
    mean_wall = sum(r["wall_s"] for r in results) / max(1, len(results))
    report = {
        "quick": args.quick,
        "plan": asdict(plan),
        "scaled_sft_settings": SCALED_SFT if plan.scale else None,
        "clean": {
            "exit_code": clean_run.exit_code,
            "wall_s": clean_run.wall_s,
            "tool_docs": clean_run.tool_docs,
            "topics": clean_topics,
        },
        "runs": results,
        "ratio": round(mean_wall / clean_run.wall_s, 3) if clean_run.wall_s else None,
        "ok": clean_run.exit_code == 0 and all(r["ok"] for r in results),
    }
    if args.keep:
        console.print(f"homes kept under {root}")
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

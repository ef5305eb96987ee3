"""Sandbox benchmark: executions per second and latency of the warm pool vs a fresh interpreter.

Usage::

    python bench/sandbox_pool.py [--calls N] [--concurrency C] [--rows R] [--seed S]

Prints ONE JSON object on stdout; progress goes to stderr.

Both paths run the same N seeded programs, in the same run, C at a time. Each program has
the shape of an environment job (the execution contract of ``sandbox/env_runtime.py``): a
``DATA`` table of R rows decoded from JSON, a lookup tool over it and one call.

``pool``
    ``sandbox.SandboxPool`` with C warm slots: per call a pre-spawned worker (namespaces,
    read-only mounts, job dir already made) forks the job, drops to its uid, applies the
    rlimits and seccomp, runs it, reports JSON; the slot's next worker is then spawned in
    the background (that cost lands on the same 2 cores and is included).
``baseline``
    ``python -I -c PROGRAM`` per call via ``asyncio.create_subprocess_exec`` (no isolation at
    all: same uid, no limits), result printed as JSON on stdout.

Latency is per call, from submission to result; executions/s = N / wall time of the phase.
ratio = pool executions/s / baseline executions/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)


def programs(calls: int, rows: int, seed: int) -> list[tuple[str, Any]]:
    """(program, expected value) pairs: a lookup tool over a seeded table, one call each."""
    rng = random.Random(seed)
    table = [{"listing_id": f"L{i:04d}", "price": rng.randrange(100_000, 900_000)} for i in range(rows)]
    data = json.dumps({"get_listing_price": table})
    out = []
    for _ in range(calls):
        row = rng.choice(table)
        code = (
            "import json\n"
            f"DATA = json.loads({data!r})\n"
            "def get_listing_price(listing_id):\n"
            "    for r in DATA['get_listing_price']:\n"
            "        if r['listing_id'].casefold() == listing_id.casefold():\n"
            "            return {'listing_id': r['listing_id'], 'price': r['price']}\n"
            "    raise KeyError(listing_id)\n"
            f"get_listing_price(listing_id={row['listing_id']!r})\n"
        )
        out.append((code, {"listing_id": row["listing_id"], "price": row["price"]}))
    return out


def as_script(code: str) -> str:
    """The same program for a plain interpreter: print the trailing expression as JSON."""
    *body, last = code.rstrip("\n").split("\n")
    return "\n".join([*body, f"print(json.dumps({last}))"])


async def baseline_call(code: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", as_script(code), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"baseline call failed with status {proc.returncode}")
    return json.loads(out)


async def phase(
    name: str, call: Callable[[str], Awaitable[Any]], work: list[tuple[str, Any]], concurrency: int
) -> dict[str, Any]:
    """Run every program through ``call`` (``concurrency`` at a time); latencies and throughput."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    with Progress(
        TextColumn(f"{name:>8}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task(name, total=len(work))

        async def one(code: str, expected: Any) -> None:
            async with gate:
                start = time.perf_counter()
                value = await call(code)
                latencies.append(time.perf_counter() - start)
            if value != expected:
                raise RuntimeError(f"{name}: wrong value {value!r}, expected {expected!r}")
            progress.advance(task)

        start = time.perf_counter()
        await asyncio.gather(*(one(code, expected) for code, expected in work))
        wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "calls": len(work),
        "wall_s": round(wall, 3),
        "executions_per_s": round(len(work) / wall, 2),
        "latency_p50_ms": round(q[49] * 1000, 2),
        "latency_p99_ms": round(q[98] * 1000, 2),
    }


async def bench(calls: int, concurrency: int, rows: int, seed: int) -> dict[str, Any]:
    from arena.config import SandboxSettings
    from sandbox.pool import SandboxPool

    work = programs(calls, rows, seed)
    warmup = programs(5, rows, seed + 1)
    settings = SandboxSettings.model_validate({"pool_size": concurrency})
    async with SandboxPool(settings) as pool:

        async def pool_call(code: str) -> Any:
            result = await pool.run(code)
            if not result.ok:
                raise RuntimeError(f"pool call failed: {result.error}")
            return result.return_value

        await phase("warm-up", pool_call, warmup, concurrency)
        pooled = await phase("pool", pool_call, work, concurrency)
    await phase("warm-up", baseline_call, warmup, concurrency)
    baseline = await phase("baseline", baseline_call, work, concurrency)
    return {
        "benchmark": "sandbox",
        "params": {"calls": calls, "concurrency": concurrency, "rows": rows, "seed": seed},
        "pool": pooled,
        "baseline": baseline,
        "ratio_executions_per_s": round(pooled["executions_per_s"] / baseline["executions_per_s"], 3),
        "ratio_latency_p50": round(pooled["latency_p50_ms"] / baseline["latency_p50_ms"], 3),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "note": (
            "pool: SandboxPool with `concurrency` warm slots (fresh pid/net/mount/ipc/uts namespaces, read-only "
            "filesystem + private tmpfs, unprivileged uid, rlimits, seccomp; one job per process, the slot's next "
            "worker spawned in the background on the same cores, included). baseline: `python -I -c` per call, "
            "no isolation. Same seeded programs (JSON table + lookup tool + one call), same run; latency from "
            "submission to result; ratio = pool / baseline."
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200, help="programs per path (N)")
    parser.add_argument("--concurrency", type=int, default=2, help="calls in flight = pool slots (C)")
    parser.add_argument("--rows", type=int, default=50, help="rows in the tool's table (R)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the programs")
    args = parser.parse_args(argv)
    if args.calls < 2 or not 1 <= args.concurrency <= 64 or args.rows < 1:
        parser.error("--calls must be >= 2, --concurrency in [1, 64], --rows >= 1")
    if os.geteuid() != 0:
        console.print("[red]benchmark failed[/red]: the sandbox needs root")
        return 1
    result = asyncio.run(bench(args.calls, args.concurrency, args.rows, args.seed))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    raise SystemExit(main())

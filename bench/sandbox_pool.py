"""Sandbox benchmark: environment tool calls per second -- fresh interpreter, forked, session.

Usage::

    python bench/sandbox_pool.py [--calls N] [--concurrency C] [--instances I] [--home DIR] [--quick]

Prints ONE JSON object on stdout; progress goes to stderr.

The calls are the jobs of the demo's verified environments (``EnvPackage``: a ``DATA`` table,
lookup tools over it, and each job's invocation): by default the environment track runs
in-process on the demo's seeds (``rules`` backend, I QA instances per knowledge base) to make
them; ``--home`` reads them from a finished ``arena demo`` instead. N calls are drawn (seeded)
from all packages' jobs; every path runs the same N calls, C at a time, in the same run, and
every path must return the same values.

``fresh``    ``python -I -c PROGRAM`` per call (the execution contract's program: DATA decoded
             from JSON, the package code, the call), no isolation at all: the baseline.
``fork``     ``SandboxPool.run(PROGRAM)``: per call a session forked from the warm fork server
             (its own uid, pid/mount/ipc namespaces, /proc and /tmp, rlimits, seccomp), the
             program run in it, the session torn down; what RL paid per call before sessions,
             minus the interpreter start.
``session``  One session per package, opened and loaded once (DATA bound, code run), then each
             call is ``Session.call(tool, arguments)``: a message; the package stays in the
             session's memory between calls. Opening (and loading) is measured on its own as
             ``sessions_opened_per_s``.

The calls are split in 4 rounds and the three paths take turns on each round (fresh, fork,
session), so drift in the machine's speed during the run weighs on every path alike. Latency is
per call, from submission to result; calls/s = N / the path's summed wall time; the ratios are
calls/s of a path over the fresh baseline's, measured side by side.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import functools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from arena.records.envs import EnvPackage
    from sandbox.pool import SandboxPool, Session

console = Console(stderr=True)
ROUNDS = 4
"""The calls are run in this many rounds, the three paths taking turns on each (``interleaved``)."""


class Call:
    """One environment tool call: the package, the tool and its arguments, and its program."""

    def __init__(self, package: EnvPackage, tool: str, arguments: dict[str, Any], program: str) -> None:
        self.package = package
        self.tool = tool
        self.arguments = arguments
        self.program = program


def as_call(invocation: str) -> tuple[str, dict[str, Any]] | None:
    """(tool, keyword arguments) of ``tool(k=literal, ...)``; None for any other invocation."""
    try:
        node = ast.parse(invocation.strip(), mode="eval").body
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
            return None
        arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None}
    except (SyntaxError, ValueError):
        return None
    return (node.func.id, arguments) if len(arguments) == len(node.keywords) else None


def draw_calls(packages: list[EnvPackage], n: int, seed: int) -> list[Call]:
    """``n`` calls drawn (seeded, with replacement) from every package's jobs that are plain tool calls."""
    from sandbox.env_runtime import call_program

    pool = []
    for package in packages:
        for job in package.jobs:
            parsed = as_call(job.invocation)
            if parsed is not None:
                pool.append(Call(package, *parsed, call_program(package, *parsed)))
    if not pool:
        raise SystemExit("no verified environment has a job that is a plain tool call")
    rng = random.Random(seed)
    return [rng.choice(pool) for _ in range(n)]


async def demo_packages(instances: int) -> list[EnvPackage]:
    """The demo's verified environments: the environment track in-process on the demo's seeds."""
    from app.demo import demo_seeds
    from arena.config import ArenaSettings
    from bench.sft_stages import outputs, run_stage
    from streams import resources
    from streams.envs import envs_code, envs_verified, qa_traces, qa_validated
    from streams.runtime import StageDef

    plan: tuple[tuple[StageDef[Any], str], ...] = (
        (qa_traces.STAGE, "qa.traces"),
        (qa_validated.STAGE, "qa.validated"),
        (envs_code.STAGE, "envs.code"),
        (envs_verified.STAGE, "envs.verified"),
    )
    with tempfile.TemporaryDirectory() as tmp:
        settings = ArenaSettings(home=Path(tmp), llm="rules", envs={"demo_instances": instances})
        current: list[Any] = [(s.seed_id, s) for s in demo_seeds(settings)]
        with console.status("environment track (demo seeds, rules backend) ..."):
            for stage, produces in plan:
                emits, _wall = await run_stage(stage, current, settings)
                current = outputs(emits, produces)
        await resources.close_sandbox_pool(settings)
    return [record for _key, record in current]


def stored_packages(home: Path) -> list[EnvPackage]:
    """The verified environments of a finished ``arena demo`` in ``home``."""
    os.environ["ARENA_HOME"] = str(home)
    from arena.config import ArenaSettings
    from arena.records.envs import EnvPackage
    from lake.env_packages import EnvPackageStore

    store = EnvPackageStore(ArenaSettings().catalog)
    try:
        return [EnvPackage.model_validate_json(row.package) for row in store.rows()]
    finally:
        store.dispose()


def as_script(program: str) -> str:
    """The same program for a plain interpreter: print the trailing expression as JSON."""
    *body, last = program.rstrip("\n").split("\n")
    return "\n".join([*body, f"print(json.dumps({last}, default=repr))"])


async def fresh_call(call: Call) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", as_script(call.program), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"fresh call {call.tool} failed with status {proc.returncode}")
    return json.loads(out)


class PathRun:
    """One path's calls across the rounds: wall time, latencies and values (in call order)."""

    def __init__(self, name: str, run: Callable[[Call], Awaitable[Any]], calls: int) -> None:
        self.name = name
        self.run = run
        self.wall = 0.0
        self.latencies: list[float] = []
        self.values: list[Any] = [None] * calls

    def figures(self) -> dict[str, Any]:
        q = statistics.quantiles(self.latencies, n=100, method="inclusive")
        return {
            "calls": len(self.values),
            "wall_s": round(self.wall, 3),
            "calls_per_s": round(len(self.values) / self.wall, 2),
            "latency_p50_ms": round(q[49] * 1000, 3),
            "latency_p99_ms": round(q[98] * 1000, 3),
        }


async def phase(
    path: PathRun, work: list[tuple[int, Call]], concurrency: int, advance: Callable[[], None]
) -> None:
    """The calls ``work`` (index, call) through ``path``, ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int, call: Call) -> None:
        async with gate:
            start = time.perf_counter()
            path.values[i] = await path.run(call)
            path.latencies.append(time.perf_counter() - start)
        advance()

    start = time.perf_counter()
    await asyncio.gather(*(one(i, call) for i, call in work))
    path.wall += time.perf_counter() - start


async def interleaved(paths: list[PathRun], work: list[Call], concurrency: int, rounds: int) -> None:
    """Every path runs every call; the calls are split in ``rounds`` and the paths take turns on
    each, so a machine that gets faster or slower during the run weighs on all paths alike."""
    with Progress(
        TextColumn("{task.description:>8}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        tasks = {p.name: progress.add_task(p.name, total=len(work)) for p in paths}
        indexed = list(enumerate(work))
        for r in range(rounds):
            chunk = indexed[r::rounds]
            for path in paths:
                task = tasks[path.name]
                await phase(path, chunk, concurrency, functools.partial(progress.advance, task))


def _value(result: Any, what: str) -> Any:
    if not result.ok:
        raise RuntimeError(f"{what} failed: {result.error_type}: {result.error}")
    return result.return_value


async def open_sessions(
    pool: SandboxPool, packages: list[EnvPackage], concurrency: int
) -> tuple[dict[str, Session], dict[str, Any]]:
    """One loaded session per package (DATA bound, code run), ``concurrency`` opened at a time."""
    sessions: dict[str, Session] = {}
    gate = asyncio.Semaphore(concurrency)

    async def load(package: EnvPackage) -> None:
        async with gate:
            session = await pool.open_session()
            _value(await session.run(package.code, bind={"DATA": package.data}), f"loading {package.env_id}")
            sessions[package.env_id] = session

    start = time.perf_counter()
    await asyncio.gather(*(load(p) for p in packages))
    wall = time.perf_counter() - start
    return sessions, {
        "sessions": len(packages),
        "wall_s": round(wall, 3),
        "opened_per_s": round(len(packages) / wall, 2),
    }


async def bench(
    calls: int, concurrency: int, instances: int, seed: int, home: Path | None, rounds: int = ROUNDS
) -> dict[str, Any]:
    from arena.config import SandboxSettings
    from sandbox.pool import SandboxPool

    packages = stored_packages(home) if home else await demo_packages(instances)
    work = draw_calls(packages, calls, seed)
    used = list({c.package.env_id: c.package for c in work}.values())
    warmup = draw_calls(packages, 2 * concurrency, seed + 1)
    settings = SandboxSettings.model_validate({"pool_size": min(64, len(used) + concurrency)})
    async with SandboxPool(settings) as pool:

        async def fork_call(call: Call) -> Any:
            return _value(await pool.run(call.program), f"fork call {call.tool}")

        warm = [PathRun("warm-up", fork_call, len(warmup)), PathRun("warm-up", fresh_call, len(warmup))]
        for path in warm:
            await phase(path, list(enumerate(warmup)), concurrency, lambda: None)
        sessions, opened = await open_sessions(pool, used, concurrency)
        try:

            async def session_call(call: Call) -> Any:
                result = await sessions[call.package.env_id].call(call.tool, call.arguments)
                return _value(result, f"session call {call.tool}")

            paths = [PathRun("fresh", fresh_call, len(work)), PathRun("fork", fork_call, len(work))]
            paths.append(PathRun("session", session_call, len(work)))
            await interleaved(paths, work, concurrency, rounds)
        finally:
            await asyncio.gather(*(s.close() for s in sessions.values()))
    fresh_path, fork_path, session_path = paths
    for i, call in enumerate(work):
        if not fresh_path.values[i] == fork_path.values[i] == session_path.values[i]:
            raise RuntimeError(
                f"{call.tool}({call.arguments}) differs: fresh {fresh_path.values[i]!r}, "
                f"fork {fork_path.values[i]!r}, session {session_path.values[i]!r}"
            )
    fresh, forked, in_session = (p.figures() for p in paths)
    base = fresh["calls_per_s"]
    return {
        "benchmark": "sandbox",
        "params": {
            "calls": calls,
            "concurrency": concurrency,
            "instances": instances,
            "seed": seed,
            "rounds": rounds,
        },
        "environments": {
            "packages": len(packages),
            "used": len(used),
            "from": str(home) if home else "demo seeds",
        },
        "fresh_calls_per_s": base,
        "fork_calls_per_s": forked["calls_per_s"],
        "session_calls_per_s": in_session["calls_per_s"],
        "fork_vs_fresh": round(forked["calls_per_s"] / base, 2),
        "session_vs_fresh": round(in_session["calls_per_s"] / base, 2),
        "sessions_opened_per_s": opened["opened_per_s"],
        "fresh": fresh,
        "fork": forked,
        "session": in_session,
        "session_open": opened,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "note": (
            "Same seeded calls (jobs of the demo's verified environments) on every path, same run, same values. "
            "fresh: `python -I -c` per call, no isolation. fork: a session forked from the warm fork server per "
            "call (own uid and namespaces, rlimits, seccomp), torn down after. session: one loaded session per "
            "package, each call a message to it. Ratios: calls/s over fresh."
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=400, help="calls per path (N)")
    parser.add_argument("--concurrency", type=int, default=2, help="calls in flight (C)")
    parser.add_argument("--instances", type=int, default=8, help="demo QA instances per knowledge base (I)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the drawn calls")
    parser.add_argument("--home", type=Path, help="read the environments of a finished `arena demo` here")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 40 calls, 2 instances")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.instances = 40, 2
    if args.calls < 2 or not 1 <= args.concurrency <= 64 or args.instances < 1:
        parser.error("--calls must be >= 2, --concurrency in [1, 64], --instances >= 1")
    if os.geteuid() != 0:
        console.print("[red]benchmark failed[/red]: the sandbox needs root")
        return 1
    if args.home and not args.home.is_dir():
        parser.error(f"--home {args.home}: no such directory (fix: pass the ARENA_HOME of a finished demo)")
    result = asyncio.run(bench(args.calls, args.concurrency, args.instances, args.seed, args.home))
    print(json.dumps({"quick": args.quick, **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Environment-track throughput on the `rules` backend, handlers run in-process (no broker).

The demo's seeds (one per built-in knowledge base) go through every stage of
ASTRA §2.2 in order. Figures: verified packages per minute, and the share of
each stage's inputs dropped at each gate. The baseline, measured in the same
run, is the same pipeline with every sandbox execution in a fresh process
(`sandbox.run_once`) instead of the warm pool; `ratio` is warm over cold.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from pydantic import BaseModel

from app.demo import demo_seeds
from arena.config import ArenaSettings
from bench.sft_stages import outputs, run_stage
from sandbox import SandboxPool, SandboxResult, run_once
from sandbox.pool import Session
from streams import resources
from streams.envs import envs_code, envs_verified, qa_traces, qa_validated, samples_verified
from streams.runtime import Emit

PLAN = (
    (qa_traces.STAGE, "qa.traces"),
    (qa_validated.STAGE, "qa.validated"),
    (envs_code.STAGE, "envs.code"),
    (envs_verified.STAGE, "envs.verified"),
    (samples_verified.STAGE, "samples.verified"),
)


class ColdPool:
    """The baseline: the pool's interface, but a fresh sandbox process per execution or session."""

    def __init__(self, settings: ArenaSettings) -> None:
        self.settings = settings.sandbox

    async def start(self) -> None:
        return None

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> SandboxResult:
        return await run_once(code, self.settings, timeout_s=timeout_s, memory_mb=memory_mb)

    async def open_session(
        self, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> ColdSession:
        """A session in a one-slot pool of its own: a fresh fork server (interpreter) per session."""
        pool = SandboxPool(self.settings.model_copy(update={"pool_size": 1}))
        try:
            session = await pool.open_session(timeout_s=timeout_s, memory_mb=memory_mb)
        except BaseException:
            await pool.close()
            raise
        return ColdSession(pool, session)

    async def close(self) -> None:
        return None


class ColdSession:
    """A session that closes its own pool with it (``ColdPool.open_session``)."""

    def __init__(self, pool: SandboxPool, session: Session) -> None:
        self._pool = pool
        self._session = session

    @property
    def alive(self) -> bool:
        return self._session.alive

    async def run(
        self,
        source: str,
        *,
        bind: dict[str, Any] | None = None,
        space: str = "main",
        commit: bool = True,
        timeout_s: float | None = None,
    ) -> SandboxResult:
        return await self._session.run(source, bind=bind, space=space, commit=commit, timeout_s=timeout_s)

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        space: str = "main",
        commit: bool = True,
        timeout_s: float | None = None,
    ) -> SandboxResult:
        return await self._session.call(tool, arguments, space=space, commit=commit, timeout_s=timeout_s)

    async def read(self, name: str, *, space: str = "main") -> SandboxResult:
        return await self._session.read(name, space=space)

    async def close(self) -> None:
        try:
            await self._session.close()
        finally:
            await self._pool.close()


def gate_shares(records_in: int, emits: list[Emit]) -> dict[str, float]:
    """Share of a stage's inputs dropped per gate (rejected) or dead-lettered (by kind)."""
    drops: Counter[str] = Counter()
    for e in emits:
        if e.topic.endswith(".rejected"):
            drops[f"rejected:{getattr(e.value, 'gate', '?')}"] += 1
        elif e.topic.endswith(".dlq"):
            drops[f"dlq:{getattr(e.value, 'kind', '?')}"] += 1
    return {gate: round(n / records_in, 3) for gate, n in sorted(drops.items())} if records_in else {}


async def pipeline(settings: ArenaSettings, cold: bool) -> dict[str, Any]:
    if cold:
        resources.use_sandbox_pool(settings, ColdPool(settings))
    current: list[tuple[str, BaseModel]] = [(s.seed_id, s) for s in demo_seeds(settings)]
    stages: dict[str, Any] = {}
    total = 0.0
    for stage, produces in PLAN:
        emits, wall = await run_stage(stage, current, settings)
        total += wall
        nxt = outputs(emits, produces)
        stages[stage.name] = {
            "records_in": len(current),
            "records_out": len(nxt),
            "seconds": round(wall, 3),
            "dropped_share": gate_shares(len(current), emits),
        }
        current = nxt
    verified = stages["envs-verified"]["records_out"]
    await resources.close_sandbox_pool(settings)
    return {
        "stages": stages,
        "verified_packages": verified,
        "seconds": round(total, 3),
        "packages_per_minute": round(60 * verified / total, 2) if total else 0.0,
    }


async def figures(instances: int = 8, quick: bool = False) -> dict[str, Any]:
    runs = {}
    for mode in ("warm_pool", "fresh_process"):
        with tempfile.TemporaryDirectory() as tmp:
            settings = ArenaSettings(home=Path(tmp), llm="rules", envs={"demo_instances": instances})
            started = time.perf_counter()
            runs[mode] = await pipeline(settings, cold=mode == "fresh_process")
            runs[mode]["wall_s"] = round(time.perf_counter() - started, 3)
    warm, cold = runs["warm_pool"]["packages_per_minute"], runs["fresh_process"]["packages_per_minute"]
    return {
        "backend": "rules",
        "quick": quick,
        "seeds": "one per built-in knowledge base",
        "instances_per_seed": instances,
        **runs,
        "ratio_packages_per_minute_warm_over_fresh": round(warm / cold, 2) if cold else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--instances", type=int, default=8, help="demo QA instances per knowledge base")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run (1 instance per seed): not a measurement"
    )
    args = parser.parse_args(argv)
    if args.instances < 1:
        parser.error("--instances must be >= 1")
    instances = 1 if args.quick else args.instances
    print(json.dumps(asyncio.run(figures(instances, quick=args.quick)), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

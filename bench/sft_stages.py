"""SFT-track stage throughput on the `rules` backend, handlers run in-process (no broker).

Each stage's handler runs over every output of the stage before it, starting
from the bundled doc-only sample servers, so the figures are the stages' own
cost (LLM gateway with its cache, emulator, judges) without Kafka. The
end-to-end rate is sample servers in over the summed stage time.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from pydantic import BaseModel

from app.demo import sample_tools_dir
from arena.config import ArenaSettings
from arena.topics import topic
from producers.publish_tools import raw_key
from producers.tool_docs import load_tool_docs
from streams.runtime import Context, Emit, StageDef, run_handler
from streams.sft import chains, samples_sft, tasks, trajectories, trajectories_scored
from streams.tools import tools_servers


async def run_stage(
    stage: StageDef, inputs: list[tuple[str, BaseModel]], settings: ArenaSettings
) -> tuple[list[Emit], float]:
    """Every input through ``stage.handler``; returns all emits and the wall time."""
    spec = topic(stage.input)
    out: list[Emit] = []
    started = time.perf_counter()
    for key, record in inputs:
        raw = record.model_dump_json().encode()
        ctx = Context(stage.name, stage.version, spec, key, settings, raw)
        out += await run_handler(stage, record, ctx, raw)
    return out, time.perf_counter() - started


def outputs(emits: list[Emit], name: str) -> list[tuple[str, BaseModel]]:
    return [(e.key, e.value) for e in emits if e.topic == name]


def figures(records_in: int, emits: list[Emit], produces: str, wall: float) -> dict[str, float]:
    """One stage's row: records in and out, side-topic records, time and rate."""
    return {
        "records_in": records_in,
        "records_out": len(outputs(emits, produces)),
        "side_records": sum(1 for e in emits if e.topic != produces),
        "seconds": round(wall, 3),
        "records_per_s": round(records_in / wall, 2) if wall else 0.0,
    }


async def stage_figures(home: Path | None = None, limit: int | None = None) -> dict[str, Any]:
    """Figures of every SFT stage; ``limit`` (a smoke run) caps the tool docs and each stage's inputs."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = ArenaSettings(home=home or Path(tmp), llm="rules")
        loaded = load_tool_docs([sample_tools_dir() / "good"])
        docs = loaded.servers[:limit]
        current: list[tuple[str, BaseModel]] = [(raw_key(s), s) for s in docs]
        plan: list[tuple[StageDef[Any], str]] = [
            (tools_servers.STAGE, "tools.servers"),
            (chains.STAGE, "chains"),
            (tasks.CHAIN_STAGE, "tasks"),
            (trajectories.STAGE, "trajectories"),
            (trajectories_scored.STAGE, "trajectories.scored"),
            (samples_sft.STAGE, "samples.sft"),
        ]
        servers: list[tuple[str, BaseModel]] = []
        per_stage: dict[str, dict[str, float]] = {}
        total_s = 0.0
        for stage, produces in plan:
            current = current[:limit]
            emits, wall = await run_stage(stage, current, settings)
            total_s += wall
            per_stage[stage.name] = figures(len(current), emits, produces, wall)
            current = outputs(emits, produces)
            if stage is tools_servers.STAGE:
                servers = current
        emits, wall = await run_stage(tasks.SERVER_STAGE, servers, settings)
        per_stage[tasks.SERVER_STAGE.name] = figures(len(servers), emits, "tasks", wall)
        return {
            "backend": "rules",
            "stages": per_stage,
            "end_to_end": {
                "tool_docs": len(docs),
                "samples_sft": len(current),
                "seconds": round(total_s, 3),
                "tool_docs_per_s": round(len(docs) / total_s, 3) if total_s else 0.0,
            },
        }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(stage_figures()), indent=2))

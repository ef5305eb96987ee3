"""Every worker Arena can run: the stages plus the sinks that consume topics.

``arena worker --stage NAME`` looks names up here; each worker is its own
Faust app, so its own consumer group (``arena-<name>``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import faust

from arena.config import ArenaSettings
from arena.topics import TOPICS
from consumers import tool_indexer
from streams.app import attach_stage
from streams.eigen import (
    eigen_dialogs,
    eigen_dialogs_validated,
    eigen_intents,
    eigen_tasks,
    eigen_verified,
)
from streams.envs import envs_code, envs_verified, qa_traces, qa_validated, samples_verified
from streams.runtime import Guarantee, StageDef
from streams.sft import chains, samples_sft, tasks, tools_servers, trajectories, trajectories_scored


@dataclass(frozen=True)
class WorkerDef:
    name: str
    inputs: tuple[str, ...]
    guarantee: Guarantee
    attach: Callable[[faust.App, ArenaSettings], None]
    description: str

    @property
    def group(self) -> str:
        return f"arena-{self.name}"


def _stage_worker(stage: StageDef) -> WorkerDef:
    def attach(app: faust.App, settings: ArenaSettings) -> None:
        attach_stage(app, stage, settings)

    return WorkerDef(stage.name, (stage.input,), stage.guarantee, attach, stage.description)


STAGES: tuple[StageDef, ...] = (
    tools_servers.STAGE,
    tool_indexer.STAGE,
    chains.STAGE,
    tasks.CHAIN_STAGE,
    tasks.SERVER_STAGE,
    trajectories.STAGE,
    trajectories_scored.STAGE,
    samples_sft.STAGE,
    qa_traces.STAGE,
    qa_validated.STAGE,
    envs_code.STAGE,
    envs_verified.STAGE,
    samples_verified.STAGE,
    eigen_intents.STAGE,
    eigen_tasks.STAGE,
    eigen_dialogs.STAGE,
    eigen_dialogs_validated.STAGE,
    eigen_verified.STAGE,
)


def _attach_lake_sink(app: faust.App, settings: ArenaSettings) -> None:
    # Imported here: the Parquet writer (pyarrow.dataset, ~1 s) is only the sink worker's cost.
    from consumers.lake_sink import attach_lake_sink

    attach_lake_sink(app, settings)


WORKERS: dict[str, WorkerDef] = {
    **{stage.name: _stage_worker(stage) for stage in STAGES},
    "lake-sink": WorkerDef(
        "lake-sink",
        tuple(TOPICS),
        "at_least_once",
        _attach_lake_sink,
        "persist every topic to Parquet in the lake (idempotent by key)",
    ),
}


def worker(name: str) -> WorkerDef:
    try:
        return WORKERS[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; known: {', '.join(WORKERS)}") from None


def topics_by_group(names: list[str]) -> dict[str, list[str]]:
    """Input topics per consumer group, for lag and drain checks."""
    return {worker(n).group: list(worker(n).inputs) for n in names}

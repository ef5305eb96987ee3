"""The topic registry: every topic Arena uses, declared once.

Each stage topic has two side topics: ``<topic>.dlq`` for input the consuming
stage could not process (value: ``DeadLetter``) and ``<topic>.rejected`` for
records a quality gate dropped (value: ``Rejection``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from arena.records.common import DeadLetter, LedgerEntry, Rejection
from arena.records.eigen import (
    EigenDialog,
    EigenIntent,
    EigenSeed,
    EigenTask,
    EigenValidated,
    EigenVerified,
    PilotMetrics,
)
from arena.records.envs import EnvPackage, QaSeed, QaTrace, VerifiedSample
from arena.records.llm import LlmUsage
from arena.records.sft import ScoredTrajectory, SftSample, Task, ToolChain, Trajectory
from arena.records.tools import RawToolServer, ToolServer
from arena.records.trainer import TrainerMetrics

DAY_MS = 24 * 3600 * 1000
WEEK_MS = 7 * DAY_MS
FOREVER = -1


@dataclass(frozen=True)
class TopicSpec:
    """One Kafka topic: how it is created and what its records look like."""

    name: str
    partitions: int
    key: str
    """What the record key is (always a content hash, so consumers are idempotent)."""
    value: type[BaseModel]
    retention_ms: int = WEEK_MS
    side_of: str | None = None
    """For a .dlq/.rejected topic: the topic it is a side topic of."""

    @property
    def table(self) -> str:
        """Lake view name: dots become underscores (``tools.raw.dlq`` -> ``tools_raw_dlq``)."""
        return self.name.replace(".", "_")

    @property
    def dlq(self) -> str:
        return f"{self.name}.dlq"

    @property
    def rejected(self) -> str:
        return f"{self.name}.rejected"

    def configs(self) -> dict[str, str]:
        return {"retention.ms": str(self.retention_ms), "cleanup.policy": "delete"}


_STAGE_TOPICS: tuple[TopicSpec, ...] = (
    # SFT track (ASTRA 2.1)
    TopicSpec("tools.raw", 4, "hash of the raw server record", RawToolServer, FOREVER),
    TopicSpec("tools.servers", 4, "server_id", ToolServer, FOREVER),
    TopicSpec("chains", 4, "chain_id", ToolChain),
    TopicSpec("tasks", 4, "task_id", Task),
    TopicSpec("trajectories", 4, "trajectory_id", Trajectory),
    TopicSpec("trajectories.scored", 4, "hash of trajectory_id (scored-...)", ScoredTrajectory),
    TopicSpec("samples.sft", 4, "sample_id", SftSample, FOREVER),
    # Environment track (ASTRA 2.2)
    TopicSpec("qa.seeds", 4, "seed_id", QaSeed, FOREVER),
    TopicSpec("qa.traces", 4, "qa_id", QaTrace),
    TopicSpec("qa.validated", 4, "hash of qa_id (qav-...)", QaTrace),
    TopicSpec("envs.code", 4, "env_id", EnvPackage),
    TopicSpec("envs.verified", 4, "env_id", EnvPackage, FOREVER),
    TopicSpec("samples.verified", 4, "sample_id", VerifiedSample, FOREVER),
    # EigenData track
    TopicSpec("eigen.seeds", 4, "item_id", EigenSeed, FOREVER),
    TopicSpec("eigen.intents", 4, "item_id", EigenIntent),
    TopicSpec("eigen.tasks", 4, "item_id", EigenTask),
    TopicSpec("eigen.dialogs", 4, "item_id", EigenDialog),
    TopicSpec("eigen.dialogs.validated", 4, "item_id", EigenValidated),
    TopicSpec("eigen.verified", 4, "item_id", EigenVerified, FOREVER),
    TopicSpec("eigen.pilot.metrics", 1, "content hash of the record", PilotMetrics),
    # Trainer
    TopicSpec("trainer.metrics", 1, "hash of run id + step", TrainerMetrics),
    # LLM accounting: every stage worker reports its calls per role (streams/usage.py)
    TopicSpec("llm.usage", 1, "hash of stage + role + pid + window end", LlmUsage, FOREVER),
    # Accounting: one entry per input record each stage handled, in the record's transaction
    TopicSpec("stages.ledger", 4, "hash of stage + input topic, partition and offset", LedgerEntry, FOREVER),
)


SIDE_PARTITIONS = 1
"""Side topics are low-volume; one partition keeps the broker's partition count small."""


def _side_topics(spec: TopicSpec) -> tuple[TopicSpec, TopicSpec]:
    return (
        TopicSpec(
            spec.dlq, SIDE_PARTITIONS, "hash of the raw input + reason", DeadLetter, FOREVER, spec.name
        ),
        TopicSpec(
            spec.rejected,
            SIDE_PARTITIONS,
            "hash of source key + gate + subject",
            Rejection,
            FOREVER,
            spec.name,
        ),
    )


def _build_registry() -> dict[str, TopicSpec]:
    registry: dict[str, TopicSpec] = {}
    for spec in _STAGE_TOPICS:
        registry[spec.name] = spec
        for side in _side_topics(spec):
            registry[side.name] = side
    return registry


TOPICS: dict[str, TopicSpec] = _build_registry()


def topic(name: str) -> TopicSpec:
    """Look up a topic by name; a typo fails loudly with the known names."""
    try:
        return TOPICS[name]
    except KeyError:
        raise KeyError(f"unknown topic {name!r}; known: {', '.join(sorted(TOPICS))}") from None


def by_table(table: str) -> TopicSpec:
    for spec in TOPICS.values():
        if spec.table == table:
            return spec
    raise KeyError(f"no topic has lake view {table!r}")

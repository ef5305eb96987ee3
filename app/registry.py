"""Every worker Arena can run: the stages plus the sinks that consume topics.

``arena worker --stage NAME`` (or ``--track NAME``, ``TRACKS``) looks names up here; each worker is its own
Faust app, so its own consumer group (``arena-<name>``). ``topic_roles()`` says
who writes and who reads each topic: the workers, plus the commands outside
the worker registry (publishers, the trainer) declared in ``CLIENTS``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arena.config import ArenaSettings
from arena.topics import TOPICS, topic
from arena.versions import MAIN, VersionSpec, split_worker, wire, worker_name
from streams.runtime import LEDGER_TOPIC, Guarantee, StageDef
from streams.tracks import Track, depths, tracks

if TYPE_CHECKING:  # Faust and the stage runtime are a worker process's cost, not a CLI command's
    import faust

USAGE_TOPIC = topic("llm.usage").name
"""Every stage worker reports its LLM usage here (``streams.usage``)."""


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


def _stage_worker(stage: StageDef[Any], version: str = MAIN) -> WorkerDef:
    def attach(app: faust.App, settings: ArenaSettings) -> None:
        from streams.app import attach_stage

        attach_stage(app, stage, settings, priority=stage_priorities()[stage.name], version=version)

    return WorkerDef(
        worker_name(stage.name, version),
        (wire(stage.input, version),),
        stage.guarantee,
        attach,
        stage.description,
    )


TRACKS: tuple[Track, ...] = tracks()
"""Every track and its stages (``streams/<track>/``; a stage is registered by living there)."""

STAGES: tuple[StageDef[Any], ...] = tuple(stage for track in TRACKS for stage in track.stages)


def stage_priorities() -> dict[str, int]:
    """Each stage's depth in the topic graph: its admission priority (``streams.tracks.depths``)."""
    return depths(STAGES)


def _attach_lake_sink(app: faust.App, settings: ArenaSettings) -> None:
    # Imported here: the Parquet writer (pyarrow.dataset, ~1 s) is only the sink worker's cost.
    from consumers.lake_sink import attach_lake_sink

    attach_lake_sink(app, settings)


def _version_lake_sink(spec: VersionSpec) -> WorkerDef:
    topics = tuple(wire(name, spec.name) for name in spec.topics)

    def attach(app: faust.App, settings: ArenaSettings) -> None:
        from consumers.lake_sink import attach_lake_sink

        attach_lake_sink(app, settings, topics=topics)

    return WorkerDef(
        worker_name("lake-sink", spec.name),
        topics,
        "at_least_once",
        attach,
        f"persist data version {spec.name}'s topics to its lake folder",
    )


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


def version_workers(spec: VersionSpec) -> dict[str, WorkerDef]:
    """The workers of data version ``spec``: its stages (``<stage>@<version>``) and its lake sink.

    They read and write the version's own topics only (``arena.versions.wire``).
    """
    by_name = {stage.name: stage for stage in STAGES}
    defs = [_stage_worker(by_name[name], spec.name) for name in spec.stages if name in by_name]
    return {d.name: d for d in [*defs, _version_lake_sink(spec)]}


def register_versions(specs: Iterable[VersionSpec]) -> list[str]:
    """Add the workers of each data version to ``WORKERS``; returns their names.

    A version's workers exist only once its spec is known (the catalog holds it): ``arena worker``
    and a worker process (``app.run``) register the versions they run before looking names up.
    """
    names: list[str] = []
    for spec in specs:
        defs = version_workers(spec)
        WORKERS.update(defs)
        names.extend(defs)
    return names


def worker(name: str) -> WorkerDef:
    try:
        return WORKERS[name]
    except KeyError:
        raise KeyError(f"unknown stage {name!r}; known: {', '.join(WORKERS)}") from None


def stage_inputs(names: list[str]) -> dict[str, str]:
    """The input topic of each of ``names`` that is a stage (they write ``stages.ledger``).

    A versioned stage (``<stage>@<version>``) reads its version's copy of the topic.
    """
    inputs = {stage.name: stage.input for stage in STAGES}
    found: dict[str, str] = {}
    for name in names:
        base, version = split_worker(name)
        if base in inputs:
            found[name] = wire(inputs[base], version)
    return found


def stage_outputs(names: list[str]) -> list[str]:
    """Every topic the stages among ``names`` may write: their outputs, side topics, the ledger and
    the LLM-usage topic (a versioned stage's: its version's copies)."""
    by_name = {stage.name: stage for stage in STAGES}
    found: set[str] = set()
    for name in names:
        base, version = split_worker(name)
        if base in by_name:
            found.update(wire(t, version) for t in (*by_name[base].may_emit, LEDGER_TOPIC, USAGE_TOPIC))
    return sorted(found)


def topics_by_group(names: list[str]) -> dict[str, list[str]]:
    """Input topics per consumer group, for lag and drain checks."""
    return {worker(n).group: list(worker(n).inputs) for n in names}


@dataclass(frozen=True)
class Client:
    """A command outside the worker registry that writes or reads topics (declared, not imported)."""

    name: str
    writes: tuple[str, ...]
    reads: tuple[str, ...] = ()


CLIENTS: tuple[Client, ...] = (
    # producers/publish_tools.py: the servers, and files that do not load as dead letters
    Client("arena publish tools", writes=("tools.raw", "tools.raw.dlq")),
    Client("arena publish mcp", writes=("tools.raw",)),
    Client("arena publish qa", writes=("qa.seeds",)),
    # producers/publish_domain.py: phase-2 pilot metrics, phase-3 seeds
    Client("arena publish domain", writes=("eigen.seeds", "eigen.pilot.metrics")),
    # trainer/service.py + trainer/samples_source.py: a sample that does not decode goes to <topic>.dlq
    # consumers/ledger.py: `arena worker --until-drained` checks every consumed record has an outcome
    Client("arena worker", writes=(), reads=("stages.ledger",)),
    Client(
        "arena train",
        writes=("trainer.metrics", "samples.sft.dlq", "samples.verified.dlq"),
        reads=("samples.sft", "samples.verified"),
    ),
)
"""Writers and readers that are not workers (``WORKERS``), by command name."""


@dataclass(frozen=True)
class TopicRoles:
    """Who writes a topic and who reads it: worker names and ``CLIENTS`` names, sorted."""

    writers: tuple[str, ...]
    readers: tuple[str, ...]


def topic_roles() -> dict[str, TopicRoles]:
    """Writers and readers of every topic of the registry, in registry order.

    A stage writes what it may emit (``StageDef.may_emit``: its outputs, its input's .dlq and
    .rejected, its outputs' .rejected); a worker reads its inputs (the lake sink reads every
    topic); ``CLIENTS`` add the publishers and the trainer.
    """
    writers: dict[str, set[str]] = {name: set() for name in TOPICS}
    readers: dict[str, set[str]] = {name: set() for name in TOPICS}
    for stage in STAGES:
        # every stage worker reports its LLM usage and writes the ledger entry of each input record
        for name in (*stage.may_emit, USAGE_TOPIC, LEDGER_TOPIC):
            writers[name].add(stage.name)
    for work in WORKERS.values():
        for name in work.inputs:
            readers[name].add(work.name)
    for client in CLIENTS:
        for name in client.writes:
            writers[topic(name).name].add(client.name)
        for name in client.reads:
            readers[topic(name).name].add(client.name)
    return {name: TopicRoles(tuple(sorted(writers[name])), tuple(sorted(readers[name]))) for name in TOPICS}

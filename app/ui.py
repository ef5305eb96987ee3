"""`arena ui`: a dashboard on localhost, a static page over a small JSON API (starlette + uvicorn).

The page (``app/ui_static/``: one HTML file, one vanilla JS file, one CSS file; no build step, no
CDN) polls the API about once a second:

- ``GET /api/graph``: the stage graph. Nodes are topics (plus sinks that write no topic), edges
  are workers reading topic A and writing topic B, derived from the worker registry
  (``app.registry``) and the trainer. Each edge has its consumer group's lag on A in data records
  (the numbers `arena lag` shows, from ``consumers.lag.compute_lag``; transaction markers are not
  records), whether the group is idle (never ran), and its throughput: data records/s consumed,
  exponentially weighted over ``RATE_WINDOW_S``. A topic node has its data records
  (``consumers.record_count``) and their rate the same way. ``groups`` lists every consumer group
  the cluster knows, registered or not.
- ``GET /api/stages``: every stage's ledger, as `arena stages --json` prints it
  (``consumers.ledger.stage_ledgers``): input records by outcome, outputs, rejections by gate, dead
  letters by kind, and ``balanced``; read again at most every ``STAGES_CACHE_S``.
- ``GET /api/dlq`` (``?topic=``, ``?reason=``) and ``POST /api/dlq/replay`` ``{keys, force}`` (or
  ``{topic, reason, force}``): dead letters with their history, and the replay of exactly the
  letters selected (``consumers.dlq``).
- ``GET /api/lake/tables`` and ``POST /api/lake/query`` ``{sql, limit}``: the lake's views with
  row counts (the live pipeline's, version main; other data versions' apart), and one read-only
  DuckDB statement (``lake.query``) with its first rows. Every view holds every data version's rows:
  its ``_version`` column says whose, so the page's own queries filter ``_version = 'main'``.
- ``GET /api/versions``: every data version, main first (a pseudo-entry: the live pipeline), then
  the catalog's (``app.versions.data_versions``) with their specs, each with its progress from the
  lag sample the graph uses (``consumers.lag.version_progress``: groups, pending, read).
- ``GET /api/diff?a=&b=`` (``&stage=``, ``&examples=``): two data versions compared stage by stage,
  as `arena diff --json` prints it (``consumers.version_diff.compare``).
- ``GET /api/training``: per-run step series of ``trainer.metrics`` (loss, reward, ...), read
  from the topic as the trainer publishes them.
- ``GET /api/trace/{record_id}``: a record's lineage (``lake.trace``).

Errors are JSON ``{"error": message}`` with a 4xx/5xx status: the message says what is wrong and
how to fix it. The server binds loopback by default and, when it does, answers only requests
whose Host is a loopback name (no DNS rebinding). Every request that is not a GET, HEAD or
OPTIONS needs the token of this start in ``X-Arena-Token`` (403 without it; random per start
unless ``--token`` is given, and required for a non-loopback ``--host``); the page gets it
embedded. Writes also need ``Content-Type: application/json`` (no cross-site form posts). Query
results are capped in rows and in bytes.
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
import math
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from app.ledger_metrics import LedgerCollector
from app.registry import STAGES, version_workers
from arena.config import ArenaSettings
from arena.versions import MAIN, InputRange, VersionNameError, VersionSpec, check_name
from streams import read_committed

if TYPE_CHECKING:
    from consumers.version_diff import VersionDiff

log = logging.getLogger("arena.ui")

STATIC = Path(__file__).with_name("ui_static")
"""The page's files (package data of ``app``)."""

LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]
TRAINER_TOPIC = "trainer.metrics"
DEFAULT_ROW_LIMIT = 500
MAX_ROW_LIMIT = 5_000
MAX_RESULT_BYTES = 2 * 1024 * 1024
"""JSON bytes of result rows at most: one wide row (a whole trajectory) must not make a 50 MB answer."""
RATE_WINDOW_S = 30.0
"""Time constant of the records/s averages: bursty stages read steadily instead of mostly 0.0."""
STAGES_CACHE_S = 5.0
"""The stage ledgers read every input topic and stages.ledger: at most once per this many seconds."""
VERSIONS_CACHE_S = 5.0
"""The data versions are read from the catalog at most once per this many seconds."""
MAX_DIFF_EXAMPLES = 50
TOKEN_HEADER = "X-Arena-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MIN_TOKEN_CHARS = 16
TOKEN_PLACEHOLDER = '<meta name="arena-token" content="">'
QUERY_TIMEOUT_S = 30.0
READ_ONLY_STATEMENTS = ("SELECT", "EXPLAIN")
"""DuckDB statement types the query box runs (SELECT covers WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE)."""


class UiError(Exception):
    """A request the user can fix; answered with status 400 and the message."""


# --- API models -------------------------------------------------------------------------------


class GraphNode(BaseModel):
    """A topic of the stage graph, or a sink (a worker that writes no topic)."""

    id: Annotated[str, Field(description="Topic name, or the sink worker's name.")]
    kind: Annotated[Literal["topic", "sink"], Field(description="What the node is.")]
    depth: Annotated[int, Field(description="Row of the layout: longest path from a source topic.")]
    end: Annotated[
        int | None,
        Field(description="Sum of read_committed end offsets (markers included); None if unsampled."),
    ]
    records: Annotated[
        int | None, Field(description="Data records in the topic (no markers); None if unsampled.")
    ]
    records_complete: Annotated[
        bool, Field(description="False: counting goes on, records is a lower bound.")
    ] = True
    rate: Annotated[
        float | None,
        Field(description=f"Data records/s appended, exponentially weighted over {RATE_WINDOW_S:g} s."),
    ]
    idle: Annotated[
        bool,
        Field(description="Every worker writing this node is idle (its group never ran); False for sources."),
    ] = False


class GraphEdge(BaseModel):
    """A worker reading ``source`` and writing ``target``, with its group's lag on ``source``."""

    id: Annotated[str, Field(description="Stable id: worker:source->target.")]
    worker: Annotated[str, Field(description="Worker (stage) name, or 'trainer'.")]
    group: Annotated[str, Field(description="Consumer group the worker commits under.")]
    source: Annotated[str, Field(description="Topic read.")]
    target: Annotated[str, Field(description="Topic written (or the sink node's id).")]
    lag: Annotated[
        int | None, Field(description="Data records still to read, summed over partitions (as `arena lag`).")
    ]
    pending: Annotated[int | None, Field(description="The same count as lag.")]
    offset_lag: Annotated[int | None, Field(description="end - committed offsets, markers included.")] = None
    pending_capped: Annotated[bool, Field(description="lag is a lower bound.")] = False
    idle: Annotated[bool, Field(description="The group never ran (no commit, no live member).")] = False
    throughput: Annotated[
        float | None,
        Field(
            description=f"Data records/s the group consumed, exponentially weighted over {RATE_WINDOW_S:g} s."
        ),
    ]


class GroupLag(BaseModel):
    """One consumer group on one topic, partitions summed."""

    group: Annotated[str, Field(description="Consumer group id.")]
    topic: Annotated[str, Field(description="Topic.")]
    committed: Annotated[
        int | None, Field(description="Sum of committed offsets; None when nothing committed.")
    ]
    end: Annotated[int, Field(description="Sum of read_committed end offsets.")]
    lag: Annotated[int, Field(description="Data records still to read, summed over partitions.")]
    pending: Annotated[int, Field(description="The same count as lag.")]
    offset_lag: Annotated[int, Field(description="end - committed offsets, summed (markers included).")]
    pending_capped: Annotated[bool, Field(description="Some partition's lag is a lower bound.")]
    idle: Annotated[bool, Field(description="The group never ran (no commit, no live member).")]
    throughput: Annotated[
        float | None,
        Field(description=f"Data records/s consumed, exponentially weighted over {RATE_WINDOW_S:g} s."),
    ]
    worker: Annotated[str | None, Field(description="The registered worker of this group, if any.")]


class GraphView(BaseModel):
    """``GET /api/graph``."""

    nodes: list[GraphNode]
    edges: list[GraphEdge]
    groups: list[GroupLag]
    sampled_at: Annotated[datetime, Field(description="When the lag sample was taken (UTC).")]
    interval_s: Annotated[float | None, Field(description="Seconds between the last two samples.")]
    rate_window_s: Annotated[float, Field(description="Time constant of the records/s averages.")] = (
        RATE_WINDOW_S
    )


class LakeTable(BaseModel):
    """One view of the lake (one per registered topic)."""

    view: Annotated[str, Field(description="SQL view name (dots as underscores).")]
    topic: Annotated[str, Field(description="Topic the view reads.")]
    files: Annotated[int, Field(description="Parquet files of the live pipeline (version main).")]
    rows: Annotated[
        int, Field(description="Rows of the live pipeline (version main), from the Parquet footers.")
    ]
    bytes: Annotated[int, Field(description="Bytes on the store (version main).")]
    version_rows: Annotated[
        dict[str, int],
        Field(
            description="Rows of each other data version that has this topic in the lake: the view "
            "holds them too, told apart by its _version column."
        ),
    ] = Field(default_factory=dict)


class QueryRequest(BaseModel):
    """``POST /api/lake/query``."""

    sql: Annotated[str, Field(min_length=1, max_length=20_000, description="One read-only DuckDB statement.")]
    limit: Annotated[
        int, Field(ge=1, le=MAX_ROW_LIMIT, description="Rows returned at most (the rest is cut).")
    ] = DEFAULT_ROW_LIMIT


class QueryResult(BaseModel):
    """The first rows of a query, cut at ``limit`` rows or ``MAX_RESULT_BYTES``, whichever comes first."""

    columns: Annotated[list[str], Field(description="Column names, in order.")]
    rows: Annotated[list[list[Any]], Field(description="Rows as JSON values, at most ``limit``.")]
    truncated: Annotated[bool, Field(description="The query had more rows than were returned.")]
    cut_by: Annotated[
        Literal["rows", "bytes"] | None,
        Field(description="What cut the rows: the row limit, the byte cap; None when all came."),
    ] = None
    bytes: Annotated[int, Field(description="JSON size of the returned rows.")] = 0
    max_bytes: Annotated[int, Field(description="The byte cap on the rows.")] = MAX_RESULT_BYTES
    note: Annotated[
        str | None, Field(description="Why rows were cut and how to see more; None when not cut.")
    ] = None
    elapsed_ms: Annotated[float, Field(description="Time the query took.")]


class ReplayRequest(BaseModel):
    """``POST /api/dlq/replay``: the letters to replay, by key, or by topic and reason."""

    keys: Annotated[
        list[str] | None,
        Field(min_length=1, description="Keys of the letters to replay (the rows selected)."),
    ] = None
    topic: Annotated[
        str | None, Field(min_length=1, description="Dead-letter topic (<topic>.dlq): all its letters.")
    ] = None
    reason: Annotated[str | None, Field(description="Only dead letters with this reason; all when None.")] = (
        None
    )
    force: Annotated[
        bool, Field(description="Replay failures replayed before too (the 'replay again' button).")
    ] = False


class TrainingPoint(BaseModel):
    """One optimizer step of a run."""

    step: Annotated[int, Field(description="Optimizer step.")]
    metrics: Annotated[dict[str, float], Field(description="loss, reward_mean, ... as published.")]


class TrainingRun(BaseModel):
    """A run's steps, in step order."""

    run_id: Annotated[str, Field(description="Training run.")]
    points: list[TrainingPoint]


class TrainingView(BaseModel):
    """``GET /api/training``."""

    runs: list[TrainingRun]
    metrics: Annotated[list[str], Field(description="Metric names seen, loss and reward first.")]
    invalid: Annotated[int, Field(description="Records of trainer.metrics that did not decode.")]


class VersionView(BaseModel):
    """``GET /api/versions``: one data version, what made it (the catalog's spec) and how far it is."""

    name: Annotated[str, Field(description="The version's name; main is the live pipeline.")]
    main: Annotated[bool, Field(description="This is the live pipeline (not a catalog entry).")] = False
    parent: Annotated[str | None, Field(description="The version whose input it replayed.")] = None
    stage: Annotated[str | None, Field(description="The stage it re-ran.")] = None
    stages: Annotated[list[str], Field(description="Every stage that runs in it (all of them for main).")] = (
        Field(default_factory=list)
    )
    input_topic: Annotated[str | None, Field(description="The registry topic the replayed stage reads.")] = (
        None
    )
    topics: Annotated[list[str], Field(description="Registry topics it has its own copy of.")] = Field(
        default_factory=list
    )
    ranges: Annotated[list[InputRange], Field(description="What it replayed, per input partition.")] = Field(
        default_factory=list
    )
    records: Annotated[int | None, Field(description="Input records it replayed (None for main).")] = None
    inherited: Annotated[
        dict[str, int], Field(description="Records taken over from the parent, per topic.")
    ] = Field(default_factory=dict)
    settings: Annotated[dict[str, str], Field(description="Setting overrides (environment values).")] = Field(
        default_factory=dict
    )
    prompts: Annotated[dict[str, str], Field(description="Prompt overrides per role (full text).")] = Field(
        default_factory=dict
    )
    prompt_versions: Annotated[dict[str, str], Field(description="The overridden roles' prompt ids.")] = (
        Field(default_factory=dict)
    )
    llm: Annotated[str, Field(description="The LLM endpoint its stages use (secrets masked).")] = ""
    created_at: Annotated[datetime | None, Field(description="When `arena replay` made it (UTC).")] = None
    config_hash: Annotated[str | None, Field(description="Hash of what changes its outputs.")] = None
    groups: Annotated[int, Field(description="Its consumer groups in the lag sample.")] = 0
    pending: Annotated[int, Field(description="Data records its groups still have to read.")] = 0
    pending_capped: Annotated[bool, Field(description="pending is a lower bound.")] = False
    read: Annotated[int, Field(description="Offsets its groups committed past (markers included).")] = 0
    state: Annotated[
        Literal["idle", "running", "drained"],
        Field(
            description="idle: none of its groups ran yet; running: records pending; drained: nothing "
            "pending (a replay is done)."
        ),
    ] = "idle"


# --- the stage graph --------------------------------------------------------------------------


@dataclass(frozen=True)
class EdgeDef:
    """A worker reading ``source`` and writing ``target`` (static, from the registry)."""

    worker: str
    group: str
    source: str
    target: str
    sink: bool = False
    """``target`` is the worker itself: it writes no topic."""

    @property
    def id(self) -> str:
        return f"{self.worker}:{self.source}->{self.target}"


def _side_topic(name: str) -> bool:
    return name.endswith((".dlq", ".rejected"))


def graph_edges(cfg: ArenaSettings) -> list[EdgeDef]:
    """Every stage's input -> output edge (side topics left out), and the trainer's."""
    from app.registry import STAGES

    edges: list[EdgeDef] = []
    for stage in STAGES:
        outputs = [name for name in stage.outputs if not _side_topic(name)]
        if not outputs:
            edges.append(EdgeDef(stage.name, stage.group, stage.input, stage.name, sink=True))
        edges.extend(EdgeDef(stage.name, stage.group, stage.input, out) for out in outputs)
    group = cfg.train.group_id
    edges.extend(EdgeDef("trainer", group, src, TRAINER_TOPIC) for src in ("samples.sft", "samples.verified"))
    return edges


def node_depths(edges: Iterable[EdgeDef]) -> dict[str, int]:
    """Layout column per node: 0 for a node nothing writes, else 1 + its deepest writer's source."""
    into: dict[str, list[str]] = defaultdict(list)
    nodes: dict[str, None] = {}
    for edge in edges:
        into[edge.target].append(edge.source)
        nodes.update({edge.source: None, edge.target: None})
    depth: dict[str, int] = {}
    on_path: set[str] = set()

    def visit(node: str) -> int:
        if node not in depth:
            on_path.add(node)
            ups = [visit(src) for src in into.get(node, []) if src not in on_path]
            on_path.discard(node)
            depth[node] = 1 + max(ups) if ups else 0
        return depth[node]

    return {node: visit(node) for node in nodes}


# --- lag sampling -----------------------------------------------------------------------------


@dataclass
class RateWindow:
    """Per-second rate of a growing count, exponentially weighted over ``window_s``.

    The moves and the elapsed time both decay by ``exp(-dt / window_s)`` at each update, so the rate
    is the average over about the last ``window_s`` seconds (over all of them while fewer have
    passed): a stage that handles a batch every few seconds reads its average, not 0.0 between
    batches, and a long pause between samples leaves only the last interval.
    """

    window_s: float = RATE_WINDOW_S
    _value: int | None = None
    _at: float = 0.0
    _moved: float = 0.0
    _elapsed: float = 0.0

    def update(self, value: int | None, at: float) -> None:
        """The count seen at ``at``; None when unknown now (the next known count spans the gap)."""
        if value is None:
            return
        if self._value is not None and at > self._at:
            dt = at - self._at
            decay = math.exp(-dt / self.window_s)
            # a count that went back (retention, an offset reset) moved nothing
            self._moved = self._moved * decay + max(value - self._value, 0)
            self._elapsed = self._elapsed * decay + dt
        self._value, self._at = value, at

    @property
    def rate(self) -> float | None:
        return self._moved / self._elapsed if self._elapsed > 0 else None


@dataclass
class _Sample:
    at: float
    taken: datetime
    groups: dict[tuple[str, str], GroupLag]
    topics: dict[str, Any]
    """Topic name -> ``consumers.record_count.TopicRecords``."""
    topic_rates: dict[str, float | None]
    interval_s: float | None
    rows: list[Any] = field(default_factory=list)
    """The ``consumers.lag.LagRow`` lines the sample was made of (per partition)."""


def _group_lag(group: str, topic: str, parts: list[Any], worker: str | None) -> GroupLag:
    commits = [r.committed for r in parts if r.committed is not None]
    lag = sum(r.lag for r in parts)
    return GroupLag(
        group=group,
        topic=topic,
        committed=sum(commits) if commits else None,
        end=sum(r.end for r in parts),
        lag=lag,
        pending=lag,
        offset_lag=sum(r.offset_lag for r in parts),
        pending_capped=any(r.pending_capped for r in parts),
        idle=any(r.idle for r in parts),
        throughput=None,
        worker=worker,
    )


@dataclass
class LagSampler:
    """Samples consumer lag and topic records (blocking kafka-python, in a thread) at most once per ``min_interval_s``.

    Concurrent callers share one sample. Rates come from :class:`RateWindow`: a topic's data records,
    and a group's consumed data records (the topic's records minus the group's lag, both counted up to
    the same end offsets).
    """

    bootstrap: str
    topics_by_group: dict[str, list[str]]
    workers_by_group: dict[str, str]
    topics: list[str] = field(default_factory=list)
    """Topics whose records to count besides those the groups read (the graph's nodes)."""
    min_interval_s: float = 0.8
    pending_cap: int = 1_000
    timeout_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _last: _Sample | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _rates: dict[tuple[str, ...], RateWindow] = field(default_factory=dict)
    _counter: Any = None

    async def sample(self) -> _Sample:
        """The newest sample (taken now when the last one is older than ``min_interval_s``)."""
        async with self._lock:
            if self._last is None or self.clock() - self._last.at >= self.min_interval_s:
                self._last = await asyncio.to_thread(self._take)
            return self._last

    def _rate(self, key: tuple[str, ...], value: int | None, at: float) -> float | None:
        window = self._rates.setdefault(key, RateWindow())
        window.update(value, at)
        return window.rate

    def _take(self) -> _Sample:
        from kafka import TopicPartition

        from consumers.lag import compute_lag
        from consumers.record_count import RecordCounter

        rows = compute_lag(
            self.bootstrap,
            None,
            topics_by_group=self.topics_by_group,
            pending_cap=self.pending_cap,
            timeout_s=self.timeout_s,
        )
        if self._counter is None:
            self._counter = RecordCounter(self.bootstrap)
        ends = {TopicPartition(r.topic, r.partition): r.end for r in rows}
        topics = self._counter.count([*self.topics, *(r.topic for r in rows)], ends)
        at = self.clock()
        per: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for row in rows:
            per[(row.group, row.topic)].append(row)
        groups: dict[tuple[str, str], GroupLag] = {}
        for (group, name), parts in per.items():
            lag = _group_lag(group, name, parts, self.workers_by_group.get(group))
            counted = topics.get(name)
            # data records behind the group's commit; unknown while either count is a lower bound
            known = counted is not None and counted.complete and not lag.pending_capped
            consumed = counted.records - lag.lag if known and counted is not None else None
            groups[(group, name)] = lag.model_copy(
                update={"throughput": self._rate(("group", group, name), consumed, at)}
            )
        rates = {
            name: self._rate(("topic", name), t.records if t.complete else None, at)
            for name, t in topics.items()
        }
        previous = self._last.at if self._last is not None else None
        return _Sample(
            at,
            datetime.now(UTC),
            groups,
            topics,
            rates,
            at - previous if previous is not None else None,
            rows,
        )

    def watch(self, topics_by_group: dict[str, list[str]], workers_by_group: dict[str, str]) -> bool:
        """Sample these groups too from now on (besides every group the cluster knows), even before
        they ran; True when that changed what is sampled (the next sample is then taken anew).

        The dicts are replaced, never changed in place: a sample being taken in a thread keeps its own.
        """
        merged = {**self.topics_by_group, **topics_by_group}
        if merged == self.topics_by_group:
            return False
        self.topics_by_group = merged
        self.workers_by_group = {**self.workers_by_group, **workers_by_group}
        self._last = None
        return True

    def close(self) -> None:
        if self._counter is not None:
            self._counter.close()


def graph_view(edges: list[EdgeDef], sample: _Sample) -> GraphView:
    """The graph with the sample's lag, records and rates."""
    out_edges: list[GraphEdge] = []
    idle_in: dict[str, list[bool]] = defaultdict(list)
    for edge in edges:
        row = sample.groups.get((edge.group, edge.source))
        # no row: the source topic does not exist yet, so the group cannot have run on it
        idle = row is None or row.idle
        idle_in[edge.target].append(idle)
        out_edges.append(
            GraphEdge(
                id=edge.id,
                worker=edge.worker,
                group=edge.group,
                source=edge.source,
                target=edge.target,
                lag=row.lag if row else None,
                pending=row.pending if row else None,
                offset_lag=row.offset_lag if row else None,
                pending_capped=row.pending_capped if row else False,
                idle=idle,
                throughput=row.throughput if row else None,
            )
        )
    sinks = {e.target for e in edges if e.sink}
    nodes = []
    for name, depth in node_depths(edges).items():
        counted = sample.topics.get(name)
        nodes.append(
            GraphNode(
                id=name,
                kind="sink" if name in sinks else "topic",
                depth=depth,
                end=counted.end if counted else None,
                records=counted.records if counted else None,
                records_complete=counted.complete if counted else True,
                rate=sample.topic_rates.get(name),
                idle=bool(idle_in.get(name)) and all(idle_in[name]),
            )
        )
    return GraphView(
        nodes=nodes,
        edges=out_edges,
        groups=[g for _, g in sorted(sample.groups.items())],
        sampled_at=sample.taken,
        interval_s=sample.interval_s,
    )


# --- data versions ----------------------------------------------------------------------------


def version_groups(specs: Iterable[VersionSpec]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The consumer groups of the versions' workers (stages and lake sink): their topics, their workers."""
    topics: dict[str, list[str]] = {}
    workers: dict[str, str] = {}
    for spec in specs:
        for worker in version_workers(spec).values():
            topics[worker.group] = list(worker.inputs)
            workers[worker.group] = worker.name
    return topics, workers


def versions_view(specs: Sequence[VersionSpec], rows: Sequence[Any]) -> list[VersionView]:
    """main, then every catalog version (oldest first), each with its progress from lag ``rows``.

    Progress is ``consumers.lag.version_progress`` (what `arena lag` prints per version): a version
    none of whose groups ran reads idle, one with nothing pending drained.
    """
    from consumers.lag import version_progress

    progress = {p.version: p for p in version_progress(list(rows))}
    capped = {r.version for r in rows if r.pending_capped}
    ran = {r.version for r in rows if not r.idle}
    main = VersionView(name=MAIN, main=True, stages=[stage.name for stage in STAGES])
    out = [main]
    for spec in specs:
        out.append(
            VersionView(
                name=spec.name,
                parent=spec.parent,
                stage=spec.stage,
                stages=list(spec.stages),
                input_topic=spec.input_topic,
                topics=list(spec.topics),
                ranges=list(spec.ranges),
                records=spec.records,
                inherited=spec.inherited,
                settings=spec.settings,
                prompts=spec.prompts,
                prompt_versions=spec.prompt_versions,
                llm=spec.llm,
                created_at=spec.created_at,
                config_hash=spec.config_hash,
            )
        )
    for view in out:
        p = progress.get(view.name)
        if p is not None:
            view.groups, view.pending, view.read = p.groups, p.pending, p.read
        view.pending_capped = view.name in capped
        view.state = "idle" if view.name not in ran else ("running" if view.pending else "drained")
    return out


def version_diff(
    cfg: ArenaSettings, a: str, b: str, *, stage: str | None = None, examples: int = 3
) -> VersionDiff:
    """``consumers.version_diff.compare`` of ``a`` and ``b`` (as `arena diff`), after the checks it does:
    both names are main or catalog versions, ``stage`` a stage that made something in one of them."""
    from app.versions import data_versions
    from consumers.version_diff import compare
    from lake.store import open_store

    for name in (a, b):
        try:
            check_name(name)
        except VersionNameError as exc:
            raise UiError(str(exc)) from None
    specs = {spec.name: spec for spec in data_versions(cfg)}
    known = [MAIN, *specs]
    for name in (a, b):
        if name not in known:
            raise UiError(
                f"no data version {name!r} (fix: one of {', '.join(known)}; `arena data-versions list`)"
            )
    if stage is not None and stage not in {s.name for s in STAGES}:
        ran = [s for v in (a, b) if v in specs for s in specs[v].stages] or [s.name for s in STAGES]
        raise UiError(f"no stage {stage!r} (fix: one of {', '.join(dict.fromkeys(ran))})")
    result = compare(open_store(cfg), a, b, stage=stage, examples=examples)
    if stage is not None and not result.stages:
        raise UiError(
            f"stage {stage!r} made nothing in {a} or {b} (fix: a stage from `arena data-versions show {b}`)"
        )
    return result


# --- training curves --------------------------------------------------------------------------


def _metric_order(name: str) -> tuple[int, str]:
    first = ("loss", "reward_mean", "reward_std")
    return (first.index(name) if name in first else len(first), name)


class TrainingFeed:
    """Reads ``trainer.metrics`` from the broker incrementally (no consumer group, nothing committed).

    Blocking (kafka-python): call :meth:`poll` in a thread; calls are serialised. A step published
    twice (a resumed run redoing it) keeps its newest metrics.
    """

    def __init__(self, bootstrap: str, topic: str = TRAINER_TOPIC, *, read_s: float = 2.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.read_s = read_s
        self._consumer: Any = None
        self._points: dict[tuple[str, int], dict[str, float]] = {}
        self._invalid = 0
        self._lock = threading.Lock()

    def _assigned(self) -> Any:
        from kafka import KafkaConsumer, TopicPartition

        if self._consumer is None:
            read_committed.install()
            self._consumer = KafkaConsumer(
                bootstrap_servers=self.bootstrap,
                client_id="arena-ui",
                group_id=None,
                enable_auto_commit=False,
                isolation_level="read_committed",
                auto_offset_reset="earliest",
                fetch_max_wait_ms=50,
            )
        if not self._consumer.assignment():
            parts = self._consumer.partitions_for_topic(self.topic)
            if not parts:
                return None  # not created yet: try again next poll
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            self._consumer.assign(tps)
            self._consumer.seek_to_beginning(*tps)
        return self._consumer

    def poll(self) -> TrainingView:
        with self._lock:
            consumer = self._assigned()
            if consumer is not None:
                self._read_to_end(consumer)
            return self._view()

    def _read_to_end(self, consumer: Any) -> None:
        from arena.records.trainer import TrainerMetrics
        from consumers.lag import consumer_offsets

        tps = list(consumer.assignment())
        ends = consumer_offsets(consumer.end_offsets, tps)
        deadline = time.monotonic() + self.read_s
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=100).values():
                for record in records:
                    try:
                        value = TrainerMetrics.model_validate_json(record.value or b"")
                    except ValidationError:
                        self._invalid += 1
                        continue
                    self._points[(value.run_id, value.step)] = value.metrics

    def _view(self) -> TrainingView:
        runs: dict[str, list[TrainingPoint]] = defaultdict(list)
        names: set[str] = set()
        for (run_id, step), metrics in sorted(self._points.items()):
            runs[run_id].append(TrainingPoint(step=step, metrics=metrics))
            names.update(metrics)
        return TrainingView(
            runs=[TrainingRun(run_id=r, points=p) for r, p in sorted(runs.items())],
            metrics=sorted(names, key=_metric_order),
            invalid=self._invalid,
        )

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close(autocommit=False)
                self._consumer = None


# --- lake -------------------------------------------------------------------------------------


def lake_tables(cfg: ArenaSettings) -> list[LakeTable]:
    """Every view of the lake with its files, rows and bytes (zero for topics not in the lake yet)."""
    from arena.topics import TOPICS
    from arena.versions import split_wire
    from lake.parquet import lake_listing
    from lake.store import open_store

    listed = {item.topic: item for item in lake_listing(open_store(cfg))}
    others: dict[str, dict[str, int]] = defaultdict(dict)
    for name, listing in listed.items():
        version, base = split_wire(name)
        if version != MAIN:
            others[base][version] = listing.rows
    out = []
    for spec in TOPICS.values():
        item = listed.get(spec.name)  # the live pipeline's files: a version's are version.<v>.<topic>
        out.append(
            LakeTable(
                view=spec.table,
                topic=spec.name,
                files=item.files if item else 0,
                rows=item.rows if item else 0,
                bytes=item.bytes if item else 0,
                version_rows=dict(sorted(others[spec.name].items())),
            )
        )
    return sorted(out, key=lambda t: (-t.rows, t.view))


def _check_read_only(sql: str) -> None:
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise UiError(f"query failed: {exc}") from None
    if len(statements) != 1:
        raise UiError(
            f"the query box runs exactly one statement; got {len(statements)} (fix: drop the others)"
        )
    kind = statements[0].type.name
    if kind not in READ_ONLY_STATEMENTS:
        raise UiError(
            f"only read-only queries run here (SELECT, WITH, FROM, DESCRIBE, SUMMARIZE, EXPLAIN); got {kind}"
        )


def _json_cell(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict):
        return {str(k): _json_cell(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_cell(v) for v in value]
    return str(value)


def _mib(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MiB"


@dataclass
class _Rows:
    """Result rows gathered under a row limit and a byte cap."""

    limit: int
    max_bytes: int
    rows: list[list[Any]] = field(default_factory=list)
    size: int = 2  # the list's brackets
    cut_by: Literal["rows", "bytes"] | None = None
    over: int = 0
    """JSON bytes of the first row left out by the byte cap."""

    def add(self, values: Iterable[Any]) -> bool:
        """Takes one row; False once the result is full (this row left out)."""
        if len(self.rows) >= self.limit:
            self.cut_by = "rows"
            return False
        cells = [_json_cell(v) for v in values]
        size = len(json.dumps(cells, ensure_ascii=False, separators=(",", ":")).encode()) + 1
        if self.size + size > self.max_bytes:
            self.cut_by, self.over = "bytes", size
            return False
        self.rows.append(cells)
        self.size += size
        return True

    def note(self) -> str | None:
        if self.cut_by == "rows":
            return (
                f"first {self.limit} rows (fix: a higher limit, up to {MAX_ROW_LIMIT}, or a narrower WHERE)"
            )
        if self.cut_by == "bytes" and not self.rows:
            return (
                f"the first row alone is {_mib(self.over)}, over the {_mib(self.max_bytes)} cap on results "
                "(fix: select fewer or narrower columns, e.g. left(col, 1000))"
            )
        if self.cut_by == "bytes":
            return (
                f"cut after {len(self.rows)} rows at the {_mib(self.max_bytes)} cap on results "
                "(fix: select fewer or narrower columns, or add a LIMIT)"
            )
        return None


def run_query(
    cfg: ArenaSettings,
    sql: str,
    limit: int = DEFAULT_ROW_LIMIT,
    *,
    timeout_s: float = QUERY_TIMEOUT_S,
    max_bytes: int = MAX_RESULT_BYTES,
) -> QueryResult:
    """One read-only statement over the lake's views; its first ``limit`` rows, ``max_bytes`` of JSON at most.

    Besides the statement check, the connection has file and network access switched off and
    its configuration locked, so no statement can read or write files (the views are Arrow
    objects registered from Python). A query still running after ``timeout_s`` is interrupted.
    Rows are read in small batches and reading stops at the first row that does not fit, so a
    huge result is never held whole.
    """
    import duckdb

    from lake.query import LakeQuery
    from lake.store import open_store

    _check_read_only(sql)
    started = time.perf_counter()
    con = LakeQuery(open_store(cfg)).connect()
    timer = threading.Timer(timeout_s, con.interrupt)
    try:
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        timer.start()
        rel = con.sql(sql)
        if rel is None:
            return QueryResult(columns=[], rows=[], truncated=False, elapsed_ms=0.0)
        columns = list(rel.columns)
        got = _Rows(limit, max_bytes)
        reader = rel.limit(limit + 1).to_arrow_reader(batch_size=64)
        for batch in reader:
            if not all(got.add(row.values()) for row in batch.to_pylist()):
                break
        reader.close()
    except duckdb.InterruptException:
        raise UiError(
            f"query stopped after {timeout_s:g} s (fix: narrow it, e.g. a WHERE or LIMIT)"
        ) from None
    except duckdb.Error as exc:
        raise UiError(f"query failed: {exc}") from None
    finally:
        timer.cancel()
        con.close()
    return QueryResult(
        columns=columns,
        rows=got.rows,
        truncated=got.cut_by is not None,
        cut_by=got.cut_by,
        bytes=got.size,
        max_bytes=max_bytes,
        note=got.note(),
        elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
    )


# --- the app ----------------------------------------------------------------------------------


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status)


def _model(value: BaseModel | Sequence[BaseModel]) -> Response:
    if not isinstance(value, BaseModel):
        body = "[" + ",".join(v.model_dump_json() for v in value) + "]"
    else:
        body = value.model_dump_json()
    return Response(body, media_type="application/json")


Handler = Callable[[Request], Awaitable[Response]]


class WriteToken:
    """Refuses every request that may change something (any method but GET, HEAD, OPTIONS) without the token.

    Applied to the whole app, so a write endpoint added later is covered without saying so.
    """

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            sent = Headers(scope=scope).get(TOKEN_HEADER, "").encode()
            if not secrets.compare_digest(sent, self.token):
                refusal = _error(
                    f"this request changes something and needs the dashboard's token in {TOKEN_HEADER} "
                    "(fix: reload the page `arena ui` printed, or send the token it printed at start)",
                    403,
                )
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _api(handler: Handler) -> Handler:
    """Answers a handler's failures as JSON errors (no traceback reaches the page)."""
    from kafka.errors import KafkaError

    from consumers.dlq import DlqReadStalled

    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except UiError as exc:
            return _error(str(exc), 400)
        except KafkaError as exc:
            return _error(f"Kafka: {exc} (fix: check that the broker is up: `arena status`)", 503)
        except DlqReadStalled as exc:
            return _error(str(exc), 503)
        except Exception as exc:
            log.exception("%s %s failed", request.method, request.url.path)
            return _error(f"{type(exc).__name__}: {exc}", 500)

    return wrapped


async def _body(request: Request, model: type[Any]) -> Any:
    """The JSON body validated as ``model``; a clear 400 naming the field otherwise."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise UiError("send the body as JSON with Content-Type: application/json")
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
        )
        raise UiError(f"bad request body: {problems}") from None


class Dashboard:
    """The API's state: settings, the broker, the lag sampler, the training feed and the write token."""

    def __init__(self, cfg: ArenaSettings, bootstrap: str, *, token: str, token_in_page: bool) -> None:
        self.cfg = cfg
        self.bootstrap = bootstrap
        self.token = token
        self.token_in_page = token_in_page
        self.edges = graph_edges(cfg)
        topics_by_group: dict[str, list[str]] = defaultdict(list)
        workers: dict[str, str] = {}
        topics: dict[str, None] = {}
        for edge in self.edges:
            if edge.source not in topics_by_group[edge.group]:
                topics_by_group[edge.group].append(edge.source)
            workers[edge.group] = edge.worker
            topics.update(dict.fromkeys([edge.source] if edge.sink else [edge.source, edge.target]))
        self.sampler = LagSampler(bootstrap, dict(topics_by_group), workers, topics=list(topics))
        self.training = TrainingFeed(bootstrap)
        self.ledgers = LedgerCollector.for_stages(
            bootstrap, {stage.name: stage.input for stage in STAGES}, cache_s=STAGES_CACHE_S
        )
        self.versions_cache_s = VERSIONS_CACHE_S
        self._specs: tuple[float, list[VersionSpec]] | None = None
        self._specs_lock = threading.Lock()

    def version_specs(self) -> list[VersionSpec]:
        """The catalog's data versions, read again at most every ``versions_cache_s`` (blocking)."""
        from app.versions import data_versions

        with self._specs_lock:
            now = time.monotonic()
            if self._specs is None or now - self._specs[0] >= self.versions_cache_s:
                self._specs = (now, data_versions(self.cfg))
            return self._specs[1]

    async def graph(self, _: Request) -> Response:
        return _model(graph_view(self.edges, await self.sampler.sample()))

    async def stages(self, _: Request) -> Response:
        ledgers = await asyncio.to_thread(self.ledgers.ledgers)
        return JSONResponse([ledger.as_json() for ledger in ledgers])

    async def dead_letters(self, request: Request) -> Response:
        from consumers.dlq import DlqError, list_dead_letters

        try:
            rows = await list_dead_letters(
                self.bootstrap,
                topic=request.query_params.get("topic") or None,
                reason=request.query_params.get("reason") or None,
                settings=self.cfg,
            )
        except DlqError as exc:
            raise UiError(str(exc)) from None
        return _model(list(rows))

    async def replay(self, request: Request) -> Response:
        from consumers.dlq import DlqError, replay_dead_letters

        body: ReplayRequest = await _body(request, ReplayRequest)
        try:
            report = await replay_dead_letters(
                self.cfg, self.bootstrap, body.topic, reason=body.reason, keys=body.keys, force=body.force
            )
        except DlqError as exc:
            raise UiError(str(exc)) from None
        return _model(report)

    async def versions(self, _: Request) -> Response:
        specs = await asyncio.to_thread(self.version_specs)
        # a version's groups are sampled from the start, so one whose workers never ran shows its input
        self.sampler.watch(*version_groups(specs))
        sample = await self.sampler.sample()
        return _model(versions_view(specs, sample.rows))

    async def diff(self, request: Request) -> Response:
        params = request.query_params
        a, b = params.get("a", "").strip(), params.get("b", "").strip()
        if not a or not b:
            raise UiError(
                "name the two data versions to compare: /api/diff?a=main&b=<version> "
                "(`arena data-versions list` names them)"
            )
        raw = params.get("examples", "3")
        if not raw.isdigit() or int(raw) > MAX_DIFF_EXAMPLES:
            raise UiError(f"examples={raw!r}: use a whole number from 0 to {MAX_DIFF_EXAMPLES}")
        stage = params.get("stage", "").strip() or None
        result = await asyncio.to_thread(version_diff, self.cfg, a, b, stage=stage, examples=int(raw))
        return _model(result)

    async def tables(self, _: Request) -> Response:
        return _model(await asyncio.to_thread(lake_tables, self.cfg))

    async def query(self, request: Request) -> Response:
        body: QueryRequest = await _body(request, QueryRequest)
        return _model(await asyncio.to_thread(run_query, self.cfg, body.sql, body.limit))

    async def training_curves(self, _: Request) -> Response:
        return _model(await asyncio.to_thread(self.training.poll))

    async def trace(self, request: Request) -> Response:
        from lake.trace import TraceError, trace_record

        raw_depth = request.query_params.get("depth", "20")
        if not raw_depth.isdigit() or not 1 <= int(raw_depth) <= 200:
            raise UiError(f"depth={raw_depth!r}: use a whole number from 1 to 200")
        record_id = request.path_params["record_id"]
        try:
            report = await asyncio.to_thread(trace_record, self.cfg, record_id, depth=int(raw_depth))
        except TraceError as exc:
            raise UiError(str(exc)) from None
        return _model(report)

    async def index(self, request: Request) -> Response:
        """The page, with the write token when it may have it: always on loopback, else with ``?token=``."""
        page = (STATIC / "index.html").read_text()
        asked = request.query_params.get("token", "").encode()
        if self.token_in_page or secrets.compare_digest(asked, self.token.encode()):
            page = page.replace(
                TOKEN_PLACEHOLDER, f'<meta name="arena-token" content="{html.escape(self.token)}">'
            )
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    def close(self) -> None:
        self.training.close()
        self.sampler.close()


def create_app(
    cfg: ArenaSettings,
    bootstrap: str,
    *,
    allowed_hosts: list[str] | None = None,
    token: str | None = None,
    token_in_page: bool = True,
) -> Starlette:
    """The dashboard app; ``allowed_hosts`` limits the Host header (None: any).

    Writes need ``token`` (a random one when None: ``app.state.token``). The page carries it when
    ``token_in_page`` (a loopback server, whose Host check keeps other sites out), otherwise only
    when opened with ``?token=``.
    """
    token = token or secrets.token_urlsafe(24)
    dash = Dashboard(cfg, bootstrap, token=token, token_in_page=token_in_page)
    routes = [
        Route("/", dash.index, methods=["GET"]),
        Route("/api/graph", _api(dash.graph), methods=["GET"]),
        Route("/api/stages", _api(dash.stages), methods=["GET"]),
        Route("/api/dlq", _api(dash.dead_letters), methods=["GET"]),
        Route("/api/dlq/replay", _api(dash.replay), methods=["POST"]),
        Route("/api/lake/tables", _api(dash.tables), methods=["GET"]),
        Route("/api/lake/query", _api(dash.query), methods=["POST"]),
        Route("/api/versions", _api(dash.versions), methods=["GET"]),
        Route("/api/diff", _api(dash.diff), methods=["GET"]),
        Route("/api/training", _api(dash.training_curves), methods=["GET"]),
        Route("/api/trace/{record_id:path}", _api(dash.trace), methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)] if allowed_hosts else []
    middleware.append(Middleware(WriteToken, token=token))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(dash.close)

    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.dashboard = dash
    app.state.token = token
    return app


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def check_token(host: str, token: str | None) -> None:
    """A non-loopback address needs a token chosen by the user, and a token must be hard to guess."""
    if token is None and not is_loopback(host):
        raise UiError(
            f"--host {host} is not a loopback address: anyone who reaches it could replay dead letters and "
            "query the lake, so writes need a token you choose (fix: add --token with 16+ random characters, "
            "e.g. from `python -c 'import secrets; print(secrets.token_urlsafe())'`, or drop --host)"
        )
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise UiError(
            f"--token has {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
            "(e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
        )


def serve(
    cfg: ArenaSettings,
    bootstrap: str,
    *,
    host: str,
    port: int,
    say: Callable[[str], None],
    token: str | None = None,
) -> None:
    """Serve the dashboard until interrupted (blocking); writes need ``token`` (random when None, loopback only)."""
    import socket

    import uvicorn

    check_token(host, token)
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise UiError(
            f"cannot listen on {host}:{port}: {exc.strerror} (fix: --port with a free port)"
        ) from None
    loopback = is_loopback(host)
    app = create_app(
        cfg,
        bootstrap,
        allowed_hosts=LOOPBACK_HOSTS if loopback else None,
        token=token,
        token_in_page=loopback,
    )
    shown = f"[{host}]" if ":" in host else host
    say(f"Arena dashboard on http://{shown}:{port}/ (broker {bootstrap}); Ctrl-C stops it")
    if loopback:
        say(
            f"write token of this start: {app.state.token} (the page has it; other clients send {TOKEN_HEADER})"
        )
    else:
        say(
            f"open http://{shown}:{port}/?token=<your --token> for working buttons; {host} is not loopback, "
            f"so anyone who reaches it can read the graph, dead letters and lake views (writes need the token)"
        )
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)

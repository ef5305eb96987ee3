"""Backbone benchmark: tool docs per second through publish -> normalise -> lake.

Over 800 lines on purpose: a quarter is the seeded synthetic tool themes (data), and the
methodology below is part of the figure it prints; the code itself is one script.

Usage::

    python bench/backbone.py [--servers N] [--tools-per-server T] [--seed S] [--quick]

Prints ONE JSON object on stdout; progress and logs go to stderr.

Two paths run on the same embedded ``noida-db`` broker, in the same run, on the
same seeded synthetic servers (OpenAI-format tools with typed parameters and
descriptions of several words, so every tool and server passes the gates):

``arena``
    The real system: ``producers.publish.publish`` writes N ``tools.raw``
    records; the ``tools-servers`` Faust worker (exactly-once: its outputs and
    input offsets commit in one Kafka transaction) normalises, gates and
    classifies each server into ``tools.servers``; the ``lake-sink`` Faust
    worker writes every topic to Parquet (plus the SQLite catalog). Both
    workers run as separate processes under ``app.worker.Supervisor``.
    Worker start-up is excluded: timing starts only once both consumer groups
    are Stable and one warm-up server has gone all the way to the lake (so the
    embedding model is loaded, transactional producers exist and the lake
    writer is initialised). The clock runs from the start of publishing until
    ``consumers.lag.drained`` is true twice in a row for both groups AND the
    lake holds every benchmark server in ``tools.servers``.

``baseline``
    A plain aiokafka loop in this process: one consumer (its own group,
    earliest, no transactions) reads the same N ``tools.raw`` records, and for
    each does the stage's per-record work, i.e. ``streams.runtime.decode``
    (UTF-8 + JSON + ``RawToolServer`` validation) and the stage's own
    ``build_server`` (``normalize_server`` + ``server_gate`` +
    ``classify_domain`` + the ``ToolServer`` model) and ``streams.runtime.encode``
    (JSON + lineage headers), then produces the ``ToolServer`` JSON with an
    idempotent producer (acks=all) to ``bench.baseline.out`` (4 partitions)
    and commits offsets at the end. Timed from the first poll to the last
    produce acknowledged (model warmed up first, as in the arena path).

The ratio ``arena docs/s / baseline docs/s`` therefore isolates what the
streaming system adds on top of the same JSON + embedding work: Faust,
per-partition Kafka transactions, a second consumer group, Parquet/catalog
writes and drain detection, and two worker processes sharing the cores.
"""

from __future__ import annotations

import os

# Same thread settings as the worker processes (app.worker.Supervisor._env), set before torch loads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import platform
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

BROKER = "noida-db embedded"
BENCH_TOPIC = "bench.baseline.out"
BENCH_PARTITIONS = 4
BASELINE_GROUP = "bench-baseline"
WORKER_NAMES = ["tools-servers", "lake-sink"]
WARMUP_NAME = "bench-warmup-server"
POLL_S = 0.2
IDLE_PROBE_S = 3.0

console = Console(stderr=True)


class BenchError(RuntimeError):
    """The benchmark could not produce a trustworthy number."""


# -- synthetic tool docs ---------------------------------------------------------------------

# (theme, [(entity, plural, [(field, JSON-schema, description)])])
_Field = tuple[str, dict[str, Any], str]
_THEMES: list[tuple[str, list[tuple[str, str, list[_Field]]]]] = [
    (
        "travel",
        [
            (
                "flight",
                "flights",
                [
                    (
                        "origin",
                        {"type": "string", "pattern": "^[A-Z]{3}$"},
                        "IATA code of the departure airport.",
                    ),
                    (
                        "destination",
                        {"type": "string", "pattern": "^[A-Z]{3}$"},
                        "IATA code of the arrival airport.",
                    ),
                    ("departure_date", {"type": "string", "format": "date"}, "Day of departure, YYYY-MM-DD."),
                    ("passengers", {"type": "integer", "minimum": 1, "maximum": 9}, "Number of travellers."),
                    (
                        "cabin",
                        {"type": "string", "enum": ["economy", "premium", "business", "first"]},
                        "Cabin class.",
                    ),
                ],
            ),
            (
                "hotel",
                "hotels",
                [
                    ("city", {"type": "string"}, "City to search in, e.g. 'Lisbon'."),
                    ("check_in", {"type": "string", "format": "date"}, "Arrival day, YYYY-MM-DD."),
                    ("nights", {"type": "integer", "minimum": 1}, "Length of stay in nights."),
                    ("max_price", {"type": "number", "minimum": 0}, "Highest nightly price in EUR."),
                    ("breakfast", {"type": "boolean"}, "Only rooms with breakfast included."),
                ],
            ),
        ],
    ),
    (
        "finance",
        [
            (
                "payment",
                "payments",
                [
                    ("amount", {"type": "number", "exclusiveMinimum": 0}, "Amount in the account currency."),
                    ("currency", {"type": "string", "enum": ["EUR", "USD", "GBP", "JPY"]}, "ISO 4217 code."),
                    ("recipient_iban", {"type": "string"}, "IBAN of the beneficiary account."),
                    ("reference", {"type": "string", "maxLength": 140}, "Free text shown to the recipient."),
                    ("instant", {"type": "boolean"}, "Use instant transfer when available."),
                ],
            ),
            (
                "stock_quote",
                "stock quotes",
                [
                    ("symbol", {"type": "string"}, "Ticker symbol, e.g. 'AAPL'."),
                    (
                        "exchange",
                        {"type": "string", "enum": ["NASDAQ", "NYSE", "LSE", "XETRA"]},
                        "Listing venue.",
                    ),
                    (
                        "interval",
                        {"type": "string", "enum": ["1m", "5m", "1h", "1d"]},
                        "Bar size of the series.",
                    ),
                    ("limit", {"type": "integer", "minimum": 1, "maximum": 500}, "Number of bars to return."),
                ],
            ),
        ],
    ),
    (
        "weather",
        [
            (
                "forecast",
                "forecasts",
                [
                    ("latitude", {"type": "number", "minimum": -90, "maximum": 90}, "Latitude in degrees."),
                    (
                        "longitude",
                        {"type": "number", "minimum": -180, "maximum": 180},
                        "Longitude in degrees.",
                    ),
                    ("days", {"type": "integer", "minimum": 1, "maximum": 16}, "How many days ahead."),
                    (
                        "units",
                        {"type": "string", "enum": ["metric", "imperial"]},
                        "Unit system of the values.",
                    ),
                ],
            ),
            (
                "weather_alert",
                "weather alerts",
                [
                    ("region", {"type": "string"}, "Region or county name."),
                    (
                        "severity",
                        {"type": "string", "enum": ["minor", "moderate", "severe", "extreme"]},
                        "Lowest severity.",
                    ),
                    ("active_only", {"type": "boolean"}, "Skip alerts that already expired."),
                ],
            ),
        ],
    ),
    (
        "commerce",
        [
            (
                "product",
                "products",
                [
                    ("query", {"type": "string"}, "Words to match in the product title."),
                    ("category", {"type": "string"}, "Catalog category slug, e.g. 'shoes'."),
                    ("min_price", {"type": "number", "minimum": 0}, "Lowest price to include."),
                    ("in_stock", {"type": "boolean"}, "Only products that can ship today."),
                    (
                        "tags",
                        {"type": "array", "items": {"type": "string"}},
                        "Tags every product must carry.",
                    ),
                ],
            ),
            (
                "order",
                "orders",
                [
                    ("customer_id", {"type": "string"}, "Identifier of the customer account."),
                    (
                        "status",
                        {"type": "string", "enum": ["pending", "paid", "shipped", "returned"]},
                        "Order state.",
                    ),
                    (
                        "placed_after",
                        {"type": "string", "format": "date-time"},
                        "Earliest order time, ISO 8601.",
                    ),
                    ("items", {"type": "array", "items": {"type": "string"}}, "Product SKUs in the order."),
                ],
            ),
        ],
    ),
    (
        "health",
        [
            (
                "appointment",
                "appointments",
                [
                    ("patient_id", {"type": "string"}, "Identifier of the patient record."),
                    ("doctor_id", {"type": "string"}, "Identifier of the practitioner."),
                    ("start_time", {"type": "string", "format": "date-time"}, "Start of the slot, ISO 8601."),
                    ("duration_minutes", {"type": "integer", "minimum": 5, "maximum": 120}, "Slot length."),
                    ("telehealth", {"type": "boolean"}, "Hold the visit by video call."),
                ],
            ),
            (
                "medication",
                "medications",
                [
                    ("name", {"type": "string"}, "Generic or brand name of the drug."),
                    ("dose_mg", {"type": "number", "minimum": 0}, "Dose in milligrams."),
                    (
                        "frequency",
                        {"type": "string", "enum": ["daily", "twice_daily", "weekly"]},
                        "How often.",
                    ),
                ],
            ),
        ],
    ),
    (
        "music",
        [
            (
                "playlist",
                "playlists",
                [
                    ("title", {"type": "string", "maxLength": 100}, "Display title of the playlist."),
                    ("public", {"type": "boolean"}, "Whether other users can find it."),
                    ("track_ids", {"type": "array", "items": {"type": "string"}}, "Tracks in play order."),
                ],
            ),
            (
                "track",
                "tracks",
                [
                    ("artist", {"type": "string"}, "Name of the performing artist."),
                    ("album", {"type": "string"}, "Album the track appears on."),
                    ("year", {"type": "integer", "minimum": 1900, "maximum": 2100}, "Release year."),
                    ("explicit", {"type": "boolean"}, "Include tracks with explicit lyrics."),
                ],
            ),
        ],
    ),
    (
        "logistics",
        [
            (
                "shipment",
                "shipments",
                [
                    ("tracking_number", {"type": "string"}, "Carrier tracking number."),
                    ("carrier", {"type": "string", "enum": ["dhl", "ups", "fedex", "usps"]}, "Carrier code."),
                    ("weight_kg", {"type": "number", "exclusiveMinimum": 0}, "Parcel weight in kilograms."),
                    ("signature_required", {"type": "boolean"}, "Require a signature on delivery."),
                ],
            ),
            (
                "warehouse",
                "warehouses",
                [
                    (
                        "country",
                        {"type": "string", "pattern": "^[A-Z]{2}$"},
                        "ISO 3166-1 alpha-2 country code.",
                    ),
                    ("capacity_pallets", {"type": "integer", "minimum": 0}, "Free pallet positions needed."),
                    ("refrigerated", {"type": "boolean"}, "Needs cold storage."),
                ],
            ),
        ],
    ),
]

# (verb, description template, which fields it takes: "id" | "filters" | "fields")
_VERBS: list[tuple[str, str, str]] = [
    (
        "search",
        "Search {plural} matching the given filters and return a paginated list of summaries.",
        "filters",
    ),
    ("get", "Get the full details of one {entity} by its identifier, including timestamps.", "id"),
    ("create", "Create a new {entity} from the supplied fields and return its identifier.", "fields"),
    ("update", "Update selected fields of an existing {entity}; omitted fields stay unchanged.", "id+fields"),
    (
        "delete",
        "Delete one {entity} permanently. This cannot be undone, so confirm with the user first.",
        "id",
    ),
    ("list", "List the most recent {plural} of the current account, newest first.", "filters"),
    ("count", "Count the {plural} that match the given filters without returning them.", "filters"),
    ("export", "Export {plural} matching the filters as a CSV download link valid for one hour.", "filters"),
]

_ADJECTIVES = [
    "atlas",
    "nimbus",
    "vertex",
    "harbor",
    "cobalt",
    "summit",
    "lumen",
    "quartz",
    "orbit",
    "meadow",
]


def _tool(
    rng: random.Random, theme: str, entity: str, plural: str, fields: list[_Field], verb: int
) -> dict[str, Any]:
    name, template, shape = _VERBS[verb]
    props: dict[str, Any] = {}
    required: list[str] = []
    if "id" in shape:
        props[f"{entity}_id"] = {
            "type": "string",
            "description": f"Identifier of the {entity.replace('_', ' ')}.",
        }
        required.append(f"{entity}_id")
    if "fields" in shape or shape == "filters":
        chosen = rng.sample(fields, k=rng.randint(min(2, len(fields)), len(fields)))
        for fname, schema, fdesc in chosen:
            props[fname] = {**schema, "description": fdesc}
        if shape == "fields":
            required.extend(f for f, _s, _d in chosen[: rng.randint(1, len(chosen))])
    if shape == "filters":
        props["page_size"] = {
            "type": "integer",
            "minimum": 1,
            "maximum": 100,
            "default": 20,
            "description": "Results per page.",
        }
    label = entity.replace("_", " ")
    description = template.format(entity=label, plural=plural) + f" Part of the {theme} API."
    params: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        params["required"] = required
    return {
        "type": "function",
        "function": {"name": f"{name}_{entity}", "description": description, "parameters": params},
    }


def synthetic_server(rng: random.Random, name: str, tools: int) -> Any:
    """One OpenAI-format candidate server with ``tools`` distinct, well-documented tools."""
    from arena.records.tools import RawToolServer, ToolDocFormat

    theme, entities = rng.choice(_THEMES)
    combos = [(e, v) for e in range(len(entities)) for v in range(len(_VERBS))]
    rng.shuffle(combos)
    entries = []
    for i in range(tools):
        e, v = combos[i % len(combos)]
        entity, plural, fields = entities[e]
        entry = _tool(rng, theme, entity, plural, fields, v)
        if i >= len(combos):  # more tools than combinations: keep names unique
            entry["function"]["name"] += f"_v{i // len(combos) + 1}"
        entries.append(entry)
    return RawToolServer(
        server=name,
        source=f"bench://synthetic/{name}.json",
        format=ToolDocFormat.openai,
        entries=entries,
        published_at=datetime(2025, 1, 1, tzinfo=UTC),
    )


def synthetic_servers(n: int, tools_per_server: int, seed: int) -> list[Any]:
    """N seeded servers with about T tools each (T-1..T+1, never below 3)."""
    rng = random.Random(seed)
    lo, hi = max(3, tools_per_server - 1), max(3, tools_per_server + 1)
    return [
        synthetic_server(rng, f"{rng.choice(_ADJECTIVES)}-{i:05d}", rng.randint(lo, hi)) for i in range(n)
    ]


# -- helpers ---------------------------------------------------------------------------------


def _wait(
    what: str, check: Callable[[], bool], timeout_s: float, tick: Callable[[], None] | None = None
) -> float:
    """Poll ``check`` until true; returns the seconds it took, raises BenchError on timeout."""
    start = time.perf_counter()
    while True:
        if tick is not None:
            tick()
        if check():
            return time.perf_counter() - start
        if time.perf_counter() - start > timeout_s:
            raise BenchError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(POLL_S)


def groups_stable(bootstrap: str, groups: list[str]) -> bool:
    """Every group is listed by the broker and described as Stable with at least one member."""
    from streams.admin import admin_client

    with admin_client(bootstrap) as admin:
        listed = {str(g["group_id"]) for g in admin.list_groups()}
        if not set(groups) <= listed:
            return False
        described = admin.describe_groups(groups)
    return all(
        str(described.get(g, {}).get("group_state", "")) == "Stable" and described[g].get("members")
        for g in groups
    )


class LakeCounter:
    """Rows of one topic in the lake, polled cheaply.

    Lake files are written atomically and never change (content-hashed names), so each
    Parquet footer is read once; polling costs one listing of the topic's folder.
    """

    def __init__(self, store: Any, topic: str) -> None:
        self.store = store
        self.topic = topic
        self._rows: dict[str, int] = {}

    def rows(self) -> int:
        import io

        import pyarrow.parquet as pq

        from lake.parquet import topic_prefix
        from lake.store import LocalStore

        for path in self.store.list(topic_prefix(self.topic)):
            if not path.endswith(".parquet") or path in self._rows:
                continue
            if isinstance(self.store, LocalStore):
                meta = pq.read_metadata(self.store.local_path(path))
            else:
                meta = pq.read_metadata(io.BytesIO(self.store.get(path)))
            self._rows[path] = meta.num_rows
        return sum(self._rows.values())


class CpuMeter:
    """CPU seconds (user + system, all threads) used by some processes between start() and stop()."""

    def __init__(self, pids: dict[str, int | None]) -> None:
        self.pids = pids
        self._tick = os.sysconf("SC_CLK_TCK")
        self._start: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        out = {"bench_driver": time.process_time()}
        for name, pid in self.pids.items():
            if pid is None:
                continue
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[name] = (int(fields[11]) + int(fields[12])) / self._tick  # utime + stime
        return out

    def start(self) -> None:
        self._start = self._now()

    def stop(self) -> dict[str, float]:
        end = self._now()
        self.used = {k: round(end[k] - v, 2) for k, v in self._start.items() if k in end}
        return self.used


def create_bench_topic(bootstrap: str) -> None:
    from kafka.admin import NewTopic

    from streams.admin import admin_client

    with admin_client(bootstrap) as admin:
        admin.create_topics(
            [NewTopic(BENCH_TOPIC, BENCH_PARTITIONS, -1)], raise_errors=False, wait_for_metadata=True
        )


def topic_record_count(bootstrap: str, topic: str) -> int:
    """Sum of partition end offsets (a non-transactional topic: one offset per record)."""
    from kafka import TopicPartition
    from kafka.admin import OffsetSpec

    from streams.admin import admin_client, partition_counts

    with admin_client(bootstrap) as admin:
        n = partition_counts(admin, [topic]).get(topic, 0)
        tps = [TopicPartition(topic, p) for p in range(n)]
        ends = admin.list_partition_offsets(dict.fromkeys(tps, OffsetSpec.LATEST))
    return sum(int(v.offset) for v in ends.values())


@contextlib.contextmanager
def progress_bar() -> Iterator[Progress]:
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=console,
        transient=False,
    ) as progress:
        yield progress


# -- arena path ------------------------------------------------------------------------------


@dataclass
class ArenaResult:
    wall_s: float
    publish_s: float
    first_lake_row_s: float | None
    lake_complete_s: float
    drain_checks: int
    warmup_s: float
    cpu_s: dict[str, float]
    idle_cpu_per_s: dict[str, float]
    timeline: list[tuple[float, int]] = field(default_factory=list)


def publish_servers(bootstrap: str, servers: list[Any]) -> int:
    from producers.publish import publish
    from producers.publish_tools import outgoing

    return asyncio.run(publish(bootstrap, outgoing(servers, [])))


def run_arena(
    settings: Any,
    bootstrap: str,
    supervisor: Any,
    broker_pid: int,
    servers: list[Any],
    warmup: Any,
    timeout_s: float,
) -> ArenaResult:
    from app.registry import topics_by_group
    from consumers.lag import drained
    from lake.store import open_store

    lake = LakeCounter(open_store(settings), "tools.servers")
    groups = topics_by_group(WORKER_NAMES)
    n = len(servers)

    def both_drained() -> bool:
        return drained(bootstrap, groups)

    # Warm-up (untimed): one server through both workers, so lazy start-up costs
    # (embedding model, transactional producers, lake writer, catalog) are paid now.
    console.print("[cyan]warm-up[/cyan]: one server through tools-servers and lake-sink")
    publish_servers(bootstrap, [warmup])
    took = _wait(
        "the warm-up server to reach the lake",
        lambda: lake.rows() >= 1 and both_drained() and both_drained(),
        timeout_s,
        supervisor.check,
    )
    console.print(f"warm-up done in {took:.1f}s")
    target = 1 + n

    pids = {c.name: c.proc.pid if c.proc is not None else None for c in supervisor.children}
    # Idle cost (untimed): what the workers and broker burn with nothing to do. With noida-db 0.2.3 this
    # is large: the broker answers an empty Fetch at once (fetch.max.wait.ms is not honoured), so every
    # idle aiokafka consumer, Faust's included, re-polls thousands of times a second.
    idle = CpuMeter({**pids, "broker": broker_pid})
    idle.start()
    time.sleep(IDLE_PROBE_S)
    idle_cpu = {k: round(v / IDLE_PROBE_S, 3) for k, v in idle.stop().items() if k != "bench_driver"}

    timeline: list[tuple[float, int]] = []
    cpu = CpuMeter({**pids, "broker": broker_pid})
    with progress_bar() as progress:
        task = progress.add_task("arena: lake tools.servers", total=n, info="publishing")
        cpu.start()
        t0 = time.perf_counter()
        sent = publish_servers(bootstrap, servers)
        publish_s = time.perf_counter() - t0
        if sent != n:
            raise BenchError(f"published {sent} of {n} servers")
        progress.update(task, info=f"published in {publish_s:.2f}s")
        first_row_s: float | None = None
        lake_complete_s: float | None = None
        clean = checks = 0
        while True:
            supervisor.check()
            now = time.perf_counter() - t0
            rows = lake.rows() - 1
            timeline.append((round(now, 3), rows))
            if rows > 0 and first_row_s is None:
                first_row_s = now
            progress.update(task, completed=min(rows, n))
            if rows + 1 >= target:
                if lake_complete_s is None:
                    lake_complete_s = now
                    progress.update(task, info="lake complete; confirming drain")
                checks += 1
                clean = clean + 1 if both_drained() else 0
                if clean >= 2:
                    wall_s = time.perf_counter() - t0
                    cpu.stop()
                    progress.update(task, info="drained")
                    break
            if now > timeout_s:
                raise BenchError(
                    f"arena path: {rows} of {n} servers in the lake, drained {clean}x after {timeout_s:.0f}s"
                )
            if rows < n:
                time.sleep(POLL_S)
    assert lake_complete_s is not None
    return ArenaResult(
        wall_s, publish_s, first_row_s, lake_complete_s, checks, took, cpu.used, idle_cpu, timeline
    )


def lake_progress(timeline: list[tuple[float, int]], n: int) -> dict[str, float | None]:
    """Seconds after the start of publishing at which the lake first held 25/50/75/100% of the servers."""
    out: dict[str, float | None] = {}
    for pct in (25, 50, 75, 100):
        need = -(-n * pct // 100)
        out[f"{pct}%"] = next((t for t, rows in timeline if rows >= need), None)
    return out


def verify_lake(settings: Any, servers: list[Any]) -> dict[str, int]:
    """Fail loudly unless every benchmark server is in the lake exactly once, valid."""
    from lake.parquet import lake_listing, read_topic
    from lake.store import open_store

    store = open_store(settings)
    table = read_topic(store, "tools.servers")
    names = {s.server for s in servers}
    rows = [r for r in table.select(["_key", "_valid", "name", "tools"]).to_pylist() if r["name"] in names]
    keys = {r["_key"] for r in rows}
    invalid = sum(1 for r in rows if not r["_valid"])
    tools = sum(len(json.loads(r["tools"])) for r in rows)
    expected_tools = sum(len(s.entries) for s in servers)
    listed = {t.topic: t.rows for t in lake_listing(store)}
    problems = []
    if len(rows) != len(servers) or len({r["name"] for r in rows}) != len(servers):
        problems.append(f"{len(rows)} rows for {len(servers)} servers")
    if len(keys) != len(rows):
        problems.append("duplicate keys")
    if invalid:
        problems.append(f"{invalid} invalid rows")
    if tools != expected_tools:
        problems.append(f"{tools} tools in the lake, {expected_tools} published")
    for side in ("tools.raw.dlq", "tools.raw.rejected"):
        if listed.get(side):
            problems.append(f"{listed[side]} rows in {side}")
    if problems:
        raise BenchError("lake check failed: " + "; ".join(problems))
    return {"tools.servers": len(rows), "tools": tools, "tools.raw": listed.get("tools.raw", 0) - 1}


# -- baseline path ---------------------------------------------------------------------------


@dataclass
class BaselineResult:
    wall_s: float
    work_s: float
    classify_s: float
    servers: int
    tools: int
    produced: int
    cpu_s: dict[str, float]


@contextlib.contextmanager
def timed_classify() -> Iterator[list[float]]:
    """Accumulate the seconds ``build_server`` spends in ``classify_domain`` (this process only)."""
    from streams.tools import tools_servers

    original = tools_servers.classify_domain
    spent = [0.0]

    def wrapper(texts: list[str]) -> Any:
        t0 = time.perf_counter()
        try:
            return original(texts)
        finally:
            spent[0] += time.perf_counter() - t0

    tools_servers.classify_domain = wrapper  # type: ignore[assignment]
    try:
        yield spent
    finally:
        tools_servers.classify_domain = original  # type: ignore[assignment]


async def run_baseline(
    bootstrap: str, settings: Any, broker_pid: int, n: int, skip_key: str, timeout_s: float
) -> BaselineResult:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from arena.topics import topic
    from streams.runtime import Context, decode, encode
    from streams.tools.tools_servers import STAGE, build_server

    spec = topic("tools.raw")
    consumer = AIOKafkaConsumer(
        spec.name,
        bootstrap_servers=bootstrap,
        group_id=BASELINE_GROUP,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, max_request_size=8 * 1024 * 1024
    )
    await producer.start()
    await consumer.start()
    try:
        futures = []
        done = tools = 0
        work_s = 0.0
        cpu = CpuMeter({"broker": broker_pid})
        with progress_bar() as progress, timed_classify() as classify_s:
            task = progress.add_task("baseline: consume->produce", total=n, info="")
            cpu.start()
            t0 = time.perf_counter()
            while done < n:
                if time.perf_counter() - t0 > timeout_s:
                    raise BenchError(f"baseline: only {done} of {n} records after {timeout_s:.0f}s")
                batch = await consumer.getmany(timeout_ms=500)
                for tp, messages in batch.items():
                    for msg in messages:
                        key = (msg.key or b"").decode("utf-8", "replace")
                        if key == skip_key:
                            continue  # the warm-up server of the arena path
                        w0 = time.perf_counter()
                        decoded = decode(
                            spec,
                            msg.value,
                            stage="bench-baseline",
                            source_key=key,
                            partition=tp.partition,
                            offset=msg.offset,
                        )
                        if decoded.record is None:
                            raise BenchError(f"baseline: undecodable record at {tp}@{msg.offset}")
                        ctx = Context(STAGE.name, STAGE.version, spec, key, settings)
                        emits = build_server(decoded.record, ctx)  # type: ignore[arg-type]
                        outs = [e for e in emits if e.topic == "tools.servers"]
                        if len(outs) != 1 or len(emits) != 1:
                            raise BenchError(f"baseline: server {key} was gated ({[e.topic for e in emits]})")
                        k, v, headers = encode(outs[0], stage=STAGE.name, stage_version=STAGE.version)
                        tools += len(outs[0].value.tools)  # type: ignore[attr-defined]
                        work_s += time.perf_counter() - w0
                        futures.append(await producer.send(BENCH_TOPIC, v, key=k, headers=headers))
                        done += 1
                progress.update(task, completed=done)
            await asyncio.gather(*futures)
            wall_s = time.perf_counter() - t0
            cpu.stop()
        await consumer.commit()
    finally:
        await consumer.stop()
        await producer.stop()
    return BaselineResult(wall_s, work_s, classify_s[0], done, tools, len(futures), cpu.used)


# -- main ------------------------------------------------------------------------------------


def _isolate_env(home: Path) -> None:
    """The bench must not pick up a developer's ARENA_* settings or arena.toml."""
    for name in [k for k in os.environ if k.startswith("ARENA_")]:
        del os.environ[name]
    os.environ["ARENA_HOME"] = str(home)
    os.environ["ARENA_CONFIG"] = str(home / "arena.toml")  # never exists
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _dump_logs(home: Path, lines: int = 15) -> None:
    for log in sorted((home / "logs").glob("*.log")):
        with contextlib.suppress(OSError):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            console.print(f"[yellow]--- last {len(tail)} lines of {log.name}[/yellow]", highlight=False)
            console.print("\n".join(tail), markup=False, highlight=False)


def _terminate(signum: int, _frame: object) -> None:
    # SIGTERM unwinds like Ctrl-C, so the finally blocks stop the workers and the broker.
    raise SystemExit(128 + signum)


def bench(n: int, t: int, seed: int, timeout_s: float) -> dict[str, Any]:
    from app import stack
    from app.registry import worker
    from app.worker import Supervisor
    from arena.config import ArenaSettings
    from producers.publish_tools import raw_key
    from streams.admin import ensure_topics

    servers = synthetic_servers(n, t, seed)
    warmup = synthetic_server(random.Random(seed ^ 0x5EED), WARMUP_NAME, max(3, t))
    total_tools = sum(len(s.entries) for s in servers)

    with tempfile.TemporaryDirectory(prefix="arena-bench-") as tmp:
        home = Path(tmp)
        _isolate_env(home)
        settings = ArenaSettings(home=home)
        supervisor: Supervisor | None = None
        setup: dict[str, float] = {}
        try:
            t0 = time.perf_counter()
            state = stack.up(settings)
            bootstrap = state.broker
            ensure_topics(bootstrap)
            create_bench_topic(bootstrap)
            setup["broker_and_topics_s"] = round(time.perf_counter() - t0, 2)
            console.print(f"[cyan]embedded broker[/cyan] {bootstrap} under {home}")

            supervisor = Supervisor(settings, bootstrap, WORKER_NAMES, console)
            supervisor.start()
            groups = [worker(w).group for w in WORKER_NAMES]
            setup["workers_stable_s"] = round(
                _wait(
                    f"consumer groups {groups} to be Stable",
                    lambda: groups_stable(bootstrap, groups),
                    timeout_s,
                    supervisor.check,
                ),
                2,
            )
            console.print(f"workers ready in {setup['workers_stable_s']:.1f}s (excluded from timing)")

            arena = run_arena(settings, bootstrap, supervisor, state.pid, servers, warmup, timeout_s)
            setup["arena_warmup_s"] = round(arena.warmup_s, 2)
            lake = verify_lake(settings, servers)
            console.print(
                f"[green]arena[/green]: {n} servers / {total_tools} tools in {arena.wall_s:.2f}s "
                f"(lake complete at {arena.lake_complete_s:.2f}s)"
            )
            # Free the cores for the baseline: the idle Faust workers still poll.
            supervisor.stop()
            supervisor = None

            from synthesis.sft.domains import classify_domain

            w0 = time.perf_counter()
            classify_domain(["warm up the embedding model"])  # untimed, like the arena warm-up
            setup["baseline_model_load_s"] = round(time.perf_counter() - w0, 2)
            base = asyncio.run(run_baseline(bootstrap, settings, state.pid, n, raw_key(warmup), timeout_s))
            produced = topic_record_count(bootstrap, BENCH_TOPIC)
            if base.servers != n or produced != n or base.tools != total_tools:
                raise BenchError(
                    f"baseline processed {base.servers} servers / {base.tools} tools, "
                    f"{produced} records on {BENCH_TOPIC}; expected {n} / {total_tools}"
                )
            console.print(f"[green]baseline[/green]: {n} servers in {base.wall_s:.2f}s")
        except BaseException:
            _dump_logs(home)  # the temporary home, and its logs, go away with the stack
            raise
        finally:
            if supervisor is not None:
                with contextlib.suppress(Exception):
                    supervisor.stop()
            with contextlib.suppress(Exception):
                stack.down(settings)

    arena_docs = total_tools / arena.wall_s
    base_docs = total_tools / base.wall_s
    return {
        "benchmark": "backbone",
        "servers": n,
        "tools_per_server": t,
        "tool_docs": total_tools,
        "seed": seed,
        "arena": {
            "docs_per_s": round(arena_docs, 2),
            "servers_per_s": round(n / arena.wall_s, 2),
            "wall_s": round(arena.wall_s, 3),
            "publish_s": round(arena.publish_s, 3),
            "first_lake_row_s": None if arena.first_lake_row_s is None else round(arena.first_lake_row_s, 3),
            "lake_complete_s": round(arena.lake_complete_s, 3),
            "drain_confirm_s": round(arena.wall_s - arena.lake_complete_s, 3),
            "drain_checks": arena.drain_checks,
            "lake_progress_s": lake_progress(arena.timeline, n),
            "cpu_s": arena.cpu_s,
            "idle_cpu_s_per_s": arena.idle_cpu_per_s,
            "lake_rows": lake,
        },
        "baseline": {
            "docs_per_s": round(base_docs, 2),
            "servers_per_s": round(n / base.wall_s, 2),
            "wall_s": round(base.wall_s, 3),
            "per_record_work_s": round(base.work_s, 3),
            "classify_domain_s": round(base.classify_s, 3),
            "kafka_s": round(base.wall_s - base.work_s, 3),
            "cpu_s": base.cpu_s,
            "produced": base.produced,
        },
        "ratio": round(arena_docs / base_docs, 4),
        "setup_excluded_s": setup,
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
        "broker": BROKER,
        "versions": {
            pkg: importlib.metadata.version(pkg)
            for pkg in ("noida-db", "faust-streaming", "aiokafka", "kafka-python", "pyarrow", "torch")
        },
        "note": (
            "arena: wall time from the start of publishing N tools.raw records (idempotent producer, acks=all) "
            "until the tools-servers worker (Faust, exactly-once: outputs + offsets in one Kafka transaction "
            "per input partition) has normalised, gated and domain-classified every server (MiniLM embedding) "
            "into tools.servers, the lake-sink worker (Faust, at-least-once) has written every topic to "
            "Parquet + the SQLite catalog, the lake holds all N servers, and consumers.lag.drained was true on "
            "two checks in a row; excludes broker/worker start-up and one untimed warm-up server. "
            "baseline: one in-process aiokafka consumer (own group, earliest) -> the stage's own per-record work "
            "(streams.runtime.decode: JSON + RawToolServer validation; tools_servers.build_server: "
            "normalize_server + server_gate + classify_domain + ToolServer; streams.runtime.encode) -> idempotent "
            f"AIOKafkaProducer (acks=all) to {BENCH_TOPIC}, offsets committed at the end; timed from first poll "
            "to last produce acked, model warmed first, workers stopped. Same N records, same broker, same run; "
            "ratio = arena docs/s / baseline docs/s, so it measures what Faust, transactions, the second "
            "consumer group, the Parquet lake and drain detection cost on top of the same JSON/embedding work. "
            "docs = tool entries; servers_per_s counts tools.raw records."
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--servers", type=int, default=300, help="synthetic servers to publish (N)")
    parser.add_argument("--tools-per-server", type=int, default=5, help="about T tools per server (>= 3)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic generator")
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="give up on a phase after this many seconds"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 8 servers, 3 tools each; not a measurement"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.servers, args.tools_per_server, args.timeout = 8, 3, min(args.timeout, 180.0)
    if args.servers < 1 or args.tools_per_server < 3:
        parser.error(
            "--servers must be >= 1 and --tools-per-server >= 3 (servers need 3 tools to pass the gates)"
        )
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = bench(args.servers, args.tools_per_server, args.seed, args.timeout)
    except BenchError as exc:
        console.print(f"[red]benchmark failed[/red]: {exc}")
        return 1
    print(json.dumps({"quick": args.quick, **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

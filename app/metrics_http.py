"""The /metrics endpoints: consumer lag computed when scraped, and the HTTP server that serves them.

``arena train`` serves its own process (``serve_process_metrics``). ``arena worker`` serves
``WorkerMetrics``: what its stage processes write to a shared folder (``PROMETHEUS_MULTIPROC_DIR``,
summed over processes), the supervisor's view of its workers, and consumer lag with the topics'
end offsets, from ``consumers.lag.compute_lag`` -- the function behind `arena lag`, so both show
the same figures. The HTTP server answers from its own thread, so the blocking Kafka admin calls
of a scrape never run on an event loop; figures younger than ``lag_cache_s`` are reused.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, multiprocess, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from arena.config import ArenaSettings, MetricsSettings
from arena.metrics import MULTIPROC_ENV
from consumers.lag import LagRow, compute_lag

LagSource = Callable[[], list[LagRow]]

log = logging.getLogger("arena.metrics")


class MetricsPortError(RuntimeError):
    """The endpoint could not bind its address."""


class LagCollector(Collector):
    """Lag per group/topic/partition and end offsets per topic/partition, computed at scrape time.

    Lag counts data records (``consumers.lag``): 0 on a drained partition, whatever transaction
    markers lie behind the commit; the offset distance is ``arena_consumer_group_offset_lag``. A group
    that never ran is idle: ``arena_consumer_group_idle`` 1 and no lag series, so an alert on lag
    does not fire for a trainer nobody started.
    """

    def __init__(self, rows: LagSource, *, cache_s: float = 2.0) -> None:
        self._source = rows
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._rows: list[LagRow] = []
        self._at = -float("inf")
        self._ok = False
        self._seconds = 0.0
        self._errors = 0

    @classmethod
    def for_broker(
        cls,
        bootstrap: str,
        *,
        groups: list[str] | None = None,
        topics_by_group: Mapping[str, Iterable[str]] | None = None,
        cache_s: float = 2.0,
    ) -> LagCollector:
        """Lag of ``groups`` (None: every group the cluster knows, as `arena lag` shows) on ``bootstrap``."""
        explicit = {g: list(ts) for g, ts in (topics_by_group or {}).items()}
        return cls(lambda: compute_lag(bootstrap, groups, topics_by_group=explicit), cache_s=cache_s)

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # registering must not compute lag

    def rows(self) -> list[LagRow]:
        """The lag rows, recomputed when older than ``cache_s``; the last ones (or none) when the broker fails."""
        with self._lock:
            if time.monotonic() - self._at >= self.cache_s:
                started = time.perf_counter()
                try:
                    self._rows, self._ok = self._source(), True
                except Exception as exc:  # a scrape must answer even when the broker is away
                    log.warning("consumer lag for /metrics failed: %s", exc)
                    self._ok = False
                    self._errors += 1
                self._seconds = time.perf_counter() - started
                self._at = time.monotonic()
            return self._rows

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        rows = self.rows()
        part = ["topic", "partition"]
        member = ["group", *part]
        end = GaugeMetricFamily(
            "arena_topic_end_offset", "read_committed end offset (last stable offset).", labels=part
        )
        log_end = GaugeMetricFamily(
            "arena_topic_log_end_offset", "read_uncommitted end offset (high watermark).", labels=part
        )
        lag = GaugeMetricFamily(
            "arena_consumer_group_lag",
            "Data records the group would still receive, as `arena lag` LAG (markers not counted; "
            "a lower bound when capped; absent for an idle group).",
            labels=member,
        )
        pending = GaugeMetricFamily(
            "arena_consumer_group_pending", "The same count as arena_consumer_group_lag.", labels=member
        )
        offset_lag = GaugeMetricFamily(
            "arena_consumer_group_offset_lag",
            "end offset - committed offset, markers included (kafka-consumer-groups' LAG).",
            labels=member,
        )
        committed = GaugeMetricFamily(
            "arena_consumer_group_committed_offset", "Committed offset (absent: none yet).", labels=member
        )
        idle = GaugeMetricFamily(
            "arena_consumer_group_idle",
            "1 when the group never ran (no committed offset, no live member), else 0.",
            labels=["group"],
        )
        seen: set[tuple[str, int]] = set()
        idle_of: dict[str, bool] = {}
        for r in rows:
            where = [r.topic, str(r.partition)]
            if (r.topic, r.partition) not in seen:
                seen.add((r.topic, r.partition))
                end.add_metric(where, r.end)
                log_end.add_metric(where, r.log_end)
            idle_of[r.group] = r.idle
            if not r.idle:
                lag.add_metric([r.group, *where], r.lag)
                pending.add_metric([r.group, *where], r.pending)
                offset_lag.add_metric([r.group, *where], r.offset_lag)
            if r.committed is not None:
                committed.add_metric([r.group, *where], r.committed)
        for group, never_ran in sorted(idle_of.items()):
            idle.add_metric([group], int(never_ran))
        yield from (end, log_end, lag, pending, offset_lag, committed, idle)
        yield GaugeMetricFamily(
            "arena_lag_up", "1 when the last lag computation reached the broker.", value=self._ok
        )
        yield GaugeMetricFamily(
            "arena_lag_compute_seconds", "Time the last lag computation took.", value=self._seconds
        )
        yield CounterMetricFamily(
            "arena_lag_compute_errors",
            "Lag computations that failed (broker unreachable).",
            value=self._errors,
        )


# --- the HTTP endpoint ----------------------------------------------------


@dataclass
class MetricsServer:
    """A running /metrics endpoint."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve ``registry`` on http://host:port/metrics from a daemon thread (port 0: any free port)."""
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise MetricsPortError(
            f"cannot serve /metrics on {host}:{port}: {exc.strerror or exc} "
            "(fix: pick another --metrics-port / ARENA_METRICS__PORT, or 0 to turn the endpoint off)"
        ) from None
    return MetricsServer(server, thread)


def serve_process_metrics(settings: MetricsSettings) -> MetricsServer | None:
    """This process's metrics (``arena train``), or None when the port is 0."""
    if settings.port == 0:
        return None
    return serve(REGISTRY, settings.host, settings.port)


# --- arena worker ---------------------------------------------------------


class WorkerView(Protocol):
    """What the worker collector reads from the supervisor (``app.worker.Supervisor``)."""

    def snapshot(self) -> list[tuple[str, bool, int]]:
        """(stage, running, restarts) per worker process."""
        ...


class WorkersCollector(Collector):
    """The supervisor's worker processes: running per stage and restarts."""

    def __init__(self, view: WorkerView) -> None:
        self.view = view

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        running = GaugeMetricFamily(
            "arena_worker_processes", "Worker processes running per stage.", labels=["stage"]
        )
        restarts = CounterMetricFamily(
            "arena_worker_restarts", "Worker processes restarted after dying.", labels=["stage"]
        )
        up: dict[str, int] = {}
        again: dict[str, int] = {}
        for stage, alive, count in self.view.snapshot():
            up[stage] = up.get(stage, 0) + int(alive)
            again[stage] = again.get(stage, 0) + count
        for stage in sorted(up):
            running.add_metric([stage], up[stage])
            restarts.add_metric([stage], again[stage])
        yield running
        yield restarts


class WorkerMetrics:
    """The endpoint of `arena worker`: its stage processes' metrics (multiprocess), workers, lag."""

    def __init__(
        self,
        settings: MetricsSettings,
        folder: Path,
        lag: LagCollector,
        view: WorkerView,
    ) -> None:
        self.folder = folder
        shutil.rmtree(folder, ignore_errors=True)  # values of an earlier run must not add up with these
        folder.mkdir(parents=True)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(folder))
        registry.register(WorkersCollector(view))
        registry.register(lag)
        self.registry = registry
        try:
            self.server = serve(registry, settings.host, settings.port)
        except MetricsPortError:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    @property
    def port(self) -> int:
        return self.server.port

    def child_env(self) -> dict[str, str]:
        """Environment a stage process needs so that its metrics reach this endpoint."""
        return {MULTIPROC_ENV: str(self.folder)}

    def process_ended(self, pid: int) -> None:
        """Drop the live gauges (in flight, sessions open) of a stage process that ended."""
        multiprocess.mark_process_dead(pid, str(self.folder))

    def stop(self) -> None:
        self.server.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def with_metrics_port(settings: ArenaSettings, port: int | None) -> ArenaSettings:
    """``settings`` with the metrics port a command-line option gave (None: unchanged)."""
    if port is None:
        return settings
    return settings.model_copy(update={"metrics": settings.metrics.model_copy(update={"port": port})})

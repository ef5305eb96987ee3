"""Prometheus metrics: lag on /metrics equals `arena lag`, and stages, LLM calls, sandbox and trainer count.

The lag tests run on the session broker; the worker test runs `arena worker --metrics-port` on a
private stack and reads what its stage process recorded through the supervisor's endpoint.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.metrics_http import LagCollector, MetricsPortError, serve
from arena import metrics
from arena.config import SandboxSettings
from arena.llm.budget import estimated_usage
from arena.llm.core import Completion, CompletionRequest, TransientError, Usage
from arena.llm.gateway import Gateway, GatewayUsage
from arena.records.common import DeadLetter, DeadLetterKind, Rejection
from consumers.lag import LagRow, compute_lag
from sandbox.pool import SandboxPool
from simulator.backend import RulesBackend
from streams.usage import usage_records
from tests.cli import ARENA, arena_env, broker_of, run_arena
from tests.test_gateway import ECHO, TEST_RULES, CountingBackend, EchoIn

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of http://127.0.0.1:port/metrics by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def lag_samples(samples: Samples, group: str) -> dict[tuple[str, str, str], float]:
    """(metric, topic, partition) -> value of ``group``'s per-partition lag metrics."""
    out: dict[tuple[str, str, str], float] = {}
    for (name, labels), value in samples.items():
        by = dict(labels)
        if by.get("group") == group and "topic" in by:
            out[(name, by["topic"], by["partition"])] = value
    return out


def expected_from_rows(rows: list[dict[str, object]]) -> dict[tuple[str, str, str], float]:
    out: dict[tuple[str, str, str], float] = {}
    for r in rows:
        where = (str(r["topic"]), str(r["partition"]))
        if not r["idle"]:  # an idle group has no lag series
            out[("arena_consumer_group_lag", *where)] = float(r["lag"])  # type: ignore[arg-type]
            out[("arena_consumer_group_pending", *where)] = float(r["pending"])  # type: ignore[arg-type]
            out[("arena_consumer_group_offset_lag", *where)] = float(r["offset_lag"])  # type: ignore[arg-type]
        if r["committed"] is not None:
            out[("arena_consumer_group_committed_offset", *where)] = float(r["committed"])  # type: ignore[arg-type]
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def endpoint() -> Iterator[Callable[[LagCollector], int]]:
    """Serve a LagCollector on a free loopback port; returns the port."""
    servers = []

    def start(collector: LagCollector) -> int:
        registry = CollectorRegistry()
        registry.register(collector)
        server = serve(registry, "127.0.0.1", 0)
        servers.append(server)
        return server.port

    yield start
    for server in servers:
        server.stop()


# --- lag ------------------------------------------------------------------


@pytest.mark.integration
def test_lag_on_metrics_equals_compute_lag_and_the_cli(
    broker: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    endpoint: Callable[[LagCollector], int],
    tmp_path: Path,
) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("g")
    producer = KafkaProducer(bootstrap_servers=broker)
    for partition, n in ((0, 7), (1, 3)):
        for i in range(n):
            producer.send(topic, f"{partition}-{i}".encode(), partition=partition)
    producer.flush()
    producer.close()
    # A real group member reads part of the topic and commits what it read.
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=broker,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    read = 0
    deadline = time.monotonic() + 20
    while read < 4 and time.monotonic() < deadline:
        read += sum(len(r) for r in consumer.poll(timeout_ms=200, max_records=4 - read).values())
    consumer.commit()
    consumer.close(autocommit=False)
    assert read == 4

    port = endpoint(LagCollector.for_broker(broker, cache_s=0))  # every group, as `arena lag`
    samples = scrape(port)
    rows = compute_lag(broker, [group])
    assert sum(r.lag for r in rows) == 6 and {r.committed for r in rows} != {None}
    expected = expected_from_rows([r.model_dump() for r in rows])
    assert lag_samples(samples, group) == expected
    for r in rows:
        assert (
            samples[("arena_topic_end_offset", (("partition", str(r.partition)), ("topic", topic)))] == r.end
        )
    assert samples[("arena_lag_up", ())] == 1.0

    cli = run_arena(["lag", "--json", "--group", group], arena_env(tmp_path / "home", ARENA_BROKER=broker))
    assert expected_from_rows(json.loads(cli.stdout)) == expected


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(MetricsPortError, match=r"127\.0\.0\.1:\d+: .*fix: pick another --metrics-port"):
            serve(CollectorRegistry(), "127.0.0.1", taken.getsockname()[1])


def test_lag_is_cached_between_scrapes_and_a_failing_broker_keeps_the_endpoint_up(
    endpoint: Callable[[LagCollector], int],
) -> None:
    calls: list[float] = []
    fail = False
    row = LagRow(group="g", topic="t", partition=0, committed=1, end=5, log_end=5, lag=4, offset_lag=4)

    def source() -> list[LagRow]:
        calls.append(time.monotonic())
        if fail:
            raise ConnectionRefusedError("broker gone")
        return [row]

    collector = LagCollector(source, cache_s=0.5)
    port = endpoint(collector)
    first = scrape(port)
    assert scrape(port) == first and len(calls) == 1  # within cache_s: not asked again
    assert first[("arena_consumer_group_lag", (("group", "g"), ("partition", "0"), ("topic", "t")))] == 4
    time.sleep(0.6)
    fail = True
    down = scrape(port)
    assert len(calls) == 2
    assert down[("arena_lag_up", ())] == 0.0 and down[("arena_lag_compute_errors_total", ())] == 1.0
    # the last figures stay until the broker answers again
    assert down[("arena_consumer_group_lag", (("group", "g"), ("partition", "0"), ("topic", "t")))] == 4


def test_an_idle_group_is_idle_on_metrics_not_lagging(endpoint: Callable[[LagCollector], int]) -> None:
    drained = LagRow(
        group="stage", topic="t", partition=0, committed=13, end=14, log_end=14, lag=0, offset_lag=1
    )
    never = LagRow(
        group="trainer",
        topic="t",
        partition=0,
        committed=None,
        end=14,
        log_end=14,
        lag=10,
        offset_lag=14,
        idle=True,
    )
    samples = scrape(endpoint(LagCollector(lambda: [drained, never], cache_s=0)))
    where = (("partition", "0"), ("topic", "t"))
    assert samples[("arena_consumer_group_lag", (("group", "stage"), *where))] == 0  # the marker is no record
    assert samples[("arena_consumer_group_pending", (("group", "stage"), *where))] == 0
    assert samples[("arena_consumer_group_offset_lag", (("group", "stage"), *where))] == 1
    assert samples[("arena_consumer_group_idle", (("group", "stage"),))] == 0
    assert samples[("arena_consumer_group_idle", (("group", "trainer"),))] == 1
    assert lag_samples(samples, "trainer") == {}  # no lag series for a group that never ran


# --- in-process metrics ---------------------------------------------------


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_stage_outputs_count_dead_letters_by_kind_and_rejections_by_gate() -> None:
    stage = "test-stage-outputs"
    letter = DeadLetter(
        stage=stage,
        topic="tools.raw",
        kind=DeadLetterKind.parse_error,
        reason="x",
        payload_text="",
        payload_b64="",
    )
    rejection = Rejection(
        stage=stage, topic="tools.raw", source_key="k", gate="min_tools", reason="0", subject="s"
    )
    with metrics.stage_record(stage):
        assert value("arena_stage_in_flight", stage=stage) == 1
    metrics.stage_outputs(stage, [("tools.raw.dlq", letter), ("tools.raw.rejected", rejection)])
    assert value("arena_stage_records_total", stage=stage) == 1
    assert value("arena_stage_in_flight", stage=stage) == 0
    assert value("arena_stage_latency_seconds_count", stage=stage) == 1
    assert value("arena_dead_letters_total", stage=stage, kind="parse_error") == 1
    assert value("arena_rejections_total", stage=stage, gate="min_tools") == 1
    assert value("arena_stage_outputs_total", stage=stage, topic="tools.raw.dlq") == 1


def test_llm_requests_tokens_and_errors_per_role() -> None:
    class Flaky(CountingBackend):
        """The rules backend behind an endpoint that drops the first request and reports usage."""

        async def complete(self, request: CompletionRequest) -> Completion:
            if not self.requests:
                self.requests.append(request)
                assert value("arena_llm_requests_in_flight", role=ECHO.name, backend="rules") == 1
                raise TransientError("connection reset")
            completion = await super().complete(request)
            return Completion(text=completion.text, usage=Usage(prompt_tokens=11, completion_tokens=5))

    labels = {"role": ECHO.name, "backend": "rules"}
    before = {
        k: value(name, **labels, **extra)
        for k, (name, extra) in {
            "ok": ("arena_llm_requests_total", {"outcome": "ok"}),
            "transient": ("arena_llm_errors_total", {"kind": "transient"}),
            "prompt": ("arena_llm_tokens_total", {"kind": "prompt"}),
            "completion": ("arena_llm_tokens_total", {"kind": "completion"}),
        }.items()
    }

    async def run() -> None:
        gateway = Gateway(Flaky(RulesBackend(seed=0, rules=TEST_RULES)), max_attempts=3, backoff_s=0.01)
        try:
            await gateway.call(ECHO, EchoIn(text="metrics"))
        finally:
            await gateway.aclose()

    asyncio.run(run())
    assert value("arena_llm_requests_total", **labels, outcome="ok") == before["ok"] + 1
    assert value("arena_llm_errors_total", **labels, kind="transient") == before["transient"] + 1
    assert value("arena_llm_tokens_total", **labels, kind="prompt") == before["prompt"] + 11
    assert value("arena_llm_tokens_total", **labels, kind="completion") == before["completion"] + 5
    assert value("arena_llm_requests_in_flight", **labels) == 0


def test_rules_backend_reports_estimated_tokens_to_metrics_and_llm_usage() -> None:
    """The offline backend has no tokenizer: its usage is the budget's estimate, flagged as such, and
    it reaches the token counters and the ``llm.usage`` records like a real server's."""
    labels = {"role": ECHO.name, "backend": "rules"}
    before = {kind: value("arena_llm_tokens_total", **labels, kind=kind) for kind in ("prompt", "completion")}
    backend = CountingBackend(RulesBackend(seed=0, rules=TEST_RULES))

    async def run() -> GatewayUsage:
        gateway = Gateway(backend)
        try:
            answer = await gateway.call(ECHO, EchoIn(text="count my tokens"))
            assert answer.usage.prompt_tokens > 0 and answer.usage.completion_tokens > 0
            return gateway.usage
        finally:
            await gateway.aclose()

    usage = asyncio.run(run())
    (request,) = backend.requests
    completion = asyncio.run(RulesBackend(seed=0, rules=TEST_RULES).complete(request))
    assert completion.usage == estimated_usage(request.messages, request.tools, completion.text)
    assert completion.usage.estimated and completion.usage.completion_tokens == -(-len(completion.text) // 3)
    tokens = (completion.usage.prompt_tokens, completion.usage.completion_tokens)
    after = tuple(value("arena_llm_tokens_total", **labels, kind=kind) - before[kind] for kind in before)
    assert after == tokens
    exposition = generate_latest(REGISTRY).decode()
    (family,) = [f for f in text_string_to_metric_families(exposition) if f.name == "arena_llm_tokens"]
    assert {s.labels["kind"] for s in family.samples if s.labels.get("role") == ECHO.name} >= {
        "prompt",
        "completion",
    }
    now = datetime.now(UTC)
    (record,) = usage_records("-", usage, {}, now, now, pid=1)
    assert (record.prompt_tokens, record.completion_tokens) == tokens


def test_sandbox_sessions_gauge_and_verdicts() -> None:
    settings = SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 1.0, "max_procs": 8})
    opened, ok, timeout = (
        value("arena_sandbox_sessions_opened_total"),
        value("arena_sandbox_sessions_ended_total", verdict="ok"),
        value("arena_sandbox_sessions_ended_total", verdict="timeout"),
    )

    async def run() -> None:
        async with SandboxPool(settings) as pool:
            base = value("arena_sandbox_sessions_open")
            first = await pool.open_session()
            second = await pool.open_session()
            assert value("arena_sandbox_sessions_open") == base + 2
            assert (await first.run("1 + 1")).ok
            await first.close()
            assert value("arena_sandbox_sessions_open") == base + 1
            assert not (await second.run("while True: pass", timeout_s=0.3)).ok
            await second.close()
            assert value("arena_sandbox_sessions_open") == base

    asyncio.run(run())
    assert value("arena_sandbox_sessions_opened_total") == opened + 2
    assert value("arena_sandbox_sessions_ended_total", verdict="ok") == ok + 1
    assert value("arena_sandbox_sessions_ended_total", verdict="timeout") == timeout + 1


def test_trainer_step_metrics() -> None:
    run = "test-metrics-run"
    metrics.trainer_step(run, "sft", 1, {"loss": 2.5, "tokens": 400.0, "samples": 8.0, "step_s": 2.0})
    metrics.trainer_step(
        run,
        "grpo",
        2,
        {
            "loss": -0.1,
            "reward_mean": 0.75,
            "trajectories": 16.0,
            "response_tokens_mean": 10.0,
            "step_s": 4.0,
        },
    )
    assert value("arena_trainer_step", run=run) == 2
    assert value("arena_trainer_steps_total", run=run, phase="sft") == 1
    assert value("arena_trainer_loss", run=run, phase="sft") == 2.5
    assert value("arena_trainer_tokens_per_second", run=run, phase="sft") == 200
    assert value("arena_trainer_samples_per_second", run=run, phase="grpo") == 4
    assert value("arena_trainer_tokens_total", run=run, phase="grpo") == 160
    assert value("arena_trainer_reward_mean", run=run) == 0.75


# --- arena worker ---------------------------------------------------------


def _tool(name: str) -> dict[str, object]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "Search the catalogue for matching items by keyword.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }


@pytest.mark.integration
def test_arena_worker_serves_stage_metrics_and_lag_that_arena_lag_shows(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = arena_env(home)
    run_arena(["topics", "create"], env)
    try:
        bootstrap = broker_of(home)
        port = free_port()
        proc = subprocess.Popen(
            [ARENA, "worker", "--stage", "tools-servers", "--metrics-port", str(port)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            producer = KafkaProducer(bootstrap_servers=bootstrap)
            good = {
                "server": "metrics-srv",
                "source": "/m.json",
                "format": "openai",
                "entries": [_tool(f"t{i}") for i in range(3)],
            }
            producer.send("tools.raw", json.dumps(good).encode(), key=b"good")
            producer.send("tools.raw", b'{"server": "cut', key=b"broken")
            producer.flush()
            producer.close()
            stage = (("stage", "tools-servers"),)
            samples: Samples = {}
            deadline = time.monotonic() + 240  # ~15 s to start; a loaded 2-core box is slower
            while time.monotonic() < deadline:
                try:
                    samples = scrape(port)
                except OSError:
                    samples = {}
                group_lag = lag_samples(samples, "arena-tools-servers")
                pending = [
                    v for (name, _, _), v in group_lag.items() if name == "arena_consumer_group_pending"
                ]
                if samples.get(("arena_stage_records_total", stage), 0) >= 2 and pending and not any(pending):
                    break
                time.sleep(0.5)
            # a rebalance may hand a record to the stage again: at least (not exactly) these counts
            assert samples.get(("arena_stage_records_total", stage), 0) >= 2, proc.poll()
            assert (
                samples[("arena_dead_letters_total", (("kind", "parse_error"), ("stage", "tools-servers")))]
                >= 1
            )
            assert (
                samples[
                    ("arena_stage_outputs_total", (("stage", "tools-servers"), ("topic", "tools.servers")))
                ]
                >= 1
            )
            assert samples[("arena_stage_latency_seconds_count", stage)] >= 2
            assert samples[("arena_stage_in_flight", stage)] == 0
            assert samples[("arena_worker_processes", stage)] == 1

            # The stage ledger (cached for 15 s): one record produced, one dead-lettered, balanced.
            ledger = {
                ("produced",): 1.0,
                ("dead_lettered",): 1.0,
                ("rejected",): 0.0,
                ("in_flight",): 0.0,
            }
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                samples = scrape(port)
                seen = {
                    tuple(v for k, v in labels if k == "outcome"): value
                    for (name, labels), value in samples.items()
                    if name == "arena_stage_ledger_records" and ("stage", "tools-servers") in labels
                }
                if seen == ledger:
                    break
                time.sleep(1)
            assert seen == ledger
            assert samples[("arena_stage_ledger_in", stage)] == 2
            assert samples[("arena_stage_ledger_balanced", stage)] == 1
            assert (
                samples[
                    (
                        "arena_stage_ledger_dead_lettered",
                        (("kind", "parse_error"), ("stage", "tools-servers")),
                    )
                ]
                == 1
            )

            cli = run_arena(["lag", "--json", "--group", "arena-tools-servers"], env)
            assert lag_samples(scrape(port), "arena-tools-servers") == expected_from_rows(
                json.loads(cli.stdout)
            )
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        assert not (home / "metrics").exists() or not any((home / "metrics").iterdir())
    finally:
        run_arena(["down"], env, check=None)


# --- the Grafana dashboard ------------------------------------------------

DASHBOARD = Path(__file__).parent.parent / "deploy" / "grafana" / "arena-dashboard.json"
LAG_METRICS = {
    "arena_topic_end_offset",
    "arena_topic_log_end_offset",
    "arena_consumer_group_lag",
    "arena_consumer_group_pending",
    "arena_consumer_group_offset_lag",
    "arena_consumer_group_idle",
    "arena_consumer_group_committed_offset",
    "arena_lag_up",
    "arena_lag_compute_seconds",
    "arena_lag_compute_errors_total",
    "arena_worker_processes",
    "arena_worker_restarts_total",
}


def test_dashboard_queries_only_metrics_arena_exports() -> None:
    exported = set(LAG_METRICS)
    for family in REGISTRY.collect():
        if family.name.startswith("arena_"):
            exported |= {s.name for s in family.samples} | {family.name}
            if family.type == "histogram":
                exported |= {f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count")}
            if family.type == "counter":
                exported.add(f"{family.name}_total")
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    used = {name for expr in exprs for name in re.findall(r"\barena_[a-z_]+", expr)}
    assert len(exprs) >= 15 and used, "the dashboard lost its panels"
    assert used <= exported, f"the dashboard queries metrics nobody exports: {sorted(used - exported)}"
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for topic in (
        "lag",
        "end offsets",
        "records/s",
        "p95",
        "dead letters",
        "in flight",
        "tokens",
        "sandbox",
        "reward",
        "loss",
    ):
        assert topic in titles, topic

"""Arena's Prometheus metrics: one definition per metric, and the few helpers that update them.

Every process that does the work defines the same metrics by importing this module: stage workers
(records, latency, outputs, dead letters), whoever calls an LLM (requests in flight, tokens, errors
per role), whoever opens sandbox sessions, and the trainer. ``app.metrics_http`` serves them:

- ``arena train`` serves its own process (the default registry);
- ``arena worker`` runs each stage in a child process, so it sets ``PROMETHEUS_MULTIPROC_DIR`` for
  its children and serves what they write there, summed over processes (gauges of processes that
  ended are dropped), plus consumer lag computed when scraped.

Label values are bounded: stage, role, backend and topic names come from Arena's registries, and
``kind``/``gate``/``verdict``/``outcome`` from small fixed sets.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager

from prometheus_client import Counter, Gauge, Histogram
from pydantic import BaseModel

from arena.llm.core import EndpointRejected, TransientError, Undecidable, Usage
from arena.records.common import DeadLetter, Rejection

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""Set (to a folder) in a process before it imports prometheus_client: its values go to files there."""

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: from a parse-only stage (ms) to an agent loop of many LLM turns (minutes)."""

# --- stages ---------------------------------------------------------------

STAGE_RECORDS = Counter(
    "arena_stage_records", "Input records a stage handled (dead-lettered ones included).", ["stage"]
)
STAGE_LATENCY = Histogram(
    "arena_stage_latency_seconds",
    "Time a stage took to handle one input record (decode and handler, not the wait for its turn to commit).",
    ["stage"],
    buckets=LATENCY_BUCKETS,
)
STAGE_IN_FLIGHT = Gauge(
    "arena_stage_in_flight", "Input records a stage is handling now.", ["stage"], multiprocess_mode="livesum"
)
STAGE_OUTPUTS = Counter(
    "arena_stage_outputs",
    "Records a stage sent, by output topic (dead letters and rejections included).",
    ["stage", "topic"],
)
DEAD_LETTERS = Counter(
    "arena_dead_letters", "Records a stage sent to <topic>.dlq, by failure kind.", ["stage", "kind"]
)
REJECTIONS = Counter(
    "arena_rejections", "Records a quality gate sent to <topic>.rejected, by gate.", ["stage", "gate"]
)

# --- LLM gateway ----------------------------------------------------------

LLM_IN_FLIGHT = Gauge(
    "arena_llm_requests_in_flight",
    "LLM backend requests sent and not answered yet.",
    ["role", "backend"],
    multiprocess_mode="livesum",
)
LLM_REQUESTS = Counter(
    "arena_llm_requests",
    "LLM backend requests (each attempt of a call), by outcome: ok, transient, timeout, rejected, "
    "undecidable, error, cancelled.",
    ["role", "backend", "outcome"],
)
LLM_LATENCY = Histogram(
    "arena_llm_request_seconds",
    "Time one LLM backend request took.",
    ["role", "backend"],
    buckets=LATENCY_BUCKETS,
)
LLM_TOKENS = Counter(
    "arena_llm_tokens",
    "Tokens spent on LLM requests, kind prompt or completion.",
    ["role", "backend", "kind"],
)
LLM_ERRORS = Counter(
    "arena_llm_errors",
    "Failed LLM attempts by kind: transient, timeout, rejected, undecidable, error (the request failed); "
    "invalid_output, refusal, cut_off (a reply came back unusable).",
    ["role", "backend", "kind"],
)
LLM_CACHE_HITS = Counter("arena_llm_cache_hits", "LLM calls answered from the response cache.", ["role"])

# --- sandbox --------------------------------------------------------------

SANDBOX_OPEN = Gauge("arena_sandbox_sessions_open", "Sandbox sessions open now.", multiprocess_mode="livesum")
SANDBOX_OPENED = Counter("arena_sandbox_sessions_opened", "Sandbox sessions opened.")
SANDBOX_ENDED = Counter(
    "arena_sandbox_sessions_ended",
    "Sandbox sessions closed, by verdict: ok, or how the session died (timeout, output_limit, killed, ...).",
    ["verdict"],
)

# --- trainer --------------------------------------------------------------

TRAINER_STEPS = Counter("arena_trainer_steps", "Optimizer steps the trainer finished.", ["run", "phase"])
TRAINER_STEP = Gauge(
    "arena_trainer_step", "The trainer's current step.", ["run"], multiprocess_mode="mostrecent"
)
TRAINER_SAMPLES = Counter(
    "arena_trainer_samples", "Samples trained on (SFT conversations, GRPO trajectories).", ["run", "phase"]
)
TRAINER_TOKENS = Counter(
    "arena_trainer_tokens", "Tokens trained on (SFT tokens, GRPO response tokens).", ["run", "phase"]
)
TRAINER_LOSS = Gauge(
    "arena_trainer_loss", "Loss of the last step.", ["run", "phase"], multiprocess_mode="mostrecent"
)
TRAINER_REWARD = Gauge(
    "arena_trainer_reward_mean",
    "Mean reward of the last GRPO step's rollouts.",
    ["run"],
    multiprocess_mode="mostrecent",
)
TRAINER_SAMPLES_RATE = Gauge(
    "arena_trainer_samples_per_second",
    "Samples per second of the last step.",
    ["run", "phase"],
    multiprocess_mode="mostrecent",
)
TRAINER_TOKENS_RATE = Gauge(
    "arena_trainer_tokens_per_second",
    "Tokens per second of the last step.",
    ["run", "phase"],
    multiprocess_mode="mostrecent",
)
TRAINER_STEP_SECONDS = Gauge(
    "arena_trainer_step_seconds",
    "Wall time of the last step.",
    ["run", "phase"],
    multiprocess_mode="mostrecent",
)
TRAINER_FILL = Gauge(
    "arena_trainer_fill_ratio",
    "GRPO adaptive batch filling: valid groups / groups wanted, last step.",
    ["run"],
    multiprocess_mode="mostrecent",
)


# --- helpers --------------------------------------------------------------


@contextmanager
def stage_record(stage: str) -> Iterator[None]:
    """Count and time one input record of ``stage`` (in flight while inside)."""
    in_flight = STAGE_IN_FLIGHT.labels(stage)
    in_flight.inc()
    started = time.perf_counter()
    try:
        yield
    finally:
        in_flight.dec()
        STAGE_LATENCY.labels(stage).observe(time.perf_counter() - started)
        STAGE_RECORDS.labels(stage).inc()


def stage_outputs(stage: str, outputs: Iterable[tuple[str, BaseModel]]) -> None:
    """Count what ``stage`` sent: (topic, value) pairs; dead letters by kind, rejections by gate."""
    for name, value in outputs:
        STAGE_OUTPUTS.labels(stage, name).inc()
        if isinstance(value, DeadLetter):
            DEAD_LETTERS.labels(stage, value.kind.value).inc()
        elif isinstance(value, Rejection):
            REJECTIONS.labels(stage, value.gate).inc()


def _failure_kind(exc: BaseException) -> str:
    if isinstance(exc, EndpointRejected):
        return "rejected"
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, TransientError):
        return "transient"
    if isinstance(exc, Undecidable):
        return "undecidable"
    return "error"


@contextmanager
def llm_request(role: str, backend: str) -> Iterator[None]:
    """Around one backend request: in flight while inside, then its outcome and duration.

    A request cancelled with its caller counts as ``cancelled``, not as an error.
    """
    in_flight = LLM_IN_FLIGHT.labels(role, backend)
    in_flight.inc()
    started = time.perf_counter()
    outcome = "ok"
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, Exception):
            outcome = _failure_kind(exc)
            LLM_ERRORS.labels(role, backend, outcome).inc()
        else:
            outcome = "cancelled"
        raise
    finally:
        in_flight.dec()
        LLM_LATENCY.labels(role, backend).observe(time.perf_counter() - started)
        LLM_REQUESTS.labels(role, backend, outcome).inc()


def llm_tokens(role: str, backend: str, usage: Usage) -> None:
    """Tokens one answered request spent."""
    if usage.prompt_tokens:
        LLM_TOKENS.labels(role, backend, "prompt").inc(usage.prompt_tokens)
    if usage.completion_tokens:
        LLM_TOKENS.labels(role, backend, "completion").inc(usage.completion_tokens)


def llm_unusable(role: str, backend: str, kind: str) -> None:
    """A reply came back but could not be used: ``invalid_output``, ``refusal`` or ``cut_off``."""
    LLM_ERRORS.labels(role, backend, kind).inc()


def sandbox_opened() -> None:
    SANDBOX_OPENED.inc()
    SANDBOX_OPEN.inc()


def sandbox_closed(verdict: str) -> None:
    SANDBOX_OPEN.dec()
    SANDBOX_ENDED.labels(verdict).inc()


def trainer_step(run: str, phase: str, step: int, metrics: Mapping[str, float]) -> None:
    """Export one finished trainer step from the metrics it logs to ``trainer.metrics``."""
    TRAINER_STEPS.labels(run, phase).inc()
    TRAINER_STEP.labels(run).set(step)
    if phase == "sft":
        samples, tokens = metrics.get("samples", 0.0), metrics.get("tokens", 0.0)
    else:
        samples = metrics.get("trajectories", 0.0)
        tokens = samples * metrics.get("response_tokens_mean", 0.0)
    TRAINER_SAMPLES.labels(run, phase).inc(samples)
    TRAINER_TOKENS.labels(run, phase).inc(tokens)
    seconds = metrics.get("step_s", 0.0)
    TRAINER_STEP_SECONDS.labels(run, phase).set(seconds)
    if seconds > 0:
        TRAINER_SAMPLES_RATE.labels(run, phase).set(samples / seconds)
        TRAINER_TOKENS_RATE.labels(run, phase).set(tokens / seconds)
    if "loss" in metrics:
        TRAINER_LOSS.labels(run, phase).set(metrics["loss"])
    if "reward_mean" in metrics:
        TRAINER_REWARD.labels(run).set(metrics["reward_mean"])
    if "fill_ratio" in metrics:
        TRAINER_FILL.labels(run).set(metrics["fill_ratio"])

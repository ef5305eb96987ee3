"""End to end over HTTP: the openai backend against ``transformers serve`` on a tiny local model.

The model is built here (random weights, locally trained tokenizer: no downloads) and served
by ``transformers serve <path>`` on a free loopback port, fully offline. ``transformers serve``
(5.17) ignores ``response_format``, and random weights write noise, so the answer either
validates or ends as ``InvalidOutput`` carrying the noise; either way tokens were spent.
The ``hf`` backend runs the same model in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import httpx
import pytest
from pydantic import BaseModel, Field

from arena.llm.backends.hf import HfBackend
from arena.llm.backends.openai import OpenAIBackend
from arena.llm.core import Answer, Backend, InvalidOutput, Role, Sampling
from arena.llm.gateway import Gateway, GatewayUsage
from tests.fixtures import free_ports, log_tail
from tests.fixtures.tiny_model import build_tiny_model

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 120.0
SAMPLING = Sampling(temperature=0.8, top_p=0.95, max_tokens=24, seed=3)


class Topic(BaseModel):
    """Input of the test role."""

    topic: Annotated[str, Field(description="What to write about.")]


class Note(BaseModel):
    """Output of the test role."""

    title: Annotated[str, Field(description="A short title.")]


NOTE = Role(
    name="test_note",
    input=Topic,
    output=Note,
    system='Write a title. Reply with one JSON object {"title": string}.',
    template="{input}",
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model", seed=0)


def _offline_env() -> dict[str, str]:
    return os.environ | {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"transformers serve exited with {proc.returncode}:\n{log_tail(str(log_path))}"
            )
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"transformers serve not healthy after {START_TIMEOUT_S}s:\n{log_tail(str(log_path))}")


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``transformers serve`` preloading the tiny model; yields the OpenAI API root."""
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    error: Exception | None = None
    for _attempt in range(2):  # a probed free port can be taken before the server binds it
        (port,) = free_ports(1)
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(tiny_model)]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--log-level", "info"]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_offline_env()
            )
        try:
            _wait_healthy(proc, f"http://127.0.0.1:{port}", log_path)
            break
        except RuntimeError as exc:
            error = exc
            _stop(proc)
    else:
        pytest.fail(f"could not start transformers serve: {error}", pytrace=False)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        _stop(proc)


async def _ask(backend: Backend) -> tuple[Answer[Note] | InvalidOutput, GatewayUsage]:
    gateway = Gateway(backend, max_attempts=2, backoff_s=0.05)
    try:
        outcome: Answer[Note] | InvalidOutput = await gateway.call(NOTE, Topic(topic="weather"), SAMPLING)
    except InvalidOutput as exc:
        outcome = exc
    usage = gateway.usage
    await gateway.aclose()
    return outcome, usage


def _check(outcome: Answer[Note] | InvalidOutput, usage: GatewayUsage) -> None:
    total = usage.total
    assert total.transient_errors == 0, "every attempt was a real round trip"
    assert total.prompt_tokens > 0 and total.completion_tokens > 0
    if isinstance(outcome, InvalidOutput):
        assert outcome.raw != "" and outcome.attempts == 2
    else:
        assert outcome.output.title and outcome.usage.completion_tokens > 0


def test_gateway_round_trip_over_transformers_serve(served: str, tiny_model: Path) -> None:
    backend = OpenAIBackend(served, str(tiny_model), timeout_s=60, concurrency=2)
    outcome, usage = asyncio.run(_ask(backend))
    _check(outcome, usage)
    # The prompt went through the tiny model's chat template: far more than zero tokens.
    assert usage.total.prompt_tokens >= 20


def test_hf_backend_in_process(tiny_model: Path) -> None:
    outcome, usage = asyncio.run(_ask(HfBackend(tiny_model)))
    _check(outcome, usage)
    again, _ = asyncio.run(_ask(HfBackend(tiny_model)))
    raw = outcome.raw
    assert again.raw == raw, "same seed and attempt, same sample"

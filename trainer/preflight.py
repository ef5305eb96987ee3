"""What ``arena train`` can refuse before it loads torch: a rollout backend or device this machine
lacks, a ``--resume`` with no state, no model to start from.

Importing torch and transformers costs seconds; a mistake in the command line or the settings is
answered without them. ``TrainerService`` runs the same checks when it loads (one place for each
message), so a run started some other way fails the same way.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from arena.config import ArenaSettings
from lake.store import open_store
from trainer.checkpoint import Checkpoints
from trainer.pretrained import PretrainedError, check_model


class BackendUnavailable(ValueError):
    """The configured device or rollout backend cannot start on this machine (a setting to fix)."""


class NoCheckpoint(Exception):
    """``--resume`` was asked for but the run has no full state yet."""


class NoModel(FileNotFoundError):
    """No base model to start the run from: none in the run's checkpoints, none set, no ``--tiny``."""


def import_vllm() -> Any:
    """The vllm module (the gpu extra), or ``BackendUnavailable`` naming the fix."""
    try:
        import vllm
    except ImportError as exc:
        raise BackendUnavailable(
            f"ARENA_TRAIN__BACKEND=vllm but vllm cannot be imported: {exc} (fix: install vllm, the gpu extra, "
            "on a machine with a GPU, or ARENA_TRAIN__BACKEND=hf)"
        ) from exc
    return vllm


def check_backend(device: str, backend: str) -> None:
    """``BackendUnavailable`` when the device or the rollout backend cannot run on this machine.

    Only ``device=cuda`` needs torch to tell (``auto`` falls back to the CPU)."""
    check_device(device)
    if backend == "vllm" and importlib.util.find_spec("vllm") is None:
        import_vllm()


def check_device(device: str) -> None:
    """``BackendUnavailable`` when ``device`` is ``cuda`` and torch sees no GPU."""
    if device == "cuda":
        import torch  # only when a GPU is asked for

        if not torch.cuda.is_available():
            raise BackendUnavailable(
                "ARENA_TRAIN__DEVICE=cuda but torch sees no GPU (fix: device auto or cpu)"
            )


def no_state(run: str) -> NoCheckpoint:
    return NoCheckpoint(
        f"run {run!r} has no training state to resume from "
        "(fix: drop --resume to start it, or pick the run with ARENA_TRAIN__RUN)"
    )


def check_model_setting(settings: ArenaSettings, *, tiny: bool) -> None:
    """``NoModel`` unless ``ARENA_TRAIN__MODEL`` names a usable model, or it is unset and ``tiny``."""
    model = settings.train.model
    if model:
        try:
            check_model(model)
        except PretrainedError as exc:
            raise NoModel(f"ARENA_TRAIN__MODEL={exc} (or use --tiny)") from None
    elif not tiny:
        raise NoModel("no model: set ARENA_TRAIN__MODEL to a local Hugging Face folder, or pass --tiny")


def check_start(settings: ArenaSettings, *, tiny: bool, resume: bool) -> None:
    """What the run's checkpoints decide: a resume needs a state; a run without a saved base model
    needs a model setting or ``tiny``. Reads the lake and the catalog, loads nothing."""
    checkpoints = Checkpoints(open_store(settings), settings.catalog, settings.train.run)
    try:
        if resume and checkpoints.latest_state() is None:
            raise no_state(settings.train.run)
        has_base = checkpoints.has_base()
    finally:
        checkpoints.dispose()
    if not has_base:
        check_model_setting(settings, tiny=tiny)

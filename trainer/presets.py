"""Named hyper-parameter presets of the training service (`arena train --preset NAME`).

The defaults of ``TrainSettings`` are CPU-sized, for the demo's tiny model. A preset replaces them
with a published configuration; settings the user set explicitly (``ARENA_TRAIN__*`` or the
settings file) still win over the preset.

``astra``: ASTRA §3.1-3.2 (SFT: batch 32, lr 5e-6 for Qwen3-14B, cosine with 5 % warmup; RL:
batch = mini-batch = 256 prompts, so one strictly on-policy update per batch, constant lr 2e-6,
batch-level token-mean loss, no KL and no entropy bonus, Std(R) > 0 adaptive batch filling, up to
32 turns, 25,600 prompt + 49,152 response tokens). The paper states neither the group size G nor
a per-turn generation cap: G = 8 and 8,192 tokens per turn are this preset's choices.
"""

from __future__ import annotations

from typing import Any

from arena.config import ArenaSettings

PRESETS: dict[str, dict[str, Any]] = {
    "astra": {
        "sft_batch": 32,
        "sft_lr": 5e-6,
        "warmup_ratio": 0.05,
        "lr": 2e-6,
        "batch_groups": 256,
        "mini_batches": 1,
        "update_epochs": 1,  # one pass over each batch: on-policy, as the paper trains
        "max_off_policy_steps": 0,  # strictly on-policy: no rollout overlaps an update
        "group_size": 8,
        "delta": 0.0,
        "loss_agg": "token-mean",
        "clip_low": 0.2,
        "clip_high": 0.2,
        "reward": "f1",
        "max_turns": 32,
        "max_seq_len": 25_600 + 49_152,
        "max_new_tokens": 8_192,
        "temperature": 1.0,
    },
}
"""Preset name -> ``TrainSettings`` values."""


class UnknownPreset(ValueError):
    """A preset name that is not in ``PRESETS``."""


def apply_preset(settings: ArenaSettings, name: str) -> tuple[ArenaSettings, dict[str, Any]]:
    """``settings`` with preset ``name`` under the user's explicit train settings, and what it set."""
    if name not in PRESETS:
        raise UnknownPreset(f"no preset {name!r} (fix: use one of {', '.join(sorted(PRESETS))})")
    train = settings.train
    chosen = {k: v for k, v in PRESETS[name].items() if k not in train.model_fields_set}
    checked = type(train).model_validate(train.model_dump() | chosen)  # the preset obeys the field limits
    return settings.model_copy(update={"train": checked}), chosen

"""`arena train --preset astra`: the paper's hyper-parameters, under the user's explicit settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from arena.config import ArenaSettings
from tests.cli import arena_env, run_arena
from trainer.presets import PRESETS, UnknownPreset, apply_preset


def test_astra_preset_sets_the_paper_values_and_keeps_explicit_ones(tmp_path: Path) -> None:
    base = ArenaSettings(home=tmp_path, train={"lr": 1e-5})
    cfg, chosen = apply_preset(base, "astra")
    train = cfg.train
    # ASTRA §3.2: batch = mini-batch = 256, one on-policy update, token-mean loss, 32 turns
    assert (train.batch_groups, train.mini_batches, train.loss_agg, train.max_turns) == (
        256,
        1,
        "token-mean",
        32,
    )
    assert train.max_seq_len == 25_600 + 49_152 and train.sft_batch == 32 and train.sft_lr == 5e-6
    assert train.lr == 1e-5 and "lr" not in chosen  # the user's explicit value wins
    assert set(chosen) == set(PRESETS["astra"]) - {"lr"}
    assert base.train.batch_groups == 4  # CPU-sized defaults stay for the demo
    with pytest.raises(UnknownPreset, match="astra"):
        apply_preset(base, "astro")


def test_cli_rejects_an_unknown_preset(tmp_path: Path) -> None:
    out = run_arena(["train", "--tiny", "--preset", "astro"], arena_env(tmp_path / "home"), check=2)
    assert "no preset 'astro'" in out.stderr and "Traceback" not in out.stderr

"""Our GRPO advantage and policy loss equal verl 0.9.1 ``core_algos`` on the same seeded tensors.

verl lives in a second virtualenv (scripts/install_verl.sh -> .venv-verl; or the python named by
ARENA_VERL_PYTHON), never in the main one. This test runs tests/verl_reference.py there and compares.
It FAILS, never skips, when that python is missing or cannot import verl: parity is a requirement.

Covered: advantages (unbiased std + 1e-6, and std off = Dr. GRPO); the clipped loss with verl's default
dual clip 3.0, and with dual clip off (see ``DUAL_OFF``); token-mean and seq-mean-token-mean; micro-batch
losses with the whole batch's denominators vs verl's agg_loss with batch_num_tokens / global_batch_size.
Losses, gradients with respect to the log-probs, and clip metrics are compared.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.grpo import LossAggMode, group_advantages, loss_norm, micro_batches, policy_loss

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).with_name("verl_reference.py")
VERL_VERSION = "0.9.1"
# verl has no "dual clip off": its ratio is exp(clamp(log-ratio, -20, 20)) <= e^20 ~= 4.85e8, so for A < 0 the
# clipped loss |A| max(r, clip(r)) <= |A| e^20 < |A| 1e10 = the dual bound -A c: min() never picks the bound.
# verl with clip_ratio_c = 1e10 therefore computes exactly our dual_clip=None, for any inputs.
DUAL_OFF = 1e10
CLIP_LOW, CLIP_HIGH = 0.2, 0.28  # asymmetric (DAPO-style) so both bounds are checked separately
MODES: list[LossAggMode] = [
    "token-mean",
    "seq-mean-token-mean",
]  # the modes verl has (group-token-mean is ours)
MICRO = 3


def verl_python() -> str:
    return os.environ.get("ARENA_VERL_PYTHON") or str(REPO / ".venv-verl" / "bin" / "python")


# ---------------------------------------------------------------- seeded inputs


def advantage_inputs() -> dict[str, Any]:
    # 12 trajectories, groups interleaved: a (4, mixed), b (4, all equal), c (size 1), d (3, mixed)
    ids = ["a", "b", "a", "d", "b", "c", "a", "d", "b", "b", "a", "d"]
    rewards = torch.tensor([1.0, 0.5, 0.0, 0.25, 0.5, 0.8, 0.75, 1.0, 0.5, 0.5, 0.0, 0.6])
    lengths = torch.tensor([5, 3, 1, 6, 2, 4, 6, 6, 1, 3, 2, 5])
    mask = (torch.arange(6)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(12, 6)
    token_rewards[torch.arange(12), lengths - 1] = rewards  # verl: outcome reward on the last response token
    return {"ids": ids, "rewards": rewards, "mask": mask, "token_rewards": token_rewards}


def loss_inputs() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(20240917)
    batch, steps = 10, 7
    lengths = torch.tensor([7, 5, 1, 3, 0, 6, 7, 2, 4, 7])  # one fully masked sequence
    mask = (torch.arange(steps)[None, :] < lengths[:, None]).float()
    logp = -3.0 * torch.rand(batch, steps, generator=gen)
    # off-policy by a log-ratio ~ N(0, 1): many tokens clip, and ratios > 3 with A < 0 hit the dual clip
    old = logp - torch.randn(batch, steps, generator=gen)
    ids = [0, 0, 1, 1, 1, 2, 2, 3, 3, 3]
    rewards = torch.tensor([1.0, 0.0, 0.3, 0.9, 0.1, 0.0, 1.0, 0.2, 0.2, 0.7])
    return {"logp": logp, "old": old, "mask": mask, "ids": ids, "adv": group_advantages(rewards, ids)}


def loss_cases() -> list[dict[str, Any]]:
    """(mode, dual clip, rows) cases: the whole batch, then each micro-batch with global denominators."""
    data = loss_inputs()
    cases = []
    for mode in MODES:
        for dual in (3.0, None):
            cases.append({"mode": mode, "dual": dual, "rows": slice(0, len(data["ids"])), "global": False})
            for rows in micro_batches(len(data["ids"]), MICRO):
                cases.append({"mode": mode, "dual": dual, "rows": rows, "global": True})
    return cases


# ---------------------------------------------------------------- ours


def ours_loss(case: dict[str, Any]) -> dict[str, Any]:
    data = loss_inputs()
    rows = case["rows"]
    norm = loss_norm(data["mask"], data["ids"], case["mode"]) if case["global"] else None
    logp = data["logp"][rows].clone().requires_grad_(True)
    loss, metrics = policy_loss(
        logp,
        data["old"][rows],
        data["adv"][rows],
        data["mask"][rows],
        clip_low=CLIP_LOW,
        clip_high=CLIP_HIGH,
        dual_clip=case["dual"],
        agg=case["mode"],
        norm=norm,
    )
    loss.backward()
    return {"loss": loss.detach(), "grad": logp.grad, "metrics": metrics}


# ---------------------------------------------------------------- verl, in its own virtualenv


def verl_cases() -> dict[str, Any]:
    adv = advantage_inputs()
    data = loss_inputs()
    full_mask = data["mask"]
    global_info = {
        "dp_size": 1,
        "batch_num_tokens": int(full_mask.sum().item()),
        "global_batch_size": int((full_mask.sum(-1) > 0).sum().item()),
    }
    losses = []
    for case in loss_cases():
        rows = case["rows"]
        mask = full_mask[rows]
        losses.append(
            {
                "old_log_prob": data["old"][rows],
                "log_prob": data["logp"][rows],
                "advantages": data["adv"][rows][:, None] * mask,  # verl's token-level advantages
                "response_mask": mask,
                "loss_agg_mode": case["mode"],
                "clip_ratio": CLIP_LOW,
                "clip_ratio_low": CLIP_LOW,
                "clip_ratio_high": CLIP_HIGH,
                "clip_ratio_c": case["dual"] if case["dual"] is not None else DUAL_OFF,
                "global_batch_info": global_info if case["global"] else {},
            }
        )
    advantages = [
        {
            "token_level_rewards": adv["token_rewards"],
            "response_mask": adv["mask"],
            "index": adv["ids"],
            "epsilon": 1e-6,
            "norm_by_std": norm_by_std,
        }
        for norm_by_std in (True, False)
    ]
    return {"advantages": advantages, "losses": losses}


_RESULTS: dict[str, Any] = {}


def verl_results() -> dict[str, Any]:
    """Run the reference once per session; every test that needs it fails with the same clear message."""
    if "error" in _RESULTS:
        pytest.fail(_RESULTS["error"])
    if "value" not in _RESULTS:
        try:
            _RESULTS["value"] = _run_reference()
        except RuntimeError as error:
            _RESULTS["error"] = str(error)
            pytest.fail(str(error))
    return _RESULTS["value"]


def _run_reference() -> dict[str, Any]:
    python = verl_python()
    hint = "create it with scripts/install_verl.sh, or point ARENA_VERL_PYTHON at a python with verl==0.9.1"
    if not Path(python).exists():
        raise RuntimeError(f"verl parity: no verl python at {python}; {hint}")
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp, "cases.pt"), Path(tmp, "results.pt")
        torch.save(verl_cases(), source)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        # -I: isolated, so neither the main venv's PYTHONPATH nor tests/ shadows verl's imports
        done = subprocess.run(
            [python, "-I", str(REFERENCE), str(source), str(target)],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=tmp,
            check=False,
        )
        if done.returncode == 3:
            raise RuntimeError(
                f"verl parity: {python} cannot import verl ({done.stderr.strip()[-500:]}); {hint}"
            )
        if done.returncode != 0:
            raise RuntimeError(
                f"verl parity: reference script failed (rc {done.returncode}):\n{done.stderr[-3000:]}"
            )
        return torch.load(target)


# ---------------------------------------------------------------- the comparisons


def test_reference_is_verl_0_9_1() -> None:
    assert verl_results()["verl_version"] == VERL_VERSION


def test_advantages_match_verl() -> None:
    verl = verl_results()["advantages"]
    adv = advantage_inputs()
    mask = adv["mask"]
    unbiased = group_advantages(adv["rewards"], adv["ids"], eps=1e-6, std="unbiased")[:, None] * mask
    centred = group_advantages(adv["rewards"], adv["ids"], std="none")[:, None] * mask
    torch.testing.assert_close(unbiased, verl[0])
    torch.testing.assert_close(centred, verl[1])
    assert unbiased.abs().sum() > 0


@pytest.mark.parametrize("index", range(len(loss_cases())))
def test_loss_matches_verl(index: int) -> None:
    case = loss_cases()[index]
    verl = verl_results()["losses"][index]
    ours = ours_loss(case)
    label = f"{case['mode']} dual={case['dual']} rows={case['rows']}"
    torch.testing.assert_close(ours["loss"], verl["loss"], msg=lambda m: f"{label}: loss {m}")
    torch.testing.assert_close(ours["grad"], verl["grad"], msg=lambda m: f"{label}: grad {m}")
    metrics = verl["metrics"]
    assert ours["metrics"]["clip_frac"] == pytest.approx(metrics["actor/pg_clipfrac"], rel=1e-5, abs=1e-7)
    assert ours["metrics"]["approx_kl"] == pytest.approx(metrics["actor/ppo_kl"], rel=1e-5, abs=1e-7)
    assert ours["metrics"]["clip_frac_dual"] == pytest.approx(
        metrics["actor/pg_clipfrac_lower"], rel=1e-5, abs=1e-7
    )


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_sum_to_full_batch_as_in_verl(mode: LossAggMode) -> None:
    results = verl_results()["losses"]
    for dual in (3.0, None):
        picked = [i for i, c in enumerate(loss_cases()) if c["mode"] == mode and c["dual"] == dual]
        full, micro = picked[0], picked[1:]
        verl_sum = sum(results[i]["loss"] for i in micro)
        ours_sum = sum(ours_loss(loss_cases()[i])["loss"] for i in micro)
        torch.testing.assert_close(verl_sum, results[full]["loss"])
        torch.testing.assert_close(ours_sum, results[full]["loss"])


def test_cases_exercise_the_clips() -> None:
    """The data makes every branch bind, so the parity above is not vacuous."""
    full = [c for c in loss_cases() if not c["global"]]
    for mode in MODES:
        dual, plain = (ours_loss(c) for c in full if c["mode"] == mode)
        assert dual["metrics"]["clip_frac"] > 0.1
        assert dual["metrics"]["clip_frac_dual"] > 0
        assert plain["metrics"]["clip_frac_dual"] == 0.0
        assert abs(dual["loss"].item() - plain["loss"].item()) > 1e-3

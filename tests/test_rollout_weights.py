"""Lagged rollout weights (``max_off_policy_steps``): which weights each step's rollouts use, and the
off-policy passes of one batch (``update_epochs``, ``mini_batches``), on a tiny model."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from arena.config import TrainSettings
from trainer.batching import Group
from trainer.learner import Learner
from trainer.policy import HfBackend, stop_ids_of
from trainer.rollout_weights import LaggedWeights
from trainer.tiny import build_tiny

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", ["hello tools", "call the tool"], seed=0)


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _same(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def _group(learner: Learner, seed: int) -> Group:
    """Two real rollouts of one prompt from the learner's rollout backend, rewards 1 and 0."""
    prompt = learner.tokenizer("call the tool").input_ids
    rollouts = []
    for i, reward in enumerate((1.0, 0.0)):
        gen = learner.backend.generate([prompt], max_new_tokens=6, temperature=1.0, seed=seed + i)[0]
        rollouts.append(
            {
                "prompt_ids": prompt,
                "response_ids": gen.token_ids,
                "response_mask": [1] * len(gen.token_ids),
                "logprobs": gen.logprobs,
                "reward": reward,
            }
        )
    return Group(sample_id=f"g{seed}", rewards=[1.0, 0.0], rollouts=rollouts)


def _rollout_model(learner: Learner) -> torch.nn.Module:
    assert isinstance(learner.backend, HfBackend)
    return learner.backend.model


def test_rollouts_lag_the_update_by_s_steps_and_resume_with_the_same_weights(tiny: Path) -> None:
    cfg = TrainSettings(max_off_policy_steps=1, lr=1e-2)
    learner = Learner.load(tiny, cfg)
    assert _rollout_model(learner) is not learner.model  # rollouts generate with weights of their own
    learner.new_optimizer("grpo")
    learner.start_rollouts(0)
    v0 = _weights(learner.model)

    assert learner.behaviour_step(1, 0) == 0
    metrics = learner.grpo_step([_group(learner, 1)])
    assert "is_weight_mean" in metrics and "is_truncated_frac" in metrics  # the off-policy loss ran
    assert not _same(learner.model, v0) and _same(_rollout_model(learner), v0)  # no sync on update
    learner.push_weights(1)
    v1 = _weights(learner.model)

    # Step 2's batch rolls out during step 1's update: on step 0's weights (t - 1 - s = 0).
    assert learner.behaviour_step(2, 1) == 0 and _same(_rollout_model(learner), v0)
    learner.grpo_step([_group(learner, 2)])
    learner.push_weights(2)
    v2 = _weights(learner.model)
    assert learner.behaviour_step(3, 2) == 1 and _same(_rollout_model(learner), v1)

    # The state holds the weights in use (step 1's) and those to come (step 2's, = the model's).
    state = learner.state_dict() | {"step": 2}
    again = Learner.load(tiny, cfg)
    again.load_state(state, "grpo")
    assert _same(again.model, v2) and _same(_rollout_model(again), v1)
    assert again.behaviour_step(3, 2) == 1  # what the run would have used for step 3
    assert again.behaviour_step(4, 3) == 2 and _same(_rollout_model(again), v2)


def test_deeper_lag_targets_and_misuse(tiny: Path) -> None:
    model = Learner.load(tiny, TrainSettings()).model
    tokenizer = Learner.load(tiny, TrainSettings()).tokenizer
    rollout = copy.deepcopy(model)
    backend = HfBackend(rollout, tokenizer, stop_ids=stop_ids_of(tokenizer))
    lagged = LaggedWeights(backend, 2, rollout)
    lagged.reset(5, model)
    # GRPO started at step 5: steps 6, 7 and 8 roll out on step 5's weights, step 9 on step 6's.
    assert [lagged.target(t) for t in (6, 7, 8, 9, 10)] == [5, 5, 5, 6, 7]
    lagged.push(6, model)
    with pytest.raises(ValueError, match="pushed after"):
        lagged.push(6, model)
    assert lagged.sync_for(8) == 5
    with pytest.raises(RuntimeError, match="was not pushed"):
        lagged.sync_for(10)  # needs step 7's weights: never pushed
    with pytest.raises(ValueError, match="lag must be"):
        LaggedWeights(backend, 0, rollout)
    shared = HfBackend(model, tokenizer, stop_ids=stop_ids_of(tokenizer))
    with pytest.raises(ValueError, match="its own weights"):
        Learner(model, tokenizer, TrainSettings(max_off_policy_steps=1), shared)


def test_on_policy_learner_syncs_after_every_update(tiny: Path) -> None:
    learner = Learner.load(tiny, TrainSettings(lr=1e-2))
    assert learner.rollout_weights is None and _rollout_model(learner) is learner.model
    learner.new_optimizer("grpo")
    assert learner.behaviour_step(1, 0) == 0
    metrics = learner.grpo_step([_group(learner, 1)])
    assert "is_weight_mean" not in metrics  # the on-policy loss, exactly as before


@pytest.mark.parametrize("passes", [{"mini_batches": 2}, {"update_epochs": 2}])
def test_lagged_mini_batches_take_their_ratio_against_the_update_start(
    tiny: Path, passes: dict[str, int]
) -> None:
    # Two optimizer steps per batch: every step's proximal log-probs are those of the weights
    # before the first step. Rollouts on those very weights: proximal = behaviour log-probs.
    learner = Learner.load(tiny, TrainSettings(max_off_policy_steps=1, lr=5e-2, **passes))
    learner.new_optimizer("grpo")
    learner.start_rollouts(0)
    groups = [_group(learner, 1), _group(learner, 3)]
    proximal = learner._proximal(groups)
    for g in groups:
        rows = proximal[id(g)]
        assert len(rows) == len(g.rollouts)
        for row, r in zip(rows, g.rollouts, strict=True):
            torch.testing.assert_close(torch.tensor(row), torch.tensor(r["logprobs"]), atol=1e-4, rtol=0)
    metrics = learner.grpo_step(groups)
    assert _adam_steps(learner) == 2
    assert metrics["is_weight_mean"] == pytest.approx(1.0, abs=1e-3)


def _adam_steps(learner: Learner) -> int:
    assert learner.optimizer is not None
    return max(int(state["step"]) for state in learner.optimizer.state.values())


def test_update_epochs_are_more_passes_over_one_batch_against_its_rollout_logprobs(tiny: Path) -> None:
    # mu = 3 passes over the batch: three optimizer steps, each with its ratio against the log-probs
    # the rollouts recorded -- exactly what three one-pass updates on the same groups do.
    cfg = TrainSettings(lr=5e-2, update_epochs=3)
    learner = Learner.load(tiny, cfg)
    learner.new_optimizer("grpo")
    groups = [_group(learner, 1), _group(learner, 3)]
    metrics = learner.grpo_step(groups)
    assert _adam_steps(learner) == 3
    assert metrics["sequences"] == 4  # the batch's size, not summed over its passes
    assert metrics["response_tokens"] == sum(len(r["response_ids"]) for g in groups for r in g.rollouts)
    assert metrics["clip_frac"] > 0  # the later passes moved the ratio past 1 + eps: clipped

    one_pass = Learner.load(tiny, TrainSettings(lr=5e-2))
    one_pass.new_optimizer("grpo")
    for _ in range(3):
        one_pass.grpo_step(groups)
    assert _adam_steps(one_pass) == 3
    for key, value in one_pass.model.state_dict().items():
        torch.testing.assert_close(learner.model.state_dict()[key], value, atol=1e-6, rtol=0)


def test_one_update_epoch_is_one_optimizer_step(tiny: Path) -> None:
    learner = Learner.load(tiny, TrainSettings(lr=5e-2))
    learner.new_optimizer("grpo")
    metrics = learner.grpo_step([_group(learner, 1)])
    assert _adam_steps(learner) == 1 and metrics["clip_frac"] == 0  # on-policy: ratio 1, nothing clipped

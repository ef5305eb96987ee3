"""Decoupled checkpoints (lake + catalog), the SFT schedule and the SFT/GRPO updates on a tiny model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from arena.config import TrainSettings
from arena.records.sft import SftSample
from lake.store import LocalStore
from trainer.batching import Group
from trainer.checkpoint import MANIFEST, Checkpoints, StepRecord
from trainer.learner import Learner
from trainer.policy_update import grpo_update
from trainer.sft import SftExample, cosine_schedule, sft_example, sft_loss_backward
from trainer.tiny import build_tiny

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", ["hello tools"], seed=0)


def _checkpoints(tmp_path: Path) -> Checkpoints:
    return Checkpoints(LocalStore(tmp_path / "lake"), f"sqlite:///{tmp_path / 'catalog.db'}", "r1")


def _record(step: int) -> StepRecord:
    return StepRecord(
        step=step, phase="grpo", consumed=[f"s{step}"], trained=[f"s{step}"], offsets={"t": {0: step}}
    )


def test_states_keep_the_last_two_and_resume_truncates_the_lost_lineage(tmp_path: Path, tiny: Path) -> None:
    ck = _checkpoints(tmp_path)
    learner = Learner.load(tiny, TrainSettings())
    learner.new_optimizer("sft")
    for step in range(1, 8):
        ck.save_step(_record(step))
        if step % 2 == 0:
            ck.save_state(step, "grpo", {"step": step, **learner.state_dict()}, keep=2)
        if step % 3 == 0:
            ck.save_weights(step, "grpo", learner.model, learner.tokenizer)
    assert ck.state_steps() == [4, 6]
    assert ck.weights_steps() == [3, 6]
    assert ck.load_state(6)["step"] == 6
    kinds = [(r.step, r.kind) for r in ck.rows()]
    assert kinds == [(3, "weights"), (4, "state"), (6, "state"), (6, "weights")]

    # A crash after step 7: the newest state is 6, so step 7's record is from a lost lineage.
    removed = ck.truncate_after(4)
    assert removed > 0
    assert [r.step for r in ck.steps()] == [1, 2, 3, 4]
    assert ck.state_steps() == [4] and ck.weights_steps() == [3]
    assert [(r.step, r.kind) for r in ck.rows()] == [(3, "weights"), (4, "state")]


def test_weights_folder_loads_and_a_torn_upload_is_ignored(tmp_path: Path, tiny: Path) -> None:
    ck = _checkpoints(tmp_path)
    learner = Learner.load(tiny, TrainSettings())
    prefix = ck.save_weights(5, "sft", learner.model, learner.tokenizer)
    # A crash mid-upload leaves files without a manifest: never listed, never loaded.
    ck.store.put("trainer/r1/weights/step-00000009/config.json", b"{}")
    assert ck.weights_steps() == [5]
    folder = ck.weights_folder(5, tmp_path / "w5")
    again = Learner.load(folder, TrainSettings())
    for a, b in zip(learner.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert ck.store.exists(f"{prefix}/{MANIFEST}")
    with pytest.raises(FileNotFoundError, match="manifest"):
        ck.weights_folder(9, tmp_path / "w9")


def test_cosine_schedule_warms_up_then_decays_to_zero() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = cosine_schedule(opt, total_steps=40, warmup_ratio=0.05)  # warmup = ceil(2.0) = 2 steps
    lrs = []
    for _ in range(41):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(0.5) and lrs[1] == pytest.approx(1.0)  # (step + 1) / 2
    # after warmup: 0.5 (1 + cos(pi (s - 2) / 38)); s = 21 is the midpoint
    assert lrs[21] == pytest.approx(0.5 * (1 + math.cos(math.pi * 19 / 38)))
    assert lrs[40] == pytest.approx(0.0, abs=1e-12)


def test_sft_trains_only_the_target_side(tiny: Path) -> None:
    learner = Learner.load(tiny, TrainSettings())
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
        {"role": "assistant", "content": "It is 21 C."},
    ]
    agent = SftSample(sample_id="a", messages=messages, tools=[], role_target="agent", source="t")
    user = agent.model_copy(update={"sample_id": "u", "role_target": "user"})
    tok = learner.tokenizer
    ex_agent, ex_user = sft_example(tok, agent, 4096), sft_example(tok, user, 4096)
    trained_agent = tok.decode([i for i, m in zip(ex_agent.input_ids, ex_agent.loss_mask, strict=True) if m])
    trained_user = tok.decode([i for i, m in zip(ex_user.input_ids, ex_user.loss_mask, strict=True) if m])
    assert "It is 21 C." in trained_agent and "Paris" in trained_agent
    assert "Weather" not in trained_agent and "tool_response" not in trained_agent  # observations masked
    assert "Weather in Paris?" in trained_user and "It is 21 C." not in trained_user


def _grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_sft_and_grpo_micro_batches_sum_to_the_full_batch_gradient(tiny: Path) -> None:
    learner = Learner.load(tiny, TrainSettings())
    model = learner.model
    gen = torch.Generator().manual_seed(0)
    examples = [
        SftExample(
            sample_id=str(i),
            input_ids=torch.randint(3, 200, (n,), generator=gen).tolist(),
            loss_mask=[0] * 3 + [1] * (n - 3),
        )
        for i, n in enumerate((9, 14, 6, 11))
    ]
    grads = []
    for micro in (4, 1, 3):
        model.zero_grad()
        sft_loss_backward(model, examples, learner.pad_id, micro)
        grads.append(_grad(model))
    torch.testing.assert_close(grads[1], grads[0])
    torch.testing.assert_close(grads[2], grads[0])

    def rollout(n: int, reward: float) -> dict[str, object]:
        ids = torch.randint(3, 200, (n,), generator=gen).tolist()
        return {
            "prompt_ids": ids[:4],
            "response_ids": ids[4:],
            "response_mask": [1] * (n - 4),
            "logprobs": (-torch.rand(n - 4, generator=gen)).tolist(),
            "reward": reward,
        }

    groups = [
        Group(sample_id="g0", rewards=[1.0, 0.0], rollouts=[rollout(10, 1.0), rollout(7, 0.0)]),
        Group(sample_id="g1", rewards=[0.5, 0.0], rollouts=[rollout(12, 0.5), rollout(9, 0.0)]),
    ]
    for agg in ("token-mean", "group-token-mean", "seq-mean-token-mean"):
        grads = []
        for micro in (4, 1):
            model.zero_grad()
            grpo_update(
                model, groups, pad_id=learner.pad_id, micro=micro, clip_low=0.2, clip_high=0.2, agg=agg,
                adv_std="unbiased",
            )  # fmt: skip
            grads.append(_grad(model))
        torch.testing.assert_close(grads[1], grads[0], msg=agg)

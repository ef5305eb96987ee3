"""GRPO math against hand-computed values: advantages, clipped loss, aggregation modes, micro-batching."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.grpo import LossAggMode, group_advantages, loss_norm, micro_batches, policy_loss

torch.set_num_threads(1)

AGG_MODES: list[LossAggMode] = ["token-mean", "group-token-mean", "seq-mean-token-mean"]


# ---------------------------------------------------------------- advantages


def test_advantages_unbiased_default() -> None:
    # Groups interleaved on purpose: a = [1, 0, 0, 1], b = [2.0] (size 1), c = [0.3, 0.3, 0.3].
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.3, 0.0, 0.3, 1.0, 0.3])
    ids = ["a", "a", "b", "c", "a", "c", "a", "c"]
    adv = group_advantages(rewards, ids)
    # a: mean 0.5, unbiased std sqrt(4 * 0.25 / 3) = sqrt(1/3) = 0.577350; +-0.5 / (0.577350 + 1e-6)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    # b: size 1 -> mean 0, std 1 (verl): 2 / (1 + 1e-6). c: all equal -> 0 / (0 + 1e-6) = 0.
    b = 2.0 / (1 + 1e-6)
    expected = torch.tensor([a, -a, b, 0.0, -a, 0.0, a, 0.0])
    torch.testing.assert_close(adv, expected, rtol=1e-6, atol=1e-6)


def test_advantages_biased_and_none() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0])
    ids = [7, 7, 7, 7, 8]
    # biased (population) std of [1, 0, 0, 1] = 0.5: +-0.5 / 0.500001; size-1 group: 2 / (1 + 1e-6)
    biased = group_advantages(rewards, ids, std="biased")
    s = 0.5 / (0.5 + 1e-6)
    torch.testing.assert_close(biased, torch.tensor([s, -s, -s, s, 2 / (1 + 1e-6)]))
    # none (Dr. GRPO): R - mean only; size-1 group keeps R - 0 = 2 (verl).
    centred = group_advantages(rewards, ids, std="none")
    torch.testing.assert_close(centred, torch.tensor([0.5, -0.5, -0.5, 0.5, 2.0]))


def test_advantages_eps_and_validation() -> None:
    rewards = torch.tensor([3.0, 1.0])
    # mean 2, unbiased std sqrt(2) = 1.414214; eps 0.5: +-1 / 1.914214 = +-0.522408
    adv = group_advantages(rewards, ["g", "g"], eps=0.5)
    torch.testing.assert_close(adv, torch.tensor([1 / (math.sqrt(2) + 0.5), -1 / (math.sqrt(2) + 0.5)]))
    # integer rewards are promoted to float
    assert group_advantages(torch.tensor([1, 0]), [0, 0]).dtype == torch.float32
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 0.0]), ["g"])


# ---------------------------------------------------------------- the loss on a hand-computed batch
#
# 4 sequences, T = 3, groups g1 = {0, 1}, g2 = {2, 3}; ratios r = exp(logp - old), clip 0.2:
#   seq 0, A = +1,   r = 1.5, 0.5, 1.0  -> max(-A r, -A clip(r)) = max(-1.5,-1.2)=-1.2, -0.5, -1.0  sum -2.7 (3 tok)
#   seq 1, A = -1,   r = 4.0, 0.9, (masked) -> 4.0, 0.9                                              sum  4.9 (2 tok)
#            with dual clip 3: min(4.0, 3) = 3 -> 3.0, 0.9                                           sum  3.9
#   seq 2, A = +0.5, r = 1.1, 1.3, (masked) -> -0.55, max(-0.65,-0.6)=-0.6                           sum -1.15 (2 tok)
#   seq 3, A = -0.5, r = 0.7, (masked x2)   -> max(0.35, 0.4) = 0.4                                  sum  0.4 (1 tok)
# Tokens: 8. Masked positions carry a log-ratio of 50 (would explode if it leaked in).

RATIOS = [[1.5, 0.5, 1.0], [4.0, 0.9, 1.0], [1.1, 1.3, 1.0], [0.7, 1.0, 1.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0]], dtype=torch.float32)
ADV = torch.tensor([1.0, -1.0, 0.5, -0.5])
GROUPS = ["g1", "g1", "g2", "g2"]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.linspace(-2.0, -0.5, 12).reshape(4, 3)
    log_ratio = torch.log(torch.tensor(RATIOS, dtype=torch.float32))
    log_ratio = torch.where(MASK.bool(), log_ratio, torch.full_like(log_ratio, 50.0))
    return (old + log_ratio).requires_grad_(True), old


# expected values: (no dual clip, dual clip 3)
EXPECTED = {
    # (-2.7 + 4.9 - 1.15 + 0.4) / 8 = 1.45 / 8 ;  (-2.7 + 3.9 - 1.15 + 0.4) / 8 = 0.45 / 8
    "token-mean": (1.45 / 8, 0.45 / 8),
    # g1: (-2.7 + 4.9) / 5 = 0.44, g2: (-1.15 + 0.4) / 3 = -0.25 -> (0.44 - 0.25) / 2 = 0.095
    # dual: g1 (-2.7 + 3.9) / 5 = 0.24 -> (0.24 - 0.25) / 2 = -0.005
    "group-token-mean": (0.095, -0.005),
    # seq means -0.9, 2.45, -0.575, 0.4 -> 1.375 / 4 ; dual: -0.9, 1.95, -0.575, 0.4 -> 0.875 / 4
    "seq-mean-token-mean": (1.375 / 4, 0.875 / 4),
}


@pytest.mark.parametrize("agg", AGG_MODES)
def test_loss_hand_computed(agg: LossAggMode) -> None:
    logp, old = _batch()
    plain, _ = policy_loss(logp, old, ADV, MASK, agg=agg, group_ids=GROUPS)
    dual, _ = policy_loss(logp, old, ADV, MASK, agg=agg, group_ids=GROUPS, dual_clip=3.0)
    want_plain, want_dual = EXPECTED[agg]
    assert plain.item() == pytest.approx(want_plain, abs=1e-6)
    assert dual.item() == pytest.approx(want_dual, abs=1e-6)


def test_token_advantages_equal_broadcast_sequence_advantages() -> None:
    logp, old = _batch()
    per_seq, _ = policy_loss(logp, old, ADV, MASK)
    per_token, _ = policy_loss(logp, old, ADV[:, None].expand(4, 3) * MASK, MASK)
    torch.testing.assert_close(per_seq, per_token)


def test_asymmetric_clip() -> None:
    logp, old = _batch()
    loss, _ = policy_loss(logp, old, ADV, MASK, clip_high=0.28)
    # upper clips move for A > 0: seq 0 r = 1.5: max(-1.5, -1.28) = -1.28 (was -1.2);
    # seq 2 r = 1.3: max(-0.65, -0.5 * 1.28 = -0.64) = -0.64 (was -0.6) -> (1.45 - 0.08 - 0.04) / 8
    assert loss.item() == pytest.approx(1.33 / 8, abs=1e-6)
    loss, _ = policy_loss(logp, old, ADV, MASK, clip_low=0.4)
    # seq 3: max(0.35, 0.5 * clip(0.7, 0.6, 1.2) = 0.35) = 0.35 instead of 0.4 ; seq 0 token 1 unchanged
    # (A > 0 ignores the lower clip: max(-0.5, -0.6) = -0.5) -> (1.45 - 0.05) / 8
    assert loss.item() == pytest.approx(1.40 / 8, abs=1e-6)


def test_clipped_tokens_get_no_gradient_and_metrics() -> None:
    logp, old = _batch()
    loss, metrics = policy_loss(logp, old, ADV, MASK)
    loss.backward()
    assert logp.grad is not None
    grad = logp.grad
    # d/dlogp of -A r / 8 is -A r / 8 where unclipped, 0 where clipped or masked.
    expected = torch.tensor(
        [
            [0.0, -0.5 / 8, -1.0 / 8],  # r = 1.5 clipped (A > 0); r = 0.5 and 1.0 unclipped
            [4.0 / 8, 0.9 / 8, 0.0],  # A < 0 without dual clip: -(-1) r / 8
            [-0.55 / 8, 0.0, 0.0],  # r = 1.3 clipped
            [0.0, 0.0, 0.0],  # r = 0.7 clipped (A < 0)
        ]
    )
    torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-6)
    # clip_frac: tokens where the clipped term wins: (0,0), (2,1), (3,0) -> 3/8
    assert metrics["clip_frac"] == pytest.approx(3 / 8)
    assert metrics["clip_frac_dual"] == 0.0

    logp, old = _batch()
    loss, metrics = policy_loss(logp, old, ADV, MASK, dual_clip=3.0)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad[1, 0].item() == 0.0  # dual-clipped: the loss is the constant -A * 3
    assert metrics["clip_frac_dual"] == pytest.approx(1 / 8)


def test_log_ratio_is_clamped_at_20() -> None:
    logp = torch.tensor([[100.0]])
    old = torch.tensor([[0.0]])
    # A = -1, no clip effect on the max: loss = -A exp(20) = exp(20)
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(math.exp(20.0), rel=1e-6)


def test_dual_clip_must_exceed_one() -> None:
    logp, old = _batch()
    with pytest.raises(ValueError):
        policy_loss(logp, old, ADV, MASK, dual_clip=1.0)


def test_loss_norm_values() -> None:
    norm = loss_norm(MASK, GROUPS, "group-token-mean")
    assert (norm.tokens, norm.sequences) == (8.0, 4.0)
    assert norm.groups == {"g1": 5.0, "g2": 3.0}
    empty = torch.tensor([[1, 1], [0, 0]], dtype=torch.float32)
    # a fully masked sequence does not count in seq-mean; a group with no tokens does not count
    norm = loss_norm(empty, ["x", "y"], "group-token-mean")
    assert (norm.sequences, norm.groups) == (1.0, {"x": 2.0})


def test_micro_batches_cover_rows() -> None:
    assert micro_batches(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_batches(4, 8) == [slice(0, 4)]
    assert micro_batches(0, 3) == []
    with pytest.raises(ValueError):
        micro_batches(4, 0)


# ---------------------------------------------------------------- micro-batch gradient == full-batch gradient


class TinyPolicy(torch.nn.Module):
    """Token log-probs from a linear layer over fixed features: enough to carry real parameter gradients."""

    def __init__(self, features: int = 6, vocab: int = 5) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(features, vocab)

    def forward(self, x: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        logprobs = torch.log_softmax(self.proj(x), dim=-1)
        return logprobs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def _micro_setup() -> tuple[
    TinyPolicy, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]
]:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = TinyPolicy()
    batch, steps = 7, 5
    x = torch.randn(batch, steps, 6, generator=gen)
    actions = torch.randint(0, 5, (batch, steps), generator=gen)
    lengths = torch.tensor([5, 3, 1, 4, 0, 2, 5])  # uneven, one fully masked sequence
    mask = (torch.arange(steps)[None, :] < lengths[:, None]).float()
    with torch.no_grad():
        # an older policy: current log-probs shifted by noise big enough to clip (and dual-clip) some tokens
        old = model(x, actions) + 1.2 * torch.randn(batch, steps, generator=gen)
    groups = [0, 0, 0, 1, 1, 2, 2]  # micro-batches of 3 split group 1 and group 2 across two calls
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0, 0.0, 0.2, 0.9])
    adv = group_advantages(rewards, groups)
    return model, x, actions, mask, old, adv, groups


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_micro_batch_gradient_equals_full_batch(agg: LossAggMode, dual_clip: float | None) -> None:
    model, x, actions, mask, old, adv, groups = _micro_setup()
    model.zero_grad()
    full, metrics = policy_loss(
        model(x, actions), old, adv, mask, group_ids=groups, agg=agg, dual_clip=dual_clip
    )
    full.backward()
    assert metrics["clip_frac"] > 0  # the clip branches are exercised, not just the linear part
    assert dual_clip is None or metrics["clip_frac_dual"] > 0
    full_grads = _grads(model)

    model.zero_grad()
    norm = loss_norm(mask, groups, agg)
    total = torch.zeros(())
    for part in micro_batches(len(groups), 3):
        loss, _ = policy_loss(
            model(x[part], actions[part]),
            old[part],
            adv[part],
            mask[part],
            group_ids=groups[part],
            norm=norm,
            agg=agg,
            dual_clip=dual_clip,
        )
        loss.backward()
        total = total + loss.detach()
    micro_grads = _grads(model)

    torch.testing.assert_close(total, full.detach(), rtol=1e-6, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in full_grads)
    for got, want in zip(micro_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_micro_batches_without_global_norm_would_differ() -> None:
    # Control for the test above: per-micro-batch denominators do not add up to the full-batch loss.
    model, x, actions, mask, old, adv, _ = _micro_setup()
    full, _ = policy_loss(model(x, actions), old, adv, mask)
    local = sum(
        policy_loss(model(x[p], actions[p]), old[p], adv[p], mask[p])[0].item() for p in micro_batches(7, 3)
    )
    assert abs(local - full.item()) > 1e-3


# ---------------------------------------------------------------- off-policy (lagged rollouts)


def test_truncated_importance_weights_hand_computed() -> None:
    # One sequence of 3 tokens, advantage +1. Current (= proximal) log-probs ln 0.5, ln 0.2, ln 0.4;
    # behaviour (stale rollout weights) ln 0.25, ln 0.4, ln 0.1: weights pi_prox / pi_behaviour =
    # 2, 0.5, 4 -> capped at 3: 2, 0.5, 3. With one optimizer step the ratio to the proximal policy
    # is 1 (clip inactive), so token-mean loss = -(2 + 0.5 + 3) / 3, and d loss / d logp_t = -w_t / 3.
    current = torch.log(torch.tensor([[0.5, 0.2, 0.4]])).requires_grad_(True)
    behaviour = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    mask = torch.ones(1, 3)
    loss, metrics = policy_loss(current, behaviour, torch.tensor([1.0]), mask, is_cap=3.0)
    assert loss.item() == pytest.approx(-(2 + 0.5 + 3) / 3, rel=1e-6)
    loss.backward()
    assert current.grad is not None
    torch.testing.assert_close(current.grad, torch.tensor([[-2 / 3, -0.5 / 3, -3 / 3]]))
    assert metrics["is_weight_mean"] == pytest.approx((2 + 0.5 + 3) / 3, rel=1e-6)
    assert metrics["is_truncated_frac"] == pytest.approx(1 / 3)
    assert metrics["clip_frac"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0)


def test_off_policy_ratio_is_against_the_proximal_policy() -> None:
    # Two optimizer steps per batch: the second mini-batch's ratio is pi / pi_prox (weights at the
    # update's start), clipped at 1 + 0.2, while the behaviour gap only sets the weight.
    # pi = 0.9, prox = 0.6 -> ratio 1.5 -> clipped 1.2; behaviour 0.3 -> weight 2 (cap 5).
    # Advantage +1: loss = max(-1.5, -1.2) * 2 = -2.4, and the clipped token gets no gradient.
    current = torch.log(torch.tensor([[0.9]])).requires_grad_(True)
    prox = torch.log(torch.tensor([[0.6]]))
    behaviour = torch.log(torch.tensor([[0.3]]))
    loss, metrics = policy_loss(
        current, behaviour, torch.tensor([1.0]), torch.ones(1, 1), is_cap=5.0, prox_logprobs=prox
    )
    assert loss.item() == pytest.approx(-2.4, rel=1e-5)
    loss.backward()
    assert current.grad is not None and current.grad.abs().sum().item() == 0.0
    assert metrics["clip_frac"] == 1.0 and metrics["is_weight_mean"] == pytest.approx(2.0, rel=1e-5)


def test_on_policy_weights_are_one_and_cap_below_one_is_refused() -> None:
    # Fresh rollouts (behaviour = current): the off-policy loss equals the on-policy one.
    logp = torch.log(torch.tensor([[0.3, 0.6], [0.5, 0.5]]))
    adv, mask = torch.tensor([1.0, -1.0]), torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    on, _ = policy_loss(logp, logp, adv, mask)
    off, metrics = policy_loss(logp, logp, adv, mask, is_cap=2.0)
    assert off.item() == pytest.approx(on.item()) and metrics["is_weight_mean"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="is_cap"):
        policy_loss(logp, logp, adv, mask, is_cap=0.5)

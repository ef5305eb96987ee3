"""GRPO math (ASTRA eq. 23 and 32): group-relative advantages, the clipped policy loss, loss aggregation.

No KL term and no entropy bonus (ASTRA §3.1). Every formula matches verl 0.9.1 ``core_algos`` on the same
tensors (tests/test_verl_parity.py):

- advantages: ``(R - mean_g) / (std_g + eps)`` with torch's unbiased std and eps = 1e-6 by default
  (``compute_grpo_outcome_advantage``); a group of one gets mean 0 and std 1. An all-equal group gets 0.
- ratio = exp(clamp(logp - old_logp, -20, 20)); per-token loss max(-A ratio, -A clip(ratio, 1-lo, 1+hi)),
  and with dual clip c, min(that, -A c) where A < 0 (``compute_policy_loss_vanilla``).
- aggregation (``loss_agg_mode``):
  * "token-mean" (default, ASTRA's batch-level token mean): sum of token losses / tokens in the batch;
  * "group-token-mean" (eq. 32 read per group): mean over groups of (group's token-loss sum / its tokens);
  * "seq-mean-token-mean": mean over sequences of each sequence's token mean.

Off-policy rollouts (``max_off_policy_steps`` > 0, rollouts overlapping the update): ``is_cap`` turns on
the decoupled objective (clip around the proximal policy, tokens weighted by the truncated importance
weight pi_prox / pi_behaviour); without it the loss is exactly the on-policy one above.

Micro-batching: the denominators come from ``LossNorm``, computed once on the whole batch, so the losses
of the micro-batches add up to the full-batch loss, and so do their gradients (as verl's
``global_batch_info``). Without a norm, the call's own batch is the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

import torch
from pydantic import BaseModel, Field
from torch import Tensor

LossAggMode = Literal["token-mean", "group-token-mean", "seq-mean-token-mean"]
StdMode = Literal["unbiased", "biased", "none"]
GroupId = int | str

LOG_RATIO_LIMIT = 20.0  # verl clamps log-ratios to [-20, 20] before exp, so a stale token cannot overflow


def group_advantages(
    rewards: Tensor, group_ids: Sequence[GroupId], eps: float = 1e-6, std: StdMode = "unbiased"
) -> Tensor:
    """Per-trajectory advantage (R - mean_g) / (std_g + eps), groups given by ``group_ids``.

    std "unbiased" (verl's torch.std, default), "biased" (population std) or "none" (R - mean_g only,
    Dr. GRPO). A group of size 1 gets mean 0 and std 1, as in verl.
    """
    if rewards.dim() != 1 or rewards.shape[0] != len(group_ids):
        raise ValueError(f"rewards {tuple(rewards.shape)} do not match {len(group_ids)} group ids")
    if not rewards.is_floating_point():
        rewards = rewards.float()
    advantages = torch.empty_like(rewards)
    with torch.no_grad():
        for members in _members(group_ids).values():
            index = torch.tensor(members, dtype=torch.long)
            scores = rewards[index]
            if len(members) == 1:
                mean, spread = torch.zeros_like(scores[0]), torch.ones_like(scores[0])
            else:
                mean, spread = scores.mean(), scores.std(correction=0 if std == "biased" else 1)
            centred = scores - mean
            advantages[index] = centred if std == "none" else centred / (spread + eps)
    return advantages


def _members(group_ids: Sequence[GroupId]) -> dict[str, list[int]]:
    """Positions per group, in first-appearance order; ids are compared as strings (the JSON form)."""
    members: dict[str, list[int]] = {}
    for position, gid in enumerate(group_ids):
        members.setdefault(str(gid), []).append(position)
    return members


class LossNorm(BaseModel):
    """Global denominators of the loss, taken from the whole (mini-)batch once, shared by its micro-batches."""

    tokens: Annotated[float, Field(description="trained tokens in the batch (mask sum), for token-mean")]
    sequences: Annotated[
        float, Field(description="sequences with at least one trained token, for seq-mean-token-mean")
    ]
    groups: Annotated[
        dict[str, float] | None,
        Field(description="trained tokens per group id (str), groups with tokens only; group-token-mean"),
    ] = None


def loss_norm(
    mask: Tensor, group_ids: Sequence[GroupId] | None = None, agg: LossAggMode = "token-mean"
) -> LossNorm:
    """The denominators of ``agg`` over the whole batch ``mask`` [B, T]."""
    per_seq = mask.sum(dim=-1)
    groups = None
    if agg == "group-token-mean" or group_ids is not None:
        if group_ids is None:
            raise ValueError("group-token-mean needs group_ids")
        if len(group_ids) != mask.shape[0]:
            raise ValueError(f"{len(group_ids)} group ids for {mask.shape[0]} sequences")
        groups = {}
        for gid, members in _members(group_ids).items():
            tokens = float(per_seq[members].sum().item())
            if tokens > 0:
                groups[gid] = tokens
    return LossNorm(
        tokens=float(per_seq.sum().item()), sequences=float((per_seq > 0).sum().item()), groups=groups
    )


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
    agg: LossAggMode = "token-mean",
    group_ids: Sequence[GroupId] | None = None,
    norm: LossNorm | None = None,
    is_cap: float | None = None,
    prox_logprobs: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped-ratio GRPO loss (to minimise) of a batch or micro-batch, and its metrics.

    logprobs, old_logprobs, mask: [B, T]; advantages: [B] (one per trajectory) or [B, T].
    ``norm``: the whole batch's denominators when this is a micro-batch (``loss_norm`` of the full mask);
    None means this call's batch is the whole batch. Metrics are over this call's tokens.

    Off-policy rollouts (``is_cap`` set; ``old_logprobs`` are then the behaviour policy's, the stale
    weights that generated the tokens): the decoupled objective of AReaL (Fu et al. 2025). The ratio
    is taken against the proximal policy ``prox_logprobs`` (the weights at the start of this update;
    default ``logprobs.detach()``, exact for one optimizer step per batch) and each token's loss is
    weighted by the truncated importance weight min(pi_prox / pi_behaviour, is_cap), no gradient.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    if is_cap is not None and is_cap < 1.0:
        raise ValueError(f"is_cap must be >= 1, got {is_cap}")
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.expand_as(logprobs)
    weight: Tensor | None = None
    if is_cap is not None:
        prox = logprobs.detach() if prox_logprobs is None else prox_logprobs
        behaviour_gap = torch.clamp(prox - old_logprobs, min=-LOG_RATIO_LIMIT, max=LOG_RATIO_LIMIT)
        weight = torch.exp(behaviour_gap).clamp(max=is_cap)
        old_logprobs = prox
    log_ratio = torch.clamp(logprobs - old_logprobs, min=-LOG_RATIO_LIMIT, max=LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    token_loss = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(token_loss, dtype=torch.bool)
    if dual_clip is not None:
        # Dual clip (Ye et al. 2020): with A < 0 the loss is bounded by -A c however large the ratio.
        bound = -advantages * dual_clip
        dual_clipped = (advantages < 0) & (token_loss > bound)
        token_loss = torch.where(advantages < 0, torch.minimum(token_loss, bound), token_loss)
    if weight is not None:
        token_loss = token_loss * weight
    live = mask.bool()
    # where() first (as verl masked_sum), so NaN/inf in padded positions cannot leak into the sum.
    token_loss = torch.where(live, token_loss, torch.zeros_like(token_loss)) * mask
    loss = _aggregate(token_loss, mask, agg, group_ids, norm)
    metrics = {
        "clip_frac": _masked_mean(torch.gt(clipped, unclipped).float(), mask),
        "clip_frac_dual": _masked_mean(dual_clipped.float(), mask),
        "approx_kl": _masked_mean(-log_ratio.detach(), mask),
        "ratio_mean": _masked_mean(ratio.detach(), mask),
    }
    if weight is not None and is_cap is not None:
        metrics["is_weight_mean"] = _masked_mean(weight, mask)
        metrics["is_truncated_frac"] = _masked_mean(torch.ge(weight, is_cap).float(), mask)
    return loss, metrics


def _aggregate(
    token_loss: Tensor,
    mask: Tensor,
    agg: LossAggMode,
    group_ids: Sequence[GroupId] | None,
    norm: LossNorm | None,
) -> Tensor:
    if norm is None:
        norm = loss_norm(mask, group_ids if agg == "group-token-mean" else None, agg)
    if agg == "token-mean":
        return token_loss.sum() / max(norm.tokens, 1.0)
    per_seq_tokens = mask.sum(dim=-1)
    seq_sums = token_loss.sum(dim=-1)
    if agg == "seq-mean-token-mean":
        seq_means = seq_sums / per_seq_tokens.clamp(min=1)  # fully masked sequences add 0
        return seq_means.sum() / max(norm.sequences, 1.0)
    if agg == "group-token-mean":
        if group_ids is None or norm.groups is None:
            raise ValueError("group-token-mean needs group_ids (and a norm with groups)")
        if len(group_ids) != token_loss.shape[0]:
            raise ValueError(f"{len(group_ids)} group ids for {token_loss.shape[0]} sequences")
        # Each sequence's token sum over its group's (global) token count, then mean over groups.
        scale = torch.tensor(
            [1.0 / norm.groups[str(g)] if str(g) in norm.groups else 0.0 for g in group_ids],
            dtype=token_loss.dtype,
            device=token_loss.device,
        )
        return (seq_sums * scale).sum() / max(len(norm.groups), 1)
    raise ValueError(f"unknown loss_agg_mode {agg!r}")


def _masked_mean(values: Tensor, mask: Tensor) -> float:
    total = float(mask.sum().item())
    if total == 0:
        return 0.0
    return float((torch.where(mask.bool(), values, torch.zeros_like(values)) * mask).sum().item() / total)


def micro_batches(n: int, size: int) -> list[slice]:
    """Contiguous slices of ``size`` rows (the last may be shorter) covering n rows."""
    if size <= 0:
        raise ValueError(f"micro-batch size must be positive, got {size}")
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]

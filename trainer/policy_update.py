"""One GRPO policy update from a batch of groups (ASTRA eq. 23/32, EigenData §5).

Every trajectory becomes one row of response ids after its prompt (each
distinct prompt runs once for its rows: ``trainer.response_logprobs``); the
loss mask is the response mask (generated tokens only: tool outputs and
headers are observations); the behaviour log-probs are the rollout's (so groups carried
over from an earlier step are corrected by the clipped ratio). Advantages are
group-relative over the rollout-time rewards. The whole batch is one
mini-batch (strictly on-policy by default); micro-batches share the batch's
denominators so their summed gradient equals the full-batch loss's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trainer.batching import Group
from trainer.grpo import group_advantages, loss_norm, micro_batches, policy_loss
from trainer.response_logprobs import response_logprobs
from trainer.sft import pad


def _rows(groups: Sequence[Group]) -> tuple[list[dict[str, Any]], list[int]]:
    rows: list[dict[str, Any]] = []
    group_ids: list[int] = []
    for gi, group in enumerate(groups):
        for traj in group.rollouts:
            rows.append(traj)
            group_ids.append(gi)
    return rows, group_ids


def grpo_update(
    model: torch.nn.Module,
    groups: Sequence[Group],
    *,
    pad_id: int,
    micro: int,
    clip_low: float,
    clip_high: float,
    agg: Any,
    adv_std: Any,
    is_cap: float | None = None,
    prox: Sequence[Sequence[float]] | None = None,
) -> dict[str, float]:
    """Backward of the GRPO loss over ``groups`` (the caller steps the optimizer); returns metrics.

    ``is_cap``: the rollouts may be off-policy; the decoupled, importance-weighted loss
    (``trainer.grpo.policy_loss``) with ``prox`` as the proximal log-probs per row (None: the
    current weights', exact when this is the update's only optimizer step)."""
    rows, group_ids = _rows(groups)
    rewards = torch.tensor([float(r["reward"]) for r in rows])
    advantages = group_advantages(rewards, group_ids, std=adv_std)
    prompts = [list(r["prompt_ids"]) for r in rows]
    responses = [list(r["response_ids"]) for r in rows]
    masks = [list(r["response_mask"]) for r in rows]
    olds = [list(r["logprobs"]) for r in rows]
    full_mask = pad(masks, 0).float()
    norm = loss_norm(full_mask, group_ids, agg)
    loss_total = 0.0
    clip_frac = 0.0
    is_stats: dict[str, float] = {}
    for part in micro_batches(len(rows), micro):
        idx = list(range(len(rows)))[part]
        logprobs = response_logprobs(model, [prompts[i] for i in idx], [responses[i] for i in idx], pad_id)
        width = logprobs.shape[1]
        mask = torch.tensor([masks[i] + [0] * (width - len(masks[i])) for i in idx], dtype=torch.float32)
        old = torch.tensor([olds[i] + [0.0] * (width - len(olds[i])) for i in idx])
        proximal = None
        if prox is not None:
            proximal = torch.tensor([list(prox[i]) + [0.0] * (width - len(prox[i])) for i in idx])
        loss, stats = policy_loss(
            logprobs,
            old,
            advantages[idx],
            mask,
            clip_low=clip_low,
            clip_high=clip_high,
            agg=agg,
            group_ids=[group_ids[i] for i in idx],
            norm=norm,
            is_cap=is_cap,
            prox_logprobs=proximal,
        )
        loss.backward()
        loss_total += float(loss.detach())
        clip_frac += float(stats.get("clip_frac", 0.0)) * len(idx) / len(rows)
        for key in ("is_weight_mean", "is_truncated_frac"):
            if key in stats:
                is_stats[key] = is_stats.get(key, 0.0) + stats[key] * len(idx) / len(rows)
    return is_stats | {
        "loss": loss_total,
        "clip_frac": clip_frac,
        "adv_abs_mean": float(advantages.abs().mean()),
        "sequences": float(len(rows)),
        "response_tokens": float(full_mask.sum()),
    }

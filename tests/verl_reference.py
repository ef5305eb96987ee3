"""verl's own GRPO advantage and policy loss on given tensors, for tests/test_verl_parity.py.

Runs under the verl virtualenv's python (scripts/install_verl.sh makes .venv-verl), never the main one:

    .venv-verl/bin/python -I tests/verl_reference.py CASES.pt RESULTS.pt

CASES.pt (torch.save of plain dicts, lists and tensors):
    {"advantages": [{"token_level_rewards", "response_mask", "index": list[str], "epsilon", "norm_by_std"}],
     "losses": [{"old_log_prob", "log_prob", "advantages", "response_mask", "loss_agg_mode",
                 "clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c",
                 "global_batch_info": {} or {"dp_size", "batch_num_tokens", "global_batch_size"}}]}
RESULTS.pt: {"verl_version", "advantages": [Tensor[B, T]], "losses": [{"loss", "grad", "metrics"}]}
where grad is d loss / d log_prob. Exit code 3 (with a message) when verl cannot be imported.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

try:
    import verl
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage, compute_policy_loss_vanilla
    from verl.workers.config.actor import ActorConfig
except ImportError as error:  # the parity test turns this into a failure with this message
    print(f"cannot import verl: {error!r}", file=sys.stderr)
    sys.exit(3)


def advantage(case: dict[str, Any]) -> torch.Tensor:
    advantages, _returns = compute_grpo_outcome_advantage(
        token_level_rewards=case["token_level_rewards"],
        response_mask=case["response_mask"],
        index=np.array(case["index"], dtype=object),
        epsilon=case["epsilon"],
        norm_adv_by_std_in_grpo=case["norm_by_std"],
    )
    return advantages


def actor_config(case: dict[str, Any]) -> ActorConfig:
    # ActorConfig needs a strategy, rollout_n and a micro-batch size to validate; the loss reads only the
    # clip ratios and global_batch_info (the whole batch's token / sequence counts for micro-batches).
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=case["clip_ratio"],
        clip_ratio_low=case["clip_ratio_low"],
        clip_ratio_high=case["clip_ratio_high"],
        clip_ratio_c=case["clip_ratio_c"],
        loss_agg_mode=case["loss_agg_mode"],
        global_batch_info=dict(case["global_batch_info"]),
    )


def loss(case: dict[str, Any]) -> dict[str, Any]:
    log_prob = case["log_prob"].clone().requires_grad_(True)
    value, metrics = compute_policy_loss_vanilla(
        old_log_prob=case["old_log_prob"],
        log_prob=log_prob,
        advantages=case["advantages"],
        response_mask=case["response_mask"],
        loss_agg_mode=case["loss_agg_mode"],
        config=actor_config(case),
    )
    value.backward()
    return {
        "loss": value.detach(),
        "grad": log_prob.grad,
        "metrics": {k: float(v) for k, v in metrics.items()},
    }


def main(source: str, target: str) -> None:
    torch.set_num_threads(1)
    cases = torch.load(source)
    results = {
        "verl_version": verl.__version__,
        "advantages": [advantage(case) for case in cases["advantages"]],
        "losses": [loss(case) for case in cases["losses"]],
    }
    torch.save(results, target)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

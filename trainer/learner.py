"""The learner: the policy's weights, its optimizer and schedule, and the rollout backend synced to it.

SFT uses AdamW with a cosine schedule and warmup over ``sft_steps``; GRPO
starts a fresh AdamW at a constant learning rate (the RL phase is a new
optimisation problem; SFT's moments would only bias it). After every GRPO
update the rollout backend gets the new weights (a no-op for the ``hf``
backend, which generates with the trained module itself).

``frozen_backend`` / ``load_frozen`` give a generation-only copy of the policy (no gradients, never
synced): the SFT-tuned user simulator of interactive GRPO rollouts, which GRPO must not change.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch.optim import AdamW
from torch.optim.lr_scheduler import LambdaLR

from arena.config import TrainSettings
from trainer.batching import Group
from trainer.policy import (
    HfBackend,
    Precision,
    RolloutBackend,
    autocast,
    load_policy,
    resolve_device,
    resolve_precision,
    stop_ids_of,
)
from trainer.policy_update import grpo_update
from trainer.sft import SftExample, cosine_schedule, sft_loss_backward

Phase = Literal["sft", "grpo"]


class Learner:
    """Model + tokenizer + optimizer + scheduler + rollout backend of one run."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        cfg: TrainSettings,
        backend: RolloutBackend,
        precision: Precision = "fp32",
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.backend = backend
        self.precision: Precision = precision
        """bf16: forward passes under autocast; the weights and AdamW state stay fp32."""
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.optimizer: AdamW | None = None
        self.scheduler: LambdaLR | None = None

    @classmethod
    def load(cls, folder: Path, cfg: TrainSettings) -> Learner:
        """The policy saved in ``folder`` on ``cfg.device`` (auto: the GPU when there is one)."""
        device = resolve_device(cfg.device)
        precision = resolve_precision(cfg.precision, device)
        model, tokenizer = load_policy(str(folder), device)
        model.train()
        backend: RolloutBackend
        if cfg.backend == "vllm":
            from trainer.policy import VllmBackend

            backend = VllmBackend(str(folder))
        else:
            backend = HfBackend(model, tokenizer, stop_ids=stop_ids_of(tokenizer), precision=precision)
        return cls(model, tokenizer, cfg, backend, precision)

    def frozen_backend(self) -> HfBackend:
        """A generation-only HF backend on a copy of the current weights (GRPO updates never reach it).

        Always transformers on the policy's device, also when rollouts use vLLM: a second vLLM
        engine would claim another share of the GPU for a model that only plays the user.
        """
        return _frozen(copy.deepcopy(self.model), self.tokenizer, self.precision)

    def load_frozen(self, folder: Path) -> HfBackend:
        """``frozen_backend`` of the weights saved in ``folder`` (resume: the SFT-end checkpoint)."""
        model, tokenizer = load_policy(str(folder), str(next(self.model.parameters()).device))
        return _frozen(model, tokenizer, self.precision)

    def sft_backward(self, examples: Sequence[SftExample]) -> tuple[float, int]:
        """Backward of one SFT batch's token-mean NLL (the caller steps the optimizer)."""
        with autocast(self.device, self.precision):
            return sft_loss_backward(self.model, examples, self.pad_id, self.cfg.micro_batch)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def new_optimizer(self, phase: Phase) -> None:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if phase == "sft":
            self.optimizer = AdamW(params, lr=self.cfg.sft_lr, weight_decay=0.0)
            self.scheduler = cosine_schedule(self.optimizer, self.cfg.sft_steps, self.cfg.warmup_ratio)
        else:
            self.optimizer = AdamW(params, lr=self.cfg.lr, weight_decay=0.0)
            self.scheduler = LambdaLR(self.optimizer, lambda _step: 1.0)

    def optimizer_step(self) -> float:
        """Clip, step, schedule, zero grads; returns the learning rate that was used."""
        assert self.optimizer is not None and self.scheduler is not None
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return lr

    def grpo_step(self, groups: Sequence[Group]) -> dict[str, float]:
        """GRPO on ``groups``: one optimizer step per mini-batch, then a weight sync to the rollout backend.

        With one mini-batch (the default) the update is strictly on-policy; with more, later
        mini-batches are off-policy by the earlier steps and the clipped ratio corrects them.
        """
        parts = [list(groups[i :: self.cfg.mini_batches]) for i in range(self.cfg.mini_batches)]
        totals: dict[str, float] = {}
        for part in (p for p in parts if p):
            with autocast(self.device, self.precision):
                metrics = grpo_update(
                    self.model,
                    part,
                    pad_id=self.pad_id,
                    micro=self.cfg.micro_batch,
                    clip_low=self.cfg.clip_low,
                    clip_high=self.cfg.clip_high,
                    agg=self.cfg.loss_agg,
                    adv_std=self.cfg.adv_std,
                )
            metrics["lr"] = self.optimizer_step()
            for key, value in metrics.items():
                totals[key] = totals.get(key, 0.0) + value
        steps = sum(1 for p in parts if p)
        averaged = {k: v / steps for k, v in totals.items() if k not in ("sequences", "response_tokens")}
        self.backend.load_weights(self.model)
        return averaged | {k: totals[k] for k in ("sequences", "response_tokens") if k in totals}

    def state_dict(self) -> dict[str, Any]:
        assert self.optimizer is not None and self.scheduler is not None
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state(self, state: dict[str, Any], phase: Phase) -> None:
        self.model.load_state_dict(state["model"])
        self.new_optimizer(phase)
        assert self.optimizer is not None and self.scheduler is not None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.backend.load_weights(self.model)


def _frozen(model: Any, tokenizer: Any, precision: Precision) -> HfBackend:
    """Eval mode (no dropout), no gradients: the module only ever generates."""
    model.eval()
    model.requires_grad_(False)
    return HfBackend(model, tokenizer, stop_ids=stop_ids_of(tokenizer), precision=precision)

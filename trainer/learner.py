"""The learner: the policy's weights, its optimizer and schedule, and the rollout backend synced to it.

SFT uses AdamW with a cosine schedule and warmup over ``sft_steps``; GRPO
starts a fresh AdamW at a constant learning rate (the RL phase is a new
optimisation problem; SFT's moments would only bias it). After every GRPO
update the rollout backend gets the new weights (a no-op for the ``hf``
backend, which generates with the trained module itself).

With ``max_off_policy_steps`` = s > 0 the HF backend generates with a copy of the module instead, and
``rollout_weights`` (``trainer.rollout_weights.LaggedWeights``) keeps that copy (or the vLLM engine)
s steps behind, so the service can roll the next batch out while an update runs; the update then
corrects the stale rollouts with truncated importance weights (``is_cap``).

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
from trainer.response_logprobs import response_logprobs
from trainer.rollout_weights import LaggedWeights
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
        self.rollout_weights: LaggedWeights | None = None
        """Set when rollouts may lag the update (``max_off_policy_steps`` > 0)."""
        if cfg.max_off_policy_steps > 0:
            self.rollout_weights = LaggedWeights(backend, cfg.max_off_policy_steps, _staging(backend, model))

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

            backend = VllmBackend.for_settings(str(folder), tokenizer, precision, cfg)
        elif cfg.max_off_policy_steps > 0:  # rollouts overlap updates: they need weights of their own
            backend = _frozen(copy.deepcopy(model), tokenizer, precision)
        else:
            backend = HfBackend(model, tokenizer, stop_ids=stop_ids_of(tokenizer), precision=precision)
        return cls(model, tokenizer, cfg, backend, precision)

    def start_rollouts(self, step: int) -> None:
        """GRPO starts at ``step``: the rollout backend gets the current weights (after SFT)."""
        if self.rollout_weights is not None:
            self.rollout_weights.reset(step, self.model)
        else:
            self.backend.load_weights(self.model)

    def behaviour_step(self, step: int, current: int) -> int:
        """Before the rollouts for training step ``step`` (``current``: the last step trained): put
        the rollout backend on the weights they must use and return whose those are."""
        if self.rollout_weights is None:
            return current
        return self.rollout_weights.sync_for(step)

    def push_weights(self, step: int) -> None:
        """After step ``step``'s update: keep its weights for the lagged rollouts (no-op on-policy)."""
        if self.rollout_weights is not None:
            self.rollout_weights.push(step, self.model)

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
        """GRPO on ``groups``: ``update_epochs`` passes, one optimizer step per mini-batch each, then a
        weight sync to the rollout backend.

        With one pass and one mini-batch (the default) the update is strictly on-policy; otherwise
        every later optimizer step is off-policy by the earlier ones and the clipped ratio against
        the rollout's log-probs corrects it (GRPO's mu iterations, PPO's epochs).
        Lagged rollouts (``rollout_weights``): the decoupled, importance-weighted loss, and no sync
        here -- the service pushes the new weights, which reach the rollouts s steps later.
        """
        parts = [
            p for p in (list(groups[i :: self.cfg.mini_batches]) for i in range(self.cfg.mini_batches)) if p
        ]
        epochs = self.cfg.update_epochs
        lagged = self.rollout_weights is not None
        # Off-policy: every optimizer step's ratio is against the weights at the start of the update.
        several = len(parts) > 1 or epochs > 1
        proximal = self._proximal(groups) if lagged and several else None
        totals: dict[str, float] = {}
        for _ in range(epochs):
            for part in parts:
                for key, value in self._update_on(part, proximal).items():
                    totals[key] = totals.get(key, 0.0) + value
        steps = len(parts) * epochs
        counted = ("sequences", "response_tokens")  # the batch's size, not summed over its passes
        averaged = {k: v / steps for k, v in totals.items() if k not in counted}
        if not lagged:  # lagged rollouts get these weights s steps later (push_weights)
            self.backend.load_weights(self.model)
        return averaged | {k: totals[k] / epochs for k in counted if k in totals}

    def _update_on(
        self, part: Sequence[Group], proximal: dict[int, list[list[float]]] | None
    ) -> dict[str, float]:
        """One optimizer step on the GRPO loss of ``part``; its metrics and the learning rate used."""
        lagged = self.rollout_weights is not None
        prox = None if proximal is None else [row for g in part for row in proximal[id(g)]]
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
                is_cap=self.cfg.is_cap if lagged else None,
                prox=prox,
            )
        return metrics | {"lr": self.optimizer_step()}

    def _proximal(self, groups: Sequence[Group]) -> dict[int, list[list[float]]]:
        """Per group (by ``id``), each rollout's response log-probs under the current weights, no gradient."""
        rows = [(id(g), r) for g in groups for r in g.rollouts]
        out: dict[int, list[list[float]]] = {id(g): [] for g in groups}
        micro = self.cfg.micro_batch
        with torch.no_grad(), autocast(self.device, self.precision):
            for start in range(0, len(rows), micro):
                chunk = rows[start : start + micro]
                values = response_logprobs(
                    self.model,
                    [list(r["prompt_ids"]) for _, r in chunk],
                    [list(r["response_ids"]) for _, r in chunk],
                    self.pad_id,
                )
                for (gid, r), row in zip(chunk, values.tolist(), strict=True):
                    out[gid].append(row[: len(r["response_ids"])])
        return out

    def state_dict(self) -> dict[str, Any]:
        assert self.optimizer is not None and self.scheduler is not None
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
        }
        if self.rollout_weights is not None and (rollout := self.rollout_weights.state_dict()) is not None:
            state["rollout_weights"] = rollout
        return state

    def load_state(self, state: dict[str, Any], phase: Phase) -> None:
        """Restore a training state; in GRPO the rollout backend gets the weights it was using."""
        self.model.load_state_dict(state["model"])
        self.new_optimizer(phase)
        assert self.optimizer is not None and self.scheduler is not None
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        rollout = state.get("rollout_weights")
        if self.rollout_weights is None or phase != "grpo":
            self.backend.load_weights(self.model)
        elif rollout is not None and int(rollout["lag"]) == self.rollout_weights.lag:
            self.rollout_weights.load_state_dict(rollout)
        else:  # written on-policy or with another lag: the lag restarts from these weights
            self.rollout_weights.reset(int(state.get("step", 0)), self.model)


def _staging(backend: RolloutBackend, model: Any) -> torch.nn.Module:
    """Where lagged weights are loaded before a sync: the HF rollout copy itself, else a host copy."""
    if isinstance(backend, HfBackend):
        if backend.model is model:
            raise ValueError(
                "max_off_policy_steps > 0 needs a rollout backend with its own weights, not the trained module"
            )
        staging: torch.nn.Module = backend.model
        return staging
    return copy.deepcopy(model).to("cpu")


def _frozen(model: Any, tokenizer: Any, precision: Precision) -> HfBackend:
    """Eval mode (no dropout), no gradients: the module only ever generates."""
    model.eval()
    model.requires_grad_(False)
    return HfBackend(model, tokenizer, stop_ids=stop_ids_of(tokenizer), precision=precision)

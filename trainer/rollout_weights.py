"""The rollout weights of an overlapped GRPO run: the policy as it was s steps ago.

With ``max_off_policy_steps`` = s > 0 the rollouts for training step t use the weights written by
step t-1-s (or the GRPO start's, when the run is younger than that). Those weights exist before
step t-1's update begins, so the batch of step t rolls out while step t-1 trains -- the overlap of
prime-rl, verl's one-step-off-policy trainer and SkyRL -- and which weights a rollout saw follows
from its step alone, never from timing: a run is reproducible for its seed and batch composition,
and a run resumed from a checkpoint rolls out exactly what the crashed one would have.

``LaggedWeights`` keeps the rollout backend on those weights. Each update's result is ``push``-ed as
a host-memory snapshot (at most s are kept); ``sync_for(step)`` moves the backend to the newest
snapshot the lag allows before a step's rollouts start. Its ``state_dict`` (the weights in use and
the snapshots still to come) is part of the training state, since a resumed run needs weights
older than the model's.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from trainer.policy import RolloutBackend

Weights = dict[str, torch.Tensor]


def snapshot(model: torch.nn.Module) -> Weights:
    """A host-memory copy of ``model``'s weights (the module keeps training; this copy does not move)."""
    return {name: t.detach().to("cpu", copy=True) for name, t in model.state_dict().items()}


class LaggedWeights:
    """The rollout backend's weights, ``lag`` training steps behind the learner's."""

    def __init__(self, backend: RolloutBackend, lag: int, staging: torch.nn.Module) -> None:
        """``backend``: the rollout backend (not generating on the trained module); ``staging``: a module
        of the policy's architecture that snapshots are loaded into before ``backend.load_weights``
        (for the HF backend its own module, so a sync is one copy)."""
        if lag < 1:
            raise ValueError(f"lag must be >= 1 (0 means no rollout copy), got {lag}")
        self.backend = backend
        self.lag = lag
        self._staging = staging
        self.step: int | None = None
        """Training step whose weights the backend (and ``staging``) holds (None until ``reset``)."""
        self._pending: deque[tuple[int, Weights]] = deque()

    def reset(self, step: int, model: torch.nn.Module) -> None:
        """GRPO starts at ``step`` (or resumes without a recorded rollout state): roll out with
        ``model``'s weights as they are now."""
        self._pending.clear()
        self._load(step, snapshot(model))

    def push(self, step: int, model: torch.nn.Module) -> None:
        """Step ``step``'s update wrote ``model``'s weights: keep them for the rollouts ``lag`` steps on."""
        if self._pending and step <= self._pending[-1][0]:
            raise ValueError(f"weights of step {step} pushed after those of step {self._pending[-1][0]}")
        self._pending.append((step, snapshot(model)))

    def target(self, step: int) -> int:
        """The weights the rollouts for training step ``step`` use: step - 1 - lag, at least the
        oldest this run has (its GRPO start)."""
        assert self.step is not None, "reset() first"
        return max(self.step, step - 1 - self.lag)

    def sync_for(self, step: int) -> int:
        """Before the rollouts for training step ``step``: load the weights ``target(step)`` names;
        returns that step (the rollouts' behaviour policy)."""
        wanted = self.target(step)
        chosen: tuple[int, Weights] | None = None
        while self._pending and self._pending[0][0] <= wanted:
            chosen = self._pending.popleft()
        if chosen is not None:
            self._load(*chosen)
        if self.step != wanted:
            raise RuntimeError(
                f"rollouts for step {step} need the weights of step {wanted}; the newest kept is step "
                f"{self.step}: an update was not pushed"
            )
        return wanted

    def _load(self, step: int, weights: Weights) -> None:
        self._staging.load_state_dict(weights)
        self.backend.load_weights(self._staging)
        self.step = step

    def state_dict(self) -> dict[str, Any] | None:
        """The weights in use and those still to come (None before ``reset``: nothing to resume)."""
        if self.step is None:
            return None
        return {
            "lag": self.lag,
            "step": self.step,
            "current": snapshot(self._staging),  # the weights in use live in the staging module
            "pending": [[step, weights] for step, weights in self._pending],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``; the backend gets the weights that were in use."""
        self._pending = deque((int(step), weights) for step, weights in state["pending"])
        self._load(int(state["step"]), state["current"])

"""Adaptive batch filling (ASTRA §3.1, Fig. 5): every step trains on exactly n groups with a learning signal.

A group (the G rollouts of one prompt) is valid when the population standard deviation of its rewards is
above delta: with GRPO advantages, an all-equal group has zero advantage and gives no gradient. The
population std is the natural "are these all equal" measure (it is 0 exactly then, for any G, including
G = 1); ``statistics.pstdev`` computes it exactly, so delta = 0 drops exactly the all-equal groups, which
is EigenData's dynamic filtering. A negative delta keeps every group (filtering off, for ablations).

Per step: rollout rounds ``add`` groups; valid ones join the pool after the groups carried over from the
last step; rounds go on (the service keeps drawing, waiting on the topic when it is empty) until the pool
holds n; then ``take`` returns the oldest n (FIFO) and keeps up to n-1 of the surplus for the next step
(the newest ones: the oldest surplus is dropped and counted, to bound staleness). So every step trains on
exactly n groups and after every take the buffer holds fewer than n. The one exception is a run told to
stop when its topic is drained (``final_short_batch``): ``take_short`` then trains what there is, and
the step is counted and reported as short. An empty pool is never a step.

The buffer, with its rollouts' token ids and log-probs, is JSON-able (``state_dict``) and goes into the
training checkpoint, so a restart trains exactly what the crashed run would have.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BaseModel, Field


class Group(BaseModel):
    """G rollouts of one prompt, ready to train."""

    sample_id: Annotated[str, Field(description="the prompt's sample id")]
    rewards: Annotated[list[float], Field(description="one reward per rollout")]
    rollouts: Annotated[
        list[dict[str, Any]],
        Field(description="opaque, JSON-able rollouts (token ids, masks, rollout log-probs)"),
    ]
    born_step: Annotated[int, Field(description="training step at which it was rolled out (staleness)")] = 0
    behaviour_step: Annotated[
        int | None,
        Field(
            description="training step whose weights generated the rollouts (the behaviour policy): the "
            "step before born_step on-policy, older when rollouts lag the update; None in states written "
            "before it was recorded"
        ),
    ] = None


class AddOutcome(BaseModel):
    """What one rollout round added."""

    valid: Annotated[int, Field(description="groups kept (Std(R) > delta)")]
    invalid: Annotated[int, Field(description="groups discarded (Std(R) <= delta)")]
    pooled: Annotated[int, Field(description="valid groups waiting after this round")]


class StepFill(BaseModel):
    """How one training step's batch was filled."""

    rounds: int = 0
    rolled_groups: int = 0
    valid_groups: int = 0
    invalid_groups: int = 0
    carried_in: Annotated[int, Field(description="groups carried over from the previous step")] = 0
    trained_groups: int = 0
    dropped_groups: Annotated[int, Field(description="surplus valid groups beyond n-1, dropped")] = 0
    shortfall: Annotated[int, Field(description="n - trained groups (0 unless a final short step)")] = 0
    fill_ratio: Annotated[float, Field(description="trained groups / n (1.0 for a full step)")] = 0.0
    valid_ratio: Annotated[float, Field(description="valid / rolled groups of this step's rounds")] = 0.0


class FillStats(BaseModel):
    """Totals since the filler was created (restored from checkpoints)."""

    steps: int = 0
    short_steps: Annotated[int, Field(description="steps trained on fewer than n groups (final ones)")] = 0
    rounds: int = 0
    rolled_groups: int = 0
    valid_groups: int = 0
    invalid_groups: int = 0
    dropped_groups: int = 0
    trained_groups: int = 0
    shortfall: int = 0
    fill_ratio: Annotated[float, Field(description="trained groups / (steps * n)")] = 0.0
    valid_ratio: Annotated[float, Field(description="valid / rolled groups")] = 0.0


def group_std(rewards: Sequence[float]) -> float:
    """Population std of a group's rewards (0 for an empty or one-element group)."""
    return statistics.pstdev(rewards) if len(rewards) > 1 else 0.0


def is_valid(group: Group, delta: float) -> bool:
    """ASTRA's validity rule: Std(R) > delta (population std)."""
    return len(group.rewards) > 0 and group_std(group.rewards) > delta


class BatchFiller:
    """The adaptive batch-filling buffer: exactly n valid groups per step, fewer than n carried over."""

    def __init__(self, n: int, delta: float = 0.0) -> None:
        if n < 1:
            raise ValueError(f"batch size n must be >= 1, got {n}")
        self.n = n
        self.delta = delta
        self._pool: list[Group] = []  # carried-over groups first, then this step's valid groups (FIFO)
        self._step = StepFill()
        self._last = StepFill()
        self._totals = FillStats()

    @property
    def buffer(self) -> list[Group]:
        """The valid groups waiting (after a take: the carry-over, always fewer than n)."""
        return list(self._pool)

    @property
    def stats(self) -> FillStats:
        return self._totals.model_copy()

    @property
    def last(self) -> StepFill:
        """The last completed step's filling (the per-step metrics)."""
        return self._last.model_copy()

    def fill_ratio(self) -> float:
        """The last step's trained groups over n (1.0 unless it was a final short step)."""
        return self._last.fill_ratio

    def valid_ratio(self) -> float:
        """The last step's valid over rolled groups (how much rollout work fed the batch)."""
        return self._last.valid_ratio

    def add(self, groups: Sequence[Group]) -> AddOutcome:
        """One rollout round: keep the valid groups in arrival order, count the rest."""
        valid = [group for group in groups if is_valid(group, self.delta)]
        self._pool.extend(valid)
        self._step.rounds += 1
        self._step.rolled_groups += len(groups)
        self._step.valid_groups += len(valid)
        self._step.invalid_groups += len(groups) - len(valid)
        return AddOutcome(valid=len(valid), invalid=len(groups) - len(valid), pooled=len(self._pool))

    def ready(self) -> bool:
        return len(self._pool) >= self.n

    def take(self) -> list[Group]:
        """Exactly n groups, oldest first; up to n-1 newest surplus groups stay, older surplus is dropped."""
        if not self.ready():
            raise RuntimeError(
                f"only {len(self._pool)} of {self.n} valid groups; roll more or take_partial()"
            )
        batch, surplus = self._pool[: self.n], self._pool[self.n :]
        keep = surplus[len(surplus) - (self.n - 1) :] if len(surplus) > self.n - 1 else surplus
        self._pool = keep
        self._close_step(batch, dropped=len(surplus) - len(keep))
        return batch

    def take_short(self) -> list[Group]:
        """The final step of a drained run: everything waiting (fewer than n, at least one), the
        shortfall recorded. A full pool is a normal ``take``."""
        if self.ready():
            return self.take()
        if not self._pool:
            raise RuntimeError("no valid group waits: an empty batch is not a step")
        batch, self._pool = self._pool, []
        self._close_step(batch, dropped=0)
        return batch

    def _close_step(self, batch: list[Group], dropped: int) -> None:
        step = self._step
        step.trained_groups = len(batch)
        step.dropped_groups = dropped
        step.shortfall = self.n - len(batch)
        step.fill_ratio = len(batch) / self.n
        step.valid_ratio = _ratio(step.valid_groups, step.rolled_groups)
        totals = self._totals
        totals.steps += 1
        totals.short_steps += int(step.shortfall > 0)
        totals.rounds += step.rounds
        totals.rolled_groups += step.rolled_groups
        totals.valid_groups += step.valid_groups
        totals.invalid_groups += step.invalid_groups
        totals.dropped_groups += dropped
        totals.trained_groups += len(batch)
        totals.shortfall += step.shortfall
        totals.fill_ratio = _ratio(totals.trained_groups, totals.steps * self.n)
        totals.valid_ratio = _ratio(totals.valid_groups, totals.rolled_groups)
        self._last = step
        self._step = StepFill(carried_in=len(self._pool))

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the waiting groups (with their rollouts), the open step and the totals."""
        return {
            "n": self.n,
            "delta": self.delta,
            "buffer": [group.model_dump(mode="json") for group in self._pool],
            "step": self._step.model_dump(mode="json"),
            "last": self._last.model_dump(mode="json"),
            "totals": self._totals.model_dump(mode="json"),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict``; n and delta stay those of the constructor (the config)."""
        self._pool = [Group.model_validate(group) for group in state["buffer"]]
        self._step = StepFill.model_validate(state["step"])
        self._last = StepFill.model_validate(state["last"])
        self._totals = FillStats.model_validate(state["totals"])


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0

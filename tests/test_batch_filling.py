"""Adaptive batch filling (ASTRA Fig. 5): buffer invariant, exact batches, carry-over, round cap, state."""

from __future__ import annotations

import json
import random

import pytest

from trainer.batching import BatchFiller, Group, group_std, is_valid


def group(sid: str, rewards: list[float], step: int = 0) -> Group:
    rollouts = [
        {"token_ids": [1, 2, i], "logprobs": [-0.25, -1.5 + i / 10], "mask": [1, 1]}
        for i in range(len(rewards))
    ]
    return Group(sample_id=sid, rewards=rewards, rollouts=rollouts, born_step=step)


def valid(sid: str) -> Group:
    return group(sid, [0.0, 1.0, 0.5])


def invalid(sid: str) -> Group:
    return group(sid, [0.5, 0.5, 0.5])


def ids(groups: list[Group]) -> list[str]:
    return [g.sample_id for g in groups]


def test_validity_uses_population_std_over_delta() -> None:
    # population std of [0, 1] = 0.5 (the unbiased one would be 0.707)
    assert group_std([0.0, 1.0]) == 0.5
    assert is_valid(group("a", [0.0, 1.0]), delta=0.49)
    assert not is_valid(group("a", [0.0, 1.0]), delta=0.6)
    # [0, 0, 0, 1]: mean 0.25, variance (3 * 0.0625 + 0.5625) / 4 = 0.1875, std 0.4330
    assert group_std([0.0, 0.0, 0.0, 1.0]) == pytest.approx(0.4330127, abs=1e-7)
    # strictly greater than delta; a single rollout or an empty group has no spread
    assert not is_valid(group("a", [0.2, 0.2]), delta=0.0)
    assert not is_valid(group("a", [1.0]), delta=0.0)
    assert not is_valid(group("a", []), delta=-1.0)
    # negative delta switches the filter off
    assert is_valid(group("a", [0.2, 0.2]), delta=-1.0)


def test_delta_zero_is_dynamic_filtering() -> None:
    # delta -> 0 drops exactly the groups whose rewards are all equal (EigenData / DAPO dynamic filtering),
    # even for rewards that are not exact binary fractions.
    rng = random.Random(0)
    levels = [0.0, 1 / 3, 0.1, 0.7, 1.0]
    for _ in range(500):
        rewards = [rng.choice(levels) for _ in range(rng.randint(1, 6))]
        assert is_valid(group("g", rewards), delta=0.0) == (len(set(rewards)) > 1)
    filler = BatchFiller(n=2, delta=0.0)
    outcome = filler.add([invalid("a"), valid("b"), group("c", [1 / 3] * 4), group("d", [1.0, 1.0 + 1e-12])])
    assert (outcome.valid, outcome.invalid, outcome.pooled) == (2, 2, 2)
    assert ids(filler.take()) == ["b", "d"]


def test_exactly_n_per_step_and_buffer_below_n() -> None:
    rng = random.Random(1)
    n = 4
    filler = BatchFiller(n=n, delta=0.0)
    counter = 0
    for step in range(40):
        while not filler.ready():
            batch = []
            for _ in range(rng.randint(0, 9)):
                counter += 1
                batch.append(valid(f"s{counter}") if rng.random() < 0.6 else invalid(f"s{counter}"))
            filler.add(batch)
        taken = filler.take()
        assert len(taken) == n
        assert len(filler.buffer) < n, f"step {step}: buffer {len(filler.buffer)} >= n"
    stats = filler.stats
    assert stats.steps == 40 and stats.trained_groups == 40 * n and stats.shortfall == 0
    assert stats.fill_ratio == 1.0
    # every valid group was trained, is still waiting, or was dropped and counted
    assert stats.valid_groups == stats.trained_groups + len(filler.buffer) + stats.dropped_groups
    assert stats.rolled_groups == stats.valid_groups + stats.invalid_groups


def test_carry_over_keeps_newest_surplus_and_counts_dropped() -> None:
    filler = BatchFiller(n=3, delta=0.0)
    filler.add([valid(f"g{i}") for i in range(7)])
    # FIFO: g0..g2 train; surplus g3..g6 (4) > n-1 = 2 -> keep the newest g5, g6; g3, g4 dropped.
    assert ids(filler.take()) == ["g0", "g1", "g2"]
    assert ids(filler.buffer) == ["g5", "g6"]
    last = filler.last
    assert (last.trained_groups, last.dropped_groups, last.shortfall, last.fill_ratio) == (3, 2, 0, 1.0)

    # The carried groups go first in the next step.
    outcome = filler.add([invalid("x"), valid("g7"), valid("g8")])
    assert outcome.pooled == 4
    assert ids(filler.take()) == ["g5", "g6", "g7"]
    assert ids(filler.buffer) == ["g8"]
    last = filler.last
    assert (last.carried_in, last.rounds, last.rolled_groups, last.valid_groups, last.invalid_groups) == (
        2,
        1,
        3,
        2,
        1,
    )
    assert last.dropped_groups == 0
    assert last.valid_ratio == pytest.approx(2 / 3)
    assert filler.stats.dropped_groups == 2


def test_n_of_one_carries_nothing() -> None:
    filler = BatchFiller(n=1, delta=0.0)
    filler.add([valid("a"), valid("b")])
    assert ids(filler.take()) == ["a"]
    assert filler.buffer == []
    assert filler.stats.dropped_groups == 1


def test_only_a_final_short_step_trains_fewer_than_n() -> None:
    filler = BatchFiller(n=4, delta=0.0)
    filler.add([valid("a"), invalid("b")])
    filler.add([invalid("c"), valid("d")])
    assert not filler.ready()
    with pytest.raises(RuntimeError):
        filler.take()
    assert ids(filler.take_short()) == ["a", "d"]
    last = filler.last
    assert (last.trained_groups, last.shortfall, last.rounds) == (2, 2, 2)
    assert last.fill_ratio == filler.fill_ratio() == 0.5
    assert last.valid_ratio == filler.valid_ratio() == 0.5
    assert filler.buffer == []
    # an empty batch is not a step
    filler.add([invalid("x")])
    with pytest.raises(RuntimeError, match="not a step"):
        filler.take_short()
    assert filler.stats.steps == 1

    # Next step fills completely: totals average the two steps.
    filler.add([valid(f"e{i}") for i in range(4)])
    assert len(filler.take_short()) == 4  # take_short on a ready filler is a normal take
    stats = filler.stats
    assert (stats.steps, stats.short_steps, stats.shortfall, stats.trained_groups) == (2, 1, 2, 6)
    assert stats.fill_ratio == pytest.approx(6 / 8)


def test_state_dict_round_trips_through_json() -> None:
    filler = BatchFiller(n=3, delta=0.0)
    filler.add([valid(f"a{i}") for i in range(5)] + [invalid("z")])
    filler.take()  # a3, a4 carried
    filler.add([group("b0", [0.1, 0.9, 0.3], step=1)])  # an open step with one round
    state = json.loads(json.dumps(filler.state_dict()))

    restored = BatchFiller(n=3, delta=0.0)
    restored.load_state_dict(state)
    assert restored.buffer == filler.buffer
    assert restored.buffer[0].rollouts[1]["logprobs"] == [-0.25, -1.4]
    assert restored.stats == filler.stats and restored.last == filler.last
    # both continue identically, including the open step's round count
    more = [valid("c0"), invalid("c1")]
    for f in (filler, restored):
        f.add(more)
    assert ids(restored.take()) == ids(filler.take()) == ["a3", "a4", "b0"]
    assert restored.last == filler.last and restored.last.rounds == 2


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        BatchFiller(n=0)


def test_an_abandoned_step_suggests_a_short_final_step_only_where_one_would_train() -> None:
    from trainer.service import abandoned_step_line

    hint = "FINAL_SHORT_BATCH=true"
    line = abandoned_step_line(
        stopping=False, waiting=2, batch_groups=4, consumed=24, final_short_batch=False
    )
    assert "drained" in line and "2 of 4 valid groups after 24 new samples" in line and hint in line
    # A stop signal never trains a short step; a drained run with nothing waiting has nothing to train.
    assert hint not in abandoned_step_line(
        stopping=True, waiting=2, batch_groups=4, consumed=24, final_short_batch=False
    )
    assert hint not in abandoned_step_line(
        stopping=False, waiting=0, batch_groups=4, consumed=8, final_short_batch=False
    )
    line = abandoned_step_line(stopping=True, waiting=2, batch_groups=4, consumed=24, final_short_batch=True)
    assert line.startswith("[yellow]stopping[/yellow]") and "rolled out again" in line

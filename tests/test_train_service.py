"""`arena train --tiny` on the real stack: kill -9 mid-run, restart, every consumed sample trained once.

Runs on the session's demo home (tests/fixtures/demo.py): its ``samples.sft``
and ``samples.verified`` topics and its catalog of verified packages are the
trainer's input. The first run is killed with SIGKILL (its whole process
group: the trainer and its sandbox workers) once it has written a full
training state and gone past it; the second run resumes from that state and
drains both topics. The step records in the lake then describe one history in
which every sample of both topics appears exactly once, and every consumed
GRPO sample was trained, filtered, dropped or skipped with a reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.cli import ARENA, run_arena
from tests.fixtures.demo import Demo, values

pytestmark = pytest.mark.integration

RUN = "it"


def _train_env(demo: Demo) -> dict[str, str]:
    return demo.env | {
        "ARENA_TRAIN__RUN": RUN,
        "ARENA_TRAIN__SFT_STEPS": "3",
        # 3 steps of 2 (one micro-batch each): an SFT step over the demo's long samples costs about
        # 2 CPU-s per sample on the tiny model, and what is tested is the phase's bookkeeping.
        "ARENA_TRAIN__SFT_BATCH": "2",
        "ARENA_TRAIN__SFT_LR": "1e-3",
        "ARENA_TRAIN__LR": "1e-4",
        "ARENA_TRAIN__GROUP_SIZE": "2",
        "ARENA_TRAIN__BATCH_GROUPS": "2",
        "ARENA_TRAIN__FINAL_SHORT_BATCH": "true",
        # A random tiny model scores 0 everywhere; -1 keeps every group so GRPO steps update.
        "ARENA_TRAIN__DELTA": "-1",
        "ARENA_TRAIN__MAX_TURNS": "2",
        "ARENA_TRAIN__MAX_NEW_TOKENS": "16",
        "ARENA_TRAIN__MAX_SEQ_LEN": "6144",
        "ARENA_TRAIN__STATE_EVERY": "2",
        "ARENA_TRAIN__WEIGHTS_EVERY": "3",
        "ARENA_TRAIN__MICRO_BATCH": "2",
    }


def _lake(demo: Demo, run: str = RUN) -> Path:
    return demo.home / "lake" / "trainer" / run


def _steps(demo: Demo, run: str = RUN) -> list[dict]:
    folder = _lake(demo, run) / "steps"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("step-*.json"))]


@pytest.mark.parametrize("lag", [0, 1], ids=["on-policy", "overlapped"])
def test_train_killed_and_resumed_trains_every_sample_once(demo_run: Demo, lag: int) -> None:
    """lag 1 (``max_off_policy_steps``): the next batch rolls out during each update, so the kill
    lands with samples taken for a step that never trained; the checkpoint's offsets stop before
    them, and it carries the lagged rollout weights, so the resumed run stays one update behind."""
    run = RUN if lag == 0 else f"{RUN}-lag{lag}"
    env = _train_env(demo_run) | {"ARENA_TRAIN__RUN": run, "ARENA_TRAIN__MAX_OFF_POLICY_STEPS": str(lag)}
    argv = [ARENA, "train", "--tiny", "--until-drained"]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    states = _lake(demo_run, run) / "state"
    try:
        deadline = time.monotonic() + 400
        # Kill once a full state exists and at least one step after it has been recorded.
        while True:
            assert proc.poll() is None, f"trainer exited early:\n{proc.communicate()[0][-4000:]}"
            assert time.monotonic() < deadline, "no training state after 400 s"
            saved = sorted(states.glob("step-*.pt")) if states.is_dir() else []
            if saved and len(_steps(demo_run, run)) > int(saved[-1].stem.split("-")[1]):
                break
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    steps_at_kill = len(_steps(demo_run, run))

    out = run_arena(["train", "--tiny", "--until-drained"], env, timeout=900)
    assert "resumed" in out.stdout, out.stdout[-3000:]

    records = _steps(demo_run, run)
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    assert len(records) >= steps_at_kill
    consumed = Counter(i for r in records for i in r["consumed"])
    assert max(consumed.values()) == 1, [i for i, c in consumed.items() if c > 1]

    sft_ids = {v["sample_id"] for v in values(demo_run.bootstrap, "samples.sft")}
    rl_ids = {v["sample_id"] for v in values(demo_run.bootstrap, "samples.verified")}
    sft_steps = [r for r in records if r["phase"] == "sft"]
    grpo_steps = [r for r in records if r["phase"] == "grpo"]
    assert len(sft_steps) == 3
    # SFT: every consumed sample is trained in its step; GRPO consumed the whole topic.
    assert all(r["trained"] == r["consumed"] for r in sft_steps)
    assert {i for r in sft_steps for i in r["consumed"]} <= sft_ids
    grpo_consumed = {i for r in grpo_steps for i in r["consumed"]}
    assert grpo_consumed == rl_ids
    outcomes = Counter(
        i for r in grpo_steps for i in r["trained"] + r["filtered"] + r["dropped"] + list(r["skipped"])
    )
    assert set(outcomes) == rl_ids and max(outcomes.values()) == 1
    assert sum(len(r["trained"]) for r in grpo_steps) > 0
    # adaptive batch filling: every GRPO step trains exactly n groups, but the drained run's last one
    assert all(len(r["trained"]) == 2 for r in grpo_steps[:-1])
    assert 1 <= len(grpo_steps[-1]["trained"]) <= 2

    # Decoupled checkpoints: at most 2 full states, weights folders on their cadence, catalog rows.
    assert 1 <= len(list(states.glob("step-*.pt"))) <= 2
    weights = sorted(p.name for p in (_lake(demo_run, run) / "weights").iterdir())
    assert "step-00000003" in weights
    metrics = [v for v in values(demo_run.bootstrap, "trainer.metrics") if v["run_id"] == run]
    assert {m["step"] for m in metrics} == {r["step"] for r in records}
    grpo_metric = next(m for m in metrics if m["metrics"]["phase_grpo"] == 1.0)
    for key in ("reward_mean", "reward_std", "fill_ratio", "loss", "step_s", "turns_mean", "tool_calls_mean"):
        assert key in grpo_metric["metrics"], key
    shorts = {m["step"] for m in metrics if m["metrics"].get("short_batch") == 1.0}
    assert shorts <= {grpo_steps[-1]["step"]}, shorts  # only the final step may be short, and says so

    # What the policy was paid for can be audited: every GRPO step recorded its QA rollouts, and
    # `arena reward score` on them gives the rewards the service trained on.
    logs = sorted((_lake(demo_run, run) / "rollouts").glob("step-*.jsonl"))
    assert {int(p.stem.split("-")[1]) for p in logs} <= {r["step"] for r in grpo_steps} and logs
    recorded = [json.loads(line) for p in logs for line in p.read_text().splitlines()]
    joined = demo_run.home / f"recorded-{run}.jsonl"
    joined.write_text("".join(json.dumps(line) + "\n" for line in recorded))
    rescored = [
        json.loads(line) for line in run_arena(["reward", "score", str(joined)], env).stdout.splitlines()
    ]
    assert len(rescored) == len(recorded) > 0
    for line, again in zip(recorded, rescored, strict=True):
        assert again["f1"] == pytest.approx(line["reward"]), line["sample_id"]
        assert (again["solved"], again["calls"]) == (line["reward_parts"]["n_hat"], line["reward_parts"]["c"])

    # Staleness: on-policy rollouts are fresh (a group the buffer carried is one step old); lagged
    # ones are one update behind from the second GRPO step on, after the resume as well.
    stale = [r["metrics"]["staleness_mean"] for r in grpo_steps if "staleness_mean" in r["metrics"]]
    assert len(stale) == len(grpo_steps)
    if lag == 0:
        assert stale[0] == 0.0 and all(s <= 1.0 for s in stale)
        assert not any(r["metrics"]["rollout_overlapped"] for r in grpo_steps)
    else:
        assert stale[0] == 0.0 and all(1.0 <= s <= 2.0 for s in stale[1:]), stale
        assert all("is_weight_mean" in r["metrics"] for r in grpo_steps)
        assert any(r["metrics"]["rollout_overlapped"] for r in grpo_steps)

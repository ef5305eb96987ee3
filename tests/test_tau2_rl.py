"""tau2 tasks as RL environments: ``samples.verified`` records of kind ``tau2``.

The environment runs the domain's own code in a sandbox session with Arena's simulated user (the
rules backend here); its reward is the task's verification on the live session. Claims: on the same
trajectories tau2's own evaluator gives the same rewards (gold calls 1, a dropped write 0, a
do-nothing dialogue on a task that asks for nothing 1, a dialogue cut before a stop 0); the
trainer's rollouts of tau2 samples feed a GRPO step, and every rollout it recorded is rescored by
tau2's evaluator (``arena reward tau2``) to the reward the trainer used.

Needs ``.venv-tau2`` and the sandbox (root), as ``tests/test_tau2.py``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from arena.config import ArenaSettings
from environments.tau2_env import Tau2Unavailable, tau2_site_dirs

try:
    tau2_site_dirs()
except Tau2Unavailable as exc:
    pytest.skip(f"{exc} -- scripts/test.sh builds it", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("the sandbox needs root (CI runs the tests as root)", allow_module_level=True)

from environments.factory import environment_for
from environments.tau2_env import Tau2Session, tau2_pool
from environments.tau2_environment import (
    Tau2Environment,
    Tau2EnvSpec,
    Tau2Rollout,
    load_spec_databases,
    rescore,
    tau2_sample,
)
from environments.tau2_import import Tau2Import, build_import, load_tasks, synthesis_tasks
from environments.tau2_tasks import Tau2Task
from environments.user_view import GatewayUserSimulator
from lake.store import ObjectStore, open_store

DOMAIN = "retail"
NOTHING = "24"
"""A retail train task whose evaluation asks for no action: a dialogue that changes nothing passes."""


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ArenaSettings, Tau2Import]]:
    path = tmp_path_factory.mktemp("home")
    settings = ArenaSettings.model_validate(
        {"home": str(path), "llm": "rules", "sandbox": {"pool_size": 2, "timeout_s": 60.0}}
    )

    async def go() -> Tau2Import:
        async with tau2_pool(settings.sandbox, DOMAIN, evaluator=False) as pool:
            return await build_import(open_store(settings), pool, DOMAIN)

    yield settings, asyncio.run(go())


def _tasks(store: ObjectStore, imported: Tau2Import) -> dict[str, Tau2Task]:
    return {t.task_id: t for t in synthesis_tasks(load_tasks(store, imported))}


def _with_write(tasks: dict[str, Tau2Task], writes: set[str]) -> Tau2Task:
    return next(
        t
        for t in tasks.values()
        if not t.verification.needs_judge and any(a.name in writes for a in t.verification.actions)
    )


def _opening(task: Tau2Task) -> str:
    return task.requirements[0] if task.requirements else "Hi, I need help."


async def _dialogue(
    env: Tau2Environment, calls: list[tuple[str, dict[str, object]]], *, stop: bool, say: str = ""
) -> None:
    """The agent makes ``calls``, says ``say``, then talks until the user stops (``stop``), or just once."""
    for name, arguments in calls:
        await env.call(name, arguments)
    reply = await env.user_turn(f"{say} Is there anything else I can help you with?".strip())
    for _ in range(6 if stop else 0):
        if reply is None:
            break
        reply = await env.user_turn("Is there anything else I can help you with?")


def test_the_environments_reward_is_tau2s_on_the_same_trajectories(
    home: tuple[ArenaSettings, Tau2Import],
) -> None:
    settings, imported = home
    store = open_store(settings)
    tasks = _tasks(store, imported)
    write = _with_write(tasks, set(imported.write_tools))
    gold = [(a.name, dict(a.arguments)) for a in write.verification.actions]
    last_write = max(i for i, (name, _) in enumerate(gold) if name in imported.write_tools)
    cases = {
        "gold": (write, gold, True, 1.0),
        "dropped_write": (write, gold[:last_write] + gold[last_write + 1 :], True, 0.0),
        "nothing_asked": (tasks[NOTHING], [], True, 1.0),
        "cut_before_a_stop": (write, gold, False, 0.0),
    }
    from lake.catalog import open_gateway

    async def go() -> dict[str, tuple[float, float, str]]:
        gateway = open_gateway(settings)
        out = {}
        try:
            async with tau2_pool(settings.sandbox, DOMAIN) as pool:  # as `arena eval --bench tau2`'s
                rollouts = {}
                for name, (task, calls, stop, _) in cases.items():
                    sample = tau2_sample(imported, task, _opening(task), origin=name)
                    databases = load_spec_databases(store, Tau2EnvSpec.model_validate(sample.reward_spec))
                    env = environment_for(
                        sample, pool, user=GatewayUserSimulator(gateway), tau2_databases=databases
                    )
                    assert isinstance(env, Tau2Environment)
                    await _dialogue(env, calls, stop=stop, say=" ".join(task.verification.communicate_info))
                    reward, parts = await env.reward(None)  # type: ignore[arg-type]  # it reads its own log
                    assert parts["pass"] == reward
                    rollouts[name] = (reward, env.rollout())
                    await env.close()
                # tau2's evaluator replays each trajectory in fresh environments: one session for all
                async with Tau2Session(pool, DOMAIN, *databases) as session:
                    for name, (reward, rollout) in rollouts.items():
                        out[name] = (reward, await rescore(session, rollout), rollout.termination)
        finally:
            await gateway.aclose()
        return out

    scored = asyncio.run(go())
    for name, (_, _, _, expected) in cases.items():
        ours, theirs, termination = scored[name]
        assert ours == theirs == expected, (name, scored[name])
        assert (termination == "max_steps") == (name == "cut_before_a_stop"), (name, termination)


@pytest.fixture(scope="module")
def tiny(home: tuple[ArenaSettings, Tau2Import], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny policy whose tokenizer learned the domain's prompts (so they stay a few thousand tokens)."""
    from environments.render import render_text
    from trainer.tiny import build_tiny

    settings, imported = home
    tasks = list(_tasks(open_store(settings), imported).values())[:4]
    texts = [
        render_text(tau2_sample(imported, t, _opening(t), origin="tok").prompt, imported.agent_tools)
        for t in tasks
    ]
    return build_tiny(tmp_path_factory.mktemp("tiny"), texts, seed=0, vocab_size=1024)


def test_a_grpo_step_runs_on_tau2_samples_and_tau2_rescores_every_rollout(
    home: tuple[ArenaSettings, Tau2Import], tiny: Path
) -> None:
    """The trainer's ``Episodes`` rolls tau2 samples out with the tiny policy (G = 2), a GRPO step
    updates on the groups, and `arena reward tau2` on the recorded lines agrees with every reward."""
    from arena.config import TrainSettings
    from trainer.episodes import Episodes
    from trainer.learner import Learner
    from trainer.policy import HfBackend, load_policy, stop_ids_of
    from trainer.rollout_log import save_rollouts

    settings, imported = home
    store = open_store(settings)
    tasks = _tasks(store, imported)
    write = _with_write(tasks, set(imported.write_tools))
    samples = [
        tau2_sample(imported, task, _opening(task), origin=f"grpo-{task.task_id}")
        for task in (tasks[NOTHING], write)
    ]
    model, tokenizer = load_policy(str(tiny))
    backend = HfBackend(model, tokenizer, stop_ids=stop_ids_of(tokenizer))
    train = TrainSettings.model_validate(
        {"group_size": 2, "max_turns": 4, "max_new_tokens": 12, "max_seq_len": 16384, "micro_batch": 2}
    )
    run_settings = settings.model_copy(update={"train": train})
    learner = Learner(model, tokenizer, train, backend)
    learner.new_optimizer("grpo")

    async def go() -> tuple[list[object], dict[str, str], list[dict[str, object]]]:
        episodes = Episodes(run_settings, learner)
        await episodes.start()
        try:
            groups, skipped = await episodes.groups(samples, step=1, round_=1)
            return list(groups), skipped, episodes.take_recorded()
        finally:
            await episodes.close()

    groups, skipped, lines = asyncio.run(go())
    assert not skipped and len(groups) == 2
    assert [len(g.rewards) for g in groups] == [2, 2]  # type: ignore[attr-defined]
    update = learner.grpo_step(groups)  # type: ignore[arg-type]
    assert update and all(math.isfinite(v) for v in update.values()), update
    assert len(lines) == 4 and {line["kind"] for line in lines} == {"tau2"}
    rewards = sorted(float(line["reward"]) for line in lines)  # type: ignore[arg-type]
    assert rewards == sorted(r for g in groups for r in g.rewards)  # type: ignore[attr-defined]
    for line in lines:
        rollout = Tau2Rollout.model_validate(line["tau2"])
        assert rollout.reward == line["reward"] and rollout.sample_id in {s.sample_id for s in samples}

    # The recorded step, rescored by tau2's evaluator through the CLI, on the lake's databases.
    from tests.cli import arena_env, run_arena

    path = save_rollouts(store, "trainer/tau2-test", 1, lines)
    env = arena_env(Path(settings.home), ARENA_SANDBOX__POOL_SIZE="1")
    out = run_arena(["reward", "tau2", str(Path(store.local_path(path)))], env, timeout=600)  # type: ignore[attr-defined]
    rescored = [json.loads(x) for x in out.stdout.splitlines()]
    assert [r["line"] for r in rescored] == [1, 2, 3, 4]
    assert all(r["agree"] for r in rescored), rescored
    assert [r["tau2"] for r in rescored] == [line["reward"] for line in lines]
    assert "4 of 4 tau2 rollouts" in out.stderr


def test_eval_bench_tau2_rolls_a_local_checkpoint_out_on_the_test_split(
    home: tuple[ArenaSettings, Tau2Import], tiny: Path
) -> None:
    """`arena eval --bench tau2 --model FOLDER`: the checkpoint is rolled out in the training
    environment on test tasks, tau2's evaluator rescores every trial (a disagreement would be an
    error), and the report has the split, the user and the do-nothing floor."""
    from tests.cli import arena_env, run_arena

    settings, _ = home
    env = arena_env(
        Path(settings.home),
        ARENA_SANDBOX__POOL_SIZE="2",
        ARENA_TRAIN__MAX_TURNS="3",
        ARENA_TRAIN__MAX_NEW_TOKENS="12",
        ARENA_TRAIN__MAX_SEQ_LEN="16384",
    )
    twin = Path(settings.home) / "tiny-twin"  # the same weights in another folder
    if not twin.exists():
        shutil.copytree(tiny, twin)
    args = ["eval", "--bench", "tau2", "--domain", DOMAIN, "--model", str(tiny), "--model", str(twin)]
    out = run_arena([*args, "--limit", "1", "--k", "1", "--trials", "2", "--json"], env, timeout=900)
    report, again = json.loads(out.stdout)
    # Several checkpoints share the tasks, the user's openings and the seeds: the same weights score
    # the same, trial by trial.
    assert again["model"] == str(twin)
    assert [(t["task_id"], t["rewards"]) for t in again["tasks"]] == [
        (t["task_id"], t["rewards"]) for t in report["tasks"]
    ]
    assert (
        report["split"] == "test" and report["user_simulator"] == "gateway" and report["model"] == str(tiny)
    )
    assert len(report["tasks"]) == 1 and report["left_out"].get("limit", 0) > 0
    imported_test = {t.task_id for t in load_tasks(open_store(settings), home[1]) if t.split == "test"}
    assert {t["task_id"] for t in report["tasks"]} <= imported_test
    assert all(len(t["rewards"]) == 2 and not t["errors"] for t in report["tasks"]), report["tasks"]
    assert {g["group"] for g in report["groups"]} == {DOMAIN}
    bad = run_arena(
        ["eval", "--bench", "tau2", "--domain", DOMAIN, "--model", str(tiny / "nope")], env, check=2
    )
    assert "checkpoint folder" in bad.stderr and "Traceback" not in bad.stderr
    endpoints = ["--model", "openai://127.0.0.1:9/v1?model=a", "--model", "openai://127.0.0.1:9/v1?model=b"]
    twice = run_arena(["eval", "--bench", "tau2", "--domain", DOMAIN, *endpoints], env, check=2)
    assert "several models go with --bench tau2 and local checkpoint folders" in twice.stderr
    plain = run_arena(["eval", "--model", str(tiny), "--model", str(twin)], env, check=2)
    assert "--model more than once goes with --bench tau2" in plain.stderr


@pytest.mark.parametrize(
    ("domain", "k", "trials", "needle"),
    [("nope", 1, 1, "tau2 domains are airline"), ("airline", 4, 2, "trials (2) < k (4)")],
)
def test_checkpoints_on_a_plan_that_cannot_run_are_refused_before_any_sandbox(
    tmp_path: Path, domain: str, k: int, trials: int, needle: str
) -> None:
    from trainer.benchmarks.tau2 import Tau2BenchError, run_tau2_checkpoints

    settings = ArenaSettings(home=tmp_path / "home")
    with pytest.raises(Tau2BenchError, match=re.escape(needle)):
        run_tau2_checkpoints(
            settings, ["a", "b"], domain=domain, k=k, trials=trials, limit=1, concurrency=1, seed=0
        )
    assert not (tmp_path / "home").exists()  # nothing was started or written

"""The EigenData loop on a tau2 domain: synthesise, SFT, GRPO, then tau2's test split (CPU, tiny policy).

Usage::

    python bench/tau2_loop.py [--domain airline|retail|telecom]   # the full CPU profile
    python bench/tau2_loop.py --quick                              # a smoke run of a few minutes
    python bench/tau2_loop.py --policy smollm2                     # a pretrained base (GPU profile)

Prints ONE JSON object on stdout; progress goes to stderr. On a private ``ARENA_HOME`` (a temporary
folder, or ``--home``), with the ``rules`` backend playing the LLM roles (``ARENA_LLM`` picks
another):

1. ``build_import``: the domain's database and tasks into the lake (``arena domain import tau2 D``).
2. ``synthesise_domain``: EigenData dialogues on the train split's first ``synth_limit`` tasks and
   ``new`` new instances over the database (retail, airline; ``arena domain synth tau2 D --new N``):
   the verified dialogues' agent and user sides (``samples.sft``) and their tasks as ``tau2``
   environments (``samples.verified``), exactly what the CLI publishes.
3. The base checkpoint: a tiny Llama (``trainer.tiny.build_tiny``), its tokenizer trained on
   those conversations and prompts; or, with ``--policy``, a pretrained model (a Hugging Face
   folder, a ``.gguf`` file or the bundled ``smollm2``, ``trainer.pretrained``).
4. SFT on the agent and user sides (the trainer's ``Learner``: token-mean NLL, AdamW, cosine
   schedule), saved; then GRPO on the tau2 environments (``trainer.episodes.Episodes``: G rollouts
   per environment in the sandbox with Arena's simulated user, the task's verification as reward;
   ``Learner.grpo_step``), saved. The service's update path, in process (no broker), so the bench
   measures the data and the update, not the streaming.
5. ``arena eval --bench tau2 --model FOLDER`` of each checkpoint (``run_tau2_checkpoints``: one
   sandbox pool and one set of user openings for all three) on the first ``eval_limit`` tasks of
   tau2's test split, ``trials`` trials each: pass^1..k per task (every
   trial rescored by tau2's evaluator; a disagreement is an error), and the do-nothing agent's
   reward per task. Each figure is the mean over tasks with a 95% percentile bootstrap interval.

The GPU profile is ``--policy smollm2`` (or a bigger folder) with ``ARENA_TRAIN__DEVICE=cuda``
(``ARENA_TRAIN__BACKEND=vllm`` for vLLM rollouts where installed); it has not been run here (no GPU).
A tiny policy trained on CPU scores at or below the do-nothing floor (a dialogue the policy does not
end by a stop scores 0, while the do-nothing agent stops at once and passes every task that asks
for nothing); ``above_floor`` gives each checkpoint's pass^1 minus the floor's rather than
claiming progress.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]


@dataclass(frozen=True)
class Profile:
    synth_limit: int
    """Train tasks synthesised on."""
    new: int
    """New instances over the database (retail, airline)."""
    sft_steps: int
    sft_batch: int
    sft_lr: float
    grpo_steps: int
    grpo_envs: int
    """Environments per GRPO step."""
    group_size: int
    grpo_lr: float
    eval_limit: int
    k: int
    trials: int
    max_turns: int
    max_new_tokens: int


FULL = Profile(
    synth_limit=12,
    new=8,
    sft_steps=16,
    sft_batch=4,
    sft_lr=5e-3,
    grpo_steps=4,
    grpo_envs=2,
    group_size=4,
    grpo_lr=1e-4,
    eval_limit=10,
    k=4,
    trials=4,
    max_turns=6,
    max_new_tokens=48,
)
QUICK = Profile(
    synth_limit=1,
    new=0,
    sft_steps=1,
    sft_batch=2,
    sft_lr=5e-3,
    grpo_steps=1,
    grpo_envs=1,
    group_size=2,
    grpo_lr=1e-4,
    eval_limit=1,
    k=2,
    trials=2,
    max_turns=3,
    max_new_tokens=12,
)


def log(message: str) -> None:
    print(f"[tau2_loop] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def arena_home(home: Path | None) -> Iterator[Path]:
    if home is not None:
        home.mkdir(parents=True, exist_ok=True)
        yield home
        return
    with tempfile.TemporaryDirectory(prefix="arena-tau2-loop-") as tmp:
        yield Path(tmp)


def figures(tasks: list[dict[str, Any]], k: int, seed: int) -> dict[str, Any]:
    """Mean pass^1..k over tasks, each with its 95% bootstrap interval, from a report's tasks."""
    import numpy as np

    from trainer.evaluate import bootstrap_ci, pass_hat_k

    rng = np.random.default_rng(seed)
    out: dict[str, Any] = {"tasks": len(tasks)}
    for j in range(1, k + 1):
        per_task = [pass_hat_k(len(t["rewards"]), sum(r >= 1.0 for r in t["rewards"]), j) for t in tasks]
        out[f"pass^{j}"] = bootstrap_ci(per_task, rng).model_dump()
    out["errors"] = sum(len(t["errors"]) for t in tasks)
    return out


def floor_figures(tasks: list[dict[str, Any]], k: int, seed: int) -> dict[str, Any]:
    """The do-nothing agent is deterministic: its pass^j is its pass^1 for every j."""
    import numpy as np

    from trainer.evaluate import bootstrap_ci

    rng = np.random.default_rng(seed)
    metric = bootstrap_ci([float(t["baseline_reward"] >= 1.0) for t in tasks], rng).model_dump()
    return {"tasks": len(tasks), **{f"pass^{j}": metric for j in range(1, k + 1)}}


def decontaminate(
    samples: list[Any], envs: list[Any], domain: str
) -> tuple[list[Any], list[Any], dict[str, Any]]:
    """The samples and environments the trainer's screen (``trainer.decontam``) would keep, against
    the domain's test split: tau2's own train tasks can near-duplicate its test tasks, and a
    dialogue on one must not train a policy scored on the other."""
    from environments.tau2_env import tau2_data_dir
    from trainer.decontam import BenchmarkIndex, Screen, tau2_items

    items = tau2_items(tau2_data_dir(), [domain])
    screen = Screen(BenchmarkIndex(items=items))
    dropped: dict[str, str] = {}
    kept: dict[str, list[Any]] = {"samples.sft": [], "samples.verified": []}
    for topic, records in (("samples.sft", samples), ("samples.verified", envs)):
        for record in records:
            found = screen(topic, record)
            if found is None:
                kept[topic].append(record)
            else:
                dropped[record.sample_id] = found["subject"]
    report = {
        "test_items": len(items),
        "threshold": screen.tests.index.threshold,
        "cosine": screen.tests.index.cosine,
        "sft_dropped": len(samples) - len(kept["samples.sft"]),
        "environments_dropped": len(envs) - len(kept["samples.verified"]),
        "near_duplicates": dropped,
    }
    return kept["samples.sft"], kept["samples.verified"], report


async def synthesise(settings: Any, domain: str, p: Profile) -> tuple[list[Any], list[Any], Any]:
    from environments.tau2_env import tau2_pool
    from environments.tau2_import import build_import, load_import
    from lake.catalog import open_gateway
    from lake.store import open_store
    from producers.tau2_synthesis import synthesise_domain
    from synthesis.eigen.tau2_instances import INSTANCE_DOMAINS

    store = open_store(settings)
    gateway = open_gateway(settings)
    try:
        async with tau2_pool(settings.sandbox, domain) as pool:
            imported = load_import(store, domain) or await build_import(store, pool, domain)
            report, sft, envs = await synthesise_domain(
                store,
                pool,
                gateway,
                imported,
                limit=p.synth_limit,
                new=p.new if domain in INSTANCE_DOMAINS else 0,
                sessions=2,
            )
    finally:
        await gateway.aclose()
    return sft, envs, report


def sft(learner: Any, samples: list[Any], p: Profile, max_len: int) -> list[float]:
    """``sft_steps`` steps over the samples (cycled, seeded order); the loss of each step."""
    import random

    from trainer.sft import sft_example

    rng = random.Random(0)
    order = list(samples)
    losses: list[float] = []
    learner.new_optimizer("sft")
    for step in range(p.sft_steps):
        if step * p.sft_batch % len(order) == 0:
            rng.shuffle(order)
        start = step * p.sft_batch % len(order)
        batch = (order + order)[start : start + p.sft_batch]
        examples = [sft_example(learner.tokenizer, s, max_len) for s in batch]
        loss, _ = learner.sft_backward(examples)
        learner.optimizer_step()
        losses.append(round(float(loss), 4))
        log(f"sft step {step + 1}/{p.sft_steps}: loss {loss:.3f}")
    return losses


async def grpo(settings: Any, learner: Any, envs: list[Any], p: Profile) -> list[dict[str, Any]]:
    """``grpo_steps`` steps, each over ``grpo_envs`` tau2 environments (cycled); what each step saw."""
    from trainer.episodes import Episodes

    learner.new_optimizer("grpo")
    episodes = Episodes(settings, learner)
    await episodes.start()
    rows: list[dict[str, Any]] = []
    try:
        for step in range(1, p.grpo_steps + 1):
            start = (step - 1) * p.grpo_envs % len(envs)
            batch = (envs + envs)[start : start + min(p.grpo_envs, len(envs))]
            groups, skipped = await episodes.groups(batch, step=step, round_=1)
            update = await asyncio.to_thread(learner.grpo_step, groups) if groups else {}
            rewards = [r for g in groups for r in g.rewards]
            rows.append(
                {
                    "step": step,
                    "groups": len(groups),
                    "skipped": len(skipped),
                    "mean_reward": round(statistics.fmean(rewards), 4) if rewards else None,
                    "loss": update.get("loss"),
                }
            )
            episodes.take_recorded()
            log(f"grpo step {step}/{p.grpo_steps}: mean reward {rows[-1]['mean_reward']}")
    finally:
        await episodes.close()
    return rows


def save(learner: Any, folder: Path) -> Path:
    learner.model.save_pretrained(folder)
    learner.tokenizer.save_pretrained(folder)
    return folder


def evaluate(settings: Any, folders: dict[str, Path], domain: str, p: Profile, seed: int) -> dict[str, Any]:
    """Each checkpoint on the same test tasks and openings, one sandbox pool for all."""
    from trainer.benchmarks.tau2 import run_tau2_checkpoints

    log(f"eval {', '.join(folders)} on the test split ({p.eval_limit} tasks, {p.trials} trials)")
    reports = run_tau2_checkpoints(
        settings,
        [str(f) for f in folders.values()],
        domain=domain,
        k=p.k,
        trials=p.trials,
        limit=p.eval_limit,
        concurrency=2,
        seed=seed,
        split="test",
    )
    return {name: r.model_dump(mode="json") for name, r in zip(folders, reports, strict=True)}


def base_model(home: Path, policy: str, texts: list[str], seed: int) -> Path:
    """The base checkpoint: the tiny policy built on ``texts``, or the pretrained ``policy``."""
    if policy != "tiny":
        from trainer.pretrained import hf_folder

        return hf_folder(policy, home)
    from trainer.tiny import build_tiny

    return build_tiny(home / "models" / "base", texts, seed=seed, vocab_size=2048)


def run(domain: str, p: Profile, home: Path, seed: int, policy: str = "tiny") -> dict[str, Any]:
    from arena.config import ArenaSettings
    from environments.render import render_text
    from trainer.learner import Learner
    from trainer.policy import HfBackend, load_policy, resolve_device, stop_ids_of

    start = time.monotonic()
    max_seq_len = 16384  # tau2's policy and tools alone are thousands of tiny-tokenizer tokens
    settings = ArenaSettings.model_validate(
        {
            "home": str(home),
            "sandbox": {"pool_size": 2, "timeout_s": 120.0},
            "train": {
                "group_size": p.group_size,
                "max_turns": p.max_turns,
                "max_new_tokens": p.max_new_tokens,
                "max_seq_len": max_seq_len,
                "micro_batch": 2,
                "lr": p.grpo_lr,
                "sft_lr": p.sft_lr,
                "sft_steps": p.sft_steps,
                "temperature": 1.0,
            },
        }
    )
    from synthesis.eigen.tau2_instances import INSTANCE_DOMAINS

    new = f"new instances {p.new}" if domain in INSTANCE_DOMAINS else "no new-instance pool for this domain"
    log(f"import and synthesis on {domain} (train tasks {p.synth_limit}, {new})")
    samples, envs, report = asyncio.run(synthesise(settings, domain, p))
    synthesis = {
        "verified": report.verified,
        "verified_do_nothing": report.verified_do_nothing,
        "new_instances": report.new_instances,
        "new_verified": report.new_verified,
        "sft_samples": len(samples),
        "environments": len(envs),
        "by_stage": report.by_stage,
        "agreement": report.agreement,
    }
    samples, envs, screened = decontaminate(samples, envs, domain)
    if screened["sft_dropped"] or screened["environments_dropped"]:
        log(
            f"decontamination against the test split left out {screened['sft_dropped']} sample(s) and "
            f"{screened['environments_dropped']} environment(s)"
        )
    if not samples or not envs:
        raise SystemExit(
            f"nothing to train on in {domain}: verified {report.by_stage}; decontamination against the "
            f"test split left out {screened['sft_dropped']} SFT sample(s) and "
            f"{screened['environments_dropped']} environment(s) as near-duplicates of test tasks "
            f"({screened['near_duplicates']})"
        )
    texts = [render_text(s.messages, s.tools, s.role_target) for s in samples]
    texts += [render_text(e.prompt, e.tools) for e in envs]
    base = base_model(home, policy, texts, seed)
    model, tokenizer = load_policy(str(base), resolve_device(settings.train.device))
    model.train()
    learner = Learner(model, tokenizer, settings.train, HfBackend(model, tokenizer, stop_ids_of(tokenizer)))
    sft_losses = sft(learner, samples, p, max_seq_len)
    sft_folder = save(learner, home / "models" / "sft")
    grpo_rows = asyncio.run(grpo(settings, learner, envs, p))
    grpo_folder = save(learner, home / "models" / "sft-grpo")
    evals = evaluate(settings, {"base": base, "sft": sft_folder, "sft_grpo": grpo_folder}, domain, p, seed)
    tasks = {name: found["tasks"] for name, found in evals.items()}
    scores = {name: figures(tasks[name], p.k, seed) for name in tasks}
    scores["do_nothing"] = floor_figures(tasks["base"], p.k, seed)
    floor = scores["do_nothing"]["pass^1"]["mean"]
    return {
        "bench": "tau2_loop",
        "quick": p == QUICK,
        "domain": domain,
        "policy": policy,
        "profile": p.__dict__,
        "synthesis": synthesis,
        "decontam": screened,
        "sft": {"steps": len(sft_losses), "loss_first": sft_losses[0], "loss_last": sft_losses[-1]},
        "grpo": grpo_rows,
        "eval": {
            "split": "test",
            "user_simulator": evals["base"]["user_simulator"],
            "left_out": evals["base"]["left_out"],
            "k": p.k,
            "trials": p.trials,
            "ci_method": "95% percentile bootstrap over tasks (2000 resamples, seeded)",
        },
        "scores": scores,
        "above_floor": {
            n: round(scores[n]["pass^1"]["mean"] - floor, 4) for n in ("base", "sft", "sft_grpo")
        },
        "wall_s": round(time.monotonic() - start, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--domain", default="airline", choices=("airline", "retail", "telecom"))
    parser.add_argument("--quick", action="store_true", help="A smoke run of a few minutes.")
    parser.add_argument("--home", type=Path, default=None, help="Keep the run's ARENA_HOME here.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--policy",
        default="tiny",
        help="The base: 'tiny' (built here), or a pretrained model (a folder, a .gguf file, 'smollm2').",
    )
    args = parser.parse_args(argv)
    from environments.tau2_env import Tau2Unavailable, tau2_site_dirs

    try:
        tau2_site_dirs()
    except Tau2Unavailable as exc:
        print(json.dumps({"bench": "tau2_loop", "quick": args.quick, "skipped": str(exc)}))
        return 0
    with arena_home(args.home) as home:
        result = run(args.domain, QUICK if args.quick else FULL, home, args.seed, args.policy)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

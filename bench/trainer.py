"""Trainer benchmark: seconds per GRPO step (rollout / reward / update) against TRL's GRPOTrainer.

Over 800 lines on purpose: both sides of the comparison (Arena's step and the TRL baseline on the
same model, prompts and rewards) must live in one script so that they run in one process and one
run; most of the length is the set-up they share and the methodology documented here.

Usage::

    python bench/trainer.py [--prompts P] [--group G] [--steps N] [--warmup W] [--max-new-tokens T]
                            [--max-turns K] [--sft-steps S] [--mixing bands|none|random] [--seed S]
                            [--quick]

Prints ONE JSON object on stdout; progress and logs go to stderr. Needs root (the sandbox) and
TRL (``pip install -e '.[bench]'``). CPU only; torch runs on ``--threads`` threads on both sides.

Set-up (not timed, shared by both sides):

- Packages: the environment track on the ``rules`` backend (handlers in-process, as
  ``bench/env_track.py``): the demo seeds -> QA traces -> validation -> environment code ->
  verification in the sandbox. The first P verified packages by ``env_id`` are the prompts; each
  one's ``qa`` sample is ``streams.envs.samples_verified.sample_of``. All verified packages go in a
  SQLite catalog (train split), so the tool mixer has a pool.
- Model: ``trainer.tiny.build_tiny`` (seeded) with a tokenizer trained on the prompts, then a short
  SFT warm start (``--sft-steps``) on one reference trajectory per prompt (the jobs' calls run in the
  sandbox, then the answer), so the policy emits tool calls and Arena's rollouts really go
  multi-turn. Both sides load the same saved weights and tokenizer.

``arena``
    The service's own GRPO path: ``trainer.episodes.Episodes.groups`` (per sample: its package from
    the catalog, tools mixed in per ``--mixing``, G rollouts each in fresh ``QaEnvironment``
    instances on the warm ``SandboxPool``, all P x G of a round in one lockstep batch of
    ``trainer.rollout.rollout_batch``: one batched HF generate per turn, then log-probs; F1 reward
    from the environment), then ``trainer.learner.Learner.grpo_step`` (group advantages,
    clipped token-mean loss, AdamW step, weight sync). One step = one rollout round of P prompts x G
    and one update on all P groups: adaptive batch filling is left out (TRL has none), so groups with
    equal rewards are trained too (they contribute zero gradient, but the forward/backward runs).
    rollout = wall time of ``Episodes.groups`` minus the time spent in ``env.reward``; reward = the
    time spent in ``env.reward`` (measured by a timing proxy around each environment, installed by
    swapping ``trainer.episodes.environment_for``; the QA reward never awaits, so its time is all on
    the critical path and the subtraction is exact); update = wall time of ``grpo_step``.

``trl``
    ``trl.GRPOTrainer`` + ``GRPOConfig`` on the same weights, tokenizer and P prompts (plain-text
    prompts: the exact text Arena renders, system prompt and offered tools included, plus the
    generation header), same G, max completion length = Arena's per-turn ``--max-new-tokens``,
    temperature 1 with no top-k/top-p, no KL (beta 0), clip 0.2, DAPO loss (token mean over the
    batch, Arena's default), group std scaling, constant learning rate, AdamW, grad clip 1.0, fp32,
    no gradient checkpointing, one optimizer step per generation batch of P x G completions, CPU.
    TRL's default GRPOTrainer is single-turn: a completion is one assistant turn and no tool runs.
    Its reward function is the same F1 (``environments.rewards.f1_reward``) with the completion text
    standing in for the tool outputs and c = the completion's emitted ``<tool_call>`` blocks (at
    least 1). Timing by a ``TrainerCallback`` (``on_step_begin`` -> ``on_step_end``: generation,
    reward, loss, backward, optimizer step); rollout = ``_generate_and_score_completions`` minus
    ``_calculate_rewards``, reward = ``_calculate_rewards``, update = the rest of the step.

``trl_tools``
    TRL's own multi-turn tool path, ``GRPOTrainer(environment_factory=...)`` (TRL >= 1.16), on the
    same work as Arena: the same chat messages, and per prompt an environment class whose methods
    are the tools Arena offers that prompt (``bench/trl_tools.py``: schemas rebuilt from the tools'
    JSON schemas; each call runs in a fresh ``QaEnvironment`` on a sandbox pool of Arena's size;
    ``get_reward`` is Arena's F1 over the calls' results). At most ``--max-new-tokens`` per turn
    (``generation_kwargs``), ``--max-turns`` assistant turns (``max_tool_calling_iterations`` =
    turns - 1) and Arena's sequence budget (``max_completion_length`` = ``--max-seq-len`` minus the
    longest prompt); otherwise the same config as ``trl``. The tiny model's layout is Qwen's, so
    TRL parses replies with its Qwen3 response template. Timing as for ``trl``.

The first ``--warmup`` steps of each side are run and left out of the figures. ratio = arena / trl
(for seconds per step: above 1 means Arena is slower; for rollouts/s: above 1 means Arena is faster).
"""

from __future__ import annotations

import os

# Thread settings before torch loads; no hub access (everything is local).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import logging
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)
TRL_MISSING = "TRL is missing (fix: .venv/bin/pip install -c constraints.txt -e '.[dev,bench]')"


class BenchError(RuntimeError):
    """The benchmark could not produce a trustworthy number."""


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description:>18}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


# -- set-up: packages, prompts, model -----------------------------------------------------------


def _package_plan() -> tuple[tuple[Any, str], ...]:
    from streams.envs import envs_code, envs_verified, qa_traces, qa_validated

    return (
        (qa_traces.STAGE, "qa.traces"),
        (qa_validated.STAGE, "qa.validated"),
        (envs_code.STAGE, "envs.code"),
        (envs_verified.STAGE, "envs.verified"),
    )


async def build_packages(needed: int, seed: int, home: Path) -> tuple[list[Any], dict[str, Any]]:
    """Run the environment track (rules backend, in-process) until it verifies ``needed`` packages."""
    from app.demo import demo_seeds
    from arena.config import ArenaSettings
    from bench.sft_stages import outputs, run_stage
    from streams import resources

    instances = max(2, -(-needed // 2))
    started = time.perf_counter()
    for attempt in range(4):
        settings = ArenaSettings(
            home=home / f"envs-{attempt}", llm="rules", seed=seed, envs={"demo_instances": instances}
        )
        current: list[tuple[str, Any]] = [(s.seed_id, s) for s in demo_seeds(settings)]
        seeds = len(current)
        try:
            for stage, produces in _package_plan():
                emits, _wall = await run_stage(stage, current, settings)
                current = outputs(emits, produces)
        finally:
            await resources.close_sandbox_pool(settings)
        packages = sorted((p for _k, p in current), key=lambda p: p.env_id)
        if len(packages) >= needed:
            info = {
                "source": "environment track on the rules backend (demo seeds, handlers in-process)",
                "seeds": seeds,
                "instances_per_seed": instances,
                "verified_packages": len(packages),
                "domains": dict(Counter(p.domain for p in packages)),
                "seconds": round(time.perf_counter() - started, 2),
            }
            return packages, info
        instances *= 2
    raise BenchError(f"the environment track verified only {len(packages)} packages, {needed} needed")


async def reference_conversations(
    samples: Sequence[Any],
    packages: Sequence[Any],
    tools: Sequence[list[dict[str, Any]]],
    extras: Sequence[dict[str, Any]],
    pool: Any,
) -> list[list[dict[str, Any]]]:
    """Per sample: the prompt, one assistant tool call per job (run in the sandbox), the answer."""
    from environments.environment import QaEnvironment
    from trainer.reference import ReferenceCallFailed, reference_conversation

    conversations = []
    for sample, package, offered, extra in zip(samples, packages, tools, extras, strict=True):
        env = QaEnvironment(sample, package, pool, extra, tools=offered)
        try:
            messages, _outputs = await reference_conversation(sample, package, env)
        except ReferenceCallFailed as exc:
            raise BenchError(str(exc)) from exc
        finally:
            await env.close()  # its sandbox session goes back to the pool
        conversations.append(messages)
    return conversations


def build_policy(
    folder: Path,
    conversations: Sequence[list[dict[str, Any]]],
    tools: Sequence[list[dict[str, Any]]],
    *,
    seed: int,
    sft_steps: int,
    sft_lr: float,
    target_loss: float,
    hidden_size: int = 64,
    heads: int = 4,
) -> dict[str, Any]:
    """build_tiny (seeded) + an SFT warm start on the reference conversations; saved under ``folder``."""
    import torch
    from torch.optim import AdamW

    from environments.render import render, render_text
    from trainer.policy import load_policy
    from trainer.sft import SftExample, sft_loss_backward
    from trainer.tiny import build_tiny

    texts = [render_text(c, t) for c, t in zip(conversations, tools, strict=True)]
    base = build_tiny(folder.parent / "base", texts, seed=seed, hidden_size=hidden_size, heads=heads)
    model, tokenizer = load_policy(base)
    examples = []
    for i, (conv, offered) in enumerate(zip(conversations, tools, strict=True)):
        rendered = render(tokenizer, conv, offered, "agent")
        examples.append(
            SftExample(sample_id=f"ref-{i}", input_ids=rendered.input_ids, loss_mask=rendered.loss_mask)
        )
    pad_id = int(tokenizer.pad_token_id)
    started = time.perf_counter()
    losses: list[float] = []
    if sft_steps:
        torch.manual_seed(seed)
        model.train()
        optimizer = AdamW(model.parameters(), lr=sft_lr, weight_decay=0.0)
        with _progress() as progress:
            task = progress.add_task("SFT warm start", total=sft_steps)
            for _ in range(sft_steps):
                loss, _tokens = sft_loss_backward(model, examples, pad_id, micro=len(examples))
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                losses.append(loss)
                progress.advance(task)
                if loss < target_loss:
                    break
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {
        "builder": f"trainer.tiny.build_tiny (vocab 1024, hidden {hidden_size}, {heads} heads, 2 layers; "
        "tokenizer trained on the reference conversations)",
        "parameters": sum(p.numel() for p in model.parameters()),
        "sft_warm_start_steps": len(losses),
        "sft_max_steps": sft_steps,
        "sft_target_loss": target_loss,
        "sft_lr": sft_lr,
        "sft_loss_first": round(losses[0], 4) if losses else None,
        "sft_loss_last": round(losses[-1], 4) if losses else None,
        "sft_seconds": round(time.perf_counter() - started, 2),
    }


# -- Arena ------------------------------------------------------------------------------------------


@dataclass
class Clock:
    """Time and counts accumulated by the timing proxies during one step."""

    generate_s: float = 0.0
    generate_calls: int = 0
    tool_s: float = 0.0
    tool_calls: int = 0
    reward_s: float = 0.0
    rewards: int = 0

    def reset(self) -> Clock:
        snapshot = Clock(**vars(self))
        for name in vars(self):
            setattr(self, name, type(getattr(self, name))())
        return snapshot


class TimedBackend:
    """The learner's rollout backend, with its ``generate`` calls timed (they run one at a time)."""

    def __init__(self, backend: Any, clock: Clock) -> None:
        self.backend = backend
        self.clock = clock

    def generate(self, prompts: list[list[int]], **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = self.backend.generate(prompts, **kwargs)
        self.clock.generate_s += time.perf_counter() - started
        self.clock.generate_calls += 1
        return out

    def load_weights(self, model: Any) -> None:
        self.backend.load_weights(model)


class TimedEnv:
    """An environment instance with its tool calls and reward timed."""

    def __init__(self, env: Any, clock: Clock) -> None:
        self.env = env
        self.clock = clock
        self.tools = env.tools

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        started = time.perf_counter()
        try:
            return await self.env.call(name, arguments)
        finally:
            self.clock.tool_s += time.perf_counter() - started
            self.clock.tool_calls += 1

    async def user_turn(self, assistant_text: str) -> str | None:
        result: str | None = await self.env.user_turn(assistant_text)
        return result

    async def reward(self, trajectory: Any) -> tuple[float, dict[str, float]]:
        started = time.perf_counter()
        try:
            result: tuple[float, dict[str, float]] = await self.env.reward(trajectory)
            return result
        finally:
            self.clock.reward_s += time.perf_counter() - started
            self.clock.rewards += 1

    async def close(self) -> None:
        await self.env.close()


def arena_settings(args: argparse.Namespace, home: Path) -> Any:
    """The service's settings for this run: rollout and GRPO knobs from the command line."""
    from arena.config import ArenaSettings

    train = {
        "group_size": args.group,
        "batch_groups": args.prompts,
        "delta": -1.0,
        "mixing": args.mixing,
        "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens,
        "max_seq_len": args.max_seq_len,
        "temperature": 1.0,
        "lr": args.lr,
        "micro_batch": args.micro_batch or args.prompts * args.group,
    }
    settings = ArenaSettings(home=home / "arena", llm="rules", seed=args.seed, train=train)
    settings.home.mkdir(parents=True, exist_ok=True)
    return settings


def offered_tools(
    settings: Any, store: Any, samples: Sequence[Any]
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]]]:
    """Per sample: the tools its rollouts are offered and the packages of the mixed-in ones.

    The same mixer (pool, LanceDB, K, seed) and the same rule as ``Episodes`` (mixed-in tools only
    when their package is in the catalog), so the SFT warm start sees the rollouts' prompts;
    ``arena_phase`` checks that they match.
    """
    from arena.records.tools import tool_name
    from trainer.mixing import ToolMixer, pool_from_store

    cfg = settings.train
    if cfg.mixing == "none":
        return [list(s.tools) for s in samples], [{} for _ in samples]
    mixer = ToolMixer(pool_from_store(store), settings.lancedb, k_per_band=cfg.k_per_band, seed=settings.seed)
    tools, extras = [], []
    for sample in samples:
        mixed = mixer.mix(sample.tools, sample.domain, cfg.mixing, rng_key=sample.sample_id)
        found = {t.name: store.get(t.env_id) for t in mixed.mixed}
        extra = {name: row[0] for name, row in found.items() if row is not None}
        own = {tool_name(t) for t in sample.tools}
        tools.append([t for t in mixed.tools if tool_name(t) in extra or tool_name(t) in own])
        extras.append(extra)
    return tools, extras


async def arena_phase(
    args: argparse.Namespace,
    settings: Any,
    policy: Path,
    samples: Sequence[Any],
    tools: Sequence[list[dict[str, Any]]],
) -> tuple[dict[str, Any], list[str], list[int]]:
    """Warm-up + timed GRPO steps on Arena's path; returns the figures and the prompts' rendered text
    and token counts."""
    import trainer.episodes as episodes_module
    from environments.render import generation_header, render
    from trainer.episodes import Episodes
    from trainer.learner import Learner

    cfg = settings.train
    clock = Clock()
    learner = Learner.load(policy, cfg)
    learner.new_optimizer("grpo")
    learner.backend = TimedBackend(learner.backend, clock)
    episodes = Episodes(settings, learner)
    original = episodes_module.environment_for
    offered: dict[str, int] = {}  # sample id -> tools offered to its rollouts

    def timed_environment_for(sample: Any, *a: Any, **kw: Any) -> Any:
        env = original(sample, *a, **kw)
        offered[sample.sample_id] = len(env.tools)
        return TimedEnv(env, clock)

    episodes_module.environment_for = timed_environment_for
    rows: list[dict[str, Any]] = []
    prompt_texts: list[str] = []
    prompt_lengths: list[int] = []
    sft_prompts_match: list[bool] = []
    try:
        await episodes.start()
        total = args.warmup + args.steps
        with _progress() as progress:
            task = progress.add_task("arena GRPO steps", total=total)
            for step in range(1, total + 1):
                clock.reset()
                t0 = time.perf_counter()
                groups, skipped = await episodes.groups(list(samples), step=step, round_=1)
                t1 = time.perf_counter()
                if skipped or len(groups) != len(samples):
                    raise BenchError(f"arena skipped samples: {skipped}")
                metrics = learner.grpo_step(groups)
                t2 = time.perf_counter()
                spent = clock.reset()
                trajectories = [r for g in groups for r in g.rollouts]
                if spent.rewards != len(trajectories):
                    raise BenchError(
                        f"timed {spent.rewards} env.reward calls for {len(trajectories)} trajectories: the timing "
                        "proxy (trainer.episodes.environment_for) no longer sees every environment"
                    )
                if step == 1:  # the prompts exactly as the rollouts rendered them (mixed tools included)
                    first = {g.sample_id: g.rollouts[0]["prompt_ids"] for g in groups}
                    for sample, offered_list in zip(samples, tools, strict=True):
                        ids = first[sample.sample_id]
                        prompt_lengths.append(len(ids))
                        prompt_texts.append(learner.tokenizer.decode(ids, skip_special_tokens=False))
                        expected = render(learner.tokenizer, sample.prompt, offered_list).input_ids
                        sft_prompts_match.append(ids == expected + generation_header(learner.tokenizer))
                rows.append(
                    {
                        "step": step,
                        "warmup": step <= args.warmup,
                        "step_s": t2 - t0,
                        "rollout_s": (t1 - t0) - spent.reward_s,
                        "reward_s": spent.reward_s,
                        "update_s": t2 - t1,
                        "generate_s": spent.generate_s,
                        "generate_calls": spent.generate_calls,
                        "sandbox_tool_s_summed": spent.tool_s,
                        "tool_calls_executed": spent.tool_calls,
                        "rewards_computed": spent.rewards,
                        "trajectories": len(trajectories),
                        "generated_tokens": sum(sum(r["response_mask"]) for r in trajectories),
                        "response_tokens": sum(len(r["response_ids"]) for r in trajectories),
                        "turns": sum(r["turns"] for r in trajectories),
                        "tool_calls_emitted": sum(r["tool_calls"] for r in trajectories),
                        "reward_sum": sum(float(r["reward"]) for r in trajectories),
                        "stops": Counter(str(r["stop"]) for r in trajectories),
                        "loss": metrics.get("loss", 0.0),
                    }
                )
                progress.advance(task)
    finally:
        episodes_module.environment_for = original
        await episodes.close()
    timed = [r for r in rows if not r["warmup"]]
    n_traj = sum(r["trajectories"] for r in timed)
    step_s = _mean(r["step_s"] for r in timed)
    rollout_s = _mean(r["rollout_s"] for r in timed)
    stops: Counter[str] = Counter()
    for r in timed:
        stops.update(r["stops"])
    figures = {
        "steps_timed": len(timed),
        "rollouts_per_step": args.prompts * args.group,
        "step_s": _r(step_s),
        "rollout_s": _r(rollout_s),
        "reward_s": _r(_mean(r["reward_s"] for r in timed), 6),
        "update_s": _r(_mean(r["update_s"] for r in timed)),
        "rollouts_per_s": _r(args.prompts * args.group / step_s, 3),
        "rollouts_per_s_rollout_phase": _r(args.prompts * args.group / rollout_s, 3),
        "sft_warm_start_saw_these_prompts": all(sft_prompts_match),
        "inside_rollout": {
            "env_reward_calls": _r(_mean(r["rewards_computed"] for r in timed), 1),
            "generate_s": _r(_mean(r["generate_s"] for r in timed)),
            "generate_calls": _r(_mean(r["generate_calls"] for r in timed), 1),
            "sandbox_tool_s_summed": _r(_mean(r["sandbox_tool_s_summed"] for r in timed)),
            "tool_calls_executed": _r(_mean(r["tool_calls_executed"] for r in timed), 1),
            "note": "generate_s: summed time in backend.generate (prefill of uncached prefixes, "
            "sampling with the sampled tokens' log-probs), one call per turn of the lockstep batch; sandbox_tool_s_summed: summed latency of env.call, which "
            "overlaps other rollouts' generation; the rest of rollout_s is prompt rendering, parsing, "
            "the catalog look-up and tool mixing.",
        },
        "per_rollout": {
            "prompt_tokens_mean": _r(statistics.fmean(prompt_lengths), 1),
            "tools_offered_mean": _r(statistics.fmean(offered.values()), 2),
            "generated_tokens_mean": _r(sum(r["generated_tokens"] for r in timed) / n_traj, 1),
            "response_tokens_mean": _r(sum(r["response_tokens"] for r in timed) / n_traj, 1),
            "turns_mean": _r(sum(r["turns"] for r in timed) / n_traj, 2),
            "tool_calls_emitted_mean": _r(sum(r["tool_calls_emitted"] for r in timed) / n_traj, 2),
            "reward_mean": _r(sum(r["reward_sum"] for r in timed) / n_traj, 4),
            "stops": dict(sorted(stops.items())),
        },
        "generated_tokens_per_s": _r(sum(r["generated_tokens"] for r in timed) / (step_s * len(timed)), 1),
        "per_step": [_step_row(r) for r in rows],
    }
    return figures, prompt_texts, prompt_lengths


# -- TRL --------------------------------------------------------------------------------------------


@dataclass
class TrlClock:
    generate_and_score_s: float = 0.0
    rewards_s: float = 0.0
    reward_fn_s: float = 0.0
    generate_s: float = 0.0
    generate_calls: int = 0
    tool_calls: int = 0
    completion_tokens: int = 0
    completions: int = 0
    reward_sum: float = 0.0
    step_started: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    """The prompt ids TRL generated from in its first step (one row per rollout)."""
    environments: list[Any] = field(default_factory=list)
    """The tool environments TRL created (closed at the end)."""

    def start_step(self) -> None:
        for name in ("generate_and_score_s", "rewards_s", "reward_fn_s", "generate_s", "reward_sum"):
            setattr(self, name, 0.0)
        self.generate_calls = self.tool_calls = self.completion_tokens = self.completions = 0
        self.step_started = time.perf_counter()


def trl_reward(clock: TrlClock) -> Callable[..., list[float]]:
    """F1 (environments.rewards) with the completion text as the only observation; c = its call blocks (>= 1)."""
    from environments.render import parse_assistant
    from environments.rewards import ToolResult, f1_reward

    def f1(completions: list[str], jobs: list[str], **kwargs: Any) -> list[float]:
        started = time.perf_counter()
        out = []
        for text, job_json in zip(completions, jobs, strict=True):
            emitted = parse_assistant(text).emitted
            stand_ins = [ToolResult(name="completion", content=text)] * max(emitted, 1)  # one per call
            out.append(f1_reward(json.loads(job_json), stand_ins, max(emitted, 1)).f1)
        clock.reward_fn_s += time.perf_counter() - started
        clock.completions += len(completions)
        clock.reward_sum += sum(out)
        return out

    return f1


@dataclass
class TrlWork:
    """What one TRL run trains on: single-turn text prompts, or multi-turn tool environments."""

    dataset: Any
    reward_funcs: list[Any]
    environment_factory: dict[str, Any] | None = None
    config: dict[str, Any] = field(default_factory=dict)
    tool_schemas: dict[str, list[dict[str, Any]]] | None = None
    """Per environment, the JSON schemas its prompts show (Arena's own tool specs)."""


def trl_single_turn_work(
    args: argparse.Namespace, prompt_texts: Sequence[str], samples: Sequence[Any], clock: TrlClock
) -> TrlWork:
    """Arena's rendered prompt text (offered tools included) and one completion, F1 over its text."""
    from datasets import Dataset

    jobs = [json.dumps(s.reward_spec["jobs"]) for s in samples]
    rows = [{"prompt": p, "jobs": j} for p, j in zip(prompt_texts, jobs, strict=True)]
    return TrlWork(
        Dataset.from_list(rows), [trl_reward(clock)], config={"max_completion_length": args.max_new_tokens}
    )


def trl_tools_work(
    args: argparse.Namespace,
    samples: Sequence[Any],
    tools: Sequence[list[dict[str, Any]]],
    classes: dict[str, Any],
    prompt_lengths: Sequence[int],
) -> TrlWork:
    """Each prompt's chat messages and its environment class (``bench.trl_tools``); the reward is the
    environment's ``get_reward`` (Arena's F1). Per turn at most ``--max-new-tokens``, at most
    ``--max-turns`` assistant turns, and the same sequence budget as Arena (``--max-seq-len``)."""
    from datasets import Dataset

    rows = [{"prompt": s.prompt, "environment": name} for s, name in zip(samples, classes, strict=True)]
    config = {
        "max_completion_length": args.max_seq_len - max(prompt_lengths),
        "generation_kwargs": {"max_new_tokens": args.max_new_tokens},
        "max_tool_calling_iterations": args.max_turns - 1,
    }
    schemas = {name: list(offered) for name, offered in zip(classes, tools, strict=True)}
    return TrlWork(
        Dataset.from_list(rows), [], environment_factory=classes, config=config, tool_schemas=schemas
    )


def trl_phase(
    args: argparse.Namespace, home: Path, policy: Path, work: TrlWork, clock: TrlClock, label: str
) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    transformers.logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)
    total = args.warmup + args.steps

    class Timed(GRPOTrainer):  # type: ignore[misc]
        def _generate_and_score_completions(self, inputs: Any) -> Any:
            started = time.perf_counter()
            try:
                out = super()._generate_and_score_completions(inputs)
            finally:
                clock.generate_and_score_s += time.perf_counter() - started
            generated = out["completion_mask"]
            if "tool_mask" in out:  # tool results are in the completion, masked out of the loss
                generated = generated * out["tool_mask"]
            clock.completion_tokens += int(generated.sum())
            return out

        def _generate_single_turn(self, *a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return super()._generate_single_turn(*a, **kw)
            finally:
                clock.generate_s += time.perf_counter() - started
                clock.generate_calls += 1

        def _calculate_rewards(self, *a: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return super()._calculate_rewards(*a, **kw)
            finally:
                clock.rewards_s += time.perf_counter() - started

        def _tokenize_prompts(self, *a: Any, **kw: Any) -> Any:
            out = super()._tokenize_prompts(*a, **kw)
            if not clock.prompts:
                clock.prompts = [list(ids) for ids in out[0]]
            return out

    warmup = args.warmup  # the callbacks' own ``args`` parameter (TRL's config) hides the bench's
    with _progress() as progress:
        task = progress.add_task(f"{label} GRPO steps", total=total)

        class StepTimer(TrainerCallback):  # type: ignore[misc]
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock.start_step()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                step_s = time.perf_counter() - clock.step_started
                clock.rows.append(
                    {
                        "step": state.global_step,
                        "warmup": state.global_step <= warmup,
                        "step_s": step_s,
                        "rollout_s": clock.generate_and_score_s - clock.rewards_s,
                        "reward_s": clock.rewards_s,
                        "reward_fn_s": clock.reward_fn_s,
                        "update_s": step_s - clock.generate_and_score_s,
                        "generate_s": clock.generate_s,
                        "generate_calls": clock.generate_calls,
                        "tool_calls": clock.tool_calls,
                        "completions": clock.completions,
                        "completion_tokens": clock.completion_tokens,
                        "reward_sum": clock.reward_sum,
                    }
                )
                progress.advance(task)

        torch.manual_seed(args.seed)
        tokenizer = AutoTokenizer.from_pretrained(str(policy), local_files_only=True, padding_side="left")
        # The tiny model's layout is Qwen's (<tool_call> JSON blocks): TRL parses its replies with
        # Qwen3's response template (TRL sets it itself only for chat templates it recognises).
        tokenizer.response_template = qwen3_template
        model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=torch.float32, local_files_only=True)
        config = GRPOConfig(
            output_dir=str(home / label),
            use_cpu=True,
            bf16=False,
            fp16=False,
            seed=args.seed,
            per_device_train_batch_size=args.prompts * args.group,
            gradient_accumulation_steps=1,
            num_generations=args.group,
            max_steps=total,
            learning_rate=args.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            gradient_checkpointing=False,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            beta=0.0,
            epsilon=0.2,
            loss_type="dapo",
            scale_rewards="group",
            num_iterations=1,
            logging_strategy="no",
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            dataloader_num_workers=0,
            **work.config,
        )
        trainer = Timed(
            model=model,
            reward_funcs=work.reward_funcs or None,
            args=config,
            train_dataset=work.dataset,
            processing_class=tokenizer,
            callbacks=[StepTimer()],
            environment_factory=work.environment_factory,
        )
        if work.tool_schemas:
            # TRL renders an environment's tools from its methods' signatures (get_json_schema), which
            # words a schema differently from the tool's own JSON; the chat template renders schema
            # dicts as they are, so the prompts become exactly the ones Arena renders. Dispatch still
            # goes to the methods (TRL 1.16 builds its tool dicts from the environment instances).
            trainer._env_tools.update(work.tool_schemas)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            trainer.train()
    figures = trl_figures(args, clock)
    texts = {tokenizer.decode(ids, skip_special_tokens=False) for ids in clock.prompts}
    figures["per_rollout"]["prompts"] = sorted(texts)
    return figures


def trl_figures(args: argparse.Namespace, clock: TrlClock) -> dict[str, Any]:
    total = args.warmup + args.steps
    rows = clock.rows
    timed = [r for r in rows if not r["warmup"]]
    if len(timed) != args.steps:
        raise BenchError(f"TRL ran {len(rows)} steps, expected {total}")
    n = sum(r["completions"] for r in timed)
    step_s = _mean(r["step_s"] for r in timed)
    rollout_s = _mean(r["rollout_s"] for r in timed)
    return {
        "steps_timed": len(timed),
        "rollouts_per_step": args.prompts * args.group,
        "step_s": _r(step_s),
        "rollout_s": _r(rollout_s),
        "reward_s": _r(_mean(r["reward_s"] for r in timed), 6),
        "update_s": _r(_mean(r["update_s"] for r in timed)),
        "rollouts_per_s": _r(args.prompts * args.group / step_s, 3),
        "rollouts_per_s_rollout_phase": _r(args.prompts * args.group / rollout_s, 3),
        "reward_fn_s": _r(_mean(r["reward_fn_s"] for r in timed), 6),
        "inside_rollout": {
            "generate_s": _r(_mean(r["generate_s"] for r in timed)),
            "generate_calls": _r(_mean(r["generate_calls"] for r in timed), 1),
            "tool_calls_executed": _r(_mean(r["tool_calls"] for r in timed), 1),
        },
        "per_rollout": {
            "prompt_tokens_mean": _r(statistics.fmean(len(p) for p in clock.prompts), 1),
            "generated_tokens_mean": _r(sum(r["completion_tokens"] for r in timed) / n, 1) if n else None,
            "tool_calls_executed_mean": _r(sum(r["tool_calls"] for r in timed) / n, 2) if n else None,
            "reward_mean": _r(sum(r["reward_sum"] for r in timed) / n, 4) if n else None,
        },
        "generated_tokens_per_s": _r(sum(r["completion_tokens"] for r in timed) / (step_s * len(timed)), 1),
        "per_step": [_step_row(r) for r in rows],
    }


# -- glue -------------------------------------------------------------------------------------------


def _mean(values: Any) -> float:
    return statistics.fmean(list(values))


def _r(value: float, digits: int = 4) -> float:
    return round(float(value), digits)


def installed_version(package: str) -> str | None:
    """The installed distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _step_row(row: dict[str, Any]) -> dict[str, Any]:
    keep = ("step", "warmup", "step_s", "rollout_s", "reward_s", "update_s")
    return {k: (_r(row[k], 6) if isinstance(row[k], float) else row[k]) for k in keep}


@dataclass
class Setup:
    """What both sides share: the prompts' samples, packages and offered tools, and the policy."""

    settings: Any
    samples: list[Any]
    packages: list[Any]
    tools: list[list[dict[str, Any]]]
    extras: list[dict[str, Any]]
    policy: Path
    info: dict[str, Any]


async def setup(args: argparse.Namespace, home: Path, *, hidden_size: int = 64, heads: int = 4) -> Setup:
    """Packages in a catalog, the samples, their offered tools, and the warm-started policy
    (``trainer.tiny.build_tiny`` of ``hidden_size`` and ``heads``)."""
    from arena.config import SandboxSettings
    from lake.env_packages import EnvPackageStore
    from sandbox import SandboxPool
    from streams.envs.samples_verified import sample_of

    console.print("[cyan]building packages[/cyan] (environment track, rules backend)")
    packages, package_info = await build_packages(args.prompts, args.seed, home)
    chosen = packages[: args.prompts]
    samples = [sample_of(p) for p in chosen]
    settings = arena_settings(args, home)
    store = EnvPackageStore(settings.catalog)
    try:
        for package in packages:
            store.record(package, "train")
        tools, extras = await asyncio.to_thread(offered_tools, settings, store, samples)
    finally:
        store.dispose()
    async with SandboxPool(SandboxSettings.model_validate({"pool_size": 2})) as pool:
        conversations = await reference_conversations(samples, chosen, tools, extras, pool)
    policy = home / "policy"
    console.print("[cyan]building the tiny model[/cyan]")
    model_info = await asyncio.to_thread(
        build_policy,
        policy,
        conversations,
        tools,
        seed=args.seed,
        sft_steps=args.sft_steps,
        sft_lr=args.sft_lr,
        target_loss=args.sft_target_loss,
        hidden_size=hidden_size,
        heads=heads,
    )
    package_info["prompts"] = [
        {"env_id": p.env_id, "domain": p.domain, "jobs": len(p.jobs), "question": p.question} for p in chosen
    ]
    info = {"packages": package_info, "model": model_info}
    return Setup(settings, samples, chosen, tools, extras, policy, info)


def trl_tools_phase(
    args: argparse.Namespace, home: Path, shared: Setup, prompt_lengths: Sequence[int]
) -> dict[str, Any]:
    """TRL's multi-turn tool path on Arena's environments: a sandbox pool like Arena's on a loop thread."""
    from bench.trl_tools import LoopThread, close_environments, environment_classes
    from sandbox import SandboxPool

    clock = TrlClock()
    loop = LoopThread()
    pool = SandboxPool(shared.settings.sandbox)
    try:
        loop.run(pool.start())
        classes = environment_classes(
            shared.samples, shared.packages, shared.extras, shared.tools, pool, loop, clock
        )
        work = trl_tools_work(args, shared.samples, shared.tools, classes, prompt_lengths)
        figures = trl_phase(args, home, shared.policy, work, clock, "trl tools")
        loop.run(close_environments(clock.environments))
    finally:
        loop.run(pool.close())
        loop.stop()
    return figures


def bench(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="arena-bench-trainer-") as tmp:
        home = Path(tmp)
        shared = asyncio.run(setup(args, home))
        console.print("[cyan]arena[/cyan]: Episodes.groups + Learner.grpo_step")
        load = {"arena_start": _load()}
        arena, prompt_texts, prompt_lengths = asyncio.run(
            arena_phase(args, shared.settings, shared.policy, shared.samples, shared.tools)
        )
        load["arena_end"] = _load()
        if args.trl:
            console.print("[cyan]trl[/cyan]: GRPOTrainer, single-turn")
            load["trl_start"] = _load()
            clock = TrlClock()
            work = trl_single_turn_work(args, prompt_texts, shared.samples, clock)
            trl = trl_phase(args, home, shared.policy, work, clock, "trl")
            load["trl_end"] = load["trl_tools_start"] = _load()
            console.print("[cyan]trl tools[/cyan]: GRPOTrainer(environment_factory=...), multi-turn")
            trl_tools = trl_tools_phase(args, home, shared, prompt_lengths)
            load["trl_tools_end"] = _load()
            trl_tools["per_rollout"]["prompts_as_arena_renders"] = sorted(
                trl_tools["per_rollout"].pop("prompts")
            ) == sorted(set(prompt_texts))
            trl["per_rollout"].pop("prompts")
        else:
            console.print(f"[yellow]trl: skipped[/yellow] ({escape(TRL_MISSING)})")
            trl = trl_tools = {"skipped": TRL_MISSING}
        info = shared.info

    def ratio(key: str, other: dict[str, Any]) -> float | None:
        return round(arena[key] / other[key], 3) if other.get(key) else None

    return {
        "benchmark": "trainer",
        "quick": args.quick,
        "params": {
            "prompts": args.prompts,
            "group_size_G": args.group,
            "steps_timed": args.steps,
            "warmup_steps": args.warmup,
            "max_new_tokens_per_turn": args.max_new_tokens,
            "arena_max_turns": args.max_turns,
            "arena_max_seq_len": args.max_seq_len,
            "arena_micro_batch": args.micro_batch or args.prompts * args.group,
            "mixing": args.mixing,
            "lr": args.lr,
            "temperature": 1.0,
            "seed": args.seed,
            "torch_threads": args.threads,
        },
        "setup": info,
        "arena": arena,
        "trl": trl,
        "trl_tools": trl_tools,
        "ratio_step_s_arena_over_trl": ratio("step_s", trl),
        "ratio_rollout_s_arena_over_trl": ratio("rollout_s", trl),
        "ratio_update_s_arena_over_trl": ratio("update_s", trl),
        "ratio_rollouts_per_s_arena_over_trl": ratio("rollouts_per_s", trl),
        "ratio_step_s_arena_over_trl_tools": ratio("step_s", trl_tools),
        "ratio_rollout_s_arena_over_trl_tools": ratio("rollout_s", trl_tools),
        "ratio_update_s_arena_over_trl_tools": ratio("update_s", trl_tools),
        "ratio_generated_tokens_per_s_arena_over_trl_tools": ratio("generated_tokens_per_s", trl_tools),
        "comparable": [
            "same weights and tokenizer, same P prompts (the text Arena renders, offered tools included), "
            "same G, same per-turn completion budget, temperature 1 with no top-k/top-p, fp32 on CPU with the "
            "same torch thread count",
            "same objective: no KL, clip 0.2, token-mean loss over the batch (TRL 'dapo' = Arena 'token-mean'), "
            "group advantages (std-scaled; TRL eps 1e-4, Arena eps 1e-6), AdamW at a constant lr, grad clip "
            "1.0, one optimizer step per P x G rollouts",
        ],
        "not_comparable": [
            "Arena rollouts are multi-turn (up to arena_max_turns assistant turns, each up to "
            "max_new_tokens): tool calls are parsed and executed in fresh per-rollout QaEnvironment "
            "instances in the sandbox (namespaces, seccomp), and observations are appended before the "
            "next turn; TRL's default GRPOTrainer is single-turn (one completion of at most "
            "max_new_tokens, no tool runs). Compare tokens generated per rollout, not only seconds.",
            "Arena generates each turn of all live rollouts in one padded generate() and keeps the "
            "sampled tokens' log-probs (the update's old log-probs); TRL generates the P x G batch (then "
            "the rollouts with tool calls, per turn) the same way and takes the old log-probs from the "
            "training forward pass (num_iterations 1).",
            "trl_tools: Arena executes the calls of the last allowed turn (they count in c); TRL stops "
            "after max_tool_calling_iterations without running them. A call TRL cannot parse or "
            "dispatch (unknown tool, wrong argument names) becomes a TRL error message and never reaches "
            "the environment, so it is not in c; Arena counts every emitted call. TRL runs one rollout's "
            "calls concurrently and the rollouts one after another; Arena runs all rollouts' calls "
            "concurrently. Tool schemas are rebuilt from Python signatures, so the prompt text can "
            "differ slightly from Arena's (per_rollout.prompts_as_arena_renders, prompt_tokens_mean).",
            "TRL's reward is F1 over the completion text (no tool outputs exist); Arena's is F1 over the "
            "sandbox tool outputs with c = emitted calls. Both are cheap: the reward split mostly shows "
            "harness overhead.",
            "Arena's step includes the catalog look-up and tool mixing per sample (mixing mode in params); "
            "TRL gets the already-mixed tool list in its prompt text.",
            "adaptive batch filling is off on Arena's side (every rolled group is trained), as TRL has none.",
        ],
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_average_1min": load,
            "load_note": "1-minute load average when each phase started and ended: other work on the "
            "machine slows both sides, and the phases run one after the other, so compare runs at "
            "similar load",
        },
        "versions": {pkg: installed_version(pkg) for pkg in ("torch", "transformers", "trl", "accelerate")},
        "note": (
            "seconds per GRPO step are means over the timed steps (warm-up steps excluded; per_step lists "
            "all). arena: rollout = Episodes.groups wall time minus the time inside env.reward, reward = "
            "time inside env.reward (called by rollout() for each finished trajectory; a timing proxy "
            "measures it), update = Learner.grpo_step (advantages, forward + backward, AdamW, weight sync). "
            "trl: step = on_step_begin -> on_step_end, rollout = _generate_and_score_completions minus "
            "_calculate_rewards, reward = _calculate_rewards, update = step minus "
            "_generate_and_score_completions. rollouts_per_s = P x G / step_s; "
            "ratio_* = arena / trl (seconds: > 1 means Arena slower; rollouts/s: > 1 means Arena faster)."
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--prompts", type=int, default=4, help="prompts (verified packages) per step (P)")
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt (G)")
    parser.add_argument("--steps", type=int, default=3, help="timed GRPO steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed GRPO steps first, per side")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per assistant turn (both)")
    parser.add_argument("--max-turns", type=int, default=4, help="Arena: assistant turns per rollout")
    parser.add_argument("--max-seq-len", type=int, default=2048, help="Arena: prompt + response tokens")
    parser.add_argument("--micro-batch", type=int, default=0, help="Arena: sequences per pass (0: P x G)")
    parser.add_argument("--mixing", choices=["bands", "none", "random"], default="bands", help="Arena")
    parser.add_argument(
        "--sft-steps", type=int, default=200, help="most SFT warm-start steps (0: random policy)"
    )
    parser.add_argument("--sft-target-loss", type=float, default=0.02, help="SFT warm start stops below this")
    parser.add_argument("--sft-lr", type=float, default=3e-3, help="SFT warm-start learning rate")
    parser.add_argument("--lr", type=float, default=1e-6, help="GRPO learning rate (both)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both)")
    parser.add_argument("--seed", type=int, default=0, help="seed of packages, model, rollouts")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run (P 2, G 2, 1 step, no warm-up, 16 tokens, 2 turns, 2 SFT steps; all three "
        "sides, or Arena's only without TRL): not a measurement",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.group, args.steps, args.warmup = 2, 2, 1, 0
        args.max_new_tokens, args.max_turns, args.sft_steps = 16, 2, 2
    if args.prompts < 1 or args.group < 2 or args.steps < 1 or args.warmup < 0:
        parser.error("--prompts >= 1, --group >= 2, --steps >= 1, --warmup >= 0")
    if args.max_new_tokens < 1 or args.max_turns < 1 or args.sft_steps < 0 or args.threads < 1:
        parser.error("--max-new-tokens, --max-turns, --threads >= 1 and --sft-steps >= 0")
    if os.geteuid() != 0:
        console.print("[red]benchmark failed[/red]: the sandbox needs root")
        return 1
    try:
        import trl  # noqa: F401

        args.trl = True
    except ImportError:
        if not args.quick:
            console.print(f"[red]benchmark failed[/red]: {escape(TRL_MISSING)}")
            return 1
        console.print(f"[yellow]{escape(TRL_MISSING)}[/yellow]: this quick run smoke-tests Arena's side only")
        args.trl = False
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # libraries print; stdout carries only the JSON
            result = bench(args)
    except BenchError as exc:
        console.print(f"[red]benchmark failed[/red]: {exc}")
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

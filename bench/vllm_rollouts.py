"""vLLM rollout backend on a GPU: GRPO steps with weight sync, beside the HF backend on the same GPU.

Usage::

    python bench/vllm_rollouts.py prepare --work DIR [--prompts P] [--seed S]
    python bench/vllm_rollouts.py run --work DIR [--group G] [--steps N] [--backends hf,vllm]
    python bench/vllm_rollouts.py --quick

``prepare`` (any machine with the full install, CPU is fine): the environment track on the ``rules``
backend verifies P packages; a tiny Llama whose attention heads are 64 wide (vLLM's kernels need at
least 32; ``trainer.tiny``'s default is 16) gets a short SFT warm start on one reference trajectory
per prompt, so its rollouts call tools (``bench/trainer.py``'s set-up). The policy, the samples, their
packages and the tools each prompt is offered go to DIR as JSON and safetensors, so ``run`` needs
neither the lake nor the streams, only torch, transformers, pydantic and, for its backend, vllm.

``run`` (a GPU; ``pip install vllm`` for the vllm backend): per backend, the service's own GRPO pieces
on those prompts, on the GPU in bf16: ``Learner.load`` (``train.backend`` = hf or vllm: for vllm the
engine starts in-process with ``train.vllm_gpu_memory`` of the GPU), then ``--steps`` GRPO steps, each
one lockstep ``rollout_batch`` of P x G multi-turn rollouts in fresh ``QaEnvironment`` instances on a
sandbox pool, then ``Learner.grpo_step`` (update, then weight sync into the rollout backend). It
reports per step the rollout, update and sync seconds, generated tokens per second and the mean
reward, and two checks of the vLLM path:

- rollout log-probs: the log-probs vLLM recorded for the sampled tokens against the trainer's own
  (``response_logprobs`` under the same weights, the update's bf16 autocast), before the first
  update: they are the ``old`` log-probs of the PPO ratio, so their gap is how far off-policy the
  engine's kernels make an on-policy step;
- weight sync: after every update, vLLM's prompt log-probs of a probe (the step's first rollout)
  against the trained model's, and against the model before the update. A sync that works puts the
  engine closer to the new weights than the old ones are.

Prints one JSON object on stdout; progress goes to stderr. ``--quick`` (what CI runs) prepares 2
prompts in a temporary folder (3 SFT steps, 2 turns of 16 tokens) and runs 1 step on the backends
the machine has: ``hf`` on the CPU where there is no GPU, so CI checks the script and the hf path,
never vLLM.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import argparse
import asyncio
import copy
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from rich.console import Console
from rich.markup import escape

console = Console(stderr=True)
HIDDEN, HEADS = 256, 4  # head size 64: every vLLM attention backend takes it


class BenchError(RuntimeError):
    """The benchmark could not run or produce a trustworthy number."""


# -- prepare ------------------------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Packages, samples, offered tools and a warm-started policy, written under ``--work``."""
    import shutil
    import tempfile

    from bench.trainer import setup

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    setup_args = argparse.Namespace(
        prompts=args.prompts,
        seed=args.seed,
        group=4,
        mixing="bands",
        max_turns=args.max_turns,
        max_new_tokens=args.max_new_tokens,
        max_seq_len=args.max_seq_len,
        lr=1e-6,
        micro_batch=0,
        sft_steps=args.sft_steps,
        sft_lr=args.sft_lr,
        sft_target_loss=args.sft_target_loss,
    )
    with tempfile.TemporaryDirectory(prefix="arena-vllm-prepare-") as tmp:
        shared = asyncio.run(setup(setup_args, Path(tmp), hidden_size=HIDDEN, heads=HEADS))
        policy = work / "policy"
        if policy.exists():
            shutil.rmtree(policy)
        shutil.move(shared.policy, policy)  # --work may be on another filesystem than the temporary one
    prompts = [
        {
            "sample": sample.model_dump(mode="json"),
            "package": package.model_dump(mode="json"),
            "tools": tools,
            "extras": {name: extra.model_dump(mode="json") for name, extra in extras.items()},
        }
        for sample, package, tools, extras in zip(
            shared.samples, shared.packages, shared.tools, shared.extras, strict=True
        )
    ]
    _write_json(work / "prompts.json", prompts)
    _write_json(work / "setup.json", shared.info)
    return {"work": str(work), "prompts": len(prompts), "setup": shared.info}


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)  # atomic: a crash never leaves a torn file


# -- run ----------------------------------------------------------------------------------------------


class Prompt:
    """One prepared prompt: its sample, package, offered tools and mixed-in packages."""

    def __init__(self, row: dict[str, Any]) -> None:
        from arena.records.envs import EnvPackage, VerifiedSample

        self.sample = VerifiedSample.model_validate(row["sample"])
        self.package = EnvPackage.model_validate(row["package"])
        self.tools: list[dict[str, Any]] = row["tools"]
        self.extras = {name: EnvPackage.model_validate(p) for name, p in row["extras"].items()}


def load_prompts(work: Path) -> list[Prompt]:
    path = work / "prompts.json"
    if not path.is_file() or not (work / "policy").is_dir():
        raise BenchError(
            f"{work} holds no prepared run (fix: python bench/vllm_rollouts.py prepare --work {work})"
        )
    return [Prompt(row) for row in json.loads(path.read_text())]


class SyncClock:
    """The rollout backend with its weight syncs timed (``grpo_step`` ends with one)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.sync_s = 0.0

    def generate(self, prompts: list[list[int]], **kwargs: Any) -> Any:
        return self.backend.generate(prompts, **kwargs)

    def load_weights(self, model: Any) -> None:
        started = time.perf_counter()
        self.backend.load_weights(model)
        self.sync_s += time.perf_counter() - started


def train_settings(args: argparse.Namespace, backend: str, prompts: int) -> Any:
    """The service's train settings for this run; a bad option is a ``BenchError`` naming it."""
    from pydantic import ValidationError

    from arena.config import TrainSettings

    try:
        engine_args = json.loads(args.engine_args)
    except json.JSONDecodeError as exc:
        raise BenchError(
            f"--engine-args is not JSON: {exc} (fix: e.g. '{{\"enforce_eager\": true}}')"
        ) from None
    values = {
        "backend": backend,
        "device": args.device,
        "precision": "bf16" if args.device == "cuda" else "fp32",
        "group_size": args.group,
        "batch_groups": prompts,
        "lr": args.lr,
        "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens,
        "max_seq_len": args.max_seq_len,
        "micro_batch": prompts * args.group,
        "vllm_gpu_memory": args.gpu_memory,
        "vllm_engine_args": engine_args,
    }
    try:
        return TrainSettings.model_validate(values)
    except ValidationError as exc:
        raise BenchError(f"invalid option: {exc}") from None


async def rollouts(
    learner: Any, prompts: list[Prompt], pool: Any, args: argparse.Namespace, step: int, *, chunk: int
) -> Any:
    """P x G rollouts in lockstep batches of ``chunk`` (the pool's size, as ``Episodes.groups``: a
    rollout waiting for a session would stall its batch), grouped per prompt."""
    from environments.environment import QaEnvironment
    from trainer.rollout import RolloutJob, derive_seed, group_of, rollout_batch

    def factory(p: Prompt) -> Any:
        return lambda: QaEnvironment(p.sample, p.package, pool, p.extras, tools=p.tools)

    jobs = [
        RolloutJob(
            p.sample,
            factory(p),
            derive_seed(derive_seed(args.seed, "step", step, p.sample.sample_id), "group", i),
        )
        for p in prompts
        for i in range(args.group)
    ]
    trajectories = await rollout_batch(
        learner.backend,
        learner.tokenizer,
        jobs,
        seed=derive_seed(args.seed, "step", step),
        max_turns=args.max_turns,
        max_seq_len=args.max_seq_len,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        chunk=chunk,
    )
    groups = [
        group_of(
            p.sample.sample_id,
            trajectories[k * args.group : (k + 1) * args.group],
            born_step=step,
            behaviour_step=step - 1,
        )
        for k, p in enumerate(prompts)
    ]
    return trajectories, groups


def trainer_logprobs(
    model: Any, rows: list[dict[str, Any]], pad_id: int, precision: str
) -> list[list[float]]:
    """The trained model's log-prob of each generated token (mask 1) of each rollout, no gradient."""
    import torch

    from trainer.policy import autocast
    from trainer.response_logprobs import response_logprobs

    device = next(model.parameters()).device
    with torch.no_grad(), autocast(device, precision):  # type: ignore[arg-type]
        values = response_logprobs(
            model, [r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], pad_id
        )
    out = []
    for r, row in zip(rows, values.tolist(), strict=True):
        out.append([v for v, m in zip(row, r["response_mask"], strict=False) if m])
    return out


def gap(a: list[list[float]], b: list[list[float]]) -> dict[str, float]:
    """Mean and largest absolute difference of two ragged log-prob tables, and the tokens compared."""
    diffs = [abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    if not diffs:
        return {"mean_abs": 0.0, "max_abs": 0.0, "tokens": 0}
    return {
        "mean_abs": round(statistics.fmean(diffs), 5),
        "max_abs": round(max(diffs), 5),
        "tokens": len(diffs),
    }


def generated(rows: list[dict[str, Any]]) -> list[list[float]]:
    """The log-probs the rollout recorded for its generated tokens (mask 1)."""
    return [[v for v, m in zip(r["logprobs"], r["response_mask"], strict=True) if m] for r in rows]


async def run_backend(name: str, args: argparse.Namespace, prompts: list[Prompt]) -> dict[str, Any]:
    """``--steps`` GRPO steps with rollouts on backend ``name``; figures and the vLLM checks."""
    import torch

    from arena.config import SandboxSettings
    from sandbox import SandboxPool
    from trainer.learner import Learner

    cfg = train_settings(args, name, len(prompts))
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    learner = Learner.load(Path(args.work) / "policy", cfg)
    start_s = time.perf_counter() - started
    learner.new_optimizer("grpo")
    engine = learner.backend
    learner.backend = clock = SyncClock(engine)
    steps: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    sessions = min(len(prompts) * args.group, args.pool)
    async with SandboxPool(SandboxSettings.model_validate({"pool_size": sessions})) as pool:
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            trajectories, groups = await rollouts(learner, prompts, pool, args, step, chunk=sessions)
            rollout_s = time.perf_counter() - t0
            rows = [r for g in groups for r in g.rollouts]
            if step == 1 and name == "vllm":
                mine = trainer_logprobs(learner.model, rows, learner.pad_id, learner.precision)
                checks["rollout_vs_trainer_logprobs"] = gap(generated(rows), mine)
            before = copy.deepcopy(learner.model) if name == "vllm" else None
            clock.sync_s = 0.0
            _synchronize()
            t1 = time.perf_counter()
            metrics = learner.grpo_step(groups)
            _synchronize()
            update_s = time.perf_counter() - t1
            tokens = sum(sum(r["response_mask"]) for r in rows)
            row = {
                "step": step,
                "rollout_s": round(rollout_s, 3),
                "update_s": round(update_s - clock.sync_s, 3),
                "sync_s": round(clock.sync_s, 3),
                "generated_tokens": tokens,
                "generated_tokens_per_s": round(tokens / rollout_s, 1),
                "reward_mean": round(statistics.fmean(t.reward for t in trajectories), 4),
                "tool_calls_mean": round(statistics.fmean(t.tool_calls for t in trajectories), 3),
                "turns_mean": round(statistics.fmean(t.turns for t in trajectories), 3),
                "clip_frac": round(metrics.get("clip_frac", 0.0), 5),
            }
            if before is not None:
                row["sync_check"] = sync_check(engine, learner, before, rows[0])
            steps.append(row)
            console.print(f"[cyan]{name}[/cyan] step {step}: {json.dumps(row)}")
    timed = steps[args.warmup :] or steps
    summary = {
        key: round(statistics.fmean(s[key] for s in timed), 3)
        for key in ("rollout_s", "update_s", "sync_s", "generated_tokens_per_s", "reward_mean")
    }
    return {"start_s": round(start_s, 2), "summary": summary, "checks": checks, "per_step": steps}


def sync_check(engine: Any, learner: Any, before: Any, probe: dict[str, Any]) -> dict[str, Any]:
    """vLLM's log-probs of ``probe``'s generated tokens after the sync, against the trained model's
    (``after``) and the model's before the update (``before``): a working sync has after < before."""
    prompt = list(probe["prompt_ids"])
    response = list(probe["response_ids"])
    mask = list(probe["response_mask"])
    served = engine.logprobs_of(prompt, response)
    served = [v for v, m in zip(served, mask, strict=True) if m]
    new = trainer_logprobs(learner.model, [probe], learner.pad_id, learner.precision)[0]
    old = trainer_logprobs(before, [probe], learner.pad_id, learner.precision)[0]
    after, previous = gap([served], [new]), gap([served], [old])
    moved = gap([new], [old])
    return {"vs_trained": after, "vs_before_update": previous, "update_moved": moved}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import importlib.util

    import torch

    from bench.trainer import installed_version

    if args.device == "cuda" and not torch.cuda.is_available():
        raise BenchError("run needs a GPU (torch sees none; --device cpu --backends hf checks the script)")
    prompts = load_prompts(Path(args.work))
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if unknown := set(backends) - {"hf", "vllm"}:
        raise BenchError(f"--backends: unknown {sorted(unknown)} (fix: hf, vllm or both)")
    if "vllm" in backends and (args.device != "cuda" or importlib.util.find_spec("vllm") is None):
        raise BenchError("the vllm backend needs a GPU and vllm (fix: pip install -e '.[gpu]' there)")
    results = {}
    for name in backends:
        console.print(f"[cyan]{name}[/cyan]: Learner.load + {args.steps} GRPO steps")
        results[name] = asyncio.run(run_backend(name, args, prompts))
        if args.device == "cuda":
            torch.cuda.empty_cache()
    out: dict[str, Any] = {
        "benchmark": "vllm_rollouts",
        "quick": args.quick,
        "params": {k: v for k, v in vars(args).items() if k not in ("command", "quick", "work")},
        "prompts": len(prompts),
        "backends": results,
        "machine": {
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "versions": {pkg: installed_version(pkg) for pkg in ("torch", "transformers", "vllm")},
    }
    if "hf" in results and "vllm" in results:
        hf, vl = results["hf"]["summary"], results["vllm"]["summary"]
        for key in ("rollout_s", "generated_tokens_per_s"):
            out[f"ratio_{key}_vllm_over_hf"] = round(vl[key] / hf[key], 3) if hf[key] else None
    return out


def _synchronize() -> None:
    """Wait for queued GPU work, so a timer around it measures the work (no-op without a GPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def quick(args: argparse.Namespace) -> dict[str, Any]:
    """Smoke run: 2 prompts prepared in a temporary folder, then 1 step on each backend this machine
    has (hf on the CPU without a GPU; vllm too where a GPU and vllm are there)."""
    import importlib.util
    import tempfile

    import torch

    with tempfile.TemporaryDirectory(prefix="arena-vllm-quick-") as tmp:
        args.work, args.prompts, args.sft_steps = tmp, 2, 3
        args.max_turns, args.max_new_tokens = 2, 16  # a tool call and the turn after its result
        args.group, args.steps, args.warmup, args.pool = 2, 1, 0, 4
        prepared = prepare(args)
        gpu = torch.cuda.is_available()
        args.device = "cuda" if gpu else "cpu"
        args.backends = "hf,vllm" if gpu and importlib.util.find_spec("vllm") else "hf"
        result = run(args)
    result["prepared"] = {"prompts": prepared["prompts"], "model": prepared["setup"]["model"]}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("command", nargs="?", choices=["prepare", "run"], help="see the module docstring")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run (prepare + run in a temporary folder)"
    )
    parser.add_argument("--work", help="folder of the prepared run (prepare and run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-turns", type=int, default=4, help="assistant turns per rollout")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="tokens per assistant turn")
    parser.add_argument("--max-seq-len", type=int, default=2048, help="prompt + response tokens")
    parser.add_argument("--prompts", type=int, default=8, help="prepare: verified packages to roll out (P)")
    parser.add_argument("--sft-steps", type=int, default=300, help="prepare: most SFT warm-start steps")
    parser.add_argument("--sft-lr", type=float, default=1e-3, help="prepare: SFT warm-start lr")
    parser.add_argument(
        "--sft-target-loss", type=float, default=0.05, help="prepare: the warm start stops below"
    )
    parser.add_argument("--group", type=int, default=8, help="run: rollouts per prompt (G)")
    parser.add_argument("--steps", type=int, default=4, help="run: GRPO steps per backend")
    parser.add_argument("--warmup", type=int, default=1, help="run: first steps left out of the summary")
    parser.add_argument("--lr", type=float, default=1e-4, help="run: GRPO lr (large, so a sync shows)")
    parser.add_argument(
        "--pool", type=int, default=64, help="run: most sandbox sessions (the lockstep batch)"
    )
    parser.add_argument("--backends", default="hf,vllm", help="run: comma-separated, of hf and vllm")
    parser.add_argument(
        "--device", choices=["cuda", "cpu"], default="cuda", help="run: cpu checks the hf path"
    )
    parser.add_argument("--gpu-memory", type=float, default=0.3, help="run: train.vllm_gpu_memory")
    parser.add_argument("--engine-args", default="{}", help="run: train.vllm_engine_args as JSON")
    args = parser.parse_args(argv)
    if not args.quick and (args.command is None or not args.work):
        parser.error("give prepare or run with --work DIR, or --quick")
    try:
        if args.quick:
            result = quick(args)
        else:
            result = prepare(args) if args.command == "prepare" else run(args)
    except BenchError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}")
        return 2
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

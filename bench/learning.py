"""Learning benchmark: base -> SFT -> GRPO for a tiny model on the demo environments (CPU).

Usage::

    python bench/learning.py            # about 30 minutes on 2 cores
    python bench/learning.py --quick    # a smoke run of 1-2 minutes (env track only, tiny budgets)
    python bench/learning.py --home DIR # reuse a finished `arena demo` home (skips the demo)

Prints ONE JSON object on stdout; progress and the trainer's log lines go to stderr. Writes a PNG
plot of the held-out figures (``--plot``; its path is the JSON's ``plot``).

What it does, all on a private ``ARENA_HOME`` in a temporary folder:

1. ``arena demo --tracks env`` (the real pipeline, ``rules`` backend) with 768 QA instances per
   knowledge base (1,717 packages: enough distinct questions that SFT has to learn the tools
   rather than memorise a few hundred conversations) and no complexity-scaling parameters (shorter
   tool schemas, so prompts suit a CPU model), so the catalog holds train-split and held-out
   environment packages and ``samples.verified`` holds the train split. Two kinds are held out:
   an eighth of the packages by hash (``heldout_k``), and every package calling one of the tool
   families ``heldout_families_k`` holds out whole (2 of the 50 here), so those tools never
   reach training. Held-out packages whose tools all occur in train packages are held-out
   *instances of seen families* (new questions and keys, same tools); the others use a tool
   family never seen, and the first ``unseen_max`` of them by env id are evaluated.
2. Synthetic SFT data from the TRAIN split only (ASTRA §3.1's SFT trajectories): for every
   train-split package, the system prompt and question, then one assistant turn per job calling
   the job's tool with the job's invocation arguments, the tool's real output from the sandbox,
   and a final assistant message stating the main answer a0. Each trajectory is checked (F1 = 1
   against the package's jobs) before it is published to ``samples.sft``; held-out packages are
   never read here. SFT sees every train package for about 4 epochs, which leaves it partial (it
   solves some rollouts of a package, not all), so GRPO's groups over the same packages have
   reward spread; ``sft_share`` below 1 instead keeps a seeded share for SFT and gives GRPO the
   rest. Copies for several epochs get distinct sample ids (so they spread over the topic's
   partitions, which mixes the epochs); ``samples.verified`` gets copies the same way for several
   GRPO passes, since ``arena train`` consumes each record once per run.
3. A tiny Llama (``trainer.tiny.build_tiny``, tokenizer trained on the lake's text and the SFT
   texts, digits split one by one so an id it never produced is digits it has) saved to a
   folder and handed to the trainer as ``ARENA_TRAIN__MODEL``.
4. ``arena train`` three ways, each a subprocess: run ``sft`` (SFT only: ``--steps`` = SFT
   steps), run ``grpo-f1`` from the SFT weights (F1 reward, GRPO only, stopped by ``--steps``,
   the topic running dry, or a time budget via SIGTERM, which the service turns into a final
   checkpoint), and two short ablation runs from the same SFT weights with
   ``ARENA_TRAIN__REWARD=recall`` and ``=precision``.
5. ``trainer.evaluate.run_eval`` on the held-out packages for the base weights, the SFT
   weights and the final GRPO weights (pass^1..pass^k, pass@k and mean F1, each with a 95%
   bootstrap interval over packages), and on the ablation runs' final weights for their turns.

The goal is base < SFT < GRPO on held-out F1 and pass^1; a tiny CPU model may not get there, and
the JSON reports what happened either way (``ordering``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TextIO

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from rich.console import Console
from rich.text import Text

REPO_ROOT = Path(__file__).resolve().parent.parent
ARENA = str(Path(sys.executable).parent / "arena")
SFT_SOURCE = "bench-env-train"

console = Console(stderr=True)


@dataclass(frozen=True)
class Profile:
    """Every knob of one benchmark run."""

    demo_instances: int = 768  # QA instances per built-in knowledge base in the demo
    demo_tracks: str = "env"  # `arena demo --tracks`
    extra_params: int = 0  # complexity scaling's added tool parameters: shorter prompts for a CPU model
    heldout_k: int = 8  # env hash mod k == 0 is held out (173 packages of seen families here)
    heldout_families_k: int = 17  # 2 of 50 tool families held out whole: 103 packages; 1,441 train
    unseen_max: int = 48  # unseen-family packages evaluated (the first by env id): bounds the eval time
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    vocab: int = 2048
    sft_share: float = 1.0  # train packages SFT sees; below 1 GRPO's rollouts are on the rest only
    sft_copies: int = 4  # epochs over the SFT share's trajectories (the step cap decides)
    sft_batch: int = 4
    sft_lr: float = 3e-3
    sft_max_steps: int = 1500
    rl_copies: int = 2  # passes over GRPO's packages in samples.verified (enough for the time budget)
    grpo_steps: int = 400
    grpo_budget_s: float = 360.0  # with the evaluations of the held-out packages: under 30 minutes
    lr: float = 3e-4
    group_size: int = 4
    batch_groups: int = 4
    ablation_steps: int = 10
    ablation_budget_s: float = 35.0
    max_turns: int = 5
    max_new_tokens: int = 64
    max_seq_len: int = 2048
    temperature: float = 1.0
    mixing: str = "none"
    k: int = 4  # pass^4 needs 4 trials
    trials: int = 4
    ablation_trials: int = 1
    seed: int = 0
    policy: str = "tiny"  # "tiny": built here; "smollm2": the pretrained SmolLM2-135M-Instruct (GPU profile)
    backend: str = "hf"  # rollouts: transformers generate, or vLLM ("auto": vLLM where it and a GPU are)
    precision: str = "auto"  # bf16 autocast on a GPU that supports it, else fp32


PROFILES = {
    "default": Profile(),
    "quick": Profile(
        demo_instances=4,
        demo_tracks="env",
        heldout_k=4,  # a quarter of the few packages: the held-out evaluation has some
        heldout_families_k=0,  # a few packages share few tools: holding families out leaves no seen ones
        hidden=64,
        sft_share=0.5,
        sft_copies=2,
        sft_max_steps=6,
        sft_lr=5e-3,
        rl_copies=1,
        # The F1 run rolls out every GRPO package once and stops drained (a step needs a group with
        # reward spread, which the tiny SFT policy seldom has): the budget is only a safety net. A
        # budget of seconds stopped it while it was still importing torch: no rollout ever ran.
        grpo_steps=1,
        grpo_budget_s=240.0,
        group_size=2,  # 4 rollouts a step instead of 16: a step still needs a group with reward spread
        batch_groups=2,
        ablation_steps=1,
        # The ablation runs are stopped while loading (the budget-stop path: their weights fall back
        # to SFT's); the F1 run above already proves the rollouts, each more would cost a torch import.
        ablation_budget_s=1.0,
        max_turns=3,
        max_new_tokens=32,
        k=1,
        trials=1,
        ablation_trials=1,
    ),
}

SMOLLM2: dict[str, Any] = dict(
    # SmolLM2-135M-Instruct from the local-llm extra (trainer/pretrained.py converts it once): its own
    # tokenizer and ChatML template, pretrained weights, so the learning rates are a fine-tune's and
    # the turns are long enough for its wordier replies. Sized for one GPU: on 2 CPU cores one
    # forward+backward over 4x512 tokens takes about 70 s, so the default run would take days there.
    policy="smollm2",
    backend="auto",
    precision="bf16",
    sft_batch=16,
    sft_lr=1e-5,
    sft_max_steps=400,
    lr=1e-6,
    group_size=8,
    batch_groups=8,
    grpo_steps=200,
    grpo_budget_s=1800.0,
    ablation_steps=20,
    ablation_budget_s=300.0,
    max_new_tokens=256,
    max_seq_len=4096,
    temperature=1.0,
)
"""``--policy smollm2``: these knobs over the chosen profile (``--quick`` keeps its own small budgets)."""


def policy_profile(p: Profile, policy: str, quick: bool) -> Profile:
    """``p`` for ``policy``: the tiny model as profiled, or SmolLM2 with the GPU profile's knobs (a
    quick run keeps the quick budgets and only swaps the model: a CPU smoke run of the same path)."""
    if policy == "tiny":
        return p
    if quick:  # the quick budgets, but a pretrained model's learning rates (the tiny model's 5e-3 wrecks it)
        knobs = {k: SMOLLM2[k] for k in ("policy", "backend", "precision", "sft_lr", "lr")}
        return replace(p, **knobs, max_new_tokens=96, max_seq_len=2048)
    return replace(p, **SMOLLM2)


def rollout_backend(p: Profile) -> str:
    """The trainer's ``backend`` for ``p``: "auto" is vLLM where it is installed and torch sees a GPU."""
    if p.backend != "auto":
        return p.backend
    import importlib.util

    import torch

    return "vllm" if torch.cuda.is_available() and importlib.util.find_spec("vllm") else "hf"


# --- subprocesses ---------------------------------------------------------------------------------
def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """A private ARENA_HOME, no inherited ARENA_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARENA_")}
    env.update(ARENA_HOME=str(home), TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    env.update(extra)
    return env


def run_cli(
    args: list[str], env: dict[str, str], log: Path, *, budget_s: float | None = None, label: str = ""
) -> tuple[int, bool]:
    """Run ``arena ARGS``; echo its lines to stderr and ``log``; SIGTERM it after ``budget_s``.

    Returns (exit code, whether the budget stopped it).
    """
    with log.open("a") as sink:
        proc = subprocess.Popen(
            [ARENA, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        deadline = None if budget_s is None else time.monotonic() + budget_s
        stopped = False
        try:
            assert proc.stdout is not None
            os.set_blocking(proc.stdout.fileno(), False)
            while True:
                line = proc.stdout.readline()
                if line:
                    _echo(line, sink, label)
                    continue
                if proc.poll() is not None:
                    for rest in proc.stdout:
                        _echo(rest, sink, label)
                    break
                if deadline is not None and not stopped and time.monotonic() > deadline:
                    proc.send_signal(signal.SIGTERM)  # the service checkpoints and exits
                    stopped = True
                time.sleep(0.1)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    return proc.returncode, stopped


def _echo(line: str, sink: TextIO, label: str) -> None:
    sink.write(line)
    sink.flush()
    text = line.rstrip()
    if text:
        console.print(Text.assemble((label, "dim"), " ", text), highlight=False)


def check(code: int, what: str, log: Path) -> None:
    if code != 0:
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise RuntimeError(f"{what} exited {code}; log {log}:\n{tail}")


# --- data -----------------------------------------------------------------------------------------
async def env_trajectories(settings: Any) -> tuple[list[Any], dict[str, int]]:
    """SFT samples solving every TRAIN-split package (tool outputs from the sandbox), and counts."""
    from arena.hashing import content_hash
    from arena.records.envs import EnvPackage
    from arena.records.sft import SftSample
    from environments.environment import QaEnvironment
    from environments.rewards import ToolResult, f1_reward
    from lake.env_packages import EnvPackageStore
    from sandbox import SandboxPool
    from streams.envs.samples_verified import sample_of
    from trainer.reference import ReferenceCallFailed, reference_conversation

    store = EnvPackageStore(settings.catalog)
    try:
        packages = [EnvPackage.model_validate_json(r.package) for r in store.rows("train")]
    finally:
        store.dispose()
    out: list[SftSample] = []
    skipped = 0
    pool = SandboxPool(settings.sandbox)
    await pool.start()
    try:
        for package in sorted(packages, key=lambda p: p.env_id):
            sample = sample_of(package)
            env = QaEnvironment(sample, package, pool)
            try:
                messages, outputs = await reference_conversation(sample, package, env)
            except ReferenceCallFailed:
                skipped += 1
                continue
            finally:
                await env.close()  # its sandbox session goes back to the pool
            results = [ToolResult(name="tool", content=text) for text in outputs]
            parts = f1_reward(sample.reward_spec["jobs"], results, len(outputs))
            if parts.f1 < 1.0 - 1e-6:
                skipped += 1
                continue
            out.append(
                SftSample(
                    sample_id=content_hash({"messages": messages, "tools": sample.tools}, prefix="sft-"),
                    messages=messages,
                    tools=sample.tools,
                    role_target="agent",
                    source=SFT_SOURCE,
                    reward=parts.f1,
                    origin_id=package.env_id,
                )
            )
    finally:
        await pool.close()
    return out, {"train_packages": len(packages), "trajectories": len(out), "skipped": skipped}


def sft_share(env_ids: list[str], share: float, seed: int) -> set[str]:
    """The train packages whose trajectories SFT sees: a seeded hash-ordered ``share`` of them.

    Below 1, GRPO's extra passes are over the others, so its groups have reward spread (a policy
    that memorised a package solves it in every rollout) and what it gains is solving packages it
    was never shown the answer to. At 1 (the default) SFT sees every package for a few epochs and
    stays partial, and GRPO's passes are over all of them.
    """
    from arena.hashing import content_hash

    ranked = sorted(env_ids, key=lambda e: content_hash([seed, e]))
    return set(ranked[: round(share * len(ranked))])


def copies(records: list[Any], n: int, seed: int, tag: str) -> list[Any]:
    """``n`` shuffled copies of ``records`` with distinct sample ids (copy 0 keeps the id)."""
    from arena.hashing import content_hash

    rng = random.Random(seed)
    out = []
    for c in range(n):
        batch = [
            r
            if c == 0
            else r.model_copy(update={"sample_id": content_hash([tag, c, r.sample_id], prefix="cp-")})
            for r in records
        ]
        rng.shuffle(batch)
        out += batch
    return out


def topic_values(bootstrap: str, name: str, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every committed value of a topic, decoded (read_committed, from the beginning).

    Reads each partition up to its read_committed end as of the call (``consumers.ledger.read_to_end``:
    every transaction committed before it lies below); a read that takes over ``timeout_s`` fails
    rather than return part of the topic.
    """
    from consumers.ledger import read_to_end

    records = read_to_end(bootstrap, [name], timeout_s)
    return [json.loads(value) for part in records.values() for _, _, value in part if value is not None]


async def publish_all(bootstrap: str, topic: str, records: list[Any]) -> int:
    from producers.publish import publish
    from streams.runtime import Emit

    return await publish(bootstrap, [Emit(topic, r.sample_id, r) for r in records])


# --- model and runs -------------------------------------------------------------------------------
def pretrained_model(settings: Any, p: Profile) -> tuple[Path, dict[str, Any]]:
    """The converted folder of the pretrained policy ``p.policy`` and what it is."""
    from transformers import AutoConfig

    from trainer.pretrained import hf_folder

    folder = hf_folder(p.policy, settings.home)
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    return folder, {
        "arch": f"{config.model_type} ({p.policy}: pretrained, converted by trainer/pretrained.py)",
        "hidden_size": int(config.hidden_size),
        "layers": int(config.num_hidden_layers),
        "heads": int(config.num_attention_heads),
        "vocab_size": int(config.vocab_size),
        "parameters": int(sum(x.numel() for x in model.parameters())),
        "tokenizer": "the model's own (GGUF), ChatML chat template",
    }


def build_model(settings: Any, folder: Path, sft_texts: list[str], p: Profile) -> dict[str, Any]:
    from lake.store import open_store
    from trainer.tiny import build_tiny, lake_texts

    texts = lake_texts(open_store(settings)) + sft_texts
    build_tiny(
        folder, texts, seed=p.seed, vocab_size=p.vocab, hidden_size=p.hidden, layers=p.layers, heads=p.heads
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    return {
        "arch": "llama (trainer.tiny.build_tiny)",
        "hidden_size": p.hidden,
        "layers": p.layers,
        "heads": p.heads,
        "vocab_size": int(model.config.vocab_size),
        "parameters": int(sum(x.numel() for x in model.parameters())),
        "tokenizer": "byte-level BPE trained on the lake's text + the synthetic SFT texts",
    }


def train_env(base: dict[str, str], p: Profile, **extra: str) -> dict[str, str]:
    knobs = {
        "SFT_BATCH": p.sft_batch,
        "SFT_LR": p.sft_lr,
        "LR": p.lr,
        "GROUP_SIZE": p.group_size,
        "BATCH_GROUPS": p.batch_groups,
        "FINAL_SHORT_BATCH": "true",  # the budgeted runs stop drained: train their last groups
        "MAX_TURNS": p.max_turns,
        "MAX_NEW_TOKENS": p.max_new_tokens,
        "MAX_SEQ_LEN": p.max_seq_len,
        "TEMPERATURE": p.temperature,
        "MIXING": p.mixing,
        "MICRO_BATCH": 4,
        "STATE_EVERY": 1000,
        "WEIGHTS_EVERY": 1000,
        "BACKEND": rollout_backend(p),
        "PRECISION": p.precision,
    }
    env = base | {f"ARENA_TRAIN__{k}": str(v) for k, v in knobs.items()}
    return env | {f"ARENA_TRAIN__{k.upper()}": v for k, v in extra.items()}


def final_weights(settings: Any, run: str, dest: Path, start: Path | None = None) -> tuple[int, Path]:
    """(step, folder) of the run's last weights; a GRPO run that trained no step (no group with reward
    spread: an empty batch is not a step) leaves its starting weights, ``start``, as step 0."""
    from lake.store import open_store
    from trainer.checkpoint import Checkpoints

    checkpoints = Checkpoints(open_store(settings), settings.catalog, run)
    try:
        steps = checkpoints.weights_steps()
        if not steps and start is not None:
            return 0, start
        if not steps:
            raise RuntimeError(f"run {run!r} saved no weights")
        return steps[-1], checkpoints.weights_folder(steps[-1], dest)
    finally:
        checkpoints.dispose()


def step_metrics(settings: Any, run: str) -> list[dict[str, Any]]:
    from lake.store import open_store
    from trainer.checkpoint import Checkpoints

    checkpoints = Checkpoints(open_store(settings), settings.catalog, run)
    try:
        records = sorted(checkpoints.steps(), key=lambda r: r.step)
    finally:
        checkpoints.dispose()
    return [{"step": r.step, "phase": r.phase, "trained": len(r.trained), **r.metrics} for r in records]


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if key in r]
    return round(statistics.fmean(values), 4) if values else None


def grpo_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    grpo = [r for r in rows if r["phase"] == "grpo"]
    third = max(1, len(grpo) // 3)
    head, tail = grpo[:third], grpo[-third:]
    return {
        "steps": len(grpo),
        "steps_with_update": sum(1 for r in grpo if r["trained"]),
        "groups_trained": sum(r["trained"] for r in grpo),
        "trajectories": int(sum(r.get("trajectories", 0) for r in grpo)),
        "reward_mean_first_third": _mean(head, "reward_mean"),
        "reward_mean_last_third": _mean(tail, "reward_mean"),
        "f1_first_third": _mean(head, "f1"),
        "f1_last_third": _mean(tail, "f1"),
        "rollout_turns_mean": _mean(grpo, "turns_mean"),
        "rollout_tool_calls_mean": _mean(grpo, "tool_calls_mean"),
        "fill_ratio_mean": _mean(grpo, "fill_ratio"),
        "step_s_mean": _mean(grpo, "step_s"),
    }


def tool_families(settings: Any) -> dict[str, str]:
    """Held-out package id -> ``seen`` (every tool it needs is a tool of some train package: new
    questions and data, tools trained on) or ``unseen`` (a tool family never seen in training)."""
    from arena.records.envs import EnvPackage
    from arena.records.tools import tool_name
    from lake.env_packages import EnvPackageStore

    store = EnvPackageStore(settings.catalog)
    try:
        train = [EnvPackage.model_validate_json(r.package) for r in store.rows("train")]
        held = [EnvPackage.model_validate_json(r.package) for r in store.rows("heldout")]
    finally:
        store.dispose()
    known = {tool_name(t) for p in train for t in p.tools}
    return {p.env_id: "seen" if {tool_name(t) for t in p.tools} <= known else "unseen" for p in held}


def family_figures(report: Any, families: dict[str, str], k: int, seed: int) -> dict[str, Any]:
    """Per family (seen / unseen): mean F1 with its 95% bootstrap interval, pass@1, pass^4 and the
    call shares (``call_shares``)."""
    from trainer.evaluate import group_report

    out: dict[str, Any] = {}
    for family in ("seen", "unseen"):
        cases = [c for c in report.cases if c.kind == "qa" and families.get(c.env_ref) == family]
        if not cases:
            out[family] = {"packages": 0, "f1": None, "f1_ci": None, "pass1": None, "pass4": None}
            out[family] |= dict.fromkeys(("failed_call_share", "grounded_call_share"))
            continue
        g = group_report(family, cases, k, seed)
        f1 = g.f1
        out[family] = {
            "packages": len(cases),
            "f1": None if f1 is None else round(f1.mean, 4),
            "f1_ci": None if f1 is None else [round(f1.ci_low, 4), round(f1.ci_high, 4)],
            "pass1": round(g.pass_hat[1].mean, 4),
            "pass4": round(g.pass_hat[4].mean, 4) if 4 in g.pass_hat else None,
            **call_shares(g),
        }
    return out


def call_shares(group: Any) -> dict[str, float | None]:
    """Why F1 is what it is: the shares of failed calls and of calls with grounded arguments."""
    return {
        key: None if (value := getattr(group, key)) is None else round(value, 4)
        for key in ("failed_call_share", "grounded_call_share")
    }


def evaluated_packages(families: dict[str, str], unseen_max: int) -> set[str]:
    """The held-out packages to evaluate: every seen-family one, and the first ``unseen_max`` unseen
    ones by env id (a content hash: an arbitrary but fixed sample)."""
    unseen = sorted(e for e, f in families.items() if f == "unseen")[:unseen_max]
    return {e for e, f in families.items() if f == "seen"} | set(unseen)


def evaluate_stage(
    settings: Any,
    folder: Path,
    *,
    k: int,
    trials: int,
    seed: int,
    families: dict[str, str] | None = None,
    only: set[str] | None = None,
) -> dict[str, Any]:
    from trainer.evaluate import run_eval

    with contextlib.redirect_stdout(sys.stderr):  # run_eval's progress bar: keep stdout for the JSON
        report = run_eval(settings, str(folder), k=k, trials=trials, seed=seed, only=only)
    o = report.overall

    def metric(m: Any) -> dict[str, Any] | None:
        return (
            None
            if m is None
            else {"mean": round(m.mean, 4), "ci95": [round(m.ci_low, 4), round(m.ci_high, 4)]}
        )

    return {
        **({"families": family_figures(report, families, k, seed)} if families is not None else {}),
        "packages": o.cases,
        "trials_per_package": report.trials,
        "trials": o.trials,
        "f1": metric(o.f1),
        "pass^1": metric(o.pass_hat[1]),
        **({f"pass^{k}": metric(o.pass_hat[k])} if k > 1 else {}),
        f"pass@{k}": metric(o.pass_at_k),
        "mean_turns": round(o.mean_turns, 3),
        "mean_tool_calls": round(o.mean_tool_calls, 3),
        **call_shares(o),
        "trial_errors": sum(len(c.errors) for c in report.cases),
        "per_domain": {
            d.name: {"packages": d.cases, "f1": metric(d.f1), "pass^1": metric(d.pass_hat[1])}
            for d in report.domains
        },
        "eval_s": report.wall_s,
    }


@contextlib.contextmanager
def arena_home(home: Path | None, keep: bool) -> Iterator[tuple[Path, bool]]:
    """(home, whether the demo must run there): the given one, or a temporary one."""
    if home is not None:
        yield home, not (home / "catalog.db").exists()
        return
    if keep:
        yield Path(tempfile.mkdtemp(prefix="arena-learning-")) / "home", True
        return
    with tempfile.TemporaryDirectory(prefix="arena-learning-") as tmp:
        yield Path(tmp) / "home", True


# --- the benchmark --------------------------------------------------------------------------------
def bench(p: Profile, profile: str, home: Path, run_demo: bool, stop_stack: bool) -> dict[str, Any]:
    started = time.perf_counter()
    work = home.parent / "bench-learning"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "arena.log"
    base_env = cli_env(
        home,
        ARENA_ENVS__DEMO_INSTANCES=str(p.demo_instances),
        ARENA_ENVS__HELDOUT_K=str(p.heldout_k),
        ARENA_ENVS__HELDOUT_FAMILIES_K=str(p.heldout_families_k),
        ARENA_ENVS__EXTRA_PARAMS=str(p.extra_params),
    )
    os.environ.update({k: v for k, v in base_env.items() if k.startswith("ARENA_")})
    timings: dict[str, float] = {}
    try:
        t = time.perf_counter()
        if run_demo:
            console.rule("arena demo")
            demo = ["demo", "--timeout", "1200", "--tracks", p.demo_tracks]
            check(run_cli(demo, base_env, log, label="demo")[0], "arena demo", log)
            timings["demo_s"] = round(time.perf_counter() - t, 1)
        return _after_demo(p, profile, home, work, log, base_env, timings, started)
    finally:
        if stop_stack:
            subprocess.run([ARENA, "down"], env=base_env, capture_output=True, check=False)


def _after_demo(
    p: Profile,
    profile: str,
    home: Path,
    work: Path,
    log: Path,
    base_env: dict[str, str],
    timings: dict[str, float],
    started: float,
) -> dict[str, Any]:
    from app.stack import resolve_broker
    from arena.config import ArenaSettings
    from environments.render import render_text
    from streams.admin import ensure_topics
    from trainer.evaluate import heldout_cases

    settings = ArenaSettings()
    bootstrap, _ = resolve_broker(settings, start=True)
    ensure_topics(bootstrap)
    tag = f"b{int(time.time())}"

    # SFT data: the demo's samples.sft plus synthetic train-split env trajectories.
    console.rule("data")
    t = time.perf_counter()
    env_sft, built = asyncio.run(env_trajectories(settings))
    in_sft_before = topic_values(bootstrap, "samples.sft")
    demo_sft = [
        v for v in in_sft_before if v.get("source") != SFT_SOURCE
    ]  # a reused home: earlier runs' copies
    verified = [
        v for v in topic_values(bootstrap, "samples.verified") if not v["sample_id"].startswith("cp-")
    ]
    heldout = heldout_cases(settings)
    sft_ids = sft_share(sorted(s.origin_id or "" for s in env_sft), p.sft_share, p.seed)
    # Copy ids follow the seed, not the run's tag: the same ids land on the same partitions in the
    # same order every run, so the trainer's batches (and SFT's figure) are reproducible.
    sft_records = copies(
        [s for s in env_sft if s.origin_id in sft_ids], p.sft_copies, p.seed, f"s{p.seed}-sft"
    )
    asyncio.run(publish_all(bootstrap, "samples.sft", sft_records))
    from arena.records.envs import VerifiedSample

    # GRPO prompts: the packages SFT never saw, or every train package when SFT saw them all (the
    # demo's one pass over every train package is in the topic already; the copies are of these).
    rl_pool = sorted(
        (
            VerifiedSample.model_validate(v)
            for v in verified
            if v["env_ref"] not in sft_ids or p.sft_share >= 1.0
        ),
        key=lambda v: v.sample_id,  # the topic's read order depends on the demo's timing
    )
    rl_records = copies(rl_pool, p.rl_copies, p.seed, f"s{p.seed}-rl")[len(rl_pool) :]
    asyncio.run(publish_all(bootstrap, "samples.verified", rl_records))
    in_sft_topic = len(in_sft_before) + len(sft_records)
    sft_steps = min(p.sft_max_steps, in_sft_topic // p.sft_batch)
    timings["data_s"] = round(time.perf_counter() - t, 1)
    console.print(
        f"{built['trajectories']} env trajectories from {built['train_packages']} train packages; "
        f"samples.sft {in_sft_topic} records -> {sft_steps} SFT steps; {len(heldout)} held-out packages"
    )

    # The policy: a tiny model built here, or a pretrained one.
    t = time.perf_counter()
    if p.policy == "tiny":
        base_dir = work / f"{tag}-base"
        texts = [render_text(s.messages, s.tools) for s in env_sft]
        model_info = build_model(settings, base_dir, texts, p)
    else:
        base_dir, model_info = pretrained_model(settings, p)
    model_info["policy"] = p.policy
    model_info["backend"] = rollout_backend(p)
    timings["build_model_s"] = round(time.perf_counter() - t, 1)
    console.print(f"{p.policy} model: {model_info['parameters']:,} parameters")

    # Rollout limits of the evaluation follow settings.train: match the trainer's.
    settings = settings.model_copy(  # settings are frozen: change a copy
        update={
            "train": settings.train.model_copy(
                update={
                    "max_turns": p.max_turns,
                    "max_new_tokens": p.max_new_tokens,
                    "max_seq_len": p.max_seq_len,
                    "temperature": p.temperature,
                }
            )
        }
    )
    stages: dict[str, Any] = {}
    console.rule("eval: base")
    families = tool_families(settings)
    only = evaluated_packages(families, p.unseen_max)
    unseen_total = sum(1 for f in families.values() if f == "unseen")
    stages["base"] = evaluate_stage(
        settings, base_dir, k=p.k, trials=p.trials, seed=p.seed, families=families, only=only
    )

    # SFT.
    console.rule(f"SFT: {sft_steps} steps")
    t = time.perf_counter()
    sft_run = f"{tag}-sft"
    env = train_env(base_env, p, run=sft_run, model=str(base_dir), sft_steps=str(sft_steps))
    check(run_cli(["train", "--steps", str(sft_steps)], env, log, label="sft")[0], "arena train (sft)", log)
    timings["sft_s"] = round(time.perf_counter() - t, 1)
    sft_step, sft_dir = final_weights(settings, sft_run, work / f"{tag}-sft-weights")
    sft_rows = step_metrics(settings, sft_run)
    losses = [r["loss"] for r in sft_rows if r["phase"] == "sft"]
    console.rule("eval: SFT")
    stages["sft"] = evaluate_stage(
        settings, sft_dir, k=p.k, trials=p.trials, seed=p.seed, families=families, only=only
    ) | {"weights_step": sft_step}

    # GRPO with the F1 reward from the SFT weights.
    runs: dict[str, dict[str, Any]] = {}
    for reward, steps, budget in (
        ("f1", p.grpo_steps, p.grpo_budget_s),
        ("recall", p.ablation_steps, p.ablation_budget_s),
        ("precision", p.ablation_steps, p.ablation_budget_s),
    ):
        console.rule(f"GRPO ({reward}): up to {steps} steps / {budget:.0f} s")
        t = time.perf_counter()
        run = f"{tag}-grpo-{reward}"
        env = train_env(base_env, p, run=run, model=str(sft_dir), sft_steps="0", reward=reward)
        code, stopped = run_cli(
            ["train", "--steps", str(steps), "--until-drained"], env, log, budget_s=budget, label=reward
        )
        if not (stopped and code == -signal.SIGTERM):
            # A SIGTERM that lands outside the service's handlers (loading, shutting down) ends the
            # process by default; the weights of the finished steps are in the lake all the same.
            check(code, f"arena train (grpo {reward})", log)
        step, folder = final_weights(settings, run, work / f"{run}-weights", start=sft_dir)
        rows = step_metrics(settings, run)
        runs[reward] = {
            "run": run,
            "wall_s": round(time.perf_counter() - t, 1),
            "stopped_by_time_budget": stopped,
            "weights_step": step,
            "rollouts": grpo_summary(rows),
            "folder": folder,
            "rows": rows,
        }
        if reward == "f1":
            console.rule("eval: GRPO")
            stages["grpo"] = evaluate_stage(
                settings, folder, k=p.k, trials=p.trials, seed=p.seed, families=families, only=only
            ) | {"weights_step": step}
    timings["grpo_and_ablations_s"] = round(sum(r["wall_s"] for r in runs.values()), 1)

    # Reward ablation: turns and tool calls of the rollouts (same number of steps for each reward)
    # and of a held-out evaluation of each run's final weights.
    ablation: dict[str, Any] = {}
    n_common = min(runs[r]["rollouts"]["steps"] for r in runs)
    for reward in ("f1", "recall", "precision"):
        info = runs[reward]
        grpo_rows = [r for r in info["rows"] if r["phase"] == "grpo"][:n_common]
        console.rule(f"eval: ablation {reward}")
        ev = (
            stages["grpo"]
            if reward == "f1" and p.ablation_trials == p.trials
            else evaluate_stage(
                settings, info["folder"], k=1, trials=p.ablation_trials, seed=p.seed + 1, only=only
            )
        )
        ablation[reward] = {
            "grpo_steps": info["rollouts"]["steps"],
            "steps_with_update": info["rollouts"]["steps_with_update"],
            "weights_step": info["weights_step"],
            f"rollout_turns_mean_first_{n_common}_steps": _mean(grpo_rows, "turns_mean"),
            f"rollout_tool_calls_mean_first_{n_common}_steps": _mean(grpo_rows, "tool_calls_mean"),
            f"rollout_reward_mean_first_{n_common}_steps": _mean(grpo_rows, "reward_mean"),
            "rollout_turns_mean_last_step": _mean(grpo_rows[-1:], "turns_mean"),
            "eval_mean_turns": ev["mean_turns"],
            "eval_mean_tool_calls": ev["mean_tool_calls"],
            "eval_f1": ev["f1"],
            "eval_trials": ev["trials"],
        }
    key = f"rollout_turns_mean_first_{n_common}_steps"
    rec, prec = ablation["recall"][key], ablation["precision"][key]
    updated = all(ablation[r]["steps_with_update"] > 0 for r in ("recall", "precision"))

    def order(a: str, b: str, metric: str) -> bool | None:
        x, y = stages[a].get(metric), stages[b].get(metric)
        return None if x is None or y is None else x["mean"] < y["mean"]

    return {
        "bench": "learning",
        "quick": profile == "quick",
        "profile": profile,
        "device": "cpu",
        "torch_threads": _torch_threads(),
        "model": model_info,
        "data": {
            "demo": {
                "ran_here": "demo_s" in timings,  # False: --home reused a finished demo
                "instances_per_knowledge_base": p.demo_instances,
                "heldout_k": p.heldout_k,
                "heldout_families_k": p.heldout_families_k,
                "extra_params": p.extra_params,
            },
            "train_packages": built["train_packages"],
            "heldout_packages": len(heldout),
            "heldout_seen_packages": len(families) - unseen_total,
            "heldout_unseen_packages": unseen_total,
            "unseen_packages_evaluated": min(unseen_total, p.unseen_max),
            "samples_sft": {
                "demo_sft_track": len(demo_sft),
                "synthetic_env_trajectories": built["trajectories"],
                "synthetic_skipped": built["skipped"],
                "sft_share_packages": len(sft_ids),
                "synthetic_copies": p.sft_copies,
                "records_in_topic": in_sft_topic,
                "note": "synthetic trajectories are built from TRAIN-split packages only (job invocations, "
                "real sandbox outputs, final answer a0), and SFT sees only its share of them; held-out "
                "packages are never used for training",
            },
            "samples_verified": {
                "demo": len(verified),
                "grpo_share_packages": len(rl_pool),
                "copies": p.rl_copies,
                "records_in_topic": len(verified) + len(rl_records),
            },
        },
        "train": {
            "sft": {
                "steps": len(losses),
                "batch": p.sft_batch,
                "lr": p.sft_lr,
                "loss_first": round(losses[0], 4) if losses else None,
                "loss_last": round(losses[-1], 4) if losses else None,
                "wall_s": timings["sft_s"],
            },
            "grpo": {
                "reward": "f1",
                "lr": p.lr,
                "group_size": p.group_size,
                "batch_groups": p.batch_groups,
                "mixing": p.mixing,
                "max_turns": p.max_turns,
                "max_new_tokens": p.max_new_tokens,
                "wall_s": runs["f1"]["wall_s"],
                "stopped_by_time_budget": runs["f1"]["stopped_by_time_budget"],
                **runs["f1"]["rollouts"],
            },
        },
        "heldout_eval": {
            "k": p.k,
            "ci": "95% percentile bootstrap over packages (trainer.evaluate)",
            "temperature": p.temperature,
            **stages,
        },
        # Held-out instances of tool families seen in training vs families never seen (issue 16):
        # per stage mean F1 with its 95% bootstrap interval, pass@1 and pass^4 (None below 4 trials).
        **{
            family: {stage: stages[stage]["families"][family] for stage in ("base", "sft", "grpo")}
            for family in ("seen", "unseen")
        },
        "ordering": {
            "seen_f1_sft_gt_base_ci_disjoint": _disjoint_above(stages, "sft", "base"),
            "seen_f1_grpo_gt_sft_ci_disjoint": _disjoint_above(stages, "grpo", "sft"),
            "f1_base_lt_sft": order("base", "sft", "f1"),
            "f1_sft_lt_grpo": order("sft", "grpo", "f1"),
            "pass1_base_lt_sft": order("base", "sft", "pass^1"),
            "pass1_sft_lt_grpo": order("sft", "grpo", "pass^1"),
            "note": "strict comparisons of means; overlapping intervals mean the difference is not significant",
        },
        "reward_ablation": {
            **ablation,
            "astra_expectation": "recall-only -> more turns / tool calls; precision-only -> fewer",
            "recall_turns_gt_precision_turns": None if rec is None or prec is None else rec > prec,
            "comparison_meaningful": updated,
            "comparison_note": "turns are compared over the first steps every run reached; when a run made no "
            "update (every group had zero reward variance) its turns are the SFT policy's and the comparison "
            "says nothing about the reward",
        },
        "profile_knobs": asdict(p),
        "timings_s": timings | {"total_s": round(time.perf_counter() - started, 1)},
    }


def _disjoint_above(stages: dict[str, Any], upper: str, lower: str) -> bool | None:
    """Seen families: ``upper``'s F1 interval lies wholly above ``lower``'s (None without figures)."""
    a, b = stages[upper]["families"]["seen"]["f1_ci"], stages[lower]["families"]["seen"]["f1_ci"]
    return None if a is None or b is None else a[0] > b[1]


STAGES = ("base", "sft", "grpo")


def plot(result: dict[str, Any], path: Path) -> Path:
    """Held-out mean F1 (95% interval) and pass@1 per stage, seen and unseen families, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display; files only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, family in zip(axes, ("seen", "unseen"), strict=True):
        figures = [result[family][stage] for stage in STAGES]
        xs = range(len(STAGES))
        f1 = [f["f1"] or 0.0 for f in figures]
        err = [
            [m - f["f1_ci"][0] if f["f1_ci"] else 0.0 for m, f in zip(f1, figures, strict=True)],
            [f["f1_ci"][1] - m if f["f1_ci"] else 0.0 for m, f in zip(f1, figures, strict=True)],
        ]
        ax.bar([x - 0.2 for x in xs], f1, 0.4, yerr=err, capsize=4, label="mean F1 (95% CI)")
        ax.bar([x + 0.2 for x in xs], [f["pass1"] or 0.0 for f in figures], 0.4, label="pass@1")
        ax.set_xticks(list(xs), ["base", "SFT", "SFT+GRPO"])
        ax.set_title(f"held-out, {family} tool families ({figures[0]['packages']} packages)")
    axes[0].set_ylabel("score")
    axes[1].legend(loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    tmp.replace(path)  # atomic: never a torn PNG
    return path


def gpu_refusal(p: Profile, quick: bool) -> str | None:
    """Why the full SmolLM2 profile does not start here (no GPU, or no local-llm extra), or None."""
    if p.policy == "tiny":
        return None
    from arena.llm.local_models import LocalModelError, resolve

    try:
        resolve(p.policy)
    except LocalModelError as exc:
        return f"--policy {p.policy}: {exc}"
    import torch

    if not quick and not torch.cuda.is_available():
        return (
            f"--policy {p.policy} is the GPU profile (bf16, batches of {p.sft_batch}, {p.max_seq_len}-token "
            "sequences) and torch sees no GPU here (fix: run it on a GPU machine, or add --quick for a "
            "CPU smoke run of the same path)"
        )
    return None


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="base -> SFT -> GRPO learning benchmark (JSON on stdout).")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="A smoke run (env track only, tiny budgets): proves the bench works, measures nothing.",
    )
    parser.add_argument(
        "--home", type=Path, help="Reuse this ARENA_HOME (runs the demo there if it has none)."
    )
    parser.add_argument("--keep", action="store_true", help="Keep the temporary home (and stack) afterwards.")
    parser.add_argument(
        "--policy",
        choices=("tiny", "smollm2"),
        default="tiny",
        help="tiny: a small Llama built here (CPU); smollm2: the pretrained SmolLM2-135M-Instruct "
        "(local-llm extra), the GPU profile (bf16, vLLM rollouts where installed); with --quick a CPU "
        "smoke run of the same path.",
    )
    parser.add_argument("--sft-steps", type=int, help="Cap on SFT steps.")
    parser.add_argument("--grpo-steps", type=int, help="GRPO steps of the F1 run.")
    parser.add_argument("--grpo-minutes", type=float, help="Time budget of the F1 GRPO run.")
    parser.add_argument("--ablation-steps", type=int, help="GRPO steps of each reward-ablation run.")
    parser.add_argument("--trials", type=int, help="Evaluation trials per held-out package.")
    parser.add_argument("--lr", type=float, help="GRPO learning rate.")
    parser.add_argument("--seed", type=int, help="Seed of the model, data order and evaluation.")
    parser.add_argument(
        "--plot",
        type=Path,
        default=Path(tempfile.gettempdir()) / "bench-learning.png",
        help="Where to write the PNG plot of the held-out figures (default: %(default)s).",
    )
    args = parser.parse_args(argv)
    name = "quick" if args.quick else "default"
    p = policy_profile(PROFILES[name], args.policy, args.quick)
    refused = gpu_refusal(p, args.quick)
    if refused:
        console.print(f"[red]{refused}[/red]")
        return 2
    updates: dict[str, Any] = {}
    for field, value in (
        ("sft_max_steps", args.sft_steps),
        ("grpo_steps", args.grpo_steps),
        ("grpo_budget_s", None if args.grpo_minutes is None else 60 * args.grpo_minutes),
        ("ablation_steps", args.ablation_steps),
        ("trials", args.trials),
        ("lr", args.lr),
        ("seed", args.seed),
    ):
        if value is not None:
            updates[field] = value
    p = replace(p, **updates)
    if p.trials < p.k:
        p = replace(p, k=p.trials)
    with arena_home(args.home, args.keep) as (home, run_demo):
        result = bench(p, name, home, run_demo, stop_stack=args.home is None and not args.keep)
    result["plot"] = str(plot(result, args.plot.resolve()))
    console.print(f"plot: {result['plot']}")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

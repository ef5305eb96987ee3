"""EigenData synthesis throughput, gates and repairs on the `rules` backend, handlers in-process (no broker).

Usage::

    python bench/eigen.py [--seeds N] [--concurrency C] [--error-prone P] [--policy-pressure Q]
                          [--demo-config] [--prompt-sets K] [--pool-size S] [--repeat R] [--seed S]
                          [--warmup W] [--audit] [--json-only] [--quick]

Prints ONE JSON object on stdout; progress and a summary table go to stderr.

Setup, per measured run and untimed: a fresh ``ARENA_HOME`` (its own catalog and LLM response
cache), the built-in pack recorded in the EigenCatalog, K prompt sets written (phase 1) with the
given generator parameters and put straight into phase 3 (no pilot), N seeds made by
``producers.publish_domain.seed_items``, the sandbox pool started. Then every seed goes through
the handlers of the five stages the Faust workers run (``streams.runtime.run_handler``, so a
crash is a dead letter, as in a worker)::

    eigen-intents -> eigen-tasks -> eigen-dialogs -> eigen-dialogs-validated -> eigen-verified

``baseline``
    one item at a time, each through all five stages before the next (sequential).
``candidate``
    the same seeds, C items in flight at once (asyncio; each item still goes through the stages
    in order), as several partitions / workers give the real system. Same pool size.

Figures: accepted dialogues per minute (dialogues that passed every gate, i.e. reached
``eigen.verified``); per gate (task_validation after at most 3 Modify rounds,
trajectory_validation after at most 3 repair rounds, verification, and dead letters) the items
rejected, as a share of the items that reached it and of the seeds; the repair success rate of
tasks and dialogues whose first verdict failed, and their mean Modify rounds.
ratio = candidate / baseline accepted dialogues per minute. The rules backend is deterministic,
so both runs must end every seed the same way and accept the same dialogues: checked, exit
status 1 when not. Dialogues are compared with wall-clock timestamps and UUIDs masked: the pack's
tools stamp them into the database (the verifier SKIPs such fields), so the content-hashed item
ids from eigen.dialogs on differ between runs (reported as ``same_emitted_item_ids``). A short
untimed warm-up run (its own home) comes first. The machine's load drifts: ``--repeat R`` runs R
baseline/candidate pairs, interleaved, and reports the median of their ratios (and each pair).

The phase-3 drift audit still records every item's figures, but its audit points are made too
large to form (``eigen.audit_batch`` = 1000) unless ``--audit``: a drifting set is re-piloted
mid-run, and when that happens depends on the order items arrive in, which differs between the
two runs.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from arena.config import ArenaSettings
    from arena.records.eigen import EigenSeed

REPO_ROOT = Path(__file__).resolve().parent.parent
PACK = "customer_service"
QUICK_SEEDS = 2
"""Seeds of a ``--quick`` run: one per prompt set (the default 2), each through the five stages."""
GATES = {  # gate -> the stage that applies it
    "task_validation": "eigen-tasks",
    "trajectory_validation": "eigen-dialogs-validated",
    "verification": "eigen-verified",
}
DEAD_LETTER = "dead_letter"
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:[+-]\d\d:\d\d|Z)?")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
AUDIT_OFF = 1000  # eigen.audit_batch: no audit point ever forms, so no set drifts mid-run

console = Console(stderr=True)


# --------------------------------------------------------------------------- log capture


class Captured(logging.Handler):
    """Warnings and errors the stages log (kept off the terminal), and the tracebacks of crashes."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()
        self.samples: dict[str, list[str]] = defaultdict(list)
        self.tracebacks: dict[tuple[str, str], str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self.counts[record.name] += 1
        if len(self.samples[record.name]) < 3:
            self.samples[record.name].append(record.getMessage()[:300])
        # streams.runtime.run_handler: log.exception("stage %s crashed on %s", stage.name, source_key)
        if record.exc_info and record.name == "arena.stage" and isinstance(record.args, tuple):
            stage, key = (str(a) for a in record.args[:2])
            self.tracebacks[(stage, key)] = "".join(traceback.format_exception(*record.exc_info))


# --------------------------------------------------------------------------- one run


@dataclass
class Tally:
    """Everything one run saw, per seed and per gate."""

    outcomes: dict[str, str] = field(
        default_factory=dict
    )  # seed id -> accepted:<fingerprint> | <gate>@<stage>
    accepted: set[str] = field(default_factory=set)  # eigen.verified item ids (as emitted)
    accepted_dialogues: set[str] = field(default_factory=set)  # fingerprints of the accepted dialogues
    reached: Counter[str] = field(default_factory=Counter)  # stage -> items that entered it
    rejected: Counter[str] = field(default_factory=Counter)  # gate -> items it dropped
    reasons: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    task_rounds: list[tuple[int, bool]] = field(default_factory=list)  # (Modify rounds, accepted)
    dialog_rounds: list[tuple[int, bool]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    topics: Counter[str] = field(default_factory=Counter)  # every emit, by topic
    handler_s: defaultdict[str, float] = field(
        default_factory=lambda: defaultdict(float)
    )  # stage -> summed handler seconds
    heldout: int = 0


def fingerprint(data: dict[str, Any]) -> str:
    """A hash of a payload with wall-clock timestamps and UUIDs masked.

    The pack's tools stamp ``created_at`` with the clock and ``uuid`` with ``uuid4()`` (fields the
    verifier SKIPs), so the dialogue's final state and tool results, hence the content-hashed item
    ids from eigen.dialogs on, differ between two runs of the same seed; everything else is the
    rules backend's deterministic output.
    """
    text = json.dumps(data, sort_keys=True)
    masked = UUID.sub("<uuid>", TIMESTAMP.sub("<timestamp>", text))
    return hashlib.sha256(masked.encode()).hexdigest()[:20]


def settings_for(home: Path, args: argparse.Namespace) -> ArenaSettings:
    from arena.config import ArenaSettings

    settings = ArenaSettings(home=home, llm="rules", catalog_url=None, seed=args.seed)
    audit_batch = settings.eigen.audit_batch if args.audit else AUDIT_OFF
    return settings.model_copy(  # settings are frozen: change a copy
        update={
            "sandbox": settings.sandbox.model_copy(update={"pool_size": args.pool_size}),
            "eigen": settings.eigen.model_copy(update={"audit_batch": audit_batch}),
        }
    )


async def prepare(settings: ArenaSettings, args: argparse.Namespace, count: int) -> list[EigenSeed]:
    """Pack in the catalog, K prompt sets in phase 3, ``count`` seeds; the sandbox pool started."""
    from producers.publish_domain import resolve_pack, seed_items
    from streams import resources
    from synthesis.eigen.evolution import make_prompt_sets
    from synthesis.eigen.items import pack_id_of
    from synthesis.eigen.roles.tasks import PoolParams

    pack = resolve_pack(args.pack)
    store = resources.eigen_store_for(settings)
    gateway = resources.gateway_for(settings)
    pack_id = pack_id_of(pack)
    await asyncio.to_thread(store.record_pack, pack_id, pack.name, pack.model_dump_json())
    state = pack.generate(settings.seed, args.size)
    params = PoolParams(error_prone_parameters=args.error_prone, policy_pressure=args.policy_pressure)
    sets = await make_prompt_sets(
        args.prompt_sets,
        gateway=gateway,
        pack=pack,
        state=state,
        params=params,
        catalog=gateway.catalog,
        store=store,
    )
    for prompt_set in sets:  # phase 3: large-scale generation (no pilot: the knobs stay as given)
        await asyncio.to_thread(store.set_phase, prompt_set.set_id, 3)
    await resources.sandbox_pool_for(settings)  # warm before the clock starts
    return seed_items(pack_id, pack.name, sets, count, base_seed=args.seed, size=args.size)


async def drive(seed: EigenSeed, settings: ArenaSettings, tally: Tally, captured: Captured) -> None:
    """One seed through the five stages, in order, until a gate drops it or it is verified."""
    from arena.records.common import DeadLetter, Rejection
    from arena.records.eigen import EigenItem
    from arena.topics import topic
    from streams.eigen import (
        eigen_dialogs,
        eigen_dialogs_validated,
        eigen_intents,
        eigen_tasks,
        eigen_verified,
    )
    from streams.runtime import Context, StageDef, run_handler

    plan: tuple[tuple[StageDef[Any], str], ...] = (
        (eigen_intents.STAGE, "eigen.intents"),
        (eigen_tasks.STAGE, "eigen.tasks"),
        (eigen_dialogs.STAGE, "eigen.dialogs"),
        (eigen_dialogs_validated.STAGE, "eigen.dialogs.validated"),
        (eigen_verified.STAGE, "eigen.verified"),
    )
    item: EigenItem[Any] = seed
    dialogue = ""
    for stage, produces in plan:
        tally.reached[stage.name] += 1
        raw = item.model_dump_json().encode()
        ctx = Context(stage.name, stage.version, topic(stage.input), item.item_id, settings, raw)
        started = time.perf_counter()
        emits = await run_handler(stage, item, ctx, raw)
        tally.handler_s[stage.name] += time.perf_counter() - started
        following: list[EigenItem[Any]] = []
        ended: str | None = None
        for emit in emits:
            tally.topics[emit.topic] += 1
            value = emit.value
            if emit.topic == produces and isinstance(value, EigenItem):
                following.append(value)
            elif emit.topic.endswith(".rejected") and isinstance(value, Rejection):
                tally.rejected[value.gate] += 1
                tally.reasons[value.gate][value.reason[:120]] += 1
                rounds = value.details.get("rounds")
                if value.gate == "task_validation" and isinstance(rounds, int):
                    tally.task_rounds.append((rounds, False))
                elif value.gate == "trajectory_validation" and isinstance(rounds, int):
                    tally.dialog_rounds.append((rounds, False))
                ended = f"{value.gate}@{stage.name}"
            elif emit.topic.endswith(".dlq") and isinstance(value, DeadLetter):
                tally.rejected[DEAD_LETTER] += 1
                tally.reasons[DEAD_LETTER][f"{stage.name} {value.kind}: {value.reason[:100]}"] += 1
                tally.dead_letters.append(
                    {
                        "stage": stage.name,
                        "kind": str(value.kind),
                        "source_key": value.source_key,
                        "reason": value.reason[:1000],
                        "traceback": captured.tracebacks.get((stage.name, item.item_id)),
                    }
                )
                ended = f"{DEAD_LETTER}:{value.kind}@{stage.name}"
        if ended is not None or len(following) != 1:
            tally.outcomes[seed.item_id] = ended or f"{len(following)} outputs@{stage.name}"
            return
        item = following[0]
        if produces == "eigen.tasks":
            tally.task_rounds.append((item.payload.repair_rounds, True))
        elif produces == "eigen.dialogs.validated":
            tally.dialog_rounds.append((item.payload.repair_rounds, True))
            dialogue = fingerprint(item.payload.model_dump(mode="json"))
        elif produces == "eigen.verified":
            tally.heldout += item.payload.split == "heldout"
    tally.accepted.add(item.item_id)
    tally.accepted_dialogues.add(dialogue)
    tally.outcomes[seed.item_id] = f"accepted:{dialogue}"


def llm_totals(settings: ArenaSettings) -> Counter[str]:
    from streams import resources

    usage = resources.gateway_for(settings).usage
    totals: Counter[str] = Counter()
    for role in usage.roles.values():
        totals.update(calls=role.calls, cache_hits=role.cache_hits, attempts=role.attempts)
    return totals


async def run(
    name: str, count: int, concurrency: int, args: argparse.Namespace, captured: Captured, keep: list[Any]
) -> tuple[dict[str, Any], Tally]:
    """Prepare a fresh home, then time ``count`` seeds through the stages, ``concurrency`` at a time."""
    from streams import resources

    with tempfile.TemporaryDirectory(prefix=f"arena-bench-eigen-{name}-") as tmp:
        settings = settings_for(Path(tmp), args)
        keep.append(settings)  # streams.resources keys per-process resources by id(settings)
        started = time.perf_counter()
        seeds = await prepare(settings, args, count)
        setup_s = time.perf_counter() - started
        before = llm_totals(settings)
        tally = Tally()
        gate = asyncio.Semaphore(concurrency)
        with Progress(
            TextColumn(f"{name:>9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[accepted]} accepted"),
            TimeElapsedColumn(),
            console=console,
            disable=args.json_only,
        ) as progress:
            bar = progress.add_task(name, total=len(seeds), accepted=0)

            async def one(seed: EigenSeed) -> None:
                async with gate:
                    await drive(seed, settings, tally, captured)
                progress.update(bar, advance=1, accepted=len(tally.accepted))

            started = time.perf_counter()
            await asyncio.gather(*(one(seed) for seed in seeds))
            wall = time.perf_counter() - started
        llm = llm_totals(settings) - before
        await resources.close_sandbox_pool(settings)
        await resources.gateway_for(settings).aclose()
        resources.eigen_store_for(settings).dispose()
    accepted = len(tally.accepted)
    figures = {
        "seeds": len(seeds),
        "concurrency": concurrency,
        "setup_s": round(setup_s, 3),
        "wall_s": round(wall, 3),
        "accepted_dialogues": accepted,
        "accepted_dialogues_per_minute": round(60 * accepted / wall, 2) if wall else 0.0,
        "seeds_per_minute": round(60 * len(seeds) / wall, 2) if wall else 0.0,
        "heldout_instances": tally.heldout,
        "samples_verified": tally.topics["samples.verified"],
        "samples_sft": tally.topics["samples.sft"],
        "repilots": tally.topics["eigen.pilot.metrics"],
        "handler_seconds_summed": {s: round(v, 3) for s, v in tally.handler_s.items()},
        "llm": {"calls": llm["calls"], "cache_hits": llm["cache_hits"], "backend_requests": llm["attempts"]},
    }
    return figures, tally


# --------------------------------------------------------------------------- figures


def gate_figures(tally: Tally, seeds: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    names = [*GATES, DEAD_LETTER, *sorted(set(tally.rejected) - {*GATES, DEAD_LETTER})]
    for gate in names:
        stage = GATES.get(gate)
        reached = tally.reached[stage] if stage else seeds
        n = tally.rejected[gate]
        out[gate] = {
            "stage": stage or ("any" if gate == DEAD_LETTER else "?"),
            "reached": reached,
            "rejected": n,
            "share_of_reached": round(n / reached, 3) if reached else 0.0,
            "share_of_seeds": round(n / seeds, 3) if seeds else 0.0,
            "top_reasons": [{"reason": r, "count": c} for r, c in tally.reasons[gate].most_common(3)],
        }
    return out


def repair_figures(rounds: list[tuple[int, bool]]) -> dict[str, Any]:
    """Of the items whose first verdict failed (>= 1 Modify round), the share accepted in the end."""
    failed_first = [(r, ok) for r, ok in rounds if r >= 1]
    repaired = sum(ok for _, ok in failed_first)
    return {
        "judged": len(rounds),
        "passed_first_time": sum(ok and r == 0 for r, ok in rounds),
        "failed_first_time": len(failed_first),
        "repaired": repaired,
        "repair_success_rate": round(repaired / len(failed_first), 3) if failed_first else None,
        "mean_modify_rounds": round(statistics.fmean(r for r, _ in rounds), 3) if rounds else None,
        "mean_modify_rounds_failed_first": (
            round(statistics.fmean(r for r, _ in failed_first), 3) if failed_first else None
        ),
        "mean_modify_rounds_repaired": (
            round(statistics.fmean(r for r, ok in failed_first if ok), 3) if repaired else None
        ),
    }


def show(result: dict[str, Any]) -> None:
    runs = Table(title="EigenData track, rules backend (in-process stage handlers)")
    for column in ("run", "seeds", "in flight", "wall s", "accepted", "accepted/min", "LLM calls", "hits"):
        runs.add_column(column, justify="right" if column != "run" else "left")
    for name in ("baseline", "candidate"):
        r = result[name]
        runs.add_row(
            name,
            str(r["seeds"]),
            str(r["concurrency"]),
            f"{r['wall_s']:.1f}",
            str(r["accepted_dialogues"]),
            f"{r['accepted_dialogues_per_minute']:.1f}",
            str(r["llm"]["calls"]),
            str(r["llm"]["cache_hits"]),
        )
    console.print(runs)
    gates = Table(title="gates (baseline run)")
    for column in ("gate", "stage", "reached", "rejected", "of reached", "of seeds"):
        gates.add_column(column, justify="left" if column in ("gate", "stage") else "right")
    for gate, g in result["gates"].items():
        gates.add_row(
            gate,
            g["stage"],
            str(g["reached"]),
            str(g["rejected"]),
            f"{g['share_of_reached']:.1%}",
            f"{g['share_of_seeds']:.1%}",
        )
    console.print(gates)
    for kind, r in result["repair"].items():
        rate = "n/a" if r["repair_success_rate"] is None else f"{r['repair_success_rate']:.1%}"
        console.print(
            f"repair {kind}: {r['repaired']}/{r['failed_first_time']} failing first, fixed by Modify "
            f"({rate}); mean Modify rounds {r['mean_modify_rounds']}",
            highlight=False,
        )
    det = result["determinism"]
    colour = "green" if det["same_accepted_dialogues"] and det["same_outcomes"] else "red"
    console.print(
        f"[{colour}]same accepted dialogues: {det['same_accepted_dialogues']}, same outcome per seed: "
        f"{det['same_outcomes']}[/{colour}]   ratio accepted/min candidate/baseline "
        f"(median of {len(result['repeats'])}): "
        f"[bold]{result['ratio_accepted_dialogues_per_minute']}[/bold]"
    )
    crashes = [d for d in result["dead_letters"] if d["traceback"]]
    for d in crashes:
        console.print(f"[red]crash in {d['stage']}[/red] on {d['source_key']}:", highlight=False)
        console.print(d["traceback"], markup=False, highlight=False)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    captured = Captured()
    root = logging.getLogger()
    root.addHandler(captured)
    root.setLevel(logging.WARNING)
    keep: list[Any] = []
    started = time.perf_counter()
    if args.warmup:
        await run("warm-up", args.warmup, args.concurrency, args, captured, keep)
    warmup_s = time.perf_counter() - started
    pairs = []  # (baseline, candidate), interleaved so that drift in the machine's load hits both alike
    for _ in range(args.repeat):
        pairs.append(
            (
                await run("baseline", args.seeds, 1, args, captured, keep),
                await run("candidate", args.seeds, args.concurrency, args, captured, keep),
            )
        )
    root.removeHandler(captured)
    (base_figures, base), (cand_figures, cand) = pairs[0]
    repeats = [
        {
            "baseline_wall_s": b["wall_s"],
            "candidate_wall_s": c["wall_s"],
            "baseline_per_minute": b["accepted_dialogues_per_minute"],
            "candidate_per_minute": c["accepted_dialogues_per_minute"],
            "ratio": round(c["accepted_dialogues_per_minute"] / b["accepted_dialogues_per_minute"], 3)
            if b["accepted_dialogues_per_minute"]
            else None,
        }
        for (b, _), (c, _) in pairs
    ]
    ratios = [r["ratio"] for r in repeats if r["ratio"] is not None]
    cand_rate = statistics.median(r["candidate_per_minute"] for r in repeats)
    others = [t for pair in pairs for _, t in pair][1:]
    differing = sorted({s for t in others for s in base.outcomes if base.outcomes[s] != t.outcomes.get(s)})
    gates = gate_figures(base, args.seeds)
    return {
        "benchmark": "eigen",
        "backend": "rules",
        "quick": args.quick,
        "params": {
            "pack": args.pack,
            "seeds": args.seeds,
            "concurrency": args.concurrency,
            "error_prone_parameters": args.error_prone,
            "policy_pressure": args.policy_pressure,
            "prompt_sets": args.prompt_sets,
            "db_size": args.size,
            "pool_size": args.pool_size,
            "seed": args.seed,
            "phase3_audit": args.audit,
            "warmup_seeds": args.warmup,
            "repeat": args.repeat,
        },
        "accepted_dialogues_per_minute": cand_rate,
        "ratio_accepted_dialogues_per_minute": round(statistics.median(ratios), 3) if ratios else None,
        "repeats": repeats,
        "baseline": base_figures,
        "candidate": cand_figures,
        "gates": gates,
        "repair": {
            "tasks": repair_figures(base.task_rounds),
            "dialogues": repair_figures(base.dialog_rounds),
        },
        "determinism": {
            "runs_compared": 1 + len(others),
            "same_accepted_dialogues": all(t.accepted_dialogues == base.accepted_dialogues for t in others),
            "same_outcomes": not differing,
            "same_emitted_item_ids": all(t.accepted == base.accepted for t in others),
            "gates_equal": all(gate_figures(t, args.seeds) == gates for t in others),
            "differing_seeds": [
                {"seed": s, "first_baseline": base.outcomes[s], "candidate": cand.outcomes.get(s)}
                for s in differing[:10]
            ],
        },
        "outcomes": dict(Counter(o.split(":")[0] for o in base.outcomes.values())),
        "dead_letters": [{**d, "run": "baseline"} for d in base.dead_letters]
        + [{**d, "run": "candidate"} for d in cand.dead_letters],
        "log_warnings": {
            name: {"count": n, "samples": captured.samples[name]} for name, n in captured.counts.items()
        },
        "warmup_s": round(warmup_s, 3),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "note": (
            "Stage handlers of eigen-intents, eigen-tasks, eigen-dialogs, eigen-dialogs-validated and "
            "eigen-verified run in-process via streams.runtime.run_handler (no Kafka). baseline: one item at "
            "a time through all five stages; candidate: `concurrency` items in flight, same pool size. Each "
            "run has a fresh ARENA_HOME (catalog + LLM response cache: no hits carried over; the hits "
            "counted are repeats within the run) and a warm sandbox pool; setup (pack, prompt sets, pool "
            "start) is not timed. Accepted dialogues = items reaching eigen.verified (held-out ones "
            "included). Gate shares and repair figures are the baseline run's; determinism compares both "
            "(dialogues with wall-clock timestamps and UUIDs masked, see the module docstring). "
            "ratio = candidate / baseline accepted dialogues per minute."
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=24, help="seeds per run (N)")
    parser.add_argument("--concurrency", type=int, default=4, help="items in flight in the candidate run (C)")
    parser.add_argument(
        "--error-prone", type=float, default=0.5, help="PoolParams.error_prone_parameters (demo: 0.1)"
    )
    parser.add_argument(
        "--policy-pressure", type=float, default=0.5, help="PoolParams.policy_pressure (demo: 0.1)"
    )
    parser.add_argument(
        "--demo-config", action="store_true", help="the demo's generator parameters (0.1 / 0.1)"
    )
    parser.add_argument(
        "--prompt-sets", type=int, default=2, help="prompt sets the seeds go round-robin over (K)"
    )
    parser.add_argument("--pack", default=PACK, help="built-in pack name or pack folder")
    parser.add_argument("--size", default="small", choices=("small", "medium", "large"), help="database size")
    parser.add_argument("--pool-size", type=int, default=2, help="warm sandbox workers (both runs)")
    parser.add_argument("--warmup", type=int, default=2, help="seeds of the untimed warm-up run (0: none)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="baseline/candidate pairs, interleaved; the ratio is their median",
    )
    parser.add_argument("--seed", type=int, default=0, help="global seed (databases, draws)")
    parser.add_argument(
        "--audit", action="store_true", help="phase-3 drift audit as configured (re-pilots depend on order)"
    )
    parser.add_argument("--json-only", action="store_true", help="no progress bars or table on stderr")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {QUICK_SEEDS} seeds, concurrency 2, no warm-up; not a measurement",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.concurrency, args.warmup, args.repeat = QUICK_SEEDS, 2, 0, 1
    if args.demo_config:
        args.error_prone, args.policy_pressure = 0.1, 0.1
    if args.seeds < 1 or not 1 <= args.concurrency <= 64 or not 1 <= args.pool_size <= 64:
        parser.error("--seeds must be >= 1, --concurrency and --pool-size in [1, 64]")
    if args.warmup < 0 or args.repeat < 1:
        parser.error("--warmup must be >= 0 and --repeat >= 1")
    if not (0 <= args.error_prone <= 1 and 0 <= args.policy_pressure <= 1):
        parser.error("--error-prone and --policy-pressure are probabilities in [0, 1]")
    if not 1 <= args.prompt_sets <= 16:
        parser.error("--prompt-sets must be in [1, 16]")
    if os.geteuid() != 0:
        console.print("[red]benchmark failed[/red]: the sandbox needs root")
        return 1
    result = asyncio.run(bench(args))
    print(json.dumps(result, indent=2))
    if not args.json_only:
        show(result)
    det = result["determinism"]
    return 0 if det["same_accepted_dialogues"] and det["same_outcomes"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

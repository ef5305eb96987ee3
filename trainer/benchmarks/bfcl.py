"""``arena eval --bench bfcl``: the Berkeley Function-Calling Leaderboard on a model at a URL.

Each BFCL item (its question's messages and its function docs) is sent through Arena's own
OpenAI client path, the gateway's native ``agent_policy`` role (``trainer.endpoint_policy``): the
messages as chat messages, the functions as ``tools``. The reply's calls are read as the gateway
reads any reply (native ``tool_calls``, Hermes ``<tool_call>`` text, fenced or not), turned into
BFCL's ``[{name: {arg: value}}]`` and scored by bfcl-eval's own checker: the AST checker for the
simple, multiple, parallel and live categories, and "called or not" for (ir)relevance, exactly as
its ``eval_runner`` does. A do-nothing agent (no call) is scored by the same checker on every item.

bfcl-eval pins numpy, networkx and filelock below Arena's, so it lives in a second virtualenv
(``scripts/install_bfcl.sh`` -> ``.venv-bfcl``; ``ARENA_BFCL_PYTHON`` names another python).
``trainer/benchmarks/bfcl_checker.py`` runs there: it loads the questions and possible answers
bfcl-eval ships in its wheel (no network at run time) and checks the calls. A single-turn item's
trial is one reply. A multi-turn item's trial is an episode in ``trainer.benchmarks.bfcl_env``'s
``BfclEnvironment`` (bfcl-eval's simulated APIs executing each call, its scripted user turns, its
``multi_turn_checker`` as the verdict), driven by the same endpoint episode loop ``arena eval`` uses
for packs; the do-nothing agent answers every turn without a call.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field

from arena.llm.core import InvalidOutput
from arena.llm.roles.agent import PlannedCall
from trainer.benchmarks.bfcl_env import (
    MAX_STEPS_PER_TURN,
    BfclEnvironment,
    BfclRuntime,
    BfclUnavailable,
    MultiTurnItem,
)
from trainer.benchmarks.report import BenchReport, TaskResult, bench_report
from trainer.rollout import derive_seed

if TYPE_CHECKING:
    from arena.config import ArenaSettings
    from trainer.endpoint_policy import EndpointPolicy

REPO = Path(__file__).resolve().parents[2]
CHECKER = Path(__file__).with_name("bfcl_checker.py")
CHECKER_TIMEOUT_S = 600.0

MULTI_TURN: tuple[str, ...] = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
"""The multi-turn categories: episodes against bfcl-eval's simulated APIs (``bfcl_env``)."""
CATEGORIES: tuple[str, ...] = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
    "live_irrelevance",
    "live_relevance",
    *MULTI_TURN,
)
"""The single-turn Python categories bfcl-eval scores with its AST or relevance checker, and the
multi-turn ones."""
ALIASES: dict[str, tuple[str, ...]] = {"simple": ("simple_python",), "multi_turn": MULTI_TURN}
DEFAULT_CATEGORIES = "simple,multiple,parallel"

BfclCalls = list[dict[str, dict[str, Any]]]
"""A model's calls as bfcl-eval's checkers take them: ``[{name: {arg: value}}]``."""


class BfclError(Exception):
    """The BFCL evaluation cannot run (no bfcl virtualenv, an unknown category); says the fix."""


class BfclItem(BaseModel):
    """One BFCL test item, as bfcl-eval ships it."""

    id: Annotated[str, Field(description="bfcl-eval's item id, e.g. 'simple_python_0'.")]
    category: Annotated[str, Field(description="bfcl-eval's test category.")]
    messages: Annotated[list[dict[str, Any]], Field(description="The question's chat messages.")]
    functions: Annotated[list[dict[str, Any]], Field(description="The function docs, BFCL's format.")]
    tools: Annotated[
        list[dict[str, Any]], Field(description="The functions as OpenAI tools, as bfcl-eval sends them.")
    ]
    ground_truth: Annotated[
        list[dict[str, Any]] | None, Field(description="Possible answers (None: a relevance category).")
    ] = None


class BfclCheck(BaseModel):
    """bfcl-eval's verdict on one set of calls."""

    id: Annotated[str, Field(description="The item id.")]
    valid: Annotated[bool, Field(description="Whether the checker accepted the calls.")]
    errors: Annotated[list[str], Field(description="The checker's reasons when not valid.")] = []


def bfcl_python() -> Path:
    """The python of the bfcl-eval virtualenv: ``ARENA_BFCL_PYTHON``, else ``.venv-bfcl``."""
    return Path(os.environ.get("ARENA_BFCL_PYTHON") or REPO / ".venv-bfcl" / "bin" / "python")


def categories_of(spec: str) -> list[str]:
    """The bfcl-eval categories named in ``spec`` (comma-separated; 'simple' = 'simple_python')."""
    names = [n for c in spec.split(",") if c.strip() for n in ALIASES.get(c.strip(), (c.strip(),))]
    unknown = [c for c in names if c not in CATEGORIES]
    if unknown or not names:
        raise BfclError(
            f"--category {spec!r}: unknown {', '.join(unknown) or '(none given)'} "
            f"(fix: some of simple, {', '.join(CATEGORIES[1:])}, or multi_turn for all four multi-turn "
            "ones, comma-separated)"
        )
    return list(dict.fromkeys(names))


def _checker(args: list[str], stdin: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``bfcl_checker.py`` under the bfcl python; its one JSON answer."""
    python = bfcl_python()
    if not python.is_file():
        raise BfclError(
            f"no bfcl-eval virtualenv at {python} (fix: scripts/install_bfcl.sh, or set ARENA_BFCL_PYTHON "
            "to a python with bfcl-eval==2026.3.23 and soundfile)"
        )
    proc = subprocess.run(
        [str(python), "-I", str(CHECKER), *args],
        input=json.dumps(stdin) if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=CHECKER_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise BfclError(f"bfcl-eval failed ({python}): {' / '.join(tail)} (fix: scripts/install_bfcl.sh)")
    answer: dict[str, Any] = json.loads(proc.stdout)
    return answer


def load_items(categories: list[str], limit: int | None = None) -> tuple[list[BfclItem], list[MultiTurnItem]]:
    """The single-turn and the multi-turn items of ``categories`` that bfcl-eval ships (the first
    ``limit`` of each category)."""
    if not categories:
        return [], []
    args = ["items", ",".join(categories), *([str(limit)] if limit is not None else [])]
    loaded = _checker(args)["items"]
    single = [BfclItem.model_validate(i) for i in loaded if i["category"] not in MULTI_TURN]
    multi = [MultiTurnItem.model_validate(i) for i in loaded if i["category"] in MULTI_TURN]
    return single, multi


def check_calls(pairs: list[tuple[BfclItem, BfclCalls]]) -> list[BfclCheck]:
    """bfcl-eval's verdict on each (item, calls), in order, from one checker run."""
    payload = {
        "items": [
            {
                "id": item.id,
                "category": item.category,
                "functions": item.functions,
                "ground_truth": item.ground_truth,
                "calls": calls,
            }
            for item, calls in pairs
        ]
    }
    return [BfclCheck.model_validate(r) for r in _checker(["check"], payload)["results"]]


def as_bfcl_calls(calls: list[PlannedCall]) -> BfclCalls:
    """The turn's calls in bfcl-eval's form (names as sent: '.' already '_', as its checker expects)."""
    return [{c.name: dict(c.arguments)} for c in calls]


async def _trial(policy: EndpointPolicy, item: BfclItem, seed: int) -> BfclCalls:
    """One reply of the model to the item: its calls (none for a text answer)."""
    answer = await policy.turn([dict(m) for m in item.messages], item.tools, seed)
    return as_bfcl_calls(answer.output.tool_calls)


Tick = Callable[[], None]
"""Called after each trial (the progress bar)."""


async def _collect(
    policy: EndpointPolicy,
    items: list[BfclItem],
    *,
    trials: int,
    concurrency: int,
    seed: int,
    tick: Tick = lambda: None,
) -> dict[tuple[str, int], BfclCalls | str]:
    """(item id, trial) -> the calls, or why the trial got no usable reply."""
    slots = asyncio.Semaphore(concurrency)
    out: dict[tuple[str, int], BfclCalls | str] = {}

    async def one(item: BfclItem, trial: int) -> None:
        async with slots:
            try:
                out[(item.id, trial)] = await _trial(policy, item, derive_seed(seed, item.id, trial))
            except InvalidOutput as exc:
                out[(item.id, trial)] = f"trial {trial}: no usable reply ({exc})"
            tick()

    await asyncio.gather(*(one(item, t) for item in items for t in range(trials)))
    return out


def score(
    items: list[BfclItem], replies: dict[tuple[str, int], BfclCalls | str], trials: int
) -> list[TaskResult]:
    """Every trial and the do-nothing agent's empty reply, through one run of bfcl-eval's checker."""
    pairs: list[tuple[BfclItem, BfclCalls]] = [(item, []) for item in items]  # the do-nothing agent
    for item in items:
        pairs += [(item, r) for t in range(trials) if not isinstance(r := replies[(item.id, t)], str)]
    verdicts = iter(check_calls(pairs))
    baseline = {item.id: next(verdicts).valid for item in items}
    results = []
    for item in items:
        rewards, errors = [], []
        for t in range(trials):
            reply = replies[(item.id, t)]
            if isinstance(reply, str):
                rewards.append(0.0)
                errors.append(reply)
            else:
                rewards.append(1.0 if next(verdicts).valid else 0.0)
        results.append(
            TaskResult(
                task_id=item.id,
                group=item.category,
                rewards=rewards,
                baseline_reward=1.0 if baseline[item.id] else 0.0,
                errors=errors,
            )
        )
    return results


async def _multi_turn_trial(
    policy: EndpointPolicy, runtime: BfclRuntime, item: MultiTurnItem, trial: int, seed: int
) -> tuple[float, str]:
    """One episode of a multi-turn item: (reward, '' or why the trial failed)."""
    from trainer.endpoint_policy import TurnFailed, endpoint_episode

    env = BfclEnvironment(item, runtime, namespace=f"arena_t{trial}_{derive_seed(seed, item.id, trial)}")
    try:
        done = await endpoint_episode(
            policy,
            env,
            item.sample(),
            max_turns=(MAX_STEPS_PER_TURN + 1) * len(item.turns),
            seed=derive_seed(seed, item.id, trial),
        )
        return done.reward, ""
    except TurnFailed as exc:
        return 0.0, f"trial {trial}: no usable reply ({exc})"
    except BfclUnavailable as exc:
        return 0.0, f"trial {trial}: {exc}"
    finally:
        await env.close()


async def _multi_turn(
    policy: EndpointPolicy,
    items: list[MultiTurnItem],
    *,
    trials: int,
    concurrency: int,
    seed: int,
    tick: Tick = lambda: None,
) -> list[TaskResult]:
    """Every multi-turn item ``trials`` times, and the do-nothing agent (no call on any turn) once."""
    slots = asyncio.Semaphore(concurrency)
    outcomes: dict[tuple[str, int], tuple[float, str]] = {}
    async with BfclRuntime(bfcl_python()) as runtime:

        async def one(item: MultiTurnItem, trial: int) -> None:
            async with slots:
                outcomes[(item.id, trial)] = await _multi_turn_trial(policy, runtime, item, trial, seed)
            tick()

        await asyncio.gather(*(one(item, t) for item in items for t in range(trials)))
        baseline = {
            item.id: await runtime.request(
                {"op": "check", "item": {**item.wire(), "calls": [[] for _ in item.turns]}}
            )
            for item in items
        }
    return [
        TaskResult(
            task_id=item.id,
            group=item.category,
            rewards=[outcomes[(item.id, t)][0] for t in range(trials)],
            baseline_reward=1.0 if baseline[item.id]["valid"] else 0.0,
            errors=[why for t in range(trials) if (why := outcomes[(item.id, t)][1])],
        )
        for item in items
    ]


async def _evaluate(
    settings: ArenaSettings,
    url: str,
    items: list[BfclItem],
    multi: list[MultiTurnItem],
    *,
    trials: int,
    concurrency: int,
    seed: int,
    progress: bool,
) -> tuple[dict[tuple[str, int], BfclCalls | str], list[TaskResult]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trainer.endpoint_policy import open_endpoint_policy

    policy = await open_endpoint_policy(settings, url)
    bar = Progress(
        TextColumn("bfcl"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),  # stdout may carry --json
        disable=not progress,
    )
    task = bar.add_task("trials", total=(len(items) + len(multi)) * trials)
    try:
        with bar:

            def tick() -> None:
                bar.advance(task)

            replies = await _collect(
                policy, items, trials=trials, concurrency=concurrency, seed=seed, tick=tick
            )
            episodes = await _multi_turn(
                policy, multi, trials=trials, concurrency=concurrency, seed=seed, tick=tick
            )
        return replies, episodes
    finally:
        await policy.aclose()


def run_bfcl(
    settings: ArenaSettings,
    url: str,
    *,
    category: str = DEFAULT_CATEGORIES,
    k: int = 1,
    trials: int | None = None,
    limit: int | None = None,
    concurrency: int = 4,
    seed: int = 0,
    progress: bool = True,
) -> BenchReport:
    """pass^k and pass@k of the model at ``url`` per BFCL category, the do-nothing floor beside them.

    ``category``: comma-separated bfcl-eval categories ('simple' = 'simple_python'); ``limit``: the
    first N items of each. Raises ``BfclError`` (no bfcl virtualenv, unknown category) and
    ``EndpointError`` (the endpoint does not serve).
    """
    n = trials if trials is not None else k
    if n < k:
        raise ValueError(f"trials {n} < k {k}")
    started = time.monotonic()
    items, multi = load_items(categories_of(category), limit)
    try:
        replies, episodes = asyncio.run(
            _evaluate(
                settings, url, items, multi, trials=n, concurrency=concurrency, seed=seed, progress=progress
            )
        )
    except BfclUnavailable as exc:
        raise BfclError(f"{exc} (fix: scripts/install_bfcl.sh, or check {bfcl_python()} runs)") from None
    results = (score(items, replies, n) if items else []) + episodes
    return bench_report("bfcl", url, results, k=k, trials=n, wall_s=time.monotonic() - started)

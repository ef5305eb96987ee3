"""`arena eval --bench tau2 --domain D`: a served model or a local checkpoint on tau2-bench, scored by
tau2's evaluator.

The agent is the endpoint, through Arena's OpenAI client path (``trainer.endpoint_policy``: the
gateway's native ``agent_policy`` role, tools as OpenAI ``tools``, replies' ``tool_calls``), with
tau2's agent system prompt around the domain's policy. A local checkpoint (``--model FOLDER``)
instead rolls each trial out token by token in the environment training uses
(``environments.tau2_environment``: the same session, user and reward; ``trainer.evaluate``), and
tau2's evaluator rescores every trial's trajectory, which must agree. Its user opens each task once
(the simulator's reply to tau2's greeting), and every trial of the task starts from that opening. The user is Arena's simulated user (the
gateway's ``user_simulator`` role on the settings' LLM) or, with ``user="endpoint"``, the endpoint
itself through the same role. Tools -- the agent's and, in telecom, the user's own -- run the
domain's code in a sandbox session (``environments.tau2_env``), one session per concurrent worker,
its database loaded once and reset per trial.

Each trial's trajectory is written as tau2 messages and scored by tau2's own
``evaluate_simulation`` (EvaluationType.ALL), in the same session. The do-nothing agent (it only
greets, calls nothing and stops) is scored the same way once per task. Tasks are tau2's ``base``
split (what tau2 evaluates), of its test tasks by default (``split``: the tasks synthesis never
reads); the report says the split, who played the user and which tasks were left out (those
needing a judge, those past ``limit``). The domain is imported into the lake first when it is not
there yet.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from arena.config import ArenaSettings
from arena.llm.core import InvalidOutput
from environments.tau2_env import Tau2Session, Tau2Unavailable, tau2_pool
from environments.tau2_episode import (
    GREETING,
    MAX_AGENT_STEPS,
    MAX_USER_TURNS,
    Episode,
    do_nothing_reward,
    run_calls,
    system_prompt,
)
from environments.tau2_import import (
    DOMAINS,
    EvalSplit,
    Tau2Import,
    benchmark_tasks,
    build_import,
    load_databases,
    load_import,
    load_tasks,
    open_session,
)
from environments.tau2_tasks import Tau2Task
from environments.user_view import GatewayUserSimulator, UserContext, UserSimulator, ViewTurn
from lake.store import ObjectStore, open_store
from sandbox import SandboxPool
from trainer.benchmarks.report import BenchReport, TaskResult, bench_report
from trainer.endpoint_policy import EndpointPolicy, is_endpoint, open_endpoint_policy

if TYPE_CHECKING:  # torch: loaded with the first checkpoint, not on import
    from trainer.policy import RolloutBackend

T = TypeVar("T")


class Tau2BenchError(ValueError):
    """The benchmark cannot run as asked (unknown domain, tau2 not installed): the message says the fix."""


async def run_episode(
    session: Tau2Session,
    imported: Tau2Import,
    task: Tau2Task,
    policy: EndpointPolicy,
    user: UserSimulator,
    seed: int,
) -> tuple[list[dict[str, Any]], str]:
    """One trial of ``task``: (tau2 messages, termination reason)."""
    await session.reset(task.raw)
    history = list((task.raw.get("initial_state") or {}).get("message_history") or [])
    episode = Episode(
        chat=[{"role": "system", "content": system_prompt(imported.policy)}], tau2=list(history)
    )
    episode.say("assistant", GREETING)
    user_turns = 0
    for step in range(MAX_AGENT_STEPS):
        if episode.turns[-1].role == "assistant":
            context = UserContext(
                instructions=task.instructions,
                requirements=task.requirements,
                user_tools=imported.user_tools,
                turns=episode.turns,
                turn=user_turns,
                max_turns=MAX_USER_TURNS,
            )
            move = await user.reply(context)
            if move.actions:  # dual control: the user acts on its own device first, as in tau2
                await run_calls(
                    session, episode, [(a.name, dict(a.arguments)) for a in move.actions], "user", None
                )
            text = move.message or ("###STOP###" if move.signal != "continue" else "")
            if move.signal != "continue" and "###" not in text:
                text = f"{text} ###STOP###".strip()
            episode.say("user", text)
            episode.turns[-1].actions = list(move.actions)
            if move.signal != "continue":
                return episode.tau2, "user_stop"
            if user_turns >= MAX_USER_TURNS:  # the conversation ran out of turns: tau2 scores it 0
                return episode.tau2, "max_steps"
            user_turns += 1
        answer = await policy.turn(episode.chat, imported.agent_tools, seed * 1000 + step)
        turn = answer.output
        if turn.tool_calls:
            calls = [(c.name, dict(c.arguments)) for c in turn.tool_calls]
            await run_calls(session, episode, calls, "assistant", turn.content)
            continue
        episode.say("assistant", turn.content)
        if "###STOP###" in turn.content:
            return episode.tau2, "agent_stop"
    return episode.tau2, "max_steps"


async def _tasks(
    store: ObjectStore, pool: SandboxPool, domain: str, split: EvalSplit, limit: int | None
) -> tuple[Tau2Import, list[Tau2Task], dict[str, int]]:
    """The import (made first when missing), the tasks to score, and how many were left out, by why."""
    imported = load_import(store, domain) or await build_import(store, pool, domain)
    chosen = benchmark_tasks(load_tasks(store, imported), imported, split)
    tasks = [t for t in chosen if not t.verification.needs_judge]
    left_out = {"needs_judge": len(chosen) - len(tasks)}
    if limit is not None and len(tasks) > limit:
        left_out["limit"] = len(tasks) - limit
        tasks = tasks[:limit]
    if not tasks:
        raise Tau2BenchError(f"the {split} split of {domain} has no task to score (fix: --split all)")
    return imported, tasks, left_out


@dataclass(frozen=True)
class _Plan:
    """What to evaluate: the domain's split and how (the knobs of ``run_tau2``)."""

    domain: str
    k: int
    trials: int
    limit: int | None
    concurrency: int
    seed: int
    split: EvalSplit

    @property
    def workers(self) -> int:
        return max(1, self.concurrency)


async def _evaluate(
    settings: ArenaSettings, url: str, plan: _Plan, user: Literal["gateway", "endpoint"]
) -> BenchReport:
    start = time.monotonic()
    store = open_store(settings)
    domain, trials, workers = plan.domain, plan.trials, plan.workers
    pool = tau2_pool(settings.sandbox, domain, pool_size=workers)
    policy = await open_endpoint_policy(settings, url)  # probed first: a dead URL costs no sandbox
    gateway = None
    try:
        await pool.start()
        imported, tasks, left_out = await _tasks(store, pool, domain, plan.split, plan.limit)
        if user == "endpoint":
            simulator: UserSimulator = GatewayUserSimulator(policy.gateway)
        else:
            from lake.catalog import open_gateway

            gateway = open_gateway(settings)
            simulator = GatewayUserSimulator(gateway)
        results = {
            t.task_id: TaskResult(task_id=t.task_id, group=domain, rewards=[], baseline_reward=0.0)
            for t in tasks
        }
        jobs: asyncio.Queue[tuple[Tau2Task, int]] = asyncio.Queue()
        for task in tasks:
            jobs.put_nowait((task, -1))  # the do-nothing agent
            for trial in range(trials):
                jobs.put_nowait((task, trial))
        rewards: dict[tuple[str, int], float] = {}

        async def worker() -> None:
            async with open_session(store, pool, imported) as session:
                while not jobs.empty():
                    task, trial = jobs.get_nowait()
                    result = results[task.task_id]
                    if trial < 0:
                        result.baseline_reward = await do_nothing_reward(session, task)
                        continue
                    try:
                        messages, why = await run_episode(
                            session, imported, task, policy, simulator, plan.seed + trial
                        )
                        reward = await session.tau2_reward(task.raw, messages, why)
                        rewards[(task.task_id, trial)] = float(reward["reward"])
                    except (InvalidOutput, RuntimeError) as exc:
                        rewards[(task.task_id, trial)] = 0.0
                        result.errors.append(f"trial {trial}: {type(exc).__name__}: {str(exc)[:300]}")

        await asyncio.gather(*(worker() for _ in range(min(workers, max(1, jobs.qsize())))))
        for task in tasks:
            results[task.task_id].rewards = [rewards[(task.task_id, i)] for i in range(trials)]
        report = bench_report(
            "tau2", url, list(results.values()), k=plan.k, trials=trials, wall_s=time.monotonic() - start
        )
        return report.model_copy(
            update={
                "split": plan.split,
                "user_simulator": user,
                "left_out": {why: n for why, n in left_out.items() if n},
            }
        )
    finally:
        await policy.aclose()
        if gateway is not None:
            await gateway.aclose()
        await pool.close()


async def opening_of(user: UserSimulator, imported: Tau2Import, task: Tau2Task) -> str:
    """The user's first message: its reply to tau2's greeting (its first requirement if it says nothing)."""
    context = UserContext(
        instructions=task.instructions,
        requirements=task.requirements,
        user_tools=imported.user_tools,
        turns=[ViewTurn(role="assistant", text=GREETING)],
        turn=0,
        max_turns=MAX_USER_TURNS,
    )
    move = await user.reply(context)
    return move.message.strip() or (task.requirements[0] if task.requirements else "Hi, I need help.")


@dataclass(frozen=True)
class _LocalEval:
    """What every checkpoint of one local evaluation shares: the pool, the tasks, their openings
    (the user's reply to the greeting) and the do-nothing floor, none of which depend on the model."""

    store: ObjectStore
    pool: SandboxPool
    imported: Tau2Import
    databases: Any
    user: UserSimulator
    tasks: list[Tau2Task]
    samples: list[Any]
    """The tasks as ``tau2`` samples, each opening with its user's first message."""
    floor: list[float]
    """The do-nothing agent's reward per task."""


async def _evaluate_local(
    settings: ArenaSettings, model_paths: Sequence[str], plan: _Plan
) -> list[BenchReport]:
    """Local checkpoints, one after another on one sandbox pool and one set of openings
    (``_LocalEval``); a report per checkpoint."""
    from environments.tau2_environment import tau2_sample
    from lake.catalog import open_gateway
    from trainer.evaluate import load_backend

    if not model_paths:
        return []
    start = time.monotonic()
    store = open_store(settings)
    # The first checkpoint loads before the pool starts: one that cannot load costs no sandbox.
    loaded = load_backend(settings, model_paths[0])
    split = plan.split
    pool = tau2_pool(settings.sandbox, plan.domain, pool_size=plan.workers + 1)
    gateway = open_gateway(settings)
    try:
        await pool.start()
        imported, tasks, left_out = await _tasks(store, pool, plan.domain, split, plan.limit)
        user = GatewayUserSimulator(gateway)
        samples = [
            tau2_sample(
                imported, t, await opening_of(user, imported, t), origin=f"eval:{t.task_id}", split=split
            )
            for t in tasks
        ]
        async with open_session(store, pool, imported) as session:
            floor = [await do_nothing_reward(session, task) for task in tasks]
        shared = _LocalEval(
            store, pool, imported, load_databases(store, imported), user, tasks, samples, floor
        )
        reports: list[BenchReport] = []
        for index, model_path in enumerate(model_paths):
            if index:
                loaded = load_backend(settings, model_path)
            results = await _checkpoint_results(settings, loaded, shared, plan)
            found = bench_report(
                "tau2", model_path, results, k=plan.k, trials=plan.trials, wall_s=time.monotonic() - start
            )
            update = {
                "split": split,
                "user_simulator": "gateway",
                "left_out": {why: n for why, n in left_out.items() if n},
            }
            reports.append(found.model_copy(update=update))
            start = time.monotonic()
        return reports
    finally:
        await gateway.aclose()
        await pool.close()


async def _checkpoint_results(
    settings: ArenaSettings, loaded: tuple[RolloutBackend, Any], shared: _LocalEval, plan: _Plan
) -> list[TaskResult]:
    """One loaded checkpoint's (backend, tokenizer) token-level trials in ``Tau2Environment`` (as
    training rolls out), each rescored by tau2's evaluator; a trial where the two disagree is
    reported as an error."""
    from environments.tau2_environment import Tau2Environment, rescore
    from trainer.evaluate import EvalCase, evaluate

    backend, tokenizer = loaded
    made: dict[str, list[Tau2Environment]] = {}

    def factory(sample: Any) -> Any:
        def make() -> Tau2Environment:
            env = Tau2Environment(sample, shared.pool, shared.user, shared.databases)
            made.setdefault(sample.sample_id, []).append(env)
            return env

        return make

    cfg = settings.train
    report = await evaluate(
        backend,
        tokenizer,
        [EvalCase(sample=s, make_env=factory(s)) for s in shared.samples],
        k=plan.k,
        trials=plan.trials,
        max_turns=cfg.max_turns,
        max_seq_len=cfg.max_seq_len,
        max_new_tokens=cfg.max_new_tokens,
        temperature=cfg.temperature,
        seed=plan.seed,
        concurrency=plan.workers,
    )
    results: list[TaskResult] = []
    async with open_session(shared.store, shared.pool, shared.imported) as session:
        for task, sample, case, baseline in zip(
            shared.tasks, shared.samples, report.cases, shared.floor, strict=True
        ):
            rewards = case.rewards + [0.0] * len(case.errors)
            errors = list(case.errors)
            for env in made.get(sample.sample_id, []):
                theirs = await rescore(session, env.rollout())
                if theirs != env.last_reward:
                    errors.append(f"tau2's evaluator gives {theirs}, Arena {env.last_reward}")
            results.append(
                TaskResult(
                    task_id=task.task_id,
                    group=plan.domain,
                    rewards=rewards,
                    baseline_reward=baseline,
                    errors=errors,
                )
            )
    return results


def _plan(
    domain: str, k: int, trials: int, limit: int | None, concurrency: int, seed: int, split: EvalSplit
) -> _Plan:
    if domain not in DOMAINS:
        raise Tau2BenchError(f"--domain {domain!r}: tau2 domains are {', '.join(DOMAINS)}")
    if trials < k:
        raise Tau2BenchError(f"trials ({trials}) < k ({k}): pass^k needs at least k trials per task")
    return _Plan(domain, k, trials, limit, concurrency, seed, split)


def _run(evaluation: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(evaluation)
    except Tau2Unavailable as exc:
        raise Tau2BenchError(str(exc)) from None


def run_tau2(
    settings: ArenaSettings,
    url: str,
    *,
    domain: str,
    k: int,
    trials: int,
    limit: int | None,
    concurrency: int,
    seed: int,
    user: Literal["gateway", "endpoint"] = "gateway",
    split: EvalSplit = "test",
) -> BenchReport:
    """pass^k / pass@k of the model at ``url`` (an endpoint, or a local checkpoint folder) on tau2
    ``domain``, with the do-nothing floor.

    ``split``: tau2's test tasks by default, the ones synthesis never reads (``synthesis_tasks``).
    """
    plan = _plan(domain, k, trials, limit, concurrency, seed, split)
    if not is_endpoint(url):
        return _run(_evaluate_local(settings, [url], plan))[0]
    return _run(_evaluate(settings, url, plan, user))


def run_tau2_checkpoints(
    settings: ArenaSettings,
    model_paths: Sequence[str],
    *,
    domain: str,
    k: int,
    trials: int,
    limit: int | None,
    concurrency: int,
    seed: int,
    split: EvalSplit = "test",
) -> list[BenchReport]:
    """``run_tau2`` of several local checkpoints (a base and its trained descendants) on the same
    tasks and openings, one sandbox pool for all: a report per checkpoint, in order."""
    return _run(
        _evaluate_local(settings, model_paths, _plan(domain, k, trials, limit, concurrency, seed, split))
    )

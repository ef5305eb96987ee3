"""The `arena` command line.

User mistakes (a missing file, a bad setting, bad SQL) print one clear
message naming what and how to fix it, and exit 2 without a traceback.
"""

from __future__ import annotations

import asyncio
import csv
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from arena.config import ArenaSettings
from sandbox.cli import app as sandbox_app

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Arena: streaming tool-use data synthesis.",
)
topics_app = typer.Typer(no_args_is_help=True, help="Create and list Arena's Kafka topics.")
publish_app = typer.Typer(no_args_is_help=True, help="Publish inputs to Arena's topics.")
lake_app = typer.Typer(no_args_is_help=True, help="Query and list the artifact lake.")
export_app = typer.Typer(no_args_is_help=True, help="Export training data from the lake.")
env_app = typer.Typer(no_args_is_help=True, help="Inspect and re-verify environment packages.")
eigen_app = typer.Typer(
    no_args_is_help=True, help="EigenData self-evolution in the catalog: prompt sets, versions, critiques."
)
app.add_typer(topics_app, name="topics")
app.add_typer(publish_app, name="publish")
app.add_typer(lake_app, name="lake")
app.add_typer(export_app, name="export")
app.add_typer(env_app, name="env")
app.add_typer(eigen_app, name="eigen")
app.add_typer(sandbox_app, name="sandbox")

console = Console()
err = Console(stderr=True)


class UserError(Exception):
    """A mistake the user can fix; printed without a traceback."""


def settings() -> ArenaSettings:
    try:
        return ArenaSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"ARENA_{'_'.join(str(p) for p in e['loc']).upper() or 'CONFIG'}: {e['msg']}"
            for e in exc.errors()
        )
        raise UserError(f"invalid configuration (environment or arena.toml): {problems}") from None


def broker(cfg: ArenaSettings) -> str:
    """The bootstrap address; starts the embedded stack if needed and says so."""
    from app.stack import StackNotRunning, resolve_broker

    try:
        address, started = resolve_broker(cfg, start=True)
    except StackNotRunning as exc:
        raise UserError(str(exc)) from None
    if started:
        err.print(f"[cyan]started the embedded stack[/cyan] (broker {address}); `arena down` stops it")
    return address


def ready_broker(cfg: ArenaSettings) -> str:
    """A broker with every topic created with its declared partition count."""
    from streams.admin import ensure_topics

    address = broker(cfg)
    ensure_topics(address)
    return address


# --- stack --------------------------------------------------------------


@app.command()
def up() -> None:
    """Start the embedded stack (broker, lake, LanceDB, catalog) under $ARENA_HOME."""
    from app.stack import up as stack_up
    from streams.admin import ensure_topics

    cfg = settings()
    if cfg.broker:
        raise UserError(f"ARENA_BROKER is set ({cfg.broker}): Arena uses that cluster; nothing to start")
    state = stack_up(cfg)
    created = ensure_topics(state.broker)
    console.print(f"broker   {state.broker} (pid {state.pid})")
    console.print(f"topics   {len(created)} created")
    _print_locations(cfg)


@app.command()
def status() -> None:
    """Show what runs where."""
    from app.stack import status as stack_status

    cfg = settings()
    st = stack_status(cfg)
    table = Table(show_header=False)
    if cfg.broker:
        table.add_row("broker", f"{cfg.broker} (external)")
    else:
        state = f"running, pid {st.pid}" if st.running else "not running (`arena up` starts it)"
        table.add_row("broker", f"{st.broker or '-'} ({state})")
    for key, value in cfg.public_view().items():
        if key != "broker":
            table.add_row(key, str(value))
    console.print(table)


@app.command()
def down() -> None:
    """Stop the embedded stack (data is kept under $ARENA_HOME)."""
    from app.stack import down as stack_down

    stopped = stack_down(settings())
    console.print("stopped" if stopped else "not running")


def _print_locations(cfg: ArenaSettings) -> None:
    view = cfg.public_view()
    for key in ("lake", "lancedb", "catalog"):
        console.print(f"{key:<8} {view[key]}")


# --- topics -------------------------------------------------------------


@topics_app.command("create")
def topics_create() -> None:
    """Create every declared topic with its exact partition count (idempotent)."""
    from streams.admin import ensure_topics

    created = ensure_topics(broker(settings()))
    console.print(f"{len(created)} topics created" + (f": {', '.join(created)}" if created else ""))


@topics_app.command("list")
def topics_list() -> None:
    """The topic registry: name, partitions, key, value schema, retention."""
    from arena.topics import TOPICS

    table = Table("topic", "partitions", "key", "value", "retention", "lake view")
    for spec in TOPICS.values():
        retention = "forever" if spec.retention_ms < 0 else f"{spec.retention_ms // 86_400_000}d"
        table.add_row(spec.name, str(spec.partitions), spec.key, spec.value.__name__, retention, spec.table)
    console.print(table)


# --- publish ------------------------------------------------------------


@publish_app.command("tools")
def publish_tools(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders of tool docs (JSON, JSONL, YAML).")],
) -> None:
    """Publish tool docs (OpenAI, MCP tools/list, BFCL, OpenAPI 3) to `tools.raw`."""
    from producers.publish_tools import publish_tool_docs

    missing = [p for p in paths if not p.exists()]
    if missing:
        raise UserError(f"no such file or folder: {missing[0]} (fix: check the path)")
    cfg = settings()
    report = asyncio.run(publish_tool_docs(ready_broker(cfg), paths))
    if report.servers:
        table = Table("server", "format", "tools", "source", title="published to tools.raw")
        for s in report.servers:
            table.add_row(s.server, s.format.value, str(len(s.entries)), s.source)
        console.print(table)
    for e in report.errors:
        where = e.file + (f" [{e.entry}]" if e.entry else "")
        err.print(f"[red]error[/red] {where}: {e.problem} (fix: {e.fix})")
    console.print(
        f"{len(report.servers)} servers published, {len(report.errors)} rejected "
        f"(sent to tools.raw.dlq with reasons)"
    )
    if report.errors:
        raise typer.Exit(1)


@publish_app.command("mcp")
def publish_mcp(
    stdio: Annotated[
        str | None,
        typer.Option("--stdio", help="Command that starts the server on stdio, e.g. 'python -m x'."),
    ] = None,
    url: Annotated[
        str | None, typer.Option("--url", help="Streamable-HTTP endpoint, e.g. http://host:port/mcp.")
    ] = None,
    name: Annotated[
        str | None, typer.Option("--name", help="Server name (default: what the server reports).")
    ] = None,
) -> None:
    """Publish a deployed MCP server: its live tools/list goes to `tools.raw`, calls go to the server."""
    import shlex

    from arena.records.tools import McpEndpoint
    from producers.mcp_tools import fetch_mcp_server
    from producers.publish import publish
    from producers.publish_tools import outgoing

    if (stdio is None) == (url is None):
        raise UserError("give exactly one of --stdio COMMAND and --url URL")
    endpoint = (
        McpEndpoint(transport="stdio", command=shlex.split(stdio))
        if stdio is not None
        else McpEndpoint(transport="http", url=url)
    )
    cfg = settings()
    try:
        raw = asyncio.run(fetch_mcp_server(endpoint, name))
    except Exception as exc:  # the server is the user's: say what failed, no traceback
        raise UserError(
            f"could not list tools of MCP server {endpoint.describe()!r}: {type(exc).__name__}: {exc} "
            "(fix: check that the server starts / the URL answers)"
        ) from None
    asyncio.run(publish(ready_broker(cfg), outgoing([raw], [])))
    console.print(
        f"published MCP server {raw.server!r} ({len(raw.entries)} tools, {endpoint.transport}) to tools.raw"
    )


@publish_app.command("qa")
def publish_qa(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Knowledge sources: Markdown/text corpora, JSON or CSV tables (files or folders)."
        ),
    ] = None,
    builtin: Annotated[
        list[str] | None,
        typer.Option("--builtin", help="A built-in seeded knowledge base by domain (repeatable)."),
    ] = None,
    questions: Annotated[
        Path | None,
        typer.Option(
            "--questions", help="Main questions (JSONL/JSON/one per line): question-conditional mode."
        ),
    ] = None,
    hops: Annotated[int, typer.Option("--hops", min=1, max=8, help="Hop budget H.")] = 2,
    count: Annotated[
        int, typer.Option("--count", min=1, max=1000, help="Instances per source (unconditional mode).")
    ] = 8,
) -> None:
    """Publish QA seeds to `qa.seeds`: knowledge sources plus hop budget, or main questions."""
    from producers.knowledge import (
        BUILTIN_DOMAINS,
        KnowledgeError,
        builtin_knowledge,
        load_knowledge,
        load_questions,
        question_seeds,
        unconditional_seed,
    )
    from producers.publish_qa import publish_seeds

    cfg = settings()
    unknown = [d for d in builtin or [] if d not in BUILTIN_DOMAINS]
    if unknown:
        raise UserError(
            f"no built-in knowledge base {unknown[0]!r} (fix: use one of {', '.join(BUILTIN_DOMAINS)})"
        )
    if not paths and not builtin:
        raise UserError("give knowledge sources (PATH...) or --builtin DOMAIN")
    missing = [p for p in [*(paths or []), *([questions] if questions else [])] if not p.exists()]
    if missing:
        raise UserError(f"no such file or folder: {missing[0]} (fix: check the path)")
    try:
        sources = [(builtin_knowledge(d, cfg.seed), f"builtin:{d}") for d in builtin or []]
        for path in paths or []:
            sources += [(kb, str(path)) for kb in load_knowledge(path)]
        asked = load_questions(questions) if questions else None
    except KnowledgeError as exc:
        raise UserError(str(exc)) from None
    if asked is not None:
        seeds = [s for kb, src in sources for s in question_seeds(kb, asked, hop_budget=hops, source=src)]
    else:
        seeds = [unconditional_seed(kb, hop_budget=hops, count=count, source=src) for kb, src in sources]
    asyncio.run(publish_seeds(ready_broker(cfg), seeds))
    table = Table("seed", "domain", "mode", "tables", "instances", "source", title="published to qa.seeds")
    for seed in seeds:
        n = str(seed.count) if seed.mode == "unconditional" else "1"
        table.add_row(seed.seed_id, seed.domain, seed.mode, str(len(seed.knowledge.tables)), n, seed.source)
    console.print(table)


@publish_app.command("domain")
def publish_domain_cmd(
    path: Annotated[
        str, typer.Argument(help="A domain-pack folder, or a built-in pack name (customer_service).")
    ],
    instances: Annotated[
        int | None,
        typer.Option(
            "--instances", min=1, max=100_000, help="Seeds for phase 3 (default ARENA_EIGEN__INSTANCES)."
        ),
    ] = None,
    no_evolution: Annotated[
        bool, typer.Option("--no-evolution", help="Pilot without Judge critiques (the ablation).")
    ] = False,
) -> None:
    """Publish a domain pack: phases 1-2 (prompt sets, pilot) here, then seeds to `eigen.seeds`."""
    from producers.publish_domain import publish_domain, resolve_pack
    from streams.eigen.packs import DomainPackError

    cfg = settings()
    try:
        pack = resolve_pack(path)
    except DomainPackError as exc:
        raise UserError(str(exc)) from None
    address = ready_broker(cfg)
    err.print(
        f"piloting {cfg.eigen.prompt_sets} prompt set(s) of {pack.name!r} "
        f"(batches of {cfg.eigen.pilot_batch}, at most {cfg.eigen.pilot_iterations} iterations) ..."
    )
    report = asyncio.run(
        publish_domain(cfg, address, pack, instances=instances, evolve=False if no_evolution else None)
    )
    table = Table("prompt set", "focus", "iterations", "converged", "infeasibility", "version", "seeds")
    for s in report.sets:
        trend = (
            " -> ".join(f"{x:.2f}" for x in (s.infeasibility[:1] + s.infeasibility[-1:]))
            or "(phase 3 already)"
        )
        table.add_row(
            s.set_id,
            s.focus,
            str(s.iterations),
            "yes" if s.converged else "no",
            trend,
            str(s.version),
            str(s.seeds),
        )
    console.print(table)
    for warning in report.warnings:
        err.print(f"[yellow]{warning}[/yellow]")
    console.print(
        f"domain {report.domain!r} ({report.pack_id}{'' if report.new_pack else ', published before'}): "
        f"{report.pilot_records} records to eigen.pilot.metrics, {report.seeds} seeds to eigen.seeds"
    )


# --- eigen --------------------------------------------------------------

PHASES = {1: "1 new", 2: "2 pilot", 3: "3 generating"}


def _eigen_store(cfg: ArenaSettings) -> Any:
    from lake.eigen_catalog import EigenCatalog

    return EigenCatalog(cfg.catalog)


def _known_set(store: Any, set_id: str) -> None:
    if store.prompt_set(set_id) is None:
        raise UserError(f"no prompt set {set_id!r} in the catalog (fix: list them with `arena eigen sets`)")


@eigen_app.command("sets")
def eigen_sets(
    domain: Annotated[str | None, typer.Option("--domain", help="Only this domain's sets.")] = None,
) -> None:
    """Prompt sets: phase, current parameter version, focus, the key generator parameters."""
    store = _eigen_store(settings())
    table = Table(
        "prompt set", "domain", "phase", "version", "focus", "error-prone", "policy pressure", "parent"
    )
    for row in store.prompt_sets(domain):
        params = row.params_dict()
        table.add_row(
            row.set_id,
            row.domain,
            PHASES.get(row.phase, str(row.phase)),
            str(row.version),
            row.focus,
            f"{params.get('error_prone_parameters', 0):.2f}",
            f"{params.get('policy_pressure', 0):.2f}",
            row.parent or "",
        )
    console.print(table)


@eigen_app.command("versions")
def eigen_versions(set_id: Annotated[str, typer.Argument(help="Prompt set id.")]) -> None:
    """Every parameter / prompt version of a set, with why it was made."""
    store = _eigen_store(settings())
    _known_set(store, set_id)
    table = Table("version", "iteration", "reason", "parameters", "prompt versions", title=set_id)
    for row in store.param_versions(set_id):
        params = row.params_dict()
        shown = {k: v for k, v in params.items() if isinstance(v, int | float)}
        table.add_row(
            str(row.version),
            "" if row.iteration is None else str(row.iteration),
            row.reason,
            json.dumps(shown),
            str(len(json.loads(row.prompt_versions or "{}"))),
        )
    console.print(table)


@eigen_app.command("critiques")
def eigen_critiques(
    set_id: Annotated[str, typer.Argument(help="Prompt set id.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the critiques as JSON lines.")] = False,
) -> None:
    """The Judge's critique of each pilot iteration of a set, and what was applied."""
    store = _eigen_store(settings())
    _known_set(store, set_id)
    rows = store.critiques(set_id)
    if as_json:
        for row in rows:
            print(
                json.dumps(
                    {
                        "iteration": row.iteration,
                        "critique": row.critique_dict(),
                        "applied": row.applied_list(),
                    }
                )
            )
        return
    table = Table("iteration", "scores", "findings", "applied", title=set_id)
    for row in rows:
        critique = row.critique_dict()
        scores = ", ".join(f"{k}={float(v):.2f}" for k, v in (critique.get("scores") or {}).items())
        applied = ", ".join(
            f"{a['name']}={a.get('value')}" if "name" in a else f"{a.get('worker')}: {a.get('kind')}"
            for a in row.applied_list()
        )
        table.add_row(str(row.iteration), scores, "; ".join(critique.get("findings") or [])[:200], applied)
    console.print(table)


# --- export -------------------------------------------------------------


@export_app.command("sft")
def export_sft_cmd(
    path: Annotated[Path, typer.Argument(help="Output file.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
) -> None:
    """Write `samples.sft` from the lake as JSONL or Parquet (loadable with HF `datasets`)."""
    from consumers.export_sft import export_sft
    from lake.store import open_store

    if fmt not in ("jsonl", "parquet"):
        raise UserError(f"--format must be jsonl or parquet, got {fmt!r}")
    if path.is_dir():
        raise UserError(f"{path} is a folder (fix: give a file path, e.g. {path / ('sft.' + fmt)})")
    count = export_sft(open_store(settings()), path, fmt)  # type: ignore[arg-type]
    console.print(f"wrote {count} SFT samples to {path} ({fmt})")


@export_app.command("verl")
def export_verl_cmd(
    path: Annotated[Path, typer.Argument(help="Output folder (created).")],
) -> None:
    """Write verified environments in verl's multi-turn format: parquet, tool config, tool class, reward."""
    from trainer.export_verl import export_verl

    if path.exists() and not path.is_dir():
        raise UserError(f"{path} is a file (fix: give a folder path, e.g. {path.with_suffix('')}/)")
    try:
        summary = export_verl(settings(), path)
    except ValueError as exc:  # nothing to export
        raise UserError(f"{exc} (fix: `arena demo`, or `arena publish qa` and `arena worker`)") from None
    console.print_json(summary.model_dump_json())


# --- environments ---------------------------------------------------------


def _load_package(env_id: str | None, file: Path | None) -> tuple[Any, str]:
    """A package from the catalog by id, or from a JSON file (`arena env show ID --json`)."""
    from arena.records.envs import EnvPackage
    from lake.env_packages import EnvPackageStore

    if (env_id is None) == (file is None):
        raise UserError("give exactly one of ENV_ID and --file PATH")
    if file is not None:
        try:
            return EnvPackage.model_validate_json(file.read_bytes()), str(file)
        except OSError as exc:
            raise UserError(f"cannot read {file}: {exc.strerror} (fix: check the path)") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(top level)"
            raise UserError(
                f"{file}: field {where}: {first['msg']} (fix: write it with `arena env show ID --json`)"
            ) from None
    store = EnvPackageStore(settings().catalog)
    try:
        found = store.get(env_id or "")
    finally:
        store.dispose()
    if found is None:
        raise UserError(
            f"no environment package {env_id!r} in the catalog "
            '(fix: list them with `arena lake query "select env_id, structure from envs_verified"`)'
        )
    package, split = found
    return package, split


@env_app.command("show")
def env_show(
    env_id: Annotated[str, typer.Argument(help="Package id (env-...).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole package as JSON.")] = False,
) -> None:
    """Show an environment package: question, tools, jobs, merging, lineage."""
    package, split = _load_package(env_id, None)
    if as_json:
        print(package.model_dump_json(indent=1))
        return
    console.print(
        f"[bold]{package.env_id}[/bold] v{package.version}  {package.domain} / {package.structure}  "
        f"split={split}  qa={package.qa_id}"
    )
    console.print(f"Q: {package.question}\nA: {package.answer}")
    tools = Table("tool", "parameters", "rows of data", title="tools")
    for spec in package.tools:
        fn = spec.get("function", spec)
        params = ", ".join(fn.get("parameters", {}).get("properties", {}))
        tools.add_row(fn["name"], params, str(len(package.data.get(fn["name"], []))))
    console.print(tools)
    jobs = Table("#", "sub-question", "answer", "invocation", title="jobs")
    for job in package.jobs:
        jobs.add_row(str(job.index), job.question, job.answer, job.invocation)
    console.print(jobs)
    console.print(
        f"tools before merging: {package.tools_before_merge}, after: {len(package.tools)}; "
        f"merged groups: {package.merged_groups or 'none'}"
    )
    for role, version in sorted(package.lineage.items()):
        console.print(f"  {role}: {version}")


@env_app.command("verify")
def env_verify(
    env_id: Annotated[str | None, typer.Argument(help="Package id (env-...).")] = None,
    file: Annotated[
        Path | None, typer.Option("--file", help="Verify a package JSON file instead of a catalog id.")
    ] = None,
) -> None:
    """Re-execute every job of a package in the sandbox; exit 1 if any fails."""
    from sandbox import SandboxPool
    from sandbox.env_runtime import verify_package

    package, source = _load_package(env_id, file)
    cfg = settings()

    async def run() -> list[Any]:
        async with SandboxPool(cfg.sandbox) as pool:
            return await verify_package(package, pool)

    outcomes = asyncio.run(run())
    table = Table("#", "sub-question", "answer", "result", "detail", title=f"{package.env_id} ({source})")
    for o in outcomes:
        mark = "[green]pass[/green]" if o.passed else "[red]FAIL[/red]"
        table.add_row(str(o.index), _cell(o.question, 60), o.answer, mark, _cell(o.error or "", 70))
    console.print(table)
    failed = sum(not o.passed for o in outcomes)
    console.print(f"{len(outcomes) - failed}/{len(outcomes)} jobs passed")
    if failed:
        raise typer.Exit(1)


# --- workers ------------------------------------------------------------


@app.command("worker")
def worker_cmd(
    stage: Annotated[
        list[str] | None, typer.Option("--stage", help="Stage to run (repeatable). Default: all.")
    ] = None,
    until_drained: Annotated[
        bool, typer.Option("--until-drained", help="Exit 0 once every stage group has zero lag.")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="With --until-drained: give up (exit 1) after this many seconds.")
    ] = None,
) -> None:
    """Run stage workers (Faust, exactly-once) until stopped or drained."""
    from app.registry import WORKERS
    from app.worker import run_workers

    names = stage or list(WORKERS)
    unknown = [n for n in names if n not in WORKERS]
    if unknown:
        raise UserError(f"unknown stage {unknown[0]!r} (fix: use one of {', '.join(WORKERS)})")
    cfg = settings()
    code = run_workers(
        cfg, ready_broker(cfg), names, until_drained=until_drained, timeout_s=timeout, console=err
    )
    raise typer.Exit(code)


# --- training -----------------------------------------------------------


@app.command("train")
def train_cmd(
    tiny: Annotated[
        bool, typer.Option("--tiny", help="Build a tiny local model (tokenizer trained on the lake's text).")
    ] = False,
    steps: Annotated[
        int | None, typer.Option(min=1, help="Stop once the run reaches this many optimizer steps.")
    ] = None,
    until_drained: Annotated[
        bool, typer.Option("--until-drained", help="Stop when samples.sft and samples.verified are drained.")
    ] = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Fail unless the run has a checkpoint (it always resumes one).")
    ] = False,
    run: Annotated[str | None, typer.Option(help="Run name (default: ARENA_TRAIN__RUN).")] = None,
) -> None:
    """Train continuously: SFT on samples.sft, then online GRPO on samples.verified; resumes after a crash."""
    from trainer.service import NoCheckpoint, TrainerService, TrainOptions

    cfg = settings()
    if run is not None:
        try:
            cfg.train = cfg.train.model_copy(update={"run": type(cfg.train).model_validate({"run": run}).run})
        except ValidationError:
            raise UserError(f"--run {run!r}: use letters, digits, '_', '.', '-' (at most 64)") from None
    options = TrainOptions(tiny=tiny, steps=steps, until_drained=until_drained, resume=resume)
    service = TrainerService(cfg, ready_broker(cfg), options, console)
    try:
        code = asyncio.run(service.run())
    except (NoCheckpoint, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None
    raise typer.Exit(code)


@app.command("eval")
def eval_cmd(
    k: Annotated[int, typer.Option(min=1, help="k of pass^k and pass@k.")] = 4,
    trials: Annotated[int | None, typer.Option(min=1, help="Trials per case (n >= k; default k).")] = None,
    model: Annotated[
        Path | None, typer.Option(help="Model folder to evaluate (default: the run's newest weights).")
    ] = None,
    run: Annotated[str | None, typer.Option(help="Run whose newest weights to evaluate.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    user: Annotated[
        str,
        typer.Option(
            help="Who plays the user of interactive instances: 'gateway' (its simulator) or 'policy'."
        ),
    ] = "gateway",
) -> None:
    """pass^k and pass@k of a policy on the held-out qa packages and interactive instances, per domain."""
    import tempfile

    from trainer.checkpoint import Checkpoints
    from trainer.evaluate import report_table, run_eval

    cfg = settings()
    if user not in ("gateway", "policy"):
        raise UserError(f"--user {user!r}: use 'gateway' or 'policy'")
    n = trials if trials is not None else k
    if n < k:
        raise UserError(f"--trials {n} < --k {k} (fix: pass^k needs at least k trials per package)")
    with tempfile.TemporaryDirectory(prefix="arena-eval-") as tmp:
        if model is None:
            from lake.store import open_store

            name = run or cfg.train.run
            checkpoints = Checkpoints(open_store(cfg), cfg.catalog, name)
            steps = checkpoints.weights_steps()
            if not steps:
                raise UserError(
                    f"run {name!r} has no weights yet (fix: `arena train` first, or pass --model)"
                )
            model = checkpoints.weights_folder(steps[-1], Path(tmp))
        elif not (model / "config.json").is_file():
            raise UserError(f"--model {model}: no config.json there (fix: a Hugging Face model folder)")
        try:
            report = run_eval(cfg, str(model), k=k, trials=n, user=user)  # type: ignore[arg-type]  # checked above
        except ValueError as exc:  # nothing held out
            raise UserError(
                f"{exc} (fix: `arena demo`, or `arena publish qa` / `arena publish domain` and `arena worker`)"
            ) from None
    if as_json:
        console.print_json(report.model_dump_json())
    else:
        console.print(report_table(report))


# --- lag ----------------------------------------------------------------


@app.command()
def lag(
    group: Annotated[list[str] | None, typer.Option("--group", help="Consumer group (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh every --interval seconds.")] = False,
    interval: Annotated[float, typer.Option(help="Refresh period for --watch.")] = 2.0,
) -> None:
    """Consumer lag per group, topic and partition (like kafka-consumer-groups --describe)."""
    from consumers.lag import compute_lag, render_lag_table

    address = broker(settings())
    if not watch:
        rows = compute_lag(address, groups=group)
        if as_json:
            print(json.dumps([r.model_dump() for r in rows], indent=2))
        else:
            console.print(render_lag_table(rows))
        return
    from rich.live import Live

    with Live(render_lag_table(compute_lag(address, groups=group)), console=console) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render_lag_table(compute_lag(address, groups=group)))
        except KeyboardInterrupt:
            pass


# --- lake ---------------------------------------------------------------


@lake_app.command("query")
def lake_query(
    sql: Annotated[str, typer.Argument(help="DuckDB SQL; one view per topic, dots as underscores.")],
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array of row objects.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV with a header row.")] = False,
) -> None:
    """Query the lake with SQL, e.g. `select domain, count(*) from tools_servers group by 1`."""
    from lake.query import LakeQuery, LakeQueryError
    from lake.store import open_store

    if as_json and as_csv:
        raise UserError("choose one of --json and --csv")
    try:
        table = LakeQuery(open_store(settings())).query(sql)
    except LakeQueryError as exc:
        raise UserError(f"query failed: {exc}") from None
    rows = table.to_pylist()
    if as_json:
        print(json.dumps(rows, default=str, ensure_ascii=False))
    elif as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(table.column_names)
        writer.writerows([[_cell(r[c]) for c in table.column_names] for r in rows])
    else:
        out = Table(*table.column_names)
        for r in rows:
            out.add_row(*[_cell(r[c], limit=80) for c in table.column_names])
        console.print(out)
        console.print(f"{len(rows)} rows")


def _cell(value: Any, limit: int | None = None) -> str:
    text = "" if value is None else str(value)
    return text if limit is None or len(text) <= limit else text[: limit - 1] + "…"


@lake_app.command("ls")
def lake_ls(as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False) -> None:
    """Files, rows and bytes per topic in the lake."""
    from lake.parquet import lake_listing
    from lake.store import open_store

    cfg = settings()
    listing = lake_listing(open_store(cfg))
    if as_json:
        print(json.dumps([item.model_dump() for item in listing]))
        return
    table = Table("topic", "files", "rows", "bytes", title=cfg.public_view()["lake"])
    for item in listing:
        table.add_row(item.topic, str(item.files), str(item.rows), str(item.bytes))
    console.print(table)


# --- demo ---------------------------------------------------------------


@app.command()
def demo(
    timeout: Annotated[float, typer.Option(help="Give up if the stages have not drained by then.")] = 600.0,
) -> None:
    """Publish the bundled sample tool docs, run every stage until drained, summarise."""
    from app.demo import run_demo

    cfg = settings()
    raise typer.Exit(run_demo(cfg, ready_broker(cfg), console=console, timeout_s=timeout))


@app.command("config")
def config_cmd() -> None:
    """Show the effective configuration (secrets masked)."""
    console.print_json(json.dumps(settings().public_view()))


def main() -> None:
    from kafka.errors import KafkaError

    from app.stack import StackError
    from streams.admin import TopicAdminError

    try:
        app()
    except (UserError, StackError, TopicAdminError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    except KafkaError as exc:
        err.print(f"[red]error:[/red] Kafka: {exc} (fix: check that the broker is up: `arena status`)")
        sys.exit(1)


if __name__ == "__main__":
    main()

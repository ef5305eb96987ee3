"""`arena publish ...`: tool docs, MCP servers, QA seeds and domain packs into Arena's topics."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from app.cli_common import UserError, console, err, ready_broker, settings
from arena.records.tools import ToolDocFormat

if TYPE_CHECKING:
    from producers.publish_tools import PublishReport

publish_app = typer.Typer(no_args_is_help=True, help="Publish inputs to Arena's topics.")


# --- publish ------------------------------------------------------------


_SHOWN = 30
"""Rows of the server table and error lines printed; the rest are summarised (all errors are in the DLQ)."""
_PROGRESS_BYTES = 1024 * 1024
"""Inputs at least this big get a progress bar."""


@publish_app.command("tools")
def publish_tools(
    paths: Annotated[list[Path], typer.Argument(help="Files or folders of tool docs (JSON, JSONL, YAML).")],
    doc_format: Annotated[
        ToolDocFormat | None,
        typer.Option(
            "--format",
            help="Treat every document as this format instead of detecting it "
            "(openapi also covers Swagger 2.0 and specs without an 'openapi' key).",
        ),
    ] = None,
    max_server_tools: Annotated[
        int,
        typer.Option(
            "--max-server-tools", min=3, max=10_000, help="Bound on tools per server; bigger ones are split."
        ),
    ] = 64,
) -> None:
    """Publish tool docs (OpenAI, MCP tools/list, BFCL, OpenAPI 3 / Swagger 2.0, registry dumps,
    function-calling datasets) to `tools.raw`."""
    from producers.publish_tools import publish_tool_docs
    from producers.tool_docs import LoadOptions, planned_bytes

    missing = [p for p in paths if not p.exists()]
    if missing:
        raise UserError(f"no such file or folder: {missing[0]} (fix: check the path)")
    cfg = settings()
    options = LoadOptions(max_server_tools=max_server_tools, format=doc_format)
    address = ready_broker(cfg)
    total = planned_bytes(paths)
    with Progress(
        TextColumn("reading tool docs"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=total < _PROGRESS_BYTES,
    ) as bar:
        task = bar.add_task("read", total=total)
        report = asyncio.run(
            publish_tool_docs(address, paths, options, progress=lambda n: bar.advance(task, n))
        )
    _print_tools_report(report)
    if report.errors:
        raise typer.Exit(1)


def _print_tools_report(report: PublishReport) -> None:
    if report.servers:
        table = Table("server", "format", "tools", "source", title="published to tools.raw")
        for s in report.servers[:_SHOWN]:
            table.add_row(s.server, s.format.value, str(len(s.entries)), s.source)
        if len(report.servers) > _SHOWN:
            table.add_row(f"... {len(report.servers) - _SHOWN} more", "", "", "")
        console.print(table)
    for notice in report.notices[:_SHOWN]:
        err.print(f"[yellow]note[/yellow] {notice.describe()}")
    if len(report.notices) > _SHOWN:
        err.print(f"[yellow]note[/yellow] ... and {len(report.notices) - _SHOWN} more notes")
    for e in report.errors[:_SHOWN]:
        where = e.file + (f" [{e.entry}]" if e.entry else "")
        err.print(f"[red]error[/red] {where}: {e.problem} (fix: {e.fix})")
    if len(report.errors) > _SHOWN:
        err.print(f"[red]error[/red] ... and {len(report.errors) - _SHOWN} more (all in tools.raw.dlq)")
    stats = report.stats
    summary = Table("", "count", title="summary", show_header=False)
    summary.add_row("tools read", str(stats.tools_read))
    summary.add_row("duplicates merged", str(stats.duplicates_merged))
    summary.add_row("same-name conflicts (richer kept)", str(stats.conflicts))
    summary.add_row("servers formed", str(len(report.servers)))
    summary.add_row("rejected", str(len(report.errors)))
    reasons = Counter(e.problem.split(":")[0].split(" (")[0][:60] for e in report.errors)
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        summary.add_row(f"  rejected: {reason}", str(n))
    console.print(summary)
    console.print(
        f"{len(report.servers)} servers published, {len(report.errors)} rejected "
        f"(sent to tools.raw.dlq with reasons)"
    )


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
        typer.Option(
            "--builtin",
            help="A built-in knowledge base by domain (repeatable); world_facts is prose (passages only).",
        ),
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
    from producers.builtin_knowledge import BUILTIN_DOMAINS, PROSE_DOMAINS, builtin_knowledge
    from producers.knowledge import (
        KnowledgeError,
        load_knowledge,
        load_questions,
        question_seeds,
        unconditional_seed,
    )
    from producers.publish_qa import publish_seeds

    cfg = settings()
    known = (*BUILTIN_DOMAINS, *PROSE_DOMAINS)
    unknown = [d for d in builtin or [] if d not in known]
    if unknown:
        raise UserError(f"no built-in knowledge base {unknown[0]!r} (fix: use one of {', '.join(known)})")
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
    table = Table(
        "seed", "domain", "mode", "tables", "passages", "instances", "source", title="published to qa.seeds"
    )
    for seed in seeds:
        n = str(seed.count) if seed.mode == "unconditional" else "1"
        k = seed.knowledge
        table.add_row(
            seed.seed_id, seed.domain, seed.mode, str(len(k.tables)), str(len(k.passages)), n, seed.source
        )
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
    from synthesis.eigen.packs import DomainPackError

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
    from arena.llm.core import InvalidOutput

    try:
        report = asyncio.run(
            publish_domain(cfg, address, pack, instances=instances, evolve=False if no_evolution else None)
        )
    except InvalidOutput as exc:  # phases 1-2 need every orchestration role to answer at least once
        last = exc.errors[-1] if exc.errors else "no answer"
        raise UserError(
            f"the {exc.role} role gave no usable answer after {exc.attempts} attempt(s) ({last[:300]}), so the "
            f"pack {pack.name!r} was not published (fix: a stronger model for that role: "
            f'ARENA_LLM_ROLES=\'{{"{exc.role}": {{"llm": "openai://..."}}}}\')'
        ) from None
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

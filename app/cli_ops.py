"""Operating the pipeline: `arena dlq` (dead letters: list, replay) and `arena trace` (lineage)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from app.cli_common import UserError, broker, console, settings

dlq_app = typer.Typer(
    help="Dead letters: what each stage could not process, by topic and reason; replay them once fixed.",
)

MAX_CHILDREN = 40
"""Children shown per node of the trace tree (the rest are counted)."""


@dlq_app.callback(invoke_without_command=True)
def dlq_default(ctx: typer.Context) -> None:
    """`arena dlq` alone lists the dead letters (like `arena dlq list`)."""
    if ctx.invoked_subcommand is None:
        dlq_list(topic=None, reason=None, as_json=False)


@dlq_app.command("list")
def dlq_list(
    topic: Annotated[
        str | None, typer.Option("--topic", help="A stage topic (tools.raw) or its .dlq topic.")
    ] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="A kind (crash, parse_error, ...) or words of the reason.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per letter.")] = False,
) -> None:
    """Dead letters grouped by topic and reason, with counts (how many are replayed already)."""
    from consumers.dlq import DlqError, list_dead_letters

    cfg = settings()
    address = broker(cfg)
    try:
        rows = asyncio.run(list_dead_letters(address, topic=topic, reason=reason, settings=cfg))
    except DlqError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        return
    if not rows:
        console.print("no dead letters" + (" matching" if topic or reason else ""))
        return
    groups: dict[tuple[str, str, str, str], list[Any]] = defaultdict(list)
    for row in rows:
        groups[(row.source_topic, row.stage, row.kind, row.reason)].append(row)
    table = Table("topic", "stage", "kind", "reason", "letters", "replayed", "latest (UTC)")
    for (source, stage, kind, why), letters in sorted(groups.items()):
        table.add_row(
            source,
            stage,
            kind,
            escape(why if len(why) <= 160 else why[:157] + "..."),
            str(len(letters)),
            str(sum(r.replayed for r in letters)),
            max(r.at for r in letters).strftime("%Y-%m-%d %H:%M:%S"),
        )
    console.print(table)
    console.print(
        f"{len(rows)} dead letters; replay a topic's once fixed: `arena dlq replay TOPIC [--reason R]`"
    )


@dlq_app.command("replay")
def dlq_replay(
    topic: Annotated[str, typer.Argument(help="The stage topic (tools.raw) or its .dlq topic.")],
    reason: Annotated[
        str | None, typer.Option("--reason", help="Only letters of this kind or with these words.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Re-publish the topic's dead letters to it, each exactly once (fix their cause first)."""
    from consumers.dlq import DlqError, replay_dead_letters

    cfg = settings()
    address = broker(cfg)
    try:
        report = asyncio.run(replay_dead_letters(cfg, address, topic, reason=reason))
    except DlqError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        console.print(
            f"{report.source_topic}: {report.matched} matching, {report.replayed} replayed, "
            f"{report.skipped_already_replayed} replayed before, {report.in_progress} in progress elsewhere, "
            f"{len(report.failed)} failed"
        )
        for failure in report.failed:
            console.print(f"  [red]{failure.key}[/red]: {escape(failure.reason)}")
    if report.failed:
        raise typer.Exit(1)


# --- trace --------------------------------------------------------------


def trace(
    record_id: Annotated[str, typer.Argument(help="A record key, or a unique prefix of 8+ characters.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the trace as JSON.")] = False,
    depth: Annotated[int, typer.Option(min=1, help="Hops to walk each way.")] = 20,
) -> None:
    """Where a record came from (source document, stages, prompt versions) and what it fed (samples, training steps)."""
    from lake.trace import TraceError, trace_record

    try:
        report = trace_record(settings(), record_id, depth=depth)
    except TraceError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(report.model_dump_json(indent=2))
        return
    console.print(render_trace(report))


def _label(node: Any) -> str:
    if node.kind == "training_step":
        return f"[magenta]training step {node.step}[/magenta] of run {escape(node.run or '?')} ({node.phase})"
    colour = {"source": "green", "sample": "cyan", "dead_letter": "red"}.get(node.kind, "white")
    topic = escape(node.topic or "source (topic not in the lake)")
    origin = [f"{name} {value}" for name, value in (("server", node.server), ("file", node.file)) if value]
    where = f" [bold]{escape(', '.join(origin))}[/bold]" if origin else ""
    return f"[{colour}]{topic}[/{colour}] {escape(node.id)}{where}"


def _how(edge: Any, up: bool) -> str:
    """How an edge was made: up, the parent fed the child 'via' a stage; down, the child was made 'by' it."""
    if edge.stage == "train":
        return f" [dim]({', '.join(edge.roles)})[/dim]"
    parts = [f"{'via' if up else 'by'} {edge.stage} v{edge.stage_version}"]
    if edge.prompts:
        parts.append(", ".join(f"{p.role} v{p.version or '?'} {p.id}" for p in edge.prompts))
    if edge.backend:
        parts.append(edge.backend + (f"/{edge.model}" if edge.model else ""))
    return " [dim]" + escape("; ".join(parts)) + "[/dim]"


def _grow(
    tree: Tree, key: str, links: dict[str, list[Any]], nodes: dict[str, Any], up: bool, seen: set[str]
) -> None:
    children = links.get(key, [])
    for edge in children[:MAX_CHILDREN]:
        other = edge.parent if up else edge.child
        node = nodes[other]
        how = _how(edge, up)
        if other in seen:
            tree.add(f"{_label(node)}{how} [dim](shown above)[/dim]")
            continue
        seen.add(other)
        _grow(tree.add(_label(node) + how), other, links, nodes, up, seen)
    if len(children) > MAX_CHILDREN:
        tree.add(f"[dim]... {len(children) - MAX_CHILDREN} more (`arena trace --json` lists all)[/dim]")


def render_trace(report: Any) -> Tree:
    """The trace as a rich Tree: ancestors up to the sources, descendants down to training steps."""
    key = report.record.id
    root = Tree(f"{_label(report.record)} [bold]({report.record.kind})[/bold]")
    up_links: dict[str, list[Any]] = defaultdict(list)
    for edge in report.ancestors:
        up_links[edge.child].append(edge)
    down_links: dict[str, list[Any]] = defaultdict(list)
    for edge in report.descendants:
        down_links[edge.parent].append(edge)
    came = root.add(f"[bold]came from[/bold] ({len(report.sources)} source document(s))")
    if report.ancestors:
        _grow(came, key, up_links, report.nodes, True, {key})
    else:
        came.add("[dim]nothing: it is a source document[/dim]")
    fed = root.add(
        f"[bold]fed[/bold] ({len(report.samples)} sample(s), {len(report.training_steps)} training step(s))"
    )
    if report.descendants:
        _grow(fed, key, down_links, report.nodes, False, {key})
    else:
        fed.add("[dim]nothing yet[/dim]")
    if report.truncated:
        root.add("[yellow]the walk stopped at --depth; raise it to see more[/yellow]")
    return root

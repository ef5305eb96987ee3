"""Operating the pipeline: `arena stages` (per-stage ledger), `arena dlq` (dead letters: list,
replay) and `arena trace` (lineage)."""

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
MAX_LETTERS = 50
"""Letters `arena dlq` shows with their history, newest first (`--json` lists all)."""

TopicOption = Annotated[
    str | None, typer.Option("--topic", help="A stage topic (tools.raw) or its .dlq topic.")
]
ReasonOption = Annotated[
    str | None, typer.Option("--reason", help="A kind (crash, parse_error, ...) or words of the reason.")
]
ListJsonOption = Annotated[bool, typer.Option("--json", help="Print the letters as a JSON list.")]


@dlq_app.callback(invoke_without_command=True)
def dlq_default(
    ctx: typer.Context,
    topic: TopicOption = None,
    reason: ReasonOption = None,
    as_json: ListJsonOption = False,
) -> None:
    """`arena dlq` alone lists the dead letters (like `arena dlq list`, with the same options)."""
    if ctx.invoked_subcommand is None:
        dlq_list(topic=topic, reason=reason, as_json=as_json)
    elif topic or reason or as_json:
        raise UserError(
            f"put the options after `{ctx.invoked_subcommand}`: "
            f"`arena dlq {ctx.invoked_subcommand} ... --json` (or `arena dlq --json` to list)"
        )


@dlq_app.command("list")
def dlq_list(topic: TopicOption = None, reason: ReasonOption = None, as_json: ListJsonOption = False) -> None:
    """Dead letters grouped by topic and reason, with counts, then each letter's replay history."""
    from consumers.dlq import DlqError, DlqReadStalled, list_dead_letters

    cfg = settings()
    address = broker(cfg)
    try:
        rows = asyncio.run(list_dead_letters(address, topic=topic, reason=reason, settings=cfg))
    except (DlqError, DlqReadStalled) as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        return
    if not rows:
        console.print("no dead letters" + (" matching" if topic or reason else ""))
        return
    console.print(_groups_table(rows))
    console.print(_letters_table(rows))
    console.print(
        f"{len(rows)} dead letters; once the cause is fixed replay them to the stage that failed: "
        "`arena dlq replay TOPIC [--reason R]` or `arena dlq replay --key KEY` (`--force`: again)"
    )


def _clip(text: str, width: int) -> str:
    return escape(text if len(text) <= width else text[: width - 3] + "...")


def _groups_table(rows: list[Any]) -> Table:
    groups: dict[tuple[str, str, str, str], list[Any]] = defaultdict(list)
    for row in rows:
        groups[(row.source_topic, row.stage, row.kind, row.reason)].append(row)
    table = Table("topic", "stage", "kind", "reason", "letters", "replayed", "latest (UTC)")
    for (source, stage, kind, why), letters in sorted(groups.items()):
        table.add_row(
            source,
            stage,
            kind,
            _clip(why, 160),
            str(len(letters)),
            str(sum(r.replayed for r in letters)),
            max(r.at for r in letters).strftime("%Y-%m-%d %H:%M:%S"),
        )
    return table


def _letters_table(rows: list[Any]) -> Table:
    """The newest ``MAX_LETTERS`` letters, each with its history (replayed when, failed again as)."""
    newest = sorted(rows, key=lambda r: r.at, reverse=True)[:MAX_LETTERS]
    more = f" (newest {MAX_LETTERS} of {len(rows)}; `--json` lists all)" if len(rows) > MAX_LETTERS else ""
    table = Table("letter", "topic", "stage", "kind", "at (UTC)", "history", title=f"letters{more}")
    for row in newest:
        table.add_row(
            row.key[:12],
            row.source_topic,
            row.stage,
            row.kind,
            row.at.strftime("%Y-%m-%d %H:%M:%S"),
            _clip(row.history, 200),
        )
    return table


@dlq_app.command("replay")
def dlq_replay(
    topic: Annotated[
        str | None, typer.Argument(help="The stage topic (tools.raw) or its .dlq topic; optional with --key.")
    ] = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Only letters of this kind or with these words.")
    ] = None,
    keys: Annotated[
        list[str] | None,
        typer.Option("--key", help="Only this letter (its key or first 8+ characters); repeatable."),
    ] = None,
    force: Annotated[
        bool,
        typer.Option("--force", help="Replay failures replayed before too (say, after they failed again)."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Re-publish each matching failure's record for the stage that failed on it, once (fix the cause first)."""
    from consumers.dlq import DlqError, DlqReadStalled, replay_dead_letters

    cfg = settings()
    address = broker(cfg)
    try:
        report = asyncio.run(replay_dead_letters(cfg, address, topic, reason=reason, keys=keys, force=force))
    except (DlqError, DlqReadStalled) as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        again = (
            f" ({report.failed_again} failed again after it: `--force` replays them)"
            if report.failed_again
            else ""
        )
        console.print(
            f"{', '.join(report.source_topics) or topic}: {report.matched} failures matching, "
            f"{report.replayed} replayed, {report.skipped_already_replayed} replayed before{again}, "
            f"{report.in_progress} in progress elsewhere, {len(report.failed)} failed"
        )
        for failure in report.failed:
            console.print(f"  [red]{failure.key}[/red]: {escape(failure.reason)}")
    if report.failed:
        raise typer.Exit(1)


# --- stages -------------------------------------------------------------


def stages(
    track: Annotated[
        str | None, typer.Option("--track", help="Only this track's stages (tools, sft, envs, eigen).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object per stage.")] = False,
    version: Annotated[
        str, typer.Option("--version", help="A data version's stages (`arena replay --as`): its own ledger.")
    ] = "main",
) -> None:
    """What each stage made of its inputs: in = produced + rejected + dead_lettered + in_flight.

    Counts come from the stages.ledger topic (one entry per input record, written with its outputs
    in one transaction) and the input topics' data records; a stage that does not balance is flagged.
    """
    from app.registry import TRACKS
    from app.versions import data_version
    from arena.versions import MAIN, wire, worker_name
    from consumers.ledger import stage_ledgers

    cfg = settings()
    chosen = [t for t in TRACKS if track is None or t.name == track]
    if not chosen:
        raise UserError(f"unknown track {track!r}; known: {', '.join(t.name for t in TRACKS)}")
    runs = None
    if version != MAIN:
        spec = data_version(cfg, version)
        if spec is None:
            raise UserError(f"no data version {version!r} (fix: `arena data-versions list`)")
        runs = set(spec.stages)
    wanted = {
        worker_name(stage.name, version): wire(stage.input, version)
        for t in chosen
        for stage in t.stages
        if runs is None or stage.name in runs
    }
    ledgers = stage_ledgers(broker(cfg), wanted)
    if as_json:
        print(json.dumps([ledger.as_json() for ledger in ledgers], indent=2))
    else:
        console.print(render_stages(ledgers))
    unbalanced = [ledger.stage for ledger in ledgers if not ledger.balanced]
    if unbalanced and not as_json:
        console.print(
            f"[red]{len(unbalanced)} stage(s) do not balance: {', '.join(unbalanced)}[/red] "
            "(`arena worker --until-drained` names the records it skipped)"
        )


def _breakdown(counts: dict[str, int]) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def render_stages(ledgers: list[Any]) -> Table:
    """The per-stage ledger as a rich table; an unbalanced row in red."""
    table = Table(
        title="Stage ledger: IN = PROD (produced) + REJ (rejected) + DLQ + FLIGHT; OUT = records emitted"
    )
    table.add_column("STAGE", style="cyan", no_wrap=True)
    table.add_column("INPUT", overflow="fold")
    for name in ("IN", "PROD", "OUT", "REJ", "DLQ", "FLIGHT"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("WHY NOT PRODUCED", overflow="fold", min_width=16)
    for ledger in ledgers:
        why = "; ".join(
            part
            for part in (
                _breakdown(ledger.rejected_by_gate),
                _breakdown({f"dlq:{k}": n for k, n in ledger.dead_lettered_by_kind.items()}),
            )
            if part
        )
        row = [
            ledger.stage,
            ledger.topic,
            str(ledger.in_),
            str(ledger.produced),
            str(ledger.outputs),
            str(ledger.rejected),
            str(ledger.dead_lettered),
            str(ledger.in_flight),
            escape(why),
        ]
        if not ledger.balanced:
            row[0] = f"[red]{ledger.stage}[/red]"
            row[-1] = f"[red]unbalanced: {ledger.accounted} of {ledger.in_} accounted for[/red] {row[-1]}"
        elif not ledger.ran and ledger.in_:
            row[-1] = "[dim]idle: never ran[/dim]"
        table.add_row(*row)
    return table


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
    if edge.data_version != "main":
        parts.append(f"data version {edge.data_version}")
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

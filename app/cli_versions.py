"""`arena replay`, `arena diff` and `arena data-versions`: versioned re-synthesis from the command line.

``arena replay STAGE --as NAME`` makes a data version (``app.replay``): the stage and everything
downstream of it re-run over a range of the stage's input, with setting and prompt overrides, into
topics of their own; ``arena worker`` runs it like the rest (``--until-drained`` drains it).
``arena diff A B`` compares two versions stage by stage (``consumers.version_diff``);
``arena data-versions`` lists, shows and drops them (``main`` is the live pipeline, never dropped).
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.table import Table

from app.cli_common import UserError, broker, console, err, known_version, settings
from arena.versions import MAIN, VersionSpec, check_name

versions_app = typer.Typer(
    no_args_is_help=True,
    help="Data versions made by `arena replay`: list, show, drop (not `arena eigen versions`: prompt sets).",
)


def replay(
    stage: Annotated[str, typer.Argument(help="The stage to re-run (its downstream follows).")],
    name: Annotated[str, typer.Option("--as", help="Name of the new data version.")],
    start: Annotated[
        str | None, typer.Option("--from", help="First input offset (every partition) or ISO time.")
    ] = None,
    until: Annotated[
        str | None,
        typer.Option("--until", help="Input offset or ISO time to stop before (default: the end)."),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Replay every input record the parent has.")] = False,
    sets: Annotated[
        list[str] | None,
        typer.Option(
            "--set", help="A setting for the version: KEY=VALUE, e.g. sft.theta_question_quality=0.9."
        ),
    ] = None,
    prompts: Annotated[
        list[str] | None,
        typer.Option(
            "--prompt", help="A role's prompt for the version: ROLE=FILE (`arena llm prompt ROLE`)."
        ),
    ] = None,
    parent: Annotated[str, typer.Option(help="The version whose input to replay.")] = MAIN,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Say what would run, how many records and LLM calls; change nothing."),
    ] = False,
) -> None:
    """Re-run STAGE over a range of its input into a new data version; stages downstream follow.

    Upstream stages and other versions are not touched and make no LLM calls. Run the version with
    `arena worker` (`--until-drained` drains it); compare it with `arena diff main NAME`.
    """
    from app.replay import parse_bound, parse_prompts, parse_settings
    from app.replay import plan as make_plan

    cfg = settings()
    overrides = parse_settings(sets or [])  # the user's mistakes first: nothing starts for them
    texts = parse_prompts(prompts or [])
    address = broker(cfg)
    found = asyncio.run(
        make_plan(
            cfg,
            address,
            stage=stage,
            name=name,
            parent=parent,
            start=parse_bound(start, "--from"),
            until=parse_bound(until, "--until"),
            every=every,
            overrides=overrides,
            prompts=texts,
        )
    )
    spec = found.spec
    _print_plan(spec, found.estimate, dry_run=dry_run)
    if dry_run:
        return
    from app.replay import execute

    with err.status(f"copying the input of {spec.name}..."):
        sent = asyncio.run(execute(cfg, address, found))
    console.print(
        f"[green]data version {spec.name}[/green] made: {sent} records copied in; "
        f"run it with `arena worker --until-drained` (or `--version {spec.name}`), "
        f"then `arena diff {spec.parent} {spec.name}`"
    )


def _print_plan(spec: VersionSpec, estimate: dict[str, float], *, dry_run: bool) -> None:
    head = "would replay" if dry_run else "replaying"
    console.print(
        f"{head} [bold]{spec.stage}[/bold] into data version [bold]{spec.name}[/bold] (parent {spec.parent})"
    )
    console.print(f"  stages that run: {', '.join(spec.stages)}")
    lake = sum(r.from_lake for r in spec.ranges)
    console.print(
        f"  input records: {spec.records} of {spec.input_topic}"
        + (f" ({lake} read from the lake: retention had removed them)" if lake else "")
    )
    for r in spec.ranges:
        noun = "record" if r.records == 1 else "records"
        console.print(f"    partition {r.partition}: offsets {r.start}..{r.end} ({r.records} {noun})")
    for name, count in spec.inherited.items():
        console.print(
            f"  inherited unchanged from {spec.parent}: {count} records of {name} (written by stages that do not run)"
        )
    for key, value in spec.settings.items():
        console.print(f"  setting {key}={value}")
    for role, version in spec.prompt_versions.items():
        console.print(f"  prompt {role}: {version}")
    if estimate:
        console.print(
            f"  estimated LLM use: {estimate['calls']:.0f} calls, at most {estimate['requests']:.0f} requests "
            f"and {estimate['tokens']:.0f} tokens (from the parent's cost over its "
            f"{estimate['parent_inputs']:.0f} {spec.stage} inputs; a cached answer costs no request)"
        )
    else:
        console.print("  estimated LLM use: unknown (the lake has no llm_usage of the parent yet)")


@versions_app.command("list")
def versions_list(as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False) -> None:
    """Every data version: its parent, the stage it re-ran, its input and overrides."""
    from app.versions import data_versions

    specs = data_versions(settings())
    if as_json:
        print(
            json.dumps([{**s.model_dump(mode="json"), "config_hash": s.config_hash} for s in specs], indent=2)
        )
        return
    table = Table(title="Data versions (main: the live pipeline)")
    for column in ("version", "parent", "stage", "records", "overrides", "created"):
        table.add_column(column)
    for s in specs:
        overrides = [*s.settings, *(f"prompt {r}" for r in s.prompts)]
        created = s.created_at.strftime("%Y-%m-%d %H:%M") if s.created_at else ""
        table.add_row(s.name, s.parent, s.stage, str(s.records), ", ".join(overrides) or "-", created)
    console.print(table)


@versions_app.command("show")
def versions_show(name: Annotated[str, typer.Argument(help="The data version.")]) -> None:
    """Everything the catalog records about a data version, as JSON."""
    from app.versions import data_version

    spec = data_version(settings(), name)
    if spec is None:
        raise UserError(f"no data version {name!r} (fix: `arena data-versions list`)")
    print(json.dumps({**spec.model_dump(mode="json"), "config_hash": spec.config_hash}, indent=2))


@versions_app.command("drop")
def versions_drop(
    name: Annotated[str, typer.Argument(help="The data version to delete.")],
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask for confirmation.")] = False,
) -> None:
    """Delete a data version: its topics, consumer groups, lake files and catalog rows (never main's)."""
    from app.version_drop import drop_version

    try:
        check_name(name, new=True)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    cfg = settings()
    if not yes and not typer.confirm(
        f"delete data version {name!r}: its topics, lake files and catalog rows?"
    ):
        raise typer.Exit(1)
    dropped = drop_version(cfg, broker(cfg), name)
    console.print(
        f"dropped {name}: {dropped.topics} topics, {dropped.groups} consumer groups, "
        f"{dropped.files} lake files, {dropped.rows} catalog rows"
    )


def diff(
    a: Annotated[str, typer.Argument(help="A data version (e.g. main).")],
    b: Annotated[str, typer.Argument(help="Another data version.")],
    stage: Annotated[str | None, typer.Option("--stage", help="Only this stage.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    examples: Annotated[
        int, typer.Option(min=0, max=50, help="Changed outputs shown side by side per stage.")
    ] = 3,
) -> None:
    """Compare two data versions stage by stage: records in and out, rejections by gate, dead
    letters, rewards and F1 (mean with a 95% interval), outputs only in A, only in B and in both
    (matched by the upstream record they came from), LLM calls and tokens per output, and examples."""
    from consumers.version_diff import compare, render_diff
    from lake.store import open_store

    cfg = settings()
    for name in (a, b):
        try:
            check_name(name)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    for name in dict.fromkeys((a, b)):
        known_version(cfg, name)
    result = compare(open_store(cfg), a, b, stage=stage, examples=examples)
    if stage is not None and not result.stages:
        raise UserError(
            f"stage {stage!r} made nothing in {a} or {b} (fix: a stage from `arena data-versions show {b}`)"
        )
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    for renderable in render_diff(result):
        console.print(renderable)

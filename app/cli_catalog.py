"""What the pipeline made, from the catalog and the lake: `arena eigen`, `env`, `export` and `lake`."""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from app.cli_common import UserError, console, known_version, settings
from arena.config import ArenaSettings

lake_app = typer.Typer(no_args_is_help=True, help="Query and list the artifact lake.")
export_app = typer.Typer(no_args_is_help=True, help="Export training data from the lake.")
env_app = typer.Typer(no_args_is_help=True, help="Inspect and re-verify environment packages.")
eigen_app = typer.Typer(
    no_args_is_help=True,
    help="EigenData self-evolution in the catalog: prompt sets, versions, critiques, evolution curves.",
)

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
            (f"{a['name']}={a.get('value')}" if "name" in a else f"{a.get('worker')}: {a.get('kind')}")
            + (" (skipped: frozen)" if a.get("skipped") else "")
            for a in row.applied_list()
        )
        table.add_row(str(row.iteration), scores, "; ".join(critique.get("findings") or [])[:200], applied)
    console.print(table)


SPARKS = "▁▂▃▄▅▆▇█"
CURVE_METRICS = (
    ("infeasibility", "infeas.", "infeasibility"),
    ("tool_call_validity", "validity", "validity"),
    ("quality", "quality", "task quality"),
    ("dialogue_first_pass_rate", "1st pass", "first dialogues passed"),
    ("dialogue_pass_rate", "passed", "dialogues passed"),
    ("dialogue_quality", "dlg qual.", "dialogue quality"),
    ("verified_share", "verified", "verified share"),
)
"""The evolution-log metrics ``arena eigen curve`` shows: (PilotMetrics key, column title, curve label)."""
WORKER_ABBREV = {
    "RandomPool": "RP",
    "UserIntent": "UI",
    "TaskValidation": "TV",
    "DialogSynthesis": "DS",
    "TrajectoryValidation": "TrV",
    "Modify": "Mod",
    "VerificationFunction": "VF",
}


def sparkline(values: list[float | None], low: float = 0.0, high: float = 1.0) -> str:
    """One character per value, ▁ (``low``) to █ (``high``); a space where there is no value."""
    span = (high - low) or 1.0
    out = []
    for value in values:
        if value is None:
            out.append(" ")
            continue
        level = round((min(max(value, low), high) - low) / span * (len(SPARKS) - 1))
        out.append(SPARKS[level])
    return "".join(out)


def _changed_prompts(rows: list[Any]) -> list[list[str]]:
    """Per logged iteration: the worker roles whose prompt version differs from the iteration before."""
    changed: list[list[str]] = []
    before: dict[str, str] | None = None
    last_run = None
    for row in rows:
        now = row.prompt_versions_dict()
        if before is None or row.run != last_run:
            changed.append([])
        else:
            changed.append(sorted(r for r in now if before.get(r) != now[r]))
        before, last_run = now, row.run
    return changed


@eigen_app.command("curve")
def eigen_curve(
    set_id: Annotated[str, typer.Argument(help="Prompt set id.")],
    run: Annotated[int | None, typer.Option("--run", help="Only this pilot run (default: all).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the log as JSON lines.")] = False,
    prompts: Annotated[
        bool, typer.Option("--prompts", help="Also print the lines each changed prompt gained or lost.")
    ] = False,
) -> None:
    """The evolution log of a set: per pilot iteration, the workers run, the prompts changed, the metrics."""
    store = _eigen_store(settings())
    _known_set(store, set_id)
    rows = store.iterations(set_id, run)
    if not rows:
        raise UserError(
            f"prompt set {set_id!r} has no logged pilot iterations"
            + (f" in run {run}" if run is not None else "")
            + " (fix: pilot it, e.g. `arena publish domain`, then list runs with `arena eigen curve SET_ID`)"
        )
    changed = _changed_prompts(rows)
    if as_json:
        for row, roles in zip(rows, changed, strict=True):
            print(
                json.dumps(
                    {
                        "run": row.run,
                        "iteration": row.iteration,
                        "version": row.version,
                        "workers": row.workers_list(),
                        "frozen": row.frozen_list(),
                        "prompt_versions": row.prompt_versions_dict(),
                        "prompts_changed": roles,
                        "calls": row.calls_dict(),
                        "metrics": row.metrics_dict(),
                    }
                )
            )
        return
    table = Table(
        "run",
        "iter",
        "ver",
        "workers run",
        "prompts changed",
        *(title for _, title, _ in CURVE_METRICS),
        title=set_id,
    )
    for row, roles in zip(rows, changed, strict=True):
        metrics = row.metrics_dict()
        frozen = set(row.frozen_list())
        workers = " ".join(WORKER_ABBREV.get(w, w) + ("*" if w in frozen else "") for w in row.workers_list())
        cells = [f"{metrics[k]:.2f}" if k in metrics else "-" for k, _, _ in CURVE_METRICS]
        shown = ", ".join(r.removeprefix("eigen_") for r in roles)
        table.add_row(str(row.run), str(row.iteration), str(row.version), workers, shown, *cells)
    console.print(table)
    console.print(
        "workers: " + ", ".join(f"{a} {w}" for w, a in WORKER_ABBREV.items()) + "; * prompts frozen"
    )
    for run_no in sorted({r.run for r in rows}):
        series = [r.metrics_dict() for r in rows if r.run == run_no]
        lines = [
            f"  {label:<22} {sparkline([m.get(key) for m in series])}  "
            + " ".join("-" if m.get(key) is None else f"{m[key]:.2f}" for m in series)
            for key, _, label in CURVE_METRICS
            if any(key in m for m in series)
        ]
        console.print(f"run {run_no} ({len(series)} iterations):\n" + "\n".join(lines))
    if prompts:
        _print_prompt_changes(settings(), rows, changed)


def _print_prompt_changes(cfg: ArenaSettings, rows: list[Any], changed: list[list[str]]) -> None:
    """Per iteration and changed worker role: the prompt lines added (+) and removed (-)."""
    from lake.catalog import Catalog

    ids = {v for row in rows for v in row.prompt_versions_dict().values()}
    catalog = Catalog(cfg.catalog)
    try:
        texts = {k: v.text for k, v in catalog.prompt_versions_by_id(sorted(ids)).items()}
    finally:
        catalog.dispose()
    for n, (row, roles) in enumerate(zip(rows, changed, strict=True)):
        for role in roles:
            before = rows[n - 1].prompt_versions_dict().get(role, "")
            now = row.prompt_versions_dict()[role]
            old, new = texts.get(before, "").splitlines(), texts.get(now, "").splitlines()
            diff = [f"  + {line}" for line in new if line not in old] + [
                f"  - {line}" for line in old if line not in new
            ]
            console.print(
                f"run {row.run} iteration {row.iteration}: {role} {before} -> {now}",
                markup=False,
                soft_wrap=True,
            )
            console.print("\n".join(diff) or "  (same lines, reordered)", markup=False, soft_wrap=True)


# --- export -------------------------------------------------------------


@export_app.command("sft")
def export_sft_cmd(
    path: Annotated[Path, typer.Argument(help="Output file.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    version: Annotated[
        str, typer.Option("--version", help="The data version's samples (`arena data-versions list`).")
    ] = "main",
) -> None:
    """Write `samples.sft` from the lake as JSONL or Parquet (loadable with HF `datasets`)."""
    from consumers.export_sft import export_sft
    from lake.store import open_store

    if fmt not in ("jsonl", "parquet"):
        raise UserError(f"--format must be jsonl or parquet, got {fmt!r}")
    if path.is_dir():
        raise UserError(f"{path} is a folder (fix: give a file path, e.g. {path / ('sft.' + fmt)})")
    cfg = settings()
    known_version(cfg, version)
    count = export_sft(open_store(cfg), path, fmt, version)  # type: ignore[arg-type]
    console.print(f"wrote {count} SFT samples of data version {version} to {path} ({fmt})")


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

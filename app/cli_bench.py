"""``arena eval --bench tau2|bfcl``: a public benchmark on a model at an OpenAI-compatible URL.

``arena eval`` without ``--bench`` scores Arena's own held-out packages (``trainer.evaluate``); with
it, the model at ``--model openai://host:port/v1?model=NAME`` is scored by the benchmark's own
checker (``trainer.benchmarks.bfcl``, ``trainer.benchmarks.tau2``) and reported with the
do-nothing floor beside each figure (``trainer.benchmarks.report``). For tau2, ``--model`` may
also be a checkpoint folder, and be given several times: the checkpoints (a base and what was
trained from it) are scored on the same tasks, user openings and floor, with one sandbox pool.

``arena decontam index|report``: the benchmarks' test items that synthesized tasks must not repeat
(``trainer.decontam``), and the near-duplicates in the lake that training leaves out.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from app.cli_common import UserError, console, err, settings

if TYPE_CHECKING:
    from arena.config import ArenaSettings
    from trainer.benchmarks.report import BenchReport

BENCHES = ("bfcl", "tau2")


def check_bench_options(
    bench: str, models: Sequence[str], domain: str | None, category: str | None
) -> list[str]:
    """The endpoint URL (or, for tau2, the local checkpoint folders) to evaluate; ``UserError`` for
    options that do not fit the benchmark."""
    if bench not in BENCHES:
        raise UserError(f"--bench {bench!r}: use one of {', '.join(BENCHES)}")
    if not models:
        local = " or a checkpoint folder" if bench == "tau2" else ""
        raise UserError(
            f"--bench {bench} evaluates a served model{local} (fix: --model openai://host:port/v1?model=NAME, "
            "e.g. `arena llm serve` or vLLM)"
        )
    if len(models) > 1 and not (bench == "tau2" and not any(map(_is_endpoint, models))):
        raise UserError(
            f"--model {len(models)} times: several models go with --bench tau2 and local checkpoint "
            "folders only, evaluated on the same tasks (fix: one --model per run for endpoints and bfcl)"
        )
    checked = [_check_bench_model(bench, model) for model in models]
    if bench == "bfcl" and domain is not None:
        raise UserError("--domain is for --bench tau2 (fix: --category for bfcl)")
    if bench == "tau2" and category is not None:
        raise UserError("--category is for --bench bfcl (fix: --domain for tau2)")
    if bench == "tau2" and not domain:
        raise UserError("--bench tau2 needs --domain (fix: --domain airline, retail or telecom)")
    return checked


def _is_endpoint(model: str) -> bool:
    from trainer.endpoint_policy import is_endpoint

    return is_endpoint(model)


def _check_bench_model(bench: str, model: str) -> str:
    from trainer.endpoint_policy import EndpointError, check_endpoint_url

    if bench == "tau2" and not _is_endpoint(model):
        if not (Path(model) / "config.json").is_file():
            raise UserError(
                f"--model {model}: not an endpoint URL nor a checkpoint folder with a config.json "
                "(fix: --model openai://host:port/v1?model=NAME, or a folder `arena train` or `arena export` wrote)"
            )
        return model
    try:
        check_endpoint_url(model)
    except EndpointError as exc:
        raise UserError(str(exc)) from None
    return model


def run_bench(
    cfg: ArenaSettings,
    bench: str,
    models: Sequence[str],
    *,
    domain: str | None,
    category: str | None,
    k: int,
    trials: int,
    limit: int | None,
    concurrency: int,
    seed: int,
    split: str = "test",
) -> list[BenchReport]:
    """Run ``bench`` on each model (``check_bench_options``): a report per model, in order. Several
    tau2 checkpoints share one sandbox pool, the tasks and the user's openings. Errors become
    ``UserError``s naming the fix."""
    from trainer.endpoint_policy import EndpointError

    try:
        if bench == "bfcl":
            from trainer.benchmarks.bfcl import DEFAULT_CATEGORIES, BfclError, run_bfcl

            try:
                return [
                    run_bfcl(
                        cfg,
                        models[0],
                        category=category or DEFAULT_CATEGORIES,
                        k=k,
                        trials=trials,
                        limit=limit,
                        concurrency=concurrency,
                        seed=seed,
                    )
                ]
            except BfclError as exc:
                raise UserError(str(exc)) from None
        from sandbox.pool import SandboxUnavailable
        from trainer.benchmarks.tau2 import Tau2BenchError, run_tau2, run_tau2_checkpoints

        assert domain is not None  # check_bench_options
        if split not in ("test", "train", "all"):
            raise UserError(f"--split {split!r}: use test, train or all")
        options: dict[str, Any] = dict(
            domain=domain, k=k, trials=trials, limit=limit, concurrency=concurrency, seed=seed, split=split
        )
        try:
            if len(models) > 1:
                return run_tau2_checkpoints(cfg, models, **options)
            return [run_tau2(cfg, models[0], **options)]
        except (Tau2BenchError, SandboxUnavailable) as exc:  # unknown domain, no .venv-tau2, no sandbox
            raise UserError(f"--bench tau2: {exc}") from None
    except EndpointError as exc:  # the endpoint does not serve
        raise UserError(str(exc)) from None


def print_bench(reports: Sequence[BenchReport], as_json: bool) -> None:
    """A table per report; ``--json``: the report, or a list of them when several models ran."""
    from trainer.benchmarks.report import bench_table

    if as_json:
        if len(reports) == 1:
            console.print_json(reports[0].model_dump_json())
        else:
            console.print_json(json.dumps([r.model_dump(mode="json") for r in reports]))
        return
    for report in reports:
        console.print(bench_table(report))


# --- arena decontam -----------------------------------------------------------

decontam_app = typer.Typer(
    no_args_is_help=True,
    help="Keep benchmark test items out of training: index them, report near-duplicates in the lake.",
)


@decontam_app.command("index")
def decontam_index(
    bfcl: Annotated[
        str, typer.Option(help="BFCL categories whose questions to index, comma-separated; 'all' or 'none'.")
    ] = "all",
    tau2: Annotated[
        str, typer.Option(help="tau2 domains whose test split to index, comma-separated; 'none' for none.")
    ] = "airline,retail,telecom",
    tau2_data: Annotated[
        Path | None,
        typer.Option(help="tau2's data folder (…/tau2/data/tau2/domains; default: the one in .venv-tau2)."),
    ] = None,
    ngram: Annotated[int, typer.Option(min=1, max=50, help="Words per n-gram.")] = 5,
    threshold: Annotated[
        float, typer.Option(min=0.01, max=1.0, help="Shared share of the smaller text's n-grams that flags.")
    ] = 0.5,
    cosine: Annotated[
        float,
        typer.Option(
            min=0.0, max=1.0, help="Embedding cosine that flags a paraphrase; 0: n-grams only (no embedding)."
        ),
    ] = 0.9,
) -> None:
    """Load the benchmarks' test items; from then on `arena train` leaves out their near-duplicates."""
    from trainer.benchmarks.bfcl import BfclError, categories_of
    from trainer.decontam import (
        BenchmarkIndex,
        BenchmarkItem,
        bench_counts,
        bfcl_items,
        save_index,
        tau2_items,
    )

    cfg = settings()
    items: list[BenchmarkItem] = []
    if bfcl != "none":
        try:
            items += bfcl_items(None if bfcl == "all" else categories_of(bfcl))
        except BfclError as exc:
            raise UserError(f"--bfcl: {exc}") from None
    if tau2 != "none":
        items += tau2_items(_tau2_data(tau2_data), [d.strip() for d in tau2.split(",") if d.strip()])
    if not items:
        raise UserError("nothing to index (fix: leave --bfcl or --tau2 at their defaults)")
    index = BenchmarkIndex(ngram=ngram, threshold=threshold, cosine=cosine or None, items=items)
    if cosine:
        err.print(f"embedding {len(items)} benchmark test items (a paraphrase shares few n-grams)")
    path = save_index(cfg.home, index)
    counts = ", ".join(f"{bench} {n}" for bench, n in bench_counts(index).items())
    console.print(f"indexed {len(items)} benchmark test items ({counts}) in {path}")


def _tau2_data(given: Path | None) -> Path:
    if given is not None:
        if not given.is_dir():
            raise UserError(f"--tau2-data {given}: no such folder (fix: tau2's data/tau2/domains folder)")
        return given
    from environments.tau2_env import tau2_data_dir

    try:
        return tau2_data_dir()
    except Exception as exc:  # tau2-bench not installed where Arena looks
        raise UserError(
            f"--tau2: tau2-bench not found ({exc}) (fix: bash scripts/install_tau2.sh, pass --tau2-data, "
            "or --tau2 none)"
        ) from None


@decontam_app.command("report")
def decontam_report(
    topic: Annotated[
        list[str] | None,
        typer.Option("--topic", help="Topic to scan (repeatable; default all synthesis ones)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Synthesized tasks in the lake that near-duplicate a benchmark test item (what training leaves out)."""
    from lake.store import open_store
    from trainer.decontam import SCANNED_TOPICS, bench_counts, lake_records, near_duplicates, scan

    cfg = settings()
    tests = near_duplicates(cfg.home)
    if tests is None:
        raise UserError("no benchmark index yet (fix: `arena decontam index` first)")
    index = tests.index
    topics = topic or list(SCANNED_TOPICS)
    unknown = [t for t in topics if t not in SCANNED_TOPICS]
    if unknown:
        raise UserError(f"--topic {', '.join(unknown)}: use some of {', '.join(SCANNED_TOPICS)}")
    report = scan(tests, lake_records(open_store(cfg), topics), bench_counts(index))
    if as_json:
        console.print_json(report.model_dump_json())
        return
    by_cosine = "" if index.cosine is None else f", or embedding cosine >= {index.cosine:.2f}"
    table = Table(
        title=f"near-duplicates of benchmark test items ({index.ngram}-grams >= {index.threshold:.0%}{by_cosine})"
    )
    for column in ("topic", "key", "benchmark item", "by", "overlap", "cosine", "text"):
        table.add_column(column)
    for c in report.flagged:
        cos = "" if c.cosine is None else f"{c.cosine:.2f}"
        table.add_row(
            c.topic, c.key[:16], f"{c.bench} {c.item_id}", c.by, f"{c.overlap:.0%}", cos, c.text[:80]
        )
    console.print(table)
    scanned = ", ".join(f"{t} {report.scanned.get(t, 0)}" for t in topics)
    console.print(f"scanned: {scanned}; flagged {len(report.flagged)} (excluded from training)")

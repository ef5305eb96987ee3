"""The `arena` command line: the stack, topics, workers, training, lag, the demo.

Command groups live beside it (``app.cli_publish``: publish; ``app.cli_catalog``: eigen, env,
export, lake); what they share is ``app.cli_common``. User mistakes (a missing file, a bad
setting, bad SQL) print one clear message naming what and how to fix it, and exit 2 without a
traceback.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.table import Table

from app.cli_bench import decontam_app
from app.cli_catalog import eigen_app, env_app, export_app, lake_app
from app.cli_common import UserError, broker, console, err, known_version, ready_broker, settings
from app.cli_domain import domain_app
from app.cli_llm import llm_app
from app.cli_ops import dlq_app, stages, trace
from app.cli_publish import publish_app
from app.cli_reward import reward_app
from app.cli_versions import diff, replay, versions_app
from app.exit import freeze_heap_at_exit
from arena.config import ArenaSettings
from sandbox.cli import app as sandbox_app

if TYPE_CHECKING:
    from app.forkserver import ForkServer

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Arena: streaming tool-use data synthesis.",
)
topics_app = typer.Typer(no_args_is_help=True, help="Create and list Arena's Kafka topics.")
app.add_typer(topics_app, name="topics")
app.add_typer(publish_app, name="publish")
app.add_typer(lake_app, name="lake")
app.add_typer(export_app, name="export")
app.add_typer(env_app, name="env")
app.add_typer(eigen_app, name="eigen")
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(llm_app, name="llm")
app.add_typer(dlq_app, name="dlq")
app.add_typer(reward_app, name="reward")
app.add_typer(decontam_app, name="decontam")
app.add_typer(domain_app, name="domain")
app.add_typer(versions_app, name="data-versions")
app.command("trace")(trace)
app.command("stages")(stages)
app.command("replay")(replay)
app.command("diff")(diff)

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
    from app.stack import live_services
    from app.stack import status as stack_status
    from arena.llm.admission import read_stats, socket_path
    from arena.llm.outage import read_states

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
    for service in live_services(cfg):
        table.add_row(service.name, f"{service.address} (running, pid {service.pid}; `arena down` stops it)")
    for endpoint in read_states(cfg.home):
        if endpoint.state == "up":
            text = f"{endpoint.endpoint}: serving"
        else:
            since = endpoint.since.strftime("%H:%M:%S")
            text = f"[red]waiting on {endpoint.endpoint} since {since} UTC[/red]: {endpoint.reason}"
        table.add_row(f"llm ({endpoint.stage}, pid {endpoint.pid})", text)
    admission = read_stats(socket_path(cfg))
    for name, stats in (admission.endpoints if admission else {}).items():
        stages = ", ".join(
            f"{stage} {line.in_flight} (weight {line.weight:.1f}, {line.waiting} waiting)"
            for stage, line in sorted(stats.stages.items(), key=lambda kv: -kv[1].priority)
        )
        limit = f"{stats.limit} learned of {stats.capacity}" if stats.learning else str(stats.capacity)
        table.add_row(
            "llm admission",
            f"{name}: {stats.in_flight}/{limit} in flight, {stats.waiting} waiting, "
            f"most {stats.max_in_flight}, busy {stats.busy_s:.0f}s; {stages}",
        )
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
def topics_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """The topic registry: name, partitions, key, value schema, retention, who writes and who reads it."""
    from app.registry import topic_roles
    from arena.topics import TOPICS

    roles = topic_roles()
    rows = []
    for spec in TOPICS.values():
        retention = "forever" if spec.retention_ms < 0 else f"{spec.retention_ms // 86_400_000}d"
        rows.append(
            {
                "topic": spec.name,
                "partitions": spec.partitions,
                "key": spec.key,
                "value": spec.value.__name__,
                "retention": retention,
                "lake_view": spec.table,
                "writers": list(roles[spec.name].writers),
                "readers": list(roles[spec.name].readers),
            }
        )
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table("topic", "partitions", "key", "value", "retention", "lake view", "written by", "read by")
    for row in rows:
        cells = [str(row[k]) for k in ("topic", "partitions", "key", "value", "retention", "lake_view")]
        topic = roles[str(row["topic"])]
        table.add_row(*cells, ", ".join(topic.writers) or "-", ", ".join(topic.readers) or "-")
    console.print(table)


# --- workers ------------------------------------------------------------


MetricsPort = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        min=0,
        max=65535,
        help="Serve Prometheus /metrics on this port (0: off; default ARENA_METRICS__PORT).",
    ),
]
"""The ``--metrics-port`` option of `arena worker` and `arena train`."""


@app.command("worker")
def worker_cmd(
    stage: Annotated[
        list[str] | None, typer.Option("--stage", help="Stage to run (repeatable). Default: all.")
    ] = None,
    track: Annotated[
        list[str] | None,
        typer.Option("--track", help="Run every stage of a track: tools, sft, envs, eigen (repeatable)."),
    ] = None,
    until_drained: Annotated[
        bool, typer.Option("--until-drained", help="Exit 0 once every stage group has zero lag.")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option(help="With --until-drained: give up (exit 1) after this many seconds.")
    ] = None,
    replicas: Annotated[
        int,
        typer.Option(
            min=1, max=64, help="Processes per stage in its consumer group; they share its partitions."
        ),
    ] = 1,
    metrics_port: MetricsPort = None,
    version: Annotated[
        list[str] | None,
        typer.Option(
            "--version",
            help="Run a data version's workers (`arena replay --as NAME`; repeatable). Default: main's "
            "and every version's.",
        ),
    ] = None,
) -> None:
    """Run stage workers (Faust, exactly-once) until stopped or drained."""
    from app.forkserver import start_fork_server
    from app.metrics_http import with_metrics_port

    cfg = with_metrics_port(settings(), metrics_port)
    # First, while this process runs one thread: the fork server, forked once the stage code is imported.
    forks = start_fork_server(cfg)
    try:
        code = _run_worker_cmd(cfg, stage, track, version, until_drained, timeout, replicas, forks)
    finally:
        if forks is not None and forks.alive():  # not handed over (a bad argument): not needed
            forks.kill()
    raise typer.Exit(code)


def _run_worker_cmd(
    cfg: ArenaSettings,
    stage: list[str] | None,
    track: list[str] | None,
    version: list[str] | None,
    until_drained: bool,
    timeout: float | None,
    replicas: int,
    forks: ForkServer | None,
) -> int:
    """`arena worker` once its fork server is starting: the workers chosen, run; the exit code."""
    from app.metrics_http import MetricsPortError
    from app.registry import TRACKS, WORKERS, register_versions
    from app.versions import data_versions
    from app.worker import run_workers

    known_tracks = {t.name: t for t in TRACKS}
    for name in track or []:
        if name not in known_tracks:
            raise UserError(f"unknown track {name!r} (fix: use one of {', '.join(known_tracks)})")
    main_workers = list(WORKERS)
    # The catalog is read only when versions may be asked for: `--stage NAME` of main starts at once.
    wanted = version or (not stage and not track) or any("@" in name for name in stage or [])
    specs = {spec.name: spec for spec in data_versions(cfg)} if wanted else {}
    for name in version or []:
        if name not in specs:
            known = ", ".join(specs) or "none yet: `arena replay STAGE --as NAME` makes one"
            raise UserError(
                f"unknown data version {name!r} (fix: one of {known}; `arena data-versions list`)"
            )
    version_workers = register_versions(specs.values())
    chosen = [
        *(stage or []),
        *(s.name for name in track or [] for s in known_tracks[name].stages),
        *(w for name in version or [] for w in specs[name].workers()),
    ]
    names = list(dict.fromkeys(chosen)) or [*main_workers, *version_workers]
    unknown = [n for n in names if n not in WORKERS]
    if unknown:
        raise UserError(f"unknown stage {unknown[0]!r} (fix: use one of {', '.join(WORKERS)})")
    try:
        return run_workers(
            cfg,
            ready_broker(cfg),
            names,
            until_drained=until_drained,
            timeout_s=timeout,
            console=err,
            replicas=replicas,
            forks=forks,
        )
    except MetricsPortError as exc:
        raise UserError(str(exc)) from None


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
    metrics_port: MetricsPort = None,
    preset: Annotated[
        str | None,
        typer.Option(
            "--preset",
            help="Hyper-parameters of a paper ('astra': ASTRA §3); explicit ARENA_TRAIN__* settings win.",
        ),
    ] = None,
    version: Annotated[
        str,
        typer.Option(
            "--version",
            help="Train on this data version's samples (`arena replay --as`); a new run per version.",
        ),
    ] = "main",
) -> None:
    """Train continuously: SFT on samples.sft, then online GRPO on samples.verified; resumes after a crash."""
    from app.metrics_http import MetricsPortError, serve_process_metrics, with_metrics_port

    cfg = with_metrics_port(settings(), metrics_port)
    if preset is not None:
        from trainer.presets import UnknownPreset, apply_preset

        try:
            cfg, chosen = apply_preset(cfg, preset)
        except UnknownPreset as exc:
            raise UserError(f"--preset: {exc}") from None
        err.print(f"preset {preset!r}: " + ", ".join(f"{k}={v}" for k, v in chosen.items()))
    if run is not None:
        try:
            checked = type(cfg.train).model_validate({"run": run}).run
            cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"run": checked})})
        except ValidationError:
            raise UserError(f"--run {run!r}: use letters, digits, '_', '.', '-' (at most 64)") from None
    from trainer.preflight import BackendUnavailable, NoCheckpoint, check_backend, check_start

    try:  # before the stack starts: a device or backend this machine lacks is a setting to fix
        check_backend(cfg.train.device, cfg.train.backend)
    except BackendUnavailable as exc:
        raise UserError(str(exc)) from None

    known_version(cfg, version)
    trained_on = _trained_on(cfg, cfg.train.run, default=None)
    if trained_on is not None and trained_on != version:
        raise UserError(
            f"run {cfg.train.run!r} trains on data version {trained_on!r}, not {version!r}: a run never "
            f"mixes versions (fix: --run NEW_NAME for a run on {version!r})"
        )
    address = ready_broker(cfg)
    try:  # what the run's checkpoints and the model setting decide, before torch loads (seconds)
        check_start(cfg, tiny=tiny, resume=resume)
    except (NoCheckpoint, FileNotFoundError) as exc:
        raise UserError(str(exc)) from None
    from trainer.service import TrainerService, TrainOptions

    options = TrainOptions(
        tiny=tiny, steps=steps, until_drained=until_drained, resume=resume, version=version
    )
    if version != "main":
        from app.replay import trainer_topics, versioned_topics

        versioned_topics(address, version, trainer_topics())  # a version made before it had them
    service = TrainerService(cfg, address, options, console)
    try:
        endpoint = serve_process_metrics(cfg.metrics)
    except MetricsPortError as exc:
        raise UserError(str(exc)) from None
    if endpoint is not None:
        err.print(f"metrics: http://{cfg.metrics.host}:{endpoint.port}/metrics")
    try:
        code = asyncio.run(service.run())
    except (NoCheckpoint, FileNotFoundError, BackendUnavailable) as exc:
        raise UserError(str(exc)) from None
    finally:
        if endpoint is not None:
            endpoint.stop()
    raise typer.Exit(code)


@app.command("eval")
def eval_cmd(
    k: Annotated[int, typer.Option(min=1, help="k of pass^k and pass@k.")] = 4,
    trials: Annotated[int | None, typer.Option(min=1, help="Trials per case (n >= k; default k).")] = None,
    models: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            help="Model to evaluate (default: the run's newest weights): a Hugging Face folder, a .gguf "
            "file, a bundled model (smollm2), or an OpenAI-compatible endpoint: "
            "openai://host:port/v1?model=NAME (openais:// for https; key: ARENA_LLM_API_KEY). "
            "With --bench tau2, several checkpoint folders (--model A --model B) share the tasks.",
        ),
    ] = None,
    run: Annotated[str | None, typer.Option(help="Run whose newest weights to evaluate.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    user: Annotated[
        str,
        typer.Option(
            help="Who plays the user of interactive instances: 'gateway' (its simulator) or 'policy'."
        ),
    ] = "gateway",
    concurrency: Annotated[int, typer.Option(min=1, max=256, help="Trials in flight at once.")] = 4,
    max_turns: Annotated[
        int | None, typer.Option(min=1, help="Assistant turns per trial (default: ARENA_TRAIN__MAX_TURNS).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Evaluate only the first N held-out packages and N instances.")
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="Base seed of the trials and the bootstrap.")] = 0,
    bench: Annotated[
        str | None,
        typer.Option(
            help="A public benchmark instead of the held-out packages: 'bfcl' or 'tau2' (needs an "
            "endpoint --model, or for tau2 a checkpoint folder; --limit: items per category/domain)."
        ),
    ] = None,
    domain: Annotated[
        str | None, typer.Option(help="--bench tau2: the domain (airline, retail, telecom).")
    ] = None,
    category: Annotated[
        str | None,
        typer.Option(help="--bench bfcl: categories, comma-separated (default simple,multiple,parallel)."),
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            help="--bench tau2: the tasks to score: test (default: never read by synthesis), train or all."
        ),
    ] = None,
) -> None:
    """pass^k and pass@k of a policy on the held-out qa packages and interactive instances, per domain.

    With --bench, pass^k and pass@k of a served model per BFCL category or tau2 domain, scored by the
    benchmark's own checker, with a do-nothing agent's score beside each.
    """
    from arena.files import scratch_dir

    cfg = settings()
    if bench is not None:
        from app.cli_bench import check_bench_options, print_bench, run_bench

        urls = check_bench_options(bench, models or [], domain, category)
        if split is not None and bench != "tau2":
            raise UserError("--split goes with --bench tau2 (fix: drop it)")
        n = trials if trials is not None else k
        if n < k:
            raise UserError(f"--trials {n} < --k {k} (fix: pass^k needs at least k trials per item)")
        found = run_bench(
            cfg,
            bench,
            urls,
            domain=domain,
            category=category,
            k=k,
            trials=n,
            limit=limit,
            concurrency=concurrency,
            seed=seed,
            split=split or "test",
        )
        print_bench(found, as_json)
        return
    if domain is not None or category is not None:
        raise UserError("--domain and --category go with --bench (fix: --bench tau2 or --bench bfcl)")
    if len(models or []) > 1:
        raise UserError("--model more than once goes with --bench tau2 (fix: one --model per `arena eval`)")
    model = models[0] if models else None
    if user not in ("gateway", "policy"):
        raise UserError(f"--user {user!r}: use 'gateway' or 'policy'")
    n = trials if trials is not None else k
    if n < k:
        raise UserError(f"--trials {n} < --k {k} (fix: pass^k needs at least k trials per package)")
    # Imported once the options are known to be good: the evaluator loads torch (seconds).
    from trainer.endpoint_policy import EndpointError, check_endpoint_url, is_endpoint
    from trainer.evaluate import report_table, run_eval
    from trainer.preflight import BackendUnavailable

    trained_on: str | None = None
    with scratch_dir(cfg.home, "eval") as tmp:  # a run's weights are copied here
        if model is None:
            from lake.store import open_store
            from trainer.checkpoint import Checkpoints

            name = run or cfg.train.run
            checkpoints = Checkpoints(open_store(cfg), cfg.catalog, name)
            steps = checkpoints.weights_steps()
            if not steps:
                raise UserError(
                    f"run {name!r} has no weights yet (fix: `arena train` first, or pass --model)"
                )
            model = str(checkpoints.weights_folder(steps[-1], Path(tmp)))
            trained_on = _trained_on(cfg, name)
        elif is_endpoint(model):
            try:
                check_endpoint_url(model)
            except EndpointError as exc:
                raise UserError(str(exc)) from None
        else:
            from trainer.pretrained import PretrainedError, hf_folder

            try:  # a Hugging Face folder as is; a GGUF file or a bundled model converted once
                model = str(hf_folder(model, cfg.home))
            except PretrainedError as exc:
                raise UserError(f"--model {exc} (or an endpoint openai://host:port/v1?model=NAME)") from None
        try:
            report = run_eval(
                cfg,
                model,
                k=k,
                trials=n,
                user=user,  # type: ignore[arg-type]  # checked above
                concurrency=concurrency,
                max_turns=max_turns,
                limit=limit,
                seed=seed,
            )
        except EndpointError as exc:  # the endpoint does not serve
            raise UserError(str(exc)) from None
        except BackendUnavailable as exc:  # train.device / train.backend cannot start here
            raise UserError(str(exc)) from None
        except ValueError as exc:  # nothing held out
            raise UserError(
                f"{exc} (fix: `arena demo`, or `arena publish qa` / `arena publish domain` and `arena worker`)"
            ) from None
    report = report.model_copy(update={"data_version": trained_on})
    if as_json:
        console.print_json(report.model_dump_json())
    else:
        console.print(report_table(report))
        if trained_on is not None:
            console.print(f"the policy was trained on data version {trained_on}")


def _trained_on(cfg: ArenaSettings, run: str, default: str | None = "main") -> str | None:
    """The data version training run ``run`` consumed (its newest start's record in the catalog);
    ``default`` when the catalog has no start of it."""
    from lake.catalog import Catalog

    catalog = Catalog(cfg.catalog)
    try:
        starts = [r for r in catalog.runs("train") if r.name == run]
    finally:
        catalog.dispose()
    if not starts:
        return default
    newest = max(starts, key=lambda r: r.started_at)
    return str(newest.params_dict().get("data_version", "main"))


# --- lag ----------------------------------------------------------------


@app.command()
def lag(
    group: Annotated[list[str] | None, typer.Option("--group", help="Consumer group (repeatable).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="Refresh every --interval seconds.")] = False,
    interval: Annotated[float, typer.Option(help="Refresh period for --watch.")] = 2.0,
    version: Annotated[
        str | None, typer.Option("--version", help="Only the groups of this data version (e.g. main, v2).")
    ] = None,
) -> None:
    """Consumer lag per group, topic and partition (like kafka-consumer-groups --describe).

    LAG and PENDING count data records (transaction markers are not records: a drained group reads
    0); OFFSET LAG is end - committed. A group that never ran (no commit, no live member) reads
    idle. A group whose worker waits for its LLM endpoint (down, or refusing the key) says so in NOTE.
    """
    from consumers.lag import compute_lag, mark_waiting, render_lag_table, render_versions_table

    cfg = settings()
    address = broker(cfg)

    def rows() -> list[Any]:
        found = mark_waiting(compute_lag(address, groups=group), waiting_groups(cfg))
        return [r for r in found if version is None or r.version == version]

    if not watch:
        if as_json:
            print(json.dumps([r.model_dump() for r in rows()], indent=2))
        else:
            shown = rows()
            console.print(render_lag_table(shown))
            if any(r.version != "main" for r in shown):
                console.print(render_versions_table(shown))
        return
    from rich.live import Live

    with Live(render_lag_table(rows()), console=console) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render_lag_table(rows()))
        except KeyboardInterrupt:
            pass


def waiting_groups(cfg: ArenaSettings) -> dict[str, str]:
    """Consumer group -> why its worker waits for the LLM endpoint, for workers that do now."""
    from arena.llm.outage import read_states

    return {
        f"arena-{state.stage}": state.reason for state in read_states(cfg.home) if state.state == "waiting"
    }


@app.command("ui")
def ui_cmd(
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to serve on.")] = 8600,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            help="Token that writes (replay, queries) must send; random per start when not given. "
            "Required for a non-loopback --host."
        ),
    ] = None,
) -> None:
    """Web dashboard: stage graph with live lag, dead letters and replay, lake browser, training curves."""
    from app.ui import UiError, check_token, serve

    try:
        check_token(host, token)  # before the broker starts: a refused start changes nothing
        cfg = settings()
        serve(cfg, ready_broker(cfg), host=host, port=port, say=err.print, token=token)
    except UiError as exc:
        raise UserError(str(exc)) from None


# --- demo ---------------------------------------------------------------


@app.command()
def demo(
    timeout: Annotated[float, typer.Option(help="Give up if the stages have not drained by then.")] = 600.0,
    tracks: Annotated[
        str,
        typer.Option(help="Comma-separated tracks to run: sft (tool docs), env (QA environments), eigen."),
    ] = "sft,env,eigen",
) -> None:
    """Publish the bundled sample tool docs, run every stage until drained, summarise."""
    from app.demo import TRACKS, run_demo

    chosen = tuple(t.strip() for t in tracks.split(",") if t.strip())
    unknown = [t for t in chosen if t not in TRACKS]
    if unknown or not chosen:
        raise UserError(f"--tracks {tracks!r}: use some of {', '.join(TRACKS)} (comma-separated)")
    cfg = settings()
    raise typer.Exit(run_demo(cfg, ready_broker(cfg), console=console, timeout_s=timeout, tracks=chosen))


@app.command("config")
def config_cmd() -> None:
    """Show the effective configuration (secrets masked)."""
    console.print_json(json.dumps(settings().public_view()))


def main() -> None:
    freeze_heap_at_exit()
    try:
        app()
    except Exception as exc:
        code = _user_facing(exc)
        if code is None:
            raise
        sys.exit(code)


def _user_facing(exc: Exception) -> int | None:
    """Print a user's mistake or an unreachable service as one line; the exit code, or None (a bug:
    the traceback stays). Its error types are imported only when something failed: the Kafka client
    alone costs a command that does not use it 0.3 s to import."""
    from kafka.errors import KafkaError
    from rich.markup import escape

    from app.stack import StackError
    from arena.llm.core import InvalidOutput
    from streams.admin import TopicAdminError

    if isinstance(exc, (UserError, StackError, TopicAdminError)):
        err.print(f"[red]error:[/red] {escape(str(exc))}")  # a path or a pip extra is not markup
        return 2
    if isinstance(exc, KafkaError):
        err.print(
            f"[red]error:[/red] Kafka: {escape(str(exc))} (fix: check that the broker is up: `arena status`)"
        )
        return 1
    if isinstance(exc, InvalidOutput):  # a command's own LLM call (not a stage's: those dead-letter)
        reason = exc.errors[-1] if exc.errors else "no reply"
        err.print(f"[red]error:[/red] the LLM gave no usable output for role {exc.role!r}: {escape(reason)}")
        return 1
    return None


if __name__ == "__main__":
    main()

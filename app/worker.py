"""`arena worker`: a supervisor of Faust worker processes, one or more per stage.

Each stage runs as ``python -m app.run NAME`` in its own process group
(its own consumer group), logging to ``$ARENA_HOME/logs/worker-NAME.log``. The processes are
forked from a fork server that imported the stage code once (``app.forkserver``; setting
``worker_fork`` false, or a server that fails, execs each one instead).
``--replicas N`` runs N processes of each stage in the same consumer group: they share the
stage's partitions (``worker-NAME-rK.log`` for replica K > 0); a second ``arena worker`` with
another ``ARENA_WORKER_SLOT`` adds processes on another machine the same way. A
worker that dies is restarted with backoff, under its static group-member id, so it takes
its partitions back at once. ``--until-drained`` stops all of
them and returns 0 once every stage group has nothing pending, measured
against the read_committed position, on two checks in a row. With a metrics port
(``--metrics-port``/``ARENA_METRICS__PORT``) the supervisor serves /metrics: what
every worker process records (``arena.metrics``), the workers it runs, and consumer
lag per group (``app.metrics_http``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from app.admission_host import start_admission_host
from app.endpoint_watch import EndpointWatch
from app.forkserver import ForkedProcess, ForkServer, ForkServerError, supervised_env
from app.ledger_metrics import LedgerCollector
from app.metrics_http import LagCollector, WorkerMetrics
from app.registry import stage_inputs, stage_outputs, topics_by_group, worker
from app.stack import pid_alive
from arena.config import ArenaSettings
from consumers import ledger
from consumers.lag import CountMemo, LagRow, compute_lag, drained, unsettled
from streams.runtime import LEDGER_TOPIC

STOP_GRACE_S = 15.0
MAX_RESTARTS = 5
LEDGER_SETTLE_S = 15.0
"""How long a drain check that found records without a ledger entry waits for the ledger's open
transactions to become visible before it looks again."""
SINK_SETTLE_S = 60.0
"""After a drain, how long the sinks (the lake sink) may take to read what the stages wrote as they
stopped (their last LLM-usage reports) before they are stopped too."""
DRAIN_POLL_S = (0.5, 2.0)
"""Seconds between drain checks: the first after a clean check (it confirms the drain), the most
while records are pending (each pause grows by half up to it). A check costs a tenth of a
CPU-second or more on the broker and here, so a long run on 2 cores does not poll at the fastest
rate it could use."""


@dataclass
class Child:
    name: str
    log_path: Path
    replica: int = 0
    proc: subprocess.Popen[bytes] | ForkedProcess | None = None
    restarts: int = 0
    next_start: float = 0.0


class Supervisor:
    """Starts, watches, restarts and stops the worker processes."""

    def __init__(
        self,
        settings: ArenaSettings,
        bootstrap: str,
        names: list[str],
        console: Console,
        replicas: int = 1,
        forks: ForkServer | None = None,
    ) -> None:
        for name in names:
            worker(name)  # unknown names fail before anything starts
        if replicas < 1:
            raise ValueError("replicas must be at least 1")
        self.settings = settings
        self.bootstrap = bootstrap
        self.console = console
        log_dir = settings.home / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.children = [
            Child(n, log_dir / (f"worker-{n}.log" if r == 0 else f"worker-{n}-r{r}.log"), r)
            for n in names
            for r in range(replicas)
        ]
        self.metrics: WorkerMetrics | None = None
        """Set before ``start`` when /metrics is served: the workers then record into its folder."""
        self._forks: ForkServer | None = forks
        """Started with the first process (its environment then includes the metrics folder), unless
        the caller started it earlier (``start_fork_server``)."""
        self._fork = settings.worker_fork

    def snapshot(self) -> list[tuple[str, bool, int]]:
        """(stage, running, restarts) per worker process, for /metrics."""
        return [(c.name, c.proc is not None and c.proc.poll() is None, c.restarts) for c in self.children]

    def _env(self) -> dict[str, str]:
        env = supervised_env(self.settings.home)
        env["ARENA_BROKER"] = self.bootstrap
        if self.metrics is not None:
            env.update(self.metrics.child_env())
        return env

    def _spawn(self, child: Child) -> None:
        env = self._env()
        # A stable static-membership id per (host, worker slot, stage): a
        # restarted worker reclaims its partitions immediately.
        replica = f"-r{child.replica}" if child.replica else ""
        env["ARENA_WORKER_INSTANCE"] = (
            f"{socket.gethostname()}-{env.get('ARENA_WORKER_SLOT', '0')}-{child.name}{replica}"
        )
        if self._fork:
            try:
                child.proc = self._fork_server(env).spawn(child.name, child.log_path, env)
                return
            except ForkServerError as exc:
                self.console.print(
                    f"[yellow]{exc}; each worker starts as `python -m app.run` instead[/yellow]"
                )
                self._fork = False
        with open(child.log_path, "ab") as log:
            child.proc = subprocess.Popen(
                [sys.executable, "-m", "app.run", child.name],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def _fork_server(self, env: dict[str, str]) -> ForkServer:
        if self._forks is None or not self._forks.alive():
            self._forks = ForkServer({k: v for k, v in env.items() if k != "ARENA_WORKER_INSTANCE"})
        return self._forks

    def start(self) -> None:
        for child in self.children:
            self._spawn(child)

    def check(self) -> None:
        """Restart dead workers with exponential backoff; give up after MAX_RESTARTS."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is None or child.proc.poll() is None:
                continue
            if child.next_start == 0.0:
                if self.metrics is not None:
                    self.metrics.process_ended(child.proc.pid)
                child.restarts += 1
                if child.restarts > MAX_RESTARTS:
                    raise WorkerFailed(
                        f"worker {child.name} exited {child.proc.returncode} {child.restarts} times; "
                        f"see {child.log_path}"
                    )
                child.next_start = now + min(2.0**child.restarts, 30.0)
                self.console.print(
                    f"[yellow]worker {child.name} exited with {child.proc.returncode}; "
                    f"restarting (log: {child.log_path})[/yellow]"
                )
            elif now >= child.next_start:
                child.next_start = 0.0
                self._spawn(child)

    def stop(self, names: set[str] | None = None) -> None:
        """SIGTERM the process group of every worker (of ``names`` only, when given), then SIGKILL
        what is left; stopping them all ends the fork server too."""
        live = [
            c.proc
            for c in self.children
            if c.proc is not None and c.proc.poll() is None and (names is None or c.name in names)
        ]
        for proc in live:
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        if names is None and self._forks is not None:
            self._forks.close()
            self._forks = None


class WorkerFailed(RuntimeError):
    """A worker kept crashing."""


def _signal_group(proc: subprocess.Popen[bytes] | ForkedProcess, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def start_metrics(
    settings: ArenaSettings,
    bootstrap: str,
    groups: dict[str, list[str]],
    supervisor: Supervisor,
    console: Console,
) -> WorkerMetrics | None:
    """The /metrics endpoint of this supervisor, or None when ``settings.metrics.port`` is 0.

    Lag covers every group the cluster knows (as `arena lag` does) plus this supervisor's stage
    groups before they first join.
    """
    cfg = settings.metrics
    if cfg.port == 0:
        return None
    lag = LagCollector.for_broker(bootstrap, topics_by_group=groups, cache_s=cfg.lag_cache_s)
    folder = settings.home / "metrics" / f"worker-{os.getpid()}"
    _remove_stale_metrics(folder.parent)
    metrics = WorkerMetrics(cfg, folder, lag, supervisor)
    names = [group.removeprefix("arena-") for group in groups]
    metrics.registry.register(LedgerCollector.for_stages(bootstrap, stage_inputs(names)))
    console.print(f"metrics: http://{cfg.host}:{metrics.port}/metrics")
    return metrics


def _remove_stale_metrics(parent: Path) -> None:
    """Drop the metrics folders of supervisors that died without cleaning up (SIGKILL)."""
    for old in parent.glob("worker-*"):
        pid = old.name.removeprefix("worker-")
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)


def pending_by_group(rows: list[LagRow], groups: dict[str, list[str]]) -> dict[str, int]:
    totals = dict.fromkeys(groups, 0)
    for row in rows:
        if row.group in totals:
            totals[row.group] += row.pending
    return totals


SHOWN_MISSING = 20


def accounted_for(bootstrap: str, stages: dict[str, str], console: Console) -> bool:
    """Every record the stages committed past has a ledger entry (``consumers.ledger``); names those without."""
    if not stages:
        return True
    found = ledger.check(bootstrap, stages)
    if found.missing:  # a ledger entry committed with its record may not be visible yet: look again
        deadline = time.monotonic() + LEDGER_SETTLE_S
        while unsettled(bootstrap, [LEDGER_TOPIC]) and time.monotonic() < deadline:
            time.sleep(0.5)
        found = ledger.check(bootstrap, stages)
    if found.unchecked:
        console.print(
            f"[yellow]not checked (no ledger entries; they ran before the ledger existed): "
            f"{', '.join(found.unchecked)}[/yellow]"
        )
    if not found.missing:
        return True
    console.print(
        f"[red]drained, but {len(found.missing)} consumed record(s) have no outcome[/red] "
        "(no output, rejection, dead letter or duplicate entry in stages.ledger: "
        "the stage committed past them without handling them):"
    )
    for item in found.missing[:SHOWN_MISSING]:
        console.print(f"  {item}")
    if len(found.missing) > SHOWN_MISSING:
        console.print(f"  ... and {len(found.missing) - SHOWN_MISSING} more")
    return False


def stop_stages_then_sinks(
    supervisor: Supervisor,
    bootstrap: str,
    groups: dict[str, list[str]],
    *,
    settle: bool,
    console: Console,
) -> None:
    """Stop the stage workers, then the others (the lake sink), so that a drained run ends drained.

    A stage sends its last LLM-usage report as it stops (``streams.usage``); with ``settle`` the
    stages' output topics are waited for until every transaction on them is visible to readers,
    and the sinks read what the stages wrote until their groups have nothing pending (at most
    ``SINK_SETTLE_S`` in all) before they stop.
    """
    stage_names = set(stage_inputs([c.name for c in supervisor.children]))
    try:
        supervisor.stop(stage_names)
        outputs = stage_outputs(sorted(stage_names))
        sinks = {c.name for c in supervisor.children if c.name not in stage_names}
        sink_groups = {worker(n).group: groups[worker(n).group] for n in sinks if worker(n).group in groups}
        deadline = time.monotonic() + SINK_SETTLE_S
        counted: CountMemo = {}
        while settle and (
            unsettled(bootstrap, outputs)
            or (sink_groups and not drained(bootstrap, sink_groups, memo=counted))
        ):
            if time.monotonic() > deadline:
                console.print(
                    f"[yellow]the stages' outputs or {', '.join(sorted(sinks)) or 'the sinks'} had not "
                    f"settled after {SINK_SETTLE_S:.0f}s; what is left waits in its topics[/yellow]"
                )
                break
            time.sleep(0.5)
    finally:
        supervisor.stop()  # whatever the broker answered: no worker outlives the run


def run_workers(
    settings: ArenaSettings,
    bootstrap: str,
    names: list[str],
    *,
    until_drained: bool,
    timeout_s: float | None,
    console: Console,
    replicas: int = 1,
    forks: ForkServer | None = None,
) -> int:
    """Run the workers (``replicas`` processes per stage); returns the process exit code.

    ``forks``: a fork server the caller started already (``start_fork_server``), stopped with them.
    """
    supervisor = Supervisor(settings, bootstrap, names, console, replicas, forks)
    groups = topics_by_group(names)
    outputs = stage_outputs(names)
    supervisor.metrics = start_metrics(settings, bootstrap, groups, supervisor, console)
    interrupted = False

    def _interrupt(signum: int, _frame: object) -> None:
        nonlocal interrupted
        interrupted = True

    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    admission = start_admission_host(settings, bootstrap)  # the LLM admission coordinator (one per home)
    supervisor.start()
    started = time.monotonic()
    clean_checks = 0
    drained_ok = False
    endpoints = EndpointWatch(settings.home, console)
    counted: CountMemo = {}  # offset ranges counted by an earlier check are not read again
    pause = DRAIN_POLL_S[0]
    try:
        with console.status("starting workers...") as status:
            while not interrupted:
                supervisor.check()
                waiting = endpoints.waiting()
                if not until_drained:
                    time.sleep(0.5)
                    continue
                refused = endpoints.refused(waiting)
                if refused is not None:
                    console.print(
                        f"[red]the LLM endpoint {refused.endpoint} refuses Arena's requests[/red]: {refused.reason}\n"
                        "nothing was dead-lettered; the records wait in their topics for the next run"
                    )
                    return 1
                rows = compute_lag(bootstrap, list(groups), topics_by_group=groups, memo=counted)
                pending = pending_by_group(rows, groups)
                status.update(
                    "draining: "
                    + ", ".join(f"{g.removeprefix('arena-')} {n}" for g, n in pending.items())
                    + f" pending ({time.monotonic() - started:.0f}s)"
                    + (f"; {len(waiting)} worker(s) waiting for the LLM endpoint" if waiting else "")
                )
                # Drained: nothing left to read, and every output the stages committed is visible.
                clean = drained(bootstrap, groups, rows=rows) and not unsettled(bootstrap, outputs)
                clean_checks = clean_checks + 1 if clean else 0
                if clean_checks >= 2:
                    status.update("drained; checking that every consumed record has an outcome")
                    if not accounted_for(bootstrap, stage_inputs(names), console):
                        return 1
                    console.print(f"[green]drained[/green] in {time.monotonic() - started:.1f}s")
                    drained_ok = True
                    return 0
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    console.print(f"[red]not drained after {timeout_s:.0f}s[/red]: {pending}")
                    return 1
                pause = DRAIN_POLL_S[0] if clean else min(pause * 1.5, DRAIN_POLL_S[1])
                time.sleep(pause)
        return 0  # stopped by SIGINT/SIGTERM: a clean shutdown
    except WorkerFailed as exc:
        console.print(f"[red]{exc}[/red]")
        return 1
    finally:
        with console.status("stopping workers..."):
            stop_stages_then_sinks(supervisor, bootstrap, groups, settle=drained_ok, console=console)
        if supervisor.metrics is not None:
            supervisor.metrics.stop()
        admission.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

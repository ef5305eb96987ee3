"""Entry point of one worker process: ``python -m app.run NAME``.

`arena worker` starts one of these per stage and supervises them.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import faust
import setproctitle

from app.exit import freeze_heap_at_exit
from app.registry import register_versions, worker
from app.versions import data_version, version_env
from arena.config import ArenaSettings
from arena.versions import MAIN, split_worker
from streams import fetch_pacing, read_committed
from streams.app import make_app

ORPHAN_GRACE_S = 30.0
"""How long an orphaned worker may take to stop cleanly before it kills itself."""


def exit_with_parent() -> None:
    """Stop this worker when its supervisor dies, even by SIGKILL (no orphans).

    A clean stop can hang when the broker went down with the supervisor (Faust retries its last
    commit), so a worker still alive ``ORPHAN_GRACE_S`` after the SIGTERM kills itself.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def process_title(name: str, state: str | None = None) -> str:
    """What ``ps`` shows for worker ``name``: how `arena worker` started it, then Faust's state.

    The chaos bench, the tests and an operator's ``pgrep -f "app.run NAME"`` find workers by it,
    whether the process was exec'd or forked (``app.forkserver``).
    """
    return f"{sys.executable} -m app.run {name}" + (f" ({state})" if state else "")


class _TitledWorker(faust.Worker):
    """Faust's worker, with the title ``process_title`` gives (Faust's own names the app only)."""

    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        self._arena_name = name
        super().__init__(*args, **kwargs)

    def _setproctitle(self, info: str, *, ident: str = "") -> None:  # Faust calls it at each state
        setproctitle.setproctitle(process_title(self._arena_name, info))


def _in_version(settings: ArenaSettings, name: str) -> ArenaSettings:
    """The settings of worker ``name``: a data version's worker (``stage@version``) gets its
    version's overrides (``app.versions.version_env``) and its workers registered."""
    version = split_worker(name)[1]
    if version == MAIN:
        return settings
    spec = data_version(settings, version)
    if spec is None:
        raise SystemExit(f"data version {version!r} is not in the catalog (it was dropped?)")
    register_versions([spec])
    os.environ.update(version_env(spec, settings.home))
    return ArenaSettings()


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m app.run WORKER_NAME")
    freeze_heap_at_exit()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    settings = ArenaSettings()
    if not settings.broker:
        raise SystemExit("ARENA_BROKER is not set; start workers with `arena worker`")
    bootstrap = settings.broker
    settings = _in_version(settings, argv[0])
    spec = worker(argv[0])
    fetch_pacing.install()
    read_committed.install()  # Faust's consumers read_committed (exactly-once stages)
    if os.environ.get("ARENA_SUPERVISED") == "1":
        exit_with_parent()
    app = make_app(
        spec.group,
        settings,
        bootstrap,
        exactly_once=spec.guarantee == "exactly_once",
        instance_id=os.environ.get("ARENA_WORKER_INSTANCE") or None,
    )
    spec.attach(app, settings)
    level = os.environ.get("ARENA_LOG_LEVEL", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    runner = _TitledWorker(argv[0], app, loglevel=level, quiet=True, redirect_stdouts=False)
    runner.execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1:])

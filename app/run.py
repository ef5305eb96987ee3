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

import faust

from app.registry import worker
from arena.config import ArenaSettings
from streams import fetch_pacing, read_committed
from streams.app import make_app


def exit_with_parent() -> None:
    """Stop this worker when its supervisor dies, even by SIGKILL (no orphans)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m app.run WORKER_NAME")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    settings = ArenaSettings()
    if not settings.broker:
        raise SystemExit("ARENA_BROKER is not set; start workers with `arena worker`")
    spec = worker(argv[0])
    fetch_pacing.install()
    read_committed.install()  # Faust's consumers read_committed (exactly-once stages)
    if os.environ.get("ARENA_SUPERVISED") == "1":
        exit_with_parent()
    app = make_app(
        spec.group,
        settings,
        settings.broker,
        exactly_once=spec.guarantee == "exactly_once",
        instance_id=os.environ.get("ARENA_WORKER_INSTANCE") or None,
    )
    spec.attach(app, settings)
    level = os.environ.get("ARENA_LOG_LEVEL", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    faust.Worker(app, loglevel=level, quiet=True, redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1:])

"""Entry point of one worker process: ``python -m streams.run NAME``.

`arena worker` starts one of these per stage and supervises them.
"""

from __future__ import annotations

import logging
import os
import sys

import faust

from arena.config import ArenaSettings
from streams.app import make_app
from streams.registry import worker


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m streams.run WORKER_NAME")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    settings = ArenaSettings()
    if not settings.broker:
        raise SystemExit("ARENA_BROKER is not set; start workers with `arena worker`")
    spec = worker(argv[0])
    app = make_app(spec.group, settings, settings.broker, exactly_once=spec.guarantee == "exactly_once")
    spec.attach(app, settings)
    level = os.environ.get("ARENA_LOG_LEVEL", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    faust.Worker(app, loglevel=level, quiet=True, redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main(sys.argv[1:])

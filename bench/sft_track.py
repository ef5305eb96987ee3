"""SFT-track benchmark figures.

Usage::

    python bench/sft_track.py [--concurrency N] [--requests R] [--latency S] [--quick]

Prints ONE JSON object on stdout.

``gateway``
    LLM gateway throughput with the ``openai`` backend: ``R`` distinct calls of one role go
    through ``Gateway.call`` (prompt rendering, HTTP, JSON extraction, validation; no cache)
    to the scripted local OpenAI-compatible server (``tests/fixtures/openai_server.py``, a
    subprocess on a loopback port) that answers every request after a fixed latency. Run once
    with backend concurrency 1 and once with ``N``; the ratio shows how much of the server's
    latency bounded concurrency hides (ideal: ``min(N, R)``). One warm-up call per run is not
    timed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

from arena.llm.backends.openai import OpenAIBackend
from arena.llm.gateway import Gateway

REPO_ROOT = Path(__file__).resolve().parent.parent


# --- gateway ------------------------------------------------------------------------------


async def _gateway_rps(base_url: str, concurrency: int, requests: int) -> float:
    """Requests per second of ``requests`` concurrent gateway calls at backend ``concurrency``."""
    backend = OpenAIBackend(base_url, "bench-model", concurrency=concurrency, timeout_s=60)
    gateway = Gateway(backend, max_attempts=1)
    from tests.fixtures.openai_server import ASK, Question  # on sys.path via gateway_figures

    try:
        await gateway.call(ASK, Question(text="warm-up"))
        started = time.perf_counter()
        answers = await asyncio.gather(
            *(gateway.call(ASK, Question(text=f"question {i}")) for i in range(requests))
        )
        elapsed = time.perf_counter() - started
    finally:
        await gateway.aclose()
    assert all(a.output.answer == "ok" for a in answers)
    return requests / elapsed


async def gateway_figures(
    concurrency: int = 8, requests: int = 64, latency_s: float = 0.05
) -> dict[str, Any]:
    """Gateway requests/s at concurrency 1 and ``concurrency`` against a fixed-latency server."""
    if str(REPO_ROOT) not in sys.path:  # the scripted server lives with the test fixtures
        sys.path.insert(0, str(REPO_ROOT))
    from tests.fixtures.openai_server import ServerScript, start_openai_server

    stack = contextlib.ExitStack()  # starting and stopping the subprocess block: run them in threads
    try:
        server = await asyncio.to_thread(stack.enter_context, start_openai_server())
        await server.aconfigure(ServerScript(latency_s=latency_s))
        sequential = await _gateway_rps(server.base_url, 1, requests)
        concurrent = await _gateway_rps(server.base_url, concurrency, requests)
    finally:
        await asyncio.to_thread(stack.close)
    return {
        "backend": "openai",
        "server": "scripted aiohttp OpenAI-compatible server on 127.0.0.1 (tests/fixtures/openai_server.py)",
        "latency_s": latency_s,
        "requests": requests,
        "concurrency": concurrency,
        "requests_per_s_concurrency_1": round(sequential, 2),
        "requests_per_s_concurrency_n": round(concurrent, 2),
        "speedup": round(concurrent / sequential, 2),
        "ideal_speedup": min(concurrency, requests),
    }


# --- entry point --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="SFT-track benchmark figures (JSON on stdout).")
    parser.add_argument("--concurrency", type=int, default=8, help="Backend concurrency of the second run.")
    parser.add_argument("--requests", type=int, default=64, help="Timed gateway calls per run.")
    parser.add_argument("--latency", type=float, default=0.05, help="Server latency per request (s).")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="A smoke run: 2 tool docs, at most 2 records per stage, 16 gateway calls at concurrency 4.",
    )
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.requests < 1 or args.latency < 0:
        parser.error("--concurrency and --requests must be >= 1, --latency >= 0")
    if args.quick:
        args.concurrency, args.requests = 4, 16
    from bench.sft_stages import stage_figures

    result = {
        "quick": args.quick,
        "stages": asyncio.run(stage_figures(limit=2 if args.quick else None)),
        "gateway": asyncio.run(gateway_figures(args.concurrency, args.requests, args.latency)),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

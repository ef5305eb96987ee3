"""Shared test setup: fixture plugins and single-threaded math libraries (2-core machines)."""

from __future__ import annotations

import gc
import os

import pytest

from streams import read_committed

# Every read_committed reader of the tests (tests/cli.read_all, the lag tests) gets the repair the
# workers and the CLI get: without it a census misses committed records (streams.read_committed).
read_committed.install()

# Set at import, before any test module imports torch/numpy, so their thread pools see it.
os.environ["OMP_NUM_THREADS"] = "1"

# No cyclic collection while the test modules import (torch, transformers, lancedb: 25 s of every
# xdist worker's collection): the collector's passes over that long-lived heap were 30% of it. Once
# collected, the heap is frozen (never walked by a test's collections) and collection resumes.
gc.disable()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """After collection, before the first test (and in xdist's controller, which collects nothing)."""
    gc.freeze()
    gc.enable()


pytest_plugins = [
    "tests.fixtures.broker",
    "tests.fixtures.s3",
    "tests.fixtures.postgres",
    "tests.fixtures.demo",
    "tests.fixtures.domain",
]


@pytest.fixture(autouse=True, scope="session")
def _single_threaded_math() -> None:
    """Keep OMP_NUM_THREADS=1 for the session (subprocesses started by tests inherit it)."""
    os.environ["OMP_NUM_THREADS"] = "1"


DEMO_TIMEOUT_S = 900
"""pytest-timeout counts a fixture's set-up in the first test that uses it: the shared demo home
(tests/fixtures/demo.py, about 4-5 minutes on 2 busy cores) would leave that test nothing of the
suite's 300 s."""


SPREAD_FILES = frozenset({"test_bench_quick.py"})
"""Files whose tests are independent heavy runs (each bench's smoke run): spread one by one."""


def xdist_group(item: pytest.Item) -> str:
    """Which tests one pytest-xdist worker runs together (scripts/test.sh: ``-n 3 --dist loadgroup``).

    Every test of the shared demo home on one worker (the home is built once per worker that
    asks for it); otherwise a file's tests together, so module fixtures start once.
    """
    if "demo_run" in getattr(item, "fixturenames", ()):
        return "demo"
    if item.path.name in SPREAD_FILES:
        return item.nodeid
    return item.path.name


HEAVY_FIRST: tuple[str, ...] = (
    "demo",
    "test_tau2.py",
    "test_replay.py",
    "test_cli.py",
    "bench/tau2_loop.py",
    "test_dlq_trace.py",
    "test_recovery.py",
    "bench/chaos.py",
    "bench/replay.py",
    "test_tau2_rl.py",
    "bench/learning.py",
    "bench/llm_concurrency.py",
    "test_pipeline.py",
    "test_openai_backend.py",
    "test_llm_endpoint_faults.py",
    "test_read_committed.py",
    "test_ledger.py",
    "test_bfcl.py",
    "test_ui_browser.py",
    "test_verl_parity.py",
    "test_mcp_servers.py",
)
"""Groups that take a minute or more on 2 cores, longest first (a bench by its script): handed out
before every other group (scripts/test.sh: ``--no-loadscope-reorder`` keeps this order), so the
run ends on short groups and neither worker idles through another's long tail. Scheduling only:
a stale entry costs balance, never a result."""


def schedule_rank(group: str) -> int:
    """Where ``group`` goes in the work queue: its place in ``HEAVY_FIRST``, else after all of them."""
    for rank, name in enumerate(HEAVY_FIRST):
        if group == name or group.endswith(f"[{name}]"):
            return rank
    return len(HEAVY_FIRST)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: xdist's worker hook (registered after this conftest, so called before it) reads the
    # xdist_group marks to suffix node ids; marks added after it are ignored and every worker
    # builds its own demo home.
    groups: dict[str, str] = {}
    for item in items:
        if "demo_run" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEMO_TIMEOUT_S))
        groups[item.nodeid] = xdist_group(item)
        item.add_marker(pytest.mark.xdist_group(groups[item.nodeid]))
    # Heavy groups first (a stable sort: a group's tests keep their order, the rest keep theirs).
    items.sort(key=lambda item: schedule_rank(groups[item.nodeid]))

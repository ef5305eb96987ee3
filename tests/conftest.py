"""Shared test setup: fixture plugins and single-threaded math libraries (2-core machines)."""

from __future__ import annotations

import os

import pytest

from streams import read_committed

# Every read_committed reader of the tests (tests/cli.read_all, the lag tests) gets the repair the
# workers and the CLI get: without it a census misses committed records (streams.read_committed).
read_committed.install()

# Set at import, before any test module imports torch/numpy, so their thread pools see it.
os.environ["OMP_NUM_THREADS"] = "1"

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "demo_run" in getattr(item, "fixturenames", ()) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(DEMO_TIMEOUT_S))

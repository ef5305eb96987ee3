"""Shared test setup: fixture plugins and single-threaded math libraries (2-core machines)."""

from __future__ import annotations

import os

import pytest

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

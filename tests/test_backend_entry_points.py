"""LLM backends are found by name through the ``arena.llm_backends`` entry points, the simulator too."""

from __future__ import annotations

import asyncio
from typing import get_args

import pytest

from arena.config import ArenaSettings
from arena.llm.backends import LlmTarget, backend_factory, make_backend
from simulator.backend import RulesBackend


def test_every_backend_kind_has_an_installed_factory() -> None:
    kinds = get_args(LlmTarget.model_fields["kind"].annotation)
    assert set(kinds) == {"rules", "openai", "hf", "vllm"}
    for kind in kinds:
        assert callable(backend_factory(kind))


def test_the_rules_entry_point_builds_the_seeded_simulator() -> None:
    backend = make_backend(ArenaSettings(llm="rules", seed=7))
    assert isinstance(backend, RulesBackend) and backend.seed == 7


def test_the_openai_entry_point_takes_the_llm_settings() -> None:
    settings = ArenaSettings(llm="openai://127.0.0.1:9/v1?model=m", llm_concurrency=3, llm_timeout_s=2.5)
    backend = make_backend(settings)
    assert (backend.name, backend.model) == ("openai", "m")
    assert backend.concurrency == 3 and backend.timeout_s == 2.5  # type: ignore[attr-defined]
    asyncio.run(backend.aclose())


def test_an_uninstalled_backend_kind_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"no LLM backend 'nope' is installed .*fix: reinstall"):
        backend_factory("nope")

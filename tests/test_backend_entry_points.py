"""LLM backends are found by name through the ``arena.llm_backends`` entry points, the simulator too.

A package adds a backend without editing Arena: the scheme of ``ARENA_LLM`` names its entry point.
The tests below install a real (tiny) distribution on ``sys.path``, read by ``importlib.metadata``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from arena.config import ArenaSettings
from arena.llm.backends import (
    BACKEND_GROUP,
    BUILTIN_KINDS,
    LlmTarget,
    backend_factory,
    installed_backends,
    make_backend,
    parse_llm_url,
)
from arena.llm.core import Role
from arena.llm.gateway import Gateway
from simulator.backend import RulesBackend

TOY_MODULE = "toy_arena_backend"
"""The toy distribution's module (a name no other test or package uses)."""

TOY_SOURCE = '''
"""A third-party Arena LLM backend: answers every role with JSON naming its URL and the prompt."""

import json
from urllib.parse import urlparse

from arena.llm.core import Completion


class ToyBackend:
    name = "toy"

    def __init__(self, url, seed):
        self.url = url
        self.model = urlparse(url).netloc or "toy-model"
        self.seed = seed
        self.requests = []
        self.closed = False

    async def complete(self, request):
        self.requests.append(request)
        prompt = request.messages[-1]["content"]
        return Completion(text=json.dumps({"answer": f"{self.url} heard {prompt}"}))

    async def aclose(self):
        self.closed = True


def from_target(target, settings):
    return ToyBackend(target.url, settings.seed)
'''


@pytest.fixture
def toy_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution on disk, ``toy-arena-backend``, registering ``toy`` under ``arena.llm_backends``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / f"{TOY_MODULE}.py").write_text(TOY_SOURCE)
    dist = site / f"{TOY_MODULE}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-arena-backend\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[{BACKEND_GROUP}]\ntoy = {TOY_MODULE}:from_target\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop(TOY_MODULE, None)


def test_every_builtin_kind_has_an_installed_factory() -> None:
    assert set(BUILTIN_KINDS) == {"rules", "openai", "hf", "vllm"}
    assert set(BUILTIN_KINDS) <= set(installed_backends())
    for kind in BUILTIN_KINDS:
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


def test_a_third_party_scheme_keeps_its_whole_url(toy_installed: Path) -> None:
    assert "toy" in installed_backends()
    url = "toy://anything/model-x?temperature=0.5#frag"
    assert parse_llm_url(url) == LlmTarget(kind="toy", url=url)
    assert parse_llm_url(f"  {url}\n") == LlmTarget(kind="toy", url=url)  # stripped like the built-ins
    assert parse_llm_url("TOY://x").kind == "toy"  # URL schemes are case-insensitive


def test_arena_llm_selects_the_installed_backend_by_scheme(
    toy_installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARENA_LLM", "toy://anything")
    settings = ArenaSettings(home=tmp_path / "home", seed=11)
    assert settings.llm == "toy://anything"
    backend = make_backend(settings)
    assert type(backend).__module__ == TOY_MODULE
    assert (backend.name, backend.model) == ("toy", "anything")
    assert backend.url == "toy://anything" and backend.seed == 11  # type: ignore[attr-defined]
    asyncio.run(backend.aclose())


class ToyIn(BaseModel):
    """Input of the toy role."""

    text: Annotated[str, Field(description="What to say.")]


class ToyOut(BaseModel):
    """Output of the toy role."""

    answer: Annotated[str, Field(description="What the backend heard.")]


TOY_ROLE = Role(
    name="test_toy_echo",
    input=ToyIn,
    output=ToyOut,
    system='Reply with {"answer": string}.',
    template="Say: {input}",
)


def test_a_role_call_through_the_gateway_reaches_the_third_party_backend(
    toy_installed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARENA_LLM", "toy://anything")
    settings = ArenaSettings(home=tmp_path / "home")

    async def call() -> None:
        gateway = Gateway.from_settings(settings)
        try:
            answer = await gateway.call(TOY_ROLE, ToyIn(text="hello"))
            backend = gateway.backend
            assert type(backend).__module__ == TOY_MODULE
            assert len(backend.requests) == 1  # type: ignore[attr-defined]
            assert (answer.backend, answer.model) == ("toy", "anything")
            assert answer.output.answer.startswith("toy://anything heard ")
            assert "hello" in answer.output.answer
        finally:
            await gateway.aclose()
        assert backend.closed  # type: ignore[attr-defined]

    asyncio.run(call())


@pytest.mark.parametrize("url", ["mybackend://host/model", "ollama://localhost:11434"])
def test_an_unknown_scheme_names_the_setting_the_installed_backends_and_the_fix(
    toy_installed: Path, url: str
) -> None:
    scheme = url.split("://")[0]
    with pytest.raises(ValueError) as info:
        parse_llm_url(url)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"ARENA_LLM={url!r} ")
    assert f"no installed backend serves scheme {scheme!r}" in message
    assert {"hf", "openai", "rules", "toy", "vllm"} <= set(installed_backends())
    assert f"installed backends: {', '.join(installed_backends())};" in message
    assert f"fix: install a package that registers {scheme!r} in entry point group 'arena.llm_backends'" in (
        message
    )


def test_an_unknown_scheme_fails_make_backend_too(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ARENA_LLM='toy://anything' .*scheme 'toy'.*installed backends: "):
        make_backend(ArenaSettings(home=tmp_path, llm="toy://anything"))  # the toy package is not installed


def test_rules_takes_no_url() -> None:
    with pytest.raises(ValueError, match=r"rules takes no URL: ARENA_LLM=rules"):
        parse_llm_url("rules://x")

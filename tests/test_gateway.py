"""The LLM gateway on the rules backend: determinism, cache, retries, catalog, usage, URLs."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from arena.config import ArenaSettings
from arena.llm.backends import BackendError, LlmTarget, make_backend, parse_llm_url
from arena.llm.cache import ResponseCache
from arena.llm.core import (
    Backend,
    Completion,
    CompletionRequest,
    InvalidOutput,
    Role,
    Sampling,
    TransientError,
    Undecidable,
)
from arena.llm.gateway import CACHE_FILE, Gateway, cache_key
from arena.llm.replies import NoJsonObject, extract_json
from lake.catalog import Catalog, open_gateway
from simulator.backend import RuleFn, RulesBackend, UnknownRole


class EchoIn(BaseModel):
    """Input of the test role."""

    text: Annotated[str, Field(description="Text to echo.")]
    n: Annotated[int, Field(description="A number the rule mixes in.")] = 0


class EchoOut(BaseModel):
    """Output of the test role."""

    answer: Annotated[str, Field(description="The echoed text with a random suffix.")]
    score: Annotated[float, Field(ge=0, le=1, description="A random score.")]


def _role(name: str, system: str = "Echo the text as JSON.") -> Role[EchoIn, EchoOut]:
    return Role(
        name=name,
        input=EchoIn,
        output=EchoOut,
        system=system + ' Reply with {"answer": string, "score": number in [0, 1]}.',
        template="Input:\n{input}",
    )


ECHO = _role("test_echo")
UNDECIDABLE = _role("test_undecidable")
WRONG_SHAPE = _role("test_wrong_shape")


def _echo(inputs: BaseModel, rng: random.Random) -> BaseModel:
    assert isinstance(inputs, EchoIn)
    return EchoOut(answer=f"{inputs.text}-{inputs.n}-{rng.randrange(10**9)}", score=rng.random())


def _undecidable(inputs: BaseModel, rng: random.Random) -> BaseModel:
    raise Undecidable(f"cannot decide on {inputs!r}")


def _wrong_shape(inputs: BaseModel, rng: random.Random) -> BaseModel:
    return EchoIn(text=f"not an EchoOut {rng.randrange(100)}")  # valid JSON, wrong model


TEST_RULES: dict[str, RuleFn] = {
    ECHO.name: _echo,
    UNDECIDABLE.name: _undecidable,
    WRONG_SHAPE.name: _wrong_shape,
}


@dataclass
class CountingBackend:
    """A real Backend wrapping another: records requests and can garble chosen attempts' replies."""

    inner: Backend
    garble_attempts: frozenset[int] = frozenset()
    fence: bool = False
    requests: list[CompletionRequest] = field(default_factory=list)
    name: str = ""
    model: str = ""

    def __post_init__(self) -> None:
        self.name, self.model = self.inner.name, self.inner.model

    async def complete(self, request: CompletionRequest) -> Completion:
        self.requests.append(request)
        completion = await self.inner.complete(request)
        text = completion.text
        if request.attempt in self.garble_attempts:
            text = "Sure! Here it is: " + text[: len(text) // 2]  # truncated JSON
        elif self.fence:
            text = f"Here is the JSON you asked for:\n```json\n{text}\n```\nAnything else?"
        return replace(completion, text=text)

    async def aclose(self) -> None:
        await self.inner.aclose()


def _gateway(
    tmp_path: Path | None = None,
    seed: int = 0,
    garble_attempts: frozenset[int] = frozenset(),
    fence: bool = False,
) -> tuple[Gateway, CountingBackend]:
    backend = CountingBackend(RulesBackend(seed=seed, rules=TEST_RULES), garble_attempts, fence)
    cache = ResponseCache(tmp_path / "cache.db") if tmp_path is not None else None
    return Gateway(backend, cache=cache, max_attempts=3, seed=seed, backoff_s=0.01), backend


def test_rules_output_is_deterministic_per_seed() -> None:
    async def run(seed: int) -> EchoOut:
        gateway, _ = _gateway(seed=seed)
        try:
            answer = await gateway.call(ECHO, EchoIn(text="hello", n=3))
        finally:
            await gateway.aclose()
        assert answer.backend == "rules" and answer.model == "rules-v1" and not answer.cached
        return answer.output

    first, again, other = asyncio.run(run(0)), asyncio.run(run(0)), asyncio.run(run(1))
    assert first == again
    assert first != other
    assert first.answer.startswith("hello-3-")


def test_cache_hit_skips_the_backend(tmp_path: Path) -> None:
    async def run() -> None:
        gateway, backend = _gateway(tmp_path)
        inputs = EchoIn(text="cache me")
        first = await gateway.call(ECHO, inputs)
        second = await gateway.call(ECHO, inputs)
        assert not first.cached and second.cached
        assert second.output == first.output and second.raw == first.raw
        assert len(backend.requests) == 1
        await gateway.aclose()

        # Another gateway (another worker process would do the same) reads the same file.
        reopened, backend2 = _gateway(tmp_path)
        third = await reopened.call(ECHO, inputs)
        assert third.cached and third.output == first.output and backend2.requests == []
        assert reopened.usage.roles[ECHO.name].cache_hits == 1
        await reopened.aclose()

    asyncio.run(run())


def test_cache_key_covers_sampling_model_and_prompt_version() -> None:
    inputs, sampling = EchoIn(text="k"), Sampling()
    base = cache_key(ECHO, inputs, "rules", "rules-v1", sampling)
    assert base == cache_key(ECHO, EchoIn(text="k"), "rules", "rules-v1", Sampling())
    changed_prompt = _role(ECHO.name, system="Echo the text, politely, as JSON.")
    assert changed_prompt.version != ECHO.version
    variants = [
        cache_key(ECHO, inputs, "rules", "rules-v1", Sampling(temperature=0.2)),
        cache_key(ECHO, inputs, "rules", "rules-v1", Sampling(seed=7)),
        cache_key(ECHO, inputs, "rules", "rules-v2", sampling),
        cache_key(ECHO, inputs, "openai", "rules-v1", sampling),
        cache_key(changed_prompt, inputs, "rules", "rules-v1", sampling),
        cache_key(ECHO, EchoIn(text="k", n=1), "rules", "rules-v1", sampling),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_different_sampling_misses_the_cache(tmp_path: Path) -> None:
    async def run() -> None:
        gateway, backend = _gateway(tmp_path)
        inputs = EchoIn(text="s")
        await gateway.call(ECHO, inputs, Sampling(temperature=0.1))
        again = await gateway.call(ECHO, inputs, Sampling(temperature=0.9))
        assert not again.cached and len(backend.requests) == 2
        await gateway.aclose()

    asyncio.run(run())


def test_invalid_output_is_retried_with_the_next_attempt() -> None:
    async def run() -> None:
        gateway, backend = _gateway(garble_attempts=frozenset({0}))
        answer = await gateway.call(ECHO, EchoIn(text="retry"))
        assert [r.attempt for r in backend.requests] == [0, 1]
        # Attempt 1 reseeds the rule: the answer is attempt 1's draw, not attempt 0's.
        direct = await RulesBackend(rules=TEST_RULES).complete(backend.requests[1])
        assert answer.raw == direct.text
        usage = gateway.usage.roles[ECHO.name]
        assert (usage.calls, usage.attempts, usage.retries, usage.invalid_outputs, usage.failures) == (
            1,
            2,
            1,
            1,
            0,
        )

    asyncio.run(run())


def test_a_transport_retry_resends_the_same_request() -> None:
    """A timeout or reset is the endpoint's fault, not the reply's: the retry keeps its seed and answer."""

    @dataclass
    class FailsFirst(CountingBackend):
        failures: int = 2

        async def complete(self, request: CompletionRequest) -> Completion:
            if self.failures:
                self.failures -= 1
                self.requests.append(request)
                raise TransientError("connection reset")
            return await super().complete(request)

    async def run() -> None:
        clean, _ = _gateway()
        expected = await clean.call(ECHO, EchoIn(text="flaky"))
        backend = FailsFirst(RulesBackend(seed=0, rules=TEST_RULES))
        gateway = Gateway(backend, max_attempts=3, seed=0, backoff_s=0.01)
        answer = await gateway.call(ECHO, EchoIn(text="flaky"))
        assert [r.attempt for r in backend.requests] == [0, 0, 0]
        assert answer.raw == expected.raw
        await gateway.aclose()
        await clean.aclose()

    asyncio.run(run())


def test_fenced_json_with_prose_is_accepted() -> None:
    async def run() -> None:
        gateway, backend = _gateway(fence=True)
        answer = await gateway.call(ECHO, EchoIn(text="fenced"))
        assert answer.raw.startswith("Here is the JSON") and answer.output.answer.startswith("fenced-")
        assert len(backend.requests) == 1

    asyncio.run(run())


def test_extract_json_takes_the_first_object() -> None:
    assert extract_json('```json\n{"a": 1}\n```') == {"a": 1}
    assert extract_json('Answer: {"a": {"b": [1, 2]}} and then {"c": 3}') == {"a": {"b": [1, 2]}}
    assert extract_json('broken {"a": 1, then {"b": 2}') == {"b": 2}
    with pytest.raises(NoJsonObject):
        extract_json("[1, 2, 3] no object here")
    with pytest.raises(NoJsonObject):
        extract_json("")


def test_invalid_output_ends_as_invalid_output_with_the_raw_text(tmp_path: Path) -> None:
    async def run() -> None:
        gateway, backend = _gateway(tmp_path)
        with pytest.raises(InvalidOutput) as info:
            await gateway.call(WRONG_SHAPE, EchoIn(text="x"))
        error = info.value
        assert error.role == WRONG_SHAPE.name and error.attempts == 3 and len(error.errors) == 3
        assert all("invalid output" in e for e in error.errors)
        last = await RulesBackend(rules=TEST_RULES).complete(backend.requests[-1])
        assert error.raw == last.text and '"text":"not an EchoOut' in error.raw
        assert [r.attempt for r in backend.requests] == [0, 1, 2]
        assert gateway.cache is not None and await gateway.cache.count() == 0  # only valid output is cached
        assert gateway.usage.roles[WRONG_SHAPE.name].failures == 1
        await gateway.aclose()

    asyncio.run(run())


def test_undecidable_is_retried_then_invalid_output() -> None:
    async def run() -> None:
        gateway, backend = _gateway()
        with pytest.raises(InvalidOutput) as info:
            await gateway.call(UNDECIDABLE, EchoIn(text="?"))
        assert info.value.raw == "" and info.value.attempts == 3
        assert all("undecidable" in e for e in info.value.errors)
        assert [r.attempt for r in backend.requests] == [0, 1, 2]
        usage = gateway.usage.roles[UNDECIDABLE.name]
        assert (usage.attempts, usage.retries, usage.invalid_outputs, usage.failures) == (3, 2, 3, 1)

    asyncio.run(run())


def test_unknown_role_is_a_clear_error_not_a_retry() -> None:
    async def run() -> None:
        gateway, backend = _gateway()
        with pytest.raises(UnknownRole, match="no rule for role 'test_nobody'"):
            await gateway.call(_role("test_nobody"), EchoIn(text="x"))
        assert len(backend.requests) == 1
        assert gateway.usage.roles["test_nobody"].failures == 1

    asyncio.run(run())


def test_inputs_of_the_wrong_type_are_refused() -> None:
    async def run() -> None:
        gateway, _ = _gateway()
        with pytest.raises(TypeError, match="takes EchoIn"):
            await gateway.call(ECHO, EchoOut(answer="a", score=0.1))  # type: ignore[arg-type,misc]

    asyncio.run(run())


def test_prompt_version_is_registered_in_the_catalog_once(tmp_path: Path) -> None:
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")

    async def run() -> None:
        backend = RulesBackend(rules=TEST_RULES)
        gateway = Gateway(backend, catalog=catalog)
        answers = await asyncio.gather(*(gateway.call(ECHO, EchoIn(text=str(i))) for i in range(5)))
        assert {a.prompt_version for a in answers} == {ECHO.version}
        await gateway.aclose()

    asyncio.run(run())
    versions = catalog.prompt_versions(ECHO.name)
    assert [(v.id, v.version, v.text) for v in versions] == [(ECHO.version, 1, ECHO.prompt_text)]
    catalog.dispose()


def test_usage_snapshot_counts_per_role(tmp_path: Path) -> None:
    async def run() -> None:
        gateway, _ = _gateway(tmp_path)
        await gateway.call(ECHO, EchoIn(text="a"))
        await gateway.call(ECHO, EchoIn(text="a"))
        await gateway.call(ECHO, EchoIn(text="b"))
        with pytest.raises(InvalidOutput):
            await gateway.call(UNDECIDABLE, EchoIn(text="c"))
        snapshot = gateway.usage
        echo = snapshot.roles[ECHO.name]
        assert (echo.calls, echo.cache_hits, echo.attempts, echo.failures) == (3, 1, 2, 0)
        total = snapshot.total
        assert (total.calls, total.attempts, total.failures) == (4, 5, 1)
        assert total.prompt_tokens > 0 and total.completion_tokens > 0  # estimated: rules have no tokenizer
        snapshot.roles[ECHO.name].calls = 99  # a snapshot, not the live counters
        assert gateway.usage.roles[ECHO.name].calls == 3
        await gateway.aclose()

    asyncio.run(run())


def test_from_settings_uses_home_cache_and_catalog(tmp_path: Path) -> None:
    settings = ArenaSettings(home=tmp_path / "home", llm="rules", llm_max_attempts=2, seed=5)
    gateway = open_gateway(settings)
    assert isinstance(gateway.backend, RulesBackend) and gateway.backend.seed == 5
    assert gateway.max_attempts == 2 and gateway.cache is not None
    assert gateway.cache.path == settings.home / CACHE_FILE
    asyncio.run(gateway.aclose())


def test_cache_is_shared_by_concurrent_processes(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from arena.llm.cache import ResponseCache
        from arena.llm.core import Usage

        async def main(worker):
            cache = ResponseCache({str(path)!r})
            for i in range(100):
                await cache.put(f"k{{i % 50}}", "r", f"w{{worker}}-{{i}}", Usage(1, 2))
                assert (await cache.get(f"k{{i % 50}}")) is not None
            await cache.aclose()

        asyncio.run(main(int(sys.argv[1])))
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in range(3)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]

    async def check() -> None:
        cache = ResponseCache(path)
        assert await cache.count() == 50
        stored = await cache.get("k7")
        assert stored is not None and stored.prompt_tokens == 1 and stored.completion_tokens == 2
        await cache.aclose()

    asyncio.run(check())


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("rules", LlmTarget(kind="rules")),
        (
            "openai://127.0.0.1:8000/v1?model=Qwen/Qwen3-8B",
            LlmTarget(kind="openai", base_url="http://127.0.0.1:8000/v1", model="Qwen/Qwen3-8B"),
        ),
        (
            "openais://llm.example.org/api/v1/?model=m",
            LlmTarget(kind="openai", base_url="https://llm.example.org/api/v1", model="m"),
        ),
        (
            "openai://localhost:9000?model=m",
            LlmTarget(kind="openai", base_url="http://localhost:9000/v1", model="m"),
        ),
        ("hf:///models/tiny", LlmTarget(kind="hf", path="/models/tiny")),
        ("vllm:///models/qwen", LlmTarget(kind="vllm", path="/models/qwen")),
    ],
)
def test_parse_llm_url_accepts(url: str, expected: LlmTarget) -> None:
    assert parse_llm_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "",
        "gpt-4",
        "ollama://localhost:11434",
        "openai://127.0.0.1:8000/v1",
        "openai://127.0.0.1:8000/v1?model=",
        "openai://127.0.0.1:8000/v1?model=a&model=b",
        "openai://127.0.0.1:8000/v1?model=m&temperature=1",
        "openai://user:secret@127.0.0.1:8000/v1?model=m",
        "openai://127.0.0.1:notaport/v1?model=m",
        "openai:///v1?model=m",
        "hf://models/tiny",
        "hf:///",
        "vllm:///models/q?x=1",
    ],
)
def test_parse_llm_url_rejects_with_one_clear_line(url: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_llm_url(url)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"ARENA_LLM={url!r} ")
    assert (
        "rules | openai://host:port/v1?model=M" in message and "hf:///" in message and "vllm:///" in message
    )


def test_make_backend_builds_each_kind(tmp_path: Path) -> None:
    assert isinstance(make_backend(ArenaSettings(home=tmp_path, llm="rules")), RulesBackend)
    openai = make_backend(
        ArenaSettings(
            home=tmp_path,
            llm="openai://127.0.0.1:1/v1?model=m",
            llm_api_key="sk-do-not-print",
            llm_concurrency=3,
            llm_timeout_s=7,
        )
    )
    assert (openai.name, openai.model) == ("openai", "m")
    assert "sk-do-not-print" not in repr(openai)
    asyncio.run(openai.aclose())
    with pytest.raises(BackendError, match="no model at"):
        make_backend(ArenaSettings(home=tmp_path, llm=f"hf://{tmp_path}/missing"))
    with pytest.raises(ValueError, match="ARENA_LLM"):
        make_backend(ArenaSettings(home=tmp_path, llm="nonsense"))


def test_vllm_backend_without_vllm_says_how_to_install(tmp_path: Path) -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed here")
    with pytest.raises(BackendError, match=r"pip install 'arena\[gpu\]'"):
        make_backend(ArenaSettings(home=tmp_path, llm=f"vllm://{tmp_path}"))


def test_identical_calls_in_flight_share_one_request() -> None:
    """Concurrent records often ask the same question at once: one request answers all of them."""

    class Slow:
        name = "slow"
        model = "m"

        def __init__(self) -> None:
            self.requests = 0

        async def complete(self, request: CompletionRequest) -> Completion:
            self.requests += 1
            await asyncio.sleep(0.05)
            return Completion(text='{"answer": "ok", "score": 0.5}')

        async def aclose(self) -> None:
            return None

    from tests.fixtures.openai_server import ASK, Question

    backend = Slow()

    async def run() -> None:
        gateway = Gateway(backend)
        answers = await asyncio.gather(*(gateway.call(ASK, Question(text="same?")) for _ in range(5)))
        assert {a.output.answer for a in answers} == {"ok"}
        other = await gateway.call(ASK, Question(text="different?"))
        assert other.output.answer == "ok"
        usage = gateway.usage.roles[ASK.name]
        assert (usage.calls, usage.shared, usage.attempts) == (6, 4, 2)
        await gateway.aclose()

    asyncio.run(run())
    assert backend.requests == 2

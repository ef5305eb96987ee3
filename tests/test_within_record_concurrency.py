"""Concurrency inside one record: a stage's independent LLM calls for one input are in flight at once.

Each stage handler runs in-process on one record through a gateway whose backend (the rules
simulator) counts how many ``complete`` calls are in flight at once. The reference is the same
handler with ``synthesis.fanout.LIMIT = 1``: one item after another, as the stages' plain loops
ran before. The concurrent run must reach more than one call in flight and emit exactly what
the reference emits, in the same order, dead letters of failing items included.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from arena.config import ArenaSettings
from arena.llm.core import Completion, CompletionRequest, Undecidable
from arena.llm.gateway import Gateway
from arena.records.sft import Task, ToolChain
from arena.records.tools import ToolServer
from arena.topics import topic
from producers.tool_docs import load_tool_docs
from sandbox import SandboxPool
from simulator.backend import RulesBackend
from streams.runtime import Context, Emit, StageDef, run_handler
from streams.sft import chains, tasks, trajectories
from synthesis import fanout
from synthesis.envs.env_synthesis import synthesize_package
from synthesis.envs.merging import base_of, merge_package
from synthesis.envs.roles.envs import MergeInvocationInput
from synthesis.sft.roles.chains import ChainSynthesisInput, ChainTaskInput
from synthesis.sft.roles.tasks import AugmentInput
from synthesis.tools.normalize import normalize_server, server_id
from tests.test_env_synthesis import PARALLEL, SETTINGS, run

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "tools" / "good"
STAGE_MODULES = (chains, tasks, trajectories)

Failing = Callable[[CompletionRequest], bool]


class PeakBackend:
    """The rules backend, counting the ``complete`` calls in flight; ``fail`` picks requests to refuse."""

    name = "rules"
    model = "rules-v1"

    def __init__(self, seed: int = 0, fail: Failing | None = None) -> None:
        self.inner = RulesBackend(seed=seed)
        self.fail = fail
        self.in_flight = 0
        self.peak = 0
        self.requests = 0

    async def complete(self, request: CompletionRequest) -> Completion:
        self.in_flight += 1
        self.requests += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0)  # let every call that is ready start before this one answers
            if self.fail is not None and self.fail(request):
                raise Undecidable(f"refused by the test: {request.role.name}")
            return await self.inner.complete(request)
        finally:
            self.in_flight -= 1

    async def aclose(self) -> None:
        await self.inner.aclose()


def timeless(value: Any) -> Any:
    """``value`` without wall-clock fields: a rejection's or dead letter's ``at``, a tool call's latency."""
    if isinstance(value, dict):
        return {k: timeless(v) for k, v in value.items() if k not in ("at", "latency_ms")}
    if isinstance(value, list):
        return [timeless(v) for v in value]
    return value


def dump(emits: list[Emit]) -> list[dict[str, Any]]:
    """Emits as comparable data (wall-clock fields left out)."""
    out = []
    for e in emits:
        value = timeless(e.value.model_dump(mode="json"))
        out.append(
            {
                "topic": e.topic,
                "key": e.key,
                "value": value,
                "source_ids": e.source_ids,
                "lineage": (e.prompt_version, e.backend, e.model),
            }
        )
    return out


@pytest.fixture(scope="module")
def servers() -> dict[str, ToolServer]:
    out = {}
    for raw in load_tool_docs([SAMPLES]).servers:
        tools = normalize_server(raw).tools
        out[raw.server] = ToolServer(
            server_id=server_id(raw.server, tools),
            name=raw.server,
            source=raw.source,
            format=raw.format,
            domain="Travel",
            domain_score=1.0,
            tools=tools,
        )
    return out


class Harness:
    """Runs stage handlers in-process, each run with a fresh home (catalog, chain graphs) and gateway."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp_path = tmp_path
        self.monkeypatch = monkeypatch
        self.settings: list[ArenaSettings] = []
        """Every run's settings, kept alive: ``streams.resources`` keys its stores by ``id(settings)``."""

    def run(
        self,
        stage: StageDef[Any],
        records: list[tuple[str, BaseModel]],
        *,
        sequential: bool = False,
        fail: Failing | None = None,
        together: bool = False,
    ) -> tuple[list[Emit], PeakBackend]:
        """``stage`` on ``records`` (one after another, or all at once with ``together``)."""
        settings = ArenaSettings(
            home=self.tmp_path / f"run-{len(self.settings)}", llm="rules", catalog_url=None
        )
        self.settings.append(settings)
        backend = PeakBackend(seed=settings.seed, fail=fail)
        gateway = Gateway(backend, max_attempts=2, seed=settings.seed, backoff_s=0.0)
        for module in STAGE_MODULES:
            self.monkeypatch.setattr(module, "gateway_for", lambda _settings: gateway)
        self.monkeypatch.setattr(fanout, "LIMIT", 1 if sequential else 64)
        spec = topic(stage.input)

        async def one(key: str, record: BaseModel) -> list[Emit]:
            raw = record.model_dump_json().encode()
            return await run_handler(
                stage, record, Context(stage.name, stage.version, spec, key, settings, raw), raw
            )

        async def main() -> list[Emit]:
            if together:
                batches = await asyncio.gather(*(one(k, r) for k, r in records))
            else:
                batches = [await one(k, r) for k, r in records]
            return [e for batch in batches for e in batch]

        return asyncio.run(main()), backend

    def compare(
        self, stage: StageDef[Any], records: list[tuple[str, BaseModel]], fail: Failing | None = None
    ) -> tuple[list[Emit], int, int]:
        """Emits of the concurrent run (checked equal to the sequential one), its peak and the reference's."""
        reference, before = self.run(stage, records, sequential=True, fail=fail)
        emits, after = self.run(stage, records, fail=fail)
        assert dump(emits) == dump(reference)
        assert after.requests == before.requests  # no call asked twice, none skipped
        return emits, after.peak, before.peak


@pytest.fixture
def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    yield Harness(tmp_path, monkeypatch)


def one_server(
    servers: dict[str, ToolServer], name: str = "Hotel Booking API"
) -> list[tuple[str, BaseModel]]:
    server = servers[name]
    return [(server.server_id, server)]


def test_chains_ask_syntheses_and_walk_candidates_at_once(
    harness: Harness, servers: dict[str, ToolServer]
) -> None:
    emits, peak, reference_peak = harness.compare(chains.STAGE, one_server(servers))
    assert reference_peak == 1
    assert peak > 1, peak
    assert sum(e.topic == "chains" for e in emits) >= 2


def test_task_stages_augment_and_score_at_once(harness: Harness, servers: dict[str, ToolServer]) -> None:
    made, _ = harness.run(chains.STAGE, one_server(servers))
    chain = next(e.value for e in made if isinstance(e.value, ToolChain))
    emits, peak, reference_peak = harness.compare(tasks.CHAIN_STAGE, [(chain.chain_id, chain)])
    assert reference_peak == 1 and peak > 1, (reference_peak, peak)
    assert sum(e.topic == "tasks" for e in emits) >= 2
    emits, peak, reference_peak = harness.compare(tasks.SERVER_STAGE, one_server(servers, "restaurants"))
    assert reference_peak == 1 and peak > 1, (reference_peak, peak)
    assert sum(e.topic == "tasks" for e in emits) >= 2


def test_one_failing_item_costs_only_itself(harness: Harness, servers: dict[str, ToolServer]) -> None:
    def chain_failures(request: CompletionRequest) -> bool:
        inputs = request.inputs
        return (isinstance(inputs, ChainSynthesisInput) and inputs.variant == 2) or (
            isinstance(inputs, ChainTaskInput) and len(inputs.chain) == 3
        )

    emits, peak, _ = harness.compare(chains.STAGE, one_server(servers), fail=chain_failures)
    letters = [e.value for e in emits if e.topic == "tools.servers.dlq"]
    assert any("chain_synthesis variant 2" in getattr(d, "reason", "") for d in letters), letters
    assert any(getattr(d, "reason", "").startswith("chain ") for d in letters), letters
    assert any(e.topic == "chains" for e in emits) and peak > 1

    def augment_failures(request: CompletionRequest) -> bool:
        return isinstance(request.inputs, AugmentInput) and request.inputs.axis == "complexity"

    emits, peak, _ = harness.compare(
        tasks.SERVER_STAGE, one_server(servers, "restaurants"), fail=augment_failures
    )
    letters = [e for e in emits if e.topic == "tools.servers.dlq"]
    assert len(letters) == 2  # one per original, the other axes and the scores still went through
    assert any(e.topic == "tasks" for e in emits) and peak > 1


def test_trajectories_keep_each_rollout_sequential_and_records_independent(
    harness: Harness, servers: dict[str, ToolServer]
) -> None:
    made, _ = harness.run(tasks.SERVER_STAGE, one_server(servers, "restaurants"))
    found = [e.value for e in made if isinstance(e.value, Task)][:4]
    assert len(found) >= 2
    records: list[tuple[str, BaseModel]] = [(t.task_id, t) for t in found]
    # One record is one rollout: every call depends on the answer before it (the next policy turn
    # on the tool results, the next emulated result on the session's history), so one at a time.
    alone, backend = harness.run(trajectories.STAGE, records[:1])
    assert backend.peak == 1 and alone and alone[0].topic == "trajectories"
    # Several records at once (the runtime's concurrency): the same trajectories as one by one.
    reference, _ = harness.run(trajectories.STAGE, records)
    together, backend = harness.run(trajectories.STAGE, records, together=True)
    assert dump(together) == dump(reference)
    assert backend.peak > 1


class SerialBackend(PeakBackend):
    """``PeakBackend`` answering one request at a time: the order a loop of calls would give."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = asyncio.Lock()

    async def complete(self, request: CompletionRequest) -> Completion:
        async with self.lock:
            return await super().complete(request)


def test_merge_invocations_of_a_group_are_asked_at_once() -> None:
    async def go(pool: SandboxPool) -> None:
        built = await synthesize_package(
            PARALLEL, Gateway(RulesBackend(seed=0), max_attempts=2), pool, SETTINGS
        )
        package = built.package
        assert package is not None, built.reason

        serial = SerialBackend()
        reference = await merge_package(package, Gateway(serial, max_attempts=2), pool)
        backend = PeakBackend()
        merged = await merge_package(package, Gateway(backend, max_attempts=2), pool)
        assert serial.peak == 1 and backend.peak == 2  # the group [1, 2, 4]: two members to insert
        assert merged.package == reference.package and merged.kept == reference.kept
        assert [a.raw for a in merged.answers] == [a.raw for a in reference.answers]
        assert merged.package.merged_groups == [[1, 2, 4]]

        # A member whose invocation never comes keeps its own tool; the other one is still merged.
        base = base_of(package, [1, 2, 4], 0)
        first, last = (i for i in (1, 2, 4) if i != base)
        question = next(j.question for j in package.jobs if j.index == last)

        def refuse(request: CompletionRequest) -> bool:
            inputs = request.inputs
            return isinstance(inputs, MergeInvocationInput) and inputs.question == question

        refused = PeakBackend(fail=refuse)
        partial = await merge_package(package, Gateway(refused, max_attempts=2, backoff_s=0.0), pool)
        assert list(partial.kept) == [last] and "no valid merge invocation" in partial.kept[last]
        assert partial.package.merged_groups == [sorted([base, first])]

    run(go)


# ----------------------------------------------------------------------------- the helper


def test_map_ordered_keeps_order_and_bounds_the_items_running() -> None:
    async def go() -> None:
        running = peak = 0

        async def item(n: int) -> int:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            for _ in range(random.Random(n).randrange(4)):
                await asyncio.sleep(0)
            running -= 1
            return n * n

        assert await fanout.map_ordered(item, range(200), limit=8) == [n * n for n in range(200)]
        assert peak == 8
        peak = 0
        assert await fanout.map_ordered(item, range(5), limit=1) == [0, 1, 4, 9, 16]
        assert peak == 1

    asyncio.run(go())


def test_map_ordered_raises_cancels_the_rest_and_passes_cancellation_on() -> None:
    async def go() -> None:
        cancelled: list[int] = []

        async def item(n: int) -> int:
            try:
                if n == 3:
                    raise KeyError(n)
                await asyncio.sleep(10)
                return n
            except asyncio.CancelledError:
                cancelled.append(n)
                raise

        with pytest.raises(KeyError):
            await fanout.map_ordered(item, range(6))
        assert sorted(cancelled) == [0, 1, 2, 4, 5]

        cancelled.clear()
        outer = asyncio.ensure_future(fanout.map_ordered(lambda n: item(n + 10), range(4)))
        await asyncio.sleep(0.01)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        assert sorted(cancelled) == [10, 11, 12, 13]

    asyncio.run(go())

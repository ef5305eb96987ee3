"""Stage contracts the runtime enforces: typed inputs, declared outputs, one value model per eigen topic.

Unit level, no broker: the stage runner (``OrderedRunner``) runs against a stand-in for the Faust app that records
what would be sent.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from arena.config import ArenaSettings
from arena.llm.core import Caller
from arena.records.common import DeadLetter, DeadLetterKind, Rejection
from arena.records.eigen import EigenItem, EigenSeed, Scenario
from arena.records.tools import RawToolServer, ToolServer
from arena.topics import TOPICS, topic
from lake.parquet import arrow_schema
from streams.app import CommitGate, OrderedRunner
from streams.eigen import eigen_intents
from streams.runtime import (
    Context,
    Emit,
    StageContractError,
    StageDef,
    UndeclaredTopic,
    decode_input,
    run_handler,
)
from synthesis.eigen.items import make_item

EIGEN_TOPICS = ("eigen.seeds", "eigen.intents", "eigen.tasks", "eigen.dialogs", "eigen.dialogs.validated")


def _server() -> RawToolServer:
    return RawToolServer(server="s", source="f.json", format="openai", entries=[])


def _ctx(stage: StageDef[Any], raw: bytes = b"raw") -> Context:
    return Context(stage.name, stage.version, topic(stage.input), "src-key", ArenaSettings(), raw)


# --------------------------------------------------------------------------- typed input


def test_stage_input_model_must_be_the_topics_value_model() -> None:
    async def handle(record: ToolServer, ctx: Context) -> list[Emit]:
        return []

    with pytest.raises(StageContractError, match=r"'demo'.*ToolServer.*'tools.raw' carries RawToolServer"):
        StageDef(name="demo", input="tools.raw", input_model=ToolServer, version="1", handler=handle)
    with pytest.raises(StageContractError, match=r"unknown topic 'tools\.srevers'"):
        StageDef(
            name="demo",
            input="tools.servers",
            input_model=ToolServer,
            version="1",
            handler=handle,
            outputs=("tools.srevers",),
        )


def test_handler_gets_the_validated_typed_record() -> None:
    seen: list[RawToolServer] = []

    async def handle(record: RawToolServer, ctx: Context) -> list[Emit]:
        seen.append(record)
        return []

    stage = StageDef(name="demo", input="tools.raw", input_model=RawToolServer, version="1", handler=handle)
    server = _server()
    raw = server.model_dump_json().encode()
    decoded = decode_input(stage, raw, source_key="k")
    assert decoded.dead_letter is None and decoded.record is not None
    [emit] = asyncio.run(run_handler(stage, decoded.record, _ctx(stage, raw), raw))
    assert seen == [server] and type(seen[0]) is RawToolServer
    # Nothing returned is not nothing said: the record ends as a no_output rejection.
    assert emit.topic == "tools.raw.rejected" and emit.value.gate == "no_output"  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- declared outputs


def _emitting(*emits: str, outputs: tuple[str, ...] = ("tools.servers",)) -> StageDef[RawToolServer]:
    async def handle(record: RawToolServer, ctx: Context) -> list[Emit]:
        out = []
        for name in emits:
            if name == "candidate":  # a dropped candidate for an output: <output>.rejected
                out.append(ctx.reject("gate", "subj", "why", candidate_of=outputs[0]))
            elif name == "reject":
                out.append(ctx.reject("gate", "subj", "why"))
            else:
                out.append(Emit(name, "k", record, (ctx.source_key,)))
        return out

    return StageDef(
        name="demo",
        input="tools.raw",
        input_model=RawToolServer,
        version="1",
        handler=handle,
        outputs=outputs,
    )


def test_an_emit_to_an_undeclared_topic_raises() -> None:
    stage = _emitting("tools.servers", "chains")
    with pytest.raises(UndeclaredTopic) as info:
        asyncio.run(run_handler(stage, _server(), _ctx(stage), b"raw"))
    err = info.value
    assert (err.stage, err.topic) == ("demo", "chains")
    assert err.declared == ("tools.raw.dlq", "tools.raw.rejected", "tools.servers", "tools.servers.rejected")
    assert "'demo'" in str(err) and "'chains'" in str(err) and "tools.servers.rejected" in str(err)
    # A side topic of another topic is just as undeclared.
    with pytest.raises(UndeclaredTopic, match=r"'chains\.rejected'"):
        asyncio.run(run_handler(_emitting("chains.rejected"), _server(), _ctx(stage), b"raw"))


def test_declared_outputs_and_side_topics_pass() -> None:
    stage = _emitting("tools.servers", "reject", "candidate", "tools.raw.dlq")
    emits = asyncio.run(run_handler(stage, _server(), _ctx(stage), b"raw"))
    assert [e.topic for e in emits] == [
        "tools.servers",
        "tools.raw.rejected",
        "tools.servers.rejected",
        "tools.raw.dlq",
    ]
    assert isinstance(emits[1].value, Rejection)


def test_a_crash_is_still_a_dead_letter_on_the_input() -> None:
    async def boom(record: RawToolServer, ctx: Context) -> list[Emit]:
        raise RuntimeError("boom")

    stage = StageDef(name="demo", input="tools.raw", input_model=RawToolServer, version="1", handler=boom)
    (emit,) = asyncio.run(run_handler(stage, _server(), _ctx(stage), b"raw"))
    assert emit.topic == "tools.raw.dlq" and isinstance(emit.value, DeadLetter)


# --------------------------------------------------------------------------- eigen topics


def test_each_eigen_topic_has_its_own_typed_value_model() -> None:
    models = {name: topic(name).value for name in (*EIGEN_TOPICS, "eigen.verified")}
    assert len(set(models.values())) == len(models)
    for name, model in models.items():
        assert issubclass(model, EigenItem)
        payload = model.model_fields["payload"]
        assert isinstance(payload.annotation, type) and payload.annotation.__name__ != "BaseModel"
        # The lake keeps the envelope's columns and the payload as one JSON column.
        schema = arrow_schema(name)
        assert {"item_id", "domain", "prompt_set", "parent_id", "payload"} <= set(schema.names)
        assert (schema.field("payload").metadata or {}).get(b"encoding") == b"json"


@dataclass
class _Message:
    value: bytes
    key: bytes = b"seed-key"
    topic: str = "eigen.seeds"
    partition: int = 0
    offset: int = 7
    generation_id: int = 1
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass
class _Event:
    message: _Message
    acked: bool = False

    def ack(self) -> None:
        self.acked = True


@dataclass
class _Producer:
    sent: list[tuple[str, bytes, bytes]] = field(default_factory=list)

    async def send(self, topic: str, key: bytes, value: bytes, *args: Any, **kwargs: Any) -> Any:
        self.sent.append((topic, key, value))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@dataclass
class _App:
    """What the stage runner uses of a Faust app: a producer, outside a transaction, no rebalance."""

    producer: _Producer = field(default_factory=_Producer)
    in_transaction: bool = False
    rebalancing: bool = False
    consumer_generation_id: int = 1


def _process(stage: StageDef[Any], value: bytes) -> list[tuple[str, bytes, bytes]]:
    app, event = _App(), _Event(_Message(value, topic=stage.input))

    async def run() -> None:
        runner = OrderedRunner(app, stage, ArenaSettings(), CommitGate(), None, 1, Caller())  # type: ignore[arg-type]
        await runner.submit(event)
        await runner.drain()

    asyncio.run(run())
    assert event.acked
    return app.producer.sent


def _seed() -> EigenSeed:
    scenario = Scenario(pack_id="pack-x", state_seed=1, size="small", seed=2)
    return make_item(EigenSeed, None, scenario, domain="customer_service", prompt_set="ps-x")


def test_a_malformed_eigen_payload_is_dead_lettered_as_a_schema_violation() -> None:
    stage = eigen_intents.STAGE
    doc = json.loads(_seed().model_dump_json())
    del doc["payload"]["size"]  # the envelope is fine; the payload misses a Scenario field
    raw = json.dumps(doc).encode()
    (name, key, value), (ledger, _, entry) = _process(
        stage, raw
    )  # the handler never runs (it would need a catalog)
    assert ledger == "stages.ledger" and json.loads(entry)["outcome"] == "dead_letter"
    letter = DeadLetter.model_validate_json(value)
    assert name == "eigen.seeds.dlq" and key
    assert letter.kind == DeadLetterKind.schema_violation and letter.stage == "eigen-intents"
    assert "does not match EigenSeed" in letter.reason and "payload.size" in letter.reason
    assert letter.payload_text == raw.decode() and letter.source_key == "seed-key"


def test_another_stages_payload_on_an_eigen_topic_is_a_schema_violation() -> None:
    # A seed (Scenario payload) written to eigen.intents: the envelope validates, the payload does not.
    spec = topic("eigen.intents")
    seed = _seed().model_dump_json().encode()
    decoded = decode_input(
        StageDef(
            name="demo",
            input=spec.name,
            input_model=spec.value,
            version="1",
            handler=_never,
        ),
        seed,
        source_key="k",
    )
    letter = decoded.dead_letter
    assert decoded.record is None and letter is not None
    assert letter.kind == DeadLetterKind.schema_violation
    assert "does not match EigenIntent" in letter.reason and "payload.draw" in letter.reason


async def _never(record: Any, ctx: Context) -> list[Emit]:
    raise AssertionError("the handler must not run on a record that does not validate")


def test_every_registered_topic_model_round_trips_a_seed_only_where_it_belongs() -> None:
    raw = _seed().model_dump_json()
    fits = sorted(name for name, spec in TOPICS.items() if _validates(spec.value, raw))
    assert fits == ["eigen.seeds"]


def _validates(model: type[Any], raw: str) -> bool:
    try:
        model.model_validate_json(raw)
    except ValueError:
        return False
    return True

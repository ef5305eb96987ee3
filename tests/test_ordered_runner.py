"""The concurrent runner: many records in flight, outputs and acks released in offset order.

Faust is replaced here by the few attributes the runner reads (rebalancing, generation, the
producer, the ack), so each property can be provoked deterministically (a dedupe stage reads its
keys from the real session broker); the real broker path, with SIGKILL, is in tests/test_recovery.py
and tests/test_llm_endpoint_faults.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaProducer
from pydantic import BaseModel

from arena.config import ArenaSettings
from arena.llm.core import CALLER, Caller
from arena.records.common import DeadLetter
from arena.records.tools import RawToolServer
from streams.app import CommitGate, OrderedRunner
from streams.dedupe import SeenKeys
from streams.runtime import Context, Emit, StageDef, dead_letter_key

TOPIC = "tools.raw"


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclass
class Message:
    partition: int
    offset: int
    key: bytes
    value: bytes
    generation_id: int = 1
    topic: str = TOPIC
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)


@dataclass
class Event:
    message: Message
    log: list[tuple[str, int, int]]

    def ack(self) -> None:
        self.log.append(("ack", self.message.partition, self.message.offset))


@dataclass
class Producer:
    log: list[tuple[str, int, int]]
    sent: list[tuple[str, bytes]] = field(default_factory=list)
    ledger: list[tuple[int, int, str]] = field(default_factory=list)
    """(partition, offset, outcome) of each ledger entry sent: one per released record."""
    letters: list[tuple[bytes, dict[str, Any]]] = field(default_factory=list)
    """(key, value) of each dead letter sent."""

    async def send(self, topic: str, key: bytes, value: bytes, *args: Any, **kwargs: Any) -> Any:
        record = json.loads(value)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.set_result(None)
        if topic == "stages.ledger":
            self.ledger.append((record["partition"], record["offset"], record["outcome"]))
            return future
        self.sent.append((topic, key))
        if topic.endswith(".dlq"):
            self.letters.append((key, record))
        if "source_key" in record:  # a dead letter: it names its input by key, k<partition>-<offset>
            partition, offset = (int(x) for x in record["source_key"][1:].split("-"))
        else:
            partition, offset = record["partition"], record["offset"]
        self.log.append(("send", partition, offset))
        return future


@dataclass
class App:
    producer: Producer
    rebalancing: bool = False
    consumer_generation_id: int = 1
    in_transaction: bool = False


class Echo(BaseModel):
    """Stand-in output value: where the input came from."""

    partition: int
    offset: int


def _stage(delays: dict[tuple[int, int], float], callers: list[Caller]) -> StageDef[RawToolServer]:
    async def handle(record: RawToolServer, ctx: Context) -> list[Emit]:
        callers.append(CALLER.get())
        partition, offset = (int(x) for x in record.server.split("-"))
        await asyncio.sleep(delays.get((partition, offset), 0.0))
        if offset == 3 and partition == 0:
            raise RuntimeError("this record is broken")
        value = Echo(partition=partition, offset=offset)
        return [Emit("tools.servers", f"{partition}-{offset}", value)]

    return StageDef(
        name="tools-servers",
        input=TOPIC,
        input_model=RawToolServer,
        version="t1",
        handler=handle,
        outputs=("tools.servers",),
    )


def _event(partition: int, offset: int, log: list[tuple[str, int, int]], generation: int = 1) -> Event:
    value = json.dumps(
        {"server": f"{partition}-{offset}", "source": "test", "format": "mcp", "entries": []}
    ).encode()
    return Event(Message(partition, offset, f"k{partition}-{offset}".encode(), value, generation), log)


def _run(
    events: list[Event],
    app: App,
    stage: StageDef[RawToolServer],
    concurrency: int,
    seen: SeenKeys | None = None,
) -> OrderedRunner:
    async def go() -> OrderedRunner:
        runner = OrderedRunner(
            app,  # type: ignore[arg-type]
            stage,
            ArenaSettings(),
            CommitGate(),
            seen,
            concurrency,
            Caller("tools-servers", 3),
        )
        for event in events:
            await runner.submit(event)
        await runner.drain()
        return runner

    return asyncio.run(go())


def test_records_run_concurrently_but_release_in_offset_order_per_partition() -> None:
    log: list[tuple[str, int, int]] = []
    # Early offsets are the slow ones: they finish last.
    delays = {(p, o): 0.02 * (6 - o) for p in (0, 1) for o in range(6)}
    callers: list[Caller] = []
    app = App(Producer(log))
    events = [_event(p, o, log) for o in range(6) for p in (0, 1)]
    _run(events, app, _stage(delays, callers), concurrency=12)

    for partition in (0, 1):
        acks = [o for kind, p, o in log if kind == "ack" and p == partition]
        assert acks == list(range(6))
    # Every send of an event comes after the previous event's ack (no output beyond the committed prefix).
    for index, (kind, partition, offset) in enumerate(log):
        if kind == "send":
            earlier_acks = {(p, o) for k, p, o in log[:index] if k == "ack"}
            assert all((partition, o) in earlier_acks for o in range(offset))
    # The broken record became a dead letter in its place; the others were not held back by it.
    assert ("tools.raw.dlq" in {t for t, _ in app.producer.sent}) and len(app.producer.sent) == 12
    assert sorted((p, o) for p, o, _ in app.producer.ledger) == sorted(
        (p, o) for k, p, o in log if k == "ack"
    )
    assert {outcome for *_, outcome in app.producer.ledger} == {"emitted", "dead_letter"}
    assert all(c == Caller("tools-servers", 3) for c in callers)  # LLM calls carry the stage


def test_concurrency_is_bounded() -> None:
    log: list[tuple[str, int, int]] = []
    in_flight = 0
    most = 0

    async def handle(record: RawToolServer, ctx: Context) -> list[Emit]:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return []

    stage = StageDef(
        name="tools-servers", input=TOPIC, input_model=RawToolServer, version="t1", handler=handle
    )
    _run([_event(0, o, log) for o in range(40)], App(Producer(log)), stage, concurrency=5)
    assert most == 5
    assert [o for kind, _, o in log if kind == "ack"] == list(range(40))


def test_events_of_an_ended_generation_are_not_released() -> None:
    """After a rebalance the partition restarts from the committed offset: a stale release would duplicate."""
    log: list[tuple[str, int, int]] = []
    app = App(Producer(log), consumer_generation_id=2)
    events = [_event(0, 0, log, generation=1), _event(0, 1, log, generation=2)]
    _run(events, app, _stage({}, []), concurrency=4)
    assert log == [("send", 0, 1), ("ack", 0, 1)]


def test_nothing_is_released_while_a_rebalance_is_under_way() -> None:
    log: list[tuple[str, int, int]] = []
    app = App(Producer(log), rebalancing=True)
    _run([_event(0, o, log) for o in range(3)], app, _stage({}, []), concurrency=4)
    assert log == []


def test_revoked_partitions_cancel_their_handlers_only() -> None:
    log: list[tuple[str, int, int]] = []
    app = App(Producer(log))
    stage = _stage({(0, 0): 5.0, (1, 0): 0.05}, [])

    async def go() -> None:
        runner = OrderedRunner(
            app,  # type: ignore[arg-type]
            stage,
            ArenaSettings(),
            CommitGate(),
            None,
            4,
            Caller(),
        )
        await runner.submit(_event(0, 0, log))
        await runner.submit(_event(1, 0, log))
        await asyncio.sleep(0.01)
        assert runner.cancel({TP(TOPIC, 0)}) == 1
        await runner.drain()

    asyncio.run(go())
    assert log == [("send", 1, 0), ("ack", 1, 0)]


def test_records_handled_before_are_acked_in_turn_and_copies_in_flight_are_dropped() -> None:
    """Dedupe stages: a key already handled is acked without outputs (or the partition would stall);
    two copies of one key handled at once release once."""
    log: list[tuple[str, int, int]] = []
    seen = SeenKeys("127.0.0.1:9", TOPIC)  # partition 0 is known below, so the broker is never read
    seen.add(0, "k0-0")
    events = [_event(0, 0, log), _event(0, 1, log), _event(0, 2, log)]
    events[2].message.key = b"k0-1"  # a copy of offset 1, in flight with it
    app = App(Producer(log))
    _run(events, app, _stage({(0, 1): 0.05}, []), concurrency=4, seen=seen)
    assert log == [("ack", 0, 0), ("send", 0, 1), ("ack", 0, 1), ("ack", 0, 2)]
    # every released record is accounted for, the skipped copies as duplicates
    assert app.producer.ledger == [(0, 0, "duplicate"), (0, 1, "emitted"), (0, 2, "duplicate")]


def test_a_replay_runs_only_in_the_stage_it_is_for() -> None:
    """A dead-letter replay names its stage: another stage reading the topic only accounts for it in
    the ledger (not_addressed, not a duplicate), the stage it is for runs it although its key was
    handled (dedupe), and a letter sent for it names the replay and where the record was read."""
    log: list[tuple[str, int, int]] = []
    callers: list[Caller] = []
    seen = SeenKeys("127.0.0.1:9", TOPIC)  # partition 0 is known below, so the broker is never read
    events = [_event(0, o, log) for o in range(4)]
    events[1].message.headers = (("arena-replay-of", b"dlf-ab#1"), ("arena-replay-for", b"tool-index"))
    events[3].message.headers = (("arena-replay-of", b"dlf-cd#2"), ("arena-replay-for", b"tools-servers"))
    for event in events[1::2]:
        seen.add(0, event.message.key.decode())  # handled when they first came
    app = App(Producer(log))
    _run(events, app, _stage({}, callers), concurrency=4, seen=seen)

    assert len(callers) == 3  # offset 1 never reached the handler
    assert app.producer.ledger == [
        (0, 0, "emitted"),
        (0, 1, "not_addressed"),
        (0, 2, "emitted"),
        (0, 3, "dead_letter"),
    ]
    ((key, value),) = app.producer.letters  # offset 3 of partition 0 crashes the handler
    letter = DeadLetter.model_validate(value)
    assert (letter.replay_of, letter.partition, letter.offset, letter.stage) == (
        "dlf-cd#2",
        0,
        3,
        "tools-servers",
    )
    assert (
        key.decode()
        == dead_letter_key(letter)
        != dead_letter_key(letter.model_copy(update={"replay_of": None}))
    )


def test_a_partition_whose_first_record_is_a_replay_still_knows_the_keys_before_it(
    broker: str, new_topic: Callable[..., str]
) -> None:
    """A dedupe stage restarted at a replay for another stage (no handling: the partition's keys are
    not read) must read them on the next record, or a key handled before that passes again."""
    name = new_topic(partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker)
    try:
        for key in (b"k0-0", b"k0-1", b"k0-0"):  # the last is the replay: the stage restarts there
            producer.send(name, b"{}", key=key, partition=0)
        producer.flush()
    finally:
        producer.close()
    log: list[tuple[str, int, int]] = []
    events = [_event(0, 2, log), _event(0, 3, log)]
    events[0].message.key = b"k0-0"
    events[0].message.headers = (("arena-replay-of", b"dlf-ab#1"), ("arena-replay-for", b"tool-index"))
    events[1].message.key = b"k0-1"  # handled before the restart: a duplicate
    app = App(Producer(log))
    _run(events, app, _stage({}, []), concurrency=1, seen=SeenKeys(broker, name))
    assert app.producer.ledger == [(0, 2, "not_addressed"), (0, 3, "duplicate")]

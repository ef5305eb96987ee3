"""The Faust side: one app (= one consumer group) per worker, and the event loop of a stage.

Exactly-once detail: Faust picks a transaction by the *output* partition,
which only matches the input partition when topics are co-partitioned. Our
stages re-key records (content hashes) and write side topics with other
partition counts, so we send through the transactional producer of the
*input* partition: each input partition's outputs and its offset commit then
land in one Kafka transaction, and a crash can neither lose nor duplicate.

Faust also snapshots the acked offsets *before* it takes a transaction's lock
to commit it, so an event handled in that gap would have its outputs committed
without its offset, and a crash right after would replay it. `CommitGate`
closes the gap: each event's sends plus its ack, and each whole commit, run
under one lock.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import faust
from faust.assignor import PartitionAssignor
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata
from faust.types import ConsumerT

from arena import metrics
from arena.config import ArenaSettings
from arena.hashing import content_hash
from arena.llm.core import CALLER, Caller
from arena.topics import topic
from arena.versions import MAIN, wire
from lake.store import ClaimCheck
from streams.dedupe import SeenKeys, addressed_to, is_replay, replay_id
from streams.runtime import (
    Context,
    Emit,
    In,
    StageDef,
    dead_letter_key,
    decode_input_async,
    encode,
    encode_claimed,
    ledger_emit,
    place_dead_letters,
    run_handler,
)
from streams.usage import UsageReporter
from streams.watchdog import exact_offset_marks
from streams.watchdog import install as install_watchdog

log = logging.getLogger("arena.stage")

USAGE_EVERY_S = 5.0
"""How often a stage worker reports its LLM usage to ``llm.usage``."""


class StableAssignor(PartitionAssignor):
    """Faust's assignor made a function of the group's members alone: no stickiness, members in order.

    A replica restarted under its static member id rejoins the embedded broker's group without a
    rebalance; when it was the group leader, it computes the whole assignment again, but only it
    receives the result, and the other replicas keep theirs. Faust's assignor depends on the
    previous assignments and on the order of the (random) member ids, so that second computation
    could give the restarted replica the partitions of a live one and nobody the rest. Here the
    members are ordered by their canonical URL (one per static member id, see ``make_app``) and
    previous assignments are ignored, so the same members always get the same partitions.
    """

    @classmethod
    def _get_client_metadata(cls, metadata: Any) -> ClientMetadata:
        client = super()._get_client_metadata(metadata)
        client.assignment = ClientAssignment(actives={}, standbys={})
        return client

    def _perform_assignment(self, cluster: Any, member_metadata: Any) -> Any:
        urls = {member: self._get_client_metadata(data).url for member, data in member_metadata.items()}
        ordered = sorted(member_metadata, key=lambda member: (urls[member], member))
        return super()._perform_assignment(cluster, {member: member_metadata[member] for member in ordered})


class ArenaApp(faust.App):
    """A Faust app whose consumer seeks to exact offsets after every assignment.

    Installed when the consumer is created, so that it covers the first rebalances of every
    worker (stages and the lake sink alike): see ``streams.watchdog.exact_offset_marks``.
    """

    def _new_consumer(self) -> ConsumerT:
        consumer = super()._new_consumer()
        exact_offset_marks(consumer)
        return consumer


def make_app(
    group: str,
    settings: ArenaSettings,
    bootstrap: str,
    *,
    exactly_once: bool,
    instance_id: str | None = None,
) -> faust.App:
    """A Faust app with no web server, no topic auto-creation and fast commits.

    ``instance_id`` makes the worker a static group member (KIP-345): a
    restarted worker takes over its predecessor's partitions at once instead
    of waiting for the dead member's session to expire. The embedded broker
    needs this: it never evicts a member killed with SIGKILL.
    """
    datadir = Path(settings.home) / "faust" / group
    datadir.mkdir(parents=True, exist_ok=True)
    app = ArenaApp(
        group,
        broker=[f"kafka://{host}" for host in bootstrap.split(",")],
        processing_guarantee="exactly_once" if exactly_once else "at_least_once",
        web_enabled=False,
        store="memory://",
        autodiscover=False,
        datadir=str(datadir),
        # Every topic is pre-created by `arena topics create` with its exact
        # partition count; Faust must not declare or alter them.
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=settings.commit_interval_s,
        broker_commit_every=200,
        producer_acks=-1,
        stream_wait_empty=False,
        consumer_group_instance_id=instance_id,
        # One URL per static member: the assignor orders the members by it (see StableAssignor).
        canonical_url=f"http://{instance_id or socket.gethostname()}:6066",
        PartitionAssignor=StableAssignor,
        broker_session_timeout=30.0,
    )
    install_watchdog(app)  # replicas hand partitions over while they run: see streams.watchdog
    return app


def raw_topic(app: faust.App, *names: str) -> Any:
    """A Faust topic whose keys and values arrive as bytes (we validate ourselves)."""
    return app.topic(*names, key_serializer="raw", value_serializer="raw")


def record_time(message: Any) -> datetime | None:
    """The log time of a Faust message (seconds since the epoch), as an aware datetime."""
    stamp = getattr(message, "timestamp", None)
    return datetime.fromtimestamp(stamp, UTC) if stamp else None


def source_key(key: bytes | None, value: bytes | None) -> str:
    if key:
        return key.decode("utf-8", "replace")
    return content_hash(value or b"")


async def send(
    app: faust.App,
    emit: Emit,
    *,
    stage: str,
    version: str,
    event: Any,
    claims: ClaimCheck | None = None,
    data_version: str = MAIN,
) -> None:
    """Send one output, inside the input partition's transaction when exactly-once.

    With ``claims``, a value too large for the broker goes to the lake and the record carries a claim.
    ``version`` is the stage's code version; ``data_version`` the data version it runs in: the record
    goes to that version's copy of its topic (``arena.versions.wire``).
    """
    if claims is None:
        key, value, headers = encode(emit, stage=stage, stage_version=version, version=data_version)
    else:
        key, value, headers = await encode_claimed(
            emit, stage=stage, stage_version=version, claims=claims, version=data_version
        )
    target = wire(emit.topic, data_version)
    if app.in_transaction:
        message = event.message
        group = app.assignor.group_for_topic(message.topic)
        tid = f"{app.conf.id}-{group}-{message.partition}"
        # Not awaited: commit_transaction flushes, and a failed send aborts it.
        await app.producer.send(target, key, value, None, None, headers, transactional_id=tid)
    else:
        fut = await app.producer.send(target, key, value, None, None, headers)
        await fut


class CommitGate:
    """Keeps an event's outputs and its offset on the same side of every commit."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self._gated: object | None = None

    def install(self, consumer: Any) -> None:
        """Make ``consumer``'s commits (timer, every-N, rebalance, error) wait on the gate."""
        if self._gated is consumer:
            return  # the agent restarted; the consumer is already gated
        commit: Callable[..., Awaitable[bool]] = consumer.force_commit

        async def gated_commit(*args: Any, **kwargs: Any) -> bool:
            async with self.lock:
                return await commit(*args, **kwargs)

        # Faust has no hook around its commit; wrapping the one method every
        # commit path goes through (Consumer.commit -> force_commit) is the
        # narrowest change.
        consumer.force_commit = gated_commit
        self._gated = consumer


def commit_released_prefix(consumer: Any) -> None:
    """Make ``consumer`` commit, per partition, the offset after the highest acked event.

    ``OrderedRunner`` acks a partition's events in offset order, so every data record below the
    highest acked offset was acked; the offsets in between that were never delivered are
    transaction markers and aborted records. Faust instead commits only a run of consecutive
    acked offsets, bridging the offsets it skipped with gaps it records while reading, and misses
    some: after the record at offset 0 (``if gap > 1 and r_offset``, 0 is false), and after a seek
    to a committed offset followed by aborted records (a killed upstream's open transaction). Its
    commit offset then stays behind while the partition's transaction still commits the later
    events' outputs: their outputs are committed without their offsets, so a restart handles them
    again (duplicates), and the worker stalls until the watchdog restarts it.
    """
    if getattr(consumer, "_arena_released_prefix", False):
        return

    def new_offset(tp: Any) -> int | None:
        acked = consumer._acked[tp]
        if not acked:
            return None
        top = max(acked)
        acked.clear()
        consumer._acked_index[tp].clear()
        consumer._gap.pop(tp, None)
        return int(top) + 1

    # Faust computes every commit's offsets with this method (Consumer._filter_committable_offsets).
    consumer._new_offset = new_offset
    consumer._arena_released_prefix = True


async def handle_event(
    stage: StageDef[In],
    settings: ArenaSettings,
    event: Any,
    seen: SeenKeys | None = None,
    claims: ClaimCheck | None = None,
) -> list[Emit] | None:
    """Decode and handle one input event: its outputs, or None when ``seen`` says it was handled.

    A claimed value is read from the lake with ``claims`` (see ``streams.runtime.decode_async``).
    Its dead letters name its partition, offset and replay (``streams.runtime.place_dead_letters``).
    """
    emits = await _handle(stage, settings, event, seen, claims)
    if emits is None:
        return None
    message = event.message
    return place_dead_letters(
        emits,
        topic(stage.input).dlq,
        partition=message.partition,
        offset=message.offset,
        replay_of=replay_id(message.headers),
    )


async def _handle(
    stage: StageDef[In],
    settings: ArenaSettings,
    event: Any,
    seen: SeenKeys | None,
    claims: ClaimCheck | None,
) -> list[Emit] | None:
    spec = topic(stage.input)
    message = event.message
    key = source_key(message.key, message.value)
    if (
        seen is not None
        and not is_replay(message.headers)
        and await seen.seen(message.partition, message.offset, key)
    ):
        log.info("%s: %s already handled, skipped", stage.name, key)
        return None
    decoded = await decode_input_async(
        stage,
        message.value,
        source_key=key,
        partition=message.partition,
        offset=message.offset,
        headers=message.headers,
        claims=claims,
    )
    if decoded.dead_letter is not None:
        letter = decoded.dead_letter
        return [Emit(spec.dlq, dead_letter_key(letter), letter, (key,))]
    assert decoded.record is not None
    ctx = Context(stage.name, stage.version, spec, key, settings, decoded.raw, record_time(message))
    return await run_handler(stage, decoded.record, ctx, decoded.raw)


async def release(
    app: faust.App,
    stage: StageDef[In],
    event: Any,
    emits: list[Emit],
    gate: CommitGate,
    claims: ClaimCheck | None = None,
    *,
    duplicate: bool = False,
    not_addressed: bool = False,
    data_version: str = MAIN,
) -> bool:
    """Send ``emits`` and the event's ledger entry, and ack ``event``, under the gate.

    False (nothing sent) when the event is stale. ``duplicate`` and ``not_addressed`` give the
    ledger entry's outcome for an event skipped with no outputs (``streams.runtime.outcome_of``).

    Stale: a rebalance started, or the event was fetched in an earlier consumer generation. Its
    partition's offsets were reset to the committed position, so the event comes again (here or
    at the partition's new owner); sending now would duplicate it.
    """
    async with gate.lock:
        if not is_current(app, event):
            log.info(
                "%s: %s[%d]@%d belongs to consumer generation %d (now %d, rebalancing: %s); not released",
                stage.name,
                event.message.topic,
                event.message.partition,
                event.message.offset,
                event.message.generation_id,
                app.consumer_generation_id,
                app.rebalancing,
            )
            return False
        message = event.message
        key = source_key(message.key, message.value)
        entry = ledger_emit(
            stage.name,
            message.topic,
            message.partition,
            message.offset,
            key,
            emits,
            duplicate=duplicate,
            stored=stage.effect is not None,
            not_addressed=not_addressed,
        )
        for emit in [*emits, entry]:
            await send(
                app,
                emit,
                stage=stage.name,
                version=stage.version,
                event=event,
                claims=claims,
                data_version=data_version,
            )
        event.ack()  # inside the gate; a commit sees both the outputs and the offset, or neither
    metrics.stage_outputs(stage.name, [(emit.topic, emit.value) for emit in emits])
    return True


def is_current(app: faust.App, event: Any) -> bool:
    """The event belongs to the consumer's current generation and no rebalance is under way."""
    return not app.rebalancing and event.message.generation_id == app.consumer_generation_id


async def abort_open_transactions(app: faust.App, gate: CommitGate) -> None:
    """Abort every open transaction of ``app``: a rebalance forgets the acked offsets.

    On a rebalance the consumer drops the acked-but-uncommitted offsets of every partition it had
    (the Kafka client revokes them all, even those it gets back) and restarts each from its
    committed offset, while the outputs of those events already sit in the partition's open
    transaction. Committing that transaction later would publish them a second time when the
    events are handled again, so it is aborted here: the events are handled once more from the
    committed offset, and their outputs are committed once. Faust begins the transactions again
    when it assigns the partitions.
    """
    producer = app.producer
    async with gate.lock:
        for tid, txn_producer in list(getattr(producer, "_transaction_producers", {}).items()):
            manager = getattr(txn_producer, "_txn_manager", None)
            if manager is not None and manager.is_in_transaction():
                await producer.abort_transaction(tid)
                log.info("rebalance: aborted the open transaction %s; its events are handled again", tid)


class OrderedRunner:
    """Handles up to ``concurrency`` events at once; releases each partition's events in offset order.

    Handlers run concurrently (LLM calls of many records in flight), but an event's outputs are
    sent, and the event acked, only after every earlier event of its partition was released: the
    committed offset is always the end of a released prefix, so a crash at any moment replays
    exactly the events whose outputs were not committed (exactly-once keeps holding). A dead
    letter is an ordinary output, so a failing record never stalls the others.

    Events of a consumer generation that ended (a rebalance) are not released: they are fetched
    again from the committed offset. Their handlers are cancelled when partitions are revoked.
    A failure to send (the producer was fenced, the broker is gone) stops every later release and
    is raised by the next ``submit``, which crashes the agent as a failing event did before.
    """

    def __init__(
        self,
        app: faust.App,
        stage: StageDef[In],
        settings: ArenaSettings,
        gate: CommitGate,
        seen: SeenKeys | None,
        concurrency: int,
        caller: Caller,
        data_version: str = MAIN,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.app = app
        self.stage = stage
        self.settings = settings
        self.gate = gate
        self.seen = seen
        self.caller = caller
        self.data_version = data_version
        self.claims = ClaimCheck.from_settings(settings)
        """Large values in and out of the lake (opened on the first one)."""
        self._slots = asyncio.Semaphore(concurrency)
        self._tails: dict[tuple[int, Any], asyncio.Future[None]] = {}
        """Per (generation, partition): the done-future of the last submitted event."""
        self._tasks: dict[asyncio.Task[None], Any] = {}
        """In-flight handlers and the topic-partition of their event."""
        self._failure: BaseException | None = None

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def submit(self, event: Any) -> None:
        """Start handling ``event`` once a slot is free."""
        self._raise_failure()
        await self._slots.acquire()
        self._raise_failure()
        message = event.message
        chain = (message.generation_id, message.tp)
        previous = self._tails.get(chain)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tails[chain] = done
        task = asyncio.create_task(self._run(event, previous), context=self._context())
        self._tasks[task] = message.tp
        # A callback, not a ``finally`` in ``_run``: a task cancelled before its first step (a
        # rebalance right after the submit) never runs its coroutine, and its slot and its
        # successors would wait for it forever.
        task.add_done_callback(functools.partial(self._finished, done=done, chain=chain))

    def _finished(self, task: asyncio.Task[None], *, done: asyncio.Future[None], chain: Any) -> None:
        """An event's handler ended (released, dropped, failed or cancelled): free its slot and successor."""
        self._tasks.pop(task, None)
        if not done.done():
            done.set_result(None)
        if self._tails.get(chain) is done:
            del self._tails[chain]
        self._slots.release()

    def _context(self) -> contextvars.Context:
        context = contextvars.copy_context()
        context.run(CALLER.set, self.caller)
        return context

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise self._failure

    async def _run(self, event: Any, previous: asyncio.Future[None] | None) -> None:
        try:
            message = event.message
            # A replay of another stage's dead letter: that stage alone runs it; this one only
            # accounts for the record in the ledger, in its turn.
            addressed = addressed_to(self.stage.name, message.headers)
            emits: list[Emit] | None = []
            if addressed:
                with metrics.stage_record(self.stage.name):
                    emits = await handle_event(self.stage, self.settings, event, self.seen, self.claims)
            if previous is not None:
                await asyncio.shield(previous)  # a cancelled successor must not cancel its predecessor
            if self._failure is not None:
                return
            duplicate = emits is None  # handled before (dedupe): acked in its turn, with no outputs
            emits = emits or []
            key = source_key(message.key, message.value)
            if (
                addressed
                and self.seen is not None
                and not is_replay(message.headers)
                and self.seen.handled(message.partition, key)
            ):
                log.info("%s: %s was handled while this copy was in flight; dropped", self.stage.name, key)
                emits, duplicate = [], True
            if not addressed:
                log.info("%s: %s is a replay for another stage; skipped", self.stage.name, key)
            released = await release(
                self.app,
                self.stage,
                event,
                emits,
                self.gate,
                self.claims,
                duplicate=duplicate,
                not_addressed=not addressed,
                data_version=self.data_version,
            )
            # A partition not read yet (its records so far were replays) is read on its next
            # record, this one's key included.
            if released and self.seen is not None and self.seen.loaded(message.partition):
                self.seen.add(message.partition, key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handler crashes are dead letters already; this is a send failure
            log.exception("%s: releasing an event failed; stopping the stage", self.stage.name)
            self._failure = exc

    def cancel(self, partitions: set[Any]) -> int:
        """Cancel the handlers of events from ``partitions`` (revoked); returns how many."""
        doomed = [task for task, tp in self._tasks.items() if tp in partitions]
        for task in doomed:
            task.cancel()
        return len(doomed)

    async def drain(self) -> None:
        """Wait for every in-flight event (used when the stream ends)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._raise_failure()


def attach_stage(
    app: faust.App, stage: StageDef[In], settings: ArenaSettings, *, priority: int = 0, version: str = MAIN
) -> None:
    """Register the Faust agent that runs ``stage`` on its input topic.

    ``priority`` is the stage's position in the pipeline (``app.registry.stage_priorities``): LLM
    calls made for its records carry it (``arena.llm.core.CALLER``) to the endpoint's admission.
    ``version``: the data version it runs in; it reads and writes that version's topics only
    (``arena.versions``), so its dedupe, ledger and usage are the version's own.
    """

    bootstrap = ",".join(f"{url.host}:{url.port}" for url in app.conf.broker)
    source = wire(stage.input, version)
    seen = SeenKeys(bootstrap, source) if stage.dedupe else None
    gate = CommitGate()
    runners: list[OrderedRunner] = []

    async def on_revoked(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        revoked: set[Any] = args[0] if args else set()  # Faust sends the revoked TPs
        if app.in_transaction:
            await abort_open_transactions(app, gate)
        for runner in runners:
            cancelled = runner.cancel(revoked)
            if cancelled:
                log.info(
                    "%s: partitions revoked, %d in-flight record(s) left for the next owner",
                    stage.name,
                    cancelled,
                )
        if seen is not None:
            seen.forget(tp.partition for tp in revoked if tp.topic == source)

    app.on_partitions_revoked.connect(on_revoked)  # type: ignore[arg-type]  # mode types receivers narrowly

    reporter = UsageReporter(settings, stage.name, bootstrap, version=version)

    async def report_usage() -> None:
        await reporter.report()

    async def close_usage(sender: Any, **kwargs: Any) -> None:
        await reporter.close()

    app.timer(interval=USAGE_EVERY_S, name=f"{stage.name}-llm-usage")(report_usage)
    app.on_before_shutdown.connect(close_usage)  # type: ignore[arg-type]  # mode types receivers narrowly

    async def agent(stream: Any) -> None:
        gate.install(app.consumer)
        commit_released_prefix(app.consumer)
        runner = OrderedRunner(
            app,
            stage,
            settings,
            gate,
            seen,
            settings.concurrency_of(stage.name),
            Caller(stage.name, priority),
            version,
        )
        runners[:] = [runner]
        # noack: an event is acked by ``release``, in offset order, not when the next one is fetched.
        async for event in stream.noack().events():
            await runner.submit(event)
        await runner.drain()

    app.agent(raw_topic(app, source), name=stage.name)(agent)

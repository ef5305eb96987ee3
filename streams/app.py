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
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import faust

from arena.config import ArenaSettings
from arena.hashing import content_hash
from arena.topics import topic
from streams.dedupe import SeenKeys
from streams.runtime import Context, Emit, In, StageDef, dead_letter_key, decode_input, encode, run_handler

log = logging.getLogger("arena.stage")


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
    return faust.App(
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
        broker_session_timeout=30.0,
    )


def raw_topic(app: faust.App, *names: str) -> Any:
    """A Faust topic whose keys and values arrive as bytes (we validate ourselves)."""
    return app.topic(*names, key_serializer="raw", value_serializer="raw")


def source_key(key: bytes | None, value: bytes | None) -> str:
    if key:
        return key.decode("utf-8", "replace")
    return content_hash(value or b"")


async def send(app: faust.App, emit: Emit, *, stage: str, version: str, event: Any) -> None:
    """Send one output, inside the input partition's transaction when exactly-once."""
    key, value, headers = encode(emit, stage=stage, stage_version=version)
    if app.in_transaction:
        message = event.message
        group = app.assignor.group_for_topic(message.topic)
        tid = f"{app.conf.id}-{group}-{message.partition}"
        # Not awaited: commit_transaction flushes, and a failed send aborts it.
        await app.producer.send(emit.topic, key, value, None, None, headers, transactional_id=tid)
    else:
        fut = await app.producer.send(emit.topic, key, value, None, None, headers)
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


async def process_event(
    app: faust.App,
    stage: StageDef[In],
    settings: ArenaSettings,
    event: Any,
    gate: CommitGate,
    seen: SeenKeys | None = None,
) -> None:
    """Decode, handle, and send the outputs of one input event."""
    spec = topic(stage.input)
    message = event.message
    key = source_key(message.key, message.value)
    if seen is not None and await seen.seen(message.partition, message.offset, key):
        log.info("%s: %s already handled, skipped", stage.name, key)
        return
    decoded = decode_input(
        stage,
        message.value,
        source_key=key,
        partition=message.partition,
        offset=message.offset,
    )
    if decoded.dead_letter is not None:
        letter = decoded.dead_letter
        emits = [Emit(spec.dlq, dead_letter_key(letter), letter, (key,))]
    else:
        assert decoded.record is not None
        ctx = Context(stage.name, stage.version, spec, key, settings, message.value or b"")
        emits = await run_handler(stage, decoded.record, ctx, message.value or b"")
    async with gate.lock:
        for emit in emits:
            await send(app, emit, stage=stage.name, version=stage.version, event=event)
        event.ack()  # inside the gate; Faust's own ack after this is a no-op
    if seen is not None:
        seen.add(message.partition, key)


def attach_stage(app: faust.App, stage: StageDef[In], settings: ArenaSettings) -> None:
    """Register the Faust agent that runs ``stage`` on its input topic."""

    bootstrap = ",".join(f"{url.host}:{url.port}" for url in app.conf.broker)
    seen = SeenKeys(bootstrap, stage.input) if stage.dedupe else None
    if seen is not None:
        keys = seen

        def forget_revoked(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
            revoked: set[Any] = args[0] if args else set()  # Faust sends the revoked TPs
            keys.forget(tp.partition for tp in revoked if tp.topic == stage.input)

        app.on_partitions_revoked.connect(forget_revoked)  # type: ignore[arg-type]  # mode types receivers narrowly

    gate = CommitGate()

    async def agent(stream: Any) -> None:
        gate.install(app.consumer)
        async for event in stream.events():
            await process_event(app, stage, settings, event, gate, seen)

    app.agent(raw_topic(app, stage.input), name=stage.name)(agent)

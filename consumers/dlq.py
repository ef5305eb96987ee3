"""Dead letters: list them by topic and reason, and replay them once their cause is fixed.

Every stage sends input it could not process to ``<topic>.dlq`` (value: ``DeadLetter``, with the
exact raw bytes). ``list_dead_letters`` reads every declared ``.dlq`` topic from the beginning to
its end offset with a throwaway consumer (``assign()``, no group, nothing committed).

``replay_dead_letters`` re-publishes each matching letter's raw value, with its source key, to its
source topic, exactly once. The ledger is a catalog table (``lake.catalog.DlqReplay``) keyed by the
dead letter's key, not a marker topic: a claim is one insert-or-ignore, an atomic compare-and-set
across processes and hosts (SQLite or PostgreSQL), so of two concurrent replays exactly one
publishes a letter; a marker topic has no such claim without transactional fencing, and the
ledger is also what `arena dlq` and the dashboard show as ``replayed``. Per letter:

1. claim the key (status ``claimed``, a random token);
2. publish the raw value with ``acks=all`` and idempotence, headers ``arena-replay-of: <key>``
   (so a deduplicating stage does not skip a key it already dead-lettered) and lineage;
3. mark the row ``replayed`` with the partition and offset it landed at.

A failed send releases the claim (a later replay retries). A claim left by an invocation that
died between 1 and 3 is *stale* after ``CLAIM_LEASE_S``: the next replay looks for the record in
the source topic (its ``arena-replay-of`` header, from the claim time on); found, the row is marked
replayed and nothing is sent; not found, the claim is taken over (compare-and-set on the token)
and the letter published.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord
from pydantic import BaseModel, Field, ValidationError

from arena.config import ArenaSettings
from arena.records.common import DeadLetter, Lineage
from arena.topics import TOPICS, TopicSpec
from lake.catalog import Catalog, DlqReplay
from lake.store import ClaimCheck, ClaimError, open_claim_async
from streams import read_committed
from streams.dedupe import REPLAY_HEADER

log = logging.getLogger("arena.dlq")

REPLAY_STAGE = "dlq-replay"
REPLAY_VERSION = "1"
CLAIM_LEASE_S = 300.0
"""A claim older than this whose row is not ``replayed`` belongs to an invocation that died."""
READ_IDLE_S = 5.0
"""Stop reading a partition that yields nothing for this long before its end offset."""


class DlqError(ValueError):
    """A mistake in what was asked (an unknown topic); the message says how to fix it."""


class DeadLetterRow(BaseModel):
    """One dead letter as `arena dlq` and the dashboard list it."""

    dlq_topic: Annotated[str, Field(description="The .dlq topic the letter is in, e.g. 'tools.raw.dlq'.")]
    source_topic: Annotated[
        str, Field(description="Topic the failed record was read from (replays go there).")
    ]
    partition: Annotated[int, Field(description="Partition of the letter in the .dlq topic.")]
    offset: Annotated[int, Field(description="Offset of the letter in the .dlq topic.")]
    key: Annotated[str, Field(description="The letter's key (hash of topic, raw value, kind and reason).")]
    source_key: Annotated[str | None, Field(description="Key of the failed record, if it had one.")] = None
    stage: Annotated[str, Field(description="Stage (or publisher) that gave up on the record.")]
    kind: Annotated[str, Field(description="parse_error, schema_violation, crash or llm_invalid_output.")]
    reason: Annotated[str, Field(description="Why, in words (e.g. the validation error).")]
    at: Annotated[datetime, Field(description="When the stage gave up (UTC).")]
    replayed: Annotated[
        bool, Field(description="The replay ledger says this letter was re-published to its source topic.")
    ] = False
    preview: Annotated[str, Field(description="The first 200 characters of the raw value.")] = ""


class ReplayFailure(BaseModel):
    """A dead letter `arena dlq replay` could not re-publish."""

    key: Annotated[str, Field(description="The dead letter's key.")]
    reason: Annotated[str, Field(description="Why it was not re-published (it stays unreplayed).")]


class ReplayReport(BaseModel):
    """What one `arena dlq replay` did."""

    source_topic: Annotated[str, Field(description="Topic the letters were re-published to.")]
    matched: Annotated[int, Field(description="Distinct dead letters that matched the topic and reason.")]
    replayed: Annotated[int, Field(description="Letters re-published by this invocation.")]
    skipped_already_replayed: Annotated[
        int, Field(description="Letters the ledger says were replayed before (nothing sent).")
    ]
    in_progress: Annotated[
        int, Field(description="Letters another invocation is replaying right now (nothing sent).")
    ] = 0
    failed: Annotated[
        list[ReplayFailure], Field(description="Letters that could not be re-published, with why.")
    ] = []
    replayed_keys: Annotated[list[str], Field(description="Keys of the letters re-published now.")] = []


# -- reading -------------------------------------------------------------


def dlq_topics(topic: str | None = None) -> list[TopicSpec]:
    """The declared .dlq topics; with ``topic`` (a source topic or a .dlq name), just its one."""
    declared = [spec for spec in TOPICS.values() if spec.name.endswith(".dlq") and spec.side_of]
    if topic is None:
        return declared
    for spec in declared:
        if topic in (spec.name, spec.side_of):
            return [spec]
    raise DlqError(
        f"no dead-letter topic for {topic!r}; give a stage topic or its .dlq name, e.g. "
        f"{', '.join(s.side_of or s.name for s in declared[:4])} (`arena topics list` shows them all)"
    )


async def _read_topics(bootstrap: str, specs: Sequence[TopicSpec]) -> list[ConsumerRecord[bytes, bytes]]:
    """Every committed record of ``specs`` from the beginning to the end offsets at call time."""
    read_committed.install()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        max_partition_fetch_bytes=8 * 1024 * 1024,
    )
    await consumer.start()
    try:
        parts = [TopicPartition(s.name, p) for s in specs for p in range(s.partitions)]
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        await consumer.seek_to_beginning(*parts)
        out: list[ConsumerRecord[bytes, bytes]] = []
        pending = {tp for tp in parts if ends[tp] > 0}
        for tp in list(pending):
            if await consumer.position(tp) >= ends[tp]:
                pending.discard(tp)
        idle_since = asyncio.get_running_loop().time()
        while pending:
            batch = await consumer.getmany(*pending, timeout_ms=500, max_records=1000)
            now = asyncio.get_running_loop().time()
            if any(batch.values()):
                idle_since = now
            for tp, records in batch.items():
                out.extend(r for r in records if r.offset < ends[tp])
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
            if pending and now - idle_since > READ_IDLE_S:
                log.warning("dlq: gave up reading %s before its end offset", sorted(map(str, pending)))
                break
        return out
    finally:
        await consumer.stop()


async def _letter(record: ConsumerRecord[bytes, bytes], claims: ClaimCheck) -> DeadLetter | None:
    """The dead letter a .dlq record holds (a large one is a claim to the lake); None if unreadable."""
    try:
        value = await open_claim_async(record.value, list(record.headers or ()), claims)
    except ClaimError as exc:
        log.warning("%s[%d]@%d: %s", record.topic, record.partition, record.offset, exc)
        return None
    try:
        return DeadLetter.model_validate_json(value)
    except ValidationError as exc:
        log.warning("%s[%d]@%d is not a DeadLetter: %s", record.topic, record.partition, record.offset, exc)
        return None


def _matches(letter: DeadLetter, reason: str | None) -> bool:
    if reason is None:
        return True
    wanted = reason.lower()
    return letter.kind.value == wanted or wanted in letter.reason.lower()


@dataclass(frozen=True)
class _Found:
    row: DeadLetterRow
    letter: DeadLetter


async def _find(bootstrap: str, topic: str | None, reason: str | None, claims: ClaimCheck) -> list[_Found]:
    records = await _read_topics(bootstrap, dlq_topics(topic))
    found: list[_Found] = []
    for record in records:
        letter = await _letter(record, claims)
        if letter is None or not _matches(letter, reason):
            continue
        row = DeadLetterRow(
            dlq_topic=record.topic,
            source_topic=letter.topic,
            partition=record.partition,
            offset=record.offset,
            key=(record.key or b"").decode("utf-8", "replace"),
            source_key=letter.source_key,
            stage=letter.stage,
            kind=letter.kind.value,
            reason=letter.reason,
            at=letter.at,
            preview=letter.payload_text[:200],
        )
        found.append(_Found(row, letter))
    return sorted(found, key=lambda f: (f.row.dlq_topic, f.row.partition, f.row.offset))


async def list_dead_letters(
    bootstrap: str,
    *,
    topic: str | None = None,
    reason: str | None = None,
    settings: ArenaSettings | None = None,
) -> list[DeadLetterRow]:
    """Every dead letter (of ``topic``: a stage topic or its .dlq name), oldest first per topic.

    ``reason`` keeps letters whose kind equals it or whose reason contains it (case-insensitive).
    ``replayed`` comes from the replay ledger in ``settings``' catalog (default: the
    environment's settings, as `arena` uses them).
    """
    cfg = settings if settings is not None else ArenaSettings()
    found = await _find(bootstrap, topic, reason, ClaimCheck.from_settings(cfg))
    ledger = await asyncio.to_thread(_ledger, cfg, [f.row.key for f in found])
    return [
        f.row.model_copy(
            update={"replayed": (e := ledger.get(f.row.key)) is not None and e.status == "replayed"}
        )
        for f in found
    ]


def _ledger(settings: ArenaSettings, keys: list[str]) -> dict[str, DlqReplay]:
    catalog = Catalog(settings.catalog)
    try:
        return catalog.replays(sorted(set(keys)))
    finally:
        catalog.dispose()


# -- replay --------------------------------------------------------------


def _headers(key: str) -> list[tuple[str, bytes]]:
    lineage = Lineage(stage=REPLAY_STAGE, stage_version=REPLAY_VERSION)
    return [*lineage.to_headers(), (REPLAY_HEADER, key.encode())]


async def _already_in_source(bootstrap: str, entry: DlqReplay) -> tuple[int, int] | None:
    """Where a stale claim's record landed in its source topic, if it did (header search from claim time)."""
    spec = TOPICS.get(entry.source_topic)
    if spec is None:
        return None
    since_ms = int((entry.claimed_at - timedelta(seconds=5)).timestamp() * 1000)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(spec.name, p) for p in range(spec.partitions)]
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        starts = await consumer.offsets_for_times(dict.fromkeys(parts, since_ms))
        wanted = entry.dead_letter_key.encode()
        for tp in parts:
            start = starts.get(tp)
            if start is None:
                continue
            consumer.seek(tp, start.offset)
            while await consumer.position(tp) < ends[tp]:
                batch = await consumer.getmany(tp, timeout_ms=1000, max_records=1000)
                if not batch.get(tp):
                    break
                for record in batch[tp]:
                    if (REPLAY_HEADER, wanted) in list(record.headers or ()):
                        return record.partition, record.offset
        return None
    finally:
        await consumer.stop()


def _raw(letter: DeadLetter) -> bytes:
    try:
        return base64.b64decode(letter.payload_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("payload_b64 is not base64; the raw value is lost") from None


async def _claim(catalog: Catalog, bootstrap: str, found: _Found, token: str, report: ReplayReport) -> bool:
    """True when this invocation holds the letter's claim and must publish it."""
    row = found.row
    claimed = await asyncio.to_thread(
        catalog.claim_replay,
        row.key,
        dlq_topic=row.dlq_topic,
        source_topic=row.source_topic,
        source_key=row.source_key,
        claim=token,
    )
    if claimed:
        return True
    entry = (await asyncio.to_thread(catalog.replays, [row.key]))[row.key]
    if entry.status == "replayed":
        report.skipped_already_replayed += 1
        return False
    if datetime.now(UTC) - entry.claimed_at < timedelta(seconds=CLAIM_LEASE_S):
        report.in_progress += 1
        return False
    landed = await _already_in_source(bootstrap, entry)
    if landed is not None:  # the dead invocation published it; only its ledger update was lost
        await asyncio.to_thread(
            catalog.finish_replay, row.key, claim=entry.claim, partition=landed[0], offset=landed[1]
        )
        report.skipped_already_replayed += 1
        return False
    if await asyncio.to_thread(catalog.take_over_replay, row.key, stale_claim=entry.claim, claim=token):
        return True
    report.in_progress += 1  # another invocation took it over first
    return False


async def replay_dead_letters(
    settings: ArenaSettings, bootstrap: str, topic: str, *, reason: str | None = None
) -> ReplayReport:
    """Re-publish every matching dead letter of ``topic`` to its source topic, exactly once.

    ``topic`` is a stage topic or its .dlq name; ``reason`` filters like ``list_dead_letters``.
    Letters with the same key (the same raw value failing the same way twice) are one letter.
    """
    spec = dlq_topics(topic)[0]
    claims = ClaimCheck.from_settings(settings)
    found = {f.row.key: f for f in await _find(bootstrap, spec.name, reason, claims)}
    report = ReplayReport(
        source_topic=spec.side_of or spec.name, matched=len(found), replayed=0, skipped_already_replayed=0
    )
    if not found:
        return report
    token = uuid.uuid4().hex
    catalog = Catalog(settings.catalog)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=30_000,
    )
    await producer.start()
    try:
        for item in found.values():
            await _replay_one(catalog, producer, claims, bootstrap, item, token, report)
    finally:
        await producer.stop()
        catalog.dispose()
    log.info(
        "dlq replay %s: %d replayed, %d already, %d in progress, %d failed",
        spec.name,
        report.replayed,
        report.skipped_already_replayed,
        report.in_progress,
        len(report.failed),
    )
    return report


async def _replay_one(
    catalog: Catalog,
    producer: AIOKafkaProducer,
    claims: ClaimCheck,
    bootstrap: str,
    item: _Found,
    token: str,
    report: ReplayReport,
) -> None:
    row, letter = item.row, item.letter
    if letter.topic not in TOPICS or TOPICS[letter.topic].side_of is not None:
        report.failed.append(
            ReplayFailure(key=row.key, reason=f"source topic {letter.topic!r} is not a stage topic")
        )
        return
    try:
        raw = _raw(letter)
    except ValueError as exc:
        report.failed.append(ReplayFailure(key=row.key, reason=str(exc)))
        return
    if not await _claim(catalog, bootstrap, item, token, report):
        return
    try:
        key = letter.source_key.encode() if letter.source_key else None
        value, headers = await claims.seal_async(raw, _headers(row.key))  # a large one goes as a claim
        meta = await producer.send_and_wait(letter.topic, value, key=key, headers=headers)
    except Exception as exc:  # the send failed: nothing was published, free the claim for a retry
        await asyncio.to_thread(catalog.release_replay, row.key, claim=token)
        report.failed.append(
            ReplayFailure(key=row.key, reason=f"publish failed: {type(exc).__name__}: {exc}")
        )
        return
    await asyncio.to_thread(
        catalog.finish_replay, row.key, claim=token, partition=meta.partition, offset=meta.offset
    )
    report.replayed += 1
    report.replayed_keys.append(row.key)

"""Dead letters: list them with their history, and replay each to the stage that failed, once fixed.

Every stage sends input it could not process to ``<topic>.dlq`` (value: ``DeadLetter``, with the
exact raw bytes, where the record was read and, for a replayed record, which replay it was).
``list_dead_letters`` reads every declared ``.dlq`` topic from the beginning to its end offset with
a throwaway consumer (``assign()``, no group, nothing committed).

A *failure* is a stage and the record it gave up on (``failure_id``: stage, topic, the record's key
and bytes; not the reason, which a stage may word differently each time it fails). It has one
letter per time it failed (more when a stage dead-letters several calls of one record): the first,
and one per replay that failed again, naming that replay (``DeadLetter.replay_of``).

``replay_dead_letters`` re-publishes each selected failure's raw value, with its source key, to its
source topic, addressed to the stage that failed (``arena-replay-for``, ``streams.dedupe``): the
other stages reading the topic skip it, so a replay re-runs exactly one stage. A letter with no
source offset comes from a publisher (the record never reached the topic): its replay is for every
reader. A failure is replayed once; ``force`` replays one replayed before (after it failed again
and the cause is fixed, say) as its next attempt. The ledger is a catalog table
(``lake.catalog.DlqReplay``) keyed by ``<failure id>#<attempt>``, not a marker topic: a claim is one
insert-or-ignore, an atomic compare-and-set across processes and hosts (SQLite or PostgreSQL), so of
two concurrent replays exactly one publishes an attempt; a marker topic has no such claim without
transactional fencing, and the ledger is also the history `arena dlq` and the dashboard show. Per
attempt:

1. claim ``<failure id>#<attempt>`` (status ``claimed``, a random token);
2. publish the raw value with ``acks=all`` and idempotence, headers ``arena-replay-of: <failure
   id>#<attempt>`` (a deduplicating stage does not skip a key it already dead-lettered, and a letter
   of a second failure names the replay), ``arena-replay-for: <stage>`` and lineage;
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
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord
from pydantic import BaseModel, Field, ValidationError

from arena.config import ArenaSettings
from arena.hashing import content_hash
from arena.records.common import DeadLetter, Lineage
from arena.topics import TOPICS, TopicSpec
from consumers.lag import unsettled
from lake.catalog import Catalog, DlqReplay
from lake.store import ClaimCheck, ClaimError, open_claim_async
from streams import read_committed
from streams.dedupe import REPLAY_HEADER, REPLAY_TARGET_HEADER

log = logging.getLogger("arena.dlq")

REPLAY_STAGE = "dlq-replay"
REPLAY_VERSION = "2"
CLAIM_LEASE_S = 300.0
"""A claim older than this whose row is not ``replayed`` belongs to an invocation that died."""
READ_SETTLE_S = 10.0
"""How long a listing waits for open transactions on the .dlq topics to end before it reads."""
READ_STALL_S = 60.0
"""A read of the .dlq topics whose positions do not move for this long is given up (an error)."""
MIN_KEY_PREFIX = 8
"""A letter may be named by the first this many characters of its key, or more."""


class DlqError(ValueError):
    """A mistake in what was asked (an unknown topic or key); the message says how to fix it."""


class DlqReadStalled(RuntimeError):
    """The broker stopped delivering a .dlq topic before its end offset: no answer beats a partial one."""


class ReplayEvent(BaseModel):
    """One replay of a failure, as the failure's letters show it."""

    replay_id: Annotated[
        str, Field(description="'<failure id>#<attempt>', the re-published record's arena-replay-of header.")
    ]
    attempt: Annotated[
        int, Field(description="1 for the failure's first replay, then one more per forced one.")
    ]
    status: Annotated[str, Field(description="claimed (being published) or replayed (published).")]
    forced: Annotated[bool, Field(description="Replayed with --force: the failure was replayed before.")]
    at: Annotated[datetime, Field(description="When it was published (UTC); when claimed, while claimed.")]
    from_letter: Annotated[str, Field(description="Key of the dead letter the record was replayed from.")]
    target_stage: Annotated[
        str | None, Field(description="The one stage it was for; None: every reader of the topic.")
    ]
    partition: Annotated[int | None, Field(description="Source partition it landed in.")] = None
    offset: Annotated[int | None, Field(description="Source offset it landed at.")] = None
    failed_again_as: Annotated[
        list[str], Field(description="Keys of the letters the stage sent when this replay failed again.")
    ] = []

    def summary(self) -> str:
        """One phrase for `arena dlq`'s history column."""
        head = f"replay #{self.attempt}{' (forced)' if self.forced else ''} {self.at:%Y-%m-%d %H:%M:%S}"
        if self.status != "replayed":
            return f"{head}: being published"
        if self.failed_again_as:
            return f"{head}: failed again as {', '.join(k[:12] for k in self.failed_again_as)}"
        return f"{head}: no dead letter since"


class DeadLetterRow(BaseModel):
    """One dead letter as `arena dlq` and the dashboard list it."""

    dlq_topic: Annotated[str, Field(description="The .dlq topic the letter is in, e.g. 'tools.raw.dlq'.")]
    source_topic: Annotated[
        str, Field(description="Topic the failed record was read from (replays go there).")
    ]
    partition: Annotated[int, Field(description="Partition of the letter in the .dlq topic.")]
    offset: Annotated[int, Field(description="Offset of the letter in the .dlq topic.")]
    key: Annotated[
        str, Field(description="The letter's key (hash of topic, raw value, kind, reason and replay).")
    ]
    source_key: Annotated[str | None, Field(description="Key of the failed record, if it had one.")] = None
    stage: Annotated[str, Field(description="Stage (or publisher) that gave up on the record.")]
    kind: Annotated[str, Field(description="parse_error, schema_violation, crash or llm_invalid_output.")]
    reason: Annotated[str, Field(description="Why, in words (e.g. the validation error).")]
    at: Annotated[datetime, Field(description="When the stage gave up (UTC).")]
    failure_id: Annotated[
        str,
        Field(description="The stage and record that failed: the same for every letter of the failure."),
    ]
    replay_of: Annotated[
        str | None, Field(description="The replay the stage failed on again; None for a first failure.")
    ] = None
    attempt: Annotated[int, Field(description="0 for a first failure; n when replay #n failed again.")] = 0
    replays: Annotated[
        list[ReplayEvent], Field(description="Replays of the failure made from this letter or after it.")
    ] = []
    replayed: Annotated[
        bool, Field(description="One of ``replays`` was published: the record went back to its stage.")
    ] = False
    needs_force: Annotated[
        bool,
        Field(description="The failure was replayed before: only a forced replay (--force) sends it again."),
    ] = False
    history: Annotated[str, Field(description="The letter's history in words, as `arena dlq` shows it.")] = ""
    preview: Annotated[str, Field(description="The first 200 characters of the raw value.")] = ""


class ReplayFailure(BaseModel):
    """A dead letter `arena dlq replay` could not re-publish."""

    key: Annotated[str, Field(description="The dead letter's key.")]
    reason: Annotated[str, Field(description="Why it was not re-published (it stays unreplayed).")]


class ReplayReport(BaseModel):
    """What one `arena dlq replay` did."""

    source_topics: Annotated[
        list[str], Field(description="Topics the matching letters' records came from (replays go there).")
    ]
    matched: Annotated[
        int,
        Field(
            description="Distinct failures (stage and record) among the matching letters: one replay each."
        ),
    ]
    replayed: Annotated[int, Field(description="Failures re-published by this invocation.")]
    skipped_already_replayed: Annotated[
        int, Field(description="Failures replayed before (nothing sent; --force sends them again).")
    ]
    failed_again: Annotated[
        int, Field(description="Of those skipped, failures whose last replay failed again.")
    ] = 0
    in_progress: Annotated[
        int, Field(description="Failures another invocation is replaying right now (nothing sent).")
    ] = 0
    failed: Annotated[
        list[ReplayFailure], Field(description="Letters that could not be re-published, with why.")
    ] = []
    replayed_keys: Annotated[
        list[str], Field(description="Keys of the letters re-published now (one per failure).")
    ] = []
    replay_ids: Annotated[
        list[str], Field(description="The replays made now, '<failure id>#<attempt>', in the same order.")
    ] = []


def failure_id(letter: DeadLetter) -> str:
    """The stage and record a letter is about: the same for every letter of that failure, whatever
    the reason says (a stage may word it differently on each failure)."""
    return content_hash([letter.topic, letter.stage, letter.source_key, letter.payload_b64], prefix="dlf-")


def replay_key(failure: str, attempt: int) -> str:
    """The id of a failure's ``attempt``-th replay (its ledger row and arena-replay-of header)."""
    return f"{failure}#{attempt}"


def attempt_of(replay: str | None, failure: str) -> int:
    """The attempt of ``failure`` a replay id names; 0 when it names none of its attempts (a first
    failure, or a publisher's record replayed to every reader that another stage failed on)."""
    head, _, number = (replay or "").rpartition("#")
    return int(number) if head == failure and number.isdigit() else 0


def target_stage(letter: DeadLetter) -> str | None:
    """The stage a replay of ``letter`` is for: the one that read the record from its topic
    (the letter has a source offset); None for a publisher's letter (every reader gets it)."""
    return letter.stage if letter.offset is not None else None


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
    """Every committed record of ``specs`` from the beginning to the end offsets at call time.

    Reads until every partition's position reaches its end; a read that stops advancing for
    ``READ_STALL_S`` raises ``DlqReadStalled`` rather than answering with part of the letters.
    """
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
        positions = {tp: await consumer.position(tp) for tp in parts if ends[tp] > 0}
        pending = {tp for tp, at in positions.items() if at < ends[tp]}
        clock = asyncio.get_running_loop().time
        moved_at = clock()
        while pending:
            batch = await consumer.getmany(*pending, timeout_ms=500, max_records=1000)
            for tp, records in batch.items():
                out.extend(r for r in records if r.offset < ends[tp])
            for tp in list(pending):
                at = await consumer.position(tp)
                if at != positions[tp]:  # records, markers and aborted batches all move it
                    positions[tp], moved_at = at, clock()
                if at >= ends[tp]:
                    pending.discard(tp)
            if pending and clock() - moved_at > READ_STALL_S:
                raise DlqReadStalled(
                    f"reading {', '.join(sorted(map(str, pending)))} made no progress for {READ_STALL_S:.0f}s "
                    f"before the end offset; nothing is listed rather than part of the letters "
                    f"(is the broker at {bootstrap} overloaded? run the command again)"
                )
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


def _settle(bootstrap: str, topics: list[str]) -> None:
    """Wait (at most ``READ_SETTLE_S``) until no transaction on ``topics`` is open or unseen, so that
    letters a run committed just before are listed; one that stays open is left for the next look."""
    deadline = time.monotonic() + READ_SETTLE_S
    while unsettled(bootstrap, topics) and time.monotonic() < deadline:
        time.sleep(0.2)


async def _find(bootstrap: str, topic: str | None, claims: ClaimCheck) -> list[_Found]:
    """Every readable letter of ``topic``'s .dlq (of all .dlq topics when None), oldest first per topic."""
    specs = dlq_topics(topic)
    await asyncio.to_thread(_settle, bootstrap, [s.name for s in specs])
    records = await _read_topics(bootstrap, specs)
    found: list[_Found] = []
    for record in records:
        letter = await _letter(record, claims)
        if letter is None:
            continue
        failure = failure_id(letter)
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
            failure_id=failure,
            replay_of=letter.replay_of,
            attempt=attempt_of(letter.replay_of, failure),
            preview=letter.payload_text[:200],
        )
        found.append(_Found(row, letter))
    return sorted(found, key=lambda f: (f.row.dlq_topic, f.row.partition, f.row.offset))


def _failed_again(found: Sequence[_Found]) -> dict[str, list[str]]:
    """Keys of the letters each replay failed again as, by replay id."""
    again: dict[str, list[str]] = defaultdict(list)
    for f in found:
        if f.letter.replay_of is not None and f.row.key not in again[f.letter.replay_of]:
            again[f.letter.replay_of].append(f.row.key)
    return again


def _event(attempt: DlqReplay, again: dict[str, list[str]]) -> ReplayEvent:
    return ReplayEvent(
        replay_id=attempt.replay_id,
        attempt=attempt.attempt,
        status=attempt.status,
        forced=attempt.forced,
        at=attempt.replayed_at or attempt.claimed_at,
        from_letter=attempt.dead_letter_key,
        target_stage=attempt.target_stage,
        partition=attempt.partition,
        offset=attempt.offset,
        failed_again_as=again.get(attempt.replay_id, []),
    )


def _history(row: DeadLetterRow) -> str:
    parts = [f"failed on replay #{row.attempt}"] if row.replay_of is not None else []
    parts += [event.summary() for event in row.replays]
    if not row.replays:
        parts.append(
            "not replayed" + (" (failure replayed before: --force sends it again)" if row.needs_force else "")
        )
    return "; ".join(parts)


def _with_history(found: Sequence[_Found], ledger: dict[str, list[DlqReplay]]) -> list[DeadLetterRow]:
    """Each letter's row with the replays of its failure since the letter, and what became of them."""
    again = _failed_again(found)
    rows = []
    for f in found:
        attempts = ledger.get(f.row.failure_id, [])
        later = [_event(a, again) for a in attempts if a.attempt > f.row.attempt]
        row = f.row.model_copy(
            update={
                "replays": later,
                "replayed": any(e.status == "replayed" for e in later),
                "needs_force": any(a.status == "replayed" for a in attempts),
            }
        )
        rows.append(row.model_copy(update={"history": _history(row)}))
    return rows


def _select(
    found: Sequence[_Found], reason: str | None, keys: Sequence[str] | None, where: str
) -> list[_Found]:
    """The letters matching ``reason`` (see ``list_dead_letters``) and, if given, ``keys``.

    A key may be a letter's whole key or its first ``MIN_KEY_PREFIX`` or more characters.
    """
    chosen = [f for f in found if _matches(f.letter, reason)]
    if keys is None:
        return chosen
    picked: dict[tuple[str, int, int], _Found] = {}
    for wanted in keys:
        hits = [f for f in chosen if f.row.key == wanted]
        if not hits and len(wanted) >= MIN_KEY_PREFIX:
            hits = [f for f in chosen if f.row.key.startswith(wanted)]
        distinct = sorted({f.row.key for f in hits})
        if not distinct:
            raise DlqError(
                f"no dead letter with key {wanted!r} in {where}"
                f"{' matching ' + repr(reason) if reason else ''}; give a key `arena dlq` lists "
                f"(or its first {MIN_KEY_PREFIX}+ characters)"
            )
        if len(distinct) > 1:
            raise DlqError(
                f"{wanted!r} starts {len(distinct)} letters' keys ({', '.join(distinct[:4])}); "
                "give more of the key"
            )
        picked.update({(f.row.dlq_topic, f.row.partition, f.row.offset): f for f in hits})
    return sorted(picked.values(), key=lambda f: (f.row.dlq_topic, f.row.partition, f.row.offset))


async def list_dead_letters(
    bootstrap: str,
    *,
    topic: str | None = None,
    reason: str | None = None,
    settings: ArenaSettings | None = None,
) -> list[DeadLetterRow]:
    """Every dead letter (of ``topic``: a stage topic or its .dlq name), oldest first per topic.

    ``reason`` keeps letters whose kind equals it or whose reason contains it (case-insensitive).
    Each row carries its failure's replays since the letter (``replays``, ``history``), from the
    replay ledger in ``settings``' catalog (default: the environment's settings, as `arena` uses
    them); what a replay failed again as is looked up among all letters, whatever ``reason`` says.
    """
    cfg = settings if settings is not None else ArenaSettings()
    found = await _find(bootstrap, topic, ClaimCheck.from_settings(cfg))
    ledger = await asyncio.to_thread(_ledger, cfg, [f.row.failure_id for f in found])
    rows = zip(found, _with_history(found, ledger), strict=True)
    return [row for f, row in rows if _matches(f.letter, reason)]


def _ledger(settings: ArenaSettings, failures: list[str]) -> dict[str, list[DlqReplay]]:
    catalog = Catalog(settings.catalog)
    try:
        return catalog.replays(sorted(set(failures)))
    finally:
        catalog.dispose()


# -- replay --------------------------------------------------------------


def _headers(attempt: DlqReplay) -> list[tuple[str, bytes]]:
    lineage = Lineage(stage=REPLAY_STAGE, stage_version=REPLAY_VERSION)
    headers = [*lineage.to_headers(), (REPLAY_HEADER, attempt.replay_id.encode())]
    if attempt.target_stage is not None:
        headers.append((REPLAY_TARGET_HEADER, attempt.target_stage.encode()))
    return headers


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
        wanted = entry.replay_id.encode()
        for tp in parts:
            start = starts.get(tp)
            if start is None:
                continue
            consumer.seek(tp, start.offset)
            clock = asyncio.get_running_loop().time
            position, moved_at = start.offset, clock()
            while position < ends[tp]:
                batch = await consumer.getmany(tp, timeout_ms=500, max_records=1000)
                for record in batch.get(tp, ()):
                    if (REPLAY_HEADER, wanted) in list(record.headers or ()):
                        return record.partition, record.offset
                if (at := await consumer.position(tp)) != position:
                    position, moved_at = at, clock()
                elif clock() - moved_at > READ_STALL_S:
                    # Not knowing is not "absent": a guess here could publish the record twice.
                    raise DlqReadStalled(f"reading {tp} for replay {entry.replay_id} made no progress")
        return None
    finally:
        await consumer.stop()


def _raw(letter: DeadLetter) -> bytes:
    try:
        return base64.b64decode(letter.payload_b64, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("payload_b64 is not base64; the raw value is lost") from None


def _newest_per_failure(chosen: Sequence[_Found]) -> dict[str, _Found]:
    """The distinct failures of ``chosen``, each with its newest letter (they all hold the same record)."""
    newest: dict[str, _Found] = {}
    for f in chosen:
        held = newest.get(f.row.failure_id)
        if held is None or (f.row.attempt, f.row.at) > (held.row.attempt, held.row.at):
            newest[f.row.failure_id] = f
    return newest


async def replay_dead_letters(
    settings: ArenaSettings,
    bootstrap: str,
    topic: str | None = None,
    *,
    reason: str | None = None,
    keys: Sequence[str] | None = None,
    force: bool = False,
) -> ReplayReport:
    """Re-publish the record of each matching failure to its source topic, for its stage, exactly once.

    ``topic`` is a stage topic or its .dlq name (None: every .dlq topic, with ``keys``); ``reason``
    filters like ``list_dead_letters``; ``keys`` keeps the letters with these keys (or key
    prefixes, ``MIN_KEY_PREFIX``+ characters). Letters of one failure (the same stage and record,
    ``failure_id``) are one replay. A failure replayed before is skipped unless ``force``, which
    replays it once more as its next attempt.
    """
    if topic is None and not keys:
        raise DlqError("say what to replay: a topic (`arena dlq replay TOPIC`) or letters (`--key KEY`)")
    claims = ClaimCheck.from_settings(settings)
    every = await _find(bootstrap, topic, claims)
    chosen = _select(every, reason, keys, f"{topic}'s dead letters" if topic else "any .dlq topic")
    failures = _newest_per_failure(chosen)
    report = ReplayReport(
        source_topics=sorted({f.letter.topic for f in chosen}),
        matched=len(failures),
        replayed=0,
        skipped_already_replayed=0,
    )
    if not failures:
        return report
    failed_again = set(_failed_again(every))
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
        for item in failures.values():
            try:
                raw = _replayable_raw(item.letter)
            except ValueError as exc:
                report.failed.append(ReplayFailure(key=item.row.key, reason=str(exc)))
                continue
            attempt = await _claim_next(catalog, bootstrap, item, token, force, failed_again, report)
            if attempt is not None:
                await _publish(catalog, producer, claims, item, raw, attempt, report)
    finally:
        await producer.stop()
        catalog.dispose()
    log.info(
        "dlq replay %s: %d replayed, %d already (%d failed again), %d in progress, %d failed",
        ", ".join(report.source_topics),
        report.replayed,
        report.skipped_already_replayed,
        report.failed_again,
        report.in_progress,
        len(report.failed),
    )
    return report


def _attempt(item: _Found, number: int, token: str) -> DlqReplay:
    letter = item.letter
    return DlqReplay(
        replay_id=replay_key(item.row.failure_id, number),
        failure_id=item.row.failure_id,
        attempt=number,
        dead_letter_key=item.row.key,
        dlq_topic=item.row.dlq_topic,
        source_topic=letter.topic,
        source_key=letter.source_key,
        target_stage=target_stage(letter),
        forced=number > 1,
        claim=token,
    )


async def _claim_next(
    catalog: Catalog,
    bootstrap: str,
    item: _Found,
    token: str,
    force: bool,
    failed_again: set[str],
    report: ReplayReport,
) -> DlqReplay | None:
    """The attempt this invocation holds the claim of and must publish; None when there is none."""
    attempts = (await asyncio.to_thread(catalog.replays, [item.row.failure_id])).get(item.row.failure_id, [])
    last = attempts[-1] if attempts else None
    if last is not None and last.status != "replayed":
        return await _resume(catalog, bootstrap, last, token, report)
    if last is not None and not force:
        report.skipped_already_replayed += 1
        report.failed_again += last.replay_id in failed_again
        return None
    attempt = _attempt(item, last.attempt + 1 if last else 1, token)
    if await asyncio.to_thread(catalog.claim_replay, attempt):
        return attempt
    report.in_progress += 1  # another invocation claimed this very attempt first
    return None


async def _resume(
    catalog: Catalog, bootstrap: str, last: DlqReplay, token: str, report: ReplayReport
) -> DlqReplay | None:
    """An attempt claimed but not marked replayed: another invocation's, or a dead one's (stale)."""
    if datetime.now(UTC) - last.claimed_at < timedelta(seconds=CLAIM_LEASE_S):
        report.in_progress += 1
        return None
    landed = await _already_in_source(bootstrap, last)
    if landed is not None:  # the dead invocation published it; only its ledger update was lost
        await asyncio.to_thread(
            catalog.finish_replay, last.replay_id, claim=last.claim, partition=landed[0], offset=landed[1]
        )
        report.skipped_already_replayed += 1
        return None
    if await asyncio.to_thread(catalog.take_over_replay, last.replay_id, stale_claim=last.claim, claim=token):
        return last.model_copy(update={"claim": token})
    report.in_progress += 1  # another invocation took it over first
    return None


async def _publish(
    catalog: Catalog,
    producer: AIOKafkaProducer,
    claims: ClaimCheck,
    item: _Found,
    raw: bytes,
    attempt: DlqReplay,
    report: ReplayReport,
) -> None:
    """Send the claimed attempt's record and mark it replayed; a failed send frees the claim."""
    letter = item.letter
    try:
        key = letter.source_key.encode() if letter.source_key else None
        value, headers = await claims.seal_async(raw, _headers(attempt))  # a large one goes as a claim
        meta = await producer.send_and_wait(letter.topic, value, key=key, headers=headers)
    except Exception as exc:  # the send failed: nothing was published, free the claim for a retry
        await asyncio.to_thread(catalog.release_replay, attempt.replay_id, claim=attempt.claim)
        report.failed.append(
            ReplayFailure(key=item.row.key, reason=f"publish failed: {type(exc).__name__}: {exc}")
        )
        return
    await asyncio.to_thread(
        catalog.finish_replay,
        attempt.replay_id,
        claim=attempt.claim,
        partition=meta.partition,
        offset=meta.offset,
    )
    report.replayed += 1
    report.replayed_keys.append(item.row.key)
    report.replay_ids.append(attempt.replay_id)


def _replayable_raw(letter: DeadLetter) -> bytes:
    """The letter's raw value; ValueError when it cannot go back (no stage topic, value lost)."""
    if letter.topic not in TOPICS or TOPICS[letter.topic].side_of is not None:
        raise ValueError(f"source topic {letter.topic!r} is not a stage topic")
    return _raw(letter)

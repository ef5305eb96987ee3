"""Lake sink: every topic (dlq and rejected included) to Parquet in the lake.

Batches come from Faust's ``take_events``, which acks a batch only after the
loop body returns, so offsets are committed after the Parquet write. The
writer drops keys already in the lake, so a replay or a crash between write
and commit adds no rows. A failing write (S3 down) is retried with backoff,
never skipped: skipping would ack and lose the batch.

A claimed record (its value in the lake, see ``lake.store.ClaimCheck``) is written with its
real value, read back and verified; a claim that is missing or corrupt keeps the small envelope
as the value, marked invalid with the reason (``_error``, and the ``arena-claim-error`` header).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import faust

from arena.config import ArenaSettings
from arena.topics import TOPICS
from lake.catalog import Catalog
from lake.parquet import LakeRow, LakeWriter
from lake.store import CLAIM_ERROR_HEADER, ClaimCheck, ClaimError, open_claim, open_store
from streams.app import raw_topic, source_key

log = logging.getLogger("arena.lake_sink")

GROUP = "arena-lake-sink"
MAX_BACKOFF_S = 30.0


def to_rows(events: list[Any], claims: ClaimCheck | None = None) -> dict[str, list[LakeRow]]:
    """Group a batch of Faust events by topic as lake rows (claimed values read with ``claims``).

    Blocking when a value is claimed: call it in a worker thread from async code.
    """
    rows: dict[str, list[LakeRow]] = defaultdict(list)
    for event in events:
        message = event.message
        headers = {k: (v or b"").decode("utf-8", "replace") for k, v in (message.headers or [])}
        try:
            value = open_claim(message.value, message.headers, claims)
        except ClaimError as exc:
            value = message.value or b""
            headers[CLAIM_ERROR_HEADER] = str(exc)
        rows[message.topic].append(
            LakeRow(
                key=source_key(message.key, message.value),
                topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                timestamp_ms=int(message.timestamp * 1000),
                headers=headers,
                value=value,
            )
        )
    return rows


async def rows_until_done(events: list[Any], claims: ClaimCheck) -> dict[str, list[LakeRow]]:
    """``to_rows`` in a worker thread, retried with backoff while the store cannot be read."""
    delay = 0.5
    while True:
        try:
            return await asyncio.to_thread(to_rows, events, claims)
        except Exception:
            log.exception(
                "reading claimed values of %d records failed; retrying in %.1fs", len(events), delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)


async def write_until_done(writer: LakeWriter, topic: str, rows: list[LakeRow]) -> None:
    delay = 0.5
    while True:
        try:
            result = await asyncio.to_thread(writer.write, topic, rows)
        except Exception:
            log.exception("lake write of %d rows to %s failed; retrying in %.1fs", len(rows), topic, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF_S)
            continue
        log.info(
            "lake %s: %d written, %d duplicates skipped", topic, result.written, result.skipped_duplicates
        )
        return


def attach_lake_sink(app: faust.App, settings: ArenaSettings, topics: Sequence[str] | None = None) -> None:
    """Persist ``topics`` (default: every registry topic, i.e. version main) to the lake."""
    store = open_store(settings)
    writer = LakeWriter(store, Catalog(settings.catalog))
    claims = ClaimCheck(store, settings.claim_threshold_bytes)

    async def sink(stream: Any) -> None:
        async for events in stream.take_events(settings.sink_batch_size, within=settings.sink_flush_s):
            for topic, rows in (await rows_until_done(list(events), claims)).items():
                await write_until_done(writer, topic, rows)

    app.agent(raw_topic(app, *(topics if topics is not None else TOPICS)), name="lake-sink")(sink)

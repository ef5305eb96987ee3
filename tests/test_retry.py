"""Retrying what LanceDB and Kafka call retryable (``arena.retry``), against real LanceDB tables.

A lost commit race is made the way two workers make one: two handles of a table opened at the same
version (``read_consistency_interval=None`` keeps a handle at the version it opened, as a writer is
between its read and its commit); one commits, and lance refuses the other's commit with
``Retryable commit conflict for version N: ... Please retry.``. Schema changes (``add_columns``)
race that way; lance rebases a merge-insert (the tool index's write) by itself and gives up with
``Too many concurrent writers`` after its own retries, which is retryable here too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiokafka.errors
import kafka.errors
import lancedb
import pyarrow as pa
import pytest

from arena.config import ArenaSettings
from arena.records.common import DeadLetter, DeadLetterKind
from arena.records.tools import ToolServer
from arena.retry import RetryPolicy, call_with_retry, is_retryable
from arena.topics import topic
from lake.tool_index import TABLE, ToolIndex
from streams.runtime import Context, Emit, StageDef, run_handler
from streams.tools import tool_index
from tests.test_tool_index import FINANCE, WEATHER

FAST = RetryPolicy(attempts=3, base_s=0.01, max_s=0.05, seed=7)


def _at_its_version(uri: str) -> Any:
    """A handle of the ``tools`` table that stays at the version it opened."""
    return lancedb.connect(uri, read_consistency_interval=None).open_table(TABLE)


def _lost_race(uri: str) -> Any:
    """A handle whose next schema change loses the commit race: another writer committed one first."""
    first, second = _at_its_version(uri), _at_its_version(uri)
    first.add_columns({"rank": "1"})
    return second


def test_a_lost_lance_commit_race_is_retried_on_the_latest_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "lancedb")
    index = ToolIndex(uri)
    index.upsert(WEATHER)
    late = _lost_race(uri)
    conflicts: list[BaseException] = []

    def reopen(exc: BaseException) -> None:
        conflicts.append(exc)
        late.checkout_latest()

    call_with_retry(lambda: late.add_columns({"checked": "2"}), FAST, what="test write", on_retry=reopen)
    (conflict,) = conflicts  # lance's own refusal: "Retryable commit conflict ... Please retry."
    assert isinstance(conflict, RuntimeError) and "Retryable commit conflict" in str(conflict)
    assert {"rank", "checked"} <= set(index.table().schema.names)
    assert index.count() == 3 and index.search("will it rain?", k=1)[0]["tool"] == "get_forecast"


def test_a_non_retryable_lance_error_is_raised_at_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "lancedb")
    ToolIndex(uri).upsert(WEATHER)
    table = _at_its_version(uri)
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        table.add_columns({"broken": "no_such_column + 1"})

    with pytest.raises(Exception, match="no_such_column") as failed:
        call_with_retry(write, FAST, what="test write")
    assert not is_retryable(failed.value) and len(tries) == 1


def test_kafka_errors_are_retried_by_their_retriable_flag() -> None:
    retriable = [kafka.errors.NotLeaderForPartitionError(), aiokafka.errors.KafkaConnectionError()]
    final = [
        kafka.errors.TopicAuthorizationFailedError(),
        aiokafka.errors.RecordTooLargeError(),
        ValueError(),
    ]
    assert all(is_retryable(e) for e in retriable)
    assert not any(is_retryable(e) for e in final)
    assert not is_retryable(RuntimeError("lance error: Commit conflict for version 3: incompatible"))

    tries: list[int] = []

    def leader_moving() -> None:
        tries.append(1)
        raise kafka.errors.NotLeaderForPartitionError()

    with pytest.raises(kafka.errors.NotLeaderForPartitionError):
        call_with_retry(leader_moving, FAST, what="test send")
    assert len(tries) == FAST.attempts  # bounded: the last try's error is raised


def test_backoff_is_bounded_jittered_and_seeded() -> None:
    policy = RetryPolicy(attempts=8, base_s=0.1, max_s=1.0, seed=3)
    delays = policy.delays()
    caps = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert len(delays) == policy.attempts - 1
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    assert delays == policy.delays()  # seeded: the same waits every time
    assert delays != policy.model_copy(update={"seed": 4}).delays()


# --- in a stage: retried before anything is dead-lettered -------------------------------------------


def _context(settings: ArenaSettings, stage: str, record: ToolServer) -> tuple[Context, bytes]:
    raw = record.model_dump_json().encode()
    return Context(stage, "1", topic("tools.servers"), record.server_id, settings, raw=raw), raw


def _lance_stage(write: Callable[[], None]) -> StageDef[ToolServer]:
    """A stage whose handler makes one LanceDB write under the policy, as the tool index does."""

    async def handle(record: ToolServer, ctx: Context) -> Sequence[Emit]:
        await asyncio.to_thread(call_with_retry, write, FAST, what=f"write for {ctx.source_key}")
        return []

    return StageDef(
        "lance-write",
        "tools.servers",
        ToolServer,
        "1",
        handle,
        description="a LanceDB write",
        effect="a LanceDB table",  # its output is the write: no emit is no loss
    )


def _letters(emits: list[Emit]) -> list[DeadLetter]:
    return [e.value for e in emits if isinstance(e.value, DeadLetter)]


def test_a_stage_write_that_loses_the_race_lands_with_no_dead_letter(tmp_path: Path) -> None:
    settings = ArenaSettings(home=tmp_path / "home")
    ToolIndex.from_settings(settings).upsert(WEATHER)
    late = _lost_race(settings.lancedb)
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        if len(tries) > 1:
            late.checkout_latest()  # a retry reads the version that won
        late.add_columns({"checked": "2"})

    ctx, raw = _context(settings, "lance-write", FINANCE)
    assert asyncio.run(run_handler(_lance_stage(write), FINANCE, ctx, raw)) == []
    assert len(tries) == 2 and "checked" in ToolIndex.from_settings(settings).table().schema.names


def test_the_tool_index_stage_dead_letters_a_non_retryable_error_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ArenaSettings(home=tmp_path / "home")
    ctx, raw = _context(settings, "tool-index", WEATHER)
    assert asyncio.run(run_handler(tool_index.STAGE, WEATHER, ctx, raw)) == []  # indexed
    assert ToolIndex.from_settings(settings).count() == 3

    # A `tools` table of another shape (an index written by something else): every write fails alike.
    other = ArenaSettings(home=tmp_path / "other")
    lancedb.connect(other.lancedb).create_table(TABLE, schema=pa.schema([pa.field("id", pa.int64())]))
    ctx, raw = _context(other, "tool-index", WEATHER)
    with caplog.at_level(logging.WARNING, logger="arena.retry"):
        emits = asyncio.run(run_handler(tool_index.STAGE, WEATHER, ctx, raw))
    (letter,) = _letters(emits)
    assert letter.kind == DeadLetterKind.crash and letter.source_key == WEATHER.server_id
    assert emits[0].topic == "tools.servers.dlq"
    assert not [r for r in caplog.records if r.name == "arena.retry"]  # not one retry

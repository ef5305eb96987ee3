"""Parquet layout, schema mapping, validation of values, and the idempotent lake writer."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import BaseModel

from arena.records.common import DeadLetter, DeadLetterKind, Lineage, Rejection
from arena.records.sft import ServerRef, ToolChain
from arena.records.trainer import TrainerMetrics
from lake.catalog import Catalog
from lake.parquet import (
    META_COLUMNS,
    LakeRow,
    LakeWriter,
    _column_kind,
    arrow_schema,
    lake_listing,
    read_topic,
)
from lake.store import LocalStore, ObjectStore, S3Store
from tests.fixtures.s3 import S3Server

DAY1 = int(datetime(2026, 11, 20, 23, 59, tzinfo=UTC).timestamp() * 1000)
DAY2 = int(datetime(2026, 11, 21, 0, 1, tzinfo=UTC).timestamp() * 1000)
FILE_RE = re.compile(r"^topic=chains/date=\d{4}-\d{2}-\d{2}/part-\d+-\d{12}-[0-9a-f]{12}\.parquet$")


def chain(i: int) -> ToolChain:
    server = ServerRef(server_id="s1", name="s1", domain="d", tools=[])
    return ToolChain(chain_id=f"c{i}", server=server, tools=["a", "b"], origin="random_walk", task="t")


def row(
    topic: str,
    key: str,
    value: BaseModel | bytes,
    offset: int,
    *,
    ts: int = DAY1,
    partition: int = 0,
    **h: str,
) -> LakeRow:
    raw = value if isinstance(value, bytes) else value.model_dump_json().encode()
    return LakeRow(
        key=key, topic=topic, partition=partition, offset=offset, timestamp_ms=ts, headers=h, value=raw
    )


# Schema mapping --------------------------------------------------------------
def test_meta_columns_come_first_with_fixed_types() -> None:
    schema = arrow_schema("chains")
    assert tuple(schema.names[: len(META_COLUMNS)]) == META_COLUMNS
    assert schema.field("_key").type == pa.string()
    assert schema.field("_partition").type == pa.int32()
    assert schema.field("_offset").type == pa.int64()
    assert schema.field("_timestamp").type == pa.timestamp("ms", tz="UTC")
    assert schema.field("_headers").type == pa.string()
    assert schema.field("_valid").type == pa.bool_()
    assert schema.field("_error").type == pa.string()
    assert schema.field("_raw").type == pa.string()
    assert schema.names[len(META_COLUMNS) :] == list(ToolChain.model_fields)
    assert schema.metadata[b"arena.topic"] == b"chains"


def test_field_types_follow_the_value_model() -> None:
    servers = arrow_schema("tools.servers")
    assert servers.field("server_id").type == pa.string()
    assert servers.field("format").type == pa.string()  # StrEnum
    assert servers.field("domain_score").type == pa.float64()
    assert servers.field("tools").type == pa.string()  # list of nested models -> JSON
    assert servers.field("tools").metadata[b"encoding"] == b"json"
    assert servers.field("tools").metadata[b"optional"] == b"false"

    raw = arrow_schema("tools.raw")
    assert raw.field("published_at").type == pa.timestamp("us", tz="UTC")
    assert raw.field("context").type == pa.string()

    dlq = arrow_schema("tools.raw.dlq")
    assert dlq.field("partition").type == pa.int64()
    assert dlq.field("partition").nullable
    assert dlq.field("partition").metadata[b"optional"] == b"true"
    assert dlq.field("kind").type == pa.string()

    assert arrow_schema("trainer.metrics").field("step").type == pa.int64()
    seeds = arrow_schema("qa.seeds")
    assert seeds.field("mode").type == pa.string()  # Literal of strings
    assert seeds.field("question").type == pa.string()
    assert arrow_schema("tools.raw.rejected").field("record").type == pa.string()


def test_column_kind_of_annotations() -> None:
    assert _column_kind(bool) == ("bool", False)
    assert _column_kind(int | None) == ("int", True)
    assert _column_kind(int | float) == ("float", False)
    assert _column_kind(str | int) == ("json", False)
    assert _column_kind(list[int] | None) == ("json", True)
    assert _column_kind(dict[str, Any]) == ("json", False)
    assert _column_kind(Literal[1, 2]) == ("int", False)
    assert _column_kind(datetime | None) == ("datetime", True)
    assert _column_kind(DeadLetterKind) == ("enum", False)


def test_unknown_topic_fails_loudly() -> None:
    with pytest.raises(KeyError, match="unknown topic"):
        arrow_schema("no.such.topic")


# Writing ---------------------------------------------------------------------
@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "lake")
    server: S3Server = request.getfixturevalue("s3_server")
    return S3Store(server.new_bucket(), "lake", **server.credentials())


def test_write_is_idempotent_by_key(store: ObjectStore) -> None:
    writer = LakeWriter(store)
    rows = [row("chains", f"k{i}", chain(i), i) for i in range(5)]
    first = writer.write("chains", rows)
    assert (first.written, first.skipped_duplicates, first.invalid) == (5, 0, 0)
    assert len(first.files) == 1 and FILE_RE.match(first.files[0]), first.files

    again = writer.write("chains", rows)
    assert (again.written, again.skipped_duplicates, again.files) == (0, 5, [])

    # A new process (new writer) learns the lake's keys from the files themselves.
    fresh = LakeWriter(store)
    mixed = [*rows[:2], row("chains", "k9", chain(9), 9)]
    result = fresh.write("chains", mixed)
    assert (result.written, result.skipped_duplicates) == (1, 2)

    table = read_topic(store, "chains")
    assert sorted(table.column("_key").to_pylist()) == ["k0", "k1", "k2", "k3", "k4", "k9"]
    assert table.schema.names == arrow_schema("chains").names


def test_duplicates_inside_one_batch_are_dropped(store: ObjectStore) -> None:
    rows = [
        row("chains", "a", chain(1), 1),
        row("chains", "a", chain(2), 2),  # same key, later: dropped
        row("chains", "b", chain(3), 3),
    ]
    result = LakeWriter(store).write("chains", rows)
    assert (result.written, result.skipped_duplicates) == (2, 1)
    table = read_topic(store, "chains").sort_by("_offset")
    assert table.column("chain_id").to_pylist() == ["c1", "c3"]


def test_rows_are_grouped_by_utc_date_and_partition(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    rows = [
        row("chains", "a", chain(1), 7, ts=DAY1, partition=0),
        row("chains", "b", chain(2), 8, ts=DAY2, partition=0),
        row("chains", "c", chain(3), 3, ts=DAY2, partition=2),
        row("chains", "d", chain(4), 1, ts=DAY2, partition=2),
    ]
    result = LakeWriter(store).write("chains", rows)
    assert [re.sub(r"-[0-9a-f]{12}\.parquet$", "", f) for f in result.files] == [
        "topic=chains/date=2026-11-20/part-0-000000000007",
        "topic=chains/date=2026-11-21/part-0-000000000008",
        "topic=chains/date=2026-11-21/part-2-000000000001",
    ]
    assert all(FILE_RE.match(f) for f in result.files)
    last = pq.read_table(store.local_path(result.files[-1]))
    assert last.column("_offset").to_pylist() == [1, 3]  # sorted by offset
    assert last.column("_timestamp").to_pylist()[0] == datetime(2026, 11, 21, 0, 1, tzinfo=UTC)


def test_replayed_batch_gets_the_same_file_name(tmp_path: Path) -> None:
    rows = [row("chains", f"k{i}", chain(i), i) for i in range(3)]
    first = LakeWriter(LocalStore(tmp_path / "one")).write("chains", rows)
    second = LakeWriter(LocalStore(tmp_path / "two")).write("chains", rows)
    assert first.files == second.files


def test_invalid_values_become_invalid_rows_never_errors(store: ObjectStore) -> None:
    good = row("chains", "good", chain(1), 0)
    not_utf8 = row("chains", "bin", b"\xff\xfe{not utf8", 1)
    not_json = row("chains", "text", b"{'chain_id': 1", 2)
    wrong = row("chains", "schema", json.dumps({"chain_id": "x", "tools": []}).encode(), 3)
    extra = row("chains", "extra", json.dumps({**chain(4).model_dump(), "surprise": 1}).encode(), 4)
    result = LakeWriter(store).write("chains", [good, not_utf8, not_json, wrong, extra])
    assert (result.written, result.invalid) == (5, 4)

    by_key = {r["_key"]: r for r in read_topic(store, "chains").to_pylist()}
    assert by_key["good"]["_valid"] and by_key["good"]["_error"] is None and by_key["good"]["_raw"] is None
    assert by_key["good"]["tools"] == '["a","b"]'
    assert by_key["bin"]["_error"].startswith("not UTF-8")
    assert by_key["bin"]["_raw"] == b"\xff\xfe{not utf8".decode("utf-8", "replace")
    assert by_key["text"]["_error"].startswith("invalid JSON")
    assert by_key["text"]["_raw"] == "{'chain_id': 1"
    assert by_key["schema"]["_error"].startswith("schema violation")
    assert "server: Field required" in by_key["schema"]["_error"]
    assert "surprise" in by_key["extra"]["_error"]
    for key in ("bin", "text", "schema", "extra"):
        r = by_key[key]
        assert r["_valid"] is False
        assert all(r[f] is None for f in ToolChain.model_fields)


def test_values_keep_their_types(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    dead = DeadLetter(
        stage="normalize",
        topic="tools.raw",
        partition=None,
        kind=DeadLetterKind.crash,
        reason="boom",
        payload_text="x",
        payload_b64="eA==",
        at=datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    )
    metrics = TrainerMetrics(run_id="r", step=7, metrics={"loss": 0.5})
    LakeWriter(store).write("tools.raw.dlq", [row("tools.raw.dlq", "d1", dead, 0)])
    LakeWriter(store).write("trainer.metrics", [row("trainer.metrics", "m1", metrics, 0)])
    (d,) = read_topic(store, "tools.raw.dlq").to_pylist()
    assert d["kind"] == "crash" and d["partition"] is None and d["offset"] is None
    assert d["at"] == datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    (m,) = read_topic(store, "trainer.metrics").to_pylist()
    assert m["step"] == 7 and json.loads(m["metrics"]) == {"loss": 0.5}


def test_writer_registers_artifacts_and_lineage(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "lake")
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    lineage = Lineage(source_ids=["p1", "p2"], stage="chains", stage_version="3", backend="rules")
    headers = {k: v.decode() for k, v in lineage.to_headers()}
    rows = [
        LakeRow(key="c1", topic="chains", partition=1, offset=10, timestamp_ms=DAY1, headers=headers,
                value=chain(1).model_dump_json().encode()),
        LakeRow(key="c2", topic="chains", partition=1, offset=12, timestamp_ms=DAY1, headers=[("x", b"y")],
                value=chain(2).model_dump_json().encode()),
    ]  # fmt: skip
    writer = LakeWriter(store, catalog)
    result = writer.write("chains", rows)
    (artifact,) = catalog.artifacts("chains")
    assert artifact.path == result.files[0]
    assert (artifact.rows, artifact.partition, artifact.min_offset, artifact.max_offset) == (2, 1, 10, 12)
    assert artifact.bytes == store.size(artifact.path)
    edges = catalog.lineage_of("c1")
    assert sorted(e.parent_key for e in edges) == ["p1", "p2"]
    assert {(e.stage, e.stage_version, e.backend, e.child_topic) for e in edges} == {
        ("chains", "3", "rules", "chains")
    }
    assert catalog.lineage_of("c2") == []
    writer.write("chains", rows)  # replay: nothing new anywhere
    assert len(catalog.artifacts()) == 1


def test_a_sink_killed_between_a_file_and_its_catalog_rows_is_caught_up(tmp_path: Path) -> None:
    """The file is durable, its artifact row and lineage are not: the replay after the kill adds no
    rows, and the writer of the restarted sink registers the file and records the lineage."""
    store = LocalStore(tmp_path / "lake")
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    headers = {
        k: v.decode() for k, v in Lineage(source_ids=["p1"], stage="chains", stage_version="3").to_headers()
    }
    rows = [
        LakeRow(key="c1", topic="chains", partition=2, offset=7, timestamp_ms=DAY1, headers=headers,
                value=chain(1).model_dump_json().encode()),
    ]  # fmt: skip
    (path,) = LakeWriter(store).write("chains", rows).files  # killed before the catalog step
    assert catalog.artifacts("chains") == [] and catalog.lineage_of("c1") == []
    replay = LakeWriter(store, catalog).write("chains", rows)
    assert replay.written == 0 and replay.skipped_duplicates == 1
    (artifact,) = catalog.artifacts("chains")
    assert (artifact.path, artifact.rows, artifact.partition, artifact.min_offset) == (path, 1, 2, 7)
    assert [e.parent_key for e in catalog.lineage_of("c1")] == ["p1"]


def test_headers_accept_kafka_shapes() -> None:
    r = LakeRow(key="k", topic="chains", partition=0, offset=0, timestamp_ms=-1,
                headers=[("a", b"\xffx"), ("b", None)], value=b"{}")  # fmt: skip
    assert r.headers == {"a": "\ufffdx"}
    assert r.date == "1969-12-31"


def test_read_topic_and_listing_of_empty_and_full_lake(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    empty = read_topic(store, "tools.raw.rejected")
    assert empty.num_rows == 0 and empty.schema.names == arrow_schema("tools.raw.rejected").names
    assert lake_listing(store) == []

    rej = Rejection(
        stage="normalize",
        topic="tools.raw",
        source_key="s",
        gate="min_tools",
        reason="2 < 3",
        subject="server",
    )
    writer = LakeWriter(store)
    writer.write("tools.raw.rejected", [row("tools.raw.rejected", "r1", rej, 0)])
    writer.write("chains", [row("chains", "a", chain(1), 0), row("chains", "b", chain(2), 1, ts=DAY2)])
    listing = {item.topic: item for item in lake_listing(store)}
    assert set(listing) == {"chains", "tools.raw.rejected"}
    assert (listing["chains"].files, listing["chains"].rows) == (2, 2)
    assert listing["tools.raw.rejected"].rows == 1
    assert listing["chains"].bytes == sum(store.size(p) for p in store.list("topic=chains/"))


def test_rows_of_another_topic_are_a_programming_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="passed to write"):
        LakeWriter(LocalStore(tmp_path)).write("tasks", [row("chains", "a", chain(1), 0)])

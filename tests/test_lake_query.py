"""SQL over the lake: one DuckDB view per topic, empty topics included, local and S3."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from arena.records.common import Rejection
from arena.records.sft import ServerRef, ToolChain
from arena.topics import TOPICS
from lake.parquet import LakeRow, LakeWriter
from lake.query import LakeQuery, LakeQueryError
from lake.store import LocalStore, ObjectStore, S3Store
from tests.fixtures.s3 import S3Server

TS = int(datetime(2026, 11, 21, 12, tzinfo=UTC).timestamp() * 1000)


def _row(topic: str, key: str, value: bytes, offset: int) -> LakeRow:
    return LakeRow(key=key, topic=topic, partition=0, offset=offset, timestamp_ms=TS, value=value)


def _fill(store: ObjectStore) -> None:
    writer = LakeWriter(store)
    chains = [
        ToolChain(
            chain_id=f"c{i}",
            server=ServerRef(server_id=f"s{i % 2}", name=f"s{i % 2}", domain="d", tools=[]),
            tools=["a"] * (i + 1),
            origin="random_walk",
            task="t",
        )
        for i in range(4)
    ]
    writer.write(
        "chains", [_row("chains", c.chain_id, c.model_dump_json().encode(), i) for i, c in enumerate(chains)]
    )
    writer.write("chains", [_row("chains", "broken", b"not json", 9)])
    rejections = [
        Rejection(stage="normalize", topic="tools.raw", source_key="k", gate=g, reason="r", subject="server")
        for g in ("min_tools", "min_tools", "domain")
    ]
    writer.write(
        "tools.raw.rejected",
        [
            _row("tools.raw.rejected", f"r{i}", r.model_dump_json().encode(), i)
            for i, r in enumerate(rejections)
        ],
    )


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "lake")
    server: S3Server = request.getfixturevalue("s3_server")
    return S3Store(server.new_bucket(), "", **server.credentials())


def test_every_topic_is_a_view_even_when_empty(tmp_path: Path) -> None:
    query = LakeQuery(LocalStore(tmp_path))
    assert query.query("select count(*) as n from chains").to_pylist() == [{"n": 0}]
    con = query.connect()
    try:
        for spec in TOPICS.values():
            assert con.sql(f"select count(*) from {spec.table}").fetchall() == [(0,)]
        columns = [r[0] for r in con.sql("describe tools_raw_rejected").fetchall()]
    finally:
        con.close()
    assert columns[:3] == ["_key", "_partition", "_offset"]
    assert "gate" in columns
    assert "tools_raw_rejected" in query.tables() and "eigen_dialogs_validated" in query.tables()


def test_queries_over_written_topics(store: ObjectStore) -> None:
    _fill(store)
    query = LakeQuery(store)
    assert query.query("select count(*) n, count(*) filter (where _valid) ok from chains").to_pylist() == [
        {"n": 5, "ok": 4}
    ]
    per_server = query.query(
        "select server->>'$.server_id' as server_id, sum(json_array_length(tools)) as calls"
        " from chains where _valid group by 1 order by 1"
    ).to_pylist()
    assert per_server == [{"server_id": "s0", "calls": 4}, {"server_id": "s1", "calls": 6}]
    gates = query.query(
        "select gate, count(*) n from tools_raw_rejected group by gate order by gate"
    ).to_pylist()
    assert gates == [{"gate": "domain", "n": 1}, {"gate": "min_tools", "n": 2}]
    (broken,) = query.query("select _raw, _error from chains where not _valid").to_pylist()
    assert broken["_raw"] == "not json" and broken["_error"].startswith("invalid JSON")
    ts = query.query("select min(_timestamp) t from chains").column("t")[0].as_py()
    assert ts == datetime(2026, 11, 21, 12, tzinfo=UTC)
    assert query.query("select count(*) n from tasks").to_pylist() == [{"n": 0}]


def test_sql_errors_raise_lake_query_error(tmp_path: Path) -> None:
    query = LakeQuery(LocalStore(tmp_path))
    with pytest.raises(LakeQueryError, match="no_such_table"):
        query.query("select * from no_such_table")
    with pytest.raises(LakeQueryError, match="syntax error"):
        query.query("selec 1")


def test_statements_without_results_return_an_empty_table(tmp_path: Path) -> None:
    assert LakeQuery(LocalStore(tmp_path)).query("set threads = 1").num_rows == 0


def test_a_query_registers_the_views_it_names_and_all_when_it_names_none(tmp_path: Path) -> None:
    from lake.query import named_topics

    store = LocalStore(tmp_path / "lake")
    _fill(store)
    sql = 'SELECT c.chain_id, r.gate FROM "Chains" c CROSS JOIN tools_raw_rejected r WHERE c._valid'
    assert [spec.table for spec in named_topics(sql)] == sorted(
        ["chains", "tools_raw_rejected"], key=[s.table for s in TOPICS.values()].index
    )
    query = LakeQuery(store)
    assert len(query.query(sql)) == 4 * 3
    shown = {row["name"] for row in query.query("SHOW TABLES").to_pylist()}
    assert set(query.tables()) <= shown  # it names no view: every view is there

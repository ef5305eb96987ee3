"""`arena ui`'s JSON API on a real broker and a real lake (starlette's TestClient, no browser).

The helpers here (commit a group's offsets, write lake rows, produce a dead letter) are shared with
tests/test_ui_browser.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from starlette.testclient import TestClient

from app.ui import (
    LOOPBACK_HOSTS,
    TOKEN_HEADER,
    EdgeDef,
    LagSampler,
    RateWindow,
    UiError,
    create_app,
    graph_edges,
    graph_view,
    node_depths,
    run_query,
    serve,
    version_groups,
    versions_view,
)
from arena.config import ArenaSettings
from arena.records.common import DeadLetter, DeadLetterKind, LedgerEntry, Outcome
from arena.records.llm import LlmUsage
from arena.records.sft import ServerRef, Task, ToolChain
from arena.records.trainer import TrainerMetrics
from arena.versions import INHERITED_HEADER, MAIN, InputRange, VersionSpec, wire
from consumers.lag import LagRow
from consumers.version_diff import compare
from lake.catalog import Catalog
from lake.parquet import LakeRow, LakeWriter
from lake.store import open_store
from streams.admin import admin_client, ensure_topics
from tests.cli import arena_env, run_arena

pytestmark = pytest.mark.integration

DLQ_SOURCE = "eigen.pilot.metrics"
"""Source topic of the test's dead letters: nothing on the session broker consumes it."""


# --- helpers (also used by the browser test) ------------------------------------------------------


def produce(broker: str, topic: str, n: int, *, partition: int = 0) -> None:
    producer = KafkaProducer(bootstrap_servers=broker)
    try:
        for i in range(n):
            producer.send(topic, f"r-{uuid.uuid4().hex[:6]}-{i}".encode(), partition=partition)
        producer.flush()
    finally:
        producer.close()


def commit(broker: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit offsets for a group without staying in it (a consumer that stopped: paused)."""
    consumer = KafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False)
    try:
        consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()})
    finally:
        consumer.close(autocommit=False)


def write_chains(cfg: ArenaSettings, n: int) -> list[str]:
    """``n`` chains in the lake of ``cfg`` (through the lake sink's writer); their ids."""
    ts = int(datetime(2026, 11, 21, 12, tzinfo=UTC).timestamp() * 1000)
    chains = [
        ToolChain(
            chain_id=f"chain-{i}",
            server=ServerRef(server_id=f"s{i % 2}", name=f"server {i % 2}", domain="travel", tools=[]),
            tools=["search", "book"][: 1 + i % 2],
            origin="random_walk",
            task="t",
        )
        for i in range(n)
    ]
    rows = [
        LakeRow(
            key=c.chain_id,
            topic="chains",
            partition=0,
            offset=i,
            timestamp_ms=ts,
            value=c.model_dump_json().encode(),
        )
        for i, c in enumerate(chains)
    ]
    LakeWriter(open_store(cfg)).write("chains", rows)
    return [c.chain_id for c in chains]


def produce_dead_letter(broker: str, reason: str) -> bytes:
    """A dead letter on ``<DLQ_SOURCE>.dlq`` as a stage sends it; returns the raw source value."""
    raw = json.dumps({"probe": reason}).encode()
    letter = DeadLetter(
        stage="eigen-intents",
        topic=DLQ_SOURCE,
        partition=0,
        offset=0,
        source_key=f"src-{reason}",
        kind=DeadLetterKind.crash,
        reason=f"handler raised: {reason}",
        payload_text=raw.decode(),
        payload_b64=base64.b64encode(raw).decode(),
    )
    producer = KafkaProducer(bootstrap_servers=broker)
    try:
        producer.send(f"{DLQ_SOURCE}.dlq", letter.model_dump_json().encode(), key=f"dl-{reason}".encode())
        producer.flush()
    finally:
        producer.close()
    return raw


def replayed_values(broker: str, failure: str) -> list[bytes]:
    """Values on DLQ_SOURCE that are replays of ``failure`` (``arena-replay-of: <failure>#<attempt>``)."""
    consumer = KafkaConsumer(bootstrap_servers=broker, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(DLQ_SOURCE, p) for p in sorted(consumer.partitions_for_topic(DLQ_SOURCE) or [])]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        found: list[bytes] = []
        deadline = time.monotonic() + 10
        while any(consumer.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                found.extend(
                    r.value
                    for r in records
                    if dict(r.headers or []).get("arena-replay-of", b"").startswith(f"{failure}#".encode())
                )
        return found
    finally:
        consumer.close(autocommit=False)


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def cfg(broker: str, tmp_path: Path) -> ArenaSettings:
    ensure_topics(broker)
    return ArenaSettings(home=tmp_path / "home", broker=broker)


@pytest.fixture
def client(cfg: ArenaSettings, broker: str) -> Iterator[TestClient]:
    """The API as the page calls it: with this start's write token on every request."""
    app = create_app(cfg, broker)
    app.state.dashboard.sampler.min_interval_s = 0.0  # every request samples anew
    with TestClient(app, headers={TOKEN_HEADER: app.state.token}) as test_client:
        yield test_client


# --- the graph -----------------------------------------------------------------------------------


def test_graph_structure_from_the_registry() -> None:
    edges = graph_edges(ArenaSettings())
    ids = {e.id for e in edges}
    assert {
        "tools-servers:tools.raw->tools.servers",
        "chains:tools.servers->chains",
        "eigen-verified:eigen.dialogs.validated->samples.sft",
        "trainer:samples.verified->trainer.metrics",
        "tool-index:tools.servers->tool-index",  # writes no topic: a sink node
    } <= ids
    assert not any(e.target.endswith((".dlq", ".rejected")) for e in edges)
    depth = node_depths(edges)
    assert depth["tools.raw"] == 0 and depth["tools.servers"] == 1 and depth["chains"] == 2
    # the longest path: tools.raw, tools.servers, chains, tasks, trajectories, trajectories.scored
    assert depth["samples.sft"] == 6 and depth["trainer.metrics"] == 7
    # a cycle does not recurse forever
    loop = [EdgeDef("a", "g", "x", "y"), EdgeDef("b", "g", "y", "x")]
    assert node_depths(loop) == {"x": 1, "y": 0}


def test_page_and_assets_are_served(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and 'id="graph-svg"' in page.text
    assert "/static/app.js" in page.text and "http" not in page.text.split("<body>", 1)[1]  # no CDN
    assert client.get("/static/app.js").status_code == 200
    assert client.get("/static/style.css").headers["content-type"].startswith("text/css")


def test_group_lag_and_throughput(
    client: TestClient, broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic, group = new_topic(partitions=1), unique_name("paused")
    produce(broker, topic, 5)
    commit(broker, group, {TopicPartition(topic, 0): 2})

    def row() -> dict[str, object]:
        view = client.get("/api/graph").json()
        (found,) = [g for g in view["groups"] if g["group"] == group and g["topic"] == topic]
        return dict(found)

    first = row()
    assert (first["committed"], first["end"], first["lag"], first["pending"]) == (2, 5, 3, 3)
    assert first["worker"] is None and first["idle"] is False
    produce(broker, topic, 4)
    commit(broker, group, {TopicPartition(topic, 0): 6})
    second = row()
    assert (second["committed"], second["end"], second["lag"]) == (6, 9, 3)
    rate = second["throughput"]
    assert isinstance(rate, float) and rate > 0  # 4 records consumed since the previous sample

    view = client.get("/api/graph").json()
    edge = next(e for e in view["edges"] if e["id"] == "chains:tools.servers->chains")
    assert edge["group"] == "arena-chains" and "lag" in edge and "throughput" in edge
    assert {n["id"]: n["kind"] for n in view["nodes"]}["tool-index"] == "sink"


def _transactions(broker: str, topic: str, sizes: list[int]) -> list[int]:
    """One committed transaction per size on partition 0 (each closed by a marker); the data offsets."""
    producer = KafkaProducer(bootstrap_servers=broker, transactional_id=f"ui-{uuid.uuid4().hex}")
    producer.init_transactions()
    offsets: list[int] = []
    try:
        for n in sizes:
            producer.begin_transaction()
            sent = [producer.send(topic, f"tx-{i}".encode(), partition=0) for i in range(n)]
            producer.flush()
            producer.commit_transaction()
            offsets += [f.get(timeout=10).offset for f in sent]
    finally:
        producer.close(timeout=2)
    return offsets


def test_lag_and_records_count_data_records_and_a_group_that_never_ran_is_idle(
    broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    source, out, later = new_topic(partitions=1), unique_name("out"), unique_name("later")
    offsets = _transactions(broker, source, [4, 3, 3])  # 10 data records, 3 commit markers
    ran, never = unique_name("ran"), unique_name("never")
    commit(broker, ran, {TopicPartition(source, 0): offsets[-1] + 1})  # handled every record
    edges = [EdgeDef("stage", ran, source, out), EdgeDef("trainer", never, source, later)]
    sampler = LagSampler(broker, {ran: [source], never: [source]}, {}, topics=[source])
    try:
        view = graph_view(edges, asyncio.run(sampler.sample()))
    finally:
        sampler.close()
    edge = {e.worker: e for e in view.edges}
    node = {n.id: n for n in view.nodes}
    # drained: lag 0 although the last marker lies behind the commit (offset lag 1)
    assert (edge["stage"].lag, edge["stage"].pending, edge["stage"].offset_lag) == (0, 0, 1)
    assert edge["stage"].idle is False and node[out].idle is False
    # the topic box: 10 data records, though its end offset counts the 3 markers too
    assert (node[source].records, node[source].end, node[source].records_complete) == (10, 13, True)
    # a group with no commit and no member is idle, and so is the box only it writes
    assert edge["trainer"].idle is True and node[later].idle is True
    assert edge["trainer"].lag == 10  # the records that wait for it
    assert node[source].idle is False  # a source: nothing writes it


def test_records_per_second_read_a_window_not_the_last_second() -> None:
    window, at, rates = RateWindow(30.0), 0.0, []
    for second in range(1, 121):  # 30 records land every 10 s: 3/s on average, 0 in 9 seconds of 10
        at = float(second)
        window.update(30 * (second // 10), at)
        rates.append(window.rate)
    steady = [r for r in rates[60:] if r is not None]
    assert len(steady) == 60 and all(2.0 <= r <= 4.5 for r in steady), (min(steady), max(steady))
    for second in range(121, 241):  # then nothing for two minutes
        window.update(360, float(second))
    assert window.rate is not None and window.rate < 0.1
    fresh = RateWindow()
    fresh.update(5, 0.0)
    assert fresh.rate is None  # one sample is no rate
    fresh.update(None, 1.0)
    fresh.update(9, 2.0)  # an unknown count in between: the next known one spans the gap
    assert fresh.rate == 2.0


# --- lake ----------------------------------------------------------------------------------------


def test_lake_tables_and_query(client: TestClient, cfg: ArenaSettings) -> None:
    write_chains(cfg, 3)
    tables = {t["view"]: t for t in client.get("/api/lake/tables").json()}
    assert tables["chains"]["rows"] == 3 and tables["chains"]["files"] == 1
    assert tables["tools_raw_dlq"]["rows"] == 0  # every view, in the lake or not

    sql = "select chain_id, server ->> '$.domain' as domain from chains order by chain_id"
    result = client.post("/api/lake/query", json={"sql": sql}).json()
    assert result["columns"] == ["chain_id", "domain"]
    assert result["rows"] == [["chain-0", "travel"], ["chain-1", "travel"], ["chain-2", "travel"]]
    assert result["truncated"] is False
    cut = client.post("/api/lake/query", json={"sql": "select * from range(10)", "limit": 4}).json()
    assert len(cut["rows"]) == 4 and cut["truncated"] is True and cut["cut_by"] == "rows"
    assert "first 4 rows" in cut["note"]


def test_query_results_are_capped_in_bytes(client: TestClient, cfg: ArenaSettings) -> None:
    # one 50 MiB row: the answer says why it has no rows instead of carrying them
    resp = client.post("/api/lake/query", json={"sql": "select repeat('x', 50 * 1024 * 1024) as big"})
    assert resp.status_code == 200 and len(resp.content) < 10_000
    body = resp.json()
    assert (body["rows"], body["truncated"], body["cut_by"]) == ([], True, "bytes")
    assert "first row alone is 50.0 MiB" in body["note"] and "left(col, 1000)" in body["note"]
    # many wide rows: as many as fit under the cap, in order
    result = run_query(cfg, "select i, repeat('y', 1000) as s from range(100) t(i)", max_bytes=10_000)
    assert [row[0] for row in result.rows] == list(range(9)) and result.bytes <= 10_000
    assert (result.truncated, result.cut_by) == (True, "bytes") and "cut after 9 rows" in (result.note or "")
    whole = run_query(cfg, "select 1 as one")
    assert (whole.truncated, whole.cut_by, whole.note) == (False, None, None)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"sql": "copy (select 1) to 'out.csv'"}, "only read-only queries"),
        ({"sql": "select 1; select 2"}, "exactly one statement"),
        ({"sql": "select * from read_csv('/etc/hostname')"}, "file system operations are disabled"),
        ({"sql": "select * from no_such_view"}, "no_such_view"),
        ({"sql": "selec 1"}, "syntax error"),
        ({"sql": "select 1", "limit": 0}, "limit"),
        ({"query": "select 1"}, "sql"),
    ],
)
def test_bad_queries_get_a_clear_error(client: TestClient, body: dict[str, object], message: str) -> None:
    resp = client.post("/api/lake/query", json=body)
    assert resp.status_code == 400
    assert message in resp.json()["error"]


def test_a_runaway_query_is_interrupted(cfg: ArenaSettings) -> None:
    with pytest.raises(UiError, match=r"query stopped after 0.5 s"):
        run_query(cfg, "select count(*) from range(100000000000) a, range(100000) b", timeout_s=0.5)


def test_ui_refuses_a_busy_port(cfg: ArenaSettings, broker: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        with pytest.raises(UiError, match=f"cannot listen on 127.0.0.1:{port}.*--port"):
            serve(cfg, broker, host="127.0.0.1", port=port, say=print)


def test_writes_need_json(client: TestClient) -> None:
    resp = client.post(
        "/api/lake/query", content=b'{"sql": "select 1"}', headers={"content-type": "text/plain"}
    )
    assert resp.status_code == 400 and "application/json" in resp.json()["error"]


def test_writes_need_the_token_of_this_start(cfg: ArenaSettings, broker: str) -> None:
    app = create_app(cfg, broker)
    token = app.state.token
    assert len(token) >= 16 and token != create_app(cfg, broker).state.token  # random per start
    query = {"sql": "select 1 as one"}
    replay = {"topic": f"{DLQ_SOURCE}.dlq", "reason": "no such reason"}
    with TestClient(app) as anyone:
        for path, body in (("/api/lake/query", query), ("/api/dlq/replay", replay)):
            refused = anyone.post(path, json=body)
            assert refused.status_code == 403 and TOKEN_HEADER in refused.json()["error"]
            wrong = token[:-1] + ("y" if token.endswith("x") else "x")  # one character off, never the same
            assert anyone.post(path, json=body, headers={TOKEN_HEADER: wrong}).status_code == 403
        assert anyone.post("/api/lake/query", json=query, headers={TOKEN_HEADER: token}).json()["rows"] == [
            [1]
        ]
        assert anyone.get("/api/lake/tables").status_code == 200  # reading needs no token
        # the loopback page carries the token, so its own buttons work
        assert f'<meta name="arena-token" content="{token}">' in anyone.get("/").text


def test_a_page_off_loopback_has_the_token_only_when_opened_with_it(cfg: ArenaSettings, broker: str) -> None:
    token = uuid.uuid4().hex
    app = create_app(cfg, broker, token=token, token_in_page=False)
    with TestClient(app) as anyone:
        assert token not in anyone.get("/").text
        assert token not in anyone.get("/", params={"token": "guess"}).text
        assert f'content="{token}"' in anyone.get("/", params={"token": token}).text


def test_a_non_loopback_host_needs_a_token(cfg: ArenaSettings, broker: str, tmp_path: Path) -> None:
    with pytest.raises(UiError, match=r"--host 0\.0\.0\.0 is not a loopback address.*fix: add --token"):
        serve(cfg, broker, host="0.0.0.0", port=1, say=print)
    with pytest.raises(UiError, match=r"--token has 5 characters; use at least 16"):
        serve(cfg, broker, host="0.0.0.0", port=1, say=print, token="short")
    proc = run_arena(["ui", "--host", "0.0.0.0"], arena_env(tmp_path / "cli-home"), check=None)
    assert proc.returncode != 0 and "--token" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "cli-home" / "stack.json").exists()  # refused before starting anything


def test_loopback_only_host_header(cfg: ArenaSettings, broker: str) -> None:
    app = create_app(cfg, broker, allowed_hosts=LOOPBACK_HOSTS)
    with TestClient(app, base_url="http://127.0.0.1:8600") as ok:
        assert ok.get("/").status_code == 200
    with TestClient(app, base_url="http://rebound.example") as rebound:
        assert rebound.get("/api/lake/tables").status_code == 400


# --- dead letters --------------------------------------------------------------------------------


def test_dead_letters_list_and_replay_exactly_the_letters_asked(client: TestClient, broker: str) -> None:
    reason = uuid.uuid4().hex
    raw = produce_dead_letter(broker, reason)
    other = produce_dead_letter(broker, f"{reason}-other")
    query = {"topic": f"{DLQ_SOURCE}.dlq", "reason": reason}

    def listed() -> tuple[dict[str, Any], dict[str, Any]]:
        rows = {r["reason"]: r for r in client.get("/api/dlq", params=query).json()}
        assert len(rows) == 2
        return rows[f"handler raised: {reason}"], rows[f"handler raised: {reason}-other"]

    row, other_row = listed()
    assert (row["source_topic"], row["kind"], row["replayed"]) == (DLQ_SOURCE, "crash", False)
    assert reason in row["reason"] and row["history"] == "not replayed"

    report = client.post("/api/dlq/replay", json={"keys": [row["key"]]}).json()
    assert (report["replayed"], report["skipped_already_replayed"], report["failed"]) == (1, 0, [])
    row, other_row = listed()
    assert (row["replayed"], row["needs_force"], other_row["replayed"]) == (True, True, False)
    assert replayed_values(broker, row["failure_id"]) == [raw]
    assert replayed_values(broker, other_row["failure_id"]) == []  # not asked for
    again = client.post("/api/dlq/replay", json={"keys": [row["key"]]}).json()
    assert "replayed" in again, again  # an error says which (seen once in a full run under load)
    assert (again["replayed"], again["skipped_already_replayed"]) == (0, 1)
    forced = client.post("/api/dlq/replay", json={"keys": [row["key"]], "force": True}).json()
    assert forced["replay_ids"] == [f"{row['failure_id']}#2"]
    assert replayed_values(broker, row["failure_id"]) == [raw, raw]
    by_topic = client.post("/api/dlq/replay", json=query).json()  # what is left of the topic and reason
    assert (by_topic["replayed"], by_topic["skipped_already_replayed"]) == (1, 1)
    assert replayed_values(broker, other_row["failure_id"]) == [other]

    bad = client.post("/api/dlq/replay", json={"topic": "nope.dlq"})
    assert bad.status_code == 400 and "no dead-letter topic" in bad.json()["error"]
    unknown = client.post("/api/dlq/replay", json={"keys": ["0123456789abcdef"]})
    assert unknown.status_code == 400 and "no dead letter with key" in unknown.json()["error"]


# --- training curves -----------------------------------------------------------------------------


def test_training_curves_from_trainer_metrics(client: TestClient, broker: str) -> None:
    run = f"ui-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=broker)
    try:
        for step in (2, 1, 3, 2):  # out of order, step 2 published twice (a resumed run): newest wins
            value = TrainerMetrics(
                run_id=run, step=step, metrics={"loss": 1.0 / step, "reward_mean": step / 10}
            )
            producer.send("trainer.metrics", value.model_dump_json().encode())
        producer.send("trainer.metrics", b"not a metrics record")
        producer.flush()
    finally:
        producer.close()
    view = client.get("/api/training").json()
    (series,) = [r for r in view["runs"] if r["run_id"] == run]
    assert [p["step"] for p in series["points"]] == [1, 2, 3]
    assert [p["metrics"]["loss"] for p in series["points"]] == [1.0, 0.5, 1.0 / 3]
    assert view["metrics"][:2] == ["loss", "reward_mean"]
    assert view["invalid"] >= 1
    # the feed is incremental: a later step shows up on the next poll
    producer = KafkaProducer(bootstrap_servers=broker)
    try:
        producer.send(
            "trainer.metrics",
            TrainerMetrics(run_id=run, step=4, metrics={"loss": 0.1}).model_dump_json().encode(),
        )
        producer.flush()
    finally:
        producer.close()
    (series,) = [r for r in client.get("/api/training").json()["runs"] if r["run_id"] == run]
    assert [p["step"] for p in series["points"]] == [1, 2, 3, 4]


# --- trace ---------------------------------------------------------------------------------------


def test_trace_of_a_record(client: TestClient, cfg: ArenaSettings) -> None:
    from lake.catalog import Catalog, LineageEdge

    chain, server = f"chain-{uuid.uuid4().hex}", f"server-{uuid.uuid4().hex}"
    catalog = Catalog(cfg.catalog)
    try:
        catalog.record_lineage(
            [
                LineageEdge(
                    child_key=chain,
                    child_topic="chains",
                    parent_key=server,
                    stage="chains",
                    stage_version="3",
                )
            ]
        )
    finally:
        catalog.dispose()
    report = client.get(f"/api/trace/{chain[:14]}").json()  # a unique prefix is enough
    assert report["record"]["id"] == chain
    assert [(e["parent"], e["child"], e["stage"]) for e in report["ancestors"]] == [(server, chain, "chains")]
    missing = client.get("/api/trace/nothing-like-this-id")
    assert missing.status_code == 400 and missing.json()["error"]
    assert client.get(f"/api/trace/{chain}?depth=0").status_code == 400


# --- data versions -------------------------------------------------------------------------------


def version_spec(name: str, **changes: Any) -> VersionSpec:
    """A replay of tasks-from-chains as `arena replay tasks-from-chains --as NAME` records it."""
    fields: dict[str, Any] = {
        "name": name,
        "parent": MAIN,
        "stage": "tasks-from-chains",
        "stages": ("tasks-from-chains",),
        "input_topic": "chains",
        "topics": ("chains", "tasks"),
        "ranges": (InputRange(partition=0, start=0, end=2, records=2),),
        "settings": {"ARENA_SFT__TASKS_PER_CHAIN": "2"},
        "created_at": datetime(2026, 11, 21, 12, tzinfo=UTC),
    }
    return VersionSpec(**{**fields, **changes})


def record_versions(cfg: ArenaSettings, *specs: VersionSpec) -> None:
    catalog = Catalog(cfg.catalog)
    try:
        for spec in specs:
            catalog.record_version(spec)
    finally:
        catalog.dispose()


def write_version_lake(cfg: ArenaSettings, name: str) -> None:
    """main and version ``name`` of tasks-from-chains in the lake of ``cfg``.

    main made task-a, task-b, task-c from chain-0..2 and dead-lettered chain-3; ``name`` replayed
    chain-0 and chain-1 (inherited from main) and chain-3: the same task-a, task-b changed, chain-3
    rejected by a gate, and fewer LLM tokens.
    """
    ts = int(datetime(2026, 11, 21, 12, tzinfo=UTC).timestamp() * 1000)
    server = ServerRef(server_id="s0", name="server 0", domain="travel", tools=[])

    def rows(topic: str, items: list[tuple[str, bytes, dict[str, str]]]) -> list[LakeRow]:
        return [
            LakeRow(key=k, topic=topic, partition=0, offset=i, timestamp_ms=ts, headers=h, value=v)
            for i, (k, v, h) in enumerate(items)
        ]

    def chain(i: int) -> bytes:
        value = ToolChain(
            chain_id=f"chain-{i}", server=server, tools=["search"], origin="random_walk", task="t"
        )
        return value.model_dump_json().encode()

    def task(key: str, text: str, parent: str, version: str) -> tuple[str, bytes, dict[str, str]]:
        value = Task(task_id=key, server=server, text=text, language="en", mode="server")
        headers = {"arena-stage": "tasks-from-chains", "arena-source-ids": parent, "arena-version": version}
        return key, value.model_dump_json().encode(), headers

    def entry(
        version: str, i: int, outcome: str, **counts: dict[str, int]
    ) -> tuple[str, bytes, dict[str, str]]:
        value = LedgerEntry(
            stage="tasks-from-chains",
            topic=wire("chains", version),
            partition=0,
            offset=i,
            key=f"chain-{i}",
            outcome=Outcome(outcome),
            **counts,
        )
        return f"ledger-{version}-{i}", value.model_dump_json().encode(), {}

    def usage(version: str, calls: int, attempts: int, tokens: int) -> tuple[str, bytes, dict[str, str]]:
        start = datetime(2026, 11, 21, 12, tzinfo=UTC)
        value = LlmUsage(
            stage="tasks-from-chains",
            role="task_synthesis",
            backend="rules",
            model="m",
            pid=1,
            window_start=start,
            window_end=start,
            calls=calls,
            attempts=attempts,
            prompt_tokens=tokens // 2,
            completion_tokens=tokens - tokens // 2,
        )
        return f"usage-{version}", value.model_dump_json().encode(), {}

    writer = LakeWriter(open_store(cfg))
    writer.write("chains", rows("chains", [(f"chain-{i}", chain(i), {}) for i in range(4)]))
    inherited = {INHERITED_HEADER: MAIN}
    v_chains = wire("chains", name)
    writer.write(v_chains, rows(v_chains, [(f"chain-{i}", chain(i), inherited) for i in (0, 1, 3)]))
    writer.write(
        "tasks",
        rows(
            "tasks",
            [
                task("task-a", "book a flight", "chain-0", MAIN),
                task("task-b", "find a hotel", "chain-1", MAIN),
                task("task-c", "rent a car", "chain-2", MAIN),
            ],
        ),
    )
    v_tasks = wire("tasks", name)
    writer.write(
        v_tasks,
        rows(
            v_tasks,
            [
                task("task-a", "book a flight", "chain-0", name),
                task("task-b2", "find a hotel near the sea", "chain-1", name),
            ],
        ),
    )
    one = {"tasks": 1}
    ledger = [
        entry(MAIN, 0, "emitted", outputs=one),
        entry(MAIN, 1, "emitted", outputs=one),
        entry(MAIN, 2, "emitted", outputs=one),
        entry(MAIN, 3, "dead_letter", dead_letters={"crash": 1}),
    ]
    writer.write("stages.ledger", rows("stages.ledger", ledger))
    v_ledger = wire("stages.ledger", name)
    ledger = [
        entry(name, 0, "emitted", outputs=one),
        entry(name, 1, "emitted", outputs=one),
        entry(name, 3, "rejected", rejections={"quality": 1}),
    ]
    writer.write(v_ledger, rows(v_ledger, ledger))
    writer.write("llm.usage", rows("llm.usage", [usage(MAIN, 6, 6, 600)]))
    v_usage = wire("llm.usage", name)
    writer.write(v_usage, rows(v_usage, [usage(name, 4, 2, 300)]))


def lag_row(group: str, topic: str, committed: int | None, lag: int, **more: Any) -> LagRow:
    end = (committed or 0) + lag
    return LagRow(
        group=group, topic=topic, partition=0, committed=committed, end=end, log_end=end, lag=lag,
        offset_lag=lag, **more,
    )  # fmt: skip


def test_versions_view_has_main_first_then_the_catalog_with_progress_from_lag() -> None:
    specs = [version_spec("v2"), version_spec("v3", stages=("tasks-from-chains", "trajectories"))]
    rows = [
        lag_row("arena-chains", "tools.servers", 10, 0),
        lag_row("arena-tasks-from-chains", "chains", 7, 3),
        lag_row("arena-tasks-from-chains@v2", wire("chains", "v2"), 1, 1),
        lag_row("arena-lake-sink@v2", wire("chains", "v2"), 2, 0),
        lag_row("arena-tasks-from-chains@v3", wire("chains", "v3"), None, 2, idle=True),
    ]
    views = {v.name: v for v in versions_view(specs, rows)}
    assert list(views) == [MAIN, "v2", "v3"]
    main, v2, v3 = views.values()
    assert main.main and "tasks-from-chains" in main.stages and main.parent is None
    assert (main.groups, main.pending, main.read, main.state) == (2, 3, 17, "running")
    assert (v2.groups, v2.pending, v2.read, v2.state) == (2, 1, 3, "running")
    assert (v3.groups, v3.pending, v3.read, v3.state) == (1, 2, 0, "idle")
    assert v2.stage == "tasks-from-chains" and v2.records == 2 and v2.config_hash == specs[0].config_hash
    # nothing left to read: the replay is done; no lag rows at all: it never ran
    done = versions_view(specs[:1], [lag_row("arena-tasks-from-chains@v2", wire("chains", "v2"), 2, 0)])
    assert done[1].state == "drained" and versions_view(specs[:1], [])[1].state == "idle"
    # the groups sampled for a version: its stages' and its lake sink's, on its own topics
    topics, workers = version_groups(specs[:1])
    assert topics == {
        "arena-tasks-from-chains@v2": [wire("chains", "v2")],
        "arena-lake-sink@v2": [wire("chains", "v2"), wire("tasks", "v2")],
    }
    assert workers["arena-tasks-from-chains@v2"] == "tasks-from-chains@v2"


def test_api_versions_lists_the_catalog_with_each_versions_progress(
    client: TestClient, cfg: ArenaSettings, broker: str
) -> None:
    # names no other test on the session broker uses: its version topics and groups are its own
    busy, unstarted = f"ui{uuid.uuid4().hex[:8]}", f"ui{uuid.uuid4().hex[:8]}"
    record_versions(cfg, version_spec(busy), version_spec(unstarted, created_at=datetime.now(UTC)))
    source = wire("chains", busy)
    with admin_client(broker) as admin:
        admin.create_topics(
            {source: {"num_partitions": 1, "replication_factor": -1, "configs": {}}}, wait_for_metadata=True
        )
    produce(broker, source, 3)
    commit(broker, f"arena-tasks-from-chains@{busy}", {TopicPartition(source, 0): 1})

    resp = client.get("/api/versions")
    assert resp.status_code == 200, resp.text
    views = {v["name"]: v for v in resp.json()}
    assert list(views) == [MAIN, busy, unstarted]  # main first, then the catalog oldest first
    assert views[MAIN]["main"] is True and "tasks-from-chains" in views[MAIN]["stages"]
    spec = version_spec(busy)
    got = views[busy]
    assert (got["parent"], got["stage"], got["stages"], got["records"]) == (
        MAIN,
        "tasks-from-chains",
        ["tasks-from-chains"],
        2,
    )
    assert got["settings"] == spec.settings and got["config_hash"] == spec.config_hash
    assert got["ranges"] == [{"partition": 0, "start": 0, "end": 2, "records": 2, "from_lake": 0}]
    # its stage read 1 of 3; its lake sink never ran and has all 3 to read (watched before it started)
    assert (got["groups"], got["pending"], got["read"], got["state"]) == (2, 2 + 3, 1, "running")
    # a version whose topics do not exist yet: no group, nothing read, idle
    assert (views[unstarted]["groups"], views[unstarted]["read"], views[unstarted]["state"]) == (0, 0, "idle")
    # the stage's group shows on the graph's group list too, with its worker
    groups = {g["group"]: g for g in client.get("/api/graph").json()["groups"]}
    assert groups[f"arena-tasks-from-chains@{busy}"]["worker"] == f"tasks-from-chains@{busy}"


def test_api_diff_compares_two_versions_from_the_lake(client: TestClient, cfg: ArenaSettings) -> None:
    write_version_lake(cfg, "v2")
    record_versions(cfg, version_spec("v2"))

    resp = client.get("/api/diff", params={"a": MAIN, "b": "v2"})
    assert resp.status_code == 200, resp.text
    diff = resp.json()
    assert (diff["a"], diff["b"]) == (MAIN, "v2")
    (stage,) = diff["stages"]  # only the stage the version ran
    assert stage["stage"] == "tasks-from-chains"
    a, b = stage["a"], stage["b"]
    assert (a["records_in"], a["produced"], a["rejected"], a["dead_lettered"], a["outputs"]) == (
        4,
        3,
        0,
        1,
        3,
    )
    assert (b["records_in"], b["produced"], b["rejected"], b["dead_lettered"], b["outputs"]) == (
        3,
        2,
        1,
        0,
        2,
    )
    assert a["dead_letters_by_kind"] == {"crash": 1} and b["rejections_by_gate"] == {"quality": 1}
    assert (a["llm_calls"], a["llm_tokens"], a["calls_per_output"], a["tokens_per_output"]) == (
        6,
        600,
        2.0,
        200.0,
    )
    assert (b["llm_requests"], b["tokens_per_output"]) == (2, 150.0)
    # matched by the upstream chain: chain-2 only in main, chain-0 and chain-1 in both, chain-1 changed
    # chain-2 was not replayed: main's task-c is outside the comparison
    assert (stage["only_a"], stage["only_b"], stage["both"], stage["identical"]) == (0, 0, 2, 1)
    assert stage["examples"] == [
        {"root": "chain-1", "a": ["find a hotel"], "b": ["find a hotel near the sea"]}
    ]
    # the same as `arena diff --json`
    expected = compare(open_store(cfg), MAIN, "v2").model_dump(mode="json")
    assert diff == expected
    assert (
        client.get("/api/diff?a=main&b=v2&stage=tasks-from-chains&examples=0").json()["stages"][0]["examples"]
        == []
    )

    # the lake's tables count the live pipeline's rows; the version's are told apart
    tables = {t["view"]: t for t in client.get("/api/lake/tables").json()}
    assert (tables["tasks"]["rows"], tables["tasks"]["version_rows"]) == (3, {"v2": 2})
    assert (tables["chains"]["rows"], tables["chains"]["version_rows"]) == (4, {"v2": 3})
    # ... as the page's query box counts them: one view over every version, main by _version
    sql = "select _version, count(*) as n from tasks group by 1 order by 1"
    assert client.post("/api/lake/query", json={"sql": sql}).json()["rows"] == [["main", 3], ["v2", 2]]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("", "name the two data versions to compare"),
        ("?a=main", "name the two data versions to compare"),
        ("?b=v2", "name the two data versions to compare"),
        ("?a=main&b=nope", "no data version 'nope' (fix: one of main, v2"),
        ("?a=Bad.Name&b=v2", "version name 'Bad.Name' is not allowed"),
        ("?a=main&b=v2&stage=no-such-stage", "no stage 'no-such-stage' (fix: one of tasks-from-chains)"),
        ("?a=main&b=v2&stage=chains", "stage 'chains' made nothing in main or v2"),
        ("?a=main&b=v2&examples=99", "examples='99'"),
        ("?a=main&b=v2&examples=-1", "examples='-1'"),
    ],
)
def test_api_diff_refuses_unknown_versions_and_stages(
    client: TestClient, cfg: ArenaSettings, query: str, message: str
) -> None:
    record_versions(cfg, version_spec("v2"))
    resp = client.get(f"/api/diff{query}")
    assert resp.status_code == 400, resp.text
    assert message in resp.json()["error"]

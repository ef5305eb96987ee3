"""Claim check: values too large for the broker travel as references to the lake.

A 5 MB ``tools.raw`` record is published through ``producers.publish`` to the real broker,
handled by the real ``tools-servers`` stage and persisted by the lake sink (worker processes,
as `arena worker` runs them): it arrives whole. Small records are sent unchanged; a claim whose
object was tampered with goes to ``tools.raw.dlq`` with a ``claim_error`` reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from rich.console import Console

from app.worker import run_workers
from arena.config import ArenaSettings
from arena.records.common import DeadLetter, DeadLetterKind
from arena.records.tools import RawToolServer
from arena.topics import topic
from lake.store import (
    CLAIM_HEADER,
    Claim,
    ClaimCheck,
    ClaimError,
    LocalStore,
    ObjectStore,
    S3Store,
    open_claim,
)
from producers.publish import publish
from producers.publish_tools import outgoing, raw_key
from streams.admin import ensure_topics
from streams.runtime import decode_async
from tests.cli import read_all
from tests.fixtures.s3 import S3Server

BIG = 5 * 1024 * 1024


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "lake")
    server: S3Server = request.getfixturevalue("s3_server")
    return S3Store(server.new_bucket(), "lake", **server.credentials())


def test_claims_round_trip_once_and_refuse_tampering(store: ObjectStore) -> None:
    claims = ClaimCheck(store, 1024)
    small = b'{"a": 1}'
    assert claims.seal(small, [("arena-stage", b"s")]) == (small, [("arena-stage", b"s")])

    value = json.dumps({"text": "x" * 5000}).encode()
    wire, headers = claims.seal(value, [("arena-stage", b"s")])
    claim = Claim.model_validate_json(dict(headers)[CLAIM_HEADER])
    assert claim.key == f"claims/{hashlib.sha256(value).hexdigest()}" and claim.size == len(value)
    assert len(wire) < 300 and json.loads(wire)["arena_claim"]["key"] == claim.key
    assert open_claim(wire, headers, claims) == value
    assert claims.seal(value, [])[1][-1] == (CLAIM_HEADER, dict(headers)[CLAIM_HEADER])  # idempotent
    assert store.list("claims/") == [claim.key]

    store.put(claim.key, value.replace(b"x", b"y", 1))
    with pytest.raises(ClaimError, match="corrupt"):
        open_claim(wire, headers, claims)
    store.delete(claim.key)
    with pytest.raises(ClaimError, match="missing"):
        open_claim(wire, headers, claims)
    with pytest.raises(ClaimError, match="no claim check"):
        open_claim(wire, headers, None)


def test_decode_reads_claims_and_dead_letters_bad_ones(tmp_path: Path) -> None:
    spec = topic("tools.raw")
    claims = ClaimCheck(LocalStore(tmp_path / "lake"), 1024)
    raw = server_doc("decode", tools=20).model_dump_json().encode()
    wire, headers = claims.seal(raw, [])

    async def decode(headers: Any, checker: ClaimCheck | None) -> Any:
        return await decode_async(spec, wire, stage="t", source_key="k", headers=headers, claims=checker)

    good = asyncio.run(decode(headers, claims))
    assert good.dead_letter is None and good.raw == raw
    assert isinstance(good.record, RawToolServer) and len(good.record.entries) == 20

    bad = asyncio.run(decode([(CLAIM_HEADER, b'{"key": "claims/../etc"}')], claims)).dead_letter
    assert bad is not None and bad.kind == DeadLetterKind.claim_error and "not a valid claim" in bad.reason
    orphan = asyncio.run(decode(headers, None)).dead_letter
    assert orphan is not None and orphan.kind == DeadLetterKind.claim_error


def tool(name: str, words: int) -> dict[str, Any]:
    vocabulary = ["search", "catalogue", "items", "matching", "keyword", "filter", "price", "stock"]
    text = " ".join(vocabulary[(i * 7 + len(name)) % len(vocabulary)] for i in range(words))
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Find items for {name}. {text}",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }


def server_doc(name: str, tools: int, words: int = 40) -> RawToolServer:
    entries = [tool(f"{name.replace('-', '_')}_t{i}", words) for i in range(tools)]
    return RawToolServer.model_validate(
        {"server": name, "source": f"/gen/{name}.json", "format": "openai", "entries": entries}
    )


def lake_rows(lake: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for file in sorted((lake / f"topic={name}").rglob("*.parquet")):
        rows.extend(pq.read_table(file).to_pylist())
    return rows


@pytest.mark.integration
def test_a_5mb_record_flows_through_a_stage_and_the_lake_sink(broker: str, tmp_path: Path) -> None:
    settings = ArenaSettings(home=tmp_path / "home", broker=broker)
    ensure_topics(broker)  # the session's broker: topics with their declared partitions, as `arena up` makes
    claims = ClaimCheck.from_settings(settings)
    tag = uuid.uuid4().hex[:8]
    big = server_doc(f"big-{tag}", tools=1200, words=600)  # ~5 MB of JSON
    tampered = server_doc(f"tampered-{tag}", tools=300, words=600)
    small = server_doc(f"small-{tag}", tools=3)
    assert len(big.model_dump_json()) > BIG
    sent = asyncio.run(publish(broker, outgoing([big, tampered, small], []), claims=claims))
    assert sent == 3

    # On the wire: the small record as it always was, the large ones as claims.
    # (the session's broker is shared: other tests' records, some without a key, are on tools.raw too)
    wire = {r.key.decode(): r for r in read_all(broker, "tools.raw") if r.key is not None}
    small_rec, big_rec = wire[raw_key(small)], wire[raw_key(big)]
    assert CLAIM_HEADER not in dict(small_rec.headers)
    assert small_rec.value == small.model_dump_json().encode()
    assert len(big_rec.value) < 1024 and CLAIM_HEADER in dict(big_rec.headers)
    bad = Claim.model_validate_json(dict(wire[raw_key(tampered)].headers)[CLAIM_HEADER])
    data = claims.store.get(bad.key)
    claims.store.put(bad.key, data[:100] + (b"z" if data[100:101] != b"z" else b"y") + data[101:])

    code = run_workers(
        settings,
        broker,
        ["tools-servers", "lake-sink"],
        until_drained=True,
        timeout_s=420,
        console=Console(quiet=True),
    )
    assert code == 0

    lake = tmp_path / "home" / "lake"
    raw_rows = {r["_key"]: r for r in lake_rows(lake, "tools.raw")}
    kept = raw_rows[raw_key(big)]
    assert kept["_valid"] and json.loads(kept["entries"]) == big.model_dump(mode="json")["entries"]
    assert CLAIM_HEADER in json.loads(kept["_headers"])
    assert raw_rows[raw_key(small)]["_valid"]
    assert not raw_rows[raw_key(tampered)]["_valid"]
    assert "corrupt" in raw_rows[raw_key(tampered)]["_error"]

    servers = [r for r in lake_rows(lake, "tools.servers") if r["name"] == big.server]
    assert len(servers) == 1 and len(json.loads(servers[0]["tools"])) == 1200  # the stage's own 5 MB output

    # The tampered record's letter carries its small claim, not 5 MB, so it is not claimed itself; a
    # claimed letter on the shared broker is another test's, its value in that test's lake.
    letters = [
        DeadLetter.model_validate_json(r.value)
        for r in read_all(broker, "tools.raw.dlq")
        if CLAIM_HEADER not in dict(r.headers)
    ]
    mine = [d for d in letters if d.source_key == raw_key(tampered)]
    assert len(mine) == 1 and mine[0].kind == DeadLetterKind.claim_error
    assert "corrupt" in mine[0].reason and bad.key in mine[0].reason

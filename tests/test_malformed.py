"""Hypothesis-generated malformed input on `tools.raw`: every record ends somewhere, with a reason.

One `arena worker` (all stages, the docker-compose command) runs for the
module; each example produces a batch of broken records straight to
`tools.raw`, waits until the groups drain, and checks where each record went.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer

from app.registry import topics_by_group
from consumers.lag import compute_lag, drained
from tests.cli import ARENA, BACKBONE_ARGS, BACKBONE_WORKERS, arena_env, broker_of, read_all, run_arena

pytestmark = pytest.mark.integration


@dataclass
class Running:
    bootstrap: str
    env: dict[str, str]
    proc: subprocess.Popen[str]


@pytest.fixture(scope="module")
def running_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    home = tmp_path_factory.mktemp("malformed") / "home"
    env = arena_env(home)
    run_arena(["topics", "create"], env)
    bootstrap = broker_of(home)
    proc = subprocess.Popen(
        [ARENA, "worker", *BACKBONE_ARGS], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        yield Running(bootstrap, env, proc)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        run_arena(["down"], env, check=None)
    assert proc.returncode == 0, err[-3000:]
    assert "exited with" not in err, f"a worker crashed:\n{err[-3000:]}"


def tool(name: str, description: str) -> dict[str, object]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }


def raw_server(name: str, entries: list[object]) -> dict[str, object]:
    return {"server": name, "source": f"/gen/{name}.json", "format": "openai", "entries": entries}


GOOD = "Search the catalogue for matching items by keyword."


@st.composite
def malformed(draw: st.DrawFn) -> tuple[str, bytes]:
    """(expected outcome, payload) pairs covering the issue's kinds of bad input."""
    name = f"gen-{uuid.uuid4().hex[:10]}"
    kind = draw(st.sampled_from(["truncated", "wrong_types", "zero_tools", "huge_description", "not_utf8"]))
    good_doc = raw_server(name, [tool(f"t{i}", GOOD) for i in range(3)])
    if kind == "truncated":
        text = json.dumps(good_doc).encode()
        return "dlq", text[: draw(st.integers(1, len(text) - 1))]
    if kind == "not_utf8":
        text = json.dumps(good_doc).encode()
        at = draw(st.integers(0, len(text)))
        return "dlq", text[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xfe\xfe", b"\x80"])) + text[
            at:
        ]
    if kind == "wrong_types":
        doc: dict[str, object] = dict(good_doc)
        field = draw(st.sampled_from(["server", "entries", "format", "entry_items"]))
        if field == "entry_items":  # valid envelope, junk tool entries: the gates drop them all
            doc["entries"] = draw(
                st.lists(st.one_of(st.integers(), st.text(max_size=5), st.none()), min_size=1, max_size=4)
            )
            return "rejected", json.dumps(doc).encode()
        # a list is a valid `entries` value (its items are judged by the gates), so not offered there
        wrong = [5, None, {"a": 1}, True] + ([] if field == "entries" else [["x"]])
        doc[field] = draw(st.sampled_from(wrong))
        return "dlq", json.dumps(doc).encode()
    if kind == "zero_tools":
        return "rejected", json.dumps(raw_server(name, [])).encode()
    huge = "Find " + "very " * (100 * 1024 // 5) + "large things."
    return "servers", json.dumps(
        raw_server(name, [tool("a", huge), tool("b", GOOD), tool("c", GOOD)])
    ).encode()


def wait_drained(bootstrap: str, timeout: float = 120.0) -> None:
    groups = topics_by_group(BACKBONE_WORKERS)
    deadline = time.monotonic() + timeout
    clean = 0
    while time.monotonic() < deadline:
        clean = clean + 1 if drained(bootstrap, groups) else 0
        if clean >= 2:
            return
        time.sleep(0.5)
    raise AssertionError(f"not drained: {compute_lag(bootstrap, topics_by_group=groups)}")


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(malformed(), min_size=3, max_size=8))
def test_malformed_records_end_in_dlq_or_rejected_with_reasons(
    running_worker: Running, batch: list[tuple[str, bytes]]
) -> None:
    bootstrap = running_worker.bootstrap
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    expected: dict[str, str] = {}
    for outcome, payload in batch:
        key = f"test-{uuid.uuid4().hex}"
        expected[key] = outcome
        producer.send("tools.raw", key=key.encode(), value=payload)
    producer.flush()
    producer.close()
    wait_drained(bootstrap)

    landed: dict[str, list[tuple[str, str]]] = {}
    for rec in read_all(bootstrap, "tools.raw.dlq"):
        value = json.loads(rec.value)
        landed.setdefault(value["source_key"], []).append(("dlq", value["reason"]))
    for rec in read_all(bootstrap, "tools.raw.rejected"):
        value = json.loads(rec.value)
        landed.setdefault(value["source_key"], []).append(("rejected", f"{value['gate']}: {value['reason']}"))
    for rec in read_all(bootstrap, "tools.servers"):
        sources = dict(rec.headers)["arena-source-ids"].decode().split(",")
        value = json.loads(rec.value)
        assert all(len(t["function"]["description"].encode()) <= 8192 for t in value["tools"])
        for source in sources:
            landed.setdefault(source, []).append(("servers", value["name"]))

    for key, outcome in expected.items():
        places = landed.get(key)
        assert places, f"record {key} ({outcome}) landed nowhere"
        kinds = {kind for kind, _ in places}
        if outcome == "servers":
            assert kinds == {"servers"}, places
        else:
            assert outcome in kinds and "servers" not in kinds, places
        assert all(reason for _, reason in places)
    assert running_worker.proc.poll() is None, "the worker died"
    assert all(
        row.pending == 0 for row in compute_lag(bootstrap, topics_by_group=topics_by_group(BACKBONE_WORKERS))
    )


def test_cli_publish_of_broken_files_names_file_and_loses_nothing(
    running_worker: Running, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "cut.json").write_text('{"tools": [{"name": "a", "descr')
    (docs / "latin1.json").write_bytes(b'{"tools": [{"name": "caf\xe9"}]}')
    (docs / "ok.json").write_text(
        json.dumps(
            {
                "tools": [
                    {"name": f"op{i}", "description": GOOD, "inputSchema": {"type": "object"}}
                    for i in range(3)
                ]
            }
        )
    )
    pub = run_arena(["publish", "tools", str(docs)], running_worker.env, check=1)
    assert "cut.json" in pub.stderr and "latin1.json" in pub.stderr
    assert "1 servers published, 2 rejected" in pub.stdout
    assert "Traceback" not in pub.stderr
    letters = [json.loads(r.value) for r in read_all(running_worker.bootstrap, "tools.raw.dlq")]
    by_file = {
        Path(v["reason"].split(":")[0].split(" [")[0]).name: v for v in letters if v["stage"] == "publish"
    }
    assert {"cut.json", "latin1.json"} <= set(by_file)
    assert base64.b64decode(by_file["latin1.json"]["payload_b64"]) == b'{"tools": [{"name": "caf\xe9"}]}'

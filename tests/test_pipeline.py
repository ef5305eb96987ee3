"""End to end through the real CLI: publish -> tools-servers -> lake -> `arena lake query`.

Each test gets its own embedded stack (the CLI starts it on first use), runs
`arena worker` as subprocesses and reads committed offsets with kafka-python.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.demo import sample_tools_dir
from tests.cli import (
    BACKBONE_ARGS,
    arena_env,
    broker_of,
    committed,
    end_offsets,
    lake_json,
    run_arena,
    stack_stopped_after,
)

pytestmark = pytest.mark.integration

GOOD_SERVERS = 7  # samples/tools/good
REJECTED_SERVERS = 2  # samples/tools/rejected: fall under 3 tools
UNREADABLE = 4  # samples/tools/malformed


def small_server(name: str, n_tools: int = 3) -> dict[str, object]:
    """An MCP tools/list document with ``n_tools`` well-described tools."""
    return {
        "serverInfo": {"name": name},
        "tools": [
            {
                "name": f"{name}_op_{i}",
                "description": f"Look up record number {i} of the {name} inventory by its identifier.",
                "inputSchema": {
                    "type": "object",
                    "properties": {"item_id": {"type": "string", "description": "Identifier."}},
                    "required": ["item_id"],
                },
            }
            for i in range(n_tools)
        ],
    }


def test_publish_normalise_lake_then_only_new_records(tmp_path: Path) -> None:
    env = arena_env(tmp_path / "home")
    with stack_stopped_after(env):
        pub = run_arena(["publish", "tools", str(sample_tools_dir())], env, check=1)
        assert "started the embedded stack" in pub.stderr
        assert f"{GOOD_SERVERS + REJECTED_SERVERS} servers published, {UNREADABLE} rejected" in pub.stdout
        assert "Traceback" not in pub.stderr
        run_arena(["worker", *BACKBONE_ARGS, "--until-drained", "--timeout", "240"], env)

        bootstrap = broker_of(tmp_path / "home")
        raw_ends = end_offsets(bootstrap, "tools.raw")
        stage_offsets = committed(bootstrap, "arena-tools-servers")
        assert {tp: stage_offsets.get(tp, 0) for tp in raw_ends} == raw_ends
        assert sum(raw_ends.values()) == GOOD_SERVERS + REJECTED_SERVERS  # no markers on noida

        # One `arena lake query` (a CLI start each): the counts and whether every server has a domain.
        counts = lake_json(
            "select (select count(*) from tools_servers) as servers,"
            " (select count(*) from tools_raw) as raw,"
            " (select count(distinct source_key) from tools_raw_rejected where gate = 'min_tools') as small,"
            " (select count(*) from tools_raw_dlq) as dlq,"
            " (select count(*) from tools_servers where coalesce(domain, '') = '') as no_domain",
            env,
        )[0]
        assert counts == {
            "servers": GOOD_SERVERS,
            "raw": GOOD_SERVERS + REJECTED_SERVERS,
            "small": REJECTED_SERVERS,
            "dlq": UNREADABLE,
            "no_domain": 0,
        }

        # A second publish after the drain processes only the new record.
        extra = tmp_path / "extra"
        extra.mkdir()
        (extra / "inventory.json").write_text(json.dumps(small_server("inventory")))
        run_arena(["publish", "tools", str(extra)], env)
        run_arena(["worker", *BACKBONE_ARGS, "--until-drained", "--timeout", "240"], env)
        after = committed(bootstrap, "arena-tools-servers")
        assert sum(after.values()) - sum(stage_offsets.values()) == 1
        assert lake_json(
            "select (select count(*) from tools_servers) as servers, (select count(*) from tools_raw) as raw",
            env,
        ) == [{"servers": GOOD_SERVERS + 1, "raw": GOOD_SERVERS + REJECTED_SERVERS + 1}]

        lag = json.loads(run_arena(["lag", "--json"], env).stdout)
        assert lag and all(row["pending"] == 0 for row in lag)
        listing = {
            item["topic"]: item for item in json.loads(run_arena(["lake", "ls", "--json"], env).stdout)
        }
        assert listing["tools.servers"]["rows"] == GOOD_SERVERS + 1


def test_pipeline_with_lake_and_lancedb_on_s3(tmp_path: Path, s3_server, s3_bucket: str) -> None:  # type: ignore[no-untyped-def]
    env = arena_env(
        tmp_path / "home",
        ARENA_LAKE_URL=f"s3://{s3_bucket}/lake",
        ARENA_LANCEDB_URI=f"s3://{s3_bucket}/lancedb",
        ARENA_S3_ENDPOINT=s3_server.endpoint,
        ARENA_S3_ACCESS_KEY=s3_server.access_key,
        ARENA_S3_SECRET_KEY=s3_server.secret_key,
    )
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("alpha", "beta", "gamma"):
        (docs / f"{name}.json").write_text(json.dumps(small_server(name, 4)))
    (docs / "tiny.json").write_text(json.dumps(small_server("tiny", 2)))
    with stack_stopped_after(env):
        run_arena(["publish", "tools", str(docs)], env)
        run_arena(["worker", *BACKBONE_ARGS, "--until-drained", "--timeout", "240"], env)
        rows = lake_json("select name from tools_servers order by name", env)
        assert [r["name"] for r in rows] == ["alpha", "beta", "gamma"]
        gates = lake_json("select subject, gate from tools_raw_rejected", env)
        assert gates == [{"subject": "tiny", "gate": "min_tools"}]
        objects = [o.object_name for o in s3_server.client().list_objects(s3_bucket, recursive=True)]
        assert any(o.startswith("lake/topic=tools.servers/date=") and o.endswith(".parquet") for o in objects)
        assert any(o.startswith("lancedb/tools.lance/") for o in objects)
        status = run_arena(["status"], env).stdout
        assert s3_server.secret_key not in status

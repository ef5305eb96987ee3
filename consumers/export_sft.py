"""`arena export sft`: the lake's ``samples.sft`` as a JSONL or Parquet file for HF ``datasets``.

Every message gets the same keys (role, content, tool_calls, tool_call_id,
name) and tool-call arguments stay JSON strings, as the OpenAI API sends
them, so Arrow infers one schema for all rows. ``tools`` is a JSON string:
tool parameter schemas differ per sample and have no common Arrow type.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from arena.versions import MAIN, wire
from lake.parquet import read_topic
from lake.store import ObjectStore

ExportFormat = Literal["jsonl", "parquet"]

_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
_MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.list_(_CALL)),
        ("tool_call_id", pa.string()),
        ("name", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("messages", pa.list_(_MESSAGE)),
        ("tools", pa.string()),
        ("role_target", pa.string()),
        ("source", pa.string()),
        ("reward", pa.float64()),
    ]
)


def normal_message(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls") or None
    if calls:
        calls = [
            {
                "id": c.get("id"),
                "type": c.get("type", "function"),
                "function": {
                    "name": c["function"]["name"],
                    "arguments": _as_json_text(c["function"].get("arguments", "{}")),
                },
            }
            for c in calls
        ]
    content = message.get("content")
    return {
        "role": message["role"],
        "content": content if content is None or isinstance(content, str) else json.dumps(content),
        "tool_calls": calls,
        "tool_call_id": message.get("tool_call_id"),
        "name": message.get("name"),
    }


def _as_json_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def sample_rows(store: ObjectStore, version: str = MAIN) -> list[dict[str, Any]]:
    """Valid ``samples.sft`` rows of data ``version`` in the lake, one per sample id, in a stable order."""
    table = read_topic(store, wire("samples.sft", version))
    rows: dict[str, dict[str, Any]] = {}
    for row in table.to_pylist():
        if not row.get("_valid", True):
            continue
        rows[row["sample_id"]] = {
            "sample_id": row["sample_id"],
            "messages": [normal_message(m) for m in json.loads(row["messages"])],
            "tools": row["tools"],
            "role_target": row["role_target"],
            "source": row["source"],
            "reward": row.get("reward"),
        }
    return [rows[k] for k in sorted(rows)]


def write_export(rows: list[dict[str, Any]], path: Path, fmt: ExportFormat) -> None:
    """Write atomically: a temp file in the target folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if fmt == "jsonl":
                for row in rows:
                    fh.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
            else:
                pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), fh)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export_sft(store: ObjectStore, path: Path, fmt: ExportFormat, version: str = MAIN) -> int:
    rows = sample_rows(store, version)
    write_export(rows, path, fmt)
    return len(rows)

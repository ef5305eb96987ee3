"""`arena demo`: the main job on the embedded default.

Publishes the bundled sample tool docs (good servers, servers the gates
reject, malformed files), runs every stage until drained, then prints what
landed where and how to look at it.
"""

from __future__ import annotations

import asyncio
from importlib.resources import files
from pathlib import Path

from rich.console import Console
from rich.table import Table

from arena.config import ArenaSettings
from arena.worker import run_workers
from lake.parquet import lake_listing
from lake.query import LakeQuery
from lake.store import open_store
from lake.tool_index import ToolIndex
from producers.publish_tools import publish_tool_docs
from streams.registry import WORKERS

EXAMPLE_QUERIES = (
    "select domain, count(*) as servers from tools_servers group by 1 order by 2 desc",
    "select gate, subject, reason from tools_raw_rejected order by gate",
    "select kind, reason from tools_raw_dlq",
)


DROP_REASONS = """
select 'tools.raw.rejected' as topic, gate as why, count(*) as n, min(subject || ': ' || reason) as example
from tools_raw_rejected group by gate
union all
select 'tools.raw.dlq', kind, count(*), min(reason) from tools_raw_dlq group by kind
order by 1, 2
"""


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sample_tools_dir() -> Path:
    return Path(str(files("arena") / "samples" / "tools"))


def run_demo(settings: ArenaSettings, bootstrap: str, *, console: Console, timeout_s: float) -> int:
    """``bootstrap`` must have every topic created (`arena.cli.ready_broker`)."""
    report = asyncio.run(publish_tool_docs(bootstrap, [sample_tools_dir()]))
    console.print(
        f"published {len(report.servers)} candidate servers to tools.raw; "
        f"{len(report.errors)} unreadable files/entries to tools.raw.dlq"
    )
    code = run_workers(
        settings, bootstrap, list(WORKERS), until_drained=True, timeout_s=timeout_s, console=console
    )
    if code != 0:
        console.print("[red]the stages did not drain; see the worker logs under $ARENA_HOME/logs[/red]")
        return code
    summarise(settings, console)
    return 0


def summarise(settings: ArenaSettings, console: Console) -> None:
    store = open_store(settings)
    counts = Table("topic", "rows", "files", title="lake contents")
    for item in lake_listing(store):
        if item.rows:
            counts.add_row(item.topic, str(item.rows), str(item.files))
    console.print(counts)

    reasons = Table("topic", "gate / kind", "records", "example reason", title="why records were dropped")
    for row in LakeQuery(store).query(DROP_REASONS).to_pylist():
        reasons.add_row(row["topic"], row["why"], str(row["n"]), _short(row["example"], 90))
    console.print(reasons)

    index = ToolIndex.from_settings(settings)
    view = settings.public_view()
    console.print(f"lake     {view['lake']}")
    console.print(f"lancedb  {view['lancedb']} ({index.count()} tool docs indexed)")
    console.print(f"catalog  {view['catalog']}")
    console.print("try:")
    for sql in EXAMPLE_QUERIES:
        console.print(f'  arena lake query "{sql}"')
    console.print("  arena lag")

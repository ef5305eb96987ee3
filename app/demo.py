"""`arena demo`: the main job on the embedded default.

Publishes the bundled sample tool docs (good servers, servers the gates
reject, malformed files), one QA seed per built-in knowledge base and every
built-in domain pack with synthesis declarations -- a retail order desk, a
dual-control phone desk, a bank desk full of refusals (EigenData phases 1-2 run
here, phase 3 seeds go to ``eigen.seeds``), runs every stage of the three tracks until
drained, then prints what landed where and how to look at it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from pathlib import Path

from rich.console import Console
from rich.table import Table

from app.registry import WORKERS
from app.stack import ServiceState, free_port, live_service, record_service
from app.worker import run_workers
from arena.config import ArenaSettings
from arena.records.envs import QaSeed
from arena.records.tools import McpEndpoint, RawToolServer
from arena.topics import TOPICS, topic
from lake.parquet import lake_listing
from lake.query import LakeQuery
from lake.store import open_store
from lake.tool_index import ToolIndex
from producers.builtin_knowledge import BUILTIN_DOMAINS, builtin_knowledge
from producers.knowledge import unconditional_seed
from producers.mcp_tools import fetch_mcp_server
from producers.publish import publish
from producers.publish_domain import publish_domain, resolve_pack
from producers.publish_qa import publish_seeds
from producers.publish_tools import outgoing, publish_tool_docs
from synthesis.eigen.packs import builtin_packs

EXAMPLE_QUERIES = (
    "select domain, count(*) as servers from tools_servers group by 1 order by 2 desc",
    "select tools, task from chains",
    "select mode, augmentation, text from tasks",
    "select trajectory_id, overall, scores from trajectories_scored order by overall",
    "select gate, count(*) from tasks_rejected group by 1",
    "select structure, count(*) as packages from envs_verified group by 1",
    "select gate, count(*) from qa_traces_rejected group by 1",
    "select prompt_set, iteration, metrics from eigen_pilot_metrics order by 1, 2",
    "select prompt_set, json_extract_string(payload, '$.split') as split, count(*) from eigen_verified group by 1, 2",
)

MCP_PACKAGE = "samples.mcp"
DEMO_DOMAIN = "customer_service"
"""The pack benchmarks publish alone; the demo publishes every one of ``demo_domains()``."""

SIDE_TOPICS = [spec.name for spec in TOPICS.values() if spec.side_of is not None]

TRACKS: tuple[str, ...] = ("sft", "env", "eigen")
"""The demo's tracks: ASTRA's SFT track, ASTRA's environment track, EigenData."""
_TRACK_OF_INPUT = {"tools.": "sft", "chains": "sft", "tasks": "sft", "trajectories": "sft", "qa.": "env"}
_TRACK_OF_INPUT |= {"envs.": "env", "eigen.": "eigen"}


def track_workers(tracks: tuple[str, ...]) -> list[str]:
    """The workers a demo of ``tracks`` runs: their stages (by input topic) and the lake sink."""
    chosen = []
    for name, worker in WORKERS.items():
        source = worker.inputs[0] if len(worker.inputs) == 1 else ""
        track = next((t for prefix, t in _TRACK_OF_INPUT.items() if source.startswith(prefix)), None)
        if track is None or track in tracks:  # the lake sink belongs to every track
            chosen.append(name)
    return chosen


def drop_reasons_sql(tables: list[str]) -> str:
    """Per side topic and gate (or dead-letter kind): how many records, and one example reason."""
    parts = []
    for name in SIDE_TOPICS:
        table = topic(name).table
        if table not in tables:
            continue
        if name.endswith(".rejected"):
            parts.append(
                f"select '{name}' as topic, gate as why, count(*) as n, "
                f"min(subject || ': ' || reason) as example from {table} group by gate"
            )
        else:
            parts.append(
                f"select '{name}' as topic, kind as why, count(*) as n, min(reason) as example "
                f"from {table} group by kind"
            )
    return " union all ".join(parts) + " order by 1, 2" if parts else ""


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sample_tools_dir() -> Path:
    return Path(str(files("samples") / "tools"))


@dataclass
class DemoMcp:
    """The bundled MCP servers as the demo deploys them: one over HTTP, one over stdio."""

    http: subprocess.Popen[bytes] | None
    """The HTTP server this call started; None when it reuses the stack's (``demo_mcp_service``)."""
    endpoints: dict[str, McpEndpoint]

    def stop(self) -> None:
        if self.http is not None and self.http.poll() is None:
            self.http.terminate()
            try:
                self.http.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.http.kill()


MCP_SERVICE = "demo-mcp-library"
"""The stack service name of the demo's deployed HTTP MCP server (``app.stack.ServiceState``)."""


def _endpoints(port: int, clock: datetime | None) -> dict[str, McpEndpoint]:
    notes = [sys.executable, "-m", f"{MCP_PACKAGE}.notes", "--transport", "stdio"]
    if clock is not None:
        notes += ["--clock", clock.isoformat()]
    return {
        "library": McpEndpoint(transport="http", url=f"http://127.0.0.1:{port}/mcp"),
        "notes": McpEndpoint(transport="stdio", command=notes),
    }


def _library_command(port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        f"{MCP_PACKAGE}.library",
        "--transport",
        "http",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]


def start_demo_mcp(log_dir: Path, port: int = 0, clock: datetime | None = None) -> DemoMcp:
    """Start the library server on loopback ``port`` (0: a free one) over HTTP; the notes server runs
    per session (stdio), on a logical clock started at ``clock`` when given. The caller stops it."""
    port = port or free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "mcp-library.log").open("ab") as log:
        http = subprocess.Popen(_library_command(port), stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    return DemoMcp(http, _endpoints(port, clock))


def demo_mcp_service(settings: ArenaSettings) -> DemoMcp:
    """The demo's deployed MCP servers as a stack service: running until `arena down`.

    Deployed means what it says: the tool docs published from it name its URL, so every later run
    over them (a worker restarted tomorrow, ``arena replay``) calls the same server. A live one from
    an earlier demo on this home is reused (same URL, same records).
    """
    live = live_service(settings, MCP_SERVICE)
    if live is not None:
        return DemoMcp(
            None, _endpoints(int(live.address.rsplit(":", 1)[1].split("/")[0]), settings.demo_mcp_clock)
        )
    port = settings.demo_mcp_port or free_port()
    log_dir = settings.home / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / "mcp-library.log").open("ab") as log:
        http = subprocess.Popen(
            _library_command(port),
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives the demo: `arena down` stops it
        )
    endpoints = _endpoints(port, settings.demo_mcp_clock)
    record_service(
        settings,
        ServiceState(
            name=MCP_SERVICE,
            pid=http.pid,
            pgid=http.pid,
            address=str(endpoints["library"].url),
            command=f"{MCP_PACKAGE}.library",
        ),
    )
    return DemoMcp(None, endpoints)


async def fetch_with_retry(endpoint: McpEndpoint, name: str, timeout_s: float = 180.0) -> RawToolServer:
    """tools/list of a server that may still be starting (a loaded 2-core box took over 60 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await fetch_mcp_server(endpoint, name)
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def publish_demo_inputs(bootstrap: str, mcp: DemoMcp) -> tuple[int, int, int]:
    """Sample tool docs plus the two deployed MCP servers; returns (docs, unreadable, deployed)."""
    report = await publish_tool_docs(bootstrap, [sample_tools_dir()])
    deployed = [await fetch_with_retry(ep, name) for name, ep in mcp.endpoints.items()]
    await publish(bootstrap, outgoing(deployed, []))
    return len(report.servers), len(report.errors), len(deployed)


def demo_seeds(settings: ArenaSettings) -> list[QaSeed]:
    """One unconditional seed per built-in knowledge base (hop budget 2)."""
    return [
        unconditional_seed(
            builtin_knowledge(domain, settings.seed),
            hop_budget=2,
            count=settings.envs.demo_instances,
            source=f"builtin:{domain}",
        )
        for domain in BUILTIN_DOMAINS
    ]


def run_demo(
    settings: ArenaSettings,
    bootstrap: str,
    *,
    console: Console,
    timeout_s: float,
    tracks: tuple[str, ...] = TRACKS,
) -> int:
    """``bootstrap`` must have every topic created (`app.cli.ready_broker`)."""
    mcp = demo_mcp_service(settings) if "sft" in tracks else None
    if mcp is not None:
        docs, unreadable, deployed = asyncio.run(publish_demo_inputs(bootstrap, mcp))
        console.print(
            f"published {docs} doc-only candidate servers and {deployed} deployed MCP servers to "
            f"tools.raw; {unreadable} unreadable files/entries to tools.raw.dlq"
        )
    if "env" in tracks:
        seeds = demo_seeds(settings)
        asyncio.run(publish_seeds(bootstrap, seeds))
        console.print(
            f"published {len(seeds)} QA seeds to qa.seeds ({', '.join(BUILTIN_DOMAINS)}; "
            f"{settings.envs.demo_instances} instances each)"
        )
    if "eigen" in tracks:
        _publish_domain(settings, bootstrap, console)
    code = run_workers(
        settings,
        bootstrap,
        track_workers(tracks),
        until_drained=True,
        timeout_s=timeout_s,
        console=console,
    )
    if code != 0:
        console.print("[red]the stages did not drain; see the worker logs under $ARENA_HOME/logs[/red]")
        return code
    summarise(settings, console)
    if mcp is not None:
        console.print(
            f"the demo's deployed MCP server keeps serving at {mcp.endpoints['library'].url} for later "
            "runs over its tools (`arena replay`, restarted workers); `arena down` stops it"
        )
    return 0


def demo_domains() -> list[str]:
    """The bundled domain packs the demo seeds: every one that declares its synthesis."""
    return [name for name in builtin_packs() if resolve_pack(name).synthesis is not None]


def _publish_domain(settings: ArenaSettings, bootstrap: str, console: Console) -> None:
    """Every bundled domain pack: EigenData phases 1-2 here, phase 3 seeds to ``eigen.seeds``."""
    for name in demo_domains():
        publication = asyncio.run(publish_domain(settings, bootstrap, resolve_pack(name)))
        piloted = ", ".join(
            f"{s.set_id} {'converged' if s.converged else 'not converged'} in {s.iterations}"
            for s in publication.sets
        )
        console.print(
            f"published domain pack {publication.domain!r}: {len(publication.sets)} prompt sets piloted "
            f"({piloted} iterations; {publication.pilot_records} records to eigen.pilot.metrics), "
            f"{publication.seeds} seeds to eigen.seeds"
        )


def summarise(settings: ArenaSettings, console: Console) -> None:
    store = open_store(settings)
    counts = Table("topic", "rows", "files", title="lake contents")
    for item in lake_listing(store):
        if item.rows:
            counts.add_row(item.topic, str(item.rows), str(item.files))
    console.print(counts)

    query = LakeQuery(store)
    sql = drop_reasons_sql(query.tables())
    reasons = Table("topic", "gate / kind", "records", "example reason", title="why records were dropped")
    for row in query.query(sql).to_pylist() if sql else []:
        reasons.add_row(row["topic"], row["why"], str(row["n"]), _short(row["example"], 90))
    console.print(reasons)
    print_rewards(query, console)
    print_environments(query, console)
    print_eigen(query, console)

    index = ToolIndex.from_settings(settings)
    view = settings.public_view()
    console.print(f"lake     {view['lake']}")
    console.print(f"lancedb  {view['lancedb']} ({index.count()} tool docs indexed)")
    console.print(f"catalog  {view['catalog']}")
    console.print(f"llm      {view['llm']} (outputs are labelled with the backend in lineage headers)")
    console.print("try:")
    for sql in EXAMPLE_QUERIES:
        console.print(f'  arena lake query "{sql}"')
    console.print("  arena export sft --format jsonl sft.jsonl")
    console.print("  arena env show ENV_ID; arena env verify ENV_ID")
    console.print("  arena eigen sets; arena eigen critiques SET_ID")
    console.print("  arena lag")


REWARD_SQL = """
select count(*) as n, avg(overall) as overall,
  avg(cast(json_extract(scores, '$.QU') as double)) as QU, avg(cast(json_extract(scores, '$.QP') as double)) as QP,
  avg(cast(json_extract(scores, '$.TCU') as double)) as TCU, avg(cast(json_extract(scores, '$.TCP') as double)) as TCP,
  avg(cast(json_extract(scores, '$.TCS') as double)) as TCS, avg(cast(json_extract(scores, '$.TC') as double)) as TC,
  avg(cast(json_extract(scores, '$.FA') as double)) as FA
from trajectories_scored where _valid
"""


def print_rewards(query: LakeQuery, console: Console) -> None:
    """Mean of each reward dimension over the scored trajectories (ASTRA §2.1.5)."""
    if "trajectories_scored" not in query.tables():
        return
    row = query.query(REWARD_SQL).to_pylist()[0]
    if not row["n"]:
        return
    names = ["overall", "QU", "QP", "TCU", "TCP", "TCS", "TC", "FA"]
    table = Table("trajectories", *names, title="7-dimension reward (means)")
    table.add_row(str(row["n"]), *[f"{row[k]:.2f}" for k in names])
    console.print(table)


ENVS_SQL = """
select structure, count(*) as packages, sum(json_array_length(jobs)) as jobs,
  sum(tools_before_merge) as tools_before, sum(json_array_length(tools)) as tools_after,
  min(env_id) as example
from envs_verified where _valid group by 1 order by 1
"""


def print_environments(query: LakeQuery, console: Console) -> None:
    """Verified environment packages per structure, with the tool counts merging saved (ASTRA §2.2.4)."""
    if "envs_verified" not in query.tables():
        return
    table = Table(
        "structure",
        "packages",
        "jobs",
        "tools before merging",
        "after",
        "example env_id",
        title="verified environments",
    )
    for row in query.query(ENVS_SQL).to_pylist():
        table.add_row(
            row["structure"],
            str(row["packages"]),
            str(row["jobs"]),
            str(row["tools_before"]),
            str(row["tools_after"]),
            row["example"],
        )
    console.print(table)


EIGEN_TOPICS = (
    "eigen.seeds",
    "eigen.intents",
    "eigen.tasks",
    "eigen.dialogs",
    "eigen.dialogs.validated",
    "eigen.verified",
)


def print_eigen(query: LakeQuery, console: Console) -> None:
    """Items per EigenData stage, and how many each gate rejected (EigenData §4.2)."""
    tables = set(query.tables())
    if topic("eigen.seeds").table not in tables:
        return
    table = Table("topic", "items", "dropped by its reader", title="EigenData track")
    for name in EIGEN_TOPICS:
        spec = topic(name)
        items = (
            query.query(f"select count(*) as n from {spec.table}").to_pylist()[0]["n"]
            if spec.table in tables
            else 0
        )
        rejected_table = topic(spec.rejected).table
        rejected = (
            query.query(f"select count(*) as n from {rejected_table}").to_pylist()[0]["n"]
            if rejected_table in tables
            else 0
        )
        table.add_row(name, str(items), str(rejected))
    console.print(table)

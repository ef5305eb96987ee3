"""Stage ``tools.raw -> tools.servers`` (ASTRA §2.1.1): normalise, group, filter.

Each ``tools.raw`` record is one candidate server. Its tools are converted to
the OpenAI tool schema (``synthesis.tools.normalize``), tools failing a gate are
dropped with a reason, servers left with fewer than three tools are rejected,
and survivors get a domain from the fixed taxonomy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from arena.records.tools import NormalizedTool, RawToolServer, ToolServer
from streams.runtime import Context, Emit, StageDef
from synthesis.sft.domains import classify_domain
from synthesis.tools.normalize import GateDrop, normalize_server, server_gate, server_id

STAGE_VERSION = "1"


def domain_text(name: str, tools: list[NormalizedTool]) -> str:
    """The text a server is classified by: its name and its tools' names and descriptions."""
    parts = [name] + [f"{t.function.name}: {t.function.description[:300]}" for t in tools]
    return "\n".join(parts)[:4000]


def build_server(raw: RawToolServer, ctx: Context) -> list[Emit]:
    """Pure(ish) core of the stage: CPU-bound, so the handler runs it in a thread."""
    outcome = normalize_server(raw, max_description_bytes=ctx.settings.max_description_bytes)
    emits = [_reject(ctx, drop) for drop in outcome.rejections]
    gate = server_gate(raw.server, outcome.tools)
    if gate is not None:
        emits.append(_reject(ctx, gate))
        return emits
    match = classify_domain([domain_text(raw.server, outcome.tools)])
    server = ToolServer(
        server_id=server_id(raw.server, outcome.tools),
        name=raw.server,
        source=raw.source,
        format=raw.format,
        domain=match.domain,
        domain_score=round(float(match.score), 6),
        tools=outcome.tools,
        dropped_tools=outcome.dropped_tools,
        endpoint=raw.endpoint,
    )
    emits.append(Emit("tools.servers", server.server_id, server, (ctx.source_key,)))
    return emits


def _reject(ctx: Context, drop: GateDrop) -> Emit:
    return ctx.reject(drop.gate, drop.subject, drop.reason, details=drop.details, record=drop.record)


async def handle(record: RawToolServer, ctx: Context) -> Sequence[Emit]:
    return await asyncio.to_thread(build_server, record, ctx)


STAGE = StageDef(
    name="tools-servers",
    input="tools.raw",
    input_model=RawToolServer,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("tools.servers",),
    description="normalise tool docs to the OpenAI schema, drop weak tools and small servers, assign domains",
)

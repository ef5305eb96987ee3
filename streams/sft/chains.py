"""Stage ``tools.servers -> chains`` (ASTRA §2.1.2): tool-chain construction.

Per server:

1. joint (task, chain) synthesis, ``sft.chain_syntheses`` times;
2. every synthesised chain joins the server's weighted transition graph,
   which persists in the catalog and keeps growing as chains arrive; a record walks the
   chains recorded before it was published plus its own (deterministic when handled again);
3. length-bounded, weight-biased random walks on the whole graph are the
   candidate chains;
4. each candidate gets a chain-conditioned task and must pass dependency
   verification (every required argument is stated by the task or provided by
   an earlier tool's output) and task-chain coherence. Failures go to
   ``chains.rejected`` with the check that failed.

The syntheses of step 1 are independent of each other, and so are the candidates of step 4:
each step asks all of its calls at once (``synthesis.fanout``) and emits in variant / walk
order, as one call after another would.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from arena.hashing import content_hash
from arena.llm.core import Answer, InvalidOutput
from arena.llm.gateway import Gateway
from arena.records.sft import ServerRef, ToolChain
from arena.records.tools import ToolServer
from streams.resources import chain_graphs_for, gateway_for
from streams.runtime import Context, Emit, StageDef, llm_lineage
from synthesis.fanout import map_ordered
from synthesis.sft.chain_graph import Walk
from synthesis.sft.roles.chains import (
    CHAIN_COHERENCE,
    CHAIN_SYNTHESIS,
    TASK_FROM_CHAIN,
    ChainSynthesisInput,
    ChainTaskInput,
    CoherenceInput,
    SynthesizedChain,
)
from synthesis.sft.tool_links import failed, verify_dependencies

STAGE_VERSION = "1"


def chain_id(server_id: str, tools: Sequence[str]) -> str:
    return content_hash({"server": server_id, "tools": list(tools)}, prefix="ch-", length=24)


async def synthesise(gw: Gateway, server: ServerRef, ctx: Context) -> tuple[list[list[str]], list[Emit]]:
    """Joint (task, chain) syntheses, asked at once; chains naming tools the server lacks are rejected."""
    cfg = ctx.settings.sft
    names = {t.function.name for t in server.tools}

    async def ask(variant: int) -> Answer[SynthesizedChain] | InvalidOutput:
        inputs = ChainSynthesisInput(server=server, max_length=cfg.max_chain_length, variant=variant)
        try:
            return await gw.call(CHAIN_SYNTHESIS, inputs)
        except InvalidOutput as exc:
            return exc

    chains: list[list[str]] = []
    emits: list[Emit] = []
    answers = await map_ordered(ask, range(cfg.chain_syntheses))
    for variant, answer in enumerate(answers):
        if isinstance(answer, InvalidOutput):
            emits.append(ctx.llm_dead_letter(answer, f"chain_synthesis variant {variant}"))
            continue
        chain = answer.output.chain
        unknown = [t for t in chain if t not in names]
        if unknown or not chain:
            emits.append(
                ctx.reject(
                    "unknown_tool" if unknown else "empty_chain",
                    f"{server.name}/synthesis/{variant}",
                    f"synthesised chain uses tools the server does not have: {unknown}"
                    if unknown
                    else "synthesised chain is empty",
                    details={"chain": chain, "server_tools": sorted(names)},
                    candidate_of="chains",
                )
            )
            continue
        chains.append(chain)
    return chains, emits


async def verify_walk(gw: Gateway, server: ServerRef, walk: Walk, graph_chains: int, ctx: Context) -> Emit:
    """A chain-conditioned task for the walk, then dependency and coherence checks."""
    tools = [t for name in walk.tools if (t := server.tool(name)) is not None]
    cid = chain_id(server.server_id, walk.tools)
    subject = f"{server.name}/{'>'.join(walk.tools)}"
    try:
        task = await gw.call(TASK_FROM_CHAIN, ChainTaskInput(server=server, chain=walk.tools, variant=0))
        deps = verify_dependencies(tools, task.output.text, task.output.slots)
        missing = failed(deps)
        if missing:
            return ctx.reject(
                "dependency",
                subject,
                "required arguments supported by neither the task nor an earlier output: "
                + ", ".join(f"{d.tool}.{d.argument}" for d in missing),
                details=_details(walk, deps, task.output.text),
                candidate_of="chains",
            )
        verdict = await gw.call(CHAIN_COHERENCE, CoherenceInput(task=task.output.text, chain=tools))
    except InvalidOutput as exc:
        return ctx.llm_dead_letter(exc, f"chain {subject}")
    if not verdict.output.coherent:
        return ctx.reject(
            "coherence",
            subject,
            f"task and chain are not coherent: {verdict.output.reason}",
            details=_details(walk, deps, task.output.text),
            candidate_of="chains",
        )
    record = ToolChain(
        chain_id=cid,
        server=server,
        tools=walk.tools,
        origin="random_walk",
        task=task.output.text,
        slots=task.output.slots,
        dependencies=deps,
        walk_weight=walk.weight,
        graph_chains=graph_chains,
    )
    answers: list[Answer[Any]] = [task, verdict]
    return Emit("chains", cid, record, (ctx.source_key,), **llm_lineage(answers))


def _details(walk: Walk, deps: Sequence[Any], task: str) -> dict[str, Any]:
    return {"chain": walk.tools, "task": task, "dependencies": [d.model_dump() for d in deps]}


async def handle(record: ToolServer, ctx: Context) -> Sequence[Emit]:
    cfg = ctx.settings.sft
    gw = gateway_for(ctx.settings)
    store = chain_graphs_for(ctx.settings)
    server = ServerRef.of(record)
    synthesised, emits = await synthesise(gw, server, ctx)
    for chain in synthesised:
        await asyncio.to_thread(store.add, server.name, chain_id(server.server_id, chain), chain)
    names = [t.function.name for t in server.tools]
    # The history of earlier versions recorded before this record was published, plus its own
    # chains: never the chains of versions handled beside it, so handling it again walks the same graph.
    graph = await asyncio.to_thread(store.load, server.name, names, ctx.record_time)
    for chain in synthesised:
        graph.add_chain(chain_id(server.server_id, chain), chain)
    rng = random.Random(content_hash([ctx.settings.seed, server.server_id]))
    walks = graph.random_walks(
        rng,
        cfg.walks,
        min_length=cfg.min_chain_length,
        max_length=cfg.max_chain_length,
        acyclic=cfg.acyclic_walks,
    )
    if not walks:
        # Every synthesised chain may be too short (or the graph empty): say so, or the record
        # would end with LLM calls spent and nothing to show for them.
        emits.append(no_walk(ctx, server, synthesised, graph.chain_count, len(graph.edges)))
        return emits
    # Walks are drawn above, before any call; each candidate's task and checks are independent of
    # the others', so they run at once (emits keep walk order).
    emits += await map_ordered(lambda walk: verify_walk(gw, server, walk, graph.chain_count, ctx), walks)
    return emits


def no_walk(ctx: Context, server: ServerRef, synthesised: list[list[str]], chains: int, edges: int) -> Emit:
    """The rejection of a server whose transition graph gave no walk of an allowed length."""
    cfg = ctx.settings.sft
    lengths = sorted(len(chain) for chain in synthesised)
    return ctx.reject(
        "no_walk",
        server.name,
        f"no walk of {cfg.min_chain_length}-{cfg.max_chain_length} tools on the transition graph "
        f"({chains} chains, {edges} edges); this record's {cfg.chain_syntheses} syntheses gave "
        f"{len(synthesised)} usable chains of lengths {lengths}",
        details={"synthesised": synthesised, "graph_chains": chains, "graph_edges": edges},
        candidate_of="chains",
    )


STAGE = StageDef(
    name="chains",
    input="tools.servers",
    input_model=ToolServer,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("chains",),
    description="synthesise (task, chain) pairs, grow the transition graph, walk it, verify candidates",
    dedupe=True,
)

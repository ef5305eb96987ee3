"""Stage ``eigen.seeds -> eigen.intents``: RandomPool and UserIntent (EigenData §4.2).

A seed names a published pack, a database seed, a scenario seed and the prompt set (phase 3)
that draws it. RandomPool draws persona, environment context and difficulty factors with the
set's parameters; UserIntent turns the draw into a task on the database slice it names. A set
the phase-3 audit sent back to phase 2 is piloted again first (``synthesis.eigen.audit.repilot``);
its per-iteration metrics go to ``eigen.pilot.metrics`` with the item.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from arena.llm.roles.user_sim import user_behaviour
from arena.llm.routing import budget_for
from arena.records.eigen import EigenIntent, EigenSeed, IntentPayload
from streams.resources import eigen_store_for, gateway_for, sandbox_pool_for
from streams.runtime import Context, Emit, StageDef
from synthesis.eigen.agents import domain_summary, entities_within, entity_refs, user_intent_input
from synthesis.eigen.audit import repilot
from synthesis.eigen.evolution import PILOT_TOPIC, pilot_key
from synthesis.eigen.items import lineage_of, make_item, open_item
from synthesis.eigen.roles.tasks import EIGEN_RANDOM_POOL, EIGEN_USER_INTENT, EntityRef, RandomPoolInput

STAGE_VERSION = "1"
ROLES = (EIGEN_RANDOM_POOL.name, EIGEN_USER_INTENT.name)


async def handle(record: EigenSeed, ctx: Context) -> Sequence[Emit]:
    store = eigen_store_for(ctx.settings)
    work = await open_item(ctx.settings, store, record)
    scenario, pack, state, prompt_set = work.scenario, work.pack, work.state, work.prompt_set
    gateway = gateway_for(ctx.settings)
    emits: list[Emit] = []
    if work.phase == 2:  # the phase-3 audit found drift: optimise again before drawing more
        prompt_set, metrics = await repilot(
            prompt_set,
            gateway=gateway,
            runner=await sandbox_pool_for(ctx.settings),
            pack=pack,
            state=state,
            store=store,
            cfg=ctx.settings.eigen,
            timeout_s=ctx.settings.sandbox.timeout_s,
            behaviour=user_behaviour(ctx.settings),
        )
        emits += [Emit(PILOT_TOPIC, pilot_key(m), m, (ctx.source_key,)) for m in metrics]
    domain = domain_summary(pack, state)
    pool_role = prompt_set.role(EIGEN_RANDOM_POOL)
    budget = budget_for(ctx.settings, EIGEN_RANDOM_POOL.name)

    def fits(entities: list[EntityRef]) -> bool:
        inputs = RandomPoolInput(
            domain=domain, seed=scenario.seed, params=prompt_set.params, entities=entities
        )
        return budget.fits(pool_role.messages(inputs))

    entities, cut = await asyncio.to_thread(entities_within, entity_refs(state), fits, scenario.seed)
    draw_input = RandomPoolInput(
        domain=domain, seed=scenario.seed, params=prompt_set.params, entities=entities
    )
    draw = (await gateway.call(pool_role, draw_input)).output
    intent_input = await asyncio.to_thread(user_intent_input, pack, state, draw, domain)
    intent = (await gateway.call(prompt_set.role(EIGEN_USER_INTENT), intent_input)).output
    body = IntentPayload(
        scenario=scenario.model_copy(update={"set_version": prompt_set.version}),
        draw=draw,
        intent=intent,
        context_cut=[f"{EIGEN_RANDOM_POOL.name}: {cut} of {cut + len(entities)} database entities left out"]
        * bool(cut),
    )
    item = make_item(EigenIntent, record, body, domain=pack.name, prompt_set=prompt_set.set_id)
    emits.append(
        Emit("eigen.intents", item.item_id, item, (ctx.source_key,), **lineage_of(prompt_set, ROLES))
    )
    return emits


STAGE = StageDef(
    name="eigen-intents",
    input="eigen.seeds",
    input_model=EigenSeed,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("eigen.intents", PILOT_TOPIC),
    description="EigenData RandomPool + UserIntent: a task per seed with its prompt set (re-pilots drifted sets)",
    dedupe=True,
)

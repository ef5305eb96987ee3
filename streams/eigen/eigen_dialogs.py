"""Stage ``eigen.tasks -> eigen.dialogs``: DialogSynthesis (EigenData §4.2).

The UserSimulator (instructed by the task, with stop / transfer / out-of-scope signals) and the
TrajectoryAgent (the pack's policy and agent tools) talk; every agent and user tool call runs in
the sandbox against the dialogue's own copy of the database (``synthesis.eigen.dialog_synthesis``).
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.llm.roles.user_sim import USER_SIMULATOR, user_behaviour
from arena.records.eigen import DialogPayload, EigenDialog, EigenTask
from streams.resources import eigen_store_for, gateway_for, sandbox_pool_for
from streams.runtime import Context, Emit, StageDef
from synthesis.eigen.dialog_loop import synthesize_dialog
from synthesis.eigen.items import lineage_of, make_item, open_item
from synthesis.eigen.roles.dialogs import EIGEN_TRAJECTORY_AGENT

STAGE_VERSION = "1"
ROLES = (EIGEN_TRAJECTORY_AGENT.name, USER_SIMULATOR.name)


async def handle(record: EigenTask, ctx: Context) -> Sequence[Emit]:
    work = await open_item(ctx.settings, eigen_store_for(ctx.settings), record)
    task = work.body
    dialog = await synthesize_dialog(
        work.pack,
        task.intent,
        work.state,
        work.prompt_set.gateway(gateway_for(ctx.settings)),  # agent and user with the set's prompts
        await sandbox_pool_for(ctx.settings),
        max_turns=ctx.settings.eigen.max_turns,
        timeout_s=ctx.settings.sandbox.timeout_s,
        behaviour=user_behaviour(ctx.settings),
    )
    body = DialogPayload(
        scenario=task.scenario, intent=task.intent, task_repair_rounds=task.repair_rounds, dialog=dialog
    )
    item = make_item(EigenDialog, record, body, domain=record.domain, prompt_set=record.prompt_set)
    return [
        Emit("eigen.dialogs", item.item_id, item, (ctx.source_key,), **lineage_of(work.prompt_set, ROLES))
    ]


STAGE = StageDef(
    name="eigen-dialogs",
    input="eigen.tasks",
    input_model=EigenTask,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("eigen.dialogs",),
    description="EigenData DialogSynthesis: user simulator and trajectory agent, every call in the sandbox",
    dedupe=True,
)

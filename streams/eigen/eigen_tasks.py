"""Stage ``eigen.intents -> eigen.tasks``: TaskValidation with Modify repair (EigenData §4.2).

The feasibility probe executes the task's reads and dry-runs its writes in the sandbox against a
copy of the database (``synthesis.eigen.agents.probe_task``); an INFEASIBLE task is repaired by
Modify and validated again, at most ``eigen.max_repair_rounds`` times, then rejected to
``eigen.intents.rejected`` with the last verdict's reasons. Each item's repair rounds and schema
problems are phase-3 audit figures of its prompt set.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.records.eigen import EigenIntent, EigenTask, TaskPayload
from streams.resources import eigen_store_for, gateway_for, sandbox_pool_for
from streams.runtime import Context, Emit, StageDef
from synthesis.eigen.agents import static_problems, validate_with_repair
from synthesis.eigen.audit import record_and_audit
from synthesis.eigen.items import lineage_of, make_item, open_item
from synthesis.eigen.roles.tasks import EIGEN_MODIFY, EIGEN_TASK_VALIDATION

STAGE_VERSION = "1"
GATE = "task_validation"
ROLES = (EIGEN_TASK_VALIDATION.name, EIGEN_MODIFY.name)


async def handle(record: EigenIntent, ctx: Context) -> Sequence[Emit]:
    store = eigen_store_for(ctx.settings)
    work = await open_item(ctx.settings, store, record)
    body, pack, state = work.body, work.pack, work.state
    outcome = await validate_with_repair(
        body.intent,
        gateway=work.prompt_set.gateway(gateway_for(ctx.settings)),  # every role with the set's prompt
        runner=await sandbox_pool_for(ctx.settings),
        pack=pack,
        state=state,
        # the set's workflow decides whether Modify repairs an infeasible task
        max_rounds=ctx.settings.eigen.max_repair_rounds if work.prompt_set.plan.runs("Modify") else 0,
        timeout_s=ctx.settings.sandbox.timeout_s,
    )
    await record_and_audit(
        store,
        ctx.settings.eigen,
        set_id=record.prompt_set,
        stage=STAGE.name,
        item_id=record.item_id,
        version=body.scenario.set_version,
        figures={
            "repair_rounds": float(outcome.rounds),
            "schema_errors": float(len(static_problems(pack, body.intent))),
            "infeasible": float(outcome.verdicts[0].status == "INFEASIBLE"),
        },
    )
    if not outcome.accepted:
        return [
            ctx.reject(
                GATE,
                record.item_id,
                outcome.reason or "infeasible",
                details={
                    "rounds": outcome.rounds,
                    "reasons": [r for v in outcome.verdicts for r in v.reasons],
                    "repairs": [[e.model_dump(mode="json") for e in edits] for edits in outcome.repairs],
                },
                record=record.model_dump(mode="json"),
            )
        ]
    task = TaskPayload(
        scenario=body.scenario,
        intent=outcome.final_intent,
        plan=outcome.plan,
        repair_rounds=outcome.rounds,
        first_reasons=outcome.verdicts[0].reasons if outcome.rounds else [],
        repairs=outcome.repairs,
    )
    item = make_item(EigenTask, record, task, domain=record.domain, prompt_set=record.prompt_set)
    return [Emit("eigen.tasks", item.item_id, item, (ctx.source_key,), **lineage_of(work.prompt_set, ROLES))]


STAGE = StageDef(
    name="eigen-tasks",
    input="eigen.intents",
    input_model=EigenIntent,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("eigen.tasks",),
    description="EigenData TaskValidation (sandbox feasibility probe) with at most 3 Modify repair rounds",
    dedupe=True,
)

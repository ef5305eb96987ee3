"""Stage ``eigen.dialogs -> eigen.dialogs.validated``: TrajectoryValidation with Modify (§4.2).

Schema validity, grounding of claims in tool outputs, goal completion, realism and policy
compliance, then the TrajectoryValidation role on that evidence and the paper's pass / fail rule
(``synthesis.eigen.dialog_synthesis.judge_dialog``). A failing dialogue is repaired (goals never achieved
are dropped from the task by Modify) and synthesized again, at most ``eigen.max_repair_rounds``
times, then rejected to ``eigen.dialogs.rejected`` with the reasons. Realism, quality and repair
rounds are phase-3 audit figures of the item's prompt set.
"""

from __future__ import annotations

from collections.abc import Sequence

from arena.llm.roles.user_sim import user_behaviour
from arena.records.eigen import EigenDialog, EigenValidated, ValidatedPayload
from streams.resources import eigen_store_for, gateway_for, sandbox_pool_for
from streams.runtime import Context, Emit, StageDef
from synthesis.eigen.audit import record_and_audit
from synthesis.eigen.dialog_synthesis import validate_with_dialog_repair
from synthesis.eigen.items import lineage_of, make_item, open_item
from synthesis.eigen.roles.dialogs import EIGEN_TRAJECTORY_VALIDATION
from synthesis.eigen.roles.tasks import EIGEN_MODIFY

STAGE_VERSION = "1"
GATE = "trajectory_validation"
ROLES = (EIGEN_TRAJECTORY_VALIDATION.name, EIGEN_MODIFY.name)


async def handle(record: EigenDialog, ctx: Context) -> Sequence[Emit]:
    store = eigen_store_for(ctx.settings)
    work = await open_item(ctx.settings, store, record)
    body = work.body
    outcome = await validate_with_dialog_repair(
        work.pack,
        body.intent,
        body.dialog,
        work.state,
        work.prompt_set.gateway(gateway_for(ctx.settings)),  # every role with the set's prompt
        await sandbox_pool_for(ctx.settings),
        max_rounds=ctx.settings.eigen.max_repair_rounds if work.prompt_set.plan.runs("Modify") else 0,
        max_turns=ctx.settings.eigen.max_turns,
        timeout_s=ctx.settings.sandbox.timeout_s,
        behaviour=user_behaviour(ctx.settings),
    )
    ratings = outcome.verdict.ratings
    await record_and_audit(
        store,
        ctx.settings.eigen,
        set_id=record.prompt_set,
        stage=STAGE.name,
        item_id=record.item_id,
        version=body.scenario.set_version,
        figures={
            "realism": ratings["realism"].score,
            "quality": sum(r.score for r in ratings.values()) / len(ratings),
            "dialog_repair_rounds": float(outcome.rounds),
        },
    )
    if not outcome.accepted:
        return [
            ctx.reject(
                GATE,
                record.item_id,
                outcome.reason or "failed validation",
                details={
                    "rounds": outcome.rounds,
                    "ratings": {c: r.rating for c, r in ratings.items()},
                    "issues": [i.model_dump(mode="json") for i in outcome.verdict.issues[:20]],
                },
                record=record.model_dump(mode="json"),
            )
        ]
    validated = ValidatedPayload(
        scenario=body.scenario,
        intent=outcome.intent,
        dialog=outcome.dialog,
        verdict=outcome.verdict,
        judged=outcome.judged,
        repair_rounds=outcome.rounds,
        task_repair_rounds=body.task_repair_rounds,
    )
    item = make_item(EigenValidated, record, validated, domain=record.domain, prompt_set=record.prompt_set)
    return [
        Emit(
            "eigen.dialogs.validated",
            item.item_id,
            item,
            (ctx.source_key,),
            **lineage_of(work.prompt_set, ROLES),
        )
    ]


STAGE = StageDef(
    name="eigen-dialogs-validated",
    input="eigen.dialogs",
    input_model=EigenDialog,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("eigen.dialogs.validated",),
    description="EigenData TrajectoryValidation (schema, grounding, goal, realism, policy) with Modify repair",
    dedupe=True,
)

"""Stages ``chains -> tasks`` and ``tools.servers -> tasks`` (ASTRA §2.1.3).

T(s) = T_chain(s) ∪ T_server(s): chain-conditioned tasks come from verified
chains, server-only tasks from the server specification alone. Every
original task is augmented along the configured axes (diversity, complexity,
persona); a variant whose language differs from its original is dropped
(lang(t~) = lang(t)). Originals and variants are then scored on question
quality, scenario realism and tool-use necessity and kept only when all three
reach their thresholds (eq. 1). Drops go to ``tasks.rejected`` with the gate.

Within a record, independent calls run at once (``synthesis.fanout``): the server-only
originals, the augmentations of every original, then the scores of every candidate; emits keep
the order one call after another gave them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from arena.config import SftSettings
from arena.hashing import content_hash
from arena.llm.core import Answer, InvalidOutput
from arena.llm.gateway import Gateway
from arena.records.sft import AugmentAxis, ServerRef, Task, ToolChain
from arena.records.tools import ToolServer
from streams.resources import gateway_for
from streams.runtime import Context, Emit, StageDef, llm_lineage
from synthesis.fanout import map_ordered
from synthesis.sft.lang import detect_language
from synthesis.sft.roles.chains import TASK_FROM_CHAIN, ChainTaskInput, TaskDraft
from synthesis.sft.roles.tasks import (
    AUGMENT_TASK,
    SCORE_TASK,
    TASK_FROM_SERVER,
    AugmentedTask,
    AugmentInput,
    ServerTaskInput,
    TaskScoreInput,
)

STAGE_VERSION = "1"


@dataclass
class Candidate:
    """A task before scoring, with the answers that produced it (for lineage)."""

    task: Task
    answers: list[Answer[Any]]


def task_id(server_id: str, text: str) -> str:
    return content_hash({"server": server_id, "text": text}, prefix="task-", length=24)


def original(server: ServerRef, text: str, mode: Literal["chain", "server"], chain: ToolChain | None) -> Task:
    return Task(
        task_id=task_id(server.server_id, text),
        server=server,
        chain_id=chain.chain_id if chain else None,
        chain=chain.tools if chain else [],
        text=text,
        language=detect_language(text),
        mode=mode,
    )


async def augment(
    gw: Gateway, base: Candidate, axes: Sequence[AugmentAxis], ctx: Context
) -> tuple[list[Candidate], list[Emit]]:
    """One variant per axis, the axes asked at once; variants that change the language are rejected."""
    parent = base.task

    async def ask(axis: AugmentAxis) -> Answer[AugmentedTask] | InvalidOutput:
        inputs = AugmentInput(
            task=parent.text, language=parent.language, axis=axis, tools=parent.server.tools, variant=0
        )
        try:
            return await gw.call(AUGMENT_TASK, inputs)
        except InvalidOutput as exc:
            return exc

    distinct = list(dict.fromkeys(axes))  # an axis listed twice is asked once (the cache would answer)
    answers = dict(zip(distinct, await map_ordered(ask, distinct), strict=True))
    kept: list[Candidate] = []
    emits: list[Emit] = []
    for axis in axes:
        answer = answers[axis]
        if isinstance(answer, InvalidOutput):
            emits.append(ctx.llm_dead_letter(answer, f"augment {axis} of {parent.task_id}"))
            continue
        text = answer.output.text.strip()
        language = detect_language(text)
        if language != parent.language:
            emits.append(
                ctx.reject(
                    "language_drift",
                    f"{parent.task_id}/{axis}",
                    f"{axis} variant is in {language!r}, the original in {parent.language!r}",
                    details={"original": parent.text, "variant": text},
                    candidate_of="tasks",
                )
            )
            continue
        variant = parent.model_copy(
            update={
                "task_id": task_id(parent.server.server_id, text),
                "text": text,
                "language": language,
                "augmentation": axis,
                "parent_task_id": parent.task_id,
                "persona": answer.output.persona,
            }
        )
        kept.append(Candidate(variant, [*base.answers, answer]))
    return kept, emits


def below_thresholds(scores: dict[str, float], cfg: SftSettings) -> list[str]:
    """Eq. (1): every score must reach its threshold."""
    thresholds = {
        "question_quality": cfg.theta_question_quality,
        "scenario_realism": cfg.theta_scenario_realism,
        "tool_necessity": cfg.theta_tool_necessity,
    }
    return [
        f"{name} {scores[name]:.2f} < {theta:.2f}"
        for name, theta in thresholds.items()
        if scores[name] < theta
    ]


async def score_and_gate(gw: Gateway, cand: Candidate, ctx: Context) -> Emit:
    task = cand.task
    try:
        answer = await gw.call(SCORE_TASK, TaskScoreInput(task=task.text, tools=task.server.tools))
    except InvalidOutput as exc:
        return ctx.llm_dead_letter(exc, f"score {task.task_id}")
    out = answer.output
    scores = {
        "question_quality": out.question_quality,
        "scenario_realism": out.scenario_realism,
        "tool_necessity": out.tool_necessity,
    }
    failures = below_thresholds(scores, ctx.settings.sft)
    if failures:
        return ctx.reject(
            "task_score",
            task.task_id,
            "; ".join(failures) + f" ({out.rationale})",
            details={
                "scores": scores,
                "text": task.text,
                "mode": task.mode,
                "augmentation": task.augmentation,
            },
            candidate_of="tasks",
        )
    scored = task.model_copy(update={"scores": scores})
    return Emit("tasks", task.task_id, scored, (ctx.source_key,), **llm_lineage([*cand.answers, answer]))


async def finish(gw: Gateway, originals: list[Candidate], ctx: Context) -> list[Emit]:
    """Augment every original, then score and gate originals and variants alike.

    The originals are augmented at once, then every distinct candidate is scored at once; emits
    keep the order of a loop over originals (their drops) and then candidates (their scores).
    """
    axes = ctx.settings.sft.augment_axes
    # Originals with the same text are one task: augmented once (the cache would answer the repeat).
    distinct: dict[str, Candidate] = {}
    for cand in originals:
        distinct.setdefault(cand.task.task_id, cand)
    augmented = await map_ordered(lambda cand: augment(gw, cand, axes, ctx), list(distinct.values()))
    by_id = dict(zip(distinct, augmented, strict=True))
    emits: list[Emit] = []
    candidates: list[Candidate] = []
    for cand in originals:
        variants, dropped = by_id[cand.task.task_id]
        candidates += [cand, *variants]
        emits += dropped
    unique: dict[str, Candidate] = {}
    for cand in candidates:
        unique.setdefault(cand.task.task_id, cand)  # a variant identical to an earlier candidate is skipped
    emits += await map_ordered(lambda cand: score_and_gate(gw, cand, ctx), list(unique.values()))
    return emits


async def handle_chain(record: ToolChain, ctx: Context) -> Sequence[Emit]:
    """Chain-conditioned construction: a task whose solution follows the verified chain."""
    gw = gateway_for(ctx.settings)
    inputs = ChainTaskInput(server=record.server, chain=record.tools, variant=1)
    try:
        answer = await gw.call(TASK_FROM_CHAIN, inputs)
    except InvalidOutput as exc:
        return [ctx.llm_dead_letter(exc, f"task for chain {record.chain_id}")]
    base = original(record.server, answer.output.text.strip(), "chain", record)
    return await finish(gw, [Candidate(base, [answer])], ctx)


async def handle_server(record: ToolServer, ctx: Context) -> Sequence[Emit]:
    """Server-only construction: tasks from the server specification alone."""
    gw = gateway_for(ctx.settings)
    server = ServerRef.of(record)

    async def ask(variant: int) -> Answer[TaskDraft] | InvalidOutput:
        try:
            return await gw.call(TASK_FROM_SERVER, ServerTaskInput(server=server, variant=variant))
        except InvalidOutput as exc:
            return exc

    originals: list[Candidate] = []
    emits: list[Emit] = []
    answers = await map_ordered(ask, range(ctx.settings.sft.server_tasks))
    for variant, answer in enumerate(answers):
        if isinstance(answer, InvalidOutput):
            emits.append(ctx.llm_dead_letter(answer, f"server task {variant}"))
            continue
        originals.append(Candidate(original(server, answer.output.text.strip(), "server", None), [answer]))
    return emits + await finish(gw, originals, ctx)


CHAIN_STAGE = StageDef(
    name="tasks-from-chains",
    input="chains",
    input_model=ToolChain,
    version=STAGE_VERSION,
    handler=handle_chain,
    outputs=("tasks",),
    description="chain-conditioned tasks, augmented and scored (T_chain)",
    dedupe=True,
)

SERVER_STAGE = StageDef(
    name="tasks-from-servers",
    input="tools.servers",
    input_model=ToolServer,
    version=STAGE_VERSION,
    handler=handle_server,
    outputs=("tasks",),
    description="server-only tasks, augmented and scored (T_server)",
    dedupe=True,
)

"""One pilot item through the planned EigenData agents, each with its prompt set's prompt (§4.2, §4.4).

``run_item`` takes one seed through the workers the plan names, in the standard order:

RandomPool -> UserIntent -> TaskValidation (+ Modify: validate <-> repair) -> DialogSynthesis ->
TrajectoryValidation (+ Modify: dialogue repair) -> VerificationFunction.

A worker the plan leaves out does not run (no TaskValidation: the task goes to the dialogue as
written; no Modify: the first verdict is final; no VerificationFunction: nothing is verified).
Every LLM call goes through a ``PromptedGateway``: a view of the gateway that calls each role
with the prompt set's system prompt for it (the role's name, schema and template stay), so every
worker with a prompt runs with its set's prompt, and counts the calls per role (the evidence of
which workers ran). The item's first failing check becomes a ``FailureSample`` with that check's
diagnosis, for the Judge -- a first-round failure that Modify then repaired too (``repaired``):
the data was saved, but the worker that made the failing artifact still needs a better prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from arena.llm.core import Answer, InvalidOutput, Role, Sampling, Undecidable
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import UserBehaviour
from arena.records.eigen import Dialog, DialogVerdict, UserIntent
from environments.environment import read_verdict, verify_program
from sandbox.env_runtime import Runner
from synthesis.eigen.agents import MAX_ROUNDS, random_pool, user_intent, validate_task, validate_with_repair
from synthesis.eigen.dialog_loop import synthesize_dialog
from synthesis.eigen.dialog_synthesis import judge_dialog, validate_with_dialog_repair
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.orchestration import FailureSample, FailureStage, WorkflowPlan
from synthesis.eigen.roles.tasks import TaskVerdict
from synthesis.eigen.verification import replay_reference, verification_source

__all__ = ["EXCERPT_MESSAGES", "BatchResult", "PromptedGateway", "run_item", "sample_failures"]

EXCERPT_MESSAGES = 6
"""Last messages of a failing dialogue shown to the Judge."""
EXCERPT_CHARS = 300


class PromptedGateway(Gateway):
    """A view of ``inner`` that calls every role with ``prompts[role.name]`` as its system prompt.

    Everything else (backend, routes, cache, catalog, usage counters) is ``inner``'s: the view
    only swaps the system text, so the catalog versions exactly what was sent. ``calls`` counts
    the calls made through this view per role.
    """

    def __init__(self, inner: Gateway, prompts: Mapping[str, str]) -> None:  # no super().__init__: a view
        self.inner = inner
        self.prompts = dict(prompts)
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"PromptedGateway({self.inner!r}, {len(self.prompts)} prompts)"

    async def call(self, role: Role[Any, Any], inputs: Any, sampling: Sampling | None = None) -> Answer[Any]:
        self.calls[role.name] += 1
        system = self.prompts.get(role.name)
        if system is not None and system != role.system:
            role = dataclasses.replace(role, system=system)
        return await self.inner.call(role, inputs, sampling)


class BatchResult(BaseModel):
    """One item of a pilot batch: what each worker that ran made of it, and where it failed."""

    seed: int
    intent: UserIntent | None = None
    verdict: TaskVerdict | None = Field(default=None, description="The first task verdict (before repair).")
    repair_rounds: int | None = Field(default=None, description="Task Modify rounds (None: Modify not run).")
    task_accepted: bool | None = Field(default=None, description="Feasible at last (None: not validated).")
    dialog: Dialog | None = None
    first_dialog_passed: bool | None = Field(default=None, description="The first dialogue's verdict.")
    dialog_verdict: DialogVerdict | None = Field(default=None, description="The last dialogue verdict.")
    dialog_rounds: int = Field(default=0, description="Dialogue repair rounds (Modify) done.")
    verified: bool | None = Field(
        default=None, description="The verifier passed the dialogue (None: not run)."
    )
    verification: str | None = Field(default=None, description="Why verification failed.")
    failures: list[FailureSample] = Field(
        default_factory=list, description="Every failing check on the item, diagnosed (repaired ones too)."
    )
    failed_at: FailureStage | None = Field(default=None, description="The check that finally lost the item.")
    error: str | None = Field(default=None, description="Why no intent came (generation failure).")

    @property
    def dialogue_passed(self) -> bool | None:
        return None if self.dialog_verdict is None else self.dialog_verdict.passed

    @property
    def needed_repair(self) -> bool:
        """Its task or its first dialogue failed validation."""
        task = self.verdict is not None and self.verdict.status == "INFEASIBLE"
        return task or self.first_dialog_passed is False

    def fail(self, failure: FailureSample) -> BatchResult:
        self.failures.append(failure)
        if not failure.repaired:
            self.failed_at = failure.stage
        return self


def _cut(text: Any) -> str:
    value = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    return value if len(value) <= EXCERPT_CHARS else value[: EXCERPT_CHARS - 1] + "…"


def _excerpt(dialog: Dialog) -> list[dict[str, Any]]:
    shown: list[dict[str, Any]] = []
    for message in dialog.messages[-EXCERPT_MESSAGES:]:
        entry: dict[str, Any] = {"role": message.get("role"), "content": _cut(message.get("content") or "")}
        calls = message.get("tool_calls") or []
        if calls:
            entry["tool_calls"] = [_cut(c.get("function", c)) for c in calls]
        shown.append(entry)
    return shown


def _dialog_failure(
    seed: int, intent: UserIntent, dialog: Dialog, verdict: DialogVerdict, rounds: int, repaired: bool
) -> FailureSample:
    critical = [i for i in verdict.issues if i.critical] or verdict.issues
    return FailureSample(
        seed=seed,
        stage="trajectory_validation",
        objective=intent.objective,
        diagnosis=[i.description for i in critical] or list(verdict.reasons),
        categories=[i.criterion for i in critical],
        repair_rounds=rounds,
        repaired=repaired,
        end_signal=dialog.end_signal,
        excerpt=_excerpt(dialog),
        failed_calls=[f"{c.name}: {_cut(c.output)}" for c in dialog.calls if not c.ok],
    )


async def _verify(
    pack: DomainPack, intent: UserIntent, dialog: Dialog, runner: Runner, timeout_s: float | None
) -> str | None:
    """VerificationFunction: generate the verifier from the dialogue's calls, run it in the sandbox on
    the dialogue's own final state; None when it passes, else why not (as the stage does)."""
    ran = [c for c in dialog.records() if c["ok"]]
    records, final = await asyncio.to_thread(replay_reference, pack, dialog.initial_state, ran)
    failed = [f"{r['name']}({json.dumps(r['arguments'])})" for r in records if not r["ok"]]
    if failed:
        return f"reference calls failed on replay: {failed[:3]}"
    source = await asyncio.to_thread(
        verification_source, pack, dialog.initial_state, records, final, must_have=intent.must_have_functions
    )
    program = verify_program(source, dialog.initial_state, dialog.final_state, dialog.records())
    verdict = read_verdict(await runner.run(program, timeout_s=timeout_s))
    if isinstance(verdict, str):
        return f"the verifier did not run: {verdict}"
    if not verdict.passed:
        return f"the verifier fails the dialogue: {verdict.components}"
    return None


async def run_item(
    seed: int,
    *,
    plan: WorkflowPlan,
    params: Any,
    gateway: PromptedGateway,
    runner: Runner,
    pack: DomainPack,
    state: Mapping[str, Any],
    repair: bool = True,
    timeout_s: float | None = None,
    behaviour: UserBehaviour | None = None,
) -> BatchResult:
    """``seed`` through the planned workers (module docstring); ``repair=False`` never runs Modify;
    ``behaviour``: the simulated user's behaviour rates (the ``[user_sim]`` settings)."""
    modify = repair and plan.runs("Modify")
    try:
        draw = await random_pool(gateway, pack, state, seed, params)
        intent = await user_intent(gateway, pack, state, draw)
    except (Undecidable, InvalidOutput) as exc:
        error = f"{type(exc).__name__}: {exc}"
        failure = FailureSample(seed=seed, stage="generation", diagnosis=[error])
        return BatchResult(seed=seed, error=error).fail(failure)
    result = BatchResult(seed=seed, intent=intent)
    if plan.runs("TaskValidation"):
        common: dict[str, Any] = {"gateway": gateway, "runner": runner, "pack": pack, "state": state}
        if modify:
            outcome = await validate_with_repair(intent, max_rounds=MAX_ROUNDS, timeout_s=timeout_s, **common)
            first, last, intent = outcome.verdicts[0], outcome.verdicts[-1], outcome.final_intent
            result.repair_rounds, result.task_accepted = outcome.rounds, outcome.accepted
        else:
            first = last = await validate_task(intent, timeout_s=timeout_s, **common)
            result.task_accepted = last.status == "FEASIBLE"
        result.verdict = first
        if first.status != "FEASIBLE":
            shown = first if result.task_accepted else last
            result.fail(
                FailureSample(
                    seed=seed,
                    stage="task_validation",
                    objective=intent.objective,
                    diagnosis=list(shown.reasons),
                    categories=sorted({f.category for f in shown.failure_reasons}),
                    repair_rounds=result.repair_rounds or 0,
                    repaired=bool(result.task_accepted),
                )
            )
        if not result.task_accepted:
            return result
    if not plan.runs("DialogSynthesis"):
        return result
    dialog = await synthesize_dialog(
        pack, intent, state, gateway, runner, timeout_s=timeout_s, behaviour=behaviour
    )
    result.dialog = dialog
    if plan.runs("TrajectoryValidation"):
        verdict, _ = await judge_dialog(pack, intent, dialog, gateway)
        result.first_dialog_passed, result.dialog_verdict = verdict.passed, verdict
        if not verdict.passed and modify:  # it judges the first dialogue again (a cache hit with a cache)
            repaired = await validate_with_dialog_repair(
                pack, intent, dialog, state, gateway, runner, timeout_s=timeout_s, behaviour=behaviour
            )
            result.dialog_rounds = repaired.rounds
            if repaired.verdict.passed:  # the first dialogue's failure, repaired
                result.fail(_dialog_failure(seed, intent, dialog, verdict, repaired.rounds, True))
            intent, dialog, verdict = repaired.intent, repaired.dialog, repaired.verdict
            result.dialog, result.dialog_verdict = dialog, verdict
        if not verdict.passed:
            result.fail(_dialog_failure(seed, intent, dialog, verdict, result.dialog_rounds, False))
            return result
    if plan.runs("VerificationFunction"):
        why = await _verify(pack, intent, dialog, runner, timeout_s)
        result.verified, result.verification = why is None, why
        if why is not None:
            result.fail(
                FailureSample(
                    seed=seed,
                    stage="verification",
                    objective=intent.objective,
                    diagnosis=[why],
                    end_signal=dialog.end_signal,
                    excerpt=_excerpt(dialog),
                )
            )
    return result


def sample_failures(results: list[BatchResult], limit: int = 6) -> list[FailureSample]:
    """Up to ``limit`` failures for the Judge, taken round-robin over the checks that failed them."""
    by_stage: dict[str, list[FailureSample]] = {}
    for r in sorted(results, key=lambda r: r.seed):
        for failure in r.failures:
            by_stage.setdefault(failure.stage, []).append(failure)
    picked: list[FailureSample] = []
    while len(picked) < limit and any(by_stage.values()):
        for stage in sorted(by_stage):
            if by_stage[stage] and len(picked) < limit:
                picked.append(by_stage[stage].pop(0))
    return picked

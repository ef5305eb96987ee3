"""EigenData-track records (EigenData §4). Declared here so the registry is complete.

Each ``eigen.*`` topic has its own value model: the shared envelope ``EigenItem`` (item id,
domain, prompt set, parent) with ``payload`` typed as that topic's payload model, so a record
whose payload does not match is a schema violation of the stage that reads it:

    eigen.seeds              EigenSeed       Scenario          which pack, database, scenario seed
    eigen.intents            EigenIntent     IntentPayload     RandomPool's draw + UserIntent's task
    eigen.tasks              EigenTask       TaskPayload       the task TaskValidation accepted
    eigen.dialogs            EigenDialog     DialogPayload     DialogSynthesis' dialogue
    eigen.dialogs.validated  EigenValidated  ValidatedPayload  the dialogue TrajectoryValidation passed
    eigen.verified           EigenVerified   VerifiedPayload   the instance with its verification function
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from arena.llm.roles.eigen import PlanStep, PoolDraw, Repair, UserIntent
from arena.llm.roles.eigen_dialogs import DialogIssue, DimensionRating, TrajectoryVerdict
from arena.records.common import Record

# --------------------------------------------------------------------------- dialogues


class CallRecord(BaseModel):
    """One executed call of an interactive dialogue, as ``verify`` receives it."""

    name: Annotated[str, Field(description="Tool name.")]
    arguments: Annotated[dict[str, Any], Field(description="Arguments as called.")]
    actor: Annotated[Literal["agent", "user"], Field(description="Who called it.")]
    ok: Annotated[bool, Field(description="It ran without raising.")]
    changed_state: Annotated[bool, Field(description="STATE differs after the call.")]


EndSignal = Literal["stop", "transfer", "out_of_scope", "max_turns", "agent_stuck", "user_error"]


class DialogCall(CallRecord):
    """One executed call of a synthesized dialogue (``CallRecord`` plus output and position)."""

    output: Any = Field(default=None, description="What it returned, or the error text.")
    message_index: int = Field(default=0, description="Index of the message it belongs to.")

    def record(self) -> dict[str, Any]:
        """The ``CallRecord`` dict ``verify`` receives."""
        return CallRecord.model_validate(self.model_dump()).model_dump()


class Dialog(BaseModel):
    """A synthesized dialogue."""

    domain: str
    messages: list[dict[str, Any]] = Field(description="OpenAI-format messages, system policy first.")
    calls: list[DialogCall] = Field(default_factory=list, description="Every call, agent and user, in order.")
    initial_state: dict[str, Any]
    final_state: dict[str, Any]
    end_signal: EndSignal
    turns: int = Field(description="User replies after the opening message.")
    error: str | None = Field(
        default=None, description="Why the user simulator failed (end_signal user_error), else None."
    )

    def records(self) -> list[dict[str, Any]]:
        return [c.record() for c in self.calls]


class DialogVerdict(BaseModel):
    """``validate_dialog``'s result."""

    passed: bool
    ratings: dict[str, DimensionRating] = Field(description="Criterion -> rating and score.")
    flags: dict[str, bool] = Field(description="Criterion -> no critical issue found.")
    issues: list[DialogIssue] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list, description="Why it failed (critical issues first).")


# --------------------------------------------------------------------------- payloads


class Scenario(BaseModel):
    """Where an item comes from; every payload carries it. The payload of ``eigen.seeds``."""

    pack_id: Annotated[str, Field(description="Content hash of the published domain pack.")]
    state_seed: Annotated[int, Field(ge=0, description="Seed of the instance's database (generator.py).")]
    size: Annotated[str, Field(description="Database size: small, medium or large.")]
    seed: Annotated[int, Field(ge=0, description="RandomPool's scenario seed.")]
    set_version: Annotated[int, Field(ge=1, description="Prompt-set parameter version that made it.")] = 1


class IntentPayload(BaseModel):
    """RandomPool + UserIntent output."""

    scenario: Scenario
    draw: Annotated[PoolDraw, Field(description="RandomPool's persona, context and difficulty factors.")]
    intent: Annotated[UserIntent, Field(description="UserIntent's task specification.")]
    context_cut: list[str] = Field(
        default_factory=list,
        exclude_if=lambda cut: not cut,  # absent when nothing was cut: earlier items keep their ids
        description="What was left out of the prompts to fit the context window (e.g. database entities).",
    )


class TaskPayload(BaseModel):
    """A task TaskValidation found FEASIBLE (possibly after Modify rounds)."""

    scenario: Scenario
    intent: Annotated[UserIntent, Field(description="The task as finally validated.")]
    plan: Annotated[list[PlanStep], Field(description="The probe-backed plan of the FEASIBLE verdict.")]
    repair_rounds: Annotated[int, Field(ge=0, description="Modify rounds it needed (0: feasible as drawn).")]
    first_reasons: Annotated[
        list[str], Field(default_factory=list, description="Why the first verdict was INFEASIBLE, if it was.")
    ]
    repairs: Annotated[
        list[list[Repair]], Field(default_factory=list, description="Edits of each Modify round.")
    ]


class DialogPayload(BaseModel):
    """A synthesized dialogue for a validated task."""

    scenario: Scenario
    intent: UserIntent
    task_repair_rounds: Annotated[int, Field(ge=0, description="Modify rounds of the task stage.")] = 0
    dialog: Dialog


class ValidatedPayload(BaseModel):
    """A dialogue TrajectoryValidation passed (possibly after Modify rounds)."""

    scenario: Scenario
    intent: Annotated[UserIntent, Field(description="The task the passing dialogue was made for.")]
    dialog: Dialog
    verdict: Annotated[DialogVerdict, Field(description="The deterministic checks' verdict.")]
    judged: Annotated[TrajectoryVerdict, Field(description="The TrajectoryValidation role's verdict.")]
    repair_rounds: Annotated[int, Field(ge=0, description="Dialogue repair rounds it needed.")] = 0
    task_repair_rounds: Annotated[int, Field(ge=0, description="Modify rounds of the task stage.")] = 0


class VerifiedPayload(BaseModel):
    """A verified interactive instance: the ``InteractiveSpec`` dict plus where it went."""

    scenario: Scenario
    instance: Annotated[dict[str, Any], Field(description="InteractiveSpec fields + provenance.")]
    sample_id: Annotated[str, Field(description="Its samples.verified id (published or held out).")]
    split: Annotated[str, Field(description="'train' (published) or 'heldout' (arena eval only).")]
    verdict: Annotated[
        dict[str, Any],
        Field(description="The verifier's result on the dialogue's own final state (sandbox)."),
    ]


# --------------------------------------------------------------------------- topic values

P = TypeVar("P", bound=BaseModel)


class EigenItem(Record, Generic[P]):
    """One work item of an EigenData stage: seeds, intents, tasks, dialogs, validated, verified.

    The stages share one envelope; ``payload`` holds the worker's typed output. Each topic's
    value model is a subclass that fixes the payload model (``EigenSeed`` ... ``EigenVerified``).
    """

    kind: ClassVar[str] = ""
    """Prefix of the item ids of this topic (``seed-``, ``intent-``, ...)."""

    item_id: Annotated[str, Field(description="Content hash of the payload.")]
    domain: Annotated[str, Field(description="Domain pack name.")]
    prompt_set: Annotated[str, Field(description="Prompt set (phase-1 set id) that produced it.")]
    parent_id: Annotated[str | None, Field(description="Item of the previous stage.")] = None
    payload: Annotated[P, Field(description="The worker's output.")]


class EigenSeed(EigenItem[Scenario]):
    """Value of ``eigen.seeds``: a scenario for a prompt set to draw a task on (``arena publish domain``)."""

    kind: ClassVar[str] = "seed"


class EigenIntent(EigenItem[IntentPayload]):
    """Value of ``eigen.intents``: RandomPool's draw and UserIntent's task for a seed."""

    kind: ClassVar[str] = "intent"


class EigenTask(EigenItem[TaskPayload]):
    """Value of ``eigen.tasks``: a task TaskValidation found feasible."""

    kind: ClassVar[str] = "task"


class EigenDialog(EigenItem[DialogPayload]):
    """Value of ``eigen.dialogs``: a dialogue DialogSynthesis made for a task."""

    kind: ClassVar[str] = "dialog"


class EigenValidated(EigenItem[ValidatedPayload]):
    """Value of ``eigen.dialogs.validated``: a dialogue TrajectoryValidation passed."""

    kind: ClassVar[str] = "validated"


class EigenVerified(EigenItem[VerifiedPayload]):
    """Value of ``eigen.verified``: a verified interactive instance and where it went."""

    kind: ClassVar[str] = "verified"


class PilotMetrics(Record):
    """Per-iteration metrics of phase-2 pilot optimisation; value of ``eigen.pilot.metrics``."""

    prompt_set: Annotated[str, Field(description="Prompt set being optimised.")]
    iteration: Annotated[int, Field(ge=0, description="Pilot iteration.")]
    metrics: Annotated[dict[str, float], Field(description="infeasibility, tool_call_validity, quality, ...")]

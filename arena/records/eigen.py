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

from pydantic import BaseModel, Field, model_validator

from arena.records.common import Record

# --------------------------------------------------------------------------- role outputs on the topics
# The EigenData roles' outputs that records carry (arena.records is the kernel's one home of
# what flows on a topic; the roles in synthesis.eigen.roles import them from here).


class Persona(BaseModel):
    """A user persona."""

    role: Annotated[str, Field(description="Kind of customer, e.g. 'weekend hiker'.")]
    expertise: Annotated[
        Literal["novice", "occasional", "frequent", "expert"], Field(description="Experience.")
    ]
    tone: Annotated[str, Field(description="How they write, e.g. 'polite', 'curt', 'anxious'.")]
    priorities: list[str] = Field(default_factory=list, description="What they care about.")


class EnvironmentContext(BaseModel):
    """The slice of the database a scenario is about."""

    user_id: Annotated[str, Field(description="The customer the scenario is about.")]
    order_ids: list[str] = Field(default_factory=list, description="That customer's orders in play.")
    product_ids: list[str] = Field(default_factory=list, description="Products of those orders.")
    nonexistent_ids: list[str] = Field(
        default_factory=list,
        description="Ids that exist nowhere in the database (for error-prone parameters).",
    )


class DifficultyFactors(BaseModel):
    """Task factors that control difficulty (§4.2 RandomPool)."""

    required_calls: Annotated[int, Field(ge=1, description="Tool calls the task should need.")]
    branching: bool = Field(default=False, description="Add a conditional fallback.")
    ambiguity: bool = Field(default=False, description="The user does not give ids up front.")
    error_prone_parameters: bool = Field(default=False, description="A goal carries a wrong id.")
    policy_violation: bool = Field(default=False, description="A goal asks for a forbidden action.")
    deception_tactics: list[str] = Field(default_factory=list, description="Tactics the user tries.")


class PoolDraw(BaseModel):
    """A scenario seed: persona, environment context, difficulty factors."""

    seed: Annotated[int, Field(ge=0, description="The scenario seed.")]
    persona: Persona
    context: EnvironmentContext
    difficulty: DifficultyFactors
    testing_objectives: list[str] = Field(default_factory=list, description="What the scenario tests.")
    task_kinds: list[str] = Field(
        default_factory=list, description="Goal templates allowed (params.task_kinds); empty: all."
    )


class GoalCall(BaseModel):
    """A call a goal needs, with the arguments the user supplies or the state implies."""

    name: Annotated[str, Field(description="Tool name.")]
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments as a JSON object.")
    actor: Literal["agent", "user"] = Field(default="agent", description="Who makes the call.")


class Goal(BaseModel):
    """One thing the user wants done, and the state-changing calls it takes."""

    kind: Annotated[str, Field(description="Template / main write tool, e.g. 'cancel_order'.")]
    requirement: Annotated[str, Field(description="How the user asks for it (one of the requirements).")]
    calls: Annotated[list[GoalCall], Field(min_length=1, description="State-changing calls, in order.")]


class UserIntent(BaseModel):
    """A concrete task specification (§4.2 UserIntent, appendix prompt)."""

    domain: Annotated[str, Field(description="Domain name.")]
    seed: Annotated[int, Field(ge=0, description="Scenario seed it came from.")]
    persona: Persona
    objective: Annotated[str, Field(min_length=1, description="The user-facing objective.")]
    reason_for_call: Annotated[str, Field(description="The user's opening message.")]
    known_info: dict[str, str] = Field(
        default_factory=dict, description="What the user knows (identity, ids, the code on their phone)."
    )
    requirements: list[str] = Field(
        default_factory=list, description="Must requirements, in the order raised."
    )
    must_not: list[str] = Field(default_factory=list, description="Must-not requirements.")
    hidden_subgoals: list[str] = Field(
        default_factory=list, description="Latent subgoals for validation, not said by the user."
    )
    deception_tactics: list[str] = Field(
        default_factory=list, description="Tactics the user tries (may be empty)."
    )
    must_have_functions: list[str] = Field(default_factory=list, description="Tools a solution must call.")
    rubrics: list[str] = Field(default_factory=list, description="Expected agent behaviour.")
    goals: list[Goal] = Field(default_factory=list, description="What must get done, as calls.")
    refused: list[Goal] = Field(
        default_factory=list, description="Requests the agent must decline (policy-enforcement tests)."
    )
    difficulty: DifficultyFactors


class PlanStep(BaseModel):
    """One step of a solution plan."""

    step: Annotated[int, Field(ge=1)]
    function: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    actor: Literal["agent", "user"] = "agent"
    purpose: str = ""
    precondition_verified: bool = True


class Repair(BaseModel):
    """One edit applied."""

    target_field: str
    original_value: str
    repaired_value: str
    rationale: str


Criterion = Literal["schema", "grounding", "goal", "realism", "policy"]


Rating = Literal["Good", "Acceptable", "Poor"]


class DialogIssue(BaseModel):
    """One finding of the validation."""

    criterion: Criterion
    critical: Annotated[bool, Field(description="A CRITICAL issue fails the dialogue by itself.")]
    description: Annotated[str, Field(min_length=1)]
    evidence: str = Field(default="", description="The quoted claim, call or message.")
    turn: int | None = Field(default=None, description="Index of the message concerned.")


class DimensionRating(BaseModel):
    """The rating of one validation dimension."""

    rating: Rating
    score: Annotated[float, Field(ge=0.0, le=1.0)] = 1.0
    assessment: str = ""


class TrajectoryVerdict(BaseModel):
    """The appendix prompt's output."""

    validation_summary: dict[str, DimensionRating] = Field(
        default_factory=dict, description="Dimension name -> rating."
    )
    critical_issues: list[DialogIssue] = Field(default_factory=list)
    non_critical_observations: list[str] = Field(default_factory=list)
    validation_result: Literal["PASS", "FAIL"]
    failure_reason: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> TrajectoryVerdict:
        poor = sum(1 for r in self.validation_summary.values() if r.rating == "Poor")
        should_fail = bool(self.critical_issues) or poor >= 2
        if (self.validation_result == "FAIL") != should_fail:
            raise ValueError("FAIL exactly when there is a critical issue or 2+ dimensions are Poor")
        if self.validation_result == "FAIL" and not self.failure_reason:
            raise ValueError("FAIL needs a failure_reason")
        return self


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

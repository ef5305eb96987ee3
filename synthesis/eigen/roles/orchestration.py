"""EigenData orchestration-layer roles (EigenData §4.1, §4.3, §4.4): Planner, Prompt Engineer, Judge.

- ``EIGEN_PLANNER`` (Workflow Planner): a generation request + the domain spec -> the worker DAG
  (ordered workers, each with the artifacts it reads and writes and the workers it depends on).
- ``EIGEN_PROMPT_ENGINEER``: writes each planned worker's prompt for one prompt set, conditioned on
  the summaries of the sets written before it (phase-1 diversity), and revises a set's prompts
  with the guidance the Judge derived from failures (phase-2 evolution).
- ``EIGEN_JUDGE``: critiques a pilot batch on the four axes of §4.1 (executability, tool
  correctness, trajectory coherence, difficulty & coverage) from its metrics AND a sample of its
  failing artifacts (tasks the validator rejected, dialogues TrajectoryValidation failed, dialogues
  whose verification function failed), each with the validator's / verifier's diagnosis, and emits
  concrete updates: generator parameter changes (``PoolParams``) and prompt edits (constraints,
  negative examples, style) addressed to the worker role responsible -- any prompted worker.
- Replanning (§4.1: "critiques used by the Planner to adjust workflow"): the Planner takes the plan
  in use and a ``PlanReview`` of the last pilot batch and returns the plan for the next one (which
  workers run, which workers' prompts may still evolve).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from arena.llm.core import Role
from synthesis.eigen.roles.tasks import DomainSummary, PoolParams

__all__ = [
    "EIGEN_JUDGE",
    "EIGEN_ORCHESTRATION_ROLES",
    "EIGEN_PLANNER",
    "EIGEN_PROMPT_ENGINEER",
    "ESSENTIAL_WORKERS",
    "PROMPTED_ROLES",
    "WORKERS",
    "WORKER_IO",
    "BatchMetrics",
    "Critique",
    "CritiqueScores",
    "FailureSample",
    "FailureStage",
    "GenerationRequest",
    "JudgeInput",
    "ParamUpdate",
    "PilotThresholds",
    "PlanReview",
    "PlannedWorkflow",
    "PromptEdit",
    "PromptEngineerInput",
    "PromptSetDraft",
    "PromptSetSummary",
    "WorkerNode",
    "WorkerPrompt",
    "WorkflowPlan",
    "standard_plan",
]

Score = Annotated[float, Field(ge=0.0, le=1.0)]

WORKERS: tuple[tuple[str, str], ...] = (
    ("RandomPool", "eigen_random_pool"),
    ("UserIntent", "eigen_user_intent"),
    ("TaskValidation", "eigen_task_validation"),
    ("DialogSynthesis", "eigen_trajectory_agent"),  # with the user_simulator role
    ("TrajectoryValidation", "eigen_trajectory_validation"),
    ("Modify", "eigen_modify"),
    ("VerificationFunction", "eigen_verification_function"),
)
"""The standard workflow of §4.2, in order: (worker, the gateway role that implements it)."""

PROMPTED_ROLES: dict[str, tuple[str, ...]] = {
    "RandomPool": ("eigen_random_pool",),
    "UserIntent": ("eigen_user_intent",),
    "TaskValidation": ("eigen_task_validation",),
    "DialogSynthesis": ("eigen_trajectory_agent", "user_simulator"),
    "TrajectoryValidation": ("eigen_trajectory_validation",),
    "Modify": ("eigen_modify",),
    "VerificationFunction": (),
}
"""Worker -> the gateway roles whose system prompt a prompt set carries and evolves. Dialog
synthesis is two agents (assistant and simulated user); the verification function is generated
as code from the accepted trajectory (``synthesis.eigen.verification``), so it has no prompt."""


# --------------------------------------------------------------------------- Planner


class PlanReview(BaseModel):
    """What the Planner is told about the last pilot batch when it replans."""

    plan: Annotated[WorkflowPlan, Field(description="The plan the batch ran with.")]
    iteration: Annotated[int, Field(ge=0)]
    size: Annotated[int, Field(ge=0, description="Tasks generated in the batch.")]
    infeasibility: float | None = Field(
        ge=0, le=1, description="INFEASIBLE share before repair (None: TaskValidation did not run)."
    )
    tool_call_validity: Annotated[float, Field(ge=0, le=1)] = 1.0
    needed_repair: Annotated[
        int, Field(ge=0, description="Items whose task or dialogue failed its first validation.")
    ] = 0
    repaired: Annotated[int, Field(ge=0, description="Items that passed after Modify rounds.")] = 0
    dialogue_pass_rate: float | None = Field(
        default=None, ge=0, le=1, description="Share of synthesized dialogues that passed (None: none)."
    )
    edits_by_worker: dict[str, int] = Field(
        default_factory=dict, description="Gateway role -> prompt edits the Judge proposed for it."
    )
    targets: Annotated[PilotThresholds, Field(description="The pilot's targets.")]
    findings: list[str] = Field(default_factory=list, description="The Judge's findings.")


class GenerationRequest(BaseModel):
    """What to generate, for which domain, with which targets."""

    request: Annotated[str, Field(min_length=1, description="The user's request in words.")]
    domain: DomainSummary
    size: Annotated[int, Field(ge=1, description="Instances wanted.")] = 100
    difficulty: Annotated[str, Field(description="Target difficulty, e.g. 'mixed', 'hard'.")] = "mixed"
    diversity: Annotated[str, Field(description="Diversity target, e.g. 'personas and task kinds'.")] = (
        "personas and task kinds"
    )
    outputs: list[Literal["sft", "rl"]] = Field(
        default_factory=lambda: list[Literal["sft", "rl"]](["sft", "rl"]),
        min_length=1,
        description="sft: dialogs only; rl: also verification functions (rewards).",
    )
    review: PlanReview | None = Field(
        default=None, description="Replanning: the plan in use and what its last pilot batch showed."
    )


class WorkerNode(BaseModel):
    """One worker of the planned workflow."""

    name: Annotated[str, Field(description="Worker name, e.g. 'RandomPool'.")]
    role: Annotated[str, Field(description="Gateway role that implements it, e.g. 'eigen_random_pool'.")]
    inputs: list[str] = Field(default_factory=list, description="Artifacts it reads.")
    outputs: list[str] = Field(default_factory=list, description="Artifacts it writes.")
    depends_on: list[str] = Field(default_factory=list, description="Workers whose outputs it reads.")
    evolve: bool = Field(
        default=True,
        description="The pilot may revise this worker's prompts (False: frozen while others evolve).",
    )


class WorkflowPlan(BaseModel):
    """The worker DAG, in execution order."""

    workers: Annotated[list[WorkerNode], Field(min_length=1)]
    rationale: str = ""

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workers]

    def runs(self, worker: str) -> bool:
        return worker in self.names

    def restricted_to(self, names: list[str] | tuple[str, ...], rationale: str = "") -> WorkflowPlan:
        """This plan with only the workers named (order kept, dependencies on the others dropped)."""
        kept = [w for w in self.workers if w.name in names]
        unknown = sorted(set(names) - {w.name for w in kept})
        if unknown:
            raise ValueError(f"workers {unknown} are not in the plan {self.names}")
        workers = [w.model_copy(update={"depends_on": [d for d in w.depends_on if d in names]}) for w in kept]
        return WorkflowPlan(workers=workers, rationale=rationale or self.rationale)

    def evolving_roles(self) -> list[str]:
        """The prompted roles of the planned workers whose prompts may evolve."""
        return [r for w in self.workers if w.evolve for r in PROMPTED_ROLES.get(w.name, ())]

    def check(self) -> None:
        """Raise ``ValueError`` unless every dependency names an earlier worker (a DAG in order)."""
        seen: set[str] = set()
        for worker in self.workers:
            unknown = [d for d in worker.depends_on if d not in seen]
            if unknown:
                raise ValueError(f"{worker.name} depends on {unknown}, not earlier workers")
            seen.add(worker.name)


ESSENTIAL_WORKERS = ("RandomPool", "UserIntent")
"""Workers every plan runs: they draw the tasks everything else works on."""

WORKER_IO: dict[str, tuple[list[str], list[str], list[str]]] = {
    "RandomPool": (["domain", "pool_params", "seed"], ["scenario_seed"], []),
    "UserIntent": (["scenario_seed", "domain", "state_slice"], ["task"], ["RandomPool"]),
    "TaskValidation": (["task", "probe_evidence"], ["task_verdict", "validated_task"], ["UserIntent"]),
    "DialogSynthesis": (["validated_task", "domain"], ["dialog"], ["TaskValidation"]),
    "TrajectoryValidation": (["dialog", "validated_task"], ["trajectory_verdict"], ["DialogSynthesis"]),
    "Modify": (
        ["task", "task_verdict", "dialog", "trajectory_verdict"],
        ["repaired_task", "repaired_dialog"],
        ["TaskValidation", "TrajectoryValidation"],
    ),
    "VerificationFunction": (
        ["accepted_dialog", "final_state"],
        ["verification_function"],
        ["TrajectoryValidation", "Modify"],
    ),
}
"""Worker -> (artifacts it reads, artifacts it writes, workers it depends on) in §4.2's workflow."""


def standard_plan(
    names: set[str] | None = None, evolve: Mapping[str, bool] | None = None, rationale: str = ""
) -> WorkflowPlan:
    """The workers named (default: all), in the standard order, each depending on the present ones it reads."""
    chosen = names if names is not None else {name for name, _ in WORKERS}
    workers = []
    for name, role in WORKERS:
        if name not in chosen:
            continue
        reads, writes, deps = WORKER_IO[name]
        workers.append(
            WorkerNode(
                name=name,
                role=role,
                inputs=reads,
                outputs=writes,
                depends_on=[d for d in deps if d in chosen],
                evolve=(evolve or {}).get(name, True),
            )
        )
    plan = WorkflowPlan(workers=workers, rationale=rationale)
    plan.check()
    return plan


class PlannedWorkflow(WorkflowPlan):
    """A plan as the Planner must write it: the essential workers run, and in dependency order (a
    plan that is not is an invalid reply, asked again with the reason)."""

    @model_validator(mode="after")
    def _usable(self) -> PlannedWorkflow:
        missing = [w for w in ESSENTIAL_WORKERS if not self.runs(w)]
        if missing:
            raise ValueError(f"the plan must run {missing}: they draw the tasks every other worker needs")
        self.check()
        return self


# --------------------------------------------------------------------------- Prompt Engineer


class PromptSetSummary(BaseModel):
    """What a later prompt set is told about an earlier one."""

    set_id: str
    focus: Annotated[str, Field(description="The set's diversity focus.")]
    personas: list[str] = Field(default_factory=list, description="Persona roles it draws.")
    task_kinds: list[str] = Field(default_factory=list, description="Goal templates it allows (empty: all).")
    summary: str = ""


class WorkerPrompt(BaseModel):
    """One worker's prompt (the system text; the role's template is unchanged)."""

    worker: Annotated[str, Field(description="Gateway role name of the worker.")]
    system: Annotated[str, Field(min_length=1)]


class PromptEngineerInput(BaseModel):
    """Write (phase 1) or revise (phase 2) one prompt set."""

    set_index: Annotated[int, Field(ge=0, description="Position of the set among the K of phase 1.")]
    domain: DomainSummary
    plan: WorkflowPlan
    params: PoolParams
    base_prompts: list[WorkerPrompt] = Field(
        default_factory=list, description="The workers' default prompts (a starting point)."
    )
    earlier: list[PromptSetSummary] = Field(
        default_factory=list, description="Summaries of the sets written before this one."
    )
    current: list[WorkerPrompt] = Field(
        default_factory=list, description="Revision: the set's prompts now (empty: write a new set)."
    )
    focus: str = Field(default="", description="Revision: the set's focus, kept.")
    guidance: list[str] = Field(
        default_factory=list, description="Constraints / negative examples from the Judge's critiques."
    )
    worker_guidance: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Revision: worker role -> the guidance its prompt must include (only these change).",
    )


class PromptSetDraft(BaseModel):
    """A prompt set: one prompt per worker, its generator parameters, and its summary."""

    focus: Annotated[str, Field(min_length=1, description="The diversity focus of the set.")]
    prompts: Annotated[list[WorkerPrompt], Field(min_length=1)]
    params: PoolParams
    summary: Annotated[str, Field(description="A paragraph for the sets written after this one.")]
    conditioned_on: list[str] = Field(default_factory=list, description="Earlier set ids it avoided.")


# --------------------------------------------------------------------------- Judge


class PilotThresholds(BaseModel):
    """When a pilot has converged (§4.4 phase 2), and what the Judge aims for."""

    max_infeasibility: Annotated[
        Score, Field(description="Stop once the INFEASIBLE share is at most this.")
    ] = 0.2
    min_validity: Annotated[Score, Field(description="... and tool-call validity is at least this.")] = 0.9
    max_quality_change: Annotated[
        float | None, Field(ge=0, description="... and quality moved at most this since the last batch.")
    ] = 0.25
    min_coverage: Annotated[Score, Field(description="Below this the Judge widens task kinds.")] = 0.3
    min_dialogue_pass_rate: Annotated[
        Score, Field(description="... and at least this share of the dialogues passed (when synthesized).")
    ] = 0.5


class BatchMetrics(BaseModel):
    """What was measured on one pilot batch."""

    size: Annotated[int, Field(ge=0, description="Intents generated.")]
    generation_failures: int = Field(default=0, description="Draws that yielded no intent.")
    infeasibility: Score | None = Field(
        description="INFEASIBLE share before repair (None: TaskValidation did not run, unmeasured)."
    )
    failure_shares: dict[str, float] = Field(
        default_factory=dict, description="Per failure category: share of intents failing so."
    )
    tool_call_validity: Score = 1.0
    quality: Score = 0.0
    coverage: Annotated[Score, Field(description="Task kinds seen / task kinds the domain offers.")] = 0.0
    kinds_seen: list[str] = Field(default_factory=list)
    kinds_available: list[str] = Field(default_factory=list)
    mean_required_calls: float = 0.0
    mean_repair_rounds: float | None = None
    schema_errors: list[str] = Field(default_factory=list, description="Distinct static/schema problems.")
    examples: list[str] = Field(default_factory=list, description="A few failure reasons, verbatim.")
    dialogues: int = Field(default=0, ge=0, description="Dialogues synthesized (0: DialogSynthesis not run).")
    dialogue_pass_rate: float | None = Field(
        default=None, ge=0, le=1, description="Share of the dialogues TrajectoryValidation passed."
    )
    dialogue_first_pass_rate: float | None = Field(
        default=None, ge=0, le=1, description="Share of the first dialogues that passed (before Modify)."
    )
    dialogue_quality: float | None = Field(
        default=None, ge=0, le=1, description="Mean validation-dimension score of the dialogues."
    )
    verified_share: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Share of the batch's tasks that ended as a verified instance (None: not run).",
    )
    needed_repair: int = Field(default=0, ge=0, description="Items whose first validation failed.")
    repaired: int = Field(default=0, ge=0, description="Items that passed after Modify rounds.")
    failures_by_stage: dict[str, int] = Field(
        default_factory=dict, description="Where items failed: task_validation, trajectory_validation, ..."
    )


FailureStage = Literal["generation", "task_validation", "trajectory_validation", "verification"]


class FailureSample(BaseModel):
    """One failing artifact of a pilot batch, with the diagnosis of the check that failed it."""

    seed: int
    stage: Annotated[FailureStage, Field(description="The check that failed it.")]
    objective: str = Field(default="", description="The task's objective ('' when no task came).")
    diagnosis: list[str] = Field(default_factory=list, description="The check's reasons, verbatim.")
    categories: list[str] = Field(
        default_factory=list,
        description="Task failure categories (task_validation) or dialogue criteria (trajectory_validation).",
    )
    repair_rounds: int = Field(default=0, ge=0, description="Modify rounds tried on it.")
    repaired: bool = Field(
        default=False, description="Modify fixed it in the end (the worker that made it still failed)."
    )
    end_signal: str = Field(default="", description="How the dialogue ended ('' without one).")
    failed_calls: list[str] = Field(
        default_factory=list, description="'name: error' of the dialogue's calls the tools refused."
    )
    excerpt: list[dict[str, Any]] = Field(
        default_factory=list, description="The dialogue's last messages (role, content, tool calls), cut."
    )


class JudgeInput(BaseModel):
    """A pilot batch's measurements, sampled failing artifacts, the set's parameters and the targets."""

    set_id: str
    iteration: Annotated[int, Field(ge=0)]
    params: PoolParams
    metrics: BatchMetrics
    targets: PilotThresholds
    failures: list[FailureSample] = Field(
        default_factory=list, description="Sampled failing tasks / dialogues with their diagnosis."
    )
    workers: list[str] = Field(
        default_factory=list,
        description="The gateway roles whose prompts may be edited (planned, not frozen).",
    )


class CritiqueScores(BaseModel):
    """The four axes of §4.1, each in [0, 1]."""

    executability: Score
    tool_correctness: Score
    trajectory_coherence: Score
    difficulty_coverage: Score


PoolParamName = Literal[
    "min_calls",
    "max_calls",
    "branching",
    "ambiguity",
    "error_prone_parameters",
    "policy_pressure",
    "deception",
    "personas",
    "task_kinds",
]


class ParamUpdate(BaseModel):
    """Set one generator parameter."""

    name: PoolParamName
    value: Any = Field(description="The new value (JSON).")
    previous: Any = Field(default=None, description="The value it replaces.")
    reason: str = ""


class PromptEdit(BaseModel):
    """One edit of a worker's prompt."""

    worker: Annotated[str, Field(description="Gateway role name of the worker.")]
    kind: Literal["add_constraint", "negative_example", "style"]
    text: Annotated[str, Field(min_length=1)]


class Critique(BaseModel):
    """The Judge's structured critique of a pilot batch."""

    scores: CritiqueScores
    findings: list[str] = Field(default_factory=list)
    param_updates: list[ParamUpdate] = Field(default_factory=list)
    prompt_edits: list[PromptEdit] = Field(default_factory=list)
    converged: bool = Field(default=False, description="The batch met every target.")


# --------------------------------------------------------------------------- roles

_JSON_ONLY = "Output: one JSON object matching the schema, and nothing else."

EIGEN_PLANNER: Role[GenerationRequest, PlannedWorkflow] = Role(
    name="eigen_planner",
    input=GenerationRequest,
    output=PlannedWorkflow,
    system=(
        "You are the Workflow Planner Agent of a hierarchical data-generation system. Given a "
        "generation request, the domain specification (tool schemas, policy, environment) and the "
        "generation targets (size, difficulty, diversity, outputs), plan which worker agents to "
        "invoke and in what order. Workers available: "
        + ", ".join(name for name, _ in WORKERS)
        + ". For each worker give its gateway role, the artifacts it reads (inputs) and writes "
        "(outputs), and the earlier workers it depends on; the list must be in execution order and always "
        "starts with RandomPool and UserIntent (they draw the tasks). "
        "Skip VerificationFunction when only SFT data is requested (no rewards needed).\n"
        "Replanning (review given): start from review.plan and adjust it to what the last pilot batch "
        "showed: drop Modify when no item needed repair, put it back (after TrajectoryValidation) when "
        "items did; set evolve=false on RandomPool and UserIntent once the tasks meet the targets "
        "(infeasibility and tool-call validity), so the dialogue workers' prompts evolve against fixed "
        "tasks, and evolve=true again when they stop meeting them. Say why in the rationale. " + _JSON_ONLY
    ),
    template="Generation request and domain:\n{input}\n\nReturn the workflow plan.",
)

EIGEN_PROMPT_ENGINEER: Role[PromptEngineerInput, PromptSetDraft] = Role(
    name="eigen_prompt_engineer",
    input=PromptEngineerInput,
    output=PromptSetDraft,
    system=(
        "You are the Prompt Engineer Agent. For each worker of the plan write its prompt: (i) embed "
        "the tool schemas and policy constraints, (ii) specify the expected output, (iii) include the "
        "guidance derived from earlier failures (add constraints when failures are systematic, "
        "negative examples for recurring hallucinations, style controls for realism).\n"
        "Writing a new set (current empty): choose a focus (persona mix, task-kind mix, difficulty "
        "pattern) that the earlier sets' summaries do NOT cover, reflect it in the generator "
        "parameters (personas, task_kinds, difficulty knobs) and in every prompt, and summarise the "
        "set in a paragraph for the sets after it.\n"
        "Revising a set (current given): keep its focus; worker_guidance gives, per worker role, the "
        "guidance that worker's prompt must now include -- rewrite only those prompts and return every "
        "other prompt unchanged, word for word. " + _JSON_ONLY
    ),
    template="Plan, domain, parameters, earlier sets and guidance:\n{input}\n\nReturn the prompt set.",
)

EIGEN_JUDGE: Role[JudgeInput, Critique] = Role(
    name="eigen_judge",
    input=JudgeInput,
    output=Critique,
    system=(
        "You are the Judge Agent. Critique a pilot batch of generated tasks and dialogues along (a) executability "
        "(solvable with the tools and state: the INFEASIBLE share and its failure categories), (b) "
        "tool correctness (schema compliance, argument validity, existing functions), (c) trajectory "
        "coherence (goal progression, consistent requirements) and (d) difficulty & coverage "
        "(task-kind coverage, required calls, edge cases). Score each axis in [0, 1], list findings, "
        "and emit concrete updates: param_updates to the generator parameters (e.g. lower "
        "error_prone_parameters when tasks fail on missing resources, lower policy_pressure when they "
        "fail on policy violations, widen task_kinds when coverage is low) and prompt_edits "
        "(add_constraint / negative_example / style) for the worker responsible. Read the sampled "
        "failures: each names the check that failed it (task_validation, trajectory_validation, "
        "verification) and its diagnosis; address each edit to the gateway role that caused the "
        "failure (e.g. eigen_trajectory_agent for wrong or ungrounded tool calls and policy breaches, "
        "user_simulator for unrealistic or premature endings, eigen_task_validation for tasks it "
        "passed that the dialogue showed infeasible, eigen_modify for repairs that did not fix, "
        "eigen_trajectory_validation for dialogues it passed that the verifier rejected), and only "
        "to roles listed in workers. Set converged when every target is met (then no parameter updates; prompt edits only for the sampled failures). "
        + _JSON_ONLY
    ),
    template="Pilot batch metrics, parameters and targets:\n{input}\n\nReturn the critique.",
)

EIGEN_ORCHESTRATION_ROLES: tuple[Role[Any, Any], ...] = (EIGEN_PLANNER, EIGEN_PROMPT_ENGINEER, EIGEN_JUDGE)
"""All EigenData orchestration-layer roles (for prompt registration)."""


PlanReview.model_rebuild()
GenerationRequest.model_rebuild()

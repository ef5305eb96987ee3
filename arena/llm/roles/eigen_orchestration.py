"""EigenData orchestration-layer roles (EigenData §4.1, §4.3, §4.4): Planner, Prompt Engineer, Judge.

- ``EIGEN_PLANNER`` (Workflow Planner): a generation request + the domain spec -> the worker DAG
  (ordered workers, each with the artifacts it reads and writes and the workers it depends on).
- ``EIGEN_PROMPT_ENGINEER``: writes each planned worker's prompt for one prompt set, conditioned on
  the summaries of the sets written before it (phase-1 diversity), and revises a set's prompts
  with the guidance the Judge derived from failures (phase-2 evolution).
- ``EIGEN_JUDGE``: critiques a pilot batch on the four axes of §4.1 (executability, tool
  correctness, trajectory coherence, difficulty & coverage) and emits concrete updates: generator
  parameter changes (``PoolParams``) and prompt edits (constraints, negative examples, style).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.llm.core import Role
from arena.llm.roles.eigen import DomainSummary, PoolParams

__all__ = [
    "EIGEN_JUDGE",
    "EIGEN_ORCHESTRATION_ROLES",
    "EIGEN_PLANNER",
    "EIGEN_PROMPT_ENGINEER",
    "WORKERS",
    "BatchMetrics",
    "Critique",
    "CritiqueScores",
    "GenerationRequest",
    "JudgeInput",
    "ParamUpdate",
    "PilotThresholds",
    "PromptEdit",
    "PromptEngineerInput",
    "PromptSetDraft",
    "PromptSetSummary",
    "WorkerNode",
    "WorkerPrompt",
    "WorkflowPlan",
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


# --------------------------------------------------------------------------- Planner


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


class WorkerNode(BaseModel):
    """One worker of the planned workflow."""

    name: Annotated[str, Field(description="Worker name, e.g. 'RandomPool'.")]
    role: Annotated[str, Field(description="Gateway role that implements it, e.g. 'eigen_random_pool'.")]
    inputs: list[str] = Field(default_factory=list, description="Artifacts it reads.")
    outputs: list[str] = Field(default_factory=list, description="Artifacts it writes.")
    depends_on: list[str] = Field(default_factory=list, description="Workers whose outputs it reads.")


class WorkflowPlan(BaseModel):
    """The worker DAG, in execution order."""

    workers: Annotated[list[WorkerNode], Field(min_length=1)]
    rationale: str = ""

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workers]

    def check(self) -> None:
        """Raise ``ValueError`` unless every dependency names an earlier worker (a DAG in order)."""
        seen: set[str] = set()
        for worker in self.workers:
            unknown = [d for d in worker.depends_on if d not in seen]
            if unknown:
                raise ValueError(f"{worker.name} depends on {unknown}, not earlier workers")
            seen.add(worker.name)


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


class BatchMetrics(BaseModel):
    """What was measured on one pilot batch."""

    size: Annotated[int, Field(ge=0, description="Intents generated.")]
    generation_failures: int = Field(default=0, description="Draws that yielded no intent.")
    infeasibility: Annotated[Score, Field(description="INFEASIBLE share before repair.")]
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


class JudgeInput(BaseModel):
    """A pilot batch's measurements, the set's parameters and the targets."""

    set_id: str
    iteration: Annotated[int, Field(ge=0)]
    params: PoolParams
    metrics: BatchMetrics
    targets: PilotThresholds


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

EIGEN_PLANNER: Role[GenerationRequest, WorkflowPlan] = Role(
    name="eigen_planner",
    input=GenerationRequest,
    output=WorkflowPlan,
    system=(
        "You are the Workflow Planner Agent of a hierarchical data-generation system. Given a "
        "generation request, the domain specification (tool schemas, policy, environment) and the "
        "generation targets (size, difficulty, diversity, outputs), plan which worker agents to "
        "invoke and in what order. Workers available: "
        + ", ".join(name for name, _ in WORKERS)
        + ". For each worker give its gateway role, the artifacts it reads (inputs) and writes "
        "(outputs), and the earlier workers it depends on; the list must be in execution order. "
        "Skip VerificationFunction when only SFT data is requested (no rewards needed). " + _JSON_ONLY
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
        "Revising a set (current given): keep its focus and change only what the guidance asks. " + _JSON_ONLY
    ),
    template="Plan, domain, parameters, earlier sets and guidance:\n{input}\n\nReturn the prompt set.",
)

EIGEN_JUDGE: Role[JudgeInput, Critique] = Role(
    name="eigen_judge",
    input=JudgeInput,
    output=Critique,
    system=(
        "You are the Judge Agent. Critique a pilot batch of generated tasks along (a) executability "
        "(solvable with the tools and state: the INFEASIBLE share and its failure categories), (b) "
        "tool correctness (schema compliance, argument validity, existing functions), (c) trajectory "
        "coherence (goal progression, consistent requirements) and (d) difficulty & coverage "
        "(task-kind coverage, required calls, edge cases). Score each axis in [0, 1], list findings, "
        "and emit concrete updates: param_updates to the generator parameters (e.g. lower "
        "error_prone_parameters when tasks fail on missing resources, lower policy_pressure when they "
        "fail on policy violations, widen task_kinds when coverage is low) and prompt_edits "
        "(add_constraint / negative_example / style) for the worker responsible. Set converged when "
        "every target is met (then no updates). " + _JSON_ONLY
    ),
    template="Pilot batch metrics, parameters and targets:\n{input}\n\nReturn the critique.",
)

EIGEN_ORCHESTRATION_ROLES: tuple[Role[Any, Any], ...] = (EIGEN_PLANNER, EIGEN_PROMPT_ENGINEER, EIGEN_JUDGE)
"""All EigenData orchestration-layer roles (for prompt registration)."""

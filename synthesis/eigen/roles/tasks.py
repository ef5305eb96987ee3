"""EigenData execution-layer roles (EigenData §4.2, appendix prompts): task generation and repair.

- ``EIGEN_RANDOM_POOL`` (RandomPool): a scenario seed from the domain summary, a seed and the
  generator parameters (``PoolParams``, the knobs self-evolution tunes): a persona, an environment
  context (entities sampled from the seeded database) and difficulty factors.
- ``EIGEN_USER_INTENT`` (UserIntent): a concrete task on that seed: objective, must / must-not
  requirements, hidden subgoals, deception tactics, must-have functions, rubrics, and the goals
  as the state-changing calls they ask for (so a probe can execute them).
- ``EIGEN_TASK_VALIDATION`` (TaskValidation): the verdict on a task from a feasibility probe's
  evidence -- calls really executed against a copy of the state (reads, then a dry run of the
  goals with the pack's policy rules checked) -- FEASIBLE with a plan, or INFEASIBLE with reasons
  and suggested fixes. "Execute, don't assume": the verdict rests on the probe, never on belief.
- ``EIGEN_MODIFY`` (Modify, task repair): the smallest edit of the task that applies the
  verdict's suggested fixes while keeping its objective, difficulty and persona.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from arena.llm.core import Role
from arena.records.eigen import (
    Goal,
    GoalCall,
    Persona,
    PlanStep,
    PoolDraw,
    Repair,
    UserIntent,
)
from synthesis.eigen.spec import SynthesisSpec

__all__ = [
    "EIGEN_MODIFY",
    "EIGEN_RANDOM_POOL",
    "EIGEN_ROLES",
    "EIGEN_TASK_VALIDATION",
    "EIGEN_USER_INTENT",
    "Alternative",
    "DomainSummary",
    "EntityRef",
    "FailureCategory",
    "FailureReason",
    "FixType",
    "GoalOption",
    "ModifyInput",
    "ModifyOutput",
    "PoolParams",
    "ProbeCall",
    "ProbeReport",
    "RandomPoolInput",
    "RuleBrief",
    "SuggestedFix",
    "TaskValidationInput",
    "TaskVerdict",
    "ToolBrief",
    "UserIntentInput",
    "template_kinds",
]

Probability = Annotated[float, Field(ge=0.0, le=1.0)]

DECEPTION_TACTICS = (
    "false_status_claims",
    "emotional_manipulation",
    "authority_appeals",
    "progressive_misinformation",
)


# --------------------------------------------------------------------------- domain


GOAL_TEMPLATES = (
    "cancel_order",
    "update_order_address",
    "return_items",
    "issue_refund",
    "issue_store_credit",
)
"""The customer-service pack's goal templates (kept for callers that predate pack declarations;
``template_kinds(domain)`` gives any pack's)."""


class ToolBrief(BaseModel):
    """One tool of the domain, as the workers see it."""

    name: Annotated[str, Field(description="Function name.")]
    description: Annotated[str, Field(description="What it does.")]
    actor: Annotated[Literal["agent", "user"], Field(description="Who may call it (dual control).")]
    kind: Annotated[Literal["read", "write"], Field(description="read: looks up; write: may change state.")]
    parameters: dict[str, Any] = Field(default_factory=dict, description="JSON Schema of the arguments.")


class RuleBrief(BaseModel):
    """One policy rule of the domain (its code lives in the pack)."""

    name: Annotated[str, Field(description="Rule name.")]
    description: Annotated[str, Field(description="What the rule demands.")]


class DomainSummary(BaseModel):
    """What a worker knows of a domain pack."""

    name: Annotated[str, Field(description="Domain name.")]
    description: Annotated[str, Field(description="The setting in a paragraph.")]
    policy: Annotated[str, Field(description="The policy document the agent follows.")]
    tools: Annotated[list[ToolBrief], Field(description="Agent and user tools.")]
    rules: list[RuleBrief] = Field(default_factory=list, description="Policy rules checked as code.")
    entity_counts: dict[str, int] = Field(default_factory=dict, description="Rows per database table.")
    today: Annotated[str, Field(description="The database's current date (ISO), '' if none.")] = ""
    synthesis: SynthesisSpec | None = Field(
        default=None,
        description="The pack's declarations: customer lookup, entities, user actions, task templates.",
    )

    def tool(self, name: str) -> ToolBrief | None:
        return next((t for t in self.tools if t.name == name), None)


def template_kinds(domain: DomainSummary) -> list[str]:
    """The goal kinds a task on ``domain`` can draw: its declared templates (else the built-in names
    of ``GOAL_TEMPLATES`` it has tools for)."""
    if domain.synthesis is not None:
        return [t.kind for t in domain.synthesis.templates]
    names = {t.name for t in domain.tools}
    return [k for k in GOAL_TEMPLATES if k in names]


class EntityRef(BaseModel):
    """One entity of the seeded database (id and a few scalar attributes)."""

    kind: Annotated[str, Field(description="Table name, e.g. 'orders'.")]
    id: Annotated[str, Field(description="Its key in the table.")]
    attributes: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="Scalar fields useful for sampling (status, owner)."
    )


# --------------------------------------------------------------------------- RandomPool


DEFAULT_PERSONAS = [
    Persona(role="weekend hiker", expertise="occasional", tone="polite", priorities=["quick resolution"]),
    Persona(role="gear reviewer", expertise="expert", tone="precise", priorities=["accuracy", "details"]),
    Persona(role="parent shopping for kids", expertise="novice", tone="anxious", priorities=["refund speed"]),
    Persona(role="frequent buyer", expertise="frequent", tone="curt", priorities=["no hassle", "cost"]),
]


class PoolParams(BaseModel):
    """Generator parameters of RandomPool: the difficulty knobs self-evolution tunes."""

    min_calls: Annotated[int, Field(ge=1, le=40, description="Fewest tool calls a task should need.")] = 4
    max_calls: Annotated[int, Field(ge=1, le=40, description="Most tool calls a task should need.")] = 9
    branching: Annotated[Probability, Field(description="Chance of a conditional fallback goal.")] = 0.3
    ambiguity: Annotated[
        Probability, Field(description="Chance the user omits ids and describes instead.")
    ] = 0.3
    error_prone_parameters: Annotated[
        Probability, Field(description="Chance a goal carries a wrong (non-existent) id parameter.")
    ] = 0.1
    policy_pressure: Annotated[
        Probability, Field(description="Chance a goal asks for an action the policy forbids.")
    ] = 0.1
    deception: Annotated[Probability, Field(description="Chance the user uses a deception tactic.")] = 0.2
    personas: list[Persona] = Field(
        default_factory=lambda: [p.model_copy() for p in DEFAULT_PERSONAS],
        min_length=1,
        description="Persona pool to draw from.",
    )
    task_kinds: list[str] = Field(
        default_factory=list, description="Goal templates allowed (write-tool names); empty: all."
    )

    @model_validator(mode="after")
    def _range(self) -> PoolParams:
        if self.min_calls > self.max_calls:
            raise ValueError("min_calls must not exceed max_calls")
        return self


class RandomPoolInput(BaseModel):
    """Domain, seed, generator parameters and the entities of the seeded database."""

    domain: DomainSummary
    seed: Annotated[int, Field(ge=0, description="Scenario seed (same seed, same draw).")]
    params: PoolParams
    entities: Annotated[list[EntityRef], Field(description="Entities of the seeded database.")]


# --------------------------------------------------------------------------- UserIntent


class GoalOption(BaseModel):
    """A task template filled on one entity of the slice, and what a dry run of it showed."""

    kind: Annotated[str, Field(description="The template.")]
    entity_id: str | None = Field(default=None, description="The entity it is on (None: the account).")
    status: Literal["allowed", "forbidden", "unchecked"] = Field(
        description="allowed: its calls ran and broke no rule; forbidden: they ran but broke a policy "
        "rule; unchecked: not dry-run."
    )
    violation: str = Field(default="", description="The rule broken ('rule: message'), when forbidden.")
    goal: Goal
    summary: str = Field(default="", description="'wants to <summary>'.")
    must_not: str = Field(default="", description="The template's must-not requirement.")
    agent_writes: bool = Field(
        default=True, description="The goal needs an agent call (not only user actions)."
    )


class UserIntentInput(BaseModel):
    """The scenario seed, the domain (tools, policy) and the database slice it is about."""

    draw: PoolDraw
    domain: DomainSummary
    records: Annotated[
        dict[str, Any],
        Field(description="The seeded state's slice: today, the customer ('user'), their records."),
    ]
    options: list[GoalOption] = Field(
        default_factory=list,
        description="The pack's task templates filled on the slice's entities, each dry-run against "
        "the policy (empty: the worker fills the templates itself, unchecked).",
    )


# --------------------------------------------------------------------------- TaskValidation


class ProbeCall(BaseModel):
    """One call the feasibility probe executed in the sandbox on a copy of the state."""

    step: Annotated[int, Field(ge=0, description="Position in the probe.")]
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    actor: Literal["agent", "user"] = "agent"
    kind: Literal["read", "write"] = "read"
    purpose: Annotated[str, Field(description="Why it was called (which check or goal).")]
    goal_index: int | None = Field(
        default=None, description="The goal it belongs to (None: identity/lookup)."
    )
    refused_index: int | None = Field(default=None, description="The refused request it dry-runs.")
    ok: Annotated[bool, Field(description="It ran without raising.")]
    output: Any = Field(default=None, description="What it returned (cut).")
    error: str | None = Field(default=None, description="The error when it raised.")
    violations: list[str] = Field(
        default_factory=list, description="Policy rules it broke ('rule: message')."
    )


class Alternative(BaseModel):
    """A substitute for a failing goal that the probe dry-ran successfully."""

    goal_index: int
    calls: list[GoalCall]
    replacements: dict[str, str] = Field(default_factory=dict, description="old -> new strings in the texts.")
    evidence: str = ""


class ProbeReport(BaseModel):
    """The probe's evidence: executed calls, statically found problems, alternatives that work."""

    executed: list[ProbeCall] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list, description="Problems found without executing.")
    alternatives: list[Alternative] = Field(default_factory=list)


class TaskValidationInput(BaseModel):
    """A task and the probe's evidence."""

    intent: UserIntent
    domain: DomainSummary
    probe: ProbeReport


FailureCategory = Literal[
    "missing_resource",
    "contradictory_constraints",
    "policy_violation",
    "unknown_function",
    "invalid_arguments",
]
FixType = Literal["replace_entity", "change_argument", "reframe_as_refusal", "drop_goal"]


class FailureReason(BaseModel):
    """Why a task cannot be completed."""

    category: FailureCategory
    description: Annotated[str, Field(min_length=1)]
    evidence: str = Field(default="", description="The tool result proving it.")
    goal_index: int | None = Field(default=None, description="The goal (or refused request) concerned.")


class SuggestedFix(BaseModel):
    """A repair the Modify worker may apply."""

    fix_type: FixType
    goal_index: Annotated[int, Field(ge=0, description="Goal concerned (refused request for refusals).")]
    description: Annotated[str, Field(min_length=1)]
    target: Literal["goal", "refused"] = Field(default="goal", description="Which list goal_index indexes.")
    calls: list[GoalCall] = Field(default_factory=list, description="Replacement calls (replace/change).")
    replacements: dict[str, str] = Field(default_factory=dict, description="old -> new strings in the texts.")


class TaskVerdict(BaseModel):
    """FEASIBLE with a plan, or INFEASIBLE with reasons and suggested fixes."""

    status: Literal["FEASIBLE", "INFEASIBLE"]
    plan: list[PlanStep] = Field(default_factory=list, description="Ordered tool calls (FEASIBLE).")
    verification_results: dict[str, bool] = Field(default_factory=dict)
    failure_reasons: list[FailureReason] = Field(default_factory=list)
    suggested_fixes: list[SuggestedFix] = Field(default_factory=list)
    confidence: Literal["high", "medium", "low"] = "high"

    @model_validator(mode="after")
    def _consistent(self) -> TaskVerdict:
        if self.status == "FEASIBLE" and (self.failure_reasons or not self.plan):
            raise ValueError("FEASIBLE needs a plan and no failure reasons")
        if self.status == "INFEASIBLE" and not self.failure_reasons:
            raise ValueError("INFEASIBLE needs at least one failure reason")
        return self

    @property
    def reasons(self) -> list[str]:
        return [f"{r.category}: {r.description}" for r in self.failure_reasons]


# --------------------------------------------------------------------------- Modify


class ModifyInput(BaseModel):
    """A task that failed validation, the verdict, and the repair round (1 minimal .. 3 aggressive)."""

    intent: UserIntent
    verdict: TaskVerdict
    round: Annotated[int, Field(ge=1, le=10)]


class ModifyOutput(BaseModel):
    """The repaired task and what changed."""

    repair_mode: Literal["TASK"] = "TASK"
    repairs_applied: list[Repair] = Field(default_factory=list)
    repaired_intent: UserIntent


# --------------------------------------------------------------------------- roles

_JSON_ONLY = "Output: one JSON object matching the schema, and nothing else."

EIGEN_RANDOM_POOL: Role[RandomPoolInput, PoolDraw] = Role(
    name="eigen_random_pool",
    input=RandomPoolInput,
    output=PoolDraw,
    system=(
        "You are the random_pool agent generating diverse scenario seeds for multi-turn, multi-step "
        "tool-calling dialogues between customers and an AI customer-service agent.\n"
        "From the domain summary, the seed and the generator parameters, draw ONE scenario seed:\n"
        "- persona: one of params.personas;\n"
        "- context: one customer (user_id: an entity of the domain's customer collection, "
        "domain.synthesis.customer), the records that customer owns (order_ids: entities of the "
        "declared collections whose owner field names the customer) and the products they name; "
        "nonexistent_ids: one id per kind of owned record, shaped like real ones, that exist nowhere "
        "in the entities;\n"
        "- difficulty: required_calls within [params.min_calls, params.max_calls]; branching, "
        "ambiguity, error_prone_parameters and policy_violation each true with the probability the "
        "params give; deception_tactics drawn with probability params.deception from "
        f"{list(DECEPTION_TACTICS)};\n"
        "- testing_objectives: what the scenario tests (sequential_decision_making, "
        "multi_constraint_verification, deception_detection, edge_case_navigation).\n"
        "The same seed must give the same draw. " + _JSON_ONLY
    ),
    template="Domain, seed, parameters and entities:\n{input}\n\nReturn the scenario seed.",
)

EIGEN_USER_INTENT: Role[UserIntentInput, UserIntent] = Role(
    name="eigen_user_intent",
    input=UserIntentInput,
    output=UserIntent,
    system=(
        "You are the UserIntent agent. Conditioned on the scenario seed, write one concrete, realistic "
        "customer task on the given database slice that needs genuine multi-step tool use "
        "(retrieval -> decision -> action).\n"
        "- objective, reason_for_call (the opening message, in the persona's tone), known_info (what the "
        "customer knows: name, email, the code on their phone, order ids unless ambiguity is set);\n"
        "- requirements (must, in the order raised), must_not, hidden_subgoals (checked in validation, "
        "never said by the user), deception_tactics (the seed's, may be empty), must_have_functions "
        "(names of the domain's tools), rubrics (expected agent behaviour);\n"
        "- goals: each thing the user wants done, with its requirement text and the state-changing "
        "calls (tool name, arguments, actor) it takes; refused: requests the agent must decline.\n"
        "options lists the domain's task templates filled on the slice, each dry-run against the "
        "policy: build goals from 'allowed' options (their requirement and calls), a policy-violation "
        "goal from a 'forbidden' one.\n"
        "Use only tools of the domain and entities of the slice. When difficulty.error_prone_parameters "
        "is set, one goal uses an id from context.nonexistent_ids; when difficulty.policy_violation is "
        "set, one goal asks for an action the policy forbids (both are for the validator to catch). "
        "Otherwise every goal must be feasible under the policy. " + _JSON_ONLY
    ),
    template="Scenario seed, domain and database slice:\n{input}\n\nReturn the task.",
)

EIGEN_TASK_VALIDATION: Role[TaskValidationInput, TaskVerdict] = Role(
    name="eigen_task_validation",
    input=TaskValidationInput,
    output=TaskVerdict,
    system=(
        "You are the TaskValidationAgent performing tool-grounded feasibility validation. The probe "
        "has EXECUTED read calls and a dry run of the task's goals against a copy of the database, "
        "with the policy rules checked on every call; its evidence is in the input. Execute, don't "
        "assume: judge only from that evidence.\n"
        "- A goal whose call raised (unknown id, refused by the tool) is INFEASIBLE: missing_resource "
        "when an entity does not exist, else contradictory_constraints.\n"
        "- A goal whose call broke a policy rule is INFEASIBLE: policy_violation (policy primacy).\n"
        "- A refused request that the policy would in fact allow is contradictory_constraints.\n"
        "- Problems listed by the probe (unknown functions, bad arguments) are INFEASIBLE.\n"
        "If FEASIBLE: status, plan (the ordered calls that solve the task, from the probe's run), "
        "verification_results. If INFEASIBLE: failure_reasons (category, description naming the "
        "entity or rule, evidence) and suggested_fixes, in order of preference: replace_entity / "
        "change_argument from the probe's alternatives, else reframe_as_refusal for a policy "
        "violation (the user asks, the agent must decline), else drop_goal. " + _JSON_ONLY
    ),
    template="Task and probe evidence:\n{input}\n\nReturn the verdict.",
)

EIGEN_MODIFY: Role[ModifyInput, ModifyOutput] = Role(
    name="eigen_modify",
    input=ModifyInput,
    output=ModifyOutput,
    system=(
        "You are the ModifyAgent performing targeted repairs on tasks that failed validation, applying "
        "minimal edits to salvage them.\n"
        "Minimal intervention: apply the verdict's suggested fixes (one per failing goal in round 1, "
        "broader in round 2, aggressive in round 3: reframe or drop what still fails), and change "
        "nothing else. Preserve the objective's intent, the difficulty factors, the persona and at "
        "least 80% of must_have_functions. Consistency propagation: a replaced id or amount changes "
        "everywhere it appears (texts, known_info, goals).\n"
        "Output repairs_applied (target_field, original_value, repaired_value, rationale) and the "
        "complete repaired_intent. " + _JSON_ONLY
    ),
    template="Task, verdict and round:\n{input}\n\nReturn the repair.",
)

EIGEN_ROLES: tuple[Role[Any, Any], ...] = (
    EIGEN_RANDOM_POOL,
    EIGEN_USER_INTENT,
    EIGEN_TASK_VALIDATION,
    EIGEN_MODIFY,
)
"""All EigenData execution-layer roles (for prompt registration)."""

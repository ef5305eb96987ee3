"""EigenData DialogSynthesis and TrajectoryValidation roles (§4.2, appendix prompts).

- ``EIGEN_TRAJECTORY_AGENT`` (TrajectoryAgent): the assistant side of a synthesized dialogue. It
  sees the policy, the agent tools, the dialogue so far in OpenAI format (its own tool calls and
  their results included), the user's in-app actions (dual control) and today's date, and answers
  with EITHER tool calls OR one message to the user (the paper's ``<function>`` / ``<message>``),
  with its reasoning in ``think``. A message may ask the user to act in the app
  (``user_action_requests``: which user tool, with the arguments the app pre-fills).
- ``EIGEN_TRAJECTORY_VALIDATION`` (TrajectoryValidationAgent): the verdict on a finished dialogue,
  from the deterministic checks' evidence (``streams.eigen.dialogs.validate_dialog``): five rated
  dimensions, critical issues, non-critical observations, PASS / FAIL. The paper's decision
  rule: PASS when no CRITICAL issue and fewer than two dimensions rated Poor; FAIL otherwise.

The user side reuses ``arena.llm.roles.user_sim.USER_SIMULATOR``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from arena.llm.core import Role
from arena.llm.roles.eigen import UserIntent

__all__ = [
    "CRITERIA",
    "EIGEN_DIALOG_ROLES",
    "EIGEN_TRAJECTORY_AGENT",
    "EIGEN_TRAJECTORY_VALIDATION",
    "AgentStep",
    "AgentToolCall",
    "AppEvent",
    "DialogIssue",
    "DimensionRating",
    "Rating",
    "TrajectoryAgentInput",
    "TrajectoryValidationInput",
    "TrajectoryVerdict",
]

Criterion = Literal["schema", "grounding", "goal", "realism", "policy"]
CRITERIA: tuple[Criterion, ...] = ("schema", "grounding", "goal", "realism", "policy")
"""The five validation criteria of §4.2, in the paper's order."""
DIMENSIONS = {
    "schema": "function_correctness",
    "grounding": "data_consistency",
    "goal": "intent_alignment",
    "realism": "conversation_quality",
    "policy": "policy_compliance",
}
"""Criterion -> the appendix prompt's validation dimension."""
Rating = Literal["Good", "Acceptable", "Poor"]


# --------------------------------------------------------------------------- TrajectoryAgent


class AppEvent(BaseModel):
    """An action the customer took in the app (a user-tool call) and what it returned."""

    name: Annotated[str, Field(description="User tool name.")]
    arguments: dict[str, Any] = Field(default_factory=dict)
    ok: Annotated[bool, Field(description="It ran without raising.")]
    output: Any = Field(default=None, description="What it returned (or the error text).")
    after_message: Annotated[int, Field(ge=0, description="Index of the message it came with.")] = 0


class TrajectoryAgentInput(BaseModel):
    """What the agent sees: policy, tools, the dialogue so far, the customer's in-app actions."""

    policy: Annotated[str, Field(description="The domain policy the agent must follow.")]
    today: Annotated[str, Field(description="Today's date (ISO), '' if the domain has none.")] = ""
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI specs of the agent tools.")]
    user_tools: list[dict[str, Any]] = Field(
        default_factory=list, description="OpenAI specs of what the customer can do in the app."
    )
    messages: Annotated[
        list[dict[str, Any]],
        Field(description="The dialogue so far, OpenAI format (system, user, assistant + tool_calls, tool)."),
    ]
    app_events: list[AppEvent] = Field(default_factory=list, description="The customer's in-app actions.")


class AgentToolCall(BaseModel):
    """One agent tool call."""

    name: Annotated[str, Field(min_length=1, description="Agent tool name.")]
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments as a JSON object.")


class AgentStep(BaseModel):
    """The agent's next move: tool calls OR a message to the user, never both."""

    think: Annotated[str, Field(description="Reasoning (the paper's <think>).")] = ""
    tool_calls: list[AgentToolCall] = Field(default_factory=list, description="Calls to run now.")
    message: str | None = Field(default=None, description="Message to the user (no tool calls then).")
    user_action_requests: list[AgentToolCall] = Field(
        default_factory=list,
        description="User-tool actions the message asks the customer to take in the app, with the "
        "arguments the app pre-fills (e.g. the account id); the customer supplies the rest.",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> AgentStep:
        has_message = bool(self.message and self.message.strip())
        if bool(self.tool_calls) == has_message:
            raise ValueError("give either tool_calls or a non-empty message, not both and not neither")
        if self.tool_calls and self.user_action_requests:
            raise ValueError("user_action_requests go with a message")
        return self


# --------------------------------------------------------------------------- TrajectoryValidation


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


class TrajectoryValidationInput(BaseModel):
    """The task, the dialogue and the deterministic checks' evidence."""

    intent: UserIntent
    messages: list[dict[str, Any]]
    calls: list[dict[str, Any]] = Field(default_factory=list, description="CallRecord dicts with actor.")
    ratings: dict[str, DimensionRating] = Field(
        default_factory=dict, description="Criterion -> rating computed by the checks."
    )
    issues: list[DialogIssue] = Field(default_factory=list, description="What the checks found.")


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


# --------------------------------------------------------------------------- roles

EIGEN_TRAJECTORY_AGENT: Role[TrajectoryAgentInput, AgentStep] = Role(
    name="eigen_trajectory_agent",
    input=TrajectoryAgentInput,
    output=AgentStep,
    system=(
        "You are a customer-service agent. Help the user efficiently while strictly adhering to the "
        "company policy given in the input.\n"
        "Every response: reason in 'think', then act with EITHER tool_calls OR a message -- never both. "
        "After any tool calls you must send a message before the user speaks again.\n"
        "- Identify the customer first (look them up from what they told you) and verify their identity "
        "as the policy demands before any change; never act on another customer's account.\n"
        "- Read before you write: check with look-up tools that each request is allowed (status, dates, "
        "limits) before acting; confirm every write with the customer first.\n"
        "- Refuse requests the policy forbids, saying which rule forbids it; offer the allowed "
        "alternative or a transfer to a human agent when the policy says so.\n"
        "- Always trust system data over user claims. State only facts (ids, amounts, statuses, dates) "
        "that appear in tool results or in the user's messages; never invent any.\n"
        "- When the user must act in the app (a user tool), ask for it in the message and list it in "
        "user_action_requests with the arguments the app pre-fills.\n"
        'Output: one JSON object {"think": string, "tool_calls": [{"name", "arguments"}], "message": '
        'string | null, "user_action_requests": [{"name", "arguments"}]} and nothing else.'
    ),
    template="Policy, tools, dialogue and app events:\n{input}\n\nReturn your next step.",
)

EIGEN_TRAJECTORY_VALIDATION: Role[TrajectoryValidationInput, TrajectoryVerdict] = Role(
    name="eigen_trajectory_validation",
    input=TrajectoryValidationInput,
    output=TrajectoryVerdict,
    system=(
        "You are the TrajectoryValidationAgent validating completed conversation trajectories for "
        "benchmark inclusion. The deterministic checks' findings are in the input; judge from them and "
        "the dialogue.\n"
        "CRITICAL issues (cause FAIL): function errors (non-existent functions, wrong parameter names or "
        "types); data fabrication (the assistant states an id, amount, status or date found in no earlier "
        "tool result or user message); severe policy violations (a policy rule broken by a call, a "
        "must-not requirement broken); goal failure (a goal of the task not achieved).\n"
        "NON-CRITICAL (note but PASS): minor inefficiencies, not all must_have_functions used, extra "
        "clarifying questions, failed attempts that were recovered.\n"
        "Dimensions: conversation_quality (realism: no empty or repeated turns, the user does not copy "
        "instructions), function_correctness, policy_compliance, intent_alignment, data_consistency -- "
        "each Good / Acceptable / Poor.\n"
        "Decision: PASS when all dimensions are Good/Acceptable and there is no CRITICAL issue; FAIL on "
        "any CRITICAL issue or 2+ dimensions rated Poor; a FAIL names the primary reason.\n"
        "Output: one JSON object matching the schema, and nothing else."
    ),
    template="Task, dialogue and check findings:\n{input}\n\nReturn the verdict.",
)

EIGEN_DIALOG_ROLES: tuple[Role[Any, Any], ...] = (EIGEN_TRAJECTORY_AGENT, EIGEN_TRAJECTORY_VALIDATION)
"""The DialogSynthesis / TrajectoryValidation roles (for prompt registration)."""

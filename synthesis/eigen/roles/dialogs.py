"""EigenData DialogSynthesis and TrajectoryValidation roles (§4.2, appendix prompts).

- ``EIGEN_TRAJECTORY_AGENT`` (TrajectoryAgent): the assistant side of a synthesized dialogue. It
  sees the policy, the agent tools, the dialogue so far in OpenAI format (its own tool calls and
  their results included), the user's in-app actions (dual control) and today's date, and answers
  with EITHER tool calls OR one message to the user (the paper's ``<function>`` / ``<message>``),
  with its reasoning in ``think``. A message may ask the user to act in the app
  (``user_action_requests``: which user tool, with the arguments the app pre-fills).
- ``EIGEN_TRAJECTORY_VALIDATION`` (TrajectoryValidationAgent): the verdict on a finished dialogue,
  from the deterministic checks' evidence (``synthesis.eigen.dialog_synthesis.validate_dialog``): five rated
  dimensions, critical issues, non-critical observations, PASS / FAIL. The paper's decision
  rule: PASS when no CRITICAL issue and fewer than two dimensions rated Poor; FAIL otherwise.

The user side reuses ``arena.llm.roles.user_sim.USER_SIMULATOR``.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from arena.llm.core import AgentIO, Role, ToolCall, sendable
from arena.records.eigen import Criterion, DialogIssue, DimensionRating, TrajectoryVerdict, UserIntent
from synthesis.eigen.spec import SynthesisSpec

__all__ = [
    "CRITERIA",
    "EIGEN_DIALOG_ROLES",
    "EIGEN_TRAJECTORY_AGENT",
    "EIGEN_TRAJECTORY_VALIDATION",
    "YES_RE",
    "AgentStep",
    "AgentToolCall",
    "AppEvent",
    "ReferenceStep",
    "TrajectoryAgentInput",
    "TrajectoryValidationInput",
    "dialog_system_message",
    "grounded_values",
]

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


# --------------------------------------------------------------------------- TrajectoryAgent


class AppEvent(BaseModel):
    """An action the customer took in the app (a user-tool call) and what it returned."""

    name: Annotated[str, Field(description="User tool name.")]
    arguments: dict[str, Any] = Field(default_factory=dict)
    ok: Annotated[bool, Field(description="It ran without raising.")]
    output: Any = Field(default=None, description="What it returned (or the error text).")
    after_message: Annotated[int, Field(ge=0, description="Index of the message it came with.")] = 0


class ReferenceStep(BaseModel):
    """One call of a reference solution (synthesis only): what a correct agent ends up doing."""

    name: Annotated[str, Field(min_length=1, description="Tool name (an agent tool, or a user tool).")]
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments as a JSON object.")
    actor: Literal["agent", "user"] = Field(
        default="agent", description="agent: the agent calls it; user: the agent asks the user to do it."
    )
    writes: bool = Field(default=False, description="It changes records: propose it and get a yes first.")


YES_RE = re.compile(r"^\W*(?:yes|yeah|yep|sure|ok(?:ay)?|please (?:go ahead|do)|go ahead|confirmed?)\b", re.I)
"""A customer's message that says yes to a proposal (how it starts)."""


def grounded_values(value: Any) -> list[str]:
    """The strings in a call's arguments that must have appeared in the dialogue before the call:
    those holding a digit or an ``@`` (ids, codes, dates, emails), at any depth."""
    if isinstance(value, str):
        return [value] if any(c.isdigit() for c in value) or "@" in value else []
    if isinstance(value, dict):
        return [v for item in value.values() for v in grounded_values(item)]
    if isinstance(value, list):
        return [v for item in value for v in grounded_values(item)]
    return []


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
    synthesis: SynthesisSpec | None = Field(
        default=None,
        exclude=True,  # a rules stand-in's reading of the pack; never sent to a model
        description="The pack's declarations (customer lookup, entities, task templates, user actions); "
        "None: a rules agent looks them up among the bundled packs by the tool names.",
    )
    policy_source: str = Field(
        default="",
        exclude=True,
        description="The pack's policy rules as code (policy.py); '' when not given.",
    )
    reference: list[ReferenceStep] | None = Field(
        default=None,
        description="A reference solution of the task (synthesis from a benchmark's train split): the "
        "calls a correct agent makes, in order ([]: it makes none, e.g. it must refuse); None outside "
        "such synthesis. Never shown in training data.",
    )
    reference_info: list[str] = Field(
        default_factory=list, description="Facts the reference solution tells the user (said verbatim)."
    )


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


class TrajectoryValidationInput(BaseModel):
    """The task, the dialogue and the deterministic checks' evidence."""

    intent: UserIntent
    messages: list[dict[str, Any]]
    calls: list[dict[str, Any]] = Field(default_factory=list, description="CallRecord dicts with actor.")
    ratings: dict[str, DimensionRating] = Field(
        default_factory=dict, description="Criterion -> rating computed by the checks."
    )
    issues: list[DialogIssue] = Field(default_factory=list, description="What the checks found.")


# --------------------------------------------------------------------------- roles

# --------------------------------------------------------------------------- native chat form

APP_ACTION_TOOL = "request_app_action"
"""The tool through which a native agent asks the customer to act in the app (``user_action_requests``)."""
NATIVE_INSTRUCTIONS = (
    "You are a customer-service agent. Help the user efficiently while strictly adhering to the "
    "company policy below.\n"
    "- Identify the customer first and verify their identity as the policy demands before any "
    "change; never act on another customer's account.\n"
    "- Read before you write: check with look-up tools that each request is allowed before acting; "
    "confirm every write with the customer first.\n"
    "- Refuse requests the policy forbids, saying which rule forbids it.\n"
    "- Trust system data over user claims; state only facts that appear in tool results or in the "
    "user's messages.\n"
    "- Each turn either calls tools or writes one message to the customer, never both. When the "
    f"customer must act in the app, write the message asking for it and call {APP_ACTION_TOOL} with "
    "the action and the arguments the app pre-fills."
)
"""The agent's instructions when it speaks the chat API natively (the JSON contract is not needed)."""
_TODAY = re.compile(r"\n\nToday's date: (?P<today>[^\n]*)\.$")
_APP_ACTIONS = "\n\n<app_actions>\n"
_APP_EVENTS = "\n\n<app_events>\n"
_REFERENCE = "\n\n<reference_solution>\n"
REFERENCE_NOTE = (
    "A reference solution follows: reach the same calls (agent calls yourself, user calls by asking the "
    "customer), using only values the customer gave or tools returned, proposing each write and waiting "
    "for a yes first, and telling the customer every listed fact. Never mention the reference."
)


def dialog_system_message(policy: str, today: str) -> str:
    """The system message a dialogue opens with: the policy and today's date."""
    return policy + (f"\n\nToday's date: {today}." if today else "")


def _app_action_tool(user_tools: list[dict[str, Any]]) -> dict[str, Any]:
    names = [str(t.get("function", {}).get("name")) for t in user_tools]
    return {
        "type": "function",
        "function": {
            "name": APP_ACTION_TOOL,
            "description": "Ask the customer to take an action in the app (listed in <app_actions>); "
            "goes with the message that asks for it.",
            "parameters": {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": names, "description": "The app action."},
                    "arguments": {"type": "object", "description": "Arguments the app pre-fills."},
                },
                "required": ["action"],
            },
        },
    }


def _conversation(inputs: TrajectoryAgentInput) -> list[dict[str, Any]]:
    """The instructions and the dialogue's system message first; app events inside the user turns."""
    out: list[dict[str, Any]] = []
    events: dict[int, list[dict[str, Any]]] = {}
    for event in inputs.app_events:
        events.setdefault(event.after_message, []).append(event.model_dump(mode="json"))
    for i, message in enumerate(inputs.messages):
        message = sendable(message)
        if i == 0 and message.get("role") == "system":
            actions = f"{_APP_ACTIONS}{json.dumps(inputs.user_tools, ensure_ascii=False)}\n</app_actions>"
            message["content"] = (
                f"{NATIVE_INSTRUCTIONS}\n\n{message.get('content') or ''}"
                + (actions if inputs.user_tools else "")
                + _reference_block(inputs)
            )
        if i in events:
            listed = json.dumps(events[i], ensure_ascii=False)
            message["content"] = f"{message.get('content') or ''}{_APP_EVENTS}{listed}\n</app_events>"
        out.append(message)
    return out


def _reference_block(inputs: TrajectoryAgentInput) -> str:
    if inputs.reference is None:
        return ""
    listed = json.dumps(
        {
            "calls": [r.model_dump(mode="json") for r in inputs.reference],
            "tell_the_customer": inputs.reference_info,
        },
        ensure_ascii=False,
    )
    return f"{_REFERENCE}{REFERENCE_NOTE}\n{listed}\n</reference_solution>"


def _inputs_from(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> TrajectoryAgentInput:
    """The inverse of ``_conversation`` (and of ``_tools``); ValueError when they are not its output."""
    if not messages or messages[0].get("role") != "system":
        raise ValueError("the conversation does not open with the agent's system message")
    system = str(messages[0].get("content") or "")
    if not system.startswith(NATIVE_INSTRUCTIONS + "\n\n"):
        raise ValueError("the system message is not the eigen agent's")
    system = system[len(NATIVE_INSTRUCTIONS) + 2 :]
    reference: dict[str, Any] | None = None
    if _REFERENCE in system:
        system, _, block = system.partition(_REFERENCE)
        reference = json.loads(
            block.removeprefix(REFERENCE_NOTE + "\n").removesuffix("\n</reference_solution>")
        )
    user_tools: list[dict[str, Any]] = []
    if _APP_ACTIONS in system:
        system, _, listed = system.partition(_APP_ACTIONS)
        user_tools = json.loads(listed.removesuffix("\n</app_actions>"))
    today_match = _TODAY.search(system)
    policy = system[: today_match.start()] if today_match else system
    today = today_match.group("today") if today_match else ""
    restored: list[dict[str, Any]] = [{**messages[0], "content": system}]
    events: list[AppEvent] = []
    for message in messages[1:]:
        content = message.get("content")
        if isinstance(content, str) and _APP_EVENTS in content:
            content, _, listed = content.partition(_APP_EVENTS)
            events.extend(
                AppEvent.model_validate(e) for e in json.loads(listed.removesuffix("\n</app_events>"))
            )
            message = {**message, "content": content}
        restored.append(message)
    return TrajectoryAgentInput(
        policy=policy,
        today=today,
        tools=[t for t in tools if t.get("function", {}).get("name") != APP_ACTION_TOOL],
        user_tools=user_tools,
        messages=restored,
        app_events=events,
        reference=None
        if reference is None
        else [ReferenceStep.model_validate(r) for r in reference.get("calls") or []],
        reference_info=[str(f) for f in (reference or {}).get("tell_the_customer") or []],
    )


def _tools(inputs: TrajectoryAgentInput) -> list[dict[str, Any]]:
    return [*inputs.tools, _app_action_tool(inputs.user_tools)] if inputs.user_tools else list(inputs.tools)


def _reply(text: str, calls: list[ToolCall]) -> AgentStep:
    """Tool calls (with the text as reasoning), or a message with the app actions it asks for."""
    requests = [
        AgentToolCall(
            name=str(c.arguments.get("action") or ""), arguments=dict(c.arguments.get("arguments") or {})
        )
        for c in calls
        if c.name == APP_ACTION_TOOL
    ]
    real = [AgentToolCall(name=c.name, arguments=c.arguments) for c in calls if c.name != APP_ACTION_TOOL]
    if real:
        return AgentStep(think=text, tool_calls=real, user_action_requests=requests)
    return AgentStep(message=text, user_action_requests=requests)


def _as_reply(step: AgentStep) -> tuple[str, list[ToolCall]]:
    if step.tool_calls:
        return step.think, [ToolCall(name=c.name, arguments=c.arguments) for c in step.tool_calls]
    asks = [
        ToolCall(name=APP_ACTION_TOOL, arguments={"action": r.name, "arguments": r.arguments})
        for r in step.user_action_requests
    ]
    return str(step.message or ""), asks


EIGEN_AGENT_NATIVE = AgentIO[TrajectoryAgentInput, AgentStep](
    conversation=_conversation,
    tools=_tools,
    reply=_reply,
    inputs_from=_inputs_from,
    as_reply=_as_reply,
)
"""The TrajectoryAgent over the chat API: the dialogue as messages (instructions and policy in the
system message, the customer's in-app actions inside the user turns they came with), the agent
tools plus ``request_app_action``; a reply with tool calls is a tool step, one without is the
message to the customer."""


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
        "- When the input has a 'reference' solution, reach its calls (user calls by asking the customer) "
        "with values the customer gave or tools returned, confirm writes first, tell the customer every "
        "'reference_info' fact, and never mention the reference.\n"
        'Output: one JSON object {"think": string, "tool_calls": [{"name", "arguments"}], "message": '
        'string | null, "user_action_requests": [{"name", "arguments"}]} and nothing else.'
    ),
    template="Policy, tools, dialogue and app events:\n{input}\n\nReturn your next step.",
    agent=EIGEN_AGENT_NATIVE,
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

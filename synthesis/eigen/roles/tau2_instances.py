"""EigenData's task role over an imported tau2 domain: a new task instance from a database draw.

The random pool (``synthesis/eigen/tau2_instances.py``) draws a customer from the domain's database
and lists what that customer could ask for (``InstanceOption``): each option's gold calls are built
from the records themselves, and its verdict from the policy's rules (``allowed``: the agent must
act; ``refuse``: the policy forbids it, the agent only looks it up). ``EIGEN_TAU2_INSTANCE`` picks
one option and writes the customer's side of the task in tau2's shape (reason for call, known and
unknown info, task instructions). The calls never come from the model: the writer cannot make the
gold wrong, only the scenario unclear, and an instance is kept only once its gold replay scores 1.0
with tau2's own evaluator (``producers/tau2_instances.py``).
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.llm.core import Role
from arena.records.eigen import GoalCall

__all__ = [
    "EIGEN_TAU2_INSTANCE",
    "InstanceDraw",
    "InstanceOption",
    "InstanceScenario",
    "Tau2InstanceInput",
]


class InstanceOption(BaseModel):
    """One thing the drawn customer could ask for, with its gold solution."""

    kind: Annotated[str, Field(description="What is asked, e.g. 'cancel_pending_order', 'add_bags'.")]
    verdict: Annotated[
        Literal["allowed", "refuse"],
        Field(description="allowed: the policy lets the agent do it; refuse: it must decline."),
    ]
    why: Annotated[str, Field(description="The policy rule behind the verdict, in one line.")]
    request: Annotated[
        str,
        Field(
            description="What the customer wants, in the second person as tau2 scenarios are written "
            "('You want to cancel order #W123 ... because ...'), with every fact the agent needs from them."
        ),
    ]
    calls: Annotated[
        list[GoalCall],
        Field(
            description="The gold solution: the look-ups a careful agent makes, then the writes (none to refuse)."
        ),
    ]
    communicate_info: Annotated[
        list[str], Field(description="Values the agent must tell the customer (e.g. a refund amount).")
    ] = Field(default_factory=list)


class InstanceDraw(BaseModel):
    """The random pool's draw: one customer of the database and what they could ask for."""

    domain: Annotated[str, Field(description="tau2 domain.")]
    user_id: Annotated[str, Field(description="The customer's id in the database.")]
    identity: Annotated[
        str, Field(description="How the customer identifies themselves, as tau2's known_info says it.")
    ]
    unknown: Annotated[
        str, Field(description="What the customer does not know (tau2's unknown_info), or ''.")
    ] = ""
    options: Annotated[list[InstanceOption], Field(description="Candidate requests, at least one.")]


class Tau2InstanceInput(BaseModel):
    """What the task writer reads."""

    domain: Annotated[str, Field(description="tau2 domain.")]
    policy: Annotated[str, Field(description="The agent's policy (what the options' verdicts follow).")]
    draw: Annotated[InstanceDraw, Field(description="The customer and their candidate requests.")]
    examples: Annotated[
        list[str],
        Field(description="Train-split scenarios of the domain, as style examples (never test tasks)."),
    ] = Field(default_factory=list)


class InstanceScenario(BaseModel):
    """The customer's side of a new task, in tau2's ``StructuredUserInstructions`` fields."""

    option: Annotated[int, Field(ge=0, description="Index of the chosen option in draw.options.")]
    reason_for_call: Annotated[
        str,
        Field(
            description="Why the customer calls, second person, with every fact of the option's request "
            "(ids, items, amounts, reasons); never the agent's tools or the verdict."
        ),
    ]
    known_info: Annotated[str, Field(description="What the customer knows about themselves (second person).")]
    unknown_info: Annotated[str, Field(description="What they do not know, or ''.")] = ""
    task_instructions: Annotated[
        str, Field(description="How the customer behaves (tone, patience), second person.")
    ]


def _narrow(inputs: Tau2InstanceInput, schema: dict[str, Any]) -> dict[str, Any]:
    """Under guided decoding the option index can only name an option of this draw."""
    narrowed = copy.deepcopy(schema)
    narrowed["properties"]["option"] = {
        "type": "integer",
        "minimum": 0,
        "maximum": len(inputs.draw.options) - 1,
    }
    return narrowed


EIGEN_TAU2_INSTANCE: Role[Tau2InstanceInput, InstanceScenario] = Role(
    name="eigen_tau2_instance",
    input=Tau2InstanceInput,
    output=InstanceScenario,
    system=(
        "You are the UserIntent agent of a customer-service data engine. You receive a customer drawn "
        "from a company's database and the requests that customer could make, each with the policy's "
        "verdict (allowed, or refuse: the agent must decline it). Choose ONE option -- prefer an allowed "
        "one unless a refusal makes a more useful test -- and write the customer's instructions for a "
        "simulated caller, in the second person, in the style of the examples:\n"
        "- reason_for_call: the option's request in your own words, keeping every fact it states "
        "(order or reservation ids, item names and options, amounts, dates, names, the reason);\n"
        "- known_info: the draw's identity, as given;\n"
        "- unknown_info: the draw's unknown, or an empty string;\n"
        "- task_instructions: how this customer behaves on the call (tone, patience, what they do if "
        "refused), one or two sentences.\n"
        "Never mention tools, function names, the verdict or the policy.\n"
        'Output one JSON object {"option": int, "reason_for_call": str, "known_info": str, '
        '"unknown_info": str, "task_instructions": str} and nothing else.'
    ),
    template="Draw and examples:\n{input}\n\nReturn the JSON object.",
    narrow=_narrow,
)

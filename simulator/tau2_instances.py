"""Rules ``eigen_tau2_instance``: picks one of the draw's options and writes the customer's side.

An allowed request is picked most of the time, a refusal now and then (the policy-violation share
of EigenData's pool), the kind of request first (a customer with five orders has five
cancellations to offer, and one payment change); the reason for call is the option's request behind one of several openings,
so that two instances on one request still read differently; the task instructions give the
customer a temperament.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pydantic import BaseModel

from synthesis.eigen.roles.tau2_instances import EIGEN_TAU2_INSTANCE, InstanceScenario, Tau2InstanceInput

REFUSE_SHARE = 0.15
"""Share of instances on a request the policy refuses (when the draw has one)."""
OPENINGS = (
    "",
    "You have a question about your account. ",
    "You have been meaning to sort this out for a few days. ",
    "You are contacting support about one thing. ",
)
TEMPERAMENTS = (
    "You are polite and answer the agent's questions briefly.",
    "You are in a hurry; you want this done quickly and give short answers.",
    "You are friendly and a little chatty, but you stay on your request.",
    "You are careful: you check the details the agent gives you before you agree.",
    "You are calm. If the agent says it cannot help, you accept that and end the call.",
)


def write_instance(inputs: BaseModel, rng: random.Random) -> InstanceScenario:
    assert isinstance(inputs, Tau2InstanceInput)
    options = inputs.draw.options
    allowed = [i for i, o in enumerate(options) if o.verdict == "allowed"]
    refused = [i for i, o in enumerate(options) if o.verdict == "refuse"]
    pool = refused if refused and (not allowed or rng.random() < REFUSE_SHARE) else allowed
    kind = rng.choice(sorted({options[i].kind for i in pool}))  # a kind first: rarer kinds get their share
    chosen = rng.choice([i for i in pool if options[i].kind == kind])
    return InstanceScenario(
        option=chosen,
        reason_for_call=rng.choice(OPENINGS) + options[chosen].request,
        known_info=inputs.draw.identity,
        unknown_info=inputs.draw.unknown,
        task_instructions=rng.choice(TEMPERAMENTS),
    )


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {EIGEN_TAU2_INSTANCE.name: write_instance}

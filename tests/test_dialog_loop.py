"""The DialogSynthesis loop as a state machine (``streams.eigen.dialog_loop``).

Real sandbox, real gateway on the rules backend, the built-in customer_service pack. A normal
dialogue walks AGENT -> TOOLS -> AGENT -> USER -> ... -> DONE and ends on the user's stop; a user
simulator that fails (its rule raising, an output that does not validate, an empty reply) ends it
with ``user_error`` -- not ``stop`` -- which validation rejects; the turn and agent-step limits end
it with their own reasons.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.llm.gateway import Gateway
from arena.llm.roles.eigen import PoolParams, UserIntent
from arena.llm.roles.user_sim import USER_SIMULATOR, UserSimInput, UserTurn
from arena.records.eigen import Dialog
from simulator import RULES
from simulator.backend import RulesBackend
from streams.eigen.dialog_loop import MAX_AGENT_STEPS, MAX_TURNS, DialogLoop, DialogState
from streams.eigen.dialogs import validate_dialog
from streams.eigen.packs import DomainPack
from streams.eigen.workers import random_pool, user_intent, validate_with_repair
from tests.fixtures.domain import sandboxed_with_gateway

pytestmark = pytest.mark.timeout(60)

SEED = 3
FEASIBLE_ONLY = PoolParams(error_prone_parameters=0.0, policy_pressure=0.0)
AGENT, TOOLS, USER, DONE = DialogState.AGENT, DialogState.TOOLS, DialogState.USER, DialogState.DONE
TRANSITIONS = {(AGENT, TOOLS), (AGENT, USER), (AGENT, DONE), (TOOLS, AGENT), (USER, AGENT), (USER, DONE)}
"""Every edge of the module docstring's diagram."""
Rule = Callable[[BaseModel, random.Random], BaseModel]


@pytest.fixture(scope="module")
def state(pack: DomainPack) -> dict[str, Any]:
    return pack.generate(SEED)


@pytest.fixture(scope="module")
def intent(pack: DomainPack, state: dict[str, Any]) -> UserIntent:
    async def scenario(pool: Any, gateway: Gateway) -> UserIntent:
        draw = await random_pool(gateway, pack, state, 0, FEASIBLE_ONLY)
        drawn = await user_intent(gateway, pack, state, draw)
        outcome = await validate_with_repair(drawn, gateway=gateway, runner=pool, pack=pack, state=state)
        assert outcome.accepted, outcome.reason
        return outcome.final_intent

    return sandboxed_with_gateway(scenario)


def run_loop(
    pack: DomainPack,
    intent: UserIntent,
    state: dict[str, Any],
    gateway: Gateway | None = None,
    *,
    max_turns: int = MAX_TURNS,
    max_agent_steps: int = MAX_AGENT_STEPS,
) -> tuple[Dialog, list[DialogState]]:
    """The dialogue and the states its loop went through."""

    async def scenario(pool: Any, gateway: Gateway) -> tuple[Dialog, list[DialogState]]:
        loop = DialogLoop(
            pack, intent, state, gateway, pool, max_turns=max_turns, max_agent_steps=max_agent_steps
        )
        return await loop.run(), loop.path

    return sandboxed_with_gateway(scenario, gateway)


def with_user_rule(rule: Rule) -> Gateway:
    """The real rules, with ``rule`` as the user simulator."""
    return Gateway(RulesBackend(seed=0, rules={**RULES, USER_SIMULATOR.name: rule}))


def real_user(inputs: BaseModel, rng: random.Random) -> BaseModel:
    return RULES[USER_SIMULATOR.name](inputs, rng)


def edges(path: list[DialogState]) -> Counter[tuple[DialogState, DialogState]]:
    return Counter(pairwise(path))


def assert_well_formed(path: list[DialogState]) -> None:
    assert path[0] is AGENT and path[-1] is DONE and path.count(DONE) == 1
    assert set(edges(path)) <= TRANSITIONS, edges(path)


def test_a_normal_dialogue_walks_the_states_and_ends_on_the_users_stop(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent
) -> None:
    dialog, path = run_loop(pack, intent, state)
    assert dialog.end_signal == "stop" and dialog.error is None
    assert validate_dialog(pack, intent, dialog).passed
    assert_well_formed(path)
    assert path[-2:] == [USER, DONE]  # the user ended it
    seen = edges(path)
    assistant = [m for m in dialog.messages if m["role"] == "assistant"]
    # One TOOLS visit per assistant tool-call message, one USER visit per assistant text message.
    assert seen[(AGENT, TOOLS)] == seen[(TOOLS, AGENT)] == sum(1 for m in assistant if m.get("tool_calls"))
    assert seen[(AGENT, USER)] == sum(1 for m in assistant if m.get("content"))
    # Each USER -> AGENT is one user reply; the agent's calls are the ones TOOLS ran.
    assert seen[(USER, AGENT)] == dialog.turns >= 2
    tool_calls = sum(len(m.get("tool_calls") or []) for m in assistant)
    assert tool_calls == sum(1 for c in dialog.calls if c.actor == "agent") > 0


def undecidable(inputs: BaseModel, rng: random.Random) -> BaseModel:
    raise Undecidable("the simulated user is lost")


def undecidable_after_first_reply(inputs: BaseModel, rng: random.Random) -> BaseModel:
    assert isinstance(inputs, UserSimInput)
    if inputs.turn >= 1:
        raise Undecidable("the simulated user is lost")
    return real_user(inputs, rng)


def wrong_output(inputs: BaseModel, rng: random.Random) -> BaseModel:
    return UserSimInput(instructions="not a user turn", dialogue=[], turn=0)  # no "message": invalid


def empty_reply(inputs: BaseModel, rng: random.Random) -> BaseModel:
    return UserTurn(message="  ", signal="continue")


@pytest.mark.parametrize(
    ("rule", "turns"),
    [(undecidable, 0), (undecidable_after_first_reply, 1), (wrong_output, 0), (empty_reply, 0)],
    ids=["undecidable", "undecidable-after-first-reply", "invalid-output", "empty-reply"],
)
def test_a_failing_user_simulator_is_a_user_error_not_a_stop(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent, rule: Rule, turns: int
) -> None:
    gateway = with_user_rule(rule)
    dialog, path = run_loop(pack, intent, state, gateway)
    assert dialog.end_signal == "user_error" and dialog.end_signal != "stop"
    assert dialog.error and "user simulator" in dialog.error
    assert dialog.turns == turns
    assert_well_formed(path)
    assert path[-2:] == [USER, DONE] and edges(path)[(USER, AGENT)] == turns
    # Nothing of the failed move is in the dialogue: it ends on the agent's message.
    assert dialog.messages[-1]["role"] == "assistant" and dialog.messages[-1]["content"]
    assert not any(c.actor == "user" and c.message_index >= len(dialog.messages) for c in dialog.calls)
    usage = gateway.usage.roles[USER_SIMULATOR.name]
    if rule is not empty_reply:  # the gateway retried, then gave up
        assert usage.failures == 1 and usage.attempts == usage.calls - 1 + gateway.max_attempts
    # What later validation sees: an incomplete dialogue, a critical finding.
    verdict = validate_dialog(pack, intent, dialog)
    assert not verdict.passed and not verdict.flags["realism"]
    assert any(r.startswith("realism") and "user-simulator failure" in r for r in verdict.reasons)


def test_a_non_retryable_user_simulator_error_propagates(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent
) -> None:
    def broken(inputs: BaseModel, rng: random.Random) -> BaseModel:
        raise RuntimeError("wiring bug")

    with pytest.raises(RuntimeError, match="wiring bug"):  # as from the agent role: the stage fails
        run_loop(pack, intent, state, with_user_rule(broken))


@pytest.mark.parametrize("max_turns", [0, 1])
def test_max_turns_ends_with_its_own_reason(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent, max_turns: int
) -> None:
    dialog, path = run_loop(pack, intent, state, max_turns=max_turns)
    assert dialog.end_signal == "max_turns" and dialog.error is None
    assert dialog.turns == max_turns
    assert_well_formed(path)
    assert path[-3:] == [AGENT, USER, DONE] and edges(path)[(USER, AGENT)] == max_turns
    assert dialog.messages[-1]["role"] == "assistant"  # the agent answered the last reply; no user move


def test_an_agent_without_a_message_is_stuck(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent
) -> None:
    dialog, path = run_loop(pack, intent, state, max_agent_steps=1)
    assert path == [AGENT, TOOLS, AGENT, DONE]  # one step, a tool call, no step left for a message
    assert dialog.end_signal == "agent_stuck" and dialog.turns == 0 and dialog.error is None
    assert [c.actor for c in dialog.calls] == ["agent"] * len(dialog.calls) and dialog.calls

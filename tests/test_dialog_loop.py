"""The DialogSynthesis loop as a state machine (``synthesis.eigen.dialog_loop``).

Real sandbox, real gateway on the rules backend, the built-in customer_service pack. A normal
dialogue walks AGENT -> TOOLS -> AGENT -> USER -> ... -> DONE and ends on the user's stop; a user
simulator that fails (its rule raising, an output that does not validate, an empty reply) ends it
with ``user_error`` -- not ``stop`` -- which validation rejects; the turn and agent-step limits end
it with their own reasons. The dialogue's database lives in one sandbox session, closed when the
dialogue ends; a failed call leaves it as it was.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import pytest
from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import USER_SIMULATOR, UserSimInput, UserTurn
from arena.records.eigen import Dialog, DialogCall, UserIntent
from sandbox import SandboxPool
from simulator import RULES
from simulator.backend import RulesBackend
from synthesis.eigen.agents import random_pool, user_intent, validate_with_repair
from synthesis.eigen.dialog_loop import MAX_AGENT_STEPS, MAX_TURNS, DialogLoop, DialogState, synthesize_dialog
from synthesis.eigen.dialog_synthesis import validate_dialog
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.tasks import PoolParams
from tests.fixtures.domain import POOL, CountingRunner, sandboxed_with_gateway

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


def wiring_bug(inputs: BaseModel, rng: random.Random) -> BaseModel:
    raise RuntimeError("wiring bug")


def test_a_non_retryable_user_simulator_error_propagates(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent
) -> None:
    with pytest.raises(RuntimeError, match="wiring bug"):  # as from the agent role: the stage fails
        run_loop(pack, intent, state, with_user_rule(wiring_bug))


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


# --------------------------------------------------------------------------- the dialogue's session

RISKY_TOOLS = '''

def void_order(order_id):
    """Writes, then refuses: the write must not stay."""
    STATE["orders"][order_id]["status"] = "void"
    raise RuntimeError("refused after a write")


def tag_order(order_id):
    """Leaves STATE not JSON (a set in it): refused too."""
    STATE["orders"][order_id]["tags"] = {"x"}
    return "tagged"


def spin(order_id):
    """Runs past the wall-clock limit: the session ends with it."""
    STATE["orders"][order_id]["status"] = "spun"
    while True:
        pass
'''


def risky_pack(pack: DomainPack) -> DomainPack:
    """``pack`` with agent tools that fail after changing the state."""
    specs = [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": f"Test tool {name}.",
                "parameters": {
                    "type": "object",
                    "properties": {"order_id": {"type": "string"}},
                    "required": ["order_id"],
                },
            },
        }
        for name in ("void_order", "tag_order", "spin")
    ]
    return pack.model_copy(
        update={"tools_source": pack.tools_source + RISKY_TOOLS, "agent_tools": [*pack.agent_tools, *specs]}
    )


def test_a_dialogue_runs_in_one_session_closed_at_its_end(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent
) -> None:
    """Every call of a dialogue goes to one session (tools and state loaded once, the final state
    read once); it is closed at the end, also when the dialogue raised: a pool of one session runs
    dialogues one after another."""

    async def main() -> tuple[list[Dialog], CountingRunner]:
        async with SandboxPool(POOL.model_copy(update={"pool_size": 1})) as pool:
            runner = CountingRunner(pool)
            first = await asyncio.wait_for(
                synthesize_dialog(pack, intent, state, Gateway(RulesBackend(seed=0)), runner), 30
            )
            counts = (runner.sessions, runner.closed, runner.loads, runner.reads, list(runner.calls))
            assert counts == (1, 1, 1, 1, [c.name for c in first.calls]), counts
            assert not runner.programs
            broken = with_user_rule(wiring_bug)
            with pytest.raises(RuntimeError, match="wiring bug"):
                await asyncio.wait_for(synthesize_dialog(pack, intent, state, broken, runner), 30)
            second = await asyncio.wait_for(
                synthesize_dialog(pack, intent, state, Gateway(RulesBackend(seed=0)), runner), 30
            )
            return [first, second], runner

    (first, second), runner = asyncio.run(main())
    assert runner.sessions == runner.closed == 3  # the raising dialogue had made its first calls
    assert first.end_signal == second.end_signal == "stop"
    assert [c.name for c in first.calls] == [c.name for c in second.calls]
    assert first.initial_state == state and first.final_state != state


def test_a_failed_call_leaves_the_database_as_it_was(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent
) -> None:
    order_id = sorted(state["orders"])[0]
    user_id = state["orders"][order_id]["user_id"]

    async def scenario(
        pool: SandboxPool, gateway: Gateway
    ) -> tuple[list[DialogCall], dict[str, Any], CountingRunner]:
        runner = CountingRunner(pool)
        session = DialogLoop(risky_pack(pack), intent, state, gateway, runner).session
        try:
            calls = [await session.execute("send_verification_code", {"user_id": user_id}, "agent", 1)]
            for name in ("void_order", "tag_order"):
                calls.append(await session.execute(name, {"order_id": order_id}, "agent", 2))
            refund = {"order_id": order_id, "amount": 1e6, "reason": "too much"}
            calls.append(await session.execute("issue_refund", refund, "agent", 3))
            final = await session.final_state()
        finally:
            await session.close()
        return calls, final, runner

    (sent, *failed), final, runner = sandboxed_with_gateway(scenario)
    assert sent.ok and sent.changed_state
    assert [(c.ok, c.changed_state) for c in failed] == [(False, False)] * 3
    assert "refused after a write" in failed[0].output
    assert "not JSON serializable" in failed[1].output and "left to refund" in failed[2].output
    assert final["session"]["code_sent_to"] == user_id
    assert {k: v for k, v in final.items() if k != "session"} == {
        k: v for k, v in state.items() if k != "session"
    }
    assert runner.sessions == runner.closed == 1 and runner.loads == 1
    assert runner.calls == ["send_verification_code", "void_order", "tag_order", "issue_refund"]


def test_a_call_that_ends_the_session_fails_alone(
    pack: DomainPack, state: dict[str, Any], intent: UserIntent
) -> None:
    """A timeout ends the session; the next call gets a new one with the database as the calls
    that ran left it (replayed), so the timed-out call changed nothing, as before sessions."""
    order_id = sorted(state["orders"])[0]
    user_id = state["orders"][order_id]["user_id"]

    async def scenario(
        pool: SandboxPool, gateway: Gateway
    ) -> tuple[list[DialogCall], dict[str, Any], CountingRunner]:
        runner = CountingRunner(pool)
        session = DialogLoop(risky_pack(pack), intent, state, gateway, runner, timeout_s=2.0).session
        try:
            calls = [
                await session.execute("send_verification_code", {"user_id": user_id}, "agent", 1),
                await session.execute("spin", {"order_id": order_id}, "agent", 2),
                await session.execute("get_order_details", {"order_id": order_id}, "agent", 3),
            ]
            final = await session.final_state()
        finally:
            await session.close()
        return calls, final, runner

    (sent, spun, read), final, runner = sandboxed_with_gateway(scenario)
    assert sent.ok and not spun.ok and "timeout" in spun.output and not spun.changed_state
    assert read.ok and read.output["status"] == state["orders"][order_id]["status"]
    assert final["session"]["code_sent_to"] == user_id
    assert final["orders"] == state["orders"]
    assert runner.sessions == runner.closed == 2 and runner.loads == 2
    assert runner.calls == ["send_verification_code", "spin", "send_verification_code", "get_order_details"]

"""EigenData execution-layer workers (issue 6, §4.2): RandomPool, UserIntent, TaskValidation, Modify.

Real sandbox (every probe call runs in a session of a ``SandboxPool``), real gateway
on the rules backend, the built-in customer_service pack. Seeded infeasible tasks are caught by
the probe with reasons naming the problem; a repairable one is FEASIBLE after Modify; an
unrepairable one is rejected after exactly ``MAX_ROUNDS`` repair rounds.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import BaseModel

from arena.llm.gateway import Gateway
from arena.records.eigen import Goal, GoalCall, UserIntent
from sandbox import SandboxPool
from simulator import RULES
from simulator.backend import RulesBackend
from synthesis.eigen.agents import (
    MAX_ROUNDS,
    probe_task,
    random_pool,
    user_intent,
    validate_task,
    validate_with_repair,
)
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.tasks import EIGEN_MODIFY, ModifyInput, ModifyOutput, PoolParams
from tests.fixtures.domain import CountingRunner, sandboxed_with_gateway

pytestmark = pytest.mark.timeout(60)

SEED = 3
FEASIBLE_ONLY = PoolParams(error_prone_parameters=0.0, policy_pressure=0.0)


@pytest.fixture(scope="module")
def state(pack: DomainPack) -> dict[str, Any]:
    return pack.generate(SEED)


def _user_with(
    state: dict[str, Any], statuses: tuple[str, ...], other: tuple[str, ...]
) -> tuple[str, str, str]:
    """(user, an order in ``statuses``, another order in ``other``) of one customer."""
    for user_id in sorted(state["users"]):
        mine = sorted(
            (o for o in state["orders"].values() if o["user_id"] == user_id), key=lambda o: o["order_id"]
        )
        first = next((o for o in mine if o["status"] in statuses), None)
        second = next((o for o in mine if o["status"] in other and o is not first), None)
        if first is not None and second is not None:
            return user_id, first["order_id"], second["order_id"]
    raise AssertionError("no such customer in the seeded database")


def cancel_intent(state: dict[str, Any], user_id: str, order_id: str) -> UserIntent:
    """A hand-written task: cancel ``order_id`` (whatever its state)."""
    user = state["users"][user_id]
    requirement = f"Please cancel my order {order_id}; I no longer need it."
    return UserIntent.model_validate(
        {
            "domain": "customer_service",
            "seed": 0,
            "persona": {"role": "weekend hiker", "expertise": "occasional", "tone": "polite"},
            "objective": f"{user['name']} wants to cancel an order.",
            "reason_for_call": "Hi, " + requirement,
            "known_info": {
                "name": user["name"],
                "email": user["email"],
                "verification_code": user["sms_code"],
            },
            "requirements": [requirement],
            "must_have_functions": ["find_user_by_email", "send_verification_code", "cancel_order"],
            "goals": [
                Goal(
                    kind="cancel_order",
                    requirement=requirement,
                    calls=[
                        GoalCall(
                            name="cancel_order",
                            arguments={"order_id": order_id, "reason": "no_longer_needed"},
                        )
                    ],
                ).model_dump()
            ],
            "difficulty": {"required_calls": 5},
        }
    )


def test_random_pool_is_seeded(pack: DomainPack, state: dict[str, Any]) -> None:
    async def scenario(pool: SandboxPool, gateway: Gateway) -> None:
        a = await random_pool(gateway, pack, state, 7)
        b = await random_pool(Gateway(RulesBackend(seed=0)), pack, state, 7)  # a fresh gateway, no cache
        assert a == b and a.seed == 7
        draws = [await random_pool(gateway, pack, state, s) for s in range(8)]
        assert len({d.model_dump_json() for d in draws}) > 1  # other seeds, other draws
        for draw in draws:
            assert draw.context.user_id in state["users"]
            assert draw.context.order_ids and all(
                state["orders"][o]["user_id"] == draw.context.user_id for o in draw.context.order_ids
            )
            assert all(p in state["products"] for p in draw.context.product_ids)
            assert all(i not in state["orders"] for i in draw.context.nonexistent_ids)
            assert 4 <= draw.difficulty.required_calls <= 9
        forced = await random_pool(
            gateway, pack, state, 7, PoolParams(error_prone_parameters=1.0, policy_pressure=0.0)
        )
        assert forced.difficulty.error_prone_parameters and not forced.difficulty.policy_violation

    sandboxed_with_gateway(scenario)


def test_intents_reference_existing_entities_and_tools(pack: DomainPack, state: dict[str, Any]) -> None:
    tools = set(pack.agent_tool_names) | set(pack.user_tool_names)

    async def scenario(pool: SandboxPool, gateway: Gateway) -> None:
        for seed in range(6):
            draw = await random_pool(gateway, pack, state, seed, FEASIBLE_ONLY)
            intent = await user_intent(gateway, pack, state, draw)
            assert intent.goals and intent.requirements == [g.requirement for g in intent.goals]
            assert set(intent.must_have_functions) <= tools
            assert {"find_user_by_email", "send_verification_code"} <= set(intent.must_have_functions)
            assert intent.known_info["email"] == state["users"][draw.context.user_id]["email"]
            assert intent.rubrics and intent.hidden_subgoals and intent.must_not
            for goal in intent.goals:
                for call in goal.calls:
                    assert call.name in tools
                    if "order_id" in call.arguments:
                        assert state["orders"][call.arguments["order_id"]]["user_id"] == draw.context.user_id
                    if "user_id" in call.arguments:
                        assert call.arguments["user_id"] == draw.context.user_id
            # Generated without flaws, the task is feasible as it stands, with a plan.
            verdict = await validate_task(intent, gateway=gateway, runner=pool, pack=pack, state=state)
            assert verdict.status == "FEASIBLE", verdict.reasons
            plan = [s.function for s in verdict.plan]
            assert plan[0] == "find_user_by_email" and "confirm_identity_code" in plan
            assert all(c.name in plan for g in intent.goals for c in g.calls)

    sandboxed_with_gateway(scenario)


def test_seeded_error_prone_parameter_is_caught_by_the_probe(pack: DomainPack, state: dict[str, Any]) -> None:
    async def scenario(pool: SandboxPool, gateway: Gateway) -> None:
        params = PoolParams(error_prone_parameters=1.0, policy_pressure=0.0)
        draw = await random_pool(gateway, pack, state, 11, params)
        intent = await user_intent(gateway, pack, state, draw)
        bad = draw.context.nonexistent_ids[0]
        assert bad not in state["orders"] and any(
            c.arguments.get("order_id") == bad for g in intent.goals for c in g.calls
        )
        runner = CountingRunner(pool)
        report = await probe_task(pack, state, intent, runner)
        # Every probe call ran in the sandbox, in one session closed at the end; a state was sent
        # in only to start and when the probe stepped back to a state the session did not hold.
        assert len(runner.calls) >= len(report.executed) > 3
        assert {c.name for c in report.executed} <= set(runner.calls)
        assert runner.sessions == runner.closed == 1 and not runner.programs
        assert 1 <= runner.loads < len(runner.calls)
        lookup = next(
            c for c in report.executed if c.name == "get_order_details" and c.arguments["order_id"] == bad
        )
        assert not lookup.ok and bad in (lookup.error or "")
        verdict = await validate_task(intent, gateway=gateway, runner=pool, pack=pack, state=state)
        assert verdict.status == "INFEASIBLE" and not verdict.plan
        reason = verdict.failure_reasons[0]
        assert reason.category == "missing_resource" and bad in reason.description
        assert verdict.suggested_fixes and not verdict.verification_results["goals_executable"]

    sandboxed_with_gateway(scenario)


def test_crafted_infeasible_tasks_are_caught_with_reasons(pack: DomainPack, state: dict[str, Any]) -> None:
    user_id, shipped, _pending = _user_with(state, ("shipped", "delivered"), ("pending", "processing"))

    async def scenario(pool: SandboxPool, gateway: Gateway) -> None:
        # A non-existent order id.
        missing = cancel_intent(state, user_id, "O-00000")
        verdict = await validate_task(missing, gateway=gateway, runner=pool, pack=pack, state=state)
        assert verdict.status == "INFEASIBLE"
        assert verdict.failure_reasons[0].category == "missing_resource"
        assert (
            "O-00000" in verdict.failure_reasons[0].description
            and "no order" in verdict.failure_reasons[0].evidence
        )
        # A policy-forbidden action: cancelling a shipped / delivered order (the tool would do it; the rule forbids).
        forbidden = cancel_intent(state, user_id, shipped)
        verdict = await validate_task(forbidden, gateway=gateway, runner=pool, pack=pack, state=state)
        assert verdict.status == "INFEASIBLE"
        reason = verdict.failure_reasons[0]
        assert reason.category == "policy_violation" and shipped in reason.description
        assert "no_cancel_after_shipment" in reason.description
        kinds = [f.fix_type for f in verdict.suggested_fixes]
        assert kinds[0] == "replace_entity" and "reframe_as_refusal" in kinds
        # A customer who does not exist: the very first lookup fails.
        ghost = missing.model_copy(
            update={"known_info": {**missing.known_info, "email": "nobody@example.com"}}
        )
        verdict = await validate_task(ghost, gateway=gateway, runner=pool, pack=pack, state=state)
        assert verdict.status == "INFEASIBLE" and not verdict.verification_results["user_exists"]
        assert "nobody@example.com" in verdict.failure_reasons[0].description

    sandboxed_with_gateway(scenario)


def test_repairable_tasks_are_feasible_after_modify(pack: DomainPack, state: dict[str, Any]) -> None:
    user_id, shipped, _pending = _user_with(state, ("shipped", "delivered"), ("pending", "processing"))

    async def scenario(pool: SandboxPool, gateway: Gateway) -> None:
        for intent, flaw in (
            (cancel_intent(state, user_id, "O-00000"), "O-00000"),
            (cancel_intent(state, user_id, shipped), shipped),
        ):
            outcome = await validate_with_repair(intent, gateway=gateway, runner=pool, pack=pack, state=state)
            assert outcome.accepted and outcome.rounds == 1 and outcome.reason is None
            assert [v.status for v in outcome.verdicts] == ["INFEASIBLE", "FEASIBLE"]
            final = outcome.final_intent
            new_id = final.goals[0].calls[0].arguments["order_id"]
            assert new_id != flaw and state["orders"][new_id]["status"] in ("pending", "processing")
            assert state["orders"][new_id]["user_id"] == user_id
            # Minimal and consistent: the id changed everywhere, nothing else did.
            assert flaw not in final.model_dump_json() and new_id in final.requirements[0]
            assert final.objective == intent.objective and final.persona == intent.persona
            assert final.must_have_functions == intent.must_have_functions
            assert outcome.repairs[0][0].target_field == "goals[0].calls"
            assert "cancel_order" in [s.function for s in outcome.plan]
        # Generated with both flaws forced: repaired within the bound.
        params = PoolParams(error_prone_parameters=1.0, policy_pressure=1.0)
        for seed in range(3):
            draw = await random_pool(gateway, pack, state, seed, params)
            intent = await user_intent(gateway, pack, state, draw)
            outcome = await validate_with_repair(intent, gateway=gateway, runner=pool, pack=pack, state=state)
            assert outcome.verdicts[0].status == "INFEASIBLE"
            assert outcome.accepted and 1 <= outcome.rounds <= MAX_ROUNDS

    sandboxed_with_gateway(scenario)


def _stubborn_modify(inputs: BaseModel, rng: random.Random) -> BaseModel:
    """A Modify that cannot fix anything: it swaps in another non-existent id every round."""
    assert isinstance(inputs, ModifyInput)
    intent = inputs.intent.model_copy(deep=True)
    call = intent.goals[0].calls[0]
    call.arguments["order_id"] = f"O-0000{inputs.round}"
    return ModifyOutput(repaired_intent=intent)


def test_unrepairable_task_is_rejected_after_exactly_three_rounds(
    pack: DomainPack, state: dict[str, Any]
) -> None:
    user_id, _shipped, _pending = _user_with(state, ("shipped", "delivered"), ("pending", "processing"))
    stubborn = Gateway(RulesBackend(seed=0, rules={**RULES, EIGEN_MODIFY.name: _stubborn_modify}))

    async def scenario(pool: SandboxPool, gateway: Gateway) -> None:
        intent = cancel_intent(state, user_id, "O-00000")
        outcome = await validate_with_repair(intent, gateway=gateway, runner=pool, pack=pack, state=state)
        assert MAX_ROUNDS == 3
        assert not outcome.accepted and outcome.rounds == MAX_ROUNDS
        assert len(outcome.verdicts) == MAX_ROUNDS + 1 and all(
            v.status == "INFEASIBLE" for v in outcome.verdicts
        )
        assert outcome.final_intent.goals[0].calls[0].arguments["order_id"] == "O-00003"
        assert (
            outcome.reason is not None and "3 repair round" in outcome.reason and "O-00003" in outcome.reason
        )
        # The real Modify cannot save a task whose customer does not exist either (no fix to apply).
        ghost = intent.model_copy(update={"known_info": {**intent.known_info, "email": "nobody@example.com"}})
        real = await validate_with_repair(
            ghost, gateway=Gateway(RulesBackend(seed=0)), runner=pool, pack=pack, state=state
        )
        assert not real.accepted and real.rounds == MAX_ROUNDS and len(real.verdicts) == MAX_ROUNDS + 1
        assert real.reason is not None and "nobody@example.com" in real.reason

    sandboxed_with_gateway(scenario, stubborn)

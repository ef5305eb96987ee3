"""EigenData DialogSynthesis + TrajectoryValidation (issue 6, §4.2).

Real sandbox (every agent and user tool call runs through ``state_program`` in a ``SandboxPool``),
real gateway on the rules backend, the built-in customer_service pack. Feasible intents yield
dialogues that pass ``validate_dialog`` and whose final state passes the verification function
generated from them (run in the sandbox); corrupted dialogues fail with the right reasons.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from arena.llm.gateway import Gateway
from arena.records.eigen import Dialog, DialogCall, UserIntent
from environments.environment import verify_program
from sandbox import SandboxPool
from simulator.backend import RulesBackend
from synthesis.eigen.agents import random_pool, user_intent, validate_with_repair
from synthesis.eigen.dialog_loop import synthesize_dialog
from synthesis.eigen.dialog_synthesis import judge_dialog, validate_dialog
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.tasks import PoolParams
from synthesis.eigen.verification import verification_source
from tests.fixtures.domain import sandboxed_with_gateway

pytestmark = pytest.mark.timeout(60)

SEED = 3
FEASIBLE_ONLY = PoolParams(error_prone_parameters=0.0, policy_pressure=0.0)


@pytest.fixture(scope="module")
def state(pack: DomainPack) -> dict[str, Any]:
    return pack.generate(SEED)


async def feasible_intent(
    pack: DomainPack, state: dict[str, Any], seed: int, pool: SandboxPool, gateway: Gateway
) -> UserIntent:
    draw = await random_pool(gateway, pack, state, seed, FEASIBLE_ONLY)
    intent = await user_intent(gateway, pack, state, draw)
    outcome = await validate_with_repair(intent, gateway=gateway, runner=pool, pack=pack, state=state)
    assert outcome.accepted, outcome.reason
    return outcome.final_intent


@pytest.fixture(scope="module")
def dialogs(pack: DomainPack, state: dict[str, Any]) -> list[tuple[UserIntent, Dialog, dict[str, Any]]]:
    """Dialogues for several seeds, with the sandbox verdict of the verifier generated from each."""

    async def scenario(
        pool: SandboxPool, gateway: Gateway
    ) -> list[tuple[UserIntent, Dialog, dict[str, Any]]]:
        out = []
        for seed in range(6):
            intent = await feasible_intent(pack, state, seed, pool, gateway)
            dialog = await synthesize_dialog(pack, intent, state, gateway, pool)
            source = verification_source(pack, dialog.initial_state, dialog.records(), dialog.final_state)
            result = await pool.run(
                verify_program(source, dialog.initial_state, dialog.final_state, dialog.records())
            )
            assert result.ok, result.error
            out.append((intent, dialog, result.return_value))
        return out

    return sandboxed_with_gateway(scenario)


def test_feasible_intents_yield_valid_verified_dialogues(
    pack: DomainPack, state: dict[str, Any], dialogs: list[tuple[UserIntent, Dialog, dict[str, Any]]]
) -> None:
    kinds = set()
    for intent, dialog, verified in dialogs:
        verdict = validate_dialog(pack, intent, dialog)
        assert verdict.passed, verdict.reasons
        assert all(verdict.flags.values()) and not verdict.issues  # not even a non-critical note
        assert verified["pass"] is True, verified
        assert dialog.end_signal == "stop" and 1 <= dialog.turns <= 12
        assert dialog.initial_state == state and dialog.final_state != state
        # OpenAI format: system policy, then user / assistant (+ tool_calls) / tool messages.
        assert dialog.messages[0] == {
            "role": "system",
            "content": pack.policy_text + f"\n\nToday's date: {state['today']}.",
        }
        assert dialog.messages[1]["role"] == "user"
        tool_ids = [c["id"] for m in dialog.messages for c in m.get("tool_calls") or []]
        assert tool_ids == [m["tool_call_id"] for m in dialog.messages if m["role"] == "tool"]
        # The agent followed the policy deliberately: identity first, reads before writes, writes after the code.
        names = [(c.actor, c.name) for c in dialog.calls]
        assert names[0] == ("agent", "find_user_by_email")
        confirmed = names.index(("user", "confirm_identity_code"))
        for n, call in enumerate(dialog.calls):
            if call.actor == "agent" and call.changed_state and call.name != "send_verification_code":
                assert n > confirmed
                order_id = call.arguments.get("order_id")
                if order_id:
                    assert any(
                        c.name == "get_order_details" and c.arguments["order_id"] == order_id
                        for c in dialog.calls[:n]
                    )
        kinds |= {g.kind for g in intent.goals}
    assert len(kinds) >= 3  # several goal kinds were exercised


def test_judge_role_agrees_with_the_checks(
    pack: DomainPack, dialogs: list[tuple[UserIntent, Dialog, dict[str, Any]]]
) -> None:
    intent, dialog, _ = dialogs[0]

    async def main() -> None:
        verdict, judged = await judge_dialog(pack, intent, dialog, Gateway(RulesBackend(seed=0)))
        assert verdict.passed and judged.validation_result == "PASS"
        broken = dialog.model_copy(deep=True)
        broken.messages[-2]["content"] += " A bonus of 987.65 USD is on its way."
        verdict, judged = await judge_dialog(pack, intent, broken, Gateway(RulesBackend(seed=0)))
        assert not verdict.passed and judged.validation_result == "FAIL"
        assert "grounding" in (judged.failure_reason or "")

    asyncio.run(main())


def _last_assistant(dialog: Dialog) -> int:
    return max(n for n, m in enumerate(dialog.messages) if m["role"] == "assistant" and m.get("content"))


def test_corrupted_dialogues_fail_with_the_right_reasons(
    pack: DomainPack, state: dict[str, Any], dialogs: list[tuple[UserIntent, Dialog, dict[str, Any]]]
) -> None:
    intent, dialog, _ = dialogs[0]

    # Grounding: an amount never seen in any tool output.
    fabricated = dialog.model_copy(deep=True)
    fabricated.messages[_last_assistant(fabricated)]["content"] += " A bonus of 987.65 USD is on its way."
    verdict = validate_dialog(pack, intent, fabricated)
    assert not verdict.passed and not verdict.flags["grounding"]
    assert any("987.65 USD" in r and r.startswith("grounding") for r in verdict.reasons)

    # Schema: a call with an unknown argument.
    bad_args = dialog.model_copy(deep=True)
    first = bad_args.calls[0]
    bad_args.calls[0] = first.model_copy(update={"arguments": {**first.arguments, "customer_tier": "gold"}})
    verdict = validate_dialog(pack, intent, bad_args)
    assert not verdict.passed and not verdict.flags["schema"]
    assert any("customer_tier" in r and r.startswith("schema") for r in verdict.reasons)
    # ... and a wrong type.
    bad_type = dialog.model_copy(deep=True)
    at = next(n for n, c in enumerate(bad_type.calls) if c.name == "get_order_details")
    bad_type.calls[at] = bad_type.calls[at].model_copy(update={"arguments": {"order_id": 12345}})
    assert any("expected string" in r for r in validate_dialog(pack, intent, bad_type).reasons)

    # Goal: a must-have goal call dropped.
    goal_call = intent.goals[0].calls[-1]
    dropped = dialog.model_copy(deep=True)
    dropped.calls = [c for c in dropped.calls if c.name != goal_call.name]
    verdict = validate_dialog(pack, intent, dropped)
    assert not verdict.passed and not verdict.flags["goal"]
    assert any(r.startswith("goal") and goal_call.name in r and "not achieved" in r for r in verdict.reasons)

    # Policy: an extra call the policy forbids (cancelling an order that has shipped / been delivered).
    def shipped_order(dialog: Dialog) -> str | None:
        user_id = next(c.output["user_id"] for c in dialog.calls if c.name == "find_user_by_email")
        return next(
            (
                o["order_id"]
                for o in sorted(state["orders"].values(), key=lambda o: o["order_id"])
                if o["user_id"] == user_id and o["status"] in ("shipped", "delivered")
            ),
            None,
        )

    intent, dialog, shipped = next((i, d, s) for i, d, _ in dialogs if (s := shipped_order(d)))
    extra = dialog.model_copy(deep=True)
    extra.calls.append(
        DialogCall(
            name="cancel_order",
            arguments={"order_id": shipped, "reason": "other"},
            actor="agent",
            ok=True,
            changed_state=True,
            message_index=len(extra.messages) - 1,
        )
    )
    verdict = validate_dialog(pack, intent, extra)
    assert not verdict.passed and not verdict.flags["policy"]
    assert any(
        r.startswith("policy") and "no_cancel_after_shipment" in r and shipped in r for r in verdict.reasons
    )
    assert not verdict.flags["goal"]  # an unasked-for write also breaks the must-not requirements


def test_realism_findings_are_scored_not_critical(
    pack: DomainPack, dialogs: list[tuple[UserIntent, Dialog, dict[str, Any]]]
) -> None:
    intent, dialog, _ = dialogs[1]
    noisy = dialog.model_copy(deep=True)
    last = _last_assistant(noisy)
    noisy.messages.insert(last, copy.deepcopy(noisy.messages[last]))  # a repeated assistant turn
    verdict = validate_dialog(pack, intent, noisy)
    assert verdict.passed and verdict.ratings["realism"].rating == "Acceptable"
    noisy.messages.insert(2, {"role": "user", "content": "  "})  # plus an empty turn: realism Poor
    noisy.messages.append(
        {
            "role": "user",
            "content": "Objective: " + intent.objective + " What you know: " + json.dumps(intent.known_info),
        }
    )
    verdict = validate_dialog(pack, intent, noisy)
    assert verdict.ratings["realism"].rating == "Poor" and verdict.passed  # one Poor dimension only
    assert any("copies the private instructions" in i.description for i in verdict.issues)

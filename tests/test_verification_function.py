"""The VerificationFunction worker's generated verifiers (issue 6 acceptance), run in the sandbox.

A verifier from ``synthesis.eigen.verification`` passes the reference trajectory; still passes when
the dialogue is paraphrased (it reads calls and states, never text: reworded free-text
arguments and state fields) and timestamps/uuids differ; fails when a key argument of a
state-changing call changes; fails when a policy rule is broken. Trajectories run in a sandbox
session as a dialogue's do; every verify run goes through ``environments.environment.verify_program``
and a real ``SandboxPool``; the end-to-end test drives ``InteractiveEnvironment`` itself.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from arena.llm.gateway import Gateway
from environments.environment import (
    InteractiveEnvironment,
    InteractiveSpec,
    Verdict,
    verify_program,
)
from sandbox import SandboxPool
from simulator.backend import RulesBackend
from synthesis.eigen.dialog_loop import call_tool, load_tools
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.verification import (
    build_instance,
    field_class,
    interactive_sample,
    replay_reference,
    text_similarity,
)
from tests.fixtures.domain import sandboxed
from tests.test_environments import trajectory

pytestmark = pytest.mark.timeout(60)

SEED = 3


@pytest.fixture(scope="module")
def instance(pack: DomainPack) -> dict[str, Any]:
    return build_instance(pack, SEED)


async def rollout(
    pool: SandboxPool, spec: dict[str, Any], calls: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run ``calls`` in one sandbox session as a dialogue does: CallRecords and the final state."""
    records = []
    async with await pool.open_session() as session:
        loaded = await load_tools(session, spec["code"], spec["initial_state"])
        assert loaded.ok, loaded.error
        for call in calls:
            run = await call_tool(session, call["name"], call["arguments"])
            records.append({**call, "ok": run.ok, "changed_state": run.changed})
        final = await session.read("STATE")
    assert final.ok and isinstance(final.return_value, dict)
    return records, final.return_value


async def verdict(
    pool: SandboxPool, spec: dict[str, Any], final: dict[str, Any], records: list[dict[str, Any]]
) -> dict[str, Any]:
    result = await pool.run(verify_program(spec["verify"], spec["initial_state"], final, records))
    assert result.ok, result.error
    Verdict.model_validate(result.return_value)  # the contract InteractiveEnvironment reads
    out: dict[str, Any] = result.return_value
    return out


def reference_calls(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: c[k] for k in ("name", "arguments", "actor")} for c in spec["reference_calls"]]


def replace_args(calls: list[dict[str, Any]], name: str, **changes: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(calls)
    call = next(c for c in out if c["name"] == name)
    call["arguments"].update(changes)
    return out


def test_instance_is_an_interactive_spec(pack: DomainPack, instance: dict[str, Any]) -> None:
    spec = InteractiveSpec.model_validate(instance)
    assert spec.code == pack.tools_source and spec.user_tools == pack.user_tools
    assert spec.goal_actions == ["send_verification_code", "issue_refund", "update_order_address"]
    assert len(spec.requirements) == 3 and "refund" in spec.user_instructions
    assert instance["domain"] == "customer_service" and instance["instance_id"].startswith("inst-")
    assert spec.initial_state == pack.generate(SEED)
    assert (
        "import requests" not in spec.verify
        and "def verify(initial_state, final_state, calls)" in spec.verify
    )
    assert build_instance(pack, SEED)["verify"] == spec.verify  # deterministic
    # Field classes of the paper's appendix.
    assert [field_class(k) for k in ("order_id", "address_change_count", "status", "amount", "verified")] == [
        "EXACT"
    ] * 5
    assert [field_class(k) for k in ("description", "reason", "note", "summary", "message")] == [
        "SEMANTIC"
    ] * 5
    assert [field_class(k) for k in ("created_at", "reported_at", "uuid", "token", "timestamp")] == [
        "SKIP"
    ] * 5


def test_reference_trajectory_passes(instance: dict[str, Any]) -> None:
    async def scenario(pool: SandboxPool) -> None:
        records, final = await rollout(pool, instance, reference_calls(instance))
        assert all(r["ok"] for r in records)
        result = await verdict(pool, instance, final, records)
        assert result["pass"] is True and result["reward"] == 1.0
        assert result["components"] == {"state": 1.0, "key_calls": 1.0, "policy": 1.0}
        assert result["details"]["initial_state_matches"] is True
        # Nothing done at all: fails on state and key calls, complies with the policy.
        nothing = await verdict(pool, instance, instance["initial_state"], [])
        assert nothing["pass"] is False and nothing["reward"] == 0.0
        assert nothing["components"]["key_calls"] == 0.0 and nothing["components"]["policy"] == 1.0

    sandboxed(scenario)


def test_paraphrased_dialogue_and_other_timestamps_still_pass(
    pack: DomainPack, instance: dict[str, Any]
) -> None:
    calls = reference_calls(instance)
    refund = next(c for c in calls if c["name"] == "issue_refund")["arguments"]
    report = next(c for c in calls if c["name"] == "report_damage")["arguments"]
    item = refund["reason"].split(":")[0].removeprefix("damaged item ")
    paraphrased = replace_args(
        calls,
        "issue_refund",
        reason=f"refund for the {item}, which arrived damaged ({report['description']})",
    )
    paraphrased = replace_args(
        paraphrased, "report_damage", description=f"when I unpacked it, {report['description']}!"
    )
    assert text_similarity(refund["reason"], paraphrased[5]["arguments"]["reason"]) < 1.0

    async def scenario(pool: SandboxPool) -> None:
        records, final = await rollout(pool, instance, paraphrased)
        assert final["refunds"][-1]["reason"] != refund["reason"]  # the state's free text differs too
        # Timestamps and uuids differ from the reference run anyway (wall clock, uuid4) ...
        _, reference_final = replay_reference(pack, instance["initial_state"], calls)
        assert final["refunds"][-1]["uuid"] != reference_final["refunds"][-1]["uuid"]
        # ... and more so here: shifted timestamps, a new token, a reworded order note.
        final = copy.deepcopy(final)
        final["refunds"][-1]["created_at"] = "2031-01-01T00:00:00+00:00"
        final["damage_reports"][-1]["reported_at"] = "2031-01-01T00:00:01+00:00"
        final["session"]["token"] = "tok-123"
        result = await verdict(pool, instance, final, records)
        assert result["pass"] is True, result["details"]
        assert result["components"] == {"state": 1.0, "key_calls": 1.0, "policy": 1.0}

        # Free text that says something else is not a paraphrase.
        unrelated = replace_args(calls, "issue_refund", reason="goodwill gesture for the late parcel")
        records, final = await rollout(pool, instance, unrelated)
        result = await verdict(pool, instance, final, records)
        assert result["pass"] is False and result["components"]["key_calls"] < 1.0

    sandboxed(scenario)


def test_a_changed_key_argument_fails(instance: dict[str, Any]) -> None:
    calls = reference_calls(instance)
    refund = next(c for c in calls if c["name"] == "issue_refund")["arguments"]
    address = next(c for c in calls if c["name"] == "update_order_address")["arguments"]
    amount = replace_args(calls, "issue_refund", amount=round(refund["amount"] - 10.0, 2))
    zip_code = replace_args(calls, "update_order_address", zip_code=address["zip_code"][:-1] + "0")
    other_order = replace_args(calls, "issue_refund", order_id=address["order_id"])  # the wrong order

    async def scenario(pool: SandboxPool) -> None:
        for variant in (amount, zip_code, other_order):
            records, final = await rollout(pool, instance, variant)
            result = await verdict(pool, instance, final, records)
            assert result["pass"] is False and result["reward"] == 0.0
            assert result["components"]["key_calls"] == pytest.approx(2 / 3)
            assert result["components"]["state"] < 1.0
            assert len(result["details"]["missing_key_calls"]) == 1

    sandboxed(scenario)


def test_a_broken_policy_rule_fails(instance: dict[str, Any]) -> None:
    calls = reference_calls(instance)
    login = calls[1:3]  # send_verification_code, confirm_identity_code
    refund_at = next(n for n, c in enumerate(calls) if c["name"] == "issue_refund")
    # Identity confirmed only after the refund: same final state, same key calls, policy broken.
    late_login = [calls[0], *calls[3 : refund_at + 1], *login, *calls[refund_at + 1 :]]
    user_id = login[0]["arguments"]["user_id"]
    # An extra forbidden call: a second address change on the same order.
    address = next(c for c in calls if c["name"] == "update_order_address")
    twice = [*calls, copy.deepcopy(address)]

    async def scenario(pool: SandboxPool) -> None:
        records, final = await rollout(pool, instance, late_login)
        assert all(r["ok"] for r in records)
        result = await verdict(pool, instance, final, records)
        assert result["pass"] is False and result["reward"] == 0.0
        assert result["components"]["state"] == 1.0 and result["components"]["key_calls"] == 1.0
        assert result["components"]["policy"] < 1.0
        assert any(
            v.startswith("rule_verified_identity") and user_id in v for v in result["details"]["violations"]
        )

        records, final = await rollout(pool, instance, twice)
        result = await verdict(pool, instance, final, records)
        assert result["pass"] is False and result["components"]["policy"] < 1.0
        assert [v.split(" ")[0] for v in result["details"]["violations"]] == [
            "rule_one_address_change_per_order"
        ]

    sandboxed(scenario)


def test_interactive_environment_rewards_the_instance(pack: DomainPack, instance: dict[str, Any]) -> None:
    sample = interactive_sample(pack, instance)
    assert sample.kind == "interactive" and sample.tools == pack.agent_tools
    assert sample.prompt[0]["content"] == pack.policy_text and sample.prompt[1]["role"] == "user"
    done = trajectory(sample, [], 0)  # InteractiveEnvironment.reward reads its own state and calls

    async def drive(pool: SandboxPool, calls: list[dict[str, Any]]) -> tuple[float, dict[str, float]]:
        env = InteractiveEnvironment(sample, pool, Gateway(RulesBackend(seed=0)))
        for call in calls:
            if call["actor"] == "agent":
                observation = await env.call(call["name"], call["arguments"])
            else:  # what the user simulator does with a user tool call (dual control)
                observation = await env._execute(call["name"], call["arguments"], "user")
            assert observation.ok, observation.text
        return await env.reward(done)

    calls = reference_calls(instance)
    refund = next(c for c in calls if c["name"] == "issue_refund")["arguments"]

    async def scenario(pool: SandboxPool) -> None:
        reward, parts = await drive(pool, calls)
        assert reward == 1.0
        assert parts == {"pass": 1.0, "verify_reward": 1.0, "state": 1.0, "key_calls": 1.0, "policy": 1.0}
        wrong = replace_args(calls, "issue_refund", amount=round(refund["amount"] / 2, 2))
        reward, parts = await drive(pool, wrong)
        assert reward == 0.0 and parts["pass"] == 0.0 and parts["key_calls"] < 1.0

    sandboxed(scenario)

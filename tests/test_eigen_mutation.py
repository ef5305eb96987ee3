"""The mutation gate rejects weakened verification functions (issue 17 item 3).

Dialogues are synthesised from every pack in ``samples/domains`` the way the EigenData
stages do (random pool, user intent, validation with repair, dialogue loop; real sandbox, rules
backend). For each, the generated verifier must pass the gate, and its mutants -- each check
removed in turn, each expected value replaced by another of the same type, each comparison
negated -- must be rejected: on the shipped packs at least 95% of them. The gate is run in the
sandbox the way the eigen.verified stage runs it (``mutation_gate``), on a good and a weakened
verifier.
"""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest

from arena.llm.gateway import Gateway
from sandbox import SandboxPool
from streams.eigen.eigen_verified import mutation_gate
from synthesis.eigen.mutation import (
    GateCase,
    gate,
    gate_cases,
    mutants,
    mutation_score,
    reference_of,
    with_reference,
)
from synthesis.eigen.packs import BUILTIN_DIR, DomainPack, load_pack
from synthesis.eigen.roles.tasks import PoolParams
from synthesis.eigen.verification import build_instance, verification_source
from tests.fixtures.domain import sandboxed, sandboxed_with_gateway

pytestmark = pytest.mark.timeout(300)

DIALOGUES = 2
"""Dialogues per pack."""
MAX_SEEDS = 6
FEASIBLE_ONLY = PoolParams(error_prone_parameters=0.0, policy_pressure=0.0)
PACKS = sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "domain.yaml").is_file())


class Trajectory:
    """An accepted dialogue's reference: what the eigen.verified stage builds its verifier from."""

    def __init__(
        self, pack: DomainPack, initial: dict[str, Any], records: list[dict[str, Any]], final: dict[str, Any]
    ):
        self.pack, self.initial, self.records, self.final = pack, initial, records, final
        self.source = verification_source(pack, initial, records, final)
        self.cases = gate_cases(pack, initial, records, final)


def synthesise(pack: DomainPack) -> list[Trajectory]:
    from synthesis.eigen.agents import random_pool, user_intent, validate_with_repair
    from synthesis.eigen.dialog_loop import synthesize_dialog

    async def scenario(pool: SandboxPool, gateway: Gateway) -> list[Trajectory]:
        out: list[Trajectory] = []
        skipped: list[str] = []
        for seed in range(MAX_SEEDS):
            if len(out) == DIALOGUES:
                break
            try:
                state = pack.generate(seed)
            except Exception as exc:  # the pack's own tests own its generator; the gate needs dialogues
                skipped.append(f"seed {seed}: generate: {type(exc).__name__} {exc}")
                continue
            draw = await random_pool(gateway, pack, state, seed, FEASIBLE_ONLY)
            intent = await user_intent(gateway, pack, state, draw)
            outcome = await validate_with_repair(intent, gateway=gateway, runner=pool, pack=pack, state=state)
            if not outcome.accepted:
                skipped.append(f"seed {seed}: {outcome.reason}")
                continue
            dialog = await synthesize_dialog(pack, outcome.final_intent, state, gateway, pool)
            records = [c for c in dialog.records() if c["ok"]]  # as the stage: the calls that ran
            out.append(Trajectory(pack, dialog.initial_state, records, dialog.final_state))
        assert len(out) == DIALOGUES, f"{pack.name}: only {len(out)} dialogues; {skipped}"
        return out

    return sandboxed_with_gateway(scenario)


@pytest.fixture(scope="module")
def trajectories() -> dict[str, list[Trajectory]]:
    return {name: synthesise(load_pack(BUILTIN_DIR / name)) for name in PACKS}


def test_generated_verifiers_pass_the_gate(trajectories: dict[str, list[Trajectory]]) -> None:
    assert "customer_service" in trajectories
    for name, found in trajectories.items():
        for t in found:
            report = gate(t.source, t.pack, t.initial, t.final, t.records, t.cases)
            assert report.passed, (name, report.reason)
            assert report.perturbations >= 5 and report.cases > report.perturbations  # correct variants too
            kinds = Counter(c.name.split(" ")[0] for c in t.cases if not c.expect_pass)
            assert {"wrong", "missing", "extra"} <= set(kinds), (name, kinds)
            if any(c["actor"] == "agent" and c["changed_state"] for c in t.records):  # key calls
                assert {"dropped", "changed"} <= set(kinds), (name, kinds)


def test_the_gate_rejects_weakened_verifiers(trajectories: dict[str, list[Trajectory]]) -> None:
    total = rejected = behavioural = 0
    operators: Counter[str] = Counter()
    for name, found in trajectories.items():
        for t in found:
            score = mutation_score(t.source, t.pack, t.initial, t.final, t.records, t.cases)
            assert score.mutants >= 10, name
            total += score.mutants
            rejected += score.rejected
            behavioural += score.rejected_by_cases
            operators.update(m.operator for m in mutants(reference_of(t.source)))
            # Every state check and every created-record field assertion is load-bearing.
            assert not [s for s in score.survivors if "state_checks" in s], (name, score.survivors)
    assert set(operators) == {"remove", "replace", "negate"}
    print(f"mutation gate: {rejected}/{total} rejected, {behavioural}/{total} by the cases alone")
    assert rejected / total >= 0.95
    assert behavioural / total >= 0.8  # the rest are pack rules no perturbation of this task can break


def test_named_weakenings_are_caught_for_the_right_reason(trajectories: dict[str, list[Trajectory]]) -> None:
    t = trajectories["customer_service"][0]
    reference = reference_of(t.source)
    checks = reference["state_checks"]
    root = next(n for n, c in enumerate(checks) if c["kind"] == "frame" and c["path"] == [])
    no_frame = {**reference, "state_checks": [c for n, c in enumerate(checks) if n != root]}
    report = gate(with_reference(t.source, no_frame), t.pack, t.initial, t.final, t.records, t.cases)
    assert not report.passed and report.wrong[0].startswith("accepts extra")
    negated = {**reference, "state_checks": [{**checks[0], "op": "ne"}, *checks[1:]]}
    report = gate(with_reference(t.source, negated), t.pack, t.initial, t.final, t.records, t.cases)
    assert not report.passed and report.wrong == ["rejects reference"]
    no_rule = {**reference, "rules": reference["rules"][1:]}
    report = gate(with_reference(t.source, no_rule), t.pack, t.initial, t.final, t.records, t.cases)
    assert not report.passed and report.reason.startswith("policy integrity")
    # A verifier that accepts everything is caught by the first perturbation.
    lax = 'def verify(initial_state, final_state, calls):\n    return {"pass": True, "reward": 1.0, "components": {}}\n'
    report = gate(
        lax,
        t.pack,
        t.initial,
        t.final,
        t.records,
        [GateCase(name="reference", expect_pass=True), *t.cases[1:]],
    )
    assert not report.passed and report.wrong[0].startswith("accepts")


def test_the_stage_gate_runs_in_the_sandbox(pack: DomainPack) -> None:
    instance = build_instance(pack, 3)
    reference = reference_of(instance["verify"])
    # The refund's amount no longer checked: any amount would do.
    weakened = copy.deepcopy(reference)
    refund = next(c for c in weakened["state_checks"] if c["kind"] == "created" and c["path"] == ["refunds"])
    del refund["expected"]["amount"]

    async def scenario(pool: SandboxPool) -> None:
        report = await mutation_gate(pack, instance, pool, 5.0)  # the demo's sandbox timeout
        assert report.passed, report.reason
        bad = {**instance, "verify": with_reference(instance["verify"], weakened)}
        report = await mutation_gate(pack, bad, pool, 5.0)
        assert not report.passed and 'accepts wrong ["refunds"].amount of a new record' in report.reason

    sandboxed(scenario)

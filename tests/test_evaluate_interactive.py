"""``arena eval`` on held-out interactive instances (EigenData track), per domain, next to qa packages.

``evaluate`` runs the real rollout state machine in real ``InteractiveEnvironment`` instances of the
built-in customer-service pack (real sandbox, generated verification functions) with a scripted
agent and a scripted user that perform the instance's reference calls on a known number of trials,
so pass^1..pass^4 and pass@4 are known in advance. ``run_eval`` then runs the command path on a
SQLite catalog holding two held-out instances and a held-out qa package, with a tiny model as the
agent and the gateway's rules user simulator (or the policy itself) as the user.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from transformers import AutoTokenizer

from arena.config import ArenaSettings, SandboxSettings
from arena.records.envs import VerifiedSample
from environments.render import IM_END, ToolCall, encode_segment, render_text
from environments.user_view import ParsedUserTurn, UserContext
from lake.eigen_catalog import EigenCatalog
from lake.env_packages import EnvPackageStore
from sandbox import SandboxPool
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.verification import build_instance, interactive_sample
from tests.test_export_verl import packages
from trainer.evaluate import (
    EvalReport,
    GroupReport,
    evaluate,
    heldout_instances,
    interactive_cases,
    pass_at_k,
    pass_hat_k,
    report_table,
    run_eval,
)
from trainer.policy import Generation
from trainer.tiny import build_tiny

pytestmark = pytest.mark.timeout(240)
torch.set_num_threads(1)

SEEDS = (3, 5)
ASK_USER = "Please do that in your app."
DONE = "Everything is done."
SORRY = "Sorry, I cannot help with that."


def instances(pack: DomainPack) -> list[tuple[dict[str, Any], VerifiedSample]]:
    out = []
    for seed in SEEDS:
        built = build_instance(pack, seed)
        out.append((built, interactive_sample(pack, built)))
    return out


def record(catalog: EigenCatalog, built: dict[str, Any], sample: VerifiedSample, split: str) -> None:
    # As the EigenData stage stores them: the published record (split may say train), the row's split.
    catalog.record_instance(
        built["instance_id"], sample.domain, split, sample.sample_id, sample.model_dump_json()
    )


def segments(built: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The reference calls as runs of one actor, in order: ("agent" | "user", calls)."""
    runs: list[tuple[str, list[dict[str, Any]]]] = []
    for call in built["reference_calls"]:
        if runs and runs[-1][0] == call["actor"]:
            runs[-1][1].append(call)
        else:
            runs.append((call["actor"], [call]))
    return runs


def call_block(call: dict[str, Any]) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": call["name"], "arguments": call["arguments"]})
        + "\n</tool_call>"
    )


class ScriptedAgent:
    """A RolloutBackend that solves a case on its first ``right`` trials and gives up on the others.

    A solving trial makes the reference's agent calls in order, one turn per run of agent calls,
    and asks the user to act where the reference has user calls, then says it is done. Trials run
    one at a time (``concurrency=1``), so the n-th opening turn of a case starts its n-th trial.
    """

    def __init__(
        self, tok: Any, cases: list[tuple[dict[str, Any], VerifiedSample]], right: list[int]
    ) -> None:
        self.tok = tok
        self.plans: dict[str, tuple[list[str], int]] = {}
        for (built, sample), r in zip(cases, right, strict=True):
            turns = [
                "\n".join(call_block(c) for c in calls) if actor == "agent" else ASK_USER
                for actor, calls in segments(built)
            ]
            self.plans[str(sample.prompt[-1]["content"])] = ([*turns, DONE], r)
        self.started: Counter[str] = Counter()
        self.solving: dict[str, bool] = {}

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        out = []
        for prompt in prompts:
            text = self.tok.decode(prompt, skip_special_tokens=False)
            opening = next(o for o in self.plans if o in text)
            plan, right = self.plans[opening]
            turn = text.count("<|im_start|>assistant") - 1
            if turn == 0:
                self.started[opening] += 1
                self.solving[opening] = self.started[opening] <= right
            body = plan[turn] if self.solving[opening] else SORRY
            ids = encode_segment(self.tok, body + IM_END)[:max_new_tokens]
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), finished=True))
        return out

    def load_weights(self, model: torch.nn.Module) -> None:
        pass


class ScriptedUser:
    """A UserSimulator doing the reference's user calls when asked, and stopping when the agent is done."""

    kind = "scripted"

    def __init__(self, cases: list[tuple[dict[str, Any], VerifiedSample]]) -> None:
        self.user_runs = {
            built["user_instructions"]: [calls for actor, calls in segments(built) if actor == "user"]
            for built, _ in cases
        }

    async def reply(self, context: UserContext) -> ParsedUserTurn:
        last = context.turns[-1].text
        runs = self.user_runs[context.instructions]
        if last != ASK_USER or context.turn >= len(runs):
            return ParsedUserTurn(message="Thanks.", actions=[], signal="stop")
        actions = [ToolCall(name=c["name"], arguments=c["arguments"]) for c in runs[context.turn]]
        return ParsedUserTurn(message="Done in the app.", actions=actions, signal="continue")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, pack: DomainPack) -> Path:
    texts = [render_text(s.prompt, s.tools) for _, s in instances(pack)]
    texts += [p.question for p in packages().values()]
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", texts, seed=0)


def check_consistent(group: GroupReport, k: int) -> None:
    """pass^k <= ... <= pass^1 <= pass@k, all in [0, 1], for a group's means."""
    values = [group.pass_hat[j].mean for j in range(1, k + 1)]
    assert sorted(group.pass_hat) == list(range(1, k + 1))
    assert all(0.0 <= v <= 1.0 for v in [*values, group.pass_at_k.mean])
    assert values == sorted(values, reverse=True) and values[0] <= group.pass_at_k.mean


def test_evaluate_counts_interactive_successes_by_the_verifier(tiny: Path, pack: DomainPack) -> None:
    tok = AutoTokenizer.from_pretrained(str(tiny), local_files_only=True)
    cases = instances(pack)
    agent = ScriptedAgent(tok, cases, right=[3, 1])

    async def main() -> EvalReport:
        async with SandboxPool(SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 10.0})) as pool:
            held = [s.model_copy(update={"split": "heldout"}) for _, s in cases]
            eval_cases = interactive_cases(held, pool, ScriptedUser(cases))
            return await evaluate(
                agent, tok, eval_cases, k=4, max_turns=12, max_seq_len=8192, max_new_tokens=512, concurrency=1
            )

    report = asyncio.run(main())
    first, second = (next(c for c in report.cases if c.env_ref == b["instance_id"]) for b, _ in cases)
    assert (first.kind, first.trials, first.successes, first.errors) == ("interactive", 4, 3, [])
    assert (second.trials, second.successes) == (4, 1)
    assert first.rewards == [1.0, 1.0, 1.0, 0.0] and second.rewards == [1.0, 0.0, 0.0, 0.0]
    # c = 3 of 4: pass^1 3/4, pass^2 C(3,2)/C(4,2) = 1/2, pass^3 C(3,3)/C(4,3) = 1/4, pass^4 0; pass@4 1
    assert first.pass_hat == pytest.approx({1: 0.75, 2: 0.5, 3: 0.25, 4: 0.0}) and first.pass_at_k == 1.0
    assert second.pass_hat == pytest.approx({1: 0.25, 2: 0.0, 3: 0.0, 4: 0.0}) and second.pass_at_k == 1.0
    assert first.f1 == [] and first.turns[0] == len(segments(cases[0][0])) + 1 and first.turns[3] == 1
    (group,) = report.domains
    assert (group.name, group.cases, group.trials, group.f1) == ("customer_service", 2, 8, None)
    means = {j: group.pass_hat[j].mean for j in range(1, 5)}
    assert means == pytest.approx({1: 0.5, 2: 0.25, 3: 0.125, 4: 0.0}) and group.pass_at_k.mean == 1.0
    check_consistent(group, 4)


def test_heldout_instances_come_from_the_catalog(tmp_path: Path, pack: DomainPack) -> None:
    catalog = EigenCatalog(f"sqlite:///{tmp_path}/catalog.db")
    (a, sa), (b, sb) = instances(pack)
    record(catalog, a, sa, "heldout")
    record(catalog, b, sb, "train")
    try:
        (only,) = heldout_instances(catalog)
    finally:
        catalog.dispose()
    assert only.sample_id == sa.sample_id and only.split == "heldout" and sa.split == "train"
    assert only.model_dump(exclude={"split"}) == sa.model_dump(exclude={"split"})


def test_run_eval_reports_interactive_and_qa_domains(tmp_path: Path, tiny: Path, pack: DomainPack) -> None:
    settings = ArenaSettings(
        home=tmp_path / "home",
        catalog_url=f"sqlite:///{tmp_path}/catalog.db",
        sandbox={"pool_size": 2, "timeout_s": 10.0},
        train={"max_new_tokens": 12, "max_seq_len": 8192},
    )
    with pytest.raises(ValueError, match="no held-out packages or interactive instances"):
        run_eval(settings, str(tiny), k=2, progress=False)
    catalog = EigenCatalog(settings.catalog)
    cases = instances(pack)
    for built, sample in cases:
        record(catalog, built, sample, "heldout")
    train_only = build_instance(pack, 11)
    record(catalog, train_only, interactive_sample(pack, train_only), "train")
    catalog.dispose()
    store = EnvPackageStore(settings.catalog)
    store.record(packages()["stock"], "heldout")
    store.dispose()

    report = run_eval(settings, str(tiny), k=4, max_turns=2, seed=1, progress=False)
    assert (report.k, report.trials) == (4, 4)
    interactive = [c for c in report.cases if c.kind == "interactive"]
    assert sorted(c.env_ref for c in interactive) == sorted(b["instance_id"] for b, _ in cases)
    assert [g.name for g in report.domains] == ["customer_service", "ecommerce"]
    service = report.domains[0]
    assert (service.cases, service.trials, service.f1) == (2, 8, None)
    for case in interactive:
        assert case.trials == 4 and not case.errors and all(1 <= t <= 2 for t in case.turns)
        assert case.pass_hat == {j: pass_hat_k(4, case.successes, j) for j in range(1, 5)}
        assert case.pass_at_k == pass_at_k(4, case.successes, 4)
        assert case.successes == sum(r >= 1.0 for r in case.rewards)
    assert service.pass_hat[1].mean == pytest.approx(sum(c.successes for c in interactive) / 8)
    check_consistent(service, 4)
    check_consistent(report.overall, 4)
    console = Console(record=True, width=220)
    console.print(report_table(report))
    shown = console.export_text()
    for text in ("customer_service", "ecommerce", "pass^4", "pass@4"):
        assert text in shown

    # The policy itself as the user: the same cases, its own generations on the user side.
    mirrored = run_eval(settings, str(tiny), k=2, max_turns=2, seed=1, limit=1, progress=False, user="policy")
    assert [c.kind for c in mirrored.cases] == ["qa", "interactive"]
    assert all(c.trials == 2 and not c.errors for c in mirrored.cases)

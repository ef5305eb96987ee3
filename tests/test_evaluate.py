"""``arena eval``: pass^k / pass@k estimators, aggregation, and held-out evaluation end to end.

The estimators and the aggregation are checked against hand-computed values. ``evaluate`` runs
the real rollout state machine in real ``QaEnvironment`` instances (real sandbox) with a scripted
policy: a ``RolloutBackend`` that writes fixed turns (tool calls, then a final answer that is right
on a set number of trials per case), so every count is known in advance. ``run_eval`` then runs
the whole command path (catalog, tiny transformers model, sandbox pool, progress bar) on a
held-out package.
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

from arena.config import ArenaSettings, SandboxSettings
from arena.records.envs import VerifiedSample
from environments.render import IM_END, encode_segment
from lake.env_packages import EnvPackageStore
from sandbox import SandboxPool
from tests.test_export_verl import packages
from trainer.call_stats import CallStats
from trainer.evaluate import (
    CaseResult,
    EvalReport,
    HeldOut,
    aggregate,
    answer_given,
    case_result,
    evaluate,
    heldout_cases,
    pass_at_k,
    pass_hat_k,
    qa_cases,
    report_table,
    run_eval,
    trial_seed,
    trial_success,
)
from trainer.policy import Generation
from trainer.rollout import Trajectory
from trainer.tiny import build_tiny

pytestmark = pytest.mark.timeout(240)
torch.set_num_threads(1)


# --------------------------------------------------------------------------- estimators


def test_pass_hat_and_pass_at_k_by_hand() -> None:
    # n=4, c=2, k=2: pass^2 = C(2,2)/C(4,2) = 1/6; pass@2 = 1 - C(2,2)/C(4,2) = 5/6
    assert pass_hat_k(4, 2, 2) == pytest.approx(1 / 6)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6)
    # k=1: both are c/n
    assert pass_hat_k(5, 3, 1) == pytest.approx(3 / 5) and pass_at_k(5, 3, 1) == pytest.approx(3 / 5)
    # n=5, c=4, k=3: pass^3 = C(4,3)/C(5,3) = 4/10; pass@3 = 1 - C(1,3)/C(5,3) = 1 - 0 = 1
    assert pass_hat_k(5, 4, 3) == pytest.approx(0.4) and pass_at_k(5, 4, 3) == 1.0
    # n=8, c=3, k=4: pass^4 = C(3,4)/C(8,4) = 0; pass@4 = 1 - C(5,4)/C(8,4) = 1 - 5/70 = 13/14
    assert pass_hat_k(8, 3, 4) == 0.0 and pass_at_k(8, 3, 4) == pytest.approx(13 / 14)
    # all succeed / none succeed
    assert pass_hat_k(4, 4, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0
    for bad in ((3, 1, 4), (4, 5, 2), (4, -1, 2), (4, 2, 0)):
        with pytest.raises(ValueError):
            pass_hat_k(*bad)
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def result(domain: str, n: int, c: int, k: int, f1: list[float]) -> CaseResult:
    return CaseResult(
        sample_id=f"vs-{domain}-{c}",
        env_ref="env",
        domain=domain,
        kind="qa",
        trials=n,
        successes=c,
        pass_hat={j: pass_hat_k(n, c, j) for j in range(1, k + 1)},
        pass_at_k=pass_at_k(n, c, k),
        f1=f1,
        rewards=f1,
        turns=[2] * n,
        tool_calls=[1] * n,
    )


def test_aggregation_means_over_cases_with_bootstrap_intervals() -> None:
    cases = [
        result("a", 4, 4, 2, [1.0] * 4),  # pass^1 1, pass^2 1, pass@2 1
        result("a", 4, 2, 2, [1.0, 1.0, 0.0, 0.0]),  # pass^1 1/2, pass^2 1/6, pass@2 5/6
        result("b", 4, 0, 2, [0.0] * 4),  # all 0
    ]
    report = aggregate(cases, k=2, trials=4, seed=7)
    a, b = report.domains
    assert (a.name, a.cases, a.trials, b.name, b.cases) == ("a", 2, 8, "b", 1)
    assert a.pass_hat[1].mean == pytest.approx(0.75)  # (1 + 1/2) / 2
    assert a.pass_hat[2].mean == pytest.approx((1 + 1 / 6) / 2)
    assert a.pass_at_k.mean == pytest.approx((1 + 5 / 6) / 2)
    assert a.f1 is not None and a.f1.mean == pytest.approx(0.75)  # mean of per-case means 1 and 1/2
    # two cases: the bootstrap means lie between the two values, and both ends are reached
    assert (a.pass_hat[1].ci_low, a.pass_hat[1].ci_high) == (0.5, 1.0)
    assert b.pass_at_k.model_dump() == {"mean": 0.0, "ci_low": 0.0, "ci_high": 0.0}  # one case
    overall = report.overall
    assert overall.cases == 3 and overall.pass_hat[1].mean == pytest.approx(1.5 / 3)
    assert overall.pass_hat[1].ci_low <= overall.pass_hat[1].mean <= overall.pass_hat[1].ci_high
    assert aggregate(cases, k=2, trials=4, seed=7) == report  # seeded
    assert EvalReport.model_validate_json(report.model_dump_json()) == report
    with pytest.raises(ValueError):
        aggregate([], k=2, trials=4, seed=0)


def trajectory(sample: VerifiedSample, final: str, reward: float = 0.0) -> Trajectory:
    messages = [*sample.prompt, {"role": "assistant", "content": final}]
    return Trajectory(
        sample_id=sample.sample_id,
        seed=0,
        messages=messages,
        tools=sample.tools,
        prompt_ids=[1],
        response_ids=[2],
        response_mask=[1],
        logprobs=[0.0],
        turns=1,
        tool_calls=0,
        invalid_calls=0,
        failed_calls=0,
        user_turns=0,
        tool_outputs=[],
        stop="no_tool_call",
        reward=reward,
    )


def test_trial_success_qa_final_answer_and_interactive_verdict() -> None:
    (h,) = held(packages()["agent_name"])  # a0 = "Tom Becker"
    qa = h.sample
    assert trial_success(qa, trajectory(qa, "It is  tom\nBECKER."))  # casefold + whitespace collapse
    assert not trial_success(qa, trajectory(qa, "It is Tom."))
    blank = qa.model_copy(update={"reward_spec": {**qa.reward_spec, "answer": "  "}})
    assert not trial_success(blank, trajectory(blank, "anything"))  # an empty answer never counts
    # qa success reads the final message, not the F1 reward
    assert not trial_success(qa, trajectory(qa, "no idea", reward=1.0))
    interactive = qa.model_copy(update={"kind": "interactive", "reward_spec": {}})
    assert trial_success(interactive, trajectory(interactive, "done", reward=1.0))
    assert not trial_success(interactive, trajectory(interactive, "Tom Becker", reward=0.0))


def test_trial_seeds_are_distinct_and_stable() -> None:
    seeds = [trial_seed(3, "vs-x", t) for t in range(8)]
    assert len(set(seeds)) == 8 and seeds == [trial_seed(3, "vs-x", t) for t in range(8)]
    assert trial_seed(4, "vs-x", 0) != seeds[0]


# --------------------------------------------------------------------------- evaluate, scripted policy


class ScriptedPolicy:
    """A RolloutBackend writing fixed turns: first the calls in ``calls`` for the case's question,
    then a final answer, right on the first ``right[question]`` final turns of that case."""

    def __init__(self, tokenizer: Any, script: dict[str, tuple[list[str], str, int]]) -> None:
        self.tok = tokenizer
        self.script = script  # question -> (call blocks, right answer, how many trials answer right)
        self.finals: Counter[str] = Counter()

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        out = []
        for prompt in prompts:
            text = self.tok.decode(prompt, skip_special_tokens=False)
            question = next(q for q in self.script if q in text)
            calls, answer, right = self.script[question]
            if "<tool_response>" not in text:
                body = "\n".join(calls)
            else:
                self.finals[question] += 1
                body = (
                    f"The answer is {answer}." if self.finals[question] <= right else "I could not find it."
                )
            ids = encode_segment(self.tok, body + IM_END)[:max_new_tokens]
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), finished=True))
        return out

    def load_weights(self, model: torch.nn.Module) -> None:
        pass


def call_block(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    texts = [p.question for p in packages().values()]
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", texts, seed=0)


def test_evaluate_counts_successes_through_real_rollouts(tiny: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny), local_files_only=True)
    pkgs = packages()
    stock, price = pkgs["stock"], pkgs["price"]
    policy = ScriptedPolicy(
        tokenizer,
        {
            # one call that solves the only job; right 4 times of 4
            stock.question: ([call_block("get_product_stock", {"sku": "SKU-9"})], "17", 4),
            # one call for two jobs (F1 = 2/3, see below); right once in 4
            price.question: ([call_block("get_listing_price", {"listing_id": "L-101"})], "L-104", 1),
        },
    )

    async def main() -> EvalReport:
        async with SandboxPool(SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 5.0})) as pool:
            cases = qa_cases([HeldOut(sample=h.sample, package=h.package) for h in held(stock, price)], pool)
            ticks: list[int] = []
            report = await evaluate(
                policy,
                tokenizer,
                cases,
                k=2,
                trials=4,
                max_turns=4,
                max_new_tokens=64,
                on_trial=lambda: ticks.append(1),
            )
            assert len(ticks) == 8
            return report

    report = asyncio.run(main())
    by_domain = {g.name: g for g in report.domains}
    stock_case, price_case = (next(c for c in report.cases if c.env_ref == p.env_id) for p in (stock, price))
    # stock: c = 4 of n = 4 -> pass^1 = pass^2 = pass@2 = 1; F1 = 1 (n = 1, n_hat = 1, c = 1)
    assert (stock_case.trials, stock_case.successes) == (4, 4)
    assert stock_case.pass_hat == {1: 1.0, 2: 1.0} and stock_case.pass_at_k == 1.0
    assert stock_case.f1 == pytest.approx([1.0] * 4)
    # price: c = 1 -> pass^1 = 1/4, pass^2 = C(1,2)/C(4,2) = 0, pass@2 = 1 - C(3,2)/C(4,2) = 1/2;
    # F1: n = 2, n_hat = 1, c = 1 -> r = 1/2, p = 1, F1 = 2(1)(1/2)/(3/2) = 2/3
    assert (price_case.trials, price_case.successes) == (4, 1)
    assert price_case.pass_hat == pytest.approx({1: 0.25, 2: 0.0}) and price_case.pass_at_k == pytest.approx(
        0.5
    )
    assert price_case.f1 == pytest.approx([2 / 3] * 4)
    assert price_case.turns == [2] * 4 and price_case.tool_calls == [1] * 4 and price_case.errors == []
    assert by_domain["ecommerce"].pass_hat[2].mean == 1.0
    assert by_domain["real_estate"].pass_at_k.mean == pytest.approx(0.5)
    # overall: means over the two cases
    assert report.overall.pass_hat[1].mean == pytest.approx((1 + 0.25) / 2)
    assert report.overall.pass_hat[2].mean == pytest.approx(0.5)
    assert report.overall.pass_at_k.mean == pytest.approx(0.75)
    assert report.overall.f1 is not None and report.overall.f1.mean == pytest.approx((1 + 2 / 3) / 2)
    assert report.overall.mean_turns == 2.0
    # both scripted calls copy their id from the question and run: nothing failed, all grounded
    one_good_call = CallStats(calls=1, observations=1, failed=0, grounded=1)
    assert stock_case.call_stats == price_case.call_stats == [one_good_call] * 4
    assert (report.overall.failed_call_share, report.overall.grounded_call_share) == (0.0, 1.0)

    console = Console(record=True, width=200)
    console.print(report_table(report))
    shown = console.export_text()
    for text in ("ecommerce", "real_estate", "all", "pass^1", "pass^2", "pass@2", "mean F1", "0.625", "100%"):
        assert text in shown


def held(*pkgs: Any) -> list[HeldOut]:
    from streams.envs.samples_verified import sample_of

    return [HeldOut(sample=sample_of(p), package=p) for p in pkgs]


def test_a_trial_that_raises_is_a_failure_not_a_crash() -> None:
    (h,) = held(packages()["stock"])
    outcome = case_result(h.sample, ["RuntimeError: sandbox gone", "RuntimeError: sandbox gone"], k=2)
    assert (outcome.trials, outcome.successes, outcome.pass_at_k, len(outcome.errors)) == (2, 0, 0.0, 2)


# --------------------------------------------------------------------------- the command path


def test_run_eval_on_the_catalog_with_a_tiny_model(tmp_path: Path, tiny: Path) -> None:
    settings = ArenaSettings(
        home=tmp_path / "home",
        sandbox={"pool_size": 2, "timeout_s": 5.0},
        train={"max_new_tokens": 12},
    )
    store = EnvPackageStore(settings.catalog)
    pkgs = packages()
    store.record(pkgs["price"], "train")
    store.record(pkgs["stock"], "heldout")
    store.record(pkgs["agent_name"], "heldout")
    assert [h.package.env_id for h in heldout_cases(settings)] == sorted(
        [pkgs["stock"].env_id, pkgs["agent_name"].env_id]
    )
    assert all(h.sample.split == "heldout" for h in heldout_cases(store))

    report = run_eval(settings, str(tiny), k=2, trials=3, max_turns=2, seed=1, progress=False)
    assert report.model == str(tiny) and (report.k, report.trials) == (2, 3)
    assert {c.env_ref for c in report.cases} == {pkgs["stock"].env_id, pkgs["agent_name"].env_id}
    assert all(c.trials == 3 and not c.errors and len(c.turns) == 3 for c in report.cases)
    assert all(1 <= t <= 2 for c in report.cases for t in c.turns)
    assert [g.name for g in report.domains] == ["ecommerce", "real_estate"] and report.overall.cases == 2
    # the same seed gives the same rollouts
    again = run_eval(settings, str(tiny), k=2, trials=3, max_turns=2, seed=1, progress=False)
    assert [c.model_dump() for c in again.cases] == [c.model_dump() for c in report.cases]
    # ``only`` picks held-out packages by env id: the same case, the same rollouts
    stock = pkgs["stock"].env_id
    one = run_eval(settings, str(tiny), k=2, trials=3, max_turns=2, seed=1, progress=False, only={stock})
    assert [c.model_dump() for c in one.cases] == [c.model_dump() for c in report.cases if c.env_ref == stock]
    with pytest.raises(ValueError, match="none of the ids"):
        run_eval(settings, str(tiny), k=2, progress=False, only={pkgs["price"].env_id})  # a train package


def test_final_answer_must_be_stated_as_a_whole_word() -> None:
    assert answer_given("3", "There are 3 listings.")
    assert answer_given("Zürich", "It is in  ZÜRICH.")  # casefold + whitespace collapse
    assert answer_given("APT-9013", "The unit is apt-9013, second floor.")
    assert not answer_given("3", "There are 30 listings.")  # a digit inside a number is not the answer
    assert not answer_given("36", "id 1367")
    assert not answer_given("", "anything")

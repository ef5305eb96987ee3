"""``arena eval --bench bfcl``: BFCL items through Arena's client, scored by bfcl-eval's own checker.

bfcl-eval lives in ``.venv-bfcl`` (scripts/install_bfcl.sh, or the python named by
``ARENA_BFCL_PYTHON``). These tests FAIL, never skip, when it is missing: the benchmark's own checker
is the point. They check that the checker (run as a library in that virtualenv) accepts the possible
answers and rejects hand-made wrong calls, that the do-nothing agent is scored by the same checker,
and the whole evaluation end to end against ``arena llm serve`` on a few items per category.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.cli import arena_env, run_arena
from tests.fixtures.llm_serve import llm_server
from tests.test_llm_serve import free_port
from trainer.benchmarks import bfcl
from trainer.benchmarks.bfcl import (
    MULTI_TURN,
    BfclCalls,
    BfclError,
    BfclItem,
    bfcl_python,
    categories_of,
    load_items,
    score,
)
from trainer.benchmarks.bfcl_env import ADDED_FUNCTIONS, BfclEnvironment, BfclRuntime, MultiTurnItem
from trainer.benchmarks.report import BenchReport, bench_table

pytestmark = pytest.mark.integration

CATEGORIES = ["simple_python", "multiple", "parallel", "irrelevance"]


@pytest.fixture(scope="module")
def items() -> list[BfclItem]:
    """The first 3 items of each category, as bfcl-eval ships them."""
    single, multi = load_items(CATEGORIES, 3)
    assert not multi
    return single


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llm_server(tmp_path_factory.mktemp("serve-home"), free_port(), max_concurrency=8) as url:
        yield url


def right_calls(item: BfclItem) -> BfclCalls:
    """The first possible answer of each expected call, named as the tools were sent ('.' -> '_')."""
    assert item.ground_truth is not None
    calls = []
    for expected in item.ground_truth:
        ((name, params),) = expected.items()
        args = {p: next(v for v in values if v != "") for p, values in params.items() if values != [""]}
        calls.append({name.replace(".", "_"): args})
    return calls


def first_value_changed(calls: BfclCalls) -> BfclCalls:
    """``calls`` with the first call's first argument given a value no possible answer has."""
    ((name, args),) = calls[0].items()
    param = next(iter(args))
    value = args[param]
    wrong: Any = (
        value + 1000 if isinstance(value, int | float) and not isinstance(value, bool) else "zzz-wrong"
    )
    return [{name: {**args, param: wrong}}, *calls[1:]]


def test_items_come_from_the_wheel_with_openai_tools(items: list[BfclItem]) -> None:
    assert [i.category for i in items] == [c for c in CATEGORIES for _ in range(3)]
    simple = items[0]
    assert simple.id == "simple_python_0" and simple.messages[0]["role"] == "user"
    assert (
        simple.tools[0]["type"] == "function"
        and simple.tools[0]["function"]["parameters"]["type"] == "object"
    )
    factorial = items[1]  # 'math.factorial': OpenAI names allow no '.', bfcl-eval sends '_'
    assert factorial.tools[0]["function"]["name"] == "math_factorial"
    assert all(i.ground_truth is None for i in items if i.category == "irrelevance")


def hand_made_trials(item: BfclItem) -> list[tuple[BfclCalls | str, bool]]:
    """Trials of one item and whether bfcl-eval must accept each (a str: a trial that got no reply)."""
    if item.ground_truth is None:  # irrelevance: only calling nothing is right
        call: dict[str, dict[str, Any]] = {item.tools[0]["function"]["name"]: {}}
        return [([], True), ([call], False), ("trial 2: no usable reply (test)", False), ([], True)]
    right = right_calls(item)
    wrong_name = [{"no_such_function": next(iter(right[0].values()))}, *right[1:]]
    return [
        (right, True),
        (first_value_changed(right), False),
        (right[:-1], False),  # a call missing (none at all for a simple item)
        (wrong_name, False),
        (list(reversed(right)), True),  # parallel calls in any order
    ]


def test_the_checker_scores_hand_made_calls_and_the_do_nothing_agent(items: list[BfclItem]) -> None:
    """One run of bfcl-eval's checker: right calls pass, wrong ones fail, doing nothing passes only
    irrelevance, and a trial without a reply scores 0 with its reason kept."""
    plans = {item.id: hand_made_trials(item) for item in items}
    trials = 5
    replies: dict[tuple[str, int], BfclCalls | str] = {}
    for item in items:
        plan = (plans[item.id] * trials)[:trials]
        plans[item.id] = plan
        replies.update({(item.id, t): calls for t, (calls, _) in enumerate(plan)})
    results = {r.task_id: r for r in score(items, replies, trials)}
    assert list(results) == [i.id for i in items]
    for item in items:
        result, plan = results[item.id], plans[item.id]
        assert result.group == item.category
        assert result.rewards == [1.0 if ok else 0.0 for _, ok in plan], (item.id, plan, result.rewards)
        assert result.errors == [calls for calls, _ in plan if isinstance(calls, str)]
        assert result.baseline_reward == (1.0 if item.category == "irrelevance" else 0.0)


def test_categories_and_a_missing_virtualenv_are_clear(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert categories_of("simple, parallel,simple") == ["simple_python", "parallel"]
    assert categories_of("multi_turn,multi_turn_base") == list(MULTI_TURN)
    with pytest.raises(BfclError, match=r"multi_turn_composite.*fix"):
        categories_of("simple,multi_turn_composite")
    monkeypatch.setenv("ARENA_BFCL_PYTHON", str(tmp_path / "python"))
    with pytest.raises(BfclError, match=r"install_bfcl\.sh"):
        bfcl.load_items(["simple_python"], 1)


def test_eval_bench_bfcl_end_to_end_against_llm_serve(tmp_path: Path, served: str) -> None:
    env = arena_env(tmp_path / "home")
    url = served.replace("http://", "openai://", 1) + "?model=rules-v1"
    args = ["eval", "--bench", "bfcl", "--model", url, "--category", "simple,multiple,parallel,irrelevance"]
    proc = run_arena([*args, "--limit", "4", "--k", "1", "--trials", "2", "--json"], env, timeout=240)
    report = BenchReport.model_validate_json(proc.stdout)
    assert report.bench == "bfcl" and report.trials == 2 and report.k == 1
    groups = {g.group: g for g in report.groups}
    assert set(groups) == {"simple_python", "multiple", "parallel", "irrelevance", "all"}
    assert all(groups[c].tasks == 4 and groups[c].errors == 0 for c in CATEGORIES)
    # The do-nothing floor: bfcl-eval passes no call only on irrelevance.
    assert groups["irrelevance"].baseline_pass == 1.0
    assert groups["simple_python"].baseline_pass == groups["parallel"].baseline_pass == 0.0
    # The rules agent solves some simple items (simple_python_0: base 10, height 5), and a trial is
    # scored on what it called: its reward is one of the checker's verdicts, never made up.
    assert groups["simple_python"].pass_hat[1] > 0.0
    assert all(r in (0.0, 1.0) for t in report.tasks for r in t.rewards)

    console = Console(width=200, record=True)
    console.print(bench_table(report))
    text = console.export_text()
    assert "do-nothing" in text and "simple_python" in text and "irrelevance" in text


def test_eval_bench_mistakes_are_named(tmp_path: Path, served: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from app.cli import app
    from app.cli_common import UserError

    monkeypatch.setenv("ARENA_HOME", str(tmp_path / "home"))
    url = served.replace("http://", "openai://", 1) + "?model=rules-v1"
    cases = [
        (["--bench", "bfcl"], "--model openai://"),
        (["--bench", "bfcl", "--model", url, "--category", "nope"], "--category 'nope'"),
        (["--bench", "bfcl", "--model", url, "--domain", "airline"], "--domain is for --bench tau2"),
        (["--bench", "tau2", "--model", url, "--category", "simple"], "--category is for --bench bfcl"),
        (["--bench", "tau2", "--model", url], "needs --domain"),
        (["--bench", "mmlu", "--model", url], "--bench 'mmlu'"),
        (["--bench", "bfcl", "--model", "openai://127.0.0.1:8000/v1"], "?model=NAME"),
        (["--category", "simple"], "go with --bench"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(app, ["eval", *extra])
        assert isinstance(result.exception, UserError), (extra, result.output)
        assert message in str(result.exception), (extra, result.exception)
    bad = run_arena(["eval", "--bench", "bfcl", "--category", "nope"], arena_env(tmp_path / "home"), check=2)
    assert "Traceback" not in bad.stderr and "--model openai://" in bad.stderr


def _keyword_calls(call: str) -> tuple[str, dict[str, Any]] | None:
    """A ground-truth call string as (name, arguments), or None when it passes arguments by position."""
    import ast

    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    if node.args:
        return None
    return node.func.id, {str(k.arg): ast.literal_eval(k.value) for k in node.keywords}


def test_multi_turn_items_score_with_bfcl_evals_checker_and_run_as_environments() -> None:
    """bfcl-eval's multi-turn checker through the runtime: the ground truth passes, a dropped call, no
    call and a trial cut a turn short fail. Played call by call in ``BfclEnvironment`` (its executor,
    its scripted turns), the ground truth scores 1.0; on a miss_func item the held-out tool is
    offered only from its turn, with bfcl-eval's own message; a made-up call gets bfcl-eval's error
    and is recorded as bfcl-eval records it."""
    import asyncio

    _, multi = load_items(["multi_turn_base", "multi_turn_miss_func"], 4)
    keyword_only = [i for i in multi if all(_keyword_calls(c) for turn in i.ground_truth for c in turn)]
    assert {i.category for i in keyword_only} == {"multi_turn_base", "multi_turn_miss_func"}

    def steps(turns: list[list[str]]) -> list[list[list[str]]]:
        return [[[c] for c in turn] for turn in turns]

    async def play(runtime: BfclRuntime, item: MultiTurnItem) -> tuple[float, list[str], list[int]]:
        env = BfclEnvironment(item, runtime, namespace=f"test_{item.id}")
        said, offered = [], [len(env.tools)]
        try:
            for i, turn in enumerate(item.ground_truth):
                if i:
                    said.append(await env.user_turn("Done."))
                    offered.append(len(env.tools))
                for call in turn:
                    found = _keyword_calls(call)
                    assert found is not None
                    observation = await env.call(*found)
                    assert observation.ok, (item.id, call, observation.text)
            assert await env.user_turn("Done.") is None  # every turn is done
            reward, _ = await env.reward(None)  # type: ignore[arg-type]  # it reads its own record
        finally:
            await env.close()
        return reward, said, offered

    async def go() -> None:
        async with BfclRuntime(bfcl_python()) as runtime:
            for item in multi:
                truth = item.ground_truth

                async def check(calls: list[list[list[str]]], item: MultiTurnItem = item) -> bool:
                    answer = await runtime.request({"op": "check", "item": {**item.wire(), "calls": calls}})
                    return bool(answer["valid"])

                assert await check(steps(truth)), item.id
                assert not await check([[] for _ in truth]), item.id  # the do-nothing agent
                assert not await check(steps(truth[:-1])), item.id  # cut a turn short
                first = next(i for i, turn in enumerate(truth) if turn)
                dropped = [turn[1:] if i == first else turn for i, turn in enumerate(truth)]
                assert not await check(steps(dropped)), item.id
            for item in keyword_only:
                reward, said, offered = await play(runtime, item)
                assert reward == 1.0, item.id
                if item.missed:
                    (turn, added), *_ = item.missed.items()
                    assert said[int(turn) - 1] == ADDED_FUNCTIONS
                    assert offered[int(turn)] == offered[0] + len(added)
            miss = next(i for i in multi if i.missed)
            env = BfclEnvironment(miss, runtime, namespace="test_unknown")
            held_out = next(iter(miss.missed.values()))[0]["function"]["name"]
            assert held_out not in {t["function"]["name"] for t in env.tools}
            made_up = await env.call("no_such_function", {})
            assert not made_up.ok and made_up.text.startswith("Error during execution")
            assert env.calls == [[["no_such_function()"]]]  # recorded as bfcl-eval records it
            await env.close()

    asyncio.run(go())


def test_eval_bench_bfcl_multi_turn_against_llm_serve(tmp_path: Path, served: str) -> None:
    """`--category multi_turn`: the four multi-turn categories, episodes through the endpoint,
    bfcl-eval's checker per trial, and the do-nothing agent (no call on any turn) beside them."""
    env = arena_env(tmp_path / "home")
    url = served.replace("http://", "openai://", 1) + "?model=rules-v1"
    args = ["eval", "--bench", "bfcl", "--model", url, "--category", "multi_turn", "--limit", "1"]
    proc = run_arena([*args, "--k", "1", "--trials", "1", "--json"], env, timeout=300)
    report = BenchReport.model_validate_json(proc.stdout)
    groups = {g.group: g for g in report.groups}
    assert set(groups) == {*MULTI_TURN, "all"}
    assert all(groups[c].tasks == 1 and groups[c].errors == 0 for c in MULTI_TURN)
    assert groups["all"].baseline_pass == 0.0  # every first turn asks for calls
    assert all(r in (0.0, 1.0) for t in report.tasks for r in t.rewards)

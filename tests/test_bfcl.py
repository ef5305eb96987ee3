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
    BfclCalls,
    BfclError,
    BfclItem,
    categories_of,
    load_items,
    score,
)
from trainer.benchmarks.report import BenchReport, bench_table

pytestmark = pytest.mark.integration

CATEGORIES = ["simple_python", "multiple", "parallel", "irrelevance"]


@pytest.fixture(scope="module")
def items() -> list[BfclItem]:
    """The first 3 items of each category, as bfcl-eval ships them."""
    return load_items(CATEGORIES, 3)


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
    with pytest.raises(BfclError, match=r"multi_turn_base.*fix"):
        categories_of("simple,multi_turn_base")
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

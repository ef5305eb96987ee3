"""``arena eval`` of a model served at an OpenAI-compatible endpoint (``--model openai://...``).

The endpoint is a real ``arena llm serve`` process (the rules simulator behind the OpenAI API, on a
free loopback port). ``run_eval`` evaluates a SQLite catalog's held-out qa packages and held-out
interactive instances of the built-in customer-service pack through it: every agent turn is a
native ``agent_policy`` chat request with ``tools``, every call runs in the real sandbox, the
rules user simulator (``--user gateway``) plays the user, and the server's ``/v1/arena/stats``
shows the requests it answered. The command path is checked for the user mistakes an endpoint
brings (a bad URL, nothing listening), which must be one clear line without a traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from arena.config import ArenaSettings
from arena.records.envs import VerifiedSample
from lake.eigen_catalog import EigenCatalog
from lake.env_packages import EnvPackageStore
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.verification import build_instance, interactive_sample
from tests.cli import arena_env, run_arena
from tests.fixtures.llm_serve import llm_server
from tests.test_export_verl import LISTINGS, PRICE, package, packages
from tests.test_llm_serve import free_port
from trainer.endpoint_policy import EndpointError, check_endpoint_url, endpoint_gateway, is_endpoint
from trainer.evaluate import EvalReport, GroupReport, pass_at_k, pass_hat_k, run_eval

pytestmark = pytest.mark.timeout(240)

MODEL = "rules-v1"
"""The model id ``arena llm serve`` serves with the rules backend."""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``arena llm serve`` (rules) on a free port; yields its ``openai://`` URL (no scheme's http)."""
    with llm_server(tmp_path_factory.mktemp("serve-home"), free_port(), max_concurrency=8) as url:
        yield url


def openai_url(http_url: str, model: str = MODEL) -> str:
    return http_url.replace("http://", "openai://", 1) + f"?model={model}"


def stats(http_url: str) -> dict[str, Any]:
    data: dict[str, Any] = httpx.get(f"{http_url}/arena/stats", timeout=10).json()
    return data


LISTING_PRICE = package(
    "real_estate",
    "What is the price of listing L-101?",
    "450000",
    [PRICE],
    {"get_listing_price": LISTINGS},
    [("What is the price of L-101?", "450000", "get_listing_price(listing_id='L-101')")],
)
"""A package the rules agent solves: one lookup whose tool its words name."""


def catalog_with_held_out(settings: ArenaSettings, pack: DomainPack) -> list[VerifiedSample]:
    """Three held-out qa packages, one train package, and two held-out interactive instances."""
    store = EnvPackageStore(settings.catalog)
    pkgs = packages()
    store.record(pkgs["stock"], "heldout")
    store.record(pkgs["agent_name"], "heldout")
    store.record(LISTING_PRICE, "heldout")
    store.record(pkgs["price"], "train")
    store.dispose()
    catalog = EigenCatalog(settings.catalog)
    samples = []
    for seed in (3, 5):
        built = build_instance(pack, seed)
        sample = interactive_sample(pack, built)
        catalog.record_instance(
            built["instance_id"], sample.domain, "heldout", sample.sample_id, sample.model_dump_json()
        )
        samples.append(sample)
    catalog.dispose()
    return samples


def check_consistent(group: GroupReport, k: int) -> None:
    """pass^k <= ... <= pass^1 <= pass@k, all in [0, 1]."""
    values = [group.pass_hat[j].mean for j in range(1, k + 1)]
    assert all(0.0 <= v <= 1.0 for v in [*values, group.pass_at_k.mean])
    assert values == sorted(values, reverse=True) and values[0] <= group.pass_at_k.mean
    for metric in [*group.pass_hat.values(), group.pass_at_k]:
        assert 0.0 <= metric.ci_low <= metric.mean <= metric.ci_high <= 1.0


# --------------------------------------------------------------------------- URLs


def test_endpoint_urls_are_told_from_folders_and_checked() -> None:
    assert is_endpoint("openai://127.0.0.1:8000/v1?model=m") and is_endpoint("openais://host/v1?model=m")
    assert not is_endpoint("/models/qwen") and not is_endpoint("runs/x/weights")
    check_endpoint_url("openai://127.0.0.1:8000/v1?model=m")
    for bad, why in (
        ("openai://127.0.0.1:8000/v1", "?model=NAME"),
        ("openai://user:pw@host/v1?model=m", "ARENA_LLM_API_KEY"),
        ("openai://host:99999/v1?model=m", "bad port"),
        ("/models/qwen", "not an endpoint URL"),
    ):
        with pytest.raises(EndpointError, match="--model") as caught:
            check_endpoint_url(bad)
        assert why in str(caught.value) and "openai://host:port/v1?model=NAME" in str(caught.value)


def test_the_endpoint_gateway_never_caches(tmp_path: Path) -> None:
    settings = ArenaSettings(home=tmp_path / "home")
    gateway = endpoint_gateway(settings, "openai://127.0.0.1:1/v1?model=m")
    try:
        assert gateway.cache is None and gateway.backend.model == "m"
    finally:
        asyncio.run(gateway.aclose())


# --------------------------------------------------------------------------- end to end


def test_run_eval_through_an_openai_endpoint(tmp_path: Path, served: str, pack: DomainPack) -> None:
    settings = ArenaSettings(
        home=tmp_path / "home",
        catalog_url=f"sqlite:///{tmp_path}/catalog.db",
        sandbox={"pool_size": 2, "timeout_s": 10.0},
    )
    interactive = catalog_with_held_out(settings, pack)
    before = stats(served)["by_role"].get("agent_policy", 0)

    report = run_eval(
        settings, openai_url(served), k=2, trials=3, max_turns=8, seed=1, concurrency=4, progress=False
    )

    assert report.model == openai_url(served) and (report.k, report.trials) == (2, 3)
    assert [g.name for g in report.domains] == ["customer_service", "ecommerce", "real_estate"]
    assert report.overall.cases == 5 and report.overall.trials == 15
    by_kind = {kind: [c for c in report.cases if c.kind == kind] for kind in ("qa", "interactive")}
    assert sorted(c.env_ref for c in by_kind["qa"]) == sorted(
        [packages()["stock"].env_id, packages()["agent_name"].env_id, LISTING_PRICE.env_id]
    )
    assert sorted(c.sample_id for c in by_kind["interactive"]) == sorted(s.sample_id for s in interactive)
    for case in report.cases:
        assert case.trials == 3 and case.errors == [] and len(case.turns) == 3
        assert all(1 <= t <= 8 for t in case.turns)
        assert case.pass_hat == {j: pass_hat_k(3, case.successes, j) for j in (1, 2)}
        assert case.pass_at_k == pass_at_k(3, case.successes, 2)
    for case in by_kind["interactive"]:  # success is the verification function's verdict
        assert case.f1 == [] and case.successes == sum(1 for r in case.rewards if r >= 1.0)
    # The package the rules agent solves: one native call, the tool's output, the answer stated.
    (solved,) = (c for c in report.cases if c.env_ref == LISTING_PRICE.env_id)
    assert (solved.successes, solved.pass_hat, solved.pass_at_k) == (3, {1: 1.0, 2: 1.0}, 1.0)
    assert solved.turns == [2, 2, 2] and solved.tool_calls == [1, 1, 1]
    assert solved.f1 == pytest.approx([1.0] * 3, abs=1e-6)
    assert report.overall.mean_tool_calls > 0
    for group in [*report.domains, report.overall]:
        check_consistent(group, 2)
    assert EvalReport.model_validate_json(report.model_dump_json()) == report

    seen = stats(served)
    # Every agent turn went to the endpoint as a native agent_policy request with its tools (a
    # request without them carries no Arena input the rules server could answer: it would be a 400).
    turns = sum(sum(c.turns) for c in report.cases)
    assert seen["by_role"]["agent_policy"] - before == turns
    assert seen["errors"] == 0 and seen["max_in_flight"] <= 4  # --concurrency bounds the trials in flight


def test_the_endpoint_can_play_the_user_too(tmp_path: Path, served: str, pack: DomainPack) -> None:
    # --user policy: the evaluated endpoint answers the user_simulator role of interactive cases.
    settings = ArenaSettings(
        home=tmp_path / "home",
        catalog_url=f"sqlite:///{tmp_path}/catalog.db",
        sandbox={"pool_size": 2, "timeout_s": 10.0},
    )
    catalog_with_held_out(settings, pack)
    before = stats(served)["by_role"].get("user_simulator", 0)
    report = run_eval(
        settings, openai_url(served), k=1, trials=2, max_turns=8, limit=1, progress=False, user="policy"
    )
    (interactive,) = (c for c in report.cases if c.kind == "interactive")
    assert interactive.trials == 2 and interactive.errors == [] and all(t > 1 for t in interactive.turns)
    assert stats(served)["by_role"]["user_simulator"] > before


def test_a_turn_without_a_usable_reply_fails_its_trial(tmp_path: Path, served: str, pack: DomainPack) -> None:
    # One attempt per call and a one-token reply budget: every reply comes back cut (finish_reason
    # length), so the agent's first turn raises InvalidOutput and each trial fails as data.
    settings = ArenaSettings(
        home=tmp_path / "home",
        catalog_url=f"sqlite:///{tmp_path}/catalog.db",
        sandbox={"pool_size": 2, "timeout_s": 10.0},
        llm_max_attempts=1,
        llm_roles={"agent_policy": {"max_tokens": 1}},
    )
    catalog_with_held_out(settings, pack)
    report = run_eval(settings, openai_url(served), k=2, trials=2, limit=1, seed=1, progress=False)
    assert [c.kind for c in report.cases] == ["qa", "interactive"]
    for case in report.cases:
        assert (case.trials, case.successes, case.pass_at_k, case.turns) == (2, 0, 0.0, [])
        assert len(case.errors) == 2
        assert all(e.startswith("TurnFailed: turn 1: role 'agent_policy'") for e in case.errors)
        assert all("cut off" in e for e in case.errors)
    assert report.overall.pass_at_k.mean == 0.0


def test_a_model_the_server_does_not_serve_is_named_before_anything_runs(tmp_path: Path, served: str) -> None:
    settings = ArenaSettings(home=tmp_path / "home", catalog_url=f"sqlite:///{tmp_path}/catalog.db")
    store = EnvPackageStore(settings.catalog)
    store.record(LISTING_PRICE, "heldout")
    store.dispose()
    before = stats(served)["requests"]
    with pytest.raises(EndpointError, match=f"--model .*does not serve.*{MODEL}") as caught:
        run_eval(settings, openai_url(served, model="no-such-model"), k=1, progress=False)
    assert "fix" in str(caught.value)
    assert stats(served)["requests"] == before  # probed with GET /models, no chat request sent


def test_eval_cli_on_an_endpoint_and_its_mistakes(tmp_path: Path, served: str) -> None:
    home = tmp_path / "home"
    settings = ArenaSettings(home=home)
    store = EnvPackageStore(settings.catalog)
    store.record(LISTING_PRICE, "heldout")
    store.record(packages()["stock"], "heldout")
    store.dispose()
    env = arena_env(home, ARENA_SANDBOX__POOL_SIZE="2")

    args = ["eval", "--model", openai_url(served), "--k", "1", "--trials", "2", "--limit", "1"]
    proc = run_arena([*args, "--concurrency", "2", "--max-turns", "4", "--json"], env, timeout=180)
    report = EvalReport.model_validate_json(proc.stdout)
    assert report.model == openai_url(served) and report.trials == 2 and report.k == 1
    (case,) = report.cases  # --limit 1: the first held-out package by env_id
    assert case.errors == [] and case.trials == 2 and 0.0 <= case.pass_at_k <= 1.0

    bad = run_arena(["eval", "--model", "openai://127.0.0.1:8000/v1"], env, check=2, timeout=120)
    assert "Traceback" not in bad.stderr and "--model" in bad.stderr and "?model=NAME" in bad.stderr

    port = free_port()  # nothing listens there
    down = run_arena(["eval", "--model", f"openai://127.0.0.1:{port}/v1?model=m"], env, check=2, timeout=120)
    assert "Traceback" not in down.stderr
    assert "--model" in down.stderr and "does not serve" in down.stderr and "fix" in down.stderr

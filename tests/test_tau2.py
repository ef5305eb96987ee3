"""tau2-bench domains in Arena: import, gold replay against tau2's own evaluator, and `--bench tau2`.

Needs ``.venv-tau2`` (``scripts/install_tau2.sh``; ``scripts/test.sh`` builds it, so CI runs these)
and the sandbox (root). The domains' own tool code runs in sandbox sessions; tau2's evaluator runs
in the same sessions on the same trajectories. ``arena domain replay tau2 D`` replays every task;
here a sample per domain keeps the file fast.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from arena.config import SandboxSettings
from environments.tau2_env import TAU2_VENV, Tau2Unavailable, tau2_pool, tau2_site_dirs
from lake.store import LocalStore

try:
    tau2_site_dirs()
except Tau2Unavailable as exc:
    pytest.skip(f"{exc} -- scripts/test.sh builds it", allow_module_level=True)
if os.geteuid() != 0:
    pytest.skip("the sandbox needs root (CI runs the tests as root)", allow_module_level=True)

from environments.tau2_import import (
    Tau2Import,
    benchmark_tasks,
    build_import,
    load_databases,
    load_tasks,
    open_session,
    synthesis_tasks,
)
from environments.tau2_tasks import GoldAction, Tau2Task, replay, verification_of
from sandbox import SandboxPool

# Sandbox sessions share 2 cores with the other test workers: several times slower than alone.
pytestmark = pytest.mark.timeout(900)

POOL = SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 60.0})
SAMPLE = {"airline": 1, "retail": 1, "telecom": 3}
"""Tasks per domain with a gold write replayed here: tau2's evaluator reloads the domain's database
from its file twice per trajectory, seconds for airline (every task: `arena domain replay`)."""


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalStore, dict[str, Tau2Import]]]:
    store = LocalStore(tmp_path_factory.mktemp("lake"))

    async def go() -> dict[str, Tau2Import]:
        domains = ("airline", "retail", "telecom")
        async with tau2_pool(POOL, *domains, evaluator=False) as pool:
            return {d: await build_import(store, pool, d) for d in domains}

    yield store, asyncio.run(go())


def test_import_keeps_the_database_in_the_lake_and_records_the_split(
    lake: tuple[LocalStore, dict[str, Tau2Import]],
) -> None:
    store, imports = lake
    airline, telecom = imports["airline"], imports["telecom"]
    assert airline.db.size > 5_000_000  # 7 MB: far over the sandbox's 64 KiB return cap
    db, user_db = load_databases(store, airline)
    assert len(db) == airline.db.size and user_db is None
    assert store.local_path(airline.db.path).name == f"{airline.db.sha256}.json"
    # telecom is dual control: the user's own tools (TelecomUserTools) and user database come along
    assert len(telecom.user_tools) == 30 and telecom.user_db is not None
    assert {"toggle_airplane_mode", "reboot_device"} <= {t["function"]["name"] for t in telecom.user_tools}
    assert "<tech_support_policy>" in telecom.policy
    for imported in imports.values():
        tasks = load_tasks(store, imported)
        train = synthesis_tasks(tasks)
        test_ids = set(imported.splits["test"])
        assert len(train) == len(imported.splits["train"]) and train
        assert not {t.task_id for t in train} & test_ids  # test tasks never reach synthesis
        assert {t.task_id for t in tasks if t.split == "test"} == test_ids
    assert len(benchmark_tasks(load_tasks(store, telecom), telecom)) == 114  # tau2's base split of 2285
    for imported in imports.values():  # the evaluation's default split: tasks synthesis never reads
        tasks = load_tasks(store, imported)
        test = benchmark_tasks(tasks, imported, "test")
        train = benchmark_tasks(tasks, imported, "train")
        assert test and all(t.split == "test" for t in test)
        assert not {t.task_id for t in test} & {t.task_id for t in synthesis_tasks(tasks)}
        assert len(test) + len(train) <= len(benchmark_tasks(tasks, imported))


def test_the_pack_folder_is_a_valid_manifest_naming_the_import(
    lake: tuple[LocalStore, dict[str, Tau2Import]], tmp_path: Path
) -> None:
    from producers.tau2_import import write_pack
    from synthesis.eigen.packs import DomainManifest

    imported = lake[1]["retail"]
    folder = write_pack(imported, tmp_path / "tau2_retail")
    manifest = DomainManifest.model_validate(yaml.safe_load((folder / "domain.yaml").read_text()))
    assert manifest.source == imported.source and manifest.source.startswith("tau2:retail@")
    assert manifest.policy == imported.policy
    assert "cancel_pending_order" in manifest.agent_tools
    assert Tau2Import.model_validate_json((folder / "tau2_import.json").read_text()) == imported


def _with_write(tasks: list[Tau2Task], writes: set[str], n: int = 1) -> list[Tau2Task]:
    return [t for t in tasks if any(a.name in writes for a in t.verification.actions)][:n]


@pytest.mark.parametrize("domain", ["airline", "retail", "telecom"])
def test_gold_replay_scores_one_dropping_a_write_zero_and_tau2_agrees(
    lake: tuple[LocalStore, dict[str, Tau2Import]], domain: str
) -> None:
    store, imports = lake
    imported = imports[domain]
    writes = set(imported.write_tools)
    tasks = _with_write(benchmark_tasks(load_tasks(store, imported), imported), writes, SAMPLE[domain])
    assert len(tasks) == SAMPLE[domain]

    async def go() -> list[tuple[float, float, float, float, bool]]:
        out = []
        async with SandboxPool(POOL) as pool, open_session(store, pool, imported) as session:
            for task in tasks:
                v = task.verification
                gold = await replay(session, task, v.actions, say=v.communicate_info)
                last = max(i for i, a in enumerate(v.actions) if a.name in writes)
                dropped = await replay(
                    session, task, v.actions[:last] + v.actions[last + 1 :], say=v.communicate_info
                )
                changed = not next(c for c in dropped.checks if c.kind == "DB").passed
                out.append((gold.arena, gold.tau2, dropped.arena, dropped.tau2, changed))
        return out

    for task, (gold, gold_tau2, dropped, dropped_tau2, changed) in zip(tasks, asyncio.run(go()), strict=True):
        assert (gold, gold_tau2) == (1.0, 1.0), task.task_id
        assert dropped == dropped_tau2, task.task_id  # the same trajectory, the same verdict
        if changed or domain == "telecom":
            assert dropped == 0.0, task.task_id


def test_arena_reward_needs_the_right_arguments_and_the_communicated_info(
    lake: tuple[LocalStore, dict[str, Tau2Import]],
) -> None:
    store, imports = lake
    imported = imports["retail"]
    tasks = benchmark_tasks(load_tasks(store, imported), imported)
    talk = next(
        t for t in tasks if t.verification.communicate_info and "COMMUNICATE" in t.verification.reward_basis
    )
    writes = set(imported.write_tools)
    act = _with_write(tasks, writes)[0]

    async def go() -> tuple[float, float, float, float]:
        async with SandboxPool(POOL) as pool, open_session(store, pool, imported) as session:
            silent = await replay(session, talk, talk.verification.actions, say=["Done."])
            actions = list(act.verification.actions)
            i = max(j for j, a in enumerate(actions) if a.name in writes)
            wrong = actions[i].model_copy(
                update={"arguments": {**actions[i].arguments, "order_id": "#W0000000"}}
            )
            bad = await replay(
                session, act, [*actions[:i], wrong, *actions[i + 1 :]], say=act.verification.communicate_info
            )
            return silent.arena, silent.tau2, bad.arena, bad.tau2

    silent, silent_tau2, bad, bad_tau2 = asyncio.run(go())
    assert silent == silent_tau2 == 0.0  # the gold writes, but the agent never said what it had to
    assert bad == bad_tau2 == 0.0  # the write on another order


def test_gold_action_matching_follows_compare_args() -> None:
    action = GoldAction(name="f", arguments={"a": 1, "b": 2}, compare_args=["a"])
    assert action.matches("f", {"a": 1, "b": 99})
    assert not action.matches("f", {"a": 2, "b": 2}) and not action.matches("g", {"a": 1})
    every = GoldAction(name="f", arguments={"a": 1, "b": 2})
    assert every.matches("f", {"a": 1, "b": 2}) and not every.matches("f", {"a": 1, "b": 3})
    v = verification_of({"id": "x", "evaluation_criteria": {"actions": [], "nl_assertions": ["be nice"]}})
    assert v.reward_basis == ["DB", "COMMUNICATE"] and not v.needs_judge  # tau2's default basis


def test_do_nothing_agent_passes_exactly_the_tasks_that_ask_for_nothing(
    lake: tuple[LocalStore, dict[str, Tau2Import]],
) -> None:
    from environments.tau2_episode import do_nothing_reward

    store, imports = lake
    imported = imports["airline"]
    tasks = {t.task_id: t for t in benchmark_tasks(load_tasks(store, imported), imported)}
    writes = set(imported.write_tools)
    nothing = tasks["0"]  # a refusal: no gold action, nothing to communicate
    assert not nothing.verification.actions and not nothing.verification.communicate_info
    busy = _with_write(list(tasks.values()), writes)[0]

    async def go() -> tuple[float, float]:
        async with SandboxPool(POOL) as pool, open_session(store, pool, imported) as session:
            return await do_nothing_reward(session, nothing), await do_nothing_reward(session, busy)

    assert asyncio.run(go()) == (1.0, 0.0)


@pytest.mark.parametrize(("domain", "limit"), [("airline", 1), ("retail", 1), ("telecom", 2)])
def test_eval_bench_tau2_runs_end_to_end_against_arena_llm_serve(
    tmp_path: Path, domain: str, limit: int
) -> None:
    from arena.config import ArenaSettings
    from tests.fixtures import free_ports
    from tests.fixtures.llm_serve import llm_server
    from trainer.benchmarks.tau2 import run_tau2

    (port,) = free_ports(1)
    settings = ArenaSettings.model_validate({"home": str(tmp_path), "sandbox": POOL.model_dump()})
    with llm_server(tmp_path, port) as url:
        report = run_tau2(
            settings,
            f"openai{url.removeprefix('http')}?model=rules-v1",
            domain=domain,
            k=1,
            trials=1,
            limit=limit,
            concurrency=2,
            seed=0,
        )
    assert report.bench == "tau2" and [g.group for g in report.groups] == [domain]
    assert (report.split, report.user_simulator) == ("test", "gateway")  # test tasks by default
    assert report.left_out.get("limit", 0) > 0  # the report says what --limit left out
    assert len(report.tasks) == limit and all(len(t.rewards) == 1 for t in report.tasks)
    assert all(r in (0.0, 1.0) for t in report.tasks for r in t.rewards)
    assert not any(t.errors for t in report.tasks), [t.errors for t in report.tasks]


def test_cli_names_unknown_domains_and_missing_installs(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "ARENA_HOME": str(tmp_path)}
    args = [sys.executable, "-m", "app.cli", "domain", "import", "tau2", "banking"]
    result = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "unknown tau2 domain 'banking'" in result.stderr
    assert "Traceback" not in result.stderr
    with pytest.raises(Tau2Unavailable, match=r"install_tau2\.sh"):
        tau2_site_dirs(tmp_path / "no-venv")
    assert TAU2_VENV.name == ".venv-tau2"


SYNTH_LIMIT = {"airline": 2, "retail": 2, "telecom": 4}
"""Train tasks synthesised on per domain here (`arena domain synth tau2 D` takes the whole split)."""
SYNTH_NEW = {"retail": 2}
"""New instances made over the database and synthesised on (`--new`; airline's: the CLI test)."""


def test_eigen_synthesis_verifies_dialogues_from_the_train_split_through_a_served_model(
    lake: tuple[LocalStore, dict[str, Tau2Import]], tmp_path: Path
) -> None:
    """EigenData in every imported domain, over the OpenAI client path against `arena llm serve`
    with real-model reply quirks (<think> decoys, fenced JSON, Hermes tool-call text): the user
    simulator acts with its own tools (telecom), dialogues are validated and verified, and Arena's
    verification agrees with tau2's evaluator on every finished dialogue. In retail, new instances
    drawn from the database are made first (their gold replays score 1.0 with both evaluators) and
    synthesised on too."""
    from arena.config import ArenaSettings
    from lake.catalog import open_gateway
    from producers.tau2_synthesis import NEW_SOURCE, SOURCE, synthesise_domain
    from synthesis.eigen.roles.dialogs import REFERENCE_NOTE
    from tests.fixtures import free_ports
    from tests.fixtures.llm_serve import llm_server

    store, imports = lake
    (port,) = free_ports(1)
    with llm_server(tmp_path / "serve", port, reply_style="real") as url:
        llm = f"openai{url.removeprefix('http')}?model=rules-v1"
        settings = ArenaSettings.model_validate(
            {"home": str(tmp_path), "llm": llm, "sandbox": POOL.model_dump()}
        )

        async def go() -> dict[str, tuple[object, list[object], list[object]]]:
            gateway = open_gateway(settings)
            try:
                async with tau2_pool(POOL, *SYNTH_LIMIT) as pool:  # its sessions share the imports
                    return {
                        d: await synthesise_domain(
                            store, pool, gateway, imports[d], limit=n, new=SYNTH_NEW.get(d, 0), sessions=2
                        )
                        for d, n in SYNTH_LIMIT.items()
                    }
            finally:
                await gateway.aclose()

        results = asyncio.run(go())
    for domain, (report, samples, envs) in results.items():
        train = {t.task_id for t in synthesis_tasks(load_tasks(store, imports[domain]))}
        assert report.verified >= 1, (domain, report.by_stage, [o.reason for o in report.outcomes])
        assert report.agreement == 1.0, domain
        assert {o.task_id for o in report.outcomes if o.split == "train"} <= train  # never a test task
        made = report.instances
        if domain in SYNTH_NEW:
            assert made is not None and made.accepted == report.new_instances == SYNTH_NEW[domain], made
            kept = [o for o in made.outcomes if o.stage == "accepted"]
            assert all(o.arena_reward == o.tau2_reward == 1.0 and o.novelty for o in kept)
            assert all(o.novelty.duplicate_of == "" for o in kept if o.novelty)
            new_ids = {o.task_id for o in kept}
            assert {o.task_id for o in report.outcomes if o.split == "new"} == new_ids
            stored = json.loads(store.get(made.lake_path))  # the lake keeps the new instances, split new
            assert {t["task_id"] for t in stored} == new_ids and {t["split"] for t in stored} == {"new"}
            assert report.new_verified == sum(
                o.stage == "verified" and o.split == "new" for o in report.outcomes
            )
        else:
            assert made is None and report.new_instances == 0
        verified = [o for o in report.outcomes if o.stage == "verified"]
        assert all(o.arena_reward == o.tau2_reward == 1.0 for o in verified)
        # the count says how many of them a do-nothing agent would pass too (refusals)
        assert all(o.do_nothing_reward in (0.0, 1.0) for o in verified)
        assert report.verified_do_nothing == sum(o.do_nothing_reward == 1.0 for o in verified)
        assert len(samples) == 2 * len(verified)
        sources = {o.task_id: SOURCE if o.split == "train" else NEW_SOURCE for o in report.outcomes}
        by_sample = {i: sources[o.task_id] for o in report.outcomes for i in o.sample_ids}
        for sample in samples:  # the reference solution guided the agent; it never reaches training data
            assert sample.source == by_sample[sample.sample_id]
            assert "reference_solution" not in str(sample.messages) and REFERENCE_NOTE not in str(
                sample.messages
            )
        agent = [s for s in samples if s.role_target == "agent"]
        assert all(
            s.messages[0]["role"] == "system" and "<policy>" in s.messages[0]["content"] for s in agent
        )
        # each verified dialogue's task is an RL environment opening with the dialogue's first user message
        assert [e.sample_id for e in envs] == [o.env_sample_id for o in verified]
        assert {e.kind for e in envs} <= {"tau2"} and all(e.prompt[-1]["role"] == "user" for e in envs)
        if domain == "telecom":  # dual control: the user ran its own tools in a verified dialogue
            assert any(
                "I did" in str(m.get("content")) for s in agent for m in s.messages if m["role"] == "user"
            )


def test_cli_synth_publishes_verified_dialogues_to_samples_sft(tmp_path: Path, broker: str) -> None:
    """`arena domain synth tau2 airline --new 2`: the import, new instances over the database,
    synthesis and both sides of each verified dialogue on the broker's samples.sft, keyed by sample
    id; telecom has no --new, and says why."""

    from tests.cli import arena_env, read_all, run_arena
    from tests.fixtures import free_ports
    from tests.fixtures.llm_serve import llm_server

    (port,) = free_ports(1)
    with llm_server(tmp_path / "serve", port) as url:
        env = arena_env(
            tmp_path / "home",
            ARENA_BROKER=broker,
            ARENA_LLM=f"openai{url.removeprefix('http')}?model=rules-v1",
            ARENA_SANDBOX__POOL_SIZE="2",
        )
        out = run_arena(
            ["domain", "synth", "tau2", "airline", "--limit", "1", "--new", "2", "--json"], env, timeout=600
        )
        refused = run_arena(["domain", "synth", "tau2", "telecom", "--new", "2"], env, check=None)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert "--new" in refused.stderr and "fix:" in refused.stderr
    report = json.loads(out.stdout)
    assert report["new_requested"] == 2 and report["instances"]["accepted"] == report["new_instances"] == 2
    assert report["new_verified"] >= 1, [o["reason"] for o in report["outcomes"]]
    ids = {i for o in report["outcomes"] for i in o["sample_ids"]}
    assert report["verified"] >= 1 and len(ids) == 2 * report["verified"], report["by_stage"]
    published = {r.key.decode(): json.loads(r.value) for r in read_all(broker, "samples.sft")}
    assert ids <= set(published)
    assert {published[i]["role_target"] for i in ids} == {"agent", "user"}
    envs = {r.key.decode(): json.loads(r.value) for r in read_all(broker, "samples.verified")}
    ours = {o["env_sample_id"] for o in report["outcomes"] if o["stage"] == "verified"}
    assert ours <= set(envs)  # the session's broker is shared: other tests publish there too
    assert {envs[i]["kind"] for i in ours} == {"tau2"}

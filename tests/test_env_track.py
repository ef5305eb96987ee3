"""The environment track end to end on the real stack, from the session's `arena demo` run.

The demo publishes one unconditional QA seed per built-in knowledge base;
the checks read the committed topics, the lake and the catalog, and re-run
packages through `arena env verify` (real sandbox, real subprocesses).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arena.config import ArenaSettings
from arena.records.envs import STRUCTURES, EnvPackage, VerifiedSample
from lake.env_packages import EnvPackageStore, split_of
from tests.cli import lake_json, run_arena
from tests.fixtures.demo import Demo, values

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]

ENV_TOPICS = ("qa.traces", "qa.validated", "envs.code", "envs.verified", "samples.verified")


@pytest.fixture(scope="module")
def packages(demo_run: Demo) -> list[EnvPackage]:
    found = [EnvPackage.model_validate(v) for v in values(demo_run.bootstrap, "envs.verified")]
    assert found, "the demo verified no environment package"
    return found


def one_per_structure(packages: list[EnvPackage]) -> list[EnvPackage]:
    chosen: dict[str, EnvPackage] = {}
    for pkg in packages:
        chosen.setdefault(pkg.structure, pkg)
    return list(chosen.values())


def test_demo_reports_env_stages_and_quality_drops(demo_run: Demo) -> None:
    for name in ENV_TOPICS:
        assert name in demo_run.stdout, f"{name} missing from the demo summary"
    rejected = lake_json("select gate, details from qa_traces_rejected", demo_run.env)
    # The QA gates catch the flawed drafts: the leaf rule and the quality score both drop some.
    assert {"non_tool_inner_node", "quality_below_threshold"} <= {r["gate"] for r in rejected}, rejected


def test_verified_packages_cover_all_four_structures(packages: list[EnvPackage], demo_run: Demo) -> None:
    assert {p.structure for p in packages} == set(STRUCTURES)
    assert {p.domain for p in packages} >= {"real_estate", "e_commerce", "healthcare"}
    lake_ids = {r["env_id"] for r in lake_json("select env_id from envs_verified", demo_run.env)}
    assert lake_ids == {p.env_id for p in packages}  # one lake row per package


def test_validated_traces_carry_their_quality_scores(demo_run: Demo) -> None:
    threshold = ArenaSettings().envs.qs_threshold
    for trace in values(demo_run.bootstrap, "qa.validated"):
        scores = trace["scores"]
        assert set(scores) == {"DC", "SA", "SR", "TC", "QS"}
        assert scores["QS"] == pytest.approx((scores["DC"] + scores["SA"] + scores["SR"] + scores["TC"]) / 4)
        assert scores["QS"] >= threshold


def test_env_verify_passes_every_job(packages: list[EnvPackage], demo_run: Demo) -> None:
    for pkg in one_per_structure(packages):
        out = run_arena(["env", "verify", pkg.env_id], demo_run.env, timeout=120).stdout
        assert f"{len(pkg.jobs)}/{len(pkg.jobs)} jobs passed" in out, out


def test_merging_shrinks_homogeneous_tools_and_keeps_answers(
    packages: list[EnvPackage], demo_run: Demo
) -> None:
    merged = [p for p in packages if p.merged_groups]
    assert merged, "no package had homogeneous sub-questions to merge"
    for pkg in merged:
        assert len(pkg.tools) < pkg.tools_before_merge
        assert len(pkg.jobs) > len(pkg.tools)  # several sub-questions answered by one tool
    out = run_arena(["env", "verify", merged[0].env_id], demo_run.env, timeout=120).stdout
    assert f"{len(merged[0].jobs)}/{len(merged[0].jobs)} jobs passed" in out, out


def test_mutating_a_package_table_fails_verification(
    packages: list[EnvPackage], demo_run: Demo, tmp_path: Path
) -> None:
    pkg = packages[0]
    shown = run_arena(["env", "show", pkg.env_id, "--json"], demo_run.env).stdout
    data = json.loads(shown)
    job = data["jobs"][0]
    rows = data["data"][job["tool"]]
    hits = [(row, col) for row in rows for col, cell in row.items() if str(cell) == job["answer"]]
    assert hits, "the answer is not in the tool's data table"
    for n, (row, col) in enumerate(hits):
        row[col] = f"changed-{n}"  # a value that does not contain the answer
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(data))
    out = run_arena(["env", "verify", "--file", str(path)], demo_run.env, check=1, timeout=120).stdout
    assert "FAIL" in out
    path.write_text(shown)  # the untouched package still passes from a file
    run_arena(["env", "verify", "--file", str(path)], demo_run.env, timeout=120)


def test_heldout_packages_never_reach_samples(packages: list[EnvPackage], demo_run: Demo) -> None:
    k = 3  # ARENA_ENVS__HELDOUT_K of the demo run
    store = EnvPackageStore(f"sqlite:///{demo_run.home / 'catalog.db'}")
    try:
        rows = store.rows()
    finally:
        store.dispose()
    assert {r.env_id for r in rows} == {p.env_id for p in packages}
    for row in rows:
        assert row.split == split_of(row.env_id, k)
    heldout = {r.env_id for r in rows if r.split == "heldout"}
    train = {r.env_id for r in rows if r.split == "train"}
    assert heldout and train
    samples = [VerifiedSample.model_validate(v) for v in values(demo_run.bootstrap, "samples.verified")]
    samples = [s for s in samples if s.kind == "qa"]  # interactive ones: tests/test_eigen_stages.py
    assert {s.env_ref for s in samples} == train
    by_id = {p.env_id: p for p in packages}
    for sample in samples:
        assert sample.kind == "qa"
        pkg = by_id[sample.env_ref]
        assert sample.tools == pkg.tools
        assert [j["answer"] for j in sample.reward_spec["jobs"]] == [j.answer for j in pkg.jobs]
        assert sample.prompt[-1] == {"role": "user", "content": pkg.question}

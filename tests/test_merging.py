"""Sub-environment merging (ASTRA §2.2.4) on the rules backend, re-verified in the real sandbox.

Packages come from real synthesis of the hand-written traces in
``tests.test_env_synthesis``. Homogeneous lookups (three listing prices) end up
sharing one tool and every answer stays correct; a sloppy grouping (different
intents grouped together) is caught by re-running every job, and the member
keeps its own tool with the reason; a tampered cell still fails the merged
package.
"""

from __future__ import annotations

import ast
import json
import random
from typing import Any

from pydantic import BaseModel

from arena.llm.gateway import Gateway
from arena.records.envs import EnvPackage, QaTrace
from sandbox import SandboxPool
from sandbox.env_runtime import verify_package
from simulator import RULES
from simulator.backend import RulesBackend
from synthesis.envs.env_synthesis import package_id, synthesize_package
from synthesis.envs.merging import MergeResult, clean_groups, dedupe_rows, drop_function, merge_package
from synthesis.envs.roles.envs import HomogeneousGroups, HomogeneousInput
from tests.test_env_synthesis import MULTI_HOP, PARALLEL, SETTINGS, run


def functions(code: str) -> set[str]:
    return {n.name for n in ast.parse(code).body if isinstance(n, ast.FunctionDef)}


async def synthesize_and_merge(
    pool: SandboxPool, qa: QaTrace, rules: dict[str, Any] | None = None
) -> tuple[EnvPackage, MergeResult]:
    gw = Gateway(RulesBackend(seed=0, rules=rules), max_attempts=2)
    res = await synthesize_package(qa, gw, pool, SETTINGS)
    assert res.package is not None, res.reason
    return res.package, await merge_package(res.package, gw, pool)


def test_homogeneous_lookups_share_one_tool_and_stay_correct() -> None:
    async def go(pool: SandboxPool) -> None:
        v1, merged = await synthesize_and_merge(pool, PARALLEL)
        v2 = merged.package
        assert len(v1.tools) == 3 and v1.tools_before_merge == 3
        assert len(v2.tools) == 1 and v2.tools_before_merge == 3
        assert v2.version == 2 and v2.merged_groups == [[1, 2, 4]] and merged.kept == {}
        assert v2.env_id == package_id(v2) != v1.env_id
        (tool,) = {j.tool for j in v2.jobs}
        assert functions(v2.code) == {tool} and set(v2.data) == {tool}
        assert len(v2.data[tool]) == 5  # same table three times: the rows are deduplicated
        assert {j.invocation for j in v2.jobs} == {
            f"{tool}(listing_id='L-101')",
            f"{tool}(listing_id='L-104')",
            f"{tool}(listing_id='L-105')",
        }
        assert "merge_invocation" in v2.lineage and "tool_spec" in v2.lineage
        assert all(o.passed for o in await verify_package(v2, pool))

        # The merged tool still reads its data: change L-105's price and only job 4 fails.
        data = json.loads(json.dumps(v2.data))
        for row in data[tool]:
            if row["listing_id"] == "L-105":
                row["price"] = 1
        outcomes = await verify_package(v2.model_copy(update={"data": data}), pool)
        assert {o.index: o.passed for o in outcomes} == {1: True, 2: True, 4: False}

    run(go)


def test_nothing_homogeneous_leaves_the_tools_alone() -> None:
    async def go(pool: SandboxPool) -> None:
        v1, merged = await synthesize_and_merge(pool, MULTI_HOP)
        v2 = merged.package
        assert v2.version == 2 and v2.merged_groups == [] and v2.tools == v1.tools and v2.code == v1.code
        assert v2.env_id != v1.env_id
        assert all(o.passed for o in await verify_package(v2, pool))

    run(go)


def everything_alike(inputs: BaseModel, rng: random.Random) -> BaseModel:
    """A sloppy grouping model: every sub-question in one group, whatever it asks."""
    assert isinstance(inputs, HomogeneousInput)
    return HomogeneousGroups(groups=[[v.index for v in inputs.sub_questions]], reason="all lookups")


def test_an_insertion_that_breaks_a_job_is_undone() -> None:
    rules = {**RULES, "homogeneous_groups": everything_alike}

    async def go(pool: SandboxPool) -> None:
        v1, merged = await synthesize_and_merge(pool, MULTI_HOP, rules)
        v2 = merged.package
        # Whatever the base, the other two look up other tables by other keys: both keep their tools.
        assert v2.merged_groups == [] and len(merged.kept) == 2
        assert all("breaks job" in why for why in merged.kept.values())
        assert v2.tools == v1.tools and v2.data == v1.data and v2.jobs == v1.jobs
        assert all(o.passed for o in await verify_package(v2, pool))

    run(go)


def test_merge_helpers() -> None:
    code = "import re\n\n@staticmethod\ndef a(x):\n    return x\n\n\ndef b(y):\n    return y\n"
    assert drop_function(code, "a") == "import re\n\n\n\ndef b(y):\n    return y\n"
    assert functions(drop_function(code, "b")) == {"a"}
    assert dedupe_rows([{"k": 1, "v": "x"}, {"v": "x", "k": 1}, {"k": 2, "v": "x"}]) == [
        {"k": 1, "v": "x"},
        {"k": 2, "v": "x"},
    ]
    assert clean_groups([[1, 2, 9], [2, 3], [4, 4, 5]], {1, 2, 3, 4, 5}) == [[1, 2], [4, 5]]

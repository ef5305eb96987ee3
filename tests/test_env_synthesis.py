"""Environment synthesis (ASTRA §2.2.3) on the rules backend, verified in the real sandbox.

QA traces are written by hand over a small real-estate knowledge base (the
shape the QA stage emits). The rules are exercised directly (what they
generate, and what they refuse), the execution contract on its own, and the
whole synthesis end to end: packages whose every job passes, a tampered data
cell that fails verification, a wrong first invocation that is retried, and an
implementation that writes the answer as a literal, which never verifies.
"""

from __future__ import annotations

import ast
import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from arena.config import EnvSettings, SandboxSettings
from arena.llm.core import Undecidable
from arena.llm.gateway import Gateway
from arena.llm.roles.envs import (
    HomogeneousInput,
    ToolImplementation,
    ToolImplementationInput,
    ToolInvocationInput,
    ToolScalingInput,
    ToolSpec,
    ToolSpecInput,
)
from arena.records.envs import EnvPackage, Grounding, KbTable, KnowledgeBase, QaTrace, SubQA
from sandbox import SandboxPool
from sandbox.env_runtime import call_program, contains_answer, job_program, verify_package
from sandbox.pool import SandboxResult
from simulator import RULES
from simulator.backend import RulesBackend
from simulator.envs import (
    EXTRA_PARAMS,
    homogeneous_groups,
    tool_implementation,
    tool_invocation,
    tool_scaling,
    tool_spec,
)
from streams.envs.synthesis import SynthesisResult, package_id, synthesize_package

T = TypeVar("T")

LISTINGS = KbTable(
    name="listings",
    entity="listing",
    key="listing_id",
    columns=["listing_id", "address", "price", "agent_id"],
    rows=[
        {"listing_id": "L-101", "address": "12 Elm St", "price": 450000, "agent_id": "A-01"},
        {"listing_id": "L-102", "address": "3 Oak Ave", "price": 389000, "agent_id": "A-03"},
        {"listing_id": "L-103", "address": "77 Pine Rd", "price": 512500, "agent_id": "A-02"},
        {"listing_id": "L-104", "address": "5 Birch Ln", "price": 615000, "agent_id": "A-01"},
        {"listing_id": "L-105", "address": "40 Cedar Ct", "price": 298000, "agent_id": "A-02"},
    ],
    links={"agent_id": "agents"},
)
AGENTS = KbTable(
    name="agents",
    entity="agent",
    key="agent_id",
    columns=["agent_id", "name", "agency_id"],
    rows=[
        {"agent_id": "A-01", "name": "Maria Lopez", "agency_id": "G-1"},
        {"agent_id": "A-02", "name": "Tom Becker", "agency_id": "G-2"},
        {"agent_id": "A-03", "name": "Ines Duval", "agency_id": "G-2"},
    ],
    links={"agency_id": "agencies"},
)
AGENCIES = KbTable(
    name="agencies",
    entity="agency",
    key="agency_id",
    columns=["agency_id", "name", "city"],
    rows=[
        {"agency_id": "G-1", "name": "Harbor Homes", "city": "Lyon"},
        {"agency_id": "G-2", "name": "Alpine Estates", "city": "Zürich"},
    ],
)


def lookup(
    index: int,
    question: str,
    answer: str,
    table: str,
    key_column: str,
    key: str,
    column: str,
    deps: list[int] | None = None,
) -> SubQA:
    return SubQA(
        index=index,
        question=question,
        answer=answer,
        depends_on=deps or [],
        grounding=Grounding(table=table, key_column=key_column, key=key, column=column),
    )


def trace(
    qa_id: str, structure: Any, question: str, answer: str, sub_qas: list[SubQA], tables: list[KbTable]
) -> QaTrace:
    return QaTrace(
        qa_id=qa_id,
        seed_id="seed-test",
        domain="real_estate",
        structure=structure,
        question=question,
        answer=answer,
        sub_qas=sub_qas,
        knowledge=KnowledgeBase(domain="real_estate", tables=tables),
        scores={"DC": 1.0, "SA": 1.0, "SR": 1.0, "TC": 1.0, "QS": 1.0},
    )


MULTI_HOP = trace(
    "qa-multi",
    "multi_hop",
    "In which city is the agency of the agent who lists L-102?",
    "Zürich",
    [
        lookup(1, "Which agent lists listing L-102?", "A-03", "listings", "listing_id", "L-102", "agent_id"),
        lookup(
            2, "Which agency does agent A-03 work for?", "G-2", "agents", "agent_id", "A-03", "agency_id", [1]
        ),
        lookup(3, "In which city is agency G-2?", "Zürich", "agencies", "agency_id", "G-2", "city", [2]),
    ],
    [LISTINGS, AGENTS, AGENCIES],
)

PARALLEL = trace(
    "qa-parallel",
    "parallel_single_hop",
    "Which of the listings L-101, L-104 and L-105 is the most expensive?",
    "L-104",
    [
        lookup(
            1, "What is the price of listing L-101?", "450000", "listings", "listing_id", "L-101", "price"
        ),
        lookup(
            2, "What is the price of listing L-104?", "615000", "listings", "listing_id", "L-104", "price"
        ),
        SubQA(
            index=3,
            question="Which listing is the most expensive given those prices?",
            answer="L-104",
            depends_on=[1, 2, 4],
            needs_tool=False,
            operation="compare",
        ),
        lookup(
            4, "What is the price of listing L-105?", "298000", "listings", "listing_id", "L-105", "price"
        ),
    ],
    [LISTINGS],
)

SETTINGS = EnvSettings.model_validate({"synthesis_attempts": 3, "extra_params": 2})


def run(coro_fn: Callable[[SandboxPool], Awaitable[T]]) -> T:
    """Run ``coro_fn(pool)`` with a fresh warm sandbox pool."""

    async def main() -> T:
        async with SandboxPool(SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 5.0})) as pool:
            return await coro_fn(pool)

    return asyncio.run(main())


def synthesize(
    qa: QaTrace, seed: int = 0, rules: dict[str, Any] | None = None
) -> Callable[[SandboxPool], Awaitable[SynthesisResult]]:
    async def go(pool: SandboxPool) -> SynthesisResult:
        gw = Gateway(RulesBackend(seed=seed, rules=rules), max_attempts=2)
        return await synthesize_package(qa, gw, pool, SETTINGS)

    return go


def spec_input(qa: SubQA, table: KbTable) -> ToolSpecInput:
    return ToolSpecInput(
        domain="real_estate",
        question=qa.question,
        answer=qa.answer,
        grounding=qa.grounding,
        entity=table.entity,
        columns=table.columns,
        sample_rows=table.rows[:3],
    )


# --- rules ------------------------------------------------------------------------------------


def test_rules_write_a_lookup_tool_that_reads_the_table() -> None:
    qa = PARALLEL.sub_qas[0]
    spec = tool_spec(spec_input(qa, LISTINGS), random.Random(0))
    assert isinstance(spec, ToolSpec)
    assert spec.name == "get_listing_price"
    assert spec.required == ["listing_id"]
    scaled = tool_scaling(ToolScalingInput(spec=spec, extra_params=2), random.Random(1))
    assert isinstance(scaled, ToolSpec)
    assert scaled.name == spec.name and scaled.required == spec.required
    added = set(scaled.properties) - set(spec.properties)
    assert len(added) == 2 and added <= set(EXTRA_PARAMS)
    assert all("default" in scaled.properties[p] for p in added)
    assert set(spec.properties["response_format"]["enum"]) < set(scaled.properties["response_format"]["enum"])

    inv = tool_invocation(
        ToolInvocationInput(question=qa.question, spec=scaled, grounding=qa.grounding, attempt=2),
        random.Random(0),
    )
    assert inv.model_dump() == {"invocation": "get_listing_price(listing_id='L-101')"}
    impl = tool_implementation(
        ToolImplementationInput(
            question=qa.question,
            answer=qa.answer,
            spec=scaled,
            invocation="get_listing_price(listing_id='L-101')",
            data_key=scaled.name,
            grounding=qa.grounding,
            columns=LISTINGS.columns,
            rows=LISTINGS.rows,
            attempt=1,
        ),
        random.Random(0),
    )
    assert isinstance(impl, ToolImplementation)
    literals = {n.value for n in ast.walk(ast.parse(impl.code)) if isinstance(n, ast.Constant)}
    assert 450000 not in literals and "450000" not in literals  # never the answer as a literal
    assert "DATA['get_listing_price']" in impl.code
    # The generated function really runs (here, in-process, on the real rows) and honours its extras.
    scope: dict[str, Any] = {"DATA": {"get_listing_price": LISTINGS.rows}}
    exec(impl.code, scope)
    assert scope["get_listing_price"](listing_id="l-101") == {"price": 450000}
    assert scope["get_listing_price"]("L-101", response_format="text") == "price: 450000"
    assert "error" in scope["get_listing_price"]("L-999")


def test_first_invocation_is_sometimes_wrong_later_ones_never() -> None:
    qa = PARALLEL.sub_qas[0]
    spec = tool_spec(spec_input(qa, LISTINGS), random.Random(0))
    assert isinstance(spec, ToolSpec)
    right = "get_listing_price(listing_id='L-101')"
    first = {
        tool_invocation(
            ToolInvocationInput(question=qa.question, spec=spec, grounding=qa.grounding, attempt=1),
            random.Random(s),
        ).invocation
        for s in range(200)
    }
    assert right in first
    assert first - {right} == {"get_listing_price(id='L-101')", "get_listing_price(listing_id='L-101.')"}
    later = {
        tool_invocation(
            ToolInvocationInput(question=qa.question, spec=spec, grounding=qa.grounding, attempt=2),
            random.Random(s),
        ).invocation
        for s in range(50)
    }
    assert later == {right}


def test_rules_refuse_ungrounded_sub_questions() -> None:
    qa = SubQA(index=1, question="Summarise the market mood.", answer="calm")
    with pytest.raises(Undecidable, match="grounding"):
        tool_spec(
            ToolSpecInput(domain="real_estate", question=qa.question, answer=qa.answer), random.Random(0)
        )


def test_homogeneous_rule_groups_same_lookup_different_keys() -> None:
    views = [
        {
            "index": q.index,
            "question": q.question,
            "answer": q.answer,
            "grounding": q.grounding,
            "tool": {"name": "t"},
        }
        for q in [*PARALLEL.sub_qas, *MULTI_HOP.sub_qas]
        if q.needs_tool
    ]
    for i, v in enumerate(views):
        v["index"] = i + 1
    out = homogeneous_groups(HomogeneousInput.model_validate({"sub_questions": views}), random.Random(0))
    assert out.model_dump()["groups"] == [[1, 2, 3]]  # the three prices; agent / agency / city stand alone


# --- execution contract -----------------------------------------------------------------------


def result(ok: bool, stdout: str = "", value: Any = None) -> SandboxResult:
    return SandboxResult(
        ok=ok,
        stdout=stdout,
        stderr="",
        return_value=value,
        error_type=None if ok else "exception",
        error=None if ok else "ValueError: boom",
        wall_s=0.01,
        cpu_s=0.01,
        truncated=False,
    )


def test_contains_answer_normalises_and_needs_an_ok_run() -> None:
    assert contains_answer(result(True, value={"city": "Zürich"}), "zürich")
    assert contains_answer(result(True, stdout="Alpine   Estates\n"), "alpine estates")
    assert contains_answer(result(True, value=450000.0), "450000")
    assert not contains_answer(result(True, value={"city": "Lyon"}), "Zürich")
    assert not contains_answer(result(False, stdout="Zürich"), "Zürich")
    assert not contains_answer(result(True, value="anything"), "  ")


# --- end to end -------------------------------------------------------------------------------


def test_multi_hop_package_verifies_and_a_tampered_cell_fails() -> None:
    async def go(pool: SandboxPool) -> None:
        res = await synthesize(MULTI_HOP)(pool)
        pkg = res.package
        assert pkg is not None, res.reason
        assert pkg.version == 1 and pkg.tools_before_merge == 3 == len(pkg.tools)
        assert pkg.env_id == package_id(pkg) and pkg.env_id.startswith("env-")
        assert [j.tool for j in pkg.jobs] == [
            "get_listing_agent_id",
            "get_agent_agency_id",
            "get_agency_city",
        ]
        assert set(pkg.data) == {j.tool for j in pkg.jobs}
        assert pkg.data["get_agency_city"] == AGENCIES.rows
        assert pkg.lineage["backend"] == "rules" and "tool_implementation" in pkg.lineage
        assert all(o.passed for o in await verify_package(pkg, pool))

        # The package round-trips through JSON (it travels on a topic) and still verifies.
        again = EnvPackage.model_validate_json(pkg.model_dump_json())
        assert all(o.passed for o in await verify_package(again, pool))

        # Mutate the answer cell of job 3 (Zürich): exactly that job fails.
        data = json.loads(json.dumps(pkg.data))
        for row in data["get_agency_city"]:
            if row["agency_id"] == "G-2":
                row["city"] = "Geneva"
        outcomes = await verify_package(pkg.model_copy(update={"data": data}), pool)
        assert [o.passed for o in outcomes] == [True, True, False]
        assert "does not contain the answer 'Zürich'" in (outcomes[2].error or "")
        assert "Geneva" in outcomes[2].output

        # The trainer's path: one agent tool call with JSON arguments.
        called = await pool.run(call_program(pkg, "get_agency_city", {"agency_id": "g-2"}))
        assert called.ok and called.return_value == {"city": "Zürich"}
        inert = await pool.run(
            call_program(pkg, "get_agency_city", {"agency_id": "x') or __import__('os').getpid() #"})
        )
        assert inert.ok and "error" in inert.return_value
        with pytest.raises(ValueError, match="no tool"):
            call_program(pkg, "open", {})
        assert job_program(pkg, pkg.jobs[0]).endswith("\nget_listing_agent_id(listing_id='L-102')\n")

    run(go)


def test_no_tool_leaves_are_skipped_and_duplicate_names_suffixed() -> None:
    async def go(pool: SandboxPool) -> None:
        res = await synthesize(PARALLEL)(pool)
        pkg = res.package
        assert pkg is not None, res.reason
        assert [j.index for j in pkg.jobs] == [1, 2, 4]  # the compare leaf has no environment
        assert [j.tool for j in pkg.jobs] == [
            "get_listing_price",
            "get_listing_price_2",
            "get_listing_price_3",
        ]
        defined = {n.name for n in ast.parse(pkg.code).body if isinstance(n, ast.FunctionDef)}
        assert defined == {"get_listing_price", "get_listing_price_2", "get_listing_price_3"}
        assert set(res.attempts) == {1, 2, 4}
        assert all(o.passed for o in await verify_package(pkg, pool))

    run(go)


def test_wrong_first_invocation_is_retried_from_the_invocation() -> None:
    single = trace(
        "qa-single",
        "single_hop",
        "In which city is agency G-1?",
        "Lyon",
        [lookup(1, "In which city is agency G-1?", "Lyon", "agencies", "agency_id", "G-1", "city")],
        [AGENCIES],
    )

    async def go(pool: SandboxPool) -> tuple[int, SynthesisResult]:
        for seed in range(60):  # the rules slip on ~20% of first attempts: find one such seed
            res = await synthesize(single, seed=seed)(pool)
            if res.attempts.get(1, 0) > 1:
                return seed, res
        raise AssertionError("no seed made a wrong first invocation")

    _, res = run(go)
    assert res.package is not None, res.reason
    assert res.attempts == {1: 2}
    assert res.package.jobs[0].invocation == "get_agency_city(agency_id='G-1')"


def literal_implementation(inputs: BaseModel, rng: random.Random) -> BaseModel:
    """A model's classic cheat: return the answer it was shown, ignoring DATA."""
    assert isinstance(inputs, ToolImplementationInput)
    params = ", ".join(inputs.spec.required)
    return ToolImplementation(
        code=f"def {inputs.spec.name}({params}, **kwargs):\n    return {{'value': {inputs.answer!r}}}\n"
    )


def test_an_implementation_that_hardcodes_the_answer_never_verifies() -> None:
    rules = {**RULES, "tool_implementation": literal_implementation}
    res = run(synthesize(PARALLEL, rules=rules))
    assert res.package is None
    assert res.failed_index == 1 and res.attempts[1] == SETTINGS.synthesis_attempts
    assert "still contains '450000'" in res.reason and "never write it" in res.reason


def test_a_trace_without_tool_steps_gives_no_package() -> None:
    leaf_only = trace(
        "qa-none",
        "single_hop",
        "Is 3 more than 2?",
        "yes",
        [SubQA(index=1, question="Is 3 > 2?", answer="yes", needs_tool=False)],
        [],
    )
    res = run(synthesize(leaf_only))
    assert res.package is None and "no tool-needing" in res.reason

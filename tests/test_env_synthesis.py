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
from arena.records.envs import (
    EnvJob,
    EnvPackage,
    Grounding,
    KbTable,
    KnowledgeBase,
    QaTrace,
    SubQA,
    tool_family,
)
from sandbox import SandboxPool
from sandbox.env_runtime import (
    EnvSession,
    JobOutcome,
    call_program,
    contains_answer,
    job_program,
    run_job,
    verify_package,
)
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
from synthesis.envs.env_synthesis import SynthesisResult, package_id, synthesize_package, unique_names
from synthesis.envs.roles.envs import (
    HomogeneousInput,
    ToolImplementation,
    ToolImplementationInput,
    ToolInvocationInput,
    ToolScalingInput,
    ToolSpec,
    ToolSpecInput,
)

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


def test_unique_names_suffix_repeats_within_64_chars_and_keep_the_family() -> None:
    obj = {"type": "object", "properties": {}}
    long = "get_" + "very_long_" * 6  # 64 characters, the most a tool name may have
    specs = [ToolSpec(name=n, description="d", parameters=obj) for n in ("get_rate", "get_rate", long, long)]
    names = [s.name for s in unique_names(specs)]
    assert names[:2] == ["get_rate", "get_rate_2"]
    assert names[3] != names[2] and len(names[3]) <= 64
    assert tool_family(names[3]) == tool_family(names[2])  # a held-out family takes both (lake.package_split)


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


# --- verification through sessions -----------------------------------------------------------


class CountingSession:
    """A real session that records its requests (kind, commit) and whether it was closed."""

    def __init__(self, session: EnvSession) -> None:
        self.session = session
        self.requests: list[tuple[str, bool]] = []
        self.closed = False

    @property
    def alive(self) -> bool:
        return self.session.alive

    async def run(self, source: str, **kwargs: Any) -> SandboxResult:
        self.requests.append(("load" if "bind" in kwargs else "run", kwargs.get("commit", True)))
        return await self.session.run(source, **kwargs)

    async def call(self, tool: str, arguments: dict[str, Any], **kwargs: Any) -> SandboxResult:
        self.requests.append(("call", kwargs.get("commit", True)))
        return await self.session.call(tool, arguments, **kwargs)

    async def read(self, name: str, *, space: str = "main") -> SandboxResult:
        return await self.session.read(name, space=space)

    async def close(self) -> None:
        self.closed = True
        await self.session.close()


class CountingPool:
    """A real ``SandboxPool`` that counts one-off runs and keeps every session it opened."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self.runs = 0
        self.sessions: list[CountingSession] = []

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> SandboxResult:
        self.runs += 1
        return await self.pool.run(code, timeout_s=timeout_s, memory_mb=memory_mb)

    async def open_session(
        self, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> CountingSession:
        session = CountingSession(await self.pool.open_session(timeout_s=timeout_s, memory_mb=memory_mb))
        self.sessions.append(session)
        return session


STOCK_CODE = """\
LOG = []
print("stock loaded")


def take(item_id):
    rows = DATA["stock"]
    for n, row in enumerate(rows):
        if row["id"] == item_id:
            LOG.append(item_id)
            return rows.pop(n)
    return {"error": "no such item"}


def left():
    return {"rows": len(DATA["stock"]), "taken": len(LOG), "columns": list(DATA["stock"][0])}


def fail():
    return 1 / 0


def spin():
    while True:
        pass
"""


def stock_package(code: str, invocations: list[tuple[str, str]]) -> EnvPackage:
    """A hand-made package over a three-row table (keys out of order, as JSON may bring them)."""
    rows: list[dict[str, str | int | float]] = [
        {"name": "apple", "id": "a", "qty": 3},
        {"name": "pear", "id": "p", "qty": 0},
        {"name": "plum", "id": "u", "qty": 7.5},
    ]
    return EnvPackage(
        env_id="env-stock",
        qa_id="qa-stock",
        seed_id="seed-stock",
        domain="e_commerce",
        structure="single_hop",
        question="What is in stock?",
        answer="apple",
        sub_qas=[],
        tools=[{"type": "function", "function": {"name": n, "parameters": {}}} for n in ("take", "left")],
        code=code,
        data={"stock": rows},
        jobs=[
            EnvJob(index=n, question=f"q{n}", answer=answer, tool="take", invocation=invocation)
            for n, (invocation, answer) in enumerate(invocations, start=1)
        ],
    )


STOCK_JOBS = [
    ("take('a')", "apple"),
    ("take('a')", "apple"),  # passes only if the first take left DATA as it was
    ("left()", '"rows": 3, "taken": 0'),
    ("fail()", "anything"),
    ("take('x')", "no such item"),  # an error payload never passes, even one stating the answer
    ("LOG.append(1) or left()", '"taken": 1'),
    ("left()", '"columns": ["id", "name", "qty"]'),  # DATA's keys sorted, as in the job program
    ("x = take('a')", "apple"),  # not an expression: fails without running
    ("left()", "stock loaded"),  # what the code printed while loading is part of the output
]


def comparable(outcomes: list[JobOutcome]) -> list[dict[str, Any]]:
    return [o.model_dump(exclude={"wall_s"}) for o in outcomes]


def test_verify_package_loads_once_per_package_in_one_session() -> None:
    async def go(pool: SandboxPool) -> None:
        counting = CountingPool(pool)
        package = stock_package(STOCK_CODE, STOCK_JOBS)
        outcomes = await verify_package(package, counting)
        assert counting.runs == 0 and len(counting.sessions) == 1
        (session,) = counting.sessions
        # The load is committed; every job with a valid invocation runs after it, uncommitted.
        assert session.requests == [("load", True)] + [("run", False)] * (len(STOCK_JOBS) - 1)
        assert session.closed and not session.session.alive
        assert [o.passed for o in outcomes] == [True, True, True, False, False, True, True, False, True]
        assert "ZeroDivisionError" in (outcomes[3].error or "")
        assert "error payload" in (outcomes[4].error or "")
        assert "not one Python expression" in (outcomes[7].error or "")

        second = await verify_package(package.model_copy(update={"env_id": "env-stock-2"}), counting)
        assert len(counting.sessions) == 2 and comparable(second) == comparable(outcomes)

    run(go)


def test_session_outcomes_equal_those_of_one_program_per_job() -> None:
    async def go(pool: SandboxPool) -> None:
        packages = [
            stock_package(STOCK_CODE, STOCK_JOBS),
            stock_package("import nope\n" + STOCK_CODE, STOCK_JOBS),  # the code does not load
            stock_package("print('half')\ndef take(:\n", STOCK_JOBS[:3]),  # SyntaxError, line 4 in both
        ]
        for package in packages:
            old = [await run_job(package, job, pool) for job in package.jobs]
            assert comparable(await verify_package(package, pool)) == comparable(old)
        assert "line 4" in (old[0].error or "")

        # A real synthesised package, as built and with a changed answer cell.
        res = await synthesize(MULTI_HOP)(pool)
        assert res.package is not None, res.reason
        data = json.loads(json.dumps(res.package.data))
        for row in data["get_agency_city"]:
            row["city"] = "Geneva"
        for package in (res.package, res.package.model_copy(update={"data": data})):
            old = [await run_job(package, job, pool) for job in package.jobs]
            assert comparable(await verify_package(package, pool)) == comparable(old)

    run(go)


def test_a_job_that_ends_its_session_does_not_fail_the_next() -> None:
    async def go() -> None:
        settings = SandboxSettings.model_validate({"pool_size": 1, "timeout_s": 1.0})
        async with SandboxPool(settings) as pool:
            counting = CountingPool(pool)
            package = stock_package(STOCK_CODE, [("spin()", "x"), ("take('a')", "apple"), ("spin()", "x")])
            outcomes = await verify_package(package, counting)
            assert [o.passed for o in outcomes] == [False, True, False]
            assert (outcomes[0].error or "").startswith("timeout: wall-clock timeout")
            # The timeout ended the first session; the package was loaded again in a fresh one.
            assert len(counting.sessions) == 2 and all(s.closed for s in counting.sessions)
            old = [await run_job(package, job, pool) for job in package.jobs]
            assert comparable(outcomes) == comparable(old)

            # Code that never finishes loading fails every job with its timeout, in one session.
            endless = stock_package(STOCK_CODE + "spin()\n", [("left()", "3"), ("take('a')", "apple")])
            outcomes = await verify_package(endless, counting)
            assert len(counting.sessions) == 3 and not any(o.passed for o in outcomes)
            old = [await run_job(endless, job, pool) for job in endless.jobs]
            assert comparable(outcomes) == comparable(old)

    asyncio.run(go())


def test_synthesis_checks_a_candidate_and_its_tampered_data_in_one_session() -> None:
    async def go(pool: SandboxPool) -> SynthesisResult:
        counting = CountingPool(pool)
        res = await synthesize_package(
            PARALLEL, Gateway(RulesBackend(seed=0), max_attempts=2), counting, SETTINGS
        )
        assert counting.runs == 0 and all(s.closed for s in counting.sessions)
        *checks, verified = [s.requests for s in counting.sessions]
        assert checks and all(r == [("run", False), ("run", False)] for r in checks)  # job, then tampered
        assert verified == [("load", True)] + [("run", False)] * 3  # the assembled package, loaded once
        return res

    assert run(go).package is not None

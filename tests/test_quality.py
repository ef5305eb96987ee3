"""QA quality validation (ASTRA §2.2.2): formulas, the leaf rule, the rules judges, ``validate``.

The instances are written by hand over a tiny knowledge base, and every score
is computed by hand in the test (eq. 14-21). Then every flaw kind the rules
synthesiser makes is shown to be caught by the judge meant for it, and clean
drafts to pass every judge.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from pydantic import ValidationError

from arena.config import EnvSettings
from arena.llm.gateway import Gateway
from arena.records.envs import STRUCTURES, Grounding, KbTable, KnowledgeBase, QaTrace, SubQA
from producers.builtin_knowledge import BUILTIN_DOMAINS, builtin_knowledge
from simulator.backend import RulesBackend
from simulator.qa import FLAW_KINDS, caught, judge_view, synthesize_instance
from simulator.qa_judges import atomicity, completeness, dependency, sequence, tool_needs
from synthesis.envs.quality import (
    GATE_LEAF,
    GATE_QUALITY,
    GATE_UNGROUNDED,
    Verdict,
    dc,
    leaf_rule_violations,
    qs,
    sa,
    sr,
    tc,
    validate,
)
from synthesis.envs.roles.qa import QaDraft, QaJudgeInput, QaSynthesisInput, StepVerdict, ToolNeedInput

KB = KnowledgeBase(
    domain="real_estate",
    tables=[
        KbTable(
            name="listings",
            entity="listing",
            key="listing_id",
            columns=["listing_id", "price", "agent_id"],
            rows=[
                {"listing_id": "L-1", "price": 300000, "agent_id": "AGT-1"},
                {"listing_id": "L-2", "price": 450000, "agent_id": "AGT-2"},
                {"listing_id": "L-3", "price": 380000, "agent_id": "AGT-1"},
            ],
            links={"agent_id": "agents"},
        ),
        KbTable(
            name="agents",
            entity="agent",
            key="agent_id",
            columns=["agent_id", "name", "agency_id"],
            rows=[
                {"agent_id": "AGT-1", "name": "Ava Quist", "agency_id": "AG-1"},
                {"agent_id": "AGT-2", "name": "Liam Szabo", "agency_id": "AG-2"},
            ],
            links={"agency_id": "agencies"},
        ),
        KbTable(
            name="agencies",
            entity="agency",
            key="agency_id",
            columns=["agency_id", "name", "city"],
            rows=[
                {"agency_id": "AG-1", "name": "Maple Realty", "city": "Austin"},
                {"agency_id": "AG-2", "name": "Cedar Homes", "city": "Denver"},
            ],
        ),
    ],
)


def lookup(
    index: int, table: str, key: str, column: str, answer: str, deps: list[int] | None = None
) -> SubQA:
    entity = {"listings": "listing", "agents": "agent", "agencies": "agency"}[table]
    key_column = {"listings": "listing_id", "agents": "agent_id", "agencies": "agency_id"}[table]
    return SubQA(
        index=index,
        question=f"What is the {column.replace('_', ' ')} of the {entity} {key}?",
        answer=answer,
        depends_on=deps or [],
        grounding=Grounding(table=table, key_column=key_column, key=key, column=column),
    )


def compare_trace(**changes: object) -> QaTrace:
    """Which of L-1, L-2, L-3 has the higher price? Three homogeneous lookups and a compare leaf."""
    subs = [
        lookup(1, "listings", "L-1", "price", "300000"),
        lookup(2, "listings", "L-2", "price", "450000"),
        lookup(3, "listings", "L-3", "price", "380000"),
        SubQA(
            index=4,
            question="Which listing has the higher price: L-1 (300000), L-2 (450000) or L-3 (380000)?",
            answer="L-2",
            depends_on=[1, 2, 3],
            needs_tool=False,
            operation="compare",
        ),
    ]
    trace = QaTrace(
        qa_id="qa-test",
        seed_id="seed-test",
        domain="real_estate",
        structure="parallel_single_hop",
        question="Which listing has the higher price: L-1, L-2 or L-3?",
        answer="L-2",
        sub_qas=subs,
        knowledge=KB,
    )
    return trace.model_copy(update=changes)


def chain_trace(subs: list[SubQA] | None = None, answer: str = "Austin") -> QaTrace:
    """The city of the agency of the agent of listing L-1: a 3-hop chain."""
    return QaTrace(
        qa_id="qa-chain",
        seed_id="seed-test",
        domain="real_estate",
        structure="multi_hop",
        question="What is the city of the agency of the agent of the listing L-1?",
        answer=answer,
        sub_qas=subs
        or [
            lookup(1, "listings", "L-1", "agent_id", "AGT-1"),
            lookup(2, "agents", "AGT-1", "agency_id", "AG-1", [1]),
            lookup(3, "agencies", "AG-1", "city", "Austin", [2]),
        ],
        knowledge=KB,
    )


def with_sub(trace: QaTrace, index: int, **changes: object) -> QaTrace:
    subs = [s.model_copy(update=changes) if s.index == index else s for s in trace.sub_qas]
    return trace.model_copy(update={"sub_qas": subs})


def run_validate(trace: QaTrace, threshold: float = 0.75) -> Verdict:
    async def go() -> Verdict:
        gw = Gateway(RulesBackend(seed=0), max_attempts=1)
        try:
            return await validate(trace, gw, EnvSettings.model_validate({"qs_threshold": threshold}))
        finally:
            await gw.aclose()

    return asyncio.run(go())


# --------------------------------------------------------------------------- formulas


def test_formulas_hand_computed() -> None:
    # 4 sub-questions, one with a bad dependency set: DC = 3/4.
    assert dc([1, 1, 0, 1]) == 0.75
    assert sa([1, 0, 0, 1, 1]) == pytest.approx(0.6)
    assert sr([True, False]) == 0.5
    assert tc(1) == 1.0 and tc(False) == 0.0
    assert qs(0.75, 1.0, 0.5, 1.0) == pytest.approx(0.8125)  # (0.75 + 1 + 0.5 + 1) / 4
    assert qs(1.0, 1.0, 1.0, 0.0) == 0.75
    # No sub-questions: every average is 0.
    assert dc([]) == sa([]) == sr([]) == 0.0


def test_formulas_refuse_non_binary_indicators() -> None:
    with pytest.raises(ValueError, match="binary"):
        dc([1, 0.5])
    with pytest.raises(ValueError, match="binary"):
        tc(0.3)
    with pytest.raises(ValueError, match="DC"):
        qs(1.2, 1, 1, 1)


def test_judge_outputs_must_be_binary() -> None:
    with pytest.raises(ValidationError):
        StepVerdict(index=1, score=0.5, reason="half")


def test_leaf_rule() -> None:
    clean = compare_trace().sub_qas
    assert leaf_rule_violations(clean) == []  # the compare step is a leaf
    inner = [
        lookup(1, "listings", "L-1", "agent_id", "AGT-1"),
        SubQA(
            index=2,
            question="Restate the value AGT-1 in plain form.",
            answer="AGT-1",
            depends_on=[1],
            needs_tool=False,
            operation="format",
        ),
        lookup(3, "agents", "AGT-1", "agency_id", "AG-1", [2]),
    ]
    assert leaf_rule_violations(inner) == [2]


# --------------------------------------------------------------------------- the rules judges, by hand


def test_clean_instances_score_one_everywhere() -> None:
    for trace in (compare_trace(), chain_trace()):
        verdict = run_validate(trace)
        assert verdict.keep and verdict.gate is None
        assert verdict.scores == {"DC": 1.0, "SA": 1.0, "SR": 1.0, "TC": 1.0, "QS": 1.0}
        assert verdict.trace.scores == verdict.scores
        assert [a.role for a in verdict.answers] == [
            "qa_tool_need",
            "qa_dependency",
            "qa_atomicity",
            "qa_sequence",
            "qa_completeness",
        ]


def test_one_bad_dependency_costs_a_quarter_of_dc() -> None:
    verdict = run_validate(with_sub(compare_trace(), 3, depends_on=[1]))  # q3 uses nothing of q1
    assert verdict.scores == {"DC": 0.75, "SA": 1.0, "SR": 1.0, "TC": 1.0, "QS": pytest.approx(0.9375)}
    assert verdict.keep
    assert "3: " in verdict.failures["DC"][0]


def test_missing_dependency_of_the_leaf() -> None:
    # The leaf quotes a3 but d4 = [1, 2]: DC_4 = 0; q3 then feeds nothing listed: SR_3 = 0.
    verdict = run_validate(with_sub(compare_trace(), 4, depends_on=[1, 2]))
    assert verdict.scores["DC"] == 0.75 and verdict.scores["SR"] == 0.75
    assert verdict.scores["QS"] == pytest.approx((0.75 + 1 + 0.75 + 1) / 4)


def test_non_atomic_sub_question() -> None:
    bundled = "What is the price and the agent id of the listing L-2?"
    verdict = run_validate(with_sub(compare_trace(), 2, question=bundled))
    assert verdict.scores["SA"] == 0.75 and verdict.scores["QS"] == pytest.approx(0.9375)
    # Entity names holding 'and the' are not conjunctions: known values are masked first.
    kb = KB.model_copy(deep=True)
    kb.tables[2].rows[0]["agency_id"] = "Smith and the Sons"
    trace = chain_trace([lookup(1, "agencies", "Smith and the Sons", "city", "Austin")]).model_copy(
        update={"question": "What is the city of the agency Smith and the Sons?", "knowledge": kb}
    )
    assert [v.score for v in atomicity(judge_view_of(trace)).verdicts] == [1.0]


def judge_view_of(trace: QaTrace) -> QaJudgeInput:
    draft = QaDraft(
        question=trace.question, answer=trace.answer, structure=trace.structure, sub_qas=trace.sub_qas
    )
    return judge_view(draft, trace.knowledge)


def test_superfluous_step() -> None:
    t = compare_trace()
    pad = lookup(4, "listings", "L-1", "agent_id", "AGT-1")
    leaf = t.sub_qas[3].model_copy(update={"index": 5})
    verdict = run_validate(t.model_copy(update={"sub_qas": [*t.sub_qas[:3], pad, leaf]}))
    assert verdict.scores["SR"] == pytest.approx(0.8)  # 4 of 5 steps feed a0
    assert verdict.scores["QS"] == pytest.approx((1 + 1 + 0.8 + 1) / 4)
    assert "4: " in verdict.failures["SR"][0] and "superfluous" in verdict.failures["SR"][0]


def test_misordered_steps() -> None:
    swapped = [
        lookup(1, "agents", "AGT-1", "agency_id", "AG-1", [2]),
        lookup(2, "listings", "L-1", "agent_id", "AGT-1"),
        lookup(3, "agencies", "AG-1", "city", "Austin", [1]),
    ]
    verdict = run_validate(chain_trace(swapped))
    assert verdict.scores == {
        "DC": 1.0,
        "SA": 1.0,
        "SR": pytest.approx(2 / 3),
        "TC": 1.0,
        "QS": pytest.approx(11 / 12),
    }


def test_unsupported_main_answer_sits_on_the_threshold() -> None:
    wrong = compare_trace(answer="L-3")  # a0 is not what the compare gives
    assert run_validate(wrong).scores == {"DC": 1.0, "SA": 1.0, "SR": 1.0, "TC": 0.0, "QS": 0.75}
    assert run_validate(wrong).keep  # QS >= 0.75
    stricter = run_validate(wrong, threshold=0.8)
    assert not stricter.keep and stricter.gate == GATE_QUALITY and "TC" in stricter.reason


def test_misquoted_aggregation_is_dropped() -> None:
    misquoted = "Which listing has the higher price: L-1 (300000), L-2 (450000) or L-3 (520000)?"
    trace = with_sub(compare_trace(answer="L-3"), 4, question=misquoted, answer="L-3")
    verdict = run_validate(trace)
    # DC_4 = 0 (a3 listed, not quoted), TC = 0 (520000 is no sub-answer): (0.75 + 1 + 1 + 0) / 4.
    assert verdict.scores["QS"] == pytest.approx(0.6875)
    assert not verdict.keep and verdict.gate == GATE_QUALITY


def test_wrong_aggregation_result_fails_tc() -> None:
    trace = with_sub(compare_trace(answer="L-3"), 4, answer="L-3")
    result = completeness(judge_view_of(trace))
    assert result.score == 0 and "L-2" in result.reason


def test_inner_no_tool_step_is_dropped_by_the_leaf_rule() -> None:
    subs = [
        lookup(1, "listings", "L-1", "agent_id", "AGT-1"),
        SubQA(index=2, question="Restate the value AGT-1 in plain form.", answer="AGT-1", depends_on=[1]),
        lookup(3, "agents", "AGT-1", "agency_id", "AG-1", [2]),
        lookup(4, "agencies", "AG-1", "city", "Austin", [3]),
    ]
    # Step 2 claims needs_tool (the default) and has no grounding: the classifier overrules the claim.
    verdict = run_validate(chain_trace(subs))
    assert not verdict.keep and verdict.gate == GATE_LEAF and verdict.scores == {}
    assert "2 (format)" in verdict.reason
    assert verdict.trace.sub_qas[1].needs_tool is False


def test_tool_step_without_grounding_is_dropped() -> None:
    trace = with_sub(chain_trace(), 2, grounding=None)
    verdict = run_validate(trace)
    assert not verdict.keep and verdict.gate == GATE_UNGROUNDED


def test_tool_need_classification() -> None:
    trace = compare_trace()
    needs = tool_needs(ToolNeedInput(question=trace.question, sub_qas=trace.sub_qas, knowledge=KB))
    assert [(n.needs_tool, n.operation) for n in needs.items] == [
        (True, None),
        (True, None),
        (True, None),
        (False, "compare"),
    ]


# --------------------------------------------------------------------------- synthesised flaws are caught


@pytest.mark.parametrize("domain", BUILTIN_DOMAINS)
def test_every_flaw_kind_is_caught_and_clean_drafts_pass(domain: str) -> None:
    kb = builtin_knowledge(domain, 3)
    made = {kind: 0 for kind in FLAW_KINDS}
    for n in range(16):
        for hops in (2, 3):
            inputs = QaSynthesisInput(
                knowledge=kb, mode="unconditional", hop_budget=hops, structure=STRUCTURES[n % 4], instance=n
            )
            clean, kind = synthesize_instance(inputs, random.Random(n))
            assert kind is None
            view = judge_view(clean, kb)
            assert all(v.score == 1 for j in (dependency, atomicity, sequence) for v in j(view).verdicts), (
                clean
            )
            assert completeness(view).score == 1, completeness(view).reason
            for flaw in FLAW_KINDS:
                draft, got = synthesize_instance(inputs, random.Random(n), flaw=flaw)
                if got is None:
                    assert draft == clean  # not applicable to this instance: left clean
                    continue
                made[flaw] += 1
                assert got == flaw and draft != clean
                assert caught(flaw, draft, kb), (flaw, draft)
    assert all(made.values()), made

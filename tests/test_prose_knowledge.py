"""Prose knowledge: fuzzy matching, chunking, retrieval, fact extraction, and prose -> verified envs.

The unit cases are computed by hand. The integration test runs the real environment-track stage
functions (QA synthesis -> quality -> environment synthesis in the real sandbox -> merging) on the
bundled prose sample with the rules backend, offline.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from arena.config import EnvSettings, SandboxSettings
from arena.llm.core import InvalidOutput
from arena.llm.gateway import Gateway
from arena.records.envs import Grounding, KnowledgeBase, SubQA
from producers.builtin_knowledge import PROSE_DOMAINS, builtin_knowledge
from producers.knowledge import KnowledgeError, load_knowledge, unconditional_seed
from sandbox import SandboxPool
from sandbox.env_runtime import verify_package
from simulator.backend import RulesBackend
from simulator.facts import extract_facts, sentence_facts
from streams.envs.samples_verified import sample_of
from synthesis.envs.env_synthesis import synthesize_package
from synthesis.envs.fuzzy import contains_value, numbers_match, parse_number, same_value, tokens
from synthesis.envs.merging import merge_package
from synthesis.envs.passages import (
    Bm25,
    chunk_id,
    chunk_passages,
    chunk_text,
    prune_knowledge,
    split_sentences,
)
from synthesis.envs.qa_synthesis import grounding_problems, resolve_passages, synthesize
from synthesis.envs.quality import validate

# --- fuzzy matching ------------------------------------------------------------------------------


def test_numbers_parse_with_separators_units_and_scales() -> None:
    assert parse_number("1,860,000") == 1_860_000
    assert parse_number("330 metres") == 330
    assert parse_number("$4.5 million") == 4_500_000
    assert parse_number(" 2.5 % ") == 2.5
    assert parse_number(450000) == 450000
    assert parse_number("L-1003") is None  # an id, not a quantity
    assert parse_number("12 Elm Street") is None  # an address
    assert parse_number(True) is None and parse_number(math.inf) is None


def test_numbers_match_within_half_a_percent_but_small_integers_exactly() -> None:
    assert numbers_match(1_860_000, 1_865_000)  # 0.27 % apart
    assert not numbers_match(1_860_000, 1_880_000)  # 1.06 % apart
    assert not numbers_match(1867, 1868)  # years: 0.05 % apart, still different answers
    assert numbers_match(330.0, 330)
    assert not numbers_match(4.5, 4.55)  # 1.1 %


def test_same_value_by_token_set_overlap() -> None:
    assert same_value("Zürich", "zurich")  # accents, case
    assert same_value("St. Stephen's Cathedral", "st stephen s cathedral")  # punctuation
    assert same_value("450,000", "450000.0")
    # Jaccard 4/5 = 0.8 reaches the threshold; 2/3 does not.
    assert same_value("the palace of culture science", "palace of culture and science the")
    assert not same_value("Alpine Estates", "Alpine Estates Ltd")
    assert not same_value("", "")


def test_contains_value_needs_most_tokens_or_a_matching_number() -> None:
    text = '{"passages": [{"text": "The population of Warsaw is 1,860,000."}]}'
    assert contains_value(text, "1860000")
    assert contains_value(text, "1.86 million")
    assert not contains_value(text, "1,900,000")
    assert contains_value("Marie Curie was born in Warsaw.", "warsaw")
    assert not contains_value("Maria Lopez", "Maria Smith")  # 1 of 2 tokens = 0.5
    assert contains_value("Wolfgang Mozart Salzburg 1756", "Wolfgang Amadeus Mozart Salzburg 1756")  # 4 of 5
    assert tokens("Zürich, 1,860,000 m.") == ["zurich", "1860000", "m"]


# --- chunking and retrieval ----------------------------------------------------------------------


def test_sentences_split_after_stops_but_not_abbreviations() -> None:
    text = "Dr. Smith visited St. Stephen's Cathedral. It is 136 metres tall! Is it old? Yes."
    assert split_sentences(text) == [
        "Dr. Smith visited St. Stephen's Cathedral.",
        "It is 136 metres tall!",
        "Is it old?",
        "Yes.",
    ]


def test_chunks_are_paragraphs_or_sentence_windows_and_idempotent() -> None:
    long = " ".join(f"Sentence number {n} is here." for n in range(10))  # 10 x 27 chars + spaces
    chunks = chunk_text(f"Short   paragraph.\n\n{long}", max_chars=60)
    assert chunks[0] == "Short paragraph."
    assert chunks[1] == "Sentence number 0 is here. Sentence number 1 is here."  # 54 chars; a third = 82
    assert all(len(c) <= 60 for c in chunks) and len(chunks) == 6
    assert [x for c in chunks for x in chunk_text(c, max_chars=60)] == chunks  # re-chunking: the same
    ids = [c.id for c in chunk_passages([f"Short paragraph.\n\n{long}", "Short paragraph."], 60)]
    assert ids[0] == chunk_id("Short paragraph.") and len(ids) == 6  # the repeat is kept once


def test_bm25_ranks_by_rare_matching_terms_deterministically() -> None:
    texts = [
        "Marie Curie was born in Warsaw in 1867.",
        "Warsaw is the capital of Poland.",
        "Paris is the capital of France.",
        "Unrelated text about rivers.",
    ]
    index = Bm25(texts)
    assert index.top("Marie Curie birthplace", 3) == [0]
    assert index.top("capital of Poland", 2) == [1, 2]  # 'poland' is rare; 'capital' is shared
    assert index.ranking("zzz") == [0, 1, 2, 3]  # nothing matches: knowledge-base order
    # idf of 'warsaw' (df 2 of 4) = ln(1 + 2.5/2.5) = ln 2
    assert index.idf["warsaw"] == pytest.approx(math.log(2))


# --- facts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sentence", "facts"),
    [
        ("The Eiffel Tower is 330 metres tall.", [("Eiffel Tower", "height", "330 metres")]),
        (
            "Marie Curie was born in Warsaw in 1867.",
            [("Marie Curie", "birthplace", "Warsaw"), ("Marie Curie", "birth year", "1867")],
        ),
        (
            "The Statue of Liberty is located in New York City.",
            [("Statue of Liberty", "location", "New York City")],
        ),
        ("The population of Warsaw is 1,860,000.", [("Warsaw", "population", "1,860,000")]),
        ("Paris has a population of about 2,100,000.", [("Paris", "population", "2,100,000")]),
        ("Warsaw is the capital of Poland.", [("Warsaw", "country", "Poland")]),
        ("The Mona Lisa was painted by Leonardo da Vinci.", [("Mona Lisa", "painter", "Leonardo da Vinci")]),
        ("The Ulm Minster was completed in 1890.", [("Ulm Minster", "completion year", "1890")]),
        ("It is 330 metres tall.", []),  # a pronoun is not an entity
        ("The city, which is old, is in a valley.", []),
    ],
)
def test_sentence_facts(sentence: str, facts: list[tuple[str, str, str]]) -> None:
    assert [(f.subject, f.attribute, f.value) for f in sentence_facts(sentence, "c-x")] == facts


def test_facts_chain_across_chunks() -> None:
    chunks = chunk_passages(["Marie Curie was born in Warsaw in 1867.", "Warsaw is the capital of Poland."])
    facts = extract_facts(chunks)
    born = next(f for f in facts if f.attribute == "birthplace")
    capital = next(f for f in facts if f.subject == born.value)
    assert (capital.attribute, capital.value, capital.chunk) == ("country", "Poland", chunks[1].id)


# --- groundings ----------------------------------------------------------------------------------

KB = KnowledgeBase(
    domain="demo",
    passages=["Marie Curie was born in Warsaw in 1867.", "Warsaw is the capital of Poland. It is big."],
)


def passage_qa(answer: str, passage: str, key: str = "Warsaw") -> SubQA:
    g = Grounding(key=key, column="country", passage=passage, quote="Warsaw is the capital of Poland.")
    return SubQA(index=1, question=f"What is the country of {key}?", answer=answer, grounding=g)


def test_passage_groundings_are_checked_and_resolved_fuzzily() -> None:
    from synthesis.envs.roles.qa import QaDraft

    chunk = chunk_passages(KB.passages)[1]
    good = QaDraft(
        question="q", answer="poland", structure="single_hop", sub_qas=[passage_qa("poland", chunk.id)]
    )
    assert grounding_problems(good, KB) == []
    wrong = good.model_copy(update={"sub_qas": [passage_qa("France", chunk.id)]})
    assert "does not state the answer" in grounding_problems(wrong, KB)[0]
    unknown = good.model_copy(update={"sub_qas": [passage_qa("Poland", "1")]})  # a model's passage number
    resolved = resolve_passages(unknown, KB)
    assert resolved.sub_qas[0].grounding is not None and resolved.sub_qas[0].grounding.passage == chunk.id
    pruned = prune_knowledge(KB, resolved.sub_qas)
    assert pruned.passages == [chunk.text] and pruned.tables == []


def test_table_groundings_stay_compact_and_compatible() -> None:
    stored = {"table": "cities", "key_column": "city", "key": "Austin", "column": "state"}
    g = Grounding.model_validate(stored)
    assert g.model_dump(mode="json") == stored and not g.is_passage  # same JSON, same content hashes
    with pytest.raises(ValueError, match="table grounding"):
        Grounding(key="x", column="y")


# --- ingestion -----------------------------------------------------------------------------------


def test_prose_files_load_as_passages_and_unreadable_ones_fail_clearly(tmp_path: Path) -> None:
    kb = builtin_knowledge(PROSE_DOMAINS[0])
    assert kb.tables == [] and len(kb.passages) >= 15
    text = tmp_path / "notes.txt"
    text.write_text("Warsaw is the capital of Poland.\n\nParis is the capital of France.\n", encoding="utf-8")
    assert load_knowledge(text)[0].passages == [
        "Warsaw is the capital of Poland.",
        "Paris is the capital of France.",
    ]
    binary = tmp_path / "scan.md"
    binary.write_bytes(b"PK\x00\x03binary")
    with pytest.raises(KnowledgeError, match="binary"):
        load_knowledge(binary)
    latin = tmp_path / "old.txt"
    latin.write_bytes("Caf\xe9 Zürich".encode("latin-1"))
    with pytest.raises(KnowledgeError, match="UTF-8"):
        load_knowledge(latin)


# --- end to end ----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_prose_knowledge_yields_verified_environments() -> None:
    """world_facts (prose only) -> QA traces -> validated -> packages verified in the sandbox -> samples."""
    seed = unconditional_seed(builtin_knowledge("world_facts"), hop_budget=2, count=8)
    settings = EnvSettings.model_validate({"flaw_rate": 0.0})

    async def main() -> list[tuple[str, int]]:
        gw = Gateway(RulesBackend(seed=0), max_attempts=2)
        verified: list[tuple[str, int]] = []
        async with SandboxPool(SandboxSettings.model_validate({"pool_size": 4, "timeout_s": 5.0})) as pool:
            for outcome in await synthesize(seed, gw, settings):
                assert not isinstance(outcome, InvalidOutput), outcome
                trace, _ = outcome
                assert all(s.grounding is None or s.grounding.is_passage for s in trace.sub_qas)
                verdict = await validate(trace, gw, settings)
                assert verdict.keep, verdict.reason
                built = await synthesize_package(verdict.trace, gw, pool, settings)
                assert built.package is not None, built.reason
                merged = (await merge_package(built.package, gw, pool)).package
                assert all(o.passed for o in await verify_package(merged, pool))
                assert merged.data and all(
                    set(r) == {"id", "text"} for rows in merged.data.values() for r in rows
                )
                sample = sample_of(merged)
                assert sample.reward_spec["jobs"] and sample.tools
                verified.append((merged.structure, len(merged.jobs)))
        return verified

    verified = asyncio.run(main())
    assert len(verified) == 8
    assert {s for s, _ in verified} == {
        "single_hop",
        "parallel_single_hop",
        "multi_hop",
        "parallel_multi_hop",
    }

"""Knowledge sources and QA seeds (producers/knowledge.py): built-ins, loaders, errors, seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from arena.hashing import content_hash
from arena.records.envs import Cell, KbTable, KnowledgeBase
from producers.builtin_knowledge import BUILTIN_DOMAINS, builtin_knowledge
from producers.knowledge import (
    KnowledgeError,
    infer_links,
    load_knowledge,
    load_questions,
    load_seeds,
    question_seeds,
    seeds_from,
    slug,
    unconditional_seed,
)
from simulator.knowledge import Kb


def table(kb: KnowledgeBase, name: str) -> dict[str, dict[str, Cell]]:
    t = next(t for t in kb.tables if t.name == name)
    return {str(r[t.key]): r for r in t.rows}


# --------------------------------------------------------------------------- built-in domains


@pytest.mark.parametrize("domain", BUILTIN_DOMAINS)
def test_builtin_knowledge_is_linked_and_seeded(domain: str) -> None:
    kb = builtin_knowledge(domain, 0)
    assert kb.domain == domain and 3 <= len(kb.tables) <= 4
    names = {t.name for t in kb.tables}
    for t in kb.tables:
        assert 12 <= len(t.rows) <= 20
        keys = [str(r[t.key]) for r in t.rows]
        assert len(set(keys)) == len(keys)  # unique keys
        assert all(set(r) == set(t.columns) for r in t.rows)
        for column, target in t.links.items():  # every foreign key resolves
            assert target in names
            assert {str(r[column]) for r in t.rows} <= set(table(kb, target))
    # Multi-hop walks exist: some path follows two foreign keys.
    assert max(len(r.links) for r in Kb(kb).routes()) >= 2
    assert builtin_knowledge(domain, 0) == kb  # same seed, same tables
    assert builtin_knowledge(domain, 1) != kb


def test_unknown_builtin_domain() -> None:
    with pytest.raises(KnowledgeError, match="fix: use one of real_estate"):
        builtin_knowledge("astrology")


# --------------------------------------------------------------------------- loaders


def test_json_knowledge_base_and_row_list(tmp_path: Path) -> None:
    doc = {
        "domain": "library",
        "tables": [
            {"name": "books", "rows": [{"isbn": "B1", "title": "Dune", "author": "A1", "pages": 412}]},
            {"name": "authors", "entity": "writer", "rows": [{"author": "A1", "name": "Frank Herbert"}]},
        ],
        "passages": ["A small library."],
    }
    (tmp_path / "lib.json").write_text(json.dumps(doc))
    (kb,) = load_knowledge(tmp_path / "lib.json")
    assert kb.domain == "library" and kb.passages == ["A small library."]
    books, authors = kb.tables
    assert (books.key, books.entity, authors.entity) == ("isbn", "book", "writer")
    assert books.links == {"author": "authors"}  # inferred: values are author keys, name points there
    (tmp_path / "Fruit Prices.json").write_text(
        json.dumps([{"fruit": "apple", "price": 3}, {"fruit": "fig"}])
    )
    (rows,) = load_knowledge(tmp_path / "Fruit Prices.json")
    assert rows.tables[0].name == "fruit_prices" and rows.tables[0].rows[1] == {"fruit": "fig"}


def test_csv_table(tmp_path: Path) -> None:
    path = tmp_path / "ports.csv"
    path.write_text(
        "code,city,depth_m,opened\nRTM,Rotterdam,24,1872\nHAM,Hamburg,15.5,\nZIP,Antwerp,007,1811\n"
    )
    (kb,) = load_knowledge(path)
    (t,) = kb.tables
    assert (t.name, t.entity, t.key, t.columns) == (
        "ports",
        "port",
        "code",
        ["code", "city", "depth_m", "opened"],
    )
    assert t.rows[0] == {"code": "RTM", "city": "Rotterdam", "depth_m": 24, "opened": 1872}
    assert t.rows[1] == {"code": "HAM", "city": "Hamburg", "depth_m": 15.5}  # empty cell left out
    assert t.rows[2]["depth_m"] == "007"  # leading zeros stay text


def test_markdown_tables_facts_and_passages(tmp_path: Path) -> None:
    path = tmp_path / "zoo.md"
    path.write_text(
        "# Enclosures\n\n"
        "| Enclosure | Keeper | Area |\n|---|---|---|\n| E1 | K7 | 1200 |\n| E2 | K8 | 950 |\n\n"
        "The zoo opened in spring. The diet of animal Leo is meat. The age of animal Leo is 7.\n"
        "The diet of the animal Zara is leaves.\n"
    )
    (kb,) = load_knowledge(path)
    enclosures = next(t for t in kb.tables if t.name == "enclosures")
    assert enclosures.rows == [
        {"enclosure": "E1", "keeper": "K7", "area": 1200},
        {"enclosure": "E2", "keeper": "K8", "area": 950},
    ]
    animals = next(t for t in kb.tables if t.name == "animals")
    assert (animals.entity, animals.key) == ("animal", "id")
    assert animals.rows == [{"id": "Leo", "diet": "meat", "age": 7}, {"id": "Zara", "diet": "leaves"}]
    assert kb.passages == ["The zoo opened in spring."]


def test_folder_is_one_linked_knowledge_base(tmp_path: Path) -> None:
    (tmp_path / "agents.csv").write_text("agent_id,name\nX1,Ann\nX2,Bo\n")
    (tmp_path / "listings.csv").write_text("listing_id,price,agent_id\nL1,100,X1\nL2,200,X2\n")
    (tmp_path / "notes.bin").write_bytes(b"\x00")  # not a knowledge file: skipped
    (kb,) = load_knowledge(tmp_path)
    assert kb.domain == slug(tmp_path.name)
    assert {t.name for t in kb.tables} == {"agents", "listings"}
    listings = next(t for t in kb.tables if t.name == "listings")
    assert listings.links == {"agent_id": "agents"}


def test_infer_links_skips_numbers_that_merely_look_like_keys() -> None:
    kb = load_knowledge_from_rows(
        {"rooms": [{"room": 1, "floor": 2}, {"room": 2, "floor": 1}], "floors": [{"floor_no": 1, "x": "a"}]}
    )
    assert all(not t.links for t in infer_links(kb.tables))


def load_knowledge_from_rows(tables: dict[str, list[dict[str, Cell]]]) -> KnowledgeBase:
    return KnowledgeBase(
        domain="t",
        tables=[
            KbTable(name=n, entity=n[:-1], key=next(iter(rows[0])), columns=list(rows[0]), rows=rows)
            for n, rows in tables.items()
        ],
    )


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("bad.json", "{not json", "invalid JSON at line 1"),
        ("shape.json", '{"rows": 3}', "unsupported JSON shape"),
        ("dupes.csv", "id,v\na,1\na,2\n", "key column 'id' repeats ['a']"),
        ("narrow.csv", "id\na\nb\n", "has 1 column(s)"),
        ("wide.csv", "id,v\na,1,extra\n", "more cells than the header"),
        ("empty.md", "\n\n", "no tables, facts or text"),
        ("table.xlsx", "x", "unsupported file type '.xlsx'"),
        (
            "links.json",
            '{"tables": [{"name": "a", "rows": [{"k": 1, "b": 2}], "links": {"b": "zz"}}]}',
            "missing",
        ),
        ("nested.json", '[{"id": 1, "v": {"x": 1}}]', "holds a dict"),
    ],
)
def test_unusable_input_names_file_and_fix(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(KnowledgeError) as err:
        load_knowledge(path)
    assert message in str(err.value)
    assert str(path) in str(err.value) and "(fix: " in str(err.value)


def test_missing_path() -> None:
    with pytest.raises(KnowledgeError, match="no such file or folder"):
        load_knowledge(Path("/nonexistent/kb.json"))


# --------------------------------------------------------------------------- questions and seeds


def test_questions_files(tmp_path: Path) -> None:
    (tmp_path / "q.jsonl").write_text('{"question": "What is A?"}\n\n"What is B?"\n')
    (tmp_path / "q.json").write_text(json.dumps({"questions": [{"question": " What is C? "}]}))
    (tmp_path / "q.txt").write_text("# comment\nWhat is D?\n\nWhat is E?\n")
    assert load_questions(tmp_path / "q.jsonl") == ["What is A?", "What is B?"]
    assert load_questions(tmp_path / "q.json") == ["What is C?"]
    assert load_questions(tmp_path / "q.txt") == ["What is D?", "What is E?"]
    (tmp_path / "none.txt").write_text("# nothing\n")
    with pytest.raises(KnowledgeError, match="no questions found"):
        load_questions(tmp_path / "none.txt")
    (tmp_path / "bad.jsonl").write_text('{"q": 1}\n')
    with pytest.raises(KnowledgeError, match="entry 1 has no question text"):
        load_questions(tmp_path / "bad.jsonl")


def test_seed_ids_are_content_hashes() -> None:
    kb = builtin_knowledge("healthcare", 0)
    seed = unconditional_seed(kb, hop_budget=3, count=5, source="builtin:healthcare")
    assert seed.mode == "unconditional" and seed.count == 5 and seed.question is None
    assert seed.seed_id == content_hash(seed.model_dump(mode="json", exclude={"seed_id"}), prefix="seed-")
    assert unconditional_seed(kb, hop_budget=3, count=5, source="builtin:healthcare") == seed
    assert unconditional_seed(kb, hop_budget=2, count=5, source="builtin:healthcare").seed_id != seed.seed_id
    asked = question_seeds(kb, ["Q one?", "Q two?"], hop_budget=2)
    assert [s.question for s in asked] == ["Q one?", "Q two?"] and {s.mode for s in asked} == {"question"}
    assert len({s.seed_id for s in asked}) == 2
    assert seeds_from(kb, questions=["Q one?"])[0] == asked[0]
    assert seeds_from(kb, count=5, hop_budget=3, source="builtin:healthcare") == [seed]


def test_load_seeds_pairs_questions_with_knowledge(tmp_path: Path) -> None:
    (tmp_path / "ports.csv").write_text("code,city\nRTM,Rotterdam\nHAM,Hamburg\n")
    (tmp_path / "q.txt").write_text("What is the city of the port RTM?\n")
    (seed,) = load_seeds(tmp_path / "ports.csv", tmp_path / "q.txt")
    assert seed.mode == "question" and seed.question == "What is the city of the port RTM?"
    assert seed.knowledge.tables[0].name == "ports" and seed.source.endswith("ports.csv")
    (plain,) = load_seeds(tmp_path / "ports.csv", count=3)
    assert plain.mode == "unconditional" and plain.count == 3

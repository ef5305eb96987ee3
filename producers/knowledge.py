"""Knowledge sources K and QA seeds for the environment track (ASTRA §2.2.1).

A knowledge base is a few small relational tables linked by foreign keys
(``arena.records.envs.KnowledgeBase``), so multi-hop questions exist: a
listing's agent, that agent's agency, the agency's city. Sources:

- ``producers.builtin_knowledge.builtin_knowledge(domain, seed)``: seeded generators for ``BUILTIN_DOMAINS``
  (4 linked tables of 12-20 rows each, distinct readable values);
- ``load_knowledge(path)``: JSON tables (``{"domain", "tables": [...]}``, a list
  of such, or a list of row dicts = one table), CSV (one table, key = first
  column, name from the file stem), Markdown/text corpora (pipe tables become
  tables; sentences "The <column> of <entity> <key> is <value>." become rows;
  other text is kept as passages: prose, one passage per paragraph, which the
  environment track chunks, retrieves per question and grounds answers in). A folder is one knowledge
  base of all its files. Links are inferred when none are given: a column
  whose values are all keys of another table (and whose name points at it).

Seeds: ``unconditional_seed`` (K + hop budget + count) and ``question_seeds``
(one seed per main question, from ``load_questions``). ``seed_id`` is the
content hash of the seed. Unusable input raises ``KnowledgeError`` naming the
file and the fix.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from arena.hashing import content_hash
from arena.records.envs import Cell, KbTable, KnowledgeBase, QaSeed

TABLE_SUFFIXES: tuple[str, ...] = (".json", ".jsonl", ".csv", ".md", ".markdown", ".txt")
"""Files a folder contributes (explicit files load whatever their name, by content type)."""
MAX_FILE_BYTES = 32 * 1024 * 1024
"""A seed carries its knowledge base in one Kafka record: bigger sources are refused."""


class KnowledgeError(ValueError):
    """A knowledge or questions file that cannot be used; the message names the file and the fix."""

    def __init__(self, path: Path | str, problem: str, fix: str) -> None:
        self.path = str(path)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{path}: {problem} (fix: {fix})")


# --------------------------------------------------------------------------- naming helpers


def slug(text: str) -> str:
    """``text`` as a table/column name: lower snake_case starting with a letter."""
    out = re.sub(r"[^0-9a-z]+", "_", text.strip().lower()).strip("_") or "table"
    return out if out[0].isalpha() else f"t_{out}"


def singular(name: str) -> str:
    """``listings`` -> ``listing``, ``cities`` -> ``city``, ``addresses`` -> ``address``."""
    if name.endswith("ies") and len(name) > 3:
        return name[:-3] + "y"
    if re.search(r"(ss|sh|ch|x)es$", name):
        return name[:-2]
    if name.endswith("s") and not name.endswith("ss"):
        return name[:-1]
    return name


def plural(name: str) -> str:
    """``city`` -> ``cities``, ``listing`` -> ``listings``."""
    if re.search(r"[^aeiou]y$", name):
        return name[:-1] + "ies"
    if re.search(r"(s|sh|ch|x)$", name):
        return name + "es"
    return name + "s"


def cell(text: str) -> Cell:
    """A text cell as int/float when it is plainly a number (``007`` stays text)."""
    value = text.strip()
    if re.fullmatch(r"-?(0|[1-9]\d{0,17})", value):
        return int(value)
    if re.fullmatch(r"-?(0|[1-9]\d*)\.\d+", value):
        return float(value)
    return value


# --------------------------------------------------------------------------- loaders


def _make_table(
    path: Path,
    name: str,
    rows: Sequence[Any],
    *,
    key: str | None = None,
    entity: str | None = None,
    links: dict[str, str] | None = None,
) -> KbTable:
    """A validated table from row dicts: scalar cells, >= 2 columns, unique non-empty keys."""
    name = slug(name)
    if not rows:
        raise KnowledgeError(path, f"table {name!r} has no rows", "give every table at least one row")
    columns: list[str] = []
    clean: list[dict[str, Cell]] = []
    for n, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise KnowledgeError(
                path, f"table {name!r} row {n} is not an object", "write rows as {column: value}"
            )
        out: dict[str, Cell] = {}
        for col, value in row.items():
            if value is None or value == "":
                continue
            if isinstance(value, bool):
                value = "yes" if value else "no"
            if not isinstance(value, str | int | float):
                raise KnowledgeError(
                    path,
                    f"table {name!r} row {n} column {col!r} holds a {type(value).__name__}",
                    "use text or number cells only",
                )
            out[str(col)] = value.strip() if isinstance(value, str) else value
            if str(col) not in columns:
                columns.append(str(col))
        clean.append(out)
    key = key or columns[0]
    if key not in columns:
        raise KnowledgeError(
            path, f"table {name!r}: key column {key!r} is not a column", "name an existing column"
        )
    bad_links = sorted(c for c in (links or {}) if c not in columns)
    if bad_links:
        raise KnowledgeError(
            path, f"table {name!r}: links name unknown columns {bad_links}", "link existing columns"
        )
    if len(columns) < 2:
        raise KnowledgeError(
            path, f"table {name!r} has {len(columns)} column(s)", "give it a key and at least one fact column"
        )
    keys = [str(r.get(key, "")) for r in clean]
    if "" in keys:
        raise KnowledgeError(
            path, f"table {name!r}: row {keys.index('') + 1} has no key {key!r}", "fill the key column"
        )
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise KnowledgeError(
            path,
            f"table {name!r}: key column {key!r} repeats {dupes[:3]}",
            "make the first (key) column unique",
        )
    try:
        return KbTable(
            name=name,
            entity=entity or singular(name),
            key=key,
            columns=columns,
            rows=clean,
            links=links or {},
        )
    except ValidationError as exc:
        raise KnowledgeError(
            path, f"table {name!r} is invalid: {exc.errors()[0]['msg']}", "check the table"
        ) from None


def _read_text(path: Path) -> str:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise KnowledgeError(
            path, f"file is larger than {MAX_FILE_BYTES >> 20} MiB", "split it into smaller sources"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise KnowledgeError(
            path, f"not UTF-8 text ({exc.reason} at byte {exc.start})", "save it as UTF-8"
        ) from None
    except OSError as exc:
        raise KnowledgeError(
            path, f"cannot be read ({exc.strerror or exc})", "check its permissions"
        ) from None
    if "\x00" in text:
        raise KnowledgeError(
            path, "looks like a binary file (it holds NUL bytes)", "export it as plain text or Markdown first"
        )
    return text


def _json_tables(path: Path, doc: Any, where: str = "") -> KnowledgeBase:
    """A knowledge base from ``{"domain", "tables", "passages"}``."""
    tables = []
    for n, raw in enumerate(doc.get("tables") or [], start=1):
        if not isinstance(raw, dict) or not isinstance(raw.get("rows"), list):
            raise KnowledgeError(
                path, f"{where}tables[{n}] has no 'rows' list", "give each table {'name', 'rows': [...]}"
            )
        tables.append(
            _make_table(
                path,
                str(raw.get("name") or f"{path.stem}_{n}"),
                raw["rows"],
                key=raw.get("key"),
                entity=raw.get("entity"),
                links=raw.get("links"),
            )
        )
    passages = [str(p) for p in doc.get("passages") or []]
    names = {t.name for t in tables}
    dangling = sorted(
        {f"{t.name}.{c} -> {target}" for t in tables for c, target in t.links.items() if target not in names}
    )
    if dangling:
        raise KnowledgeError(
            path, f"{where}links point to missing tables: {dangling[:3]}", "link to a table of the file"
        )
    if not tables and not passages:
        raise KnowledgeError(
            path, f"{where}no tables and no passages", "add 'tables': [{'name', 'rows'}] or 'passages'"
        )
    return KnowledgeBase(domain=str(doc.get("domain") or slug(path.stem)), tables=tables, passages=passages)


def _load_json(path: Path) -> list[KnowledgeBase]:
    text = _read_text(path)
    try:
        if path.suffix == ".jsonl":
            doc: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KnowledgeError(
            path, f"invalid JSON at line {exc.lineno}: {exc.msg}", "fix the JSON syntax"
        ) from None
    if isinstance(doc, dict) and "tables" in doc:
        return [_json_tables(path, doc)]
    if isinstance(doc, list) and doc and all(isinstance(d, dict) and "tables" in d for d in doc):
        return [_json_tables(path, d, f"[{n}] ") for n, d in enumerate(doc, start=1)]
    if isinstance(doc, list) and doc and all(isinstance(d, dict) for d in doc):
        return [KnowledgeBase(domain=slug(path.stem), tables=[_make_table(path, path.stem, doc)])]
    raise KnowledgeError(
        path,
        "unsupported JSON shape",
        "use {'domain': ..., 'tables': [{'name', 'rows': [...]}]}, a list of those, or a list of row objects",
    )


def _load_csv(path: Path) -> list[KnowledgeBase]:
    text = _read_text(path)
    try:
        rows = list(csv.DictReader(io.StringIO(text)))
    except csv.Error as exc:
        raise KnowledgeError(
            path, f"invalid CSV: {exc}", "write a header line and comma-separated rows"
        ) from None
    if rows and None in rows[0]:
        raise KnowledgeError(
            path, "a row has more cells than the header", "give every row the header's columns"
        )
    typed = [{k: cell(v) for k, v in row.items() if k is not None and v is not None} for row in rows]
    return [KnowledgeBase(domain=slug(path.stem), tables=[_make_table(path, path.stem, typed)])]


_FACT = re.compile(
    r"The (?P<column>[A-Za-z][A-Za-z0-9 _-]*?) of (?:the )?(?P<entity>[a-z][a-z0-9_]*) (?P<key>\S(?:.*?\S)?) "
    r"is (?P<value>\S(?:.*?\S)??)\.(?=\s|$)"
)
_SEPARATOR = re.compile(r"^\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?$")


def _pipe_cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _load_markdown(path: Path) -> list[KnowledgeBase]:
    lines = _read_text(path).splitlines()
    tables: list[KbTable] = []
    facts: dict[str, dict[str, dict[str, Cell]]] = {}  # entity -> key -> column -> value
    passages: list[str] = []
    paragraph: list[str] = []
    heading = ""
    i = 0

    def flush() -> None:
        text = " ".join(paragraph).strip()
        paragraph.clear()
        rest = _FACT.sub(lambda m: _record_fact(m, facts), text).strip()
        if re.search(r"[A-Za-z]{2}", rest):
            passages.append(rest)

    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("#"):
            flush()
            heading = line.lstrip("#").strip()
            i += 1
            continue
        if line.startswith("|") and i + 1 < len(lines) and _SEPARATOR.match(lines[i + 1].strip()):
            flush()
            header = [slug(h) for h in _pipe_cells(line)]
            i += 2
            rows: list[dict[str, Cell]] = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = _pipe_cells(lines[i])
                rows.append({h: cell(c) for h, c in zip(header, cells, strict=False) if c})
                i += 1
            name = heading or f"{path.stem}_{len(tables) + 1}"
            if any(t.name == slug(name) for t in tables):
                name = f"{name}_{len(tables) + 1}"
            tables.append(_make_table(path, name, rows))
            continue
        if not line:
            flush()
        else:
            paragraph.append(line)
        i += 1
    flush()
    for entity, by_key in facts.items():
        rows = [{"id": key, **cols} for key, cols in by_key.items()]
        tables.append(_make_table(path, plural(slug(entity)), rows, key="id", entity=slug(entity)))
    if not tables and not passages:
        raise KnowledgeError(path, "no tables, facts or text found", "write Markdown pipe tables or prose")
    return [KnowledgeBase(domain=slug(path.stem), tables=tables, passages=passages)]


def _record_fact(match: re.Match[str], facts: dict[str, dict[str, dict[str, Cell]]]) -> str:
    column = slug(match["column"])
    if column == "id":
        column = "id_value"
    facts.setdefault(match["entity"], {}).setdefault(match["key"], {})[column] = cell(match["value"])
    return ""


_LOADERS: dict[str, Callable[[Path], list[KnowledgeBase]]] = {
    ".json": _load_json,
    ".jsonl": _load_json,
    ".csv": _load_csv,
    ".md": _load_markdown,
    ".markdown": _load_markdown,
    ".txt": _load_markdown,
}


def infer_links(tables: Sequence[KbTable]) -> list[KbTable]:
    """Tables with foreign keys added where none are declared.

    A column links to another table when every value it holds is a key of that
    table and its name points there (``agent_id``, ``agent``, ``agents``, the
    other table's key column), or the keys are non-numeric text (an id space).
    """
    if any(t.links for t in tables):
        return list(tables)
    keys = {t.name: {str(r[t.key]) for r in t.rows if t.key in r} for t in tables}
    out = []
    for table in tables:
        links: dict[str, str] = {}
        for column in table.columns:
            if column == table.key:
                continue
            values = {str(r[column]) for r in table.rows if column in r}
            for other in tables:
                if other.name == table.name or not values or not values <= keys[other.name]:
                    continue
                named = column in (other.key, other.entity, other.name, f"{other.entity}_id")
                textual = all(not re.fullmatch(r"-?\d+(\.\d+)?", k) for k in keys[other.name])
                if named or textual:
                    links[column] = other.name
                    break
        out.append(table.model_copy(update={"links": links}) if links else table)
    return out


def _load_file(path: Path) -> list[KnowledgeBase]:
    loader = _LOADERS.get(path.suffix.lower())
    if loader is None:
        raise KnowledgeError(
            path,
            f"unsupported file type {path.suffix or '(none)'!r}",
            f"use one of {', '.join(TABLE_SUFFIXES)}",
        )
    return [kb.model_copy(update={"tables": infer_links(kb.tables)}) for kb in loader(path)]


def load_knowledge(path: Path) -> list[KnowledgeBase]:
    """Knowledge bases from a file, or one knowledge base from all files of a folder."""
    path = Path(path)
    if not path.exists():
        raise KnowledgeError(path, "no such file or folder", "check the path")
    if path.is_file():
        return _load_file(path)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TABLE_SUFFIXES)
    if not files:
        raise KnowledgeError(
            path, "the folder holds no knowledge files", f"add files ending in {', '.join(TABLE_SUFFIXES)}"
        )
    tables: list[KbTable] = []
    passages: list[str] = []
    for file in files:
        for kb in _LOADERS[file.suffix.lower()](file):
            for table in kb.tables:
                if any(t.name == table.name for t in tables):
                    raise KnowledgeError(
                        file, f"table name {table.name!r} is used twice in {path}", "rename one of them"
                    )
                tables.append(table)
            passages += kb.passages
    return [KnowledgeBase(domain=slug(path.name), tables=infer_links(tables), passages=passages)]


def load_questions(path: Path) -> list[str]:
    """Main questions: JSONL/JSON (objects with "question", or strings) or plain text, one per line."""
    path = Path(path)
    if not path.is_file():
        raise KnowledgeError(path, "no such file", "check the path")
    text = _read_text(path)
    items: list[Any]
    try:
        if path.suffix.lower() == ".jsonl":
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
        elif path.suffix.lower() == ".json":
            doc = json.loads(text)
            items = doc.get("questions", []) if isinstance(doc, dict) else doc
        else:
            items = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    except json.JSONDecodeError as exc:
        raise KnowledgeError(
            path, f"invalid JSON at line {exc.lineno}: {exc.msg}", "fix the JSON syntax"
        ) from None
    if not isinstance(items, list):
        raise KnowledgeError(
            path, "expected a list of questions", 'use [{"question": "..."}] or one per line'
        )
    questions = []
    for n, item in enumerate(items, start=1):
        q = item.get("question") if isinstance(item, dict) else item
        if not isinstance(q, str) or not q.strip():
            raise KnowledgeError(
                path, f"entry {n} has no question text", 'write {"question": "..."} or a string'
            )
        questions.append(q.strip())
    if not questions:
        raise KnowledgeError(path, "no questions found", "add one main question per line")
    return questions


# --------------------------------------------------------------------------- seeds


def _seed(**fields: Any) -> QaSeed:
    draft = QaSeed(seed_id="", **fields)
    return draft.model_copy(
        update={"seed_id": content_hash(draft.model_dump(mode="json", exclude={"seed_id"}), prefix="seed-")}
    )


def unconditional_seed(
    knowledge: KnowledgeBase, *, hop_budget: int = 2, count: int = 1, source: str = ""
) -> QaSeed:
    """One seed asking for ``count`` instances generated from ``knowledge``."""
    return _seed(
        domain=knowledge.domain,
        mode="unconditional",
        knowledge=knowledge,
        hop_budget=hop_budget,
        count=count,
        source=source,
    )


def question_seeds(
    knowledge: KnowledgeBase, questions: Iterable[str], *, hop_budget: int = 2, source: str = ""
) -> list[QaSeed]:
    """One question-mode seed per main question, all grounded in ``knowledge``."""
    return [
        _seed(
            domain=knowledge.domain,
            mode="question",
            question=q,
            knowledge=knowledge,
            hop_budget=hop_budget,
            count=1,
            source=source,
        )
        for q in questions
    ]


def seeds_from(
    knowledge: KnowledgeBase,
    *,
    questions: Iterable[str] | None = None,
    hop_budget: int = 2,
    count: int = 1,
    source: str = "",
) -> list[QaSeed]:
    """Question-mode seeds when ``questions`` are given, else one unconditional seed."""
    if questions is not None:
        return question_seeds(knowledge, questions, hop_budget=hop_budget, source=source)
    return [unconditional_seed(knowledge, hop_budget=hop_budget, count=count, source=source)]


def load_seeds(
    knowledge: Path, questions: Path | None = None, *, hop_budget: int = 2, count: int = 1
) -> list[QaSeed]:
    """Seeds for every knowledge base at ``knowledge``, in question mode when a questions file is given."""
    asked = load_questions(questions) if questions is not None else None
    return [
        s
        for kb in load_knowledge(knowledge)
        for s in seeds_from(kb, questions=asked, hop_budget=hop_budget, count=count, source=str(knowledge))
    ]

"""A knowledge base as the QA rules see it: ``Kb`` (rows by key, foreign-key routes, column kinds).

Also the answer-text helpers that QA synthesis (``simulator.qa``) and the QA
quality judges (``simulator.qa_judges``) share: a cell as answer text, numbers
in answers, and whole-token mentions of a value in a question.

``mentions_token`` is not ``simulator.reading.mentions`` (the agent's and
trajectory judges' check): this one compares ``norm``-ed text and treats ``-``
as part of a token (``3`` is not in ``L-1003``) and ``4.5`` as not in
``4.55``; that one compares numbers numerically and strings casefolded with
only ASCII letters and digits as token characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from arena.records.envs import Cell, KbTable, KnowledgeBase
from synthesis.envs.text import norm

MAX_LINKS = 7
"""Longest foreign-key path walked (hop budget 8 = 7 links + the final lookup)."""


# --------------------------------------------------------------------------- text


def mentions_token(text: str, value: str) -> bool:
    """Whether ``text`` names ``value`` as a whole token (``3`` is not in ``L-1003``, nor ``4.5`` in ``4.55``)."""
    v = norm(value)
    if not v:
        return False
    return re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-]|\.\d)", norm(text)) is not None


def readable(name: str) -> str:
    """``median_home_price`` -> ``median home price``."""
    return " ".join(name.replace("_", " ").split())


def cell_text(value: Cell) -> str:
    """A cell as its answer text (exactly as a tool would print it)."""
    return str(value)


def to_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{round(value, 6)}"


# --------------------------------------------------------------------------- knowledge view


@dataclass(frozen=True)
class Route:
    """A foreign-key path: start table, then one link column per hop."""

    tables: tuple[str, ...]
    links: tuple[str, ...] = ()

    @property
    def start(self) -> str:
        return self.tables[0]

    @property
    def last(self) -> str:
        return self.tables[-1]


@dataclass(frozen=True)
class Hop:
    """One lookup of a walk: the row ``key`` of ``table`` and its ``column`` value."""

    table: str
    key: str
    column: str
    value: Cell


class Kb:
    """Indexes over a knowledge base: rows by key, phrases, numeric/categorical columns, routes."""

    def __init__(self, kb: KnowledgeBase) -> None:
        self.kb = kb
        self.tables: dict[str, KbTable] = {t.name: t for t in kb.tables}
        self.rows: dict[str, dict[str, dict[str, Cell]]] = {
            t.name: {cell_text(r[t.key]): r for r in t.rows if t.key in r} for t in kb.tables
        }
        self._by_norm = {name: {norm(k): k for k in rows} for name, rows in self.rows.items()}

    def key_of(self, table: str, text: str) -> str | None:
        """The key of ``table`` that ``text`` spells (case- and space-insensitive)."""
        return self._by_norm[table].get(norm(text))

    def entity(self, table: str) -> str:
        return readable(self.tables[table].entity)

    def plural(self, table: str) -> str:
        return readable(table)

    def column_phrase(self, column: str) -> str:
        return readable(column)

    def links(self, table: str) -> list[tuple[str, str]]:
        t = self.tables[table]
        return [(c, target) for c, target in t.links.items() if target in self.tables and c in t.columns]

    def link_phrase(self, table: str, column: str) -> str:
        """How a walk names the row a link points to: ``agent`` for listings.agent_id."""
        target = self.tables[table].links[column]
        if list(self.tables[table].links.values()).count(target) == 1:
            return self.entity(target)
        return re.sub(r" id$", "", readable(column))

    def path_phrase(self, route: Route) -> str:
        pairs = list(zip(route.tables[:-1], route.links, strict=True))
        return "".join(f" of the {self.link_phrase(t, c)}" for t, c in reversed(pairs))

    def routes(self, max_links: int = MAX_LINKS) -> list[Route]:
        """Every simple foreign-key path of at most ``max_links`` links, from every table."""
        out: list[Route] = []

        def grow(route: Route) -> None:
            out.append(route)
            if len(route.links) >= max_links:
                return
            for column, target in self.links(route.last):
                if target not in route.tables:
                    grow(Route((*route.tables, target), (*route.links, column)))

        for name in self.tables:
            grow(Route((name,)))
        return out

    def walk(self, route: Route, key: str, column: str) -> list[Hop] | None:
        """The lookups from row ``key`` of the start table to ``column`` of the last; None when broken."""
        hops: list[Hop] = []
        for table, link in [*zip(route.tables[:-1], route.links, strict=True), (route.last, column)]:
            row = self.rows[table].get(key)
            if row is None or link not in row:
                return None
            hops.append(Hop(table, key, link, row[link]))
            key = cell_text(row[link])
        return hops

    def values(self, table: str, column: str) -> list[Cell]:
        return [r[column] for r in self.rows[table].values() if column in r]

    def attributes(self, table: str) -> list[str]:
        """Non-key, non-link columns (facts, not pointers)."""
        t = self.tables[table]
        return [c for c in t.columns if c != t.key and c not in t.links]

    def numeric(self, table: str, column: str) -> bool:
        vals = self.values(table, column)
        return bool(vals) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in vals)

    def integral(self, table: str, column: str) -> bool:
        return self.numeric(table, column) and all(isinstance(v, int) for v in self.values(table, column))

    def categorical(self, table: str, column: str) -> bool:
        vals = self.values(table, column)
        return bool(vals) and all(isinstance(v, str) for v in vals) and len(set(vals)) < len(vals)

    def all_values(self) -> list[str]:
        """Every cell as text, longest first (for masking entity names inside questions)."""
        vals = {cell_text(v) for t in self.kb.tables for r in t.rows for v in r.values()}
        return sorted((v for v in vals if len(v) >= 2), key=len, reverse=True)

    def all_keys(self) -> list[str]:
        return [k for rows in self.rows.values() for k in rows]

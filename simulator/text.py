"""Wording helpers of the simulator's tool-doc side (chains, task writer, task scorer).

Words of tool names (``searchHotels`` -> ``search hotels``), language-agnostic
stems for matching a task text against tool docs, sentences of a description,
imperative verbs, and joining or capitalising phrases of a task text.

The rules agent and judges read trajectories with their own, English-only
terms (``simulator.reading``: ``words``, ``stem``, ``STOPWORDS``); those differ
on purpose (synonym classes, digit tokens) and are not interchangeable with
``name_words``, ``fold_stem`` and ``DOC_STOPWORDS`` here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from arena.records.tools import NormalizedTool
from synthesis.envs.text import fold
from synthesis.sft.tool_links import singular, snake

VERBS = frozenset(
    (
        "get fetch search find list create add update delete remove cancel reserve book check calculate "
        "compute convert read write move track geocode show send set post put upload download look lookup "
        "query retrieve checkout register subscribe rename copy translate summarize summarise generate run "
        "start stop schedule attach detach replace append estimate compare validate verify resolve "
        "place order open close count measure plan locate browse view edit modify insert transfer pay "
        "submit change tag mark assign approve reject share invite follow rate review reply archive restore "
        "enable disable export import sync scan print apply request notify"
    ).split()
)
DOC_STOPWORDS = frozenset(
    (
        "the a an and or of for to in on at by with from into onto this that these those it its their "
        "them they you your our my me we is are be was were been being has have had can could should "
        "would will may might must do does did done not no yes as than then there here when where which "
        "who whom what why how all any each every some such one two both more most other only also just "
        "very per via over under about after before again further once same so too use used using uses "
        "given optional optionally default returns return returned tool function endpoint api call "
        "identifier identifiers value values result results data information info new existing current "
        "get gets list lists show shows please"
    ).split()
)


def name_words(name: str) -> list[str]:
    """``searchHotels`` -> ``['search', 'hotels']``."""
    return [w for w in snake(name).split("_") if w]


def fold_stem(word: str) -> str:
    """A crude, language-agnostic stem: folded, singular, cut to 5 letters."""
    return singular(fold(word))[:5]


def content_words(text: str) -> list[str]:
    """Words of ``text`` worth matching on (4+ letters, not stop words), folded."""
    return [w for w in re.findall(r"[^\W\d_]{4,}", fold(text)) if w not in DOC_STOPWORDS]


def text_stems(text: str) -> set[str]:
    return {fold_stem(w) for w in re.findall(r"[^\W\d_]{3,}", fold(text))}


def sentences_of(description: str) -> list[str]:
    """Sentences of a tool description, without boilerplate ("Note that the function is in Python")."""
    parts = [p.strip() for p in re.split(r"(?<=[.!?])\s+|\n+", description.strip()) if p.strip()]
    return [p for p in parts if not re.match(r"note(?: that|:)", p, re.IGNORECASE)]


def first_sentences(description: str, count: int = 2) -> str:
    return " ".join(sentences_of(description)[:count])


def tool_terms(tool: NormalizedTool) -> set[str]:
    """Stems naming what ``tool`` is about: its name and the start of its description."""
    words = [w for w in name_words(tool.function.name) if len(w) >= 3 and w not in DOC_STOPWORDS]
    words += content_words(first_sentences(tool.function.description))
    return {fold_stem(w) for w in words}


def name_terms(tool: NormalizedTool) -> set[str]:
    return {fold_stem(w) for w in name_words(tool.function.name) if len(w) >= 3 and w not in DOC_STOPWORDS}


def humanize(name: str) -> str:
    """``guest_email`` -> ``guest email``; ``check_in`` -> ``check-in``."""
    text = " ".join(name_words(name))
    return re.sub(r"\b(check|sign|log) (in|out)\b", r"\1-\2", text)


def imperative(word: str) -> str:
    """``Gets`` -> ``get``, ``Searches`` -> ``search``, ``Retrieves`` -> ``retrieve``."""
    w = word.lower()
    if w in VERBS:
        return w
    for suffix in ("es", "s"):  # searches -> search; gets -> get; retrieves -> retrieve
        if w.endswith(suffix) and w[: -len(suffix)] in VERBS:
            return w[: -len(suffix)]
    if w in ("returns", "return"):
        return "get"
    if w.endswith("ies") and w[:-3] + "y" in VERBS:
        return w[:-3] + "y"
    return w


def capitalise(text: str) -> str:
    """The text with its first character upper-cased (the rest untouched)."""
    return text[:1].upper() + text[1:]


def join_list(items: Sequence[str], conj: str = "and") -> str:
    """``a``; ``a and b``; ``a, b or c`` (with ``conj='or'``); '' for no items."""
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conj} {items[-1]}"

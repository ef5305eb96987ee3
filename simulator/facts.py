"""Facts from prose: (subject, attribute, value) triples read off simple declarative sentences.

The rules backend cannot read prose in general; it reads a small, deterministic set of sentence
shapes (``PATTERNS``) that encyclopaedic text uses all the time::

    The Eiffel Tower is 330 metres tall.            -> (Eiffel Tower, height, 330 metres)
    Marie Curie was born in Warsaw in 1867.         -> (Marie Curie, birthplace, Warsaw),
                                                       (Marie Curie, birth year, 1867)
    The Eiffel Tower is located in Paris.           -> (Eiffel Tower, location, Paris)
    The population of Warsaw is 1,860,000.          -> (Warsaw, population, 1,860,000)
    Warsaw is the capital of Poland.                -> (Warsaw, country, Poland)
    The Eiffel Tower was designed by Gustave Eiffel. -> (Eiffel Tower, designer, Gustave Eiffel)

Every other sentence is ignored. A leading "The" is dropped from subjects; a subject that is a
pronoun is not an entity. Values are copied verbatim from the sentence, so a fact's value is a
substring of its chunk (what passage grounding checks). Facts chain where one fact's value is
another's subject (born in Warsaw + Warsaw is the capital of Poland): that is a multi-hop walk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from synthesis.envs.passages import Chunk, split_sentences
from synthesis.envs.text import norm

_WORD = r"[A-Z][\w'’.-]*"
_NAME = rf"(?:The )?{_WORD}(?: (?:of|de|du|da|von|van|der|la|le|del|the|and|\d+|{_WORD}))*"
_SUBJECT = rf"(?P<s>{_NAME})"
_PLACE = rf"(?P<v>{_NAME})"
_NUMBER = r"\d[\d,]*(?:\.\d+)?(?: (?:thousand|million|billion))?"
_UNIT = r"(?:metres|meters|feet|kilometres|kilometers|km|miles|m|ft)"
_YEAR = r"(?P<y>\d{3,4})"
_FREE = r"(?P<v>[\w$€£][\w$€£%'’.,/ -]{0,60}?)"
_APPROX = r"(?:about |approximately |roughly |around |some )?"

_VERB_YEAR = {
    "founded": "founding year",
    "established": "founding year",
    "built": "construction year",
    "constructed": "construction year",
    "completed": "completion year",
    "opened": "opening year",
}
_VERB_AGENT = {
    "designed": "designer",
    "written": "author",
    "painted": "painter",
    "discovered": "discoverer",
    "invented": "inventor",
    "founded": "founder",
    "composed": "composer",
}
_DIMENSION = {"tall": "height", "high": "height", "long": "length", "wide": "width", "deep": "depth"}
PRONOUNS = frozenset({"it", "he", "she", "they", "this", "that", "these", "those", "its", "there"})

PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("born_place_year", rf"{_SUBJECT} was born in {_PLACE} in {_YEAR}"),
        ("born_year", rf"{_SUBJECT} was born in {_YEAR}"),
        ("born_place", rf"{_SUBJECT} was born in {_PLACE}"),
        ("died_place_year", rf"{_SUBJECT} died in {_PLACE} in {_YEAR}"),
        (
            "dimension",
            rf"{_SUBJECT} (?:is|was) {_APPROX}(?P<v>{_NUMBER} {_UNIT}) (?P<d>tall|high|long|wide|deep)",
        ),
        ("population_has", rf"{_SUBJECT} has a population of {_APPROX}(?P<v>{_NUMBER})"),
        ("located", rf"{_SUBJECT} (?:is|was|lies) (?:located |situated )?in {_PLACE}"),
        ("capital", rf"{_SUBJECT} is the capital(?: city)? of {_PLACE}"),
        ("verb_year", rf"{_SUBJECT} was (?P<verb>{'|'.join(_VERB_YEAR)}) in {_YEAR}"),
        ("verb_agent", rf"{_SUBJECT} was (?P<verb>{'|'.join(_VERB_AGENT)}) by {_PLACE}"),
        ("attribute_of", rf"The (?P<a>[a-z][a-z ]{{1,30}}?) of {_SUBJECT} (?:is|was) {_APPROX}{_FREE}"),
    )
)
"""Sentence shapes read, first match wins (sentences are matched whole, final punctuation stripped)."""


@dataclass(frozen=True)
class Fact:
    """One statement of a passage chunk."""

    subject: str
    attribute: str
    value: str
    chunk: str
    """Id of the chunk that states it."""
    sentence: str
    """The sentence, as the chunk has it."""


def _subject(text: str) -> str | None:
    name = re.sub(r"^The ", "", text.strip())
    if not name or norm(name) in PRONOUNS or len(name.split()) > 6:
        return None
    return name


def _value_ok(value: str) -> bool:
    text = value.strip()
    return bool(text) and len(text.split()) <= 6 and not re.search(r",(?!\d{3})|;| which | who ", text)


def sentence_facts(sentence: str, chunk: str) -> list[Fact]:
    """The facts one sentence states (empty when it has none of the ``PATTERNS`` shapes)."""
    body = sentence.strip().rstrip(".!")
    for name, pattern in PATTERNS:
        m = pattern.fullmatch(body)
        if m is None:
            continue
        subject = _subject(m["s"])
        if subject is None:
            return []
        pairs = _pairs(name, m)
        return [
            Fact(subject, attribute, value.strip(), chunk, sentence)
            for attribute, value in pairs
            if _value_ok(value) and norm(value) != norm(subject)
        ]
    return []


def _pairs(name: str, m: re.Match[str]) -> list[tuple[str, str]]:
    groups = m.groupdict()
    place = re.sub(r"^The ", "", groups.get("v") or "")
    match name:
        case "born_place_year":
            return [("birthplace", place), ("birth year", m["y"])]
        case "born_year":
            return [("birth year", m["y"])]
        case "born_place":
            return [("birthplace", place)]
        case "died_place_year":
            return [("place of death", place), ("death year", m["y"])]
        case "dimension":
            return [(_DIMENSION[m["d"]], m["v"])]
        case "population_has":
            return [("population", m["v"])]
        case "located":
            return [("location", place)]
        case "capital":
            return [("country", place)]
        case "verb_year":
            return [(_VERB_YEAR[m["verb"]], m["y"])]
        case "verb_agent":
            return [(_VERB_AGENT[m["verb"]], place)]
        case _:
            return [(" ".join(m["a"].split()), m["v"])]


def chunk_facts(chunk: Chunk) -> list[Fact]:
    """Every fact the sentences of ``chunk`` state, in order."""
    return [f for sentence in split_sentences(chunk.text) for f in sentence_facts(sentence, chunk.id)]


def extract_facts(chunks: list[Chunk]) -> list[Fact]:
    """The facts of ``chunks``; a (subject, attribute) stated twice keeps its first statement."""
    seen: set[tuple[str, str]] = set()
    out: list[Fact] = []
    for chunk in chunks:
        for fact in chunk_facts(chunk):
            key = (norm(fact.subject), fact.attribute)
            if key not in seen:
                seen.add(key)
                out.append(fact)
    return out

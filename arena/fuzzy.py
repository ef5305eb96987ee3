"""Normalised fuzzy matching of answers against knowledge and tool outputs.

One rule everywhere an answer is checked (QA grounding, sandbox verification):

- **Text** is compared as token sets: casefolded, accents folded, punctuation and whitespace
  ignored. Two values are the same when their token-set overlap (Jaccard) is at least
  ``TOKEN_THRESHOLD``; a value is *contained* in a longer text when at least ``TOKEN_THRESHOLD`` of
  its tokens occur in it (so one missing word of five is tolerated, a missing one of two is not).
- **Numbers** are read with thousands separators, currency signs, units and scale words
  (``1.2 million``) stripped; they match within ``REL_TOLERANCE`` relative difference, except
  small integers (``abs < EXACT_BELOW``: years, counts, ranks), which must be equal, since 1867 and
  1868 are different answers even though they differ by 0.05 %.

The thresholds are deliberately strict: a fuzzy match must survive the tamper check (an answer
removed from the data must no longer match), so it tolerates formatting, not content.
"""

from __future__ import annotations

import math
import re

from arena.text import fold

TOKEN_THRESHOLD = 0.8
"""Least token-set overlap (equality) or answer-token coverage (containment) for text to match."""
REL_TOLERANCE = 0.005
"""Largest relative difference at which two numbers match (0.5 %: rounding of a reported figure)."""
EXACT_BELOW = 10_000
"""Integers smaller than this (in magnitude) must be equal: years, counts, ranks."""

_SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "m": 1e6, "billion": 1e9, "bn": 1e9, "trillion": 1e12}
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:[,\u202f\u00a0 ]\d{3})+|\d+)(?:\.\d+)?(?![\d])")
_WHOLE_NUMBER = re.compile(
    r"^[^\w\d+-]*(?P<num>[-+]?(?:\d{1,3}(?:[, \u202f\u00a0]\d{3})+|\d+)(?:\.\d+)?)\s*(?P<rest>.*)$"
)
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[^\W\d_]+")


def tokens(text: object) -> list[str]:
    """Folded word and number tokens of ``text`` (``1,860,000`` -> ``1860000``; punctuation dropped)."""
    folded = fold(str(text))
    folded = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}\b)", "", folded)
    return _TOKEN.findall(folded)


def parse_number(text: object) -> float | None:
    """``text`` as one number if it is one (units, currency, separators, scale words allowed), else None.

    ``'1,860,000'`` -> 1860000; ``'330 metres'`` -> 330; ``'$4.5 million'`` -> 4500000; ``'L-1003'``,
    ``'12 Elm St'`` -> None (a number followed by more than one word is an address, not a quantity).
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return float(text) if math.isfinite(text) else None
    m = _WHOLE_NUMBER.match(fold(str(text)).strip())
    if m is None:
        return None
    value = float(re.sub(r"[, \u202f\u00a0]", "", m["num"]))
    rest = m["rest"].strip(" .")
    words = rest.split()
    if len(words) > 1 or (words and not re.fullmatch(r"[^\W\d_]+|%|[^\W\d_]+/[^\W\d_]+|°[a-z]?", words[0])):
        return None
    if words and words[0] in _SCALES:
        value *= _SCALES[words[0]]
    return value


def numbers_match(a: float, b: float) -> bool:
    """Equal small integers, or within ``REL_TOLERANCE`` of each other."""
    if a == b:
        return True
    a, b = float(a), float(b)
    if a.is_integer() and b.is_integer() and max(abs(a), abs(b)) < EXACT_BELOW:
        return False
    return abs(a - b) <= REL_TOLERANCE * max(abs(a), abs(b))


def same_value(a: object, b: object) -> bool:
    """Whether two values say the same thing (see the module rules); empty values never match."""
    na, nb = parse_number(a), parse_number(b)
    if na is not None and nb is not None:
        return numbers_match(na, nb)
    ta, tb = set(tokens(a)), set(tokens(b))
    if not ta or not tb:
        return False
    return len(ta & tb) / len(ta | tb) >= TOKEN_THRESHOLD


def contains_value(text: object, value: object) -> bool:
    """Whether ``text`` states ``value``: a matching number in it, or most of the value's tokens."""
    wanted = tokens(value)
    if not wanted:
        return False
    haystack = tokens(text)
    number = parse_number(value)
    if number is not None:
        found = [parse_number(t) for t in haystack]
        return any(n is not None and numbers_match(n, number) for n in found)
    present = set(haystack)
    hits = sum(1 for t in set(wanted) if t in present)
    return hits / len(set(wanted)) >= TOKEN_THRESHOLD

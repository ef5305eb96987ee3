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

from arena.tool_reward import (  # the number and token rules are the reward's, so they agree
    EXACT_BELOW,
    REL_TOLERANCE,
    numbers_match,
    parse_number,
    tokens,
)

__all__ = [
    "EXACT_BELOW",
    "REL_TOLERANCE",
    "TOKEN_THRESHOLD",
    "contains_value",
    "numbers_match",
    "parse_number",
    "same_value",
    "tokens",
]

TOKEN_THRESHOLD = 0.8
"""Least token-set overlap (equality) or answer-token coverage (containment) for text to match."""


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

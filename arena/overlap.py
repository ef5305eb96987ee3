"""Text overlap: word n-grams and their containment, the near-duplicate measure Arena uses twice --
decontamination (``trainer/decontam.py``: a training sample against benchmark test items) and the
novelty of synthesised task instances (``synthesis/eigen/tau2_instances.py``: a new instance
against the tasks it must not repeat)."""

from __future__ import annotations

import re

NGRAM = 5
"""Words per n-gram: BFCL questions are short (a sentence or two), so shorter than the usual 13."""

NEAR_DUPLICATE = 0.5
"""Containment at or above which two texts are near-duplicates."""

NEAR_DUPLICATE_COSINE = 0.9
"""Embedding cosine (``arena.embed``) at or above which two texts are near-duplicates: a paraphrase
shares few n-grams."""

_WORD = re.compile(r"[a-z0-9]+")


def ngrams(text: str, n: int = NGRAM) -> frozenset[str]:
    """The word n-grams of ``text`` (lower-cased alphanumeric words); all its words when fewer than n."""
    words = _WORD.findall(text.lower())
    if not words:
        return frozenset()
    if len(words) < n:
        return frozenset({" ".join(words)})
    return frozenset(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))


def containment(a: frozenset[str], b: frozenset[str]) -> float:
    """Share of the smaller n-gram set the two have in common: a text pasted inside a longer one,
    or cut short, still counts as a near-duplicate."""
    if not a or not b:
        return 0.0
    return len(a & b) / min(len(a), len(b))

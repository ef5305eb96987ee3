"""Language identification of task texts: ``lang(t)`` of ASTRA §2.1.3.

Augmented variants must keep their original's language, so the check needs
to be cheap and stable. ``py3langid`` (a naive-Bayes byte n-gram model that
ships with the package) scores the text after removing what carries no
language (numbers, dates, identifiers, e-mail addresses, URLs, paths, code-like
tokens), restricted to widely used languages with ISO 639-1 codes: regional
varieties and close neighbours (Galician, Catalan, Walloon, Luxembourgish, ...)
otherwise win short Spanish, French or German sentences by a hair. A text with no letters left
gets ``default``, and so does one the model has no evidence on (a uniform
ranking); a short, ambiguous one gets ``default`` when that language is among
the close candidates and the text is in Latin script, so "Book a table" stays
English.
"""

from __future__ import annotations

import re
import threading
from functools import lru_cache
from typing import Any

LANGUAGES: tuple[str, ...] = tuple(
    (
        "en es fr de it pt nl ru zh ja ko ar hi tr pl sv da no fi cs sk el he uk vi id ms th ro hu "
        "fa bn bg hr sr sl lt lv et ur ta te"
    ).split()
)
"""ISO 639-1 codes the detector chooses among."""

SHORT_LETTERS = 24
"""Texts with fewer letters than this (after cleaning) count as short."""
AMBIGUOUS = 0.6
"""Below this top probability a short text is ambiguous."""

_NOISE = re.compile(
    r"https?://\S+"  # URLs
    r"|\S+@\S+"  # e-mail addresses
    r"|(?:[~.]?/[A-Za-z0-9_.-]+)+/?"  # paths
    r"|[A-Za-z0-9._:/+-]*\d[A-Za-z0-9._:/+-]*"  # numbers, dates, ids, times (ASCII runs with a digit)
    r"|\b[A-Za-z0-9]+_[A-Za-z0-9_]+\b"  # snake_case identifiers
    r"|\*\.\w+"  # glob patterns
)
_lock = threading.Lock()


def _identifier() -> Any:
    """The model, loaded once per process and restricted to LANGUAGES.

    The lock is taken before the cache is read: a stage's handler threads all ask for it on their
    first records, and each one that found the cache empty used to load its own copy (2-3
    CPU-seconds each, mostly decompressing the model file).
    """
    with _lock:
        return _load_identifier()


@lru_cache(maxsize=1)
def _load_identifier() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    ident = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    ident.set_languages([code for code in LANGUAGES if code in set(ident.labels)])
    return ident


def clean_text(text: str) -> str:
    """``text`` without tokens that carry no language."""
    return re.sub(r"\s+", " ", _NOISE.sub(" ", text)).strip()


def language_ranking(text: str) -> list[tuple[str, float]]:
    """Candidate languages for ``text`` with probabilities, best first (empty when no letters)."""
    cleaned = clean_text(text)
    if not any(ch.isalpha() for ch in cleaned):
        return []
    ranked: list[tuple[str, float]] = _identifier().rank(cleaned)
    return ranked


def detect_language(text: str, default: str = "en") -> str:
    """ISO 639-1 code of the language ``text`` is written in.

    ``default`` answers for texts without letters, and for short ambiguous texts
    where it is among the three best candidates.
    """
    ranked = language_ranking(text)
    if not ranked:
        return default
    best, prob = ranked[0]
    if prob <= 2.0 / len(ranked):  # no n-gram evidence at all: the ranking is (near) uniform
        return default
    letters = sum(ch.isalpha() for ch in clean_text(text))
    latin = sum(ch.isascii() for ch in clean_text(text) if ch.isalpha()) >= 0.8 * max(letters, 1)
    if latin and letters < SHORT_LETTERS and prob < AMBIGUOUS and default in {c for c, _ in ranked[:3]}:
        return default
    return best


_WORD = re.compile(
    r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|[^\W\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]+"
)


def count_words(text: str) -> int:
    """Words in ``text``; each CJK character counts as one (those scripts use no spaces)."""
    return len(_WORD.findall(text))

"""Small text helpers every layer shares: normalised comparison of names and answers."""

from __future__ import annotations

import unicodedata


def norm(text: object) -> str:
    """Casefolded, whitespace-collapsed text."""
    return " ".join(str(text).split()).casefold()


def fold(text: str) -> str:
    """Lower case without accents (``Hôtel`` -> ``hotel``), for cross-language term matching."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))

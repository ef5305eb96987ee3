"""Small text helpers every layer shares: normalised comparison of names and answers."""

from __future__ import annotations


def norm(text: object) -> str:
    """Casefolded, whitespace-collapsed text."""
    return " ".join(str(text).split()).casefold()

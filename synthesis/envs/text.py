"""Small text helpers every layer shares: normalised comparison of names and answers."""

from __future__ import annotations

from arena.tool_reward import fold

__all__ = ["fold", "norm"]


def norm(text: object) -> str:
    """Casefolded, whitespace-collapsed text."""
    return " ".join(str(text).split()).casefold()

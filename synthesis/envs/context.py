"""Context budgets of the environment track's roles (``arena.llm.routing.budget_for``).

Stage helpers also take a bare ``EnvSettings`` (tests, library use); without the endpoint settings
a role gets the default window, ``DEFAULT_CONTEXT_TOKENS``, less its kind's reply budget.
"""

from __future__ import annotations

from arena.config import ArenaSettings, EnvSettings
from arena.llm.budget import ContextBudget
from arena.llm.routing import KIND_DEFAULTS, budget_for, kind_of

DEFAULT_CONTEXT_TOKENS = 32768
"""The window assumed when only ``EnvSettings`` are given (``llm_context_tokens``' default)."""


def role_budget(settings: ArenaSettings | EnvSettings, role: str) -> ContextBudget:
    """The prompt budget of ``role`` under ``settings``."""
    if isinstance(settings, ArenaSettings):
        return budget_for(settings, role)
    reply = int(KIND_DEFAULTS[kind_of(role)]["max_tokens"])
    return ContextBudget(context_tokens=DEFAULT_CONTEXT_TOKENS, reply_tokens=reply)

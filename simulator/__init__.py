"""The ``rules`` backend's synthesiser: one deterministic function per role.

A rule gets the role's typed input and a seeded ``random.Random`` and returns
the role's typed output, or raises ``arena.llm.core.Undecidable``. Rules see
exactly what an LLM would see (the role input), nothing more.

A module of this package registers its rules by defining ``RULES`` (role name -> rule):
adding a role's rule touches one file here and nothing that lists rules.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable

from pydantic import BaseModel

from arena.plugins import modules

RuleFn = Callable[[BaseModel, random.Random], BaseModel]


def _collect() -> dict[str, RuleFn]:
    found: dict[str, RuleFn] = {}
    for module in modules(sys.modules[__name__]):
        for role, rule in getattr(module, "RULES", {}).items():
            if role in found:
                raise ValueError(f"two rules for role {role!r} (the second in {module.__name__})")
            found[role] = rule
    return found


RULES: dict[str, RuleFn] = _collect()
"""Role name -> its rule, from every module of the simulator."""

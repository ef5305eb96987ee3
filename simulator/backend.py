"""The ``rules`` backend: runs a role's rule function instead of an LLM.

A rule gets the role's typed input and a ``random.Random`` seeded from (backend seed, role,
input, attempt), so the same call always gives the same output and a retry after an invalid or
undecidable output gets a fresh draw. Its usage is estimated from the rendered messages and the
answer text (``arena.llm.budget.estimated_usage``), so token metrics and ``llm.usage`` count it as
they count a real model's.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from pydantic import BaseModel

from arena.hashing import content_hash
from arena.llm.budget import estimated_usage
from arena.llm.core import Completion, CompletionRequest

if TYPE_CHECKING:
    from arena.config import ArenaSettings
    from arena.llm.backends import LlmTarget

RuleFn = Callable[[BaseModel, random.Random], BaseModel]


class UnknownRole(LookupError):
    """The rules backend has no rule for a role (a wiring bug, not a retryable failure)."""


class RulesBackend:
    """Deterministic, seeded rule-based synthesis behind the Backend protocol."""

    name = "rules"
    model = "rules-v1"

    def __init__(self, seed: int = 0, rules: Mapping[str, RuleFn] | None = None) -> None:
        if rules is None:
            # Imported here: the rule modules are this package's bulk; a backend with custom rules
            # (tests) does not need them.
            from simulator import RULES

            rules = RULES
        self.seed = seed
        self._rules: dict[str, RuleFn] = dict(rules)

    def __repr__(self) -> str:
        return f"RulesBackend(seed={self.seed}, roles={len(self._rules)})"

    def rng_for(self, request: CompletionRequest) -> random.Random:
        """The generator a rule gets for ``request``: one stream per (seed, role, input, attempt)."""
        key = content_hash(
            {
                "seed": self.seed,
                "role": request.role.name,
                "inputs": request.inputs.model_dump(mode="json"),
                "attempt": request.attempt,
            },
            length=16,
        )
        return random.Random(int(key, 16))

    async def complete(self, request: CompletionRequest) -> Completion:
        rule = self._rules.get(request.role.name)
        if rule is None:
            known = ", ".join(sorted(self._rules)) or "none"
            raise UnknownRole(
                f"the rules backend has no rule for role {request.role.name!r} (known: {known})"
            )
        # Rules are plain CPU code; keep them off the event loop. ``Undecidable`` propagates.
        output = await asyncio.to_thread(rule, request.inputs, self.rng_for(request))
        text = output.model_dump_json()
        return Completion(text=text, usage=estimated_usage(request.messages, request.tools, text))

    async def aclose(self) -> None:
        return None


def from_target(target: LlmTarget, settings: ArenaSettings) -> RulesBackend:
    """The ``rules`` entry point (``ARENA_LLM=rules``): every role's rule, seeded by ``settings.seed``."""
    return RulesBackend(seed=settings.seed)

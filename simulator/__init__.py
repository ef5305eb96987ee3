"""The ``rules`` backend's synthesiser: one deterministic function per role.

A rule gets the role's typed input and a seeded ``random.Random`` and returns
the role's typed output, or raises ``arena.llm.core.Undecidable``. Rules see
exactly what an LLM would see (the role input), nothing more.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pydantic import BaseModel

from simulator import (
    agent,
    chains,
    eigen,
    eigen_dialogs,
    eigen_orchestration,
    emulation,
    envs,
    judges,
    prose_qa,
    qa_judges,
    tasks,
    user_sim,
)

RuleFn = Callable[[BaseModel, random.Random], BaseModel]

RULES: dict[str, RuleFn] = {
    **chains.RULES,
    **tasks.RULES,
    **emulation.RULES,
    **agent.RULES,
    **judges.RULES,
    **envs.RULES,
    **prose_qa.RULES,  # qa_synthesis: tables (simulator.qa) or prose
    **qa_judges.RULES,
    **user_sim.RULES,
    **eigen.RULES,
    **eigen_dialogs.RULES,
    **eigen_orchestration.RULES,
}

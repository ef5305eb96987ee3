"""Per-role generation settings and endpoints: which model answers a role, and how it samples.

Every role has a *kind* (``ROLE_KINDS``): generators write new data and are sampled; judges and
verifiers decide and are deterministic (temperature 0); the tool emulator must answer the same call
the same way (temperature 0); the agent and the user simulator act in dialogues and are sampled.
``settings.llm_roles`` (``ARENA_LLM_ROLES``, JSON, or ``[llm_roles.<name>]`` tables in arena.toml)
overrides any field for a role or for a whole kind; a role's own entry wins over its kind's, which
wins over ``ROLE_DEFAULTS`` and ``KIND_DEFAULTS``. An entry with ``llm`` sends the role to another
endpoint (e.g. a larger judge model), with ``context_tokens`` its window when it differs from
``llm_context_tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arena.llm.budget import ContextBudget
from arena.llm.core import Sampling

if TYPE_CHECKING:
    from arena.config import ArenaSettings, RoleKind

JUDGES = frozenset(
    {
        "chain_coherence",
        "score_task",
        "judge_query_understanding",
        "judge_query_planning",
        "judge_round_understanding",
        "judge_round_planning",
        "judge_call_conciseness",
        "judge_answer_correlation",
        "judge_answer_summary",
        "qa_tool_need",
        "qa_dependency",
        "qa_atomicity",
        "qa_sequence",
        "qa_completeness",
        "eigen_task_validation",
        "eigen_trajectory_validation",
        "eigen_judge",
    }
)
"""Roles that judge or verify: deterministic by default."""
ROLE_KIND_OF: dict[str, RoleKind] = {
    **dict.fromkeys(JUDGES, "judge"),
    "tool_emulation": "emulator",
    "agent_policy": "agent",
    "eigen_trajectory_agent": "agent",
    "user_simulator": "user",
}
"""Roles that are not generators, by name (every other role is a generator)."""

KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    "generator": {"temperature": 0.7, "top_p": 0.95, "max_tokens": 2048},
    "judge": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 1024},
    "emulator": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 1024},
    "agent": {"temperature": 0.7, "top_p": 0.95, "max_tokens": 1024},
    "user": {"temperature": 0.7, "top_p": 0.95, "max_tokens": 512},
}
"""Sampling of each kind unless configured (documented in docs/models.md's per-role table)."""


ROLE_DEFAULTS: dict[str, dict[str, Any]] = {
    "eigen_prompt_engineer": {"max_tokens": 8192},
}
"""Roles whose replies are long by nature, over their kind's default: the prompt engineer writes a
whole prompt set (the rules simulator's run to about 24,000 characters)."""


def kind_of(role: str) -> RoleKind:
    """The kind of the role named ``role``."""
    return ROLE_KIND_OF.get(role, "generator")


@dataclass(frozen=True)
class RoleRoute:
    """Where a role's requests go and how they sample."""

    role: str
    kind: str
    sampling: Sampling
    """The role's sampling (seed: the role's, else the global seed)."""
    llm: str
    """The endpoint (an ARENA_LLM form)."""
    context_tokens: int
    """The endpoint's context window."""

    @property
    def budget(self) -> ContextBudget:
        return ContextBudget(context_tokens=self.context_tokens, reply_tokens=self.sampling.max_tokens)


def route_of(settings: ArenaSettings, role: str) -> RoleRoute:
    """The route of ``role`` under ``settings`` (its entry, then its kind's, then the defaults)."""
    kind = kind_of(role)
    fields: dict[str, Any] = {**KIND_DEFAULTS[kind], **ROLE_DEFAULTS.get(role, {}), "seed": settings.seed}
    llm, context = settings.llm, settings.llm_context_tokens
    for key in (kind, role):  # the role's own entry wins
        entry = settings.llm_roles.get(key)
        if entry is None:
            continue
        fields.update(
            entry.model_dump(
                include={"temperature", "top_p", "max_tokens", "stop", "seed"}, exclude_none=True
            )
        )
        if entry.llm is not None:
            llm = entry.llm
            context = entry.context_tokens or context
        elif entry.context_tokens is not None:
            context = entry.context_tokens
    return RoleRoute(role=role, kind=kind, sampling=Sampling(**fields), llm=llm, context_tokens=context)


def budget_for(settings: ArenaSettings, role: str) -> ContextBudget:
    """The context budget of ``role``: its endpoint's window less its reply budget."""
    return route_of(settings, role).budget

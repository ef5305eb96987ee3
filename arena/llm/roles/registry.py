"""Every role by name: how a server in front of a backend (``arena llm serve``) knows what it is asked.

Arena's ``openai://`` client names the role in ``response_format.json_schema.name`` and sends the
role's input as JSON inside its prompt template (``Role.messages``); with this registry and
``Role.inputs_from`` a server recovers the typed input, so a backend that needs it (the ``rules``
simulator) can answer over HTTP exactly as it answers in process.
"""

from __future__ import annotations

from typing import Any

from arena.llm.core import Role
from arena.llm.roles import (
    agent,
    chains,
    eigen,
    eigen_dialogs,
    eigen_orchestration,
    emulation,
    envs,
    judges,
    qa,
    tasks,
    user_sim,
)

ROLES: dict[str, Role[Any, Any]] = {
    role.name: role
    for role in (
        agent.AGENT_POLICY,
        chains.CHAIN_SYNTHESIS,
        chains.TASK_FROM_CHAIN,
        chains.CHAIN_COHERENCE,
        tasks.TASK_FROM_SERVER,
        tasks.AUGMENT_TASK,
        tasks.SCORE_TASK,
        emulation.TOOL_EMULATION,
        judges.QUERY_UNDERSTANDING,
        judges.QUERY_PLANNING,
        judges.ROUND_UNDERSTANDING,
        judges.ROUND_PLANNING,
        judges.CALL_CONCISENESS,
        judges.ANSWER_CORRELATION,
        judges.ANSWER_SUMMARY,
        qa.QA_SYNTHESIS,
        qa.QA_TOOL_NEED,
        qa.QA_DEPENDENCY,
        qa.QA_ATOMICITY,
        qa.QA_SEQUENCE,
        qa.QA_COMPLETENESS,
        envs.TOOL_SPEC,
        envs.TOOL_SCALING,
        envs.TOOL_INVOCATION,
        envs.TOOL_IMPLEMENTATION,
        envs.HOMOGENEOUS_GROUPS,
        envs.MERGE_INVOCATION,
        user_sim.USER_SIMULATOR,
        eigen.EIGEN_RANDOM_POOL,
        eigen.EIGEN_USER_INTENT,
        eigen.EIGEN_TASK_VALIDATION,
        eigen.EIGEN_MODIFY,
        eigen_dialogs.EIGEN_TRAJECTORY_AGENT,
        eigen_dialogs.EIGEN_TRAJECTORY_VALIDATION,
        eigen_orchestration.EIGEN_PLANNER,
        eigen_orchestration.EIGEN_PROMPT_ENGINEER,
        eigen_orchestration.EIGEN_JUDGE,
    )
}
"""Role name -> role (its input and output models and its prompt template)."""

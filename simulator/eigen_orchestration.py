"""Rules EigenData orchestration roles: Planner, Prompt Engineer, Judge.

Deterministic given the role input and the rng (seeded by the backend from the input):

- ``eigen_planner``: the standard seven-worker workflow of §4.2 as a DAG (each worker reads the
  artifacts of the ones before it); VerificationFunction is skipped when only SFT data is asked.
- ``eigen_prompt_engineer``: a new set picks, with the rng, a diversity focus (``AXES``: a
  task-kind mix, a persona mix, a difficulty pattern) that no earlier set's summary names, narrows
  the generator parameters to it and writes every worker's prompt from its base prompt + the focus
  + the domain's tools and rules + the earlier sets' summaries (to avoid). A revision keeps the
  focus and rewrites the guidance section of every prompt from the Judge's edits.
- ``eigen_judge``: scores the four axes from the batch metrics and derives the updates from the
  measured failure shares: tasks failing on missing resources lower ``error_prone_parameters``,
  on policy violations (or contradictions) lower ``policy_pressure`` -- each by the ratio of the
  target share to the observed one, at least 40% --, schema errors become negative examples for
  UserIntent, and low coverage widens ``task_kinds``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from arena.llm.roles.eigen import GOAL_TEMPLATES
from arena.llm.roles.eigen_orchestration import (
    EIGEN_JUDGE,
    EIGEN_PLANNER,
    EIGEN_PROMPT_ENGINEER,
    WORKERS,
    Critique,
    CritiqueScores,
    GenerationRequest,
    JudgeInput,
    ParamUpdate,
    PromptEdit,
    PromptEngineerInput,
    PromptSetDraft,
    WorkerNode,
    WorkerPrompt,
    WorkflowPlan,
)

GUIDANCE_HEADER = "\n\nGuidance from pilot critiques (follow it):"
FOCUS_HEADER = "\n\nPrompt set focus:"

# --------------------------------------------------------------------------- Planner

_IO: dict[str, tuple[list[str], list[str], list[str]]] = {
    "RandomPool": (["domain", "pool_params", "seed"], ["scenario_seed"], []),
    "UserIntent": (["scenario_seed", "domain", "state_slice"], ["task"], ["RandomPool"]),
    "TaskValidation": (["task", "probe_evidence"], ["task_verdict", "validated_task"], ["UserIntent"]),
    "DialogSynthesis": (["validated_task", "domain"], ["dialog"], ["TaskValidation"]),
    "TrajectoryValidation": (["dialog", "validated_task"], ["trajectory_verdict"], ["DialogSynthesis"]),
    "Modify": (
        ["task", "task_verdict", "dialog", "trajectory_verdict"],
        ["repaired_task", "repaired_dialog"],
        ["TaskValidation", "TrajectoryValidation"],
    ),
    "VerificationFunction": (
        ["accepted_dialog", "final_state"],
        ["verification_function"],
        ["TrajectoryValidation", "Modify"],
    ),
}


def planner(inputs: BaseModel, rng: random.Random) -> WorkflowPlan:
    assert isinstance(inputs, GenerationRequest)
    sft_only = set(inputs.outputs) == {"sft"}
    workers = []
    for name, role in WORKERS:
        if name == "VerificationFunction" and sft_only:
            continue
        reads, writes, deps = _IO[name]
        workers.append(WorkerNode(name=name, role=role, inputs=reads, outputs=writes, depends_on=deps))
    rationale = (
        f"Standard EigenData workflow for {inputs.domain.name} ({inputs.size} instances, "
        f"{inputs.difficulty} difficulty, diversity over {inputs.diversity})"
        + (
            "; no verification functions: SFT only."
            if sft_only
            else "; verification functions as RL rewards."
        )
    )
    plan = WorkflowPlan(workers=workers, rationale=rationale)
    plan.check()
    return plan


# --------------------------------------------------------------------------- Prompt Engineer

AXES: tuple[dict[str, Any], ...] = (
    {
        "focus": "order changes before shipment",
        "kinds": ["cancel_order", "update_order_address"],
        "personas": ["frequent buyer", "weekend hiker"],
        "tweaks": {"ambiguity": 0.2},
        "text": "cancellations and address changes on orders that have not shipped, with terse customers",
    },
    {
        "focus": "returns and damaged-item refunds",
        "kinds": ["return_items", "issue_refund"],
        "personas": ["parent shopping for kids", "gear reviewer"],
        "tweaks": {"branching": 0.5},
        "text": "returns inside the window and refunds for damaged items, with conditional fallbacks",
    },
    {
        "focus": "goodwill credit and deceptive customers",
        "kinds": ["issue_store_credit", "issue_refund", "cancel_order"],
        "personas": ["frequent buyer", "gear reviewer"],
        "tweaks": {"deception": 0.6},
        "text": "store-credit requests near the monthly cap, customers who misstate facts or press",
    },
    {
        "focus": "ambiguous multi-order requests",
        "kinds": [],
        "personas": ["parent shopping for kids", "weekend hiker"],
        "tweaks": {"ambiguity": 0.7, "min_calls": 6},
        "text": "customers who describe products instead of giving ids, several orders in one call",
    },
    {
        "focus": "long-horizon mixed tasks for experts",
        "kinds": [],
        "personas": ["gear reviewer", "frequent buyer"],
        "tweaks": {"min_calls": 7, "max_calls": 12},
        "text": "long tasks mixing every request kind, precise expert customers",
    },
)
"""Phase-1 diversity axes: a task-kind mix, a persona mix and a difficulty pattern each."""


def _generic_prompt(name: str, role: str) -> str:
    return (
        f"You are the {name} agent ({role}) of the EigenData execution layer. Follow the domain "
        "policy, use only the domain's tools with schema-valid arguments, and return one JSON object "
        "matching the schema."
    )


def _with_guidance(text: str, guidance: list[str]) -> str:
    base = text.split(GUIDANCE_HEADER, 1)[0]
    if not guidance:
        return base
    return base + GUIDANCE_HEADER + "".join(f"\n- {g}" for g in dict.fromkeys(guidance))


def prompt_engineer(inputs: BaseModel, rng: random.Random) -> PromptSetDraft:
    assert isinstance(inputs, PromptEngineerInput)
    domain = inputs.domain
    tools = {t.name for t in domain.tools}
    available = [k for k in GOAL_TEMPLATES if k in tools]
    earlier_ids = [e.set_id for e in inputs.earlier]
    if inputs.current:  # revision: keep the focus, rewrite the guidance section
        prompts = [
            WorkerPrompt(worker=p.worker, system=_with_guidance(p.system, inputs.guidance))
            for p in inputs.current
        ]
        focus = inputs.focus or "revised"
        return PromptSetDraft(
            focus=focus,
            prompts=prompts,
            params=inputs.params,
            summary=f"Set {inputs.set_index} ({focus}), revised with {len(inputs.guidance)} guidance line(s).",
            conditioned_on=earlier_ids,
        )
    used = {e.focus for e in inputs.earlier}
    fresh = [a for a in AXES if a["focus"] not in used]
    if fresh:
        axis = dict(rng.choice(fresh))
    else:  # more sets than axes: a seeded variation of one, named apart
        axis = dict(AXES[inputs.set_index % len(AXES)])
        axis["focus"] = f"{axis['focus']} (variant {inputs.set_index})"
        axis["tweaks"] = {**axis["tweaks"], "deception": round(rng.uniform(0.1, 0.7), 2)}
    kinds = [k for k in axis["kinds"] if k in available]
    personas = [p for p in inputs.params.personas if p.role in axis["personas"]] or list(
        inputs.params.personas
    )
    update: dict[str, Any] = {"task_kinds": kinds, "personas": [p.model_copy() for p in personas]}
    for key, value in axis["tweaks"].items():
        update[key] = value
    merged = {**inputs.params.model_dump(), **update}
    merged["max_calls"] = max(merged["max_calls"], merged["min_calls"])
    params = type(inputs.params).model_validate(merged)
    persona_roles = [p.role for p in params.personas]
    rules = "; ".join(f"{r.name} ({r.description})" for r in domain.rules) or "none"
    lines = [
        f"{FOCUS_HEADER} {axis['focus']} -- {axis['text']}.",
        f"Personas: {', '.join(persona_roles)}. Task kinds: {', '.join(kinds) or 'all of ' + ', '.join(available)}.",
        f"Domain tools: {', '.join(sorted(tools))}. Policy rules checked as code: {rules}.",
    ]
    if inputs.earlier:
        lines.append("Earlier prompt sets already cover these; do not repeat their focus:")
        lines += [f"- {e.set_id} ({e.focus}): {e.summary}" for e in inputs.earlier]
    section = "\n".join(lines)
    base = {p.worker: p.system for p in inputs.base_prompts}
    prompts = [
        WorkerPrompt(
            worker=w.role,
            system=_with_guidance(base.get(w.role) or _generic_prompt(w.name, w.role), [])
            + section
            + (GUIDANCE_HEADER + "".join(f"\n- {g}" for g in inputs.guidance) if inputs.guidance else ""),
        )
        for w in inputs.plan.workers
    ]
    summary = (
        f"Focus: {axis['focus']} ({axis['text']}); personas {', '.join(persona_roles)}; "
        f"task kinds {', '.join(kinds) or 'all'}; "
        f"ambiguity {params.ambiguity}, deception {params.deception}, calls {params.min_calls}-{params.max_calls}."
    )
    return PromptSetDraft(
        focus=axis["focus"], prompts=prompts, params=params, summary=summary, conditioned_on=earlier_ids
    )


# --------------------------------------------------------------------------- Judge

KNOBS = {
    "missing_resource": "error_prone_parameters",
    "policy_violation": "policy_pressure",
    "contradictory_constraints": "policy_pressure",
}
"""Failure category -> the generator parameter that produces it."""
CONSTRAINTS = {
    "missing_resource": (
        "Use only ids that exist in the database slice; put an id from context.nonexistent_ids in a "
        "goal only when difficulty.error_prone_parameters is set."
    ),
    "policy_violation": (
        "Check every goal against the policy before writing it; ask for a forbidden action only when "
        "difficulty.policy_violation is set."
    ),
    "contradictory_constraints": "Do not combine requirements that exclude each other.",
}
MIN_CUT = 0.4
"""A knob the Judge lowers drops by at least this fraction."""


def judge(inputs: BaseModel, rng: random.Random) -> Critique:
    assert isinstance(inputs, JudgeInput)
    m, t, params = inputs.metrics, inputs.targets, inputs.params
    calls_fill = min(1.0, m.mean_required_calls / max(1, params.max_calls))
    scores = CritiqueScores(
        executability=round(1.0 - m.infeasibility, 4),
        tool_correctness=round(m.tool_call_validity, 4),
        trajectory_coherence=round(m.quality, 4),
        difficulty_coverage=round(0.5 * m.coverage + 0.5 * calls_fill, 4),
    )
    findings: list[str] = []
    updates: dict[str, ParamUpdate] = {}
    edits: list[PromptEdit] = []
    feasible_enough = m.infeasibility <= t.max_infeasibility
    valid_enough = m.tool_call_validity >= t.min_validity
    if not feasible_enough:
        findings.append(
            f"infeasibility {m.infeasibility:.2f} above target {t.max_infeasibility:.2f}: "
            + ", ".join(f"{c} {s:.2f}" for c, s in sorted(m.failure_shares.items()) if s > 0)
        )
        target = t.max_infeasibility / 2
        for category, share in sorted(m.failure_shares.items(), key=lambda kv: -kv[1]):
            if share <= 0:
                continue
            if category in CONSTRAINTS:
                edits.append(
                    PromptEdit(worker="eigen_user_intent", kind="add_constraint", text=CONSTRAINTS[category])
                )
            knob = KNOBS.get(category)
            if knob is None:
                continue
            old = float(updates[knob].value if knob in updates else getattr(params, knob))
            if old <= 0:
                continue
            new = round(old * min(1.0 - MIN_CUT, target / share), 3)
            updates[knob] = ParamUpdate(
                name=knob,  # type: ignore[arg-type]
                value=new,
                previous=getattr(params, knob),
                reason=f"{share:.0%} of the batch failed on {category}",
            )
        for example in m.examples[:1]:
            edits.append(
                PromptEdit(
                    worker="eigen_user_intent", kind="negative_example", text=f"Avoid tasks like: {example}"
                )
            )
    if not valid_enough or m.schema_errors:
        findings.append(
            f"tool-call validity {m.tool_call_validity:.2f}; schema errors: {m.schema_errors[:3]}"
        )
        for error in m.schema_errors[:3]:
            edits.append(
                PromptEdit(worker="eigen_user_intent", kind="negative_example", text=f"Never: {error}")
            )
    if m.coverage < t.min_coverage and params.task_kinds:
        widened = sorted(set(params.task_kinds) | set(m.kinds_available))
        findings.append(f"coverage {m.coverage:.2f} below {t.min_coverage:.2f}: only {m.kinds_seen}")
        updates["task_kinds"] = ParamUpdate(
            name="task_kinds",
            value=widened,
            previous=list(params.task_kinds),
            reason="low task-kind coverage",
        )
    if m.quality < 0.5:
        findings.append(f"task quality {m.quality:.2f} is low")
        edits.append(
            PromptEdit(
                worker="eigen_user_intent",
                kind="style",
                text="Write every requirement in the persona's tone, with rubrics and hidden subgoals.",
            )
        )
    converged = feasible_enough and valid_enough
    if converged:
        findings.append("every target met")
    return Critique(
        scores=scores,
        findings=findings,
        param_updates=[] if converged else list(updates.values()),
        prompt_edits=[] if converged else edits,
        converged=converged,
    )


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    EIGEN_PLANNER.name: planner,
    EIGEN_PROMPT_ENGINEER.name: prompt_engineer,
    EIGEN_JUDGE.name: judge,
}

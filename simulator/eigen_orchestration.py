"""Rules EigenData orchestration roles: Planner, Prompt Engineer, Judge.

Deterministic given the role input and the rng (seeded by the backend from the input):

- ``eigen_planner``: the standard seven-worker workflow of §4.2 as a DAG (each worker reads the
  artifacts of the ones before it); VerificationFunction is skipped when only SFT data is asked.
  Replanning from a ``PlanReview``: Modify is dropped when no item of the last batch needed repair
  and put back when some did; RandomPool and UserIntent are frozen (``evolve=False``) while the
  tasks meet the infeasibility and validity targets, so the dialogue workers evolve against fixed
  tasks, and thawed when they stop meeting them.
- ``eigen_prompt_engineer``: a new set picks, with the rng, a diversity focus (``AXES``: a
  task-kind mix, a persona mix, a difficulty pattern) that no earlier set's summary names, narrows
  the generator parameters to it and writes every worker's prompt from its base prompt + the focus
  + the domain's tools and rules + the earlier sets' summaries (to avoid) -- one prompt per
  prompted role of every planned worker (``PROMPTED_ROLES``). A revision keeps the focus and
  rewrites the guidance section of exactly the prompts ``worker_guidance`` names.
- ``eigen_judge``: scores the four axes from the batch metrics and derives the updates from the
  measured failure shares: tasks failing on missing resources lower ``error_prone_parameters``,
  on policy violations (or contradictions) lower ``policy_pressure`` -- each by the ratio of the
  target share to the observed one, at least 40% --, schema errors become negative examples for
  UserIntent, and low coverage widens ``task_kinds``. Each sampled failing artifact becomes an
  edit for the role its diagnosis blames (``failure_edits``): dialogue schema / grounding / policy
  / unmet-goal findings the TrajectoryAgent, premature endings and unrealistic user turns the user
  simulator, goals the tools refused in a dialogue the UserIntent and TaskValidation prompts,
  failures that survived Modify rounds the Modify prompt, and dialogues the verification function
  rejected after TrajectoryValidation passed them the TrajectoryValidation prompt. Only roles in
  ``workers`` get edits.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from synthesis.eigen.roles.orchestration import (
    EIGEN_JUDGE,
    EIGEN_PLANNER,
    EIGEN_PROMPT_ENGINEER,
    PROMPTED_ROLES,
    WORKERS,
    Critique,
    CritiqueScores,
    FailureSample,
    GenerationRequest,
    JudgeInput,
    ParamUpdate,
    PlanReview,
    PromptEdit,
    PromptEngineerInput,
    PromptSetDraft,
    WorkerPrompt,
    WorkflowPlan,
    standard_plan,
)
from synthesis.eigen.roles.tasks import template_kinds

GUIDANCE_HEADER = "\n\nGuidance from pilot critiques (follow it):"
FOCUS_HEADER = "\n\nPrompt set focus:"

# --------------------------------------------------------------------------- Planner


def _replan(review: PlanReview) -> WorkflowPlan:
    previous, t = review.plan, review.targets
    names = set(previous.names)
    evolve = {w.name: w.evolve for w in previous.workers}
    notes: list[str] = []
    if "Modify" in names and review.needed_repair == 0:
        names.discard("Modify")
        notes.append(f"no item of iteration {review.iteration} needed repair: Modify skipped")
    elif "Modify" not in names and review.needed_repair > 0:
        names.add("Modify")
        notes.append(
            f"{review.needed_repair} item(s) of iteration {review.iteration} needed repair: Modify back"
        )
    # Unmeasured infeasibility (no TaskValidation) is no evidence the tasks are fine: nothing freezes.
    tasks_ok = (
        review.infeasibility is not None
        and review.infeasibility <= t.max_infeasibility
        and review.tool_call_validity >= t.min_validity
    )
    for name in ("RandomPool", "UserIntent"):
        if evolve.get(name, True) == tasks_ok:
            evolve[name] = not tasks_ok
            notes.append(
                f"tasks {'meet' if tasks_ok else 'miss'} the targets (infeasibility "
                f"{'unmeasured' if review.infeasibility is None else f'{review.infeasibility:.2f}'}, "
                f"validity {review.tool_call_validity:.2f}): "
                f"{name} prompts {'frozen' if tasks_ok else 'evolving again'}"
            )
    rationale = "; ".join(notes) if notes else f"plan kept after iteration {review.iteration}"
    return standard_plan(names, evolve, rationale)


def planner(inputs: BaseModel, rng: random.Random) -> WorkflowPlan:
    assert isinstance(inputs, GenerationRequest)
    if inputs.review is not None:
        return _replan(inputs.review)
    sft_only = set(inputs.outputs) == {"sft"}
    names = {name for name, _ in WORKERS if not (name == "VerificationFunction" and sft_only)}
    rationale = (
        f"Standard EigenData workflow for {inputs.domain.name} ({inputs.size} instances, "
        f"{inputs.difficulty} difficulty, diversity over {inputs.diversity})"
        + (
            "; no verification functions: SFT only."
            if sft_only
            else "; verification functions as RL rewards."
        )
    )
    return standard_plan(names, {}, rationale)


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
    available = template_kinds(domain)
    earlier_ids = [e.set_id for e in inputs.earlier]
    if inputs.current:  # revision: keep the focus, rewrite the guidance section of the prompts named
        if inputs.worker_guidance:
            prompts = [
                WorkerPrompt(
                    worker=p.worker, system=_with_guidance(p.system, inputs.worker_guidance[p.worker])
                )
                if p.worker in inputs.worker_guidance
                else p
                for p in inputs.current
            ]
        else:
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
            worker=role,
            system=_with_guidance(base.get(role) or _generic_prompt(w.name, role), [])
            + section
            + (GUIDANCE_HEADER + "".join(f"\n- {g}" for g in inputs.guidance) if inputs.guidance else ""),
        )
        for w in inputs.plan.workers
        for role in PROMPTED_ROLES.get(w.name, (w.role,))
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

AGENT, USER, TASK_CHECK, MODIFY, DIALOG_CHECK = (
    "eigen_trajectory_agent",
    "user_simulator",
    "eigen_task_validation",
    "eigen_modify",
    "eigen_trajectory_validation",
)
DIALOG_EDITS: dict[str, tuple[str, str, str]] = {
    "schema": (AGENT, "negative_example", "Never call a tool like this ({what}); follow its schema exactly."),
    "grounding": (AGENT, "negative_example", "State only what a tool returned; not like this: {what}."),
    "policy": (AGENT, "add_constraint", "Check the policy before every write; this broke it: {what}."),
    "must_not": (
        AGENT,
        "add_constraint",
        "Refuse what the policy forbids and never take an action the customer did not ask for.",
    ),
    "goal": (
        AGENT,
        "add_constraint",
        "Carry out every action the customer asks for and confirm it from the tool output before closing.",
    ),
    "early_end": (
        USER,
        "add_constraint",
        "Do not end the conversation while an action you asked for is still undone; ask about it again.",
    ),
    "user_realism": (
        USER,
        "style",
        "Write a new message each turn in the persona's own words; never paste the private instructions.",
    ),
    "agent_realism": (AGENT, "style", "Do not repeat a message or a call; move the conversation forward."),
}
"""Diagnosis kind -> (the role blamed, the edit kind, the edit text; ``{what}`` is the finding)."""


def _dialog_kind(category: str, diagnosis: str, end_signal: str) -> list[str]:
    """The ``DIALOG_EDITS`` kinds a failing dialogue's finding of ``category`` calls for."""
    text = diagnosis.lower()
    if category == "goal":
        if "must-not" in text or "not asked for" in text:
            return ["must_not"]
        return ["goal", "early_end"] if end_signal in ("stop", "transfer", "out_of_scope") else ["goal"]
    if category == "realism":
        return ["agent_realism"] if "assistant" in text else ["user_realism"]
    return [category] if category in DIALOG_EDITS else []


def _refused_goal(failure: FailureSample) -> str | None:
    """A failed call of a goal function, when the dialogue's unmet goal is one the tools refused."""
    for reason in failure.diagnosis:
        if "not achieved" not in reason:
            continue
        for call in failure.failed_calls:
            if call.split(":", 1)[0] in reason:
                return call
    return None


def failure_edits(failures: list[FailureSample]) -> list[PromptEdit]:
    """The per-role prompt edits the sampled failing artifacts call for (module docstring)."""
    edits: list[PromptEdit] = []
    for failure in failures:
        first = failure.diagnosis[0] if failure.diagnosis else failure.stage
        if failure.stage == "trajectory_validation":
            for category, reason in zip(failure.categories, failure.diagnosis, strict=False):
                for kind in _dialog_kind(category, reason, failure.end_signal):
                    role, edit_kind, text = DIALOG_EDITS[kind]
                    edits.append(PromptEdit(worker=role, kind=edit_kind, text=text.format(what=reason[:160])))  # type: ignore[arg-type]
            refused = _refused_goal(failure)
            if refused is not None:  # an infeasible task reached the dialogue: its writer and its checker
                edits.append(
                    PromptEdit(
                        worker="eigen_user_intent",
                        kind="negative_example",
                        text=f"Write only goals the tools can carry out on this state; not like this: {refused[:160]}",
                    )
                )
                edits.append(
                    PromptEdit(
                        worker=TASK_CHECK,
                        kind="add_constraint",
                        text="Probe every goal call on the current state and mark the task INFEASIBLE when "
                        f"the tools refuse one; a passed task failed in its dialogue on: {refused[:160]}",
                    )
                )
        elif failure.stage == "verification":
            edits.append(
                PromptEdit(
                    worker=DIALOG_CHECK,
                    kind="add_constraint",
                    text="Pass a dialogue only when its calls leave the state the task asks for; the "
                    f"verification function rejected one you passed: {first[:160]}",
                )
            )
        if failure.repair_rounds > 0 and not failure.repaired and failure.stage != "verification":
            edits.append(
                PromptEdit(
                    worker=MODIFY,
                    kind="add_constraint",
                    text="A repair must remove the cause the validator named (drop or rewrite the goal "
                    f"it blames), not reword it; still failing after {failure.repair_rounds} round(s): "
                    f"{first[:120]}",
                )
            )
    return edits


def judge(inputs: BaseModel, rng: random.Random) -> Critique:
    assert isinstance(inputs, JudgeInput)
    m, t, params = inputs.metrics, inputs.targets, inputs.params
    # Without TaskValidation (infeasibility unmeasured) the dialogues are the executability evidence.
    infeasibility = m.infeasibility if m.infeasibility is not None else 0.0
    executed = m.verified_share if m.verified_share is not None else m.dialogue_pass_rate
    executability = 1.0 - m.infeasibility if m.infeasibility is not None else float(executed or 0.0)
    calls_fill = min(1.0, m.mean_required_calls / max(1, params.max_calls))
    scores = CritiqueScores(
        executability=round(executability, 4),
        tool_correctness=round(m.tool_call_validity, 4),
        trajectory_coherence=round(m.quality, 4),
        difficulty_coverage=round(0.5 * m.coverage + 0.5 * calls_fill, 4),
    )
    findings: list[str] = []
    updates: dict[str, ParamUpdate] = {}
    edits: list[PromptEdit] = []
    feasible_enough = infeasibility <= t.max_infeasibility
    valid_enough = m.tool_call_validity >= t.min_validity
    if not feasible_enough:
        findings.append(
            f"infeasibility {infeasibility:.2f} above target {t.max_infeasibility:.2f}: "
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
    from_failures = failure_edits(inputs.failures)
    for stage in sorted({f.stage for f in inputs.failures}):
        shown = [f for f in inputs.failures if f.stage == stage]
        findings.append(
            f"{len(shown)} sampled {stage} failure(s), e.g. {'; '.join(shown[0].diagnosis[:2])[:200]}"
        )
    dialogues_ok = m.dialogue_pass_rate is None or m.dialogue_pass_rate >= t.min_dialogue_pass_rate
    if not dialogues_ok:
        findings.append(f"dialogue pass rate {m.dialogue_pass_rate:.2f} below {t.min_dialogue_pass_rate:.2f}")
    converged = feasible_enough and valid_enough and dialogues_ok
    if converged:  # the rates are on target: only what the sampled failures show is still worth an edit
        findings.append("every target met")
        edits, updates = [], {}
    edits += from_failures
    allowed = set(inputs.workers)
    if allowed:  # frozen or unplanned workers get no edits; the generator knobs are RandomPool's
        edits = [e for e in edits if e.worker in allowed]
        if "eigen_random_pool" not in allowed:
            updates = {}
    return Critique(
        scores=scores,
        findings=findings,
        param_updates=list(updates.values()),
        prompt_edits=list({(e.worker, e.text): e for e in edits}.values()),
        converged=converged,
    )


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    EIGEN_PLANNER.name: planner,
    EIGEN_PROMPT_ENGINEER.name: prompt_engineer,
    EIGEN_JUDGE.name: judge,
}

"""`arena domain synth tau2 DOMAIN`: EigenData dialogue synthesis in an imported tau2 domain.

Tasks come from the import's ``train`` split only (``synthesis_tasks``: a test task is never
synthesised on, whatever the caller passes) and exclude those whose reward needs a judge. Each task
is a task instance whose solution is known -- its gold actions and the facts to communicate -- so
the EigenData chain for it is:

1. DialogSynthesis: the simulated user (the gateway's ``user_simulator``, with the task's scenario,
   acting with its own user tools in dual-control domains) talks to the TrajectoryAgent (the
   gateway's ``eigen_trajectory_agent`` with the reference solution in its input: it must reach
   those calls through the conversation, with values the user gave or tools returned). Every call
   runs the domain's own code in a ``Tau2Session``.
2. Realism (``synthesis/eigen/realism.py``): habits a person would not accept -- a look-up before
   the customer said who they are, a message repeated word for word, an item picked from several
   without asking, a customer reciting its scenario -- reject the dialogue by name.
3. TrajectoryValidation: deterministic checks (schema: known tools, argument names; grounding:
   every id-like value of an agent call appeared earlier; policy: every write came right after the
   customer's yes) and the gateway's ``eigen_trajectory_validation`` verdict with the paper's rule.
4. VerificationFunction: the task's evaluation criteria as Arena's ``Tau2Verification`` on the live
   session, and tau2's own evaluator on the same trajectory; a dialogue is verified when both give
   1.0 and the validation passed.

A verified dialogue becomes two ``samples.sft`` records: the agent side (tau2's agent system
prompt, the domain's agent tools; the reference never appears) and the user side (the user-view
conversation); and its task becomes one ``samples.verified`` record of kind ``tau2``, opening with
the dialogue's first user message: an RL environment that runs the domain in a sandbox session
with Arena's simulated user, rewarded by the task's verification
(``environments/tau2_environment.py``). What failed, and where, is in the report.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.hashing import content_hash
from arena.llm.core import InvalidOutput
from arena.llm.gateway import Gateway
from arena.llm.replies import parse_arguments
from arena.llm.roles.user_sim import UserAction, UserActionResult, UserBehaviour
from arena.records.eigen import (
    DialogIssue,
    DifficultyFactors,
    DimensionRating,
    Goal,
    GoalCall,
    Persona,
    UserIntent,
)
from arena.records.envs import VerifiedSample
from arena.records.sft import SftSample, Side, dialogue_samples
from environments.environment import argument_error
from environments.render import ToolCall
from environments.tau2_env import Tau2Session
from environments.tau2_environment import tau2_sample
from environments.tau2_episode import (
    GREETING,
    Episode,
    do_nothing_reward,
    run_calls,
    system_prompt,
    user_move,
)
from environments.tau2_import import Tau2Import, load_tasks, open_session, synthesis_tasks
from environments.tau2_tasks import Tau2Task, arena_reward
from environments.user_view import GatewayUserSimulator, UserContext, user_view_messages
from lake.store import ObjectStore
from producers.tau2_instances import InstanceOutcome, InstanceReport, make_instances
from sandbox.env_runtime import Runner
from synthesis.eigen.dialog_synthesis import dialog_issue, dimension_rating
from synthesis.eigen.realism import realism_findings
from synthesis.eigen.roles.dialogs import (
    EIGEN_TRAJECTORY_AGENT,
    EIGEN_TRAJECTORY_VALIDATION,
    YES_RE,
    AppEvent,
    ReferenceStep,
    TrajectoryAgentInput,
    TrajectoryValidationInput,
    dialog_system_message,
    grounded_values,
)

SOURCE = "eigen-tau2"
MAX_AGENT_STEPS = 60
"""Agent moves per dialogue (a reference of ten calls takes about thirty with asks and proposals)."""
MAX_USER_TURNS = 16

Stage = Literal["dialogue", "realism", "validation", "verification", "verified"]


class SynthesisOutcome(BaseModel):
    """One task's synthesis: how far it got and why it stopped there."""

    task_id: Annotated[str, Field(description="tau2 task id (train split) or new instance id.")]
    split: Annotated[
        Literal["train", "new"], Field(description="train: a tau2 train task; new: an instance Arena made.")
    ] = "train"
    stage: Annotated[Stage, Field(description="verified, or the stage that rejected the dialogue.")]
    reason: Annotated[str, Field(description="Why it was rejected ('' when verified).")] = ""
    termination: Annotated[str, Field(description="user_stop, agent_stop or max_steps.")] = ""
    arena_reward: float | None = None
    tau2_reward: float | None = None
    do_nothing_reward: Annotated[
        float | None,
        Field(
            description="tau2's reward of an agent that only greets (verified only): 1.0 means the task "
            "needs no action, e.g. a refusal."
        ),
    ] = None
    realism: Annotated[
        list[str],
        Field(description="Habits a person would not accept (synthesis/eigen/realism.py); any rejects."),
    ] = Field(default_factory=list)
    messages: Annotated[int, Field(description="Messages in the agent-side dialogue.")] = 0
    sample_ids: list[str] = Field(default_factory=list, description="samples.sft ids (verified only).")
    env_sample_id: Annotated[
        str, Field(description="The samples.verified (kind tau2) id of the task (verified only).")
    ] = ""


class SynthesisReport(BaseModel):
    """Synthesis over an imported domain's train split."""

    domain: str
    train_tasks: Annotated[int, Field(description="Train-split tasks scorable without a judge.")]
    attempted: Annotated[int, Field(description="Tasks synthesised on: train tasks and new instances.")]
    verified: Annotated[int, Field(description="Dialogues verified.")]
    verified_do_nothing: Annotated[
        int,
        Field(
            description="Of those, dialogues on tasks a do-nothing agent also passes: they teach less "
            "than their count says."
        ),
    ] = 0
    agreement: Annotated[
        float,
        Field(description="Share of finished dialogues where Arena's reward equals tau2's evaluator's."),
    ]
    by_stage: Annotated[dict[str, int], Field(description="Outcomes per stage.")]
    new_requested: Annotated[int, Field(description="New instances asked for (--new).")] = 0
    new_instances: Annotated[
        int, Field(description="New instances made: gold replay 1.0 by both evaluators, novel.")
    ] = 0
    new_verified: Annotated[int, Field(description="Verified dialogues on new instances.")] = 0
    instances: Annotated[
        InstanceReport | None, Field(description="How the new instances were made (--new).")
    ] = None
    realism_flagged: Annotated[
        dict[str, int],
        Field(
            description="Finished dialogues the realism check flagged, per habit (one dialogue may show several)."
        ),
    ] = Field(default_factory=dict)
    realism_flagged_share: Annotated[
        float, Field(description="Share of finished dialogues with at least one realism finding.")
    ] = 0.0
    do_nothing_share: Annotated[
        float, Field(description="verified_do_nothing / verified: the share that teaches little.")
    ] = 0.0
    outcomes: list[SynthesisOutcome]
    wall_s: float


@dataclass
class _Dialogue:
    """A synthesised dialogue: the episode (agent chat + tau2 messages) and the user's in-app actions."""

    episode: Episode
    events: list[AppEvent] = field(default_factory=list)
    own: list[UserActionResult] = field(default_factory=list)
    termination: str = "max_steps"


def reference_of(task: Tau2Task, writes: set[str]) -> list[ReferenceStep]:
    """The task's gold actions as the reference solution."""
    return [
        ReferenceStep(
            name=a.name,
            arguments=dict(a.arguments),
            actor="user" if a.requestor == "user" else "agent",
            writes=a.name in writes,
        )
        for a in task.verification.actions
    ]


def intent_of(imported: Tau2Import, task: Tau2Task, writes: set[str]) -> UserIntent:
    """The task as an EigenData UserIntent (what the validation reads)."""
    instructions = (task.raw.get("user_scenario") or {}).get("instructions") or {}
    reason = (
        str(instructions.get("reason_for_call") or task.instructions)
        if isinstance(instructions, dict)
        else ""
    )
    goal_calls = [
        GoalCall(name=a.name, arguments=dict(a.arguments), actor="user" if a.requestor == "user" else "agent")
        for a in task.verification.actions
        if a.name in writes or a.requestor == "user"
    ]
    return UserIntent(
        domain=f"tau2_{imported.domain}",
        seed=0,
        persona=Persona(role="customer", expertise="occasional", tone="polite"),
        objective=reason or task.instructions,
        reason_for_call=reason or task.instructions,
        requirements=list(task.requirements),
        must_have_functions=[a.name for a in task.verification.actions if a.requestor != "user"],
        goals=[Goal(kind=goal_calls[0].name, requirement=reason, calls=goal_calls)] if goal_calls else [],
        difficulty=DifficultyFactors(required_calls=max(1, len(task.verification.actions))),
    )


async def synthesise_dialog(
    session: Tau2Session,
    imported: Tau2Import,
    task: Tau2Task,
    gateway: Gateway,
    behaviour: UserBehaviour,
) -> _Dialogue:
    """One dialogue on ``task`` (DialogSynthesis), in ``session`` reset to the task's initial state."""
    await session.reset(task.raw)
    writes = set(imported.write_tools)
    history = list((task.raw.get("initial_state") or {}).get("message_history") or [])
    episode = Episode(
        chat=[{"role": "system", "content": dialog_system_message(imported.policy, "")}], tau2=history
    )
    dialogue = _Dialogue(episode=episode)
    user = GatewayUserSimulator(gateway)
    reference = reference_of(task, writes)
    planned = [UserAction(name=r.name, arguments=r.arguments) for r in reference if r.actor == "user"]
    requests: list[UserAction] = []
    user_turns = 0
    episode.say("assistant", GREETING)
    for _ in range(MAX_AGENT_STEPS):
        if episode.turns[-1].role == "assistant":
            context = UserContext(
                instructions=task.instructions,
                requirements=task.requirements,
                user_tools=imported.user_tools,
                turns=episode.turns,
                planned_actions=planned,
                action_requests=requests,
                behaviour=behaviour,
                turn=user_turns,
                max_turns=MAX_USER_TURNS,
            )
            text, signal, ran = await user_move(session, episode, user, context, dialogue.own)
            dialogue.own += ran  # what the user saw; the agent sees it as an app event
            shown = [AppEvent(**a.model_dump(exclude={"turn"}), after_message=len(episode.chat)) for a in ran]
            dialogue.events += shown
            episode.say("user", text or ("###STOP###" if signal != "continue" else ""))
            episode.turns[-1].actions = [
                ToolCall(name=a.name, arguments=a.arguments) for a in dialogue.own if a.turn == user_turns
            ]
            if signal != "continue":
                dialogue.termination = "user_stop"
                return dialogue
            user_turns += 1
        inputs = TrajectoryAgentInput(
            policy=imported.policy,
            tools=imported.agent_tools,
            user_tools=imported.user_tools,
            messages=episode.chat,
            app_events=dialogue.events,
            reference=reference,
            reference_info=task.verification.communicate_info,
        )
        step = (await gateway.call(EIGEN_TRAJECTORY_AGENT, inputs)).output
        if step.tool_calls:
            calls = [(c.name, dict(c.arguments)) for c in step.tool_calls]
            await run_calls(session, episode, calls, "assistant", None)
            continue
        episode.say("assistant", str(step.message))
        requests = [UserAction(name=r.name, arguments=r.arguments) for r in step.user_action_requests]
    return dialogue


# --------------------------------------------------------------------------- validation


def dialogue_checks(
    chat: list[dict[str, Any]], tools: list[dict[str, Any]], writes: set[str]
) -> tuple[dict[str, DimensionRating], list[DialogIssue]]:
    """The deterministic checks of an agent-side dialogue: (criterion -> rating, issues)."""
    specs = {t["function"]["name"]: t for t in tools}
    found: dict[str, list[DialogIssue]] = {
        c: [] for c in ("schema", "grounding", "goal", "realism", "policy")
    }
    seen: list[str] = []
    last_user = ""
    user_texts: list[str] = []
    calls = 0
    for index, message in enumerate(chat[1:], start=1):
        role, content = message.get("role"), str(message.get("content") or "")
        if role == "user":
            last_user = content
            user_texts.append(content)
        if role in ("user", "tool"):
            seen.append(content.casefold())
        if role != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            calls += 1
            fn = call["function"]
            name, arguments = fn["name"], parse_arguments(fn.get("arguments")) or {}
            spec = specs.get(name)
            problem = "no such agent tool" if spec is None else argument_error(spec, arguments)
            if problem:
                found["schema"].append(dialog_issue("schema", True, f"{name}: {problem}", name, index))
            text = "\n".join(seen)
            for value in grounded_values(arguments):
                if value.casefold() not in text:
                    found["grounding"].append(
                        dialog_issue("grounding", True, f"{name} uses {value!r}, never shown", name, index)
                    )
            if name in writes and not YES_RE.search(last_user):
                found["policy"].append(
                    dialog_issue("policy", True, f"{name} ran without the customer's yes", name, index)
                )
    for finding in realism_findings(chat, writes=writes):
        found["realism"].append(
            dialog_issue(
                "realism", False, f"{finding.reason}: {finding.description}", finding.evidence, finding.turn
            )
        )
    totals = {"schema": calls, "grounding": calls, "policy": calls, "goal": 1, "realism": len(user_texts)}
    issues = [i for group in found.values() for i in group]
    return {c: dimension_rating(group, totals[c]) for c, group in found.items()}, issues


# --------------------------------------------------------------------------- one task, a domain


NEW_SOURCE = f"{SOURCE}-new"
"""``samples.sft`` source of dialogues on new instances (train-derived ones are ``SOURCE``)."""


def sft_samples(imported: Tau2Import, task: Tau2Task, dialogue: _Dialogue, origin: str) -> list[SftSample]:
    """The agent-side and user-side training conversations of a verified dialogue (the source says
    whether the task was tau2's or a new instance)."""
    agent = [{"role": "system", "content": system_prompt(imported.policy)}, *dialogue.episode.chat[1:]]
    user = user_view_messages(
        task.instructions, task.requirements, imported.user_tools, dialogue.episode.turns, "stop"
    )
    sides: list[Side] = [("agent", agent, imported.agent_tools), ("user", user, imported.user_tools)]
    return dialogue_samples(sides, source=NEW_SOURCE if task.split == "new" else SOURCE, origin=origin)


def _split(task: Tau2Task) -> Literal["train", "new"]:
    return "new" if task.split == "new" else "train"


@dataclass
class Synthesised:
    """What a verified dialogue yields: training conversations, and its task as an RL environment."""

    sft: list[SftSample] = field(default_factory=list)
    env: VerifiedSample | None = None


def _opening(dialogue: _Dialogue) -> str:
    """The user's first message of the dialogue (what the environment's prompt opens with)."""
    return next((t.text for t in dialogue.episode.turns if t.role == "user"), "")


async def synthesise_task(
    session: Tau2Session, imported: Tau2Import, task: Tau2Task, gateway: Gateway, behaviour: UserBehaviour
) -> tuple[SynthesisOutcome, Synthesised]:
    """The chain on one train task: dialogue, validation, verification."""
    writes = set(imported.write_tools)
    try:
        dialogue = await synthesise_dialog(session, imported, task, gateway, behaviour)
    except (InvalidOutput, RuntimeError) as exc:
        return SynthesisOutcome(
            task_id=task.task_id,
            split=_split(task),
            stage="dialogue",
            reason=f"{type(exc).__name__}: {exc}"[:300],
        ), Synthesised()
    chat = dialogue.episode.chat
    gold = await session.gold(task.raw)
    ours = await arena_reward(session, task, dialogue.episode.tau2, gold)
    theirs = float(
        (await session.tau2_reward(task.raw, dialogue.episode.tau2, dialogue.termination))["reward"]
    )
    outcome = SynthesisOutcome(
        task_id=task.task_id,
        split=_split(task),
        stage="verification",
        termination=dialogue.termination,
        arena_reward=ours.reward,
        tau2_reward=theirs,
        messages=len(chat),
    )
    flagged = realism_findings(chat, instructions=task.instructions, writes=writes)
    outcome.realism = list(dict.fromkeys(f.reason for f in flagged))
    if flagged:
        outcome.stage = "realism"
        outcome.reason = "; ".join(f"{f.reason} at message {f.turn}: {f.evidence}" for f in flagged)[:300]
        return outcome, Synthesised()
    ratings, issues = dialogue_checks(chat, imported.agent_tools, writes)
    if ours.reward < 1.0:
        failed = "; ".join(
            c.detail for c in ours.checks if c.kind in task.verification.reward_basis and not c.passed
        )
        issues.append(dialog_issue("goal", True, f"the task's verification fails: {failed}"))
        ratings["goal"] = dimension_rating([issues[-1]], 1)
    validation = TrajectoryValidationInput(
        intent=intent_of(imported, task, writes), messages=chat, ratings=ratings, issues=issues
    )
    try:
        verdict = (await gateway.call(EIGEN_TRAJECTORY_VALIDATION, validation)).output
    except InvalidOutput as exc:
        outcome.stage, outcome.reason = "validation", f"no verdict: {exc}"[:300]
        return outcome, Synthesised()
    if verdict.validation_result != "PASS":
        outcome.stage, outcome.reason = "validation", str(verdict.failure_reason or "FAIL")
        return outcome, Synthesised()
    if ours.reward < 1.0 or theirs < 1.0:
        outcome.reason = f"reward: Arena {ours.reward}, tau2 {theirs}"
        return outcome, Synthesised()
    origin = content_hash(
        {"domain": imported.domain, "db": imported.db.sha256, "task": task.task_id, "chat": chat},
        prefix="t2s-",
        length=24,
    )
    samples = sft_samples(imported, task, dialogue, origin)
    env = tau2_sample(imported, task, _opening(dialogue), origin=origin)
    outcome.stage, outcome.sample_ids = "verified", [s.sample_id for s in samples]
    outcome.env_sample_id = env.sample_id
    outcome.do_nothing_reward = await do_nothing_reward(session, task)
    return outcome, Synthesised(sft=samples, env=env)


async def synthesise_domain(
    store: ObjectStore,
    pool: Runner,
    gateway: Gateway,
    imported: Tau2Import,
    *,
    behaviour: UserBehaviour | None = None,
    limit: int | None = None,
    new: int = 0,
    seed: int = 0,
    sessions: int = 1,
    on_task: Callable[[SynthesisOutcome], None] | None = None,
    on_instance: Callable[[InstanceOutcome], None] | None = None,
) -> tuple[SynthesisReport, list[SftSample], list[VerifiedSample]]:
    """EigenData synthesis on the train split of ``imported`` (its first ``limit`` scorable tasks),
    and on ``new`` instances made over its database first (``producers/tau2_instances.py``): the
    report, the verified dialogues' ``samples.sft`` records and their tasks' ``samples.verified`` ones."""
    start = time.monotonic()
    everything = load_tasks(store, imported)
    tasks = [t for t in synthesis_tasks(everything) if not t.verification.needs_judge]
    chosen = tasks[:limit]
    instances: InstanceReport | None = None
    if new:
        async with open_session(store, pool, imported) as session:
            made, instances = await make_instances(
                store, session, gateway, imported, everything, new, seed=seed, on_attempt=on_instance
            )
        chosen = [*chosen, *made]
    queue: asyncio.Queue[Tau2Task] = asyncio.Queue()
    for t in chosen:
        queue.put_nowait(t)
    results: dict[str, tuple[SynthesisOutcome, Synthesised]] = {}

    async def worker() -> None:
        async with open_session(store, pool, imported) as session:
            while not queue.empty():
                task = queue.get_nowait()
                results[task.task_id] = await synthesise_task(
                    session, imported, task, gateway, behaviour or UserBehaviour()
                )
                if on_task is not None:
                    on_task(results[task.task_id][0])

    await asyncio.gather(*(worker() for _ in range(max(1, min(sessions, len(chosen))))))
    outcomes = [results[t.task_id][0] for t in chosen]
    samples = [s for t in chosen for s in results[t.task_id][1].sft]
    envs = [e for t in chosen if (e := results[t.task_id][1].env) is not None]
    scored = [o for o in outcomes if o.arena_reward is not None and o.tau2_reward is not None]
    stages: dict[str, int] = {}
    for o in outcomes:
        stages[o.stage] = stages.get(o.stage, 0) + 1
    flagged = Counter(reason for o in scored for reason in o.realism)
    verified = stages.get("verified", 0)
    do_nothing = sum(1 for o in outcomes if o.stage == "verified" and (o.do_nothing_reward or 0) >= 1.0)
    report = SynthesisReport(
        domain=imported.domain,
        train_tasks=len(tasks),
        attempted=len(chosen),
        verified=verified,
        verified_do_nothing=do_nothing,
        do_nothing_share=round(do_nothing / verified, 4) if verified else 0.0,
        realism_flagged=dict(sorted(flagged.items())),
        realism_flagged_share=round(sum(bool(o.realism) for o in scored) / len(scored), 4) if scored else 0.0,
        agreement=sum(o.arena_reward == o.tau2_reward for o in scored) / max(1, len(scored)),
        by_stage=stages,
        new_requested=new,
        new_instances=instances.accepted if instances is not None else 0,
        new_verified=sum(o.stage == "verified" and o.split == "new" for o in outcomes),
        instances=instances,
        outcomes=outcomes,
        wall_s=time.monotonic() - start,
    )
    return report, samples, envs

"""`arena domain synth tau2 DOMAIN --new N`: new task instances over the imported domain's database.

Each attempt runs EigenData's chain for one instance (``synthesis/eigen/tau2_instances.py``):

1. random pool: a customer drawn from the database (seeded by the attempt), with the requests they
   could make and the policy's verdict on each;
2. task writer: ``EIGEN_TAU2_INSTANCE`` (through the gateway) picks one and writes the scenario;
3. verification function: the instance's evaluation criteria, checked by running them -- the gold
   calls in the domain's own code must raise nothing and, for an allowed request, change the
   database; the gold-style replay (the calls, then the facts to tell) must score 1.0 with Arena's
   ``Tau2Verification`` and with tau2's own evaluator;
4. novelty: no near-duplicate of any task of the domain, train or test, nor of an instance
   accepted before it (5-grams, embedding cosine, identical writes).

Attempts stop at N accepted instances or ``MAX_ATTEMPTS_PER_INSTANCE * N`` attempts. The accepted
instances go to the lake as one JSON file (``tau2/<domain>/instances/<sha256>.json``), split
``new``; the report names every rejection by stage and reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from arena.llm.core import InvalidOutput
from arena.llm.gateway import Gateway
from environments.tau2_env import Tau2Session
from environments.tau2_import import LAKE_PREFIX, Tau2Import, load_databases, synthesis_tasks
from environments.tau2_tasks import Tau2Task, mapped_task, replay
from lake.store import ObjectStore
from synthesis.eigen.roles.tau2_instances import EIGEN_TAU2_INSTANCE, InstanceDraw, Tau2InstanceInput
from synthesis.eigen.tau2_instances import Novelty, NoveltyIndex, draw_instance, instance_task

MAX_ATTEMPTS_PER_INSTANCE = 3
EXAMPLES = 3
"""Train scenarios the writer sees as style examples."""

InstanceStage = Literal["writer", "gold", "replay", "novelty", "accepted"]


class InstanceOutcome(BaseModel):
    """One attempt at a new instance: accepted, or the stage that rejected it and why."""

    attempt: Annotated[int, Field(description="Attempt number (seeds the draw).")]
    task_id: Annotated[str, Field(description="The instance's id ('' when no task was written).")] = ""
    kind: Annotated[str, Field(description="The chosen request's kind.")] = ""
    verdict: Annotated[str, Field(description="allowed or refuse (the policy's).")] = ""
    stage: Annotated[InstanceStage, Field(description="accepted, or where it was rejected.")]
    reason: Annotated[str, Field(description="Why it was rejected ('' when accepted).")] = ""
    arena_reward: Annotated[float | None, Field(description="Arena's reward of the gold-style replay.")] = (
        None
    )
    tau2_reward: Annotated[float | None, Field(description="tau2's evaluator on the same replay.")] = None
    novelty: Annotated[Novelty | None, Field(description="Closeness to the domain's tasks.")] = None


class InstanceReport(BaseModel):
    """The new instances of one run."""

    domain: str
    requested: Annotated[int, Field(description="Instances asked for (--new).")]
    attempts: Annotated[int, Field(description="Draws made.")]
    accepted: Annotated[int, Field(description="Instances kept: gold replay 1.0 by both, novel.")]
    refusals: Annotated[int, Field(description="Accepted instances whose request the policy refuses.")]
    by_kind: Annotated[dict[str, int], Field(description="Accepted instances per request kind.")]
    rejected: Annotated[dict[str, int], Field(description="Rejected attempts per 'stage: reason'.")]
    max_ngram: Annotated[
        float, Field(description="Largest 5-gram containment of an accepted one with any task.")
    ]
    max_cosine: Annotated[
        float, Field(description="Largest embedding cosine of an accepted one with any task.")
    ]
    max_test_cosine: Annotated[
        float, Field(description="Largest cosine of an accepted one with a test task.")
    ]
    lake_path: Annotated[str, Field(description="Where the accepted instances are ('' when none).")]
    outcomes: list[InstanceOutcome]
    wall_s: float


async def _verify(session: Tau2Session, task: Tau2Task, verdict: str, outcome: InstanceOutcome) -> bool:
    """Run the verification function on the gold: errors, a write that changes nothing, the replay."""
    initial = await session.reset(task.raw)
    gold = await session.gold(task.raw)
    if gold.errors:
        outcome.stage, outcome.reason = "gold", f"a gold call raises: {gold.errors[0]}"[:300]
        return False
    if verdict == "allowed" and (gold.agent, gold.user) == (initial.agent, initial.user):
        outcome.stage, outcome.reason = "gold", "the gold writes change nothing"
        return False
    done = await replay(session, task, task.verification.actions, say=task.verification.communicate_info)
    outcome.arena_reward, outcome.tau2_reward = done.arena, done.tau2
    if done.arena < 1.0 or done.tau2 < 1.0:
        outcome.stage, outcome.reason = "replay", f"gold-style replay: Arena {done.arena}, tau2 {done.tau2}"
        return False
    return True


async def _attempt(
    attempt: int,
    session: Tau2Session,
    gateway: Gateway,
    imported: Tau2Import,
    db: dict[str, object],
    examples: list[str],
    novelty: NoveltyIndex,
    seed: int,
) -> tuple[InstanceOutcome, Tau2Task | None]:
    rng = random.Random(f"{seed}:{imported.domain}:{attempt}")
    draw: InstanceDraw = draw_instance(imported.domain, db, rng)
    outcome = InstanceOutcome(attempt=attempt, stage="writer")
    inputs = Tau2InstanceInput(domain=imported.domain, policy=imported.policy, draw=draw, examples=examples)
    try:
        scenario = (await gateway.call(EIGEN_TAU2_INSTANCE, inputs)).output
    except InvalidOutput as exc:
        outcome.reason = f"no scenario: {exc}"[:300]
        return outcome, None
    if scenario.option >= len(draw.options):
        outcome.reason = f"no such option: {scenario.option} of {len(draw.options)}"
        return outcome, None
    option = draw.options[scenario.option]
    task = mapped_task(instance_task(draw, scenario), "new")
    outcome.task_id, outcome.kind, outcome.verdict = task.task_id, option.kind, option.verdict
    if not await _verify(session, task, option.verdict, outcome):
        return outcome, None
    outcome.novelty = await asyncio.to_thread(novelty.admit, task)  # embeds: CPU, off the loop
    if outcome.novelty.duplicate_of:
        n = outcome.novelty
        outcome.stage = "novelty"
        outcome.reason = f"near-duplicate ({n.by}): {n.split} task {n.duplicate_of}"
        return outcome, None
    outcome.stage = "accepted"
    return outcome, task


def save_instances(store: ObjectStore, domain: str, tasks: list[Tau2Task]) -> str:
    """The accepted instances in the lake, by content (one put: never a torn file)."""
    data = json.dumps([t.model_dump(mode="json") for t in tasks]).encode()
    path = f"{LAKE_PREFIX}/{domain}/instances/{hashlib.sha256(data).hexdigest()}.json"
    if not store.exists(path):
        store.put(path, data)
    return path


async def make_instances(
    store: ObjectStore,
    session: Tau2Session,
    gateway: Gateway,
    imported: Tau2Import,
    tasks: list[Tau2Task],
    count: int,
    *,
    seed: int = 0,
    on_attempt: Callable[[InstanceOutcome], None] | None = None,
) -> tuple[list[Tau2Task], InstanceReport]:
    """Up to ``count`` new verified, novel instances over ``imported``'s database (``session`` open on it)."""
    start = time.monotonic()
    db = await asyncio.to_thread(lambda: json.loads(load_databases(store, imported)[0]))
    examples = [t.instructions for t in synthesis_tasks(tasks)[:EXAMPLES]]
    novelty = await asyncio.to_thread(NoveltyIndex, tasks, set(imported.write_tools))
    accepted: list[Tau2Task] = []
    outcomes: list[InstanceOutcome] = []
    for attempt in range(MAX_ATTEMPTS_PER_INSTANCE * count):
        if len(accepted) >= count:
            break
        outcome, task = await _attempt(attempt, session, gateway, imported, db, examples, novelty, seed)
        outcomes.append(outcome)
        if task is not None:
            accepted.append(task)
        if on_attempt is not None:
            on_attempt(outcome)
    kept = [o for o in outcomes if o.stage == "accepted" and o.novelty is not None]
    report = InstanceReport(
        domain=imported.domain,
        requested=count,
        attempts=len(outcomes),
        accepted=len(accepted),
        refusals=sum(o.verdict == "refuse" for o in kept),
        by_kind=dict(sorted(Counter(o.kind for o in kept).items())),
        rejected=dict(
            sorted(
                Counter(
                    f"{o.stage}: {o.reason.split(':')[0]}" for o in outcomes if o.stage != "accepted"
                ).items()
            )
        ),
        max_ngram=max((o.novelty.ngram for o in kept if o.novelty), default=0.0),
        max_cosine=max((o.novelty.cosine for o in kept if o.novelty), default=0.0),
        max_test_cosine=max((o.novelty.nearest_test_cosine for o in kept if o.novelty), default=0.0),
        lake_path=save_instances(store, imported.domain, accepted) if accepted else "",
        outcomes=outcomes,
        wall_s=time.monotonic() - start,
    )
    return accepted, report

"""A tau2 task as an RL environment: the ``tau2`` kind of ``samples.verified``.

A verified tau2 dialogue (on a train task or a new instance, ``producers/tau2_synthesis.py``)
becomes a ``VerifiedSample`` the trainer rolls out like any pack's:

- ``prompt``: tau2's agent system prompt around the domain's policy, tau2's greeting, and the
  opening user message of the verified dialogue (as pack instances open with theirs);
- ``tools``: the domain's agent tools;
- ``reward_spec``: a ``Tau2EnvSpec``: the task (its Arena verification and the tau2 original) and
  the lake objects of the databases it runs on;
- ``env_ref``: the import's source (domain and database hash).

``Tau2Environment`` runs the domain's own code in one ``Tau2Session``, opened when first needed
(a call, the user's device, the reward) and reset to the task. Arena's simulated user answers the
agent's messages and, in telecom, acts on its own device first (as in tau2's orchestrator). The
trajectory is kept as tau2 messages, so the reward is the task's verification on the live session
(``arena_reward``), 0 unless the dialogue ended by a stop (the user's, or the agent's
``###STOP###``), as tau2 scores a cut dialogue; ``rollout()`` keeps what tau2's own evaluator needs
to rescore the same trajectory (``rescore``).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.hashing import content_hash
from arena.llm.roles.user_sim import UserAction, UserActionResult, UserBehaviour
from arena.records.envs import VerifiedSample
from environments.environment import MAX_OUTPUT_CHARS, Observation, Trajectory
from environments.render import ToolCall
from environments.tau2_env import DbHashes, Tau2Session
from environments.tau2_episode import (
    GREETING,
    MAX_USER_TURNS,
    Episode,
    run_calls,
    system_prompt,
    user_move,
)
from environments.tau2_import import BlobRef, Tau2Import, read_databases
from environments.tau2_tasks import Tau2Task, arena_reward
from environments.user_view import UserContext, UserSimulator
from lake.store import ObjectStore
from sandbox.env_runtime import Runner
from sandbox.pool import SandboxUnavailable

STOP = "###STOP###"
Termination = Literal["user_stop", "agent_stop", "max_steps"]


class Tau2EnvSpec(BaseModel):
    """``VerifiedSample.reward_spec`` of a ``tau2`` sample."""

    domain: Annotated[str, Field(description="tau2 domain (airline, retail, telecom).")]
    task: Annotated[
        Tau2Task, Field(description="The task: the user's scenario, its verification, the original.")
    ]
    db: Annotated[BlobRef, Field(description="The agent database the task runs on (lake object).")]
    user_db: Annotated[BlobRef | None, Field(description="The user's device database (telecom).")] = None
    user_tools: list[dict[str, Any]] = Field(
        default_factory=list, description="OpenAI specs of the user's own tools (dual control)."
    )
    max_user_turns: Annotated[int, Field(ge=1, le=64, description="Most user replies per dialogue.")] = (
        MAX_USER_TURNS
    )


class Tau2Rollout(BaseModel):
    """One finished rollout as tau2 sees it: enough for its evaluator to score it again."""

    sample_id: Annotated[str, Field(description="The samples.verified record rolled out.")]
    domain: Annotated[str, Field(description="tau2 domain.")]
    db: Annotated[BlobRef, Field(description="The agent database it ran on (lake object).")]
    user_db: Annotated[BlobRef | None, Field(description="The user's device database (telecom).")] = None
    task: Annotated[dict[str, Any], Field(description="The tau2 task as shipped.")]
    messages: Annotated[list[dict[str, Any]], Field(description="The trajectory as tau2 messages.")]
    termination: Annotated[Termination, Field(description="How the dialogue ended.")]
    reward: Annotated[float, Field(description="Arena's reward (the task's verification).")]


def tau2_sample(
    imported: Tau2Import, task: Tau2Task, opening: str, *, origin: str, split: str = "train"
) -> VerifiedSample:
    """The ``samples.verified`` record of ``task``, opening with the user's first message ``opening``.

    ``origin``: the verified dialogue it came from (part of the id: one sample per dialogue)."""
    spec = Tau2EnvSpec(
        domain=imported.domain,
        task=task,
        db=imported.db,
        user_db=imported.user_db,
        user_tools=imported.user_tools,
    )
    prompt = [
        {"role": "system", "content": system_prompt(imported.policy)},
        {"role": "assistant", "content": GREETING},
        {"role": "user", "content": opening},
    ]
    return VerifiedSample(
        sample_id=content_hash(
            {"kind": "tau2", "domain": imported.domain, "db": imported.db.sha256, "origin": origin},
            prefix="vs-",
            length=24,
        ),
        kind="tau2",
        prompt=prompt,
        tools=list(imported.agent_tools),
        env_ref=imported.source,
        reward_spec=spec.model_dump(mode="json"),
        domain=f"tau2-{imported.domain}",
        split=split,
    )


def load_spec_databases(store: ObjectStore, spec: Tau2EnvSpec | Tau2Rollout) -> tuple[str, str | None]:
    """(db JSON, user db JSON or None) of a tau2 sample or rollout, checked against their hashes."""
    return read_databases(store, spec.db, spec.user_db)


class Tau2Environment:
    """One rollout of a ``tau2`` sample: the domain's code in a session, Arena's user, the task's reward."""

    def __init__(
        self,
        sample: VerifiedSample,
        runner: Runner,
        user: UserSimulator,
        databases: tuple[str, str | None],
        *,
        behaviour: UserBehaviour | None = None,
        max_output_chars: int = MAX_OUTPUT_CHARS,
    ) -> None:
        if sample.kind != "tau2":
            raise ValueError(f"Tau2Environment needs a tau2 sample, got {sample.kind!r}")
        self.sample = sample
        self.spec = Tau2EnvSpec.model_validate(sample.reward_spec)
        self.task = self.spec.task
        self.runner = runner
        self.user = user
        self.databases = databases
        self.behaviour = behaviour or UserBehaviour()
        self.max_output_chars = max_output_chars
        self.tools: list[dict[str, Any]] = list(sample.tools)
        history = list((self.task.raw.get("initial_state") or {}).get("message_history") or [])
        self.episode = Episode(chat=[], tau2=history)
        for message in _opening(sample.prompt):
            self.episode.say(message["role"], str(message.get("content") or ""))
        self.user_replies = 0
        self.seen: list[UserActionResult] = []
        self.termination: Termination = "max_steps"
        """``max_steps`` until a stop: a rollout cut by turns or length ends there, and scores 0."""
        self.planned = [
            UserAction(name=a.name, arguments=a.arguments)
            for a in self.task.verification.actions
            if a.requestor == "user"
        ]
        self.last_reward = 0.0
        """The reward ``reward`` gave (what ``rollout`` records)."""
        self._session: Tau2Session | None = None
        self._gold: DbHashes | None = None
        self._problem: str | None = None
        self._lock = asyncio.Lock()

    async def _open(self) -> Tau2Session | str:
        """The session, reset to the task (opened on first use), or why there is none."""
        async with self._lock:
            if self._session is None and self._problem is None:
                session = Tau2Session(self.runner, self.spec.domain, *self.databases)
                try:
                    await session.open()
                    await session.reset(self.task.raw)
                    self._gold = await session.gold(self.task.raw)
                    self._session = session
                except (RuntimeError, SandboxUnavailable) as exc:
                    await session.close()
                    self._problem = f"sandbox_error: {exc}"[:500]
            return self._session if self._session is not None else str(self._problem)

    async def call(self, name: str, arguments: dict[str, Any]) -> Observation:
        """The agent's call, answered by the domain's own code (an unknown tool or bad arguments get
        the domain's own error text, as in tau2)."""
        session = await self._open()
        if isinstance(session, str):
            return Observation(text=f"error: {session}", ok=False, tool=name)
        try:
            (answer,) = await run_calls(session, self.episode, [(name, dict(arguments))], "assistant", None)
        except RuntimeError as exc:
            return Observation(text=f"error: {exc}"[: self.max_output_chars], ok=False, tool=name)
        text = answer.content
        if len(text) > self.max_output_chars:
            text = text[: self.max_output_chars] + f"... [cut at {self.max_output_chars} characters]"
        return Observation(text=text, ok=not answer.error, tool=name)

    async def user_turn(self, assistant_text: str) -> str | None:
        """The user's reply to the agent's message, its device actions run first; None: it ended."""
        if self.termination != "max_steps":
            return None
        self.episode.say("assistant", assistant_text)
        if STOP in assistant_text:
            self.termination = "agent_stop"
            return None
        if self.user_replies >= self.spec.max_user_turns:
            return None  # out of turns: tau2 scores the dialogue 0 (max_steps)
        session = await self._open()
        if isinstance(session, str):
            return None
        context = UserContext(
            instructions=self.task.instructions,
            requirements=self.task.requirements,
            user_tools=self.spec.user_tools,
            turns=self.episode.turns,
            planned_actions=self.planned,
            behaviour=self.behaviour,
            turn=self.user_replies,
            max_turns=self.spec.max_user_turns,
        )
        try:
            text, signal, ran = await user_move(session, self.episode, self.user, context, self.seen)
        except RuntimeError:
            return None
        self.seen += ran
        if signal != "continue" and STOP not in text:
            text = f"{text} {STOP}".strip()
        self.episode.say("user", text or "")
        self.episode.turns[-1].actions = [ToolCall(name=a.name, arguments=a.arguments) for a in ran]
        if signal != "continue":
            self.termination = "user_stop"
            return None
        self.user_replies += 1
        return text

    async def reward(self, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        """The task's verification on the live session: the product of its reward-basis checks, and
        0 for a dialogue that did not end by a stop. Parts: ``pass``, each check, ``stopped``."""
        session = await self._open()
        if isinstance(session, str) or self._gold is None:
            return 0.0, {"pass": 0.0, "env_error": 1.0}
        try:
            result = await arena_reward(session, self.task, self.episode.tau2, self._gold)
        except RuntimeError:
            return 0.0, {"pass": 0.0, "env_error": 1.0}
        stopped = self.termination != "max_steps"
        value = result.reward if stopped else 0.0
        parts = {c.kind.lower(): float(c.passed) for c in result.checks}
        self.last_reward = value
        return value, {"pass": value, "stopped": float(stopped), **parts}

    def rollout(self) -> Tau2Rollout:
        """The trajectory so far as tau2 messages (call after ``reward``)."""
        return Tau2Rollout(
            sample_id=self.sample.sample_id,
            domain=self.spec.domain,
            db=self.spec.db,
            user_db=self.spec.user_db,
            task=self.task.raw,
            messages=[dict(m) for m in self.episode.tau2],
            termination=self.termination,
            reward=self.last_reward,
        )

    async def close(self) -> None:
        """End the session (its pool slot is free again); idempotent."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _opening(prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt's dialogue messages (greeting, opening user message), without the system prompt."""
    return [m for m in prompt if m.get("role") in ("assistant", "user")]


async def rescore(session: Tau2Session, rollout: Tau2Rollout) -> float:
    """tau2's own evaluator (``evaluate_simulation``) on a finished rollout's trajectory."""
    return float((await session.tau2_reward(rollout.task, rollout.messages, rollout.termination))["reward"])


__all__ = [
    "Tau2EnvSpec",
    "Tau2Environment",
    "Tau2Rollout",
    "load_spec_databases",
    "rescore",
    "tau2_sample",
]

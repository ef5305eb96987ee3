"""The multi-turn rollout (ASTRA §3.1, EigenData §5): the token-level side of the episode's state
machine (``trainer.turn_loop``)::

    GENERATE --tool calls--------> TOOLS --room left, turns left--> GENERATE
        |                            '--> DONE (max_turns | max_length)
        |--no tool call, qa--------> DONE (no_tool_call)
        |--no tool call, interactive-> USER --reply, room left--> GENERATE
        |                                '--> DONE (user_stop | max_turns | max_length)
        '--budget spent------------> DONE (max_length | max_turns)

``TurnLoop`` runs the states, the tool calls and the user simulator; ``_Tokens`` plugs in its
``Generate`` (one turn sampled by the local backend, closed and parsed) and its ``Budget`` (the
token ids, within ``max_seq_len``).

Token layout (``environments.render``; ``render(final messages)`` reproduces it):
``prompt_ids = render(prompt, tools) + generation_header``; each assistant turn is generated up to
and including ``<|im_end|>`` (mask 1, the backend's log-probs); then ``turn_suffix`` (the message
separator), and -- when the dialogue goes on -- the observation segment (tool outputs) or the user
segment, and the next ``generation_header`` (all mask 0, log-prob 0).

Decisions worth knowing:

- A turn cut at ``max_new_tokens`` with sequence budget left is closed with a forced
  ``<|im_end|>`` (mask 0: the model did not choose it) and then parsed like any turn. A turn
  cut by the sequence budget ends the rollout (``max_length``) and stays open.
- Every emitted call counts in ``tool_calls`` (the ``c`` of the F1 reward); an unparseable
  ``<tool_call>`` block gets an error observation. Calls of the last turn allowed by
  ``max_turns`` are still executed (they count in ``c``, so their outputs count too).
- An observation or user segment that does not fit in ``max_seq_len`` is dropped (neither in
  the ids, nor the messages, nor ``tool_outputs``) and the rollout stops with ``max_length``.
- ``tool_outputs`` holds the outputs of successful calls only (as the environment verification
  counts only ok runs), in call order.
- The assistant message of a turn is the OpenAI form of its parse when that renders back to the
  generated text; otherwise (invalid call blocks, odd spacing, garbage) the raw text is the
  content, so rendering the messages gives the generated ids again as long as the tokenizer's
  encoding of that text is the one the model sampled.
- Rollouts of a batch (``rollout_batch``: the G rollouts of a prompt, and every prompt of a
  training round) generate in lockstep: once every live rollout of the batch waits for its next
  turn, all of them are one batched ``generate`` call (rows in rollout order, the batch seeded from
  the batch seed and its turn), while their tool and user steps run concurrently in between. So
  the trajectories depend on the seed and the batch's composition, never on timing. A lone
  ``rollout`` generates one turn per call, seeded by its own seed and turn.
- Calls into one backend are serialised per event loop (the HF backend seeds torch's RNG, vLLM's
  offline engine is not reentrant); one call carries a whole batch, so this never serialises the
  rollouts of a batch.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field

from arena.records.envs import VerifiedSample
from environments.environment import Environment
from environments.render import (
    ParsedTurn,
    Tokenizer,
    assistant_text,
    generation_header,
    im_end_id,
    observation_ids,
    parse_assistant,
    render,
    turn_suffix_ids,
    user_ids,
)
from environments.rewards import ToolResult
from trainer.batching import Group
from trainer.turn_loop import Episode, Stop, Turn, TurnLoop

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine, Sequence

    from trainer.policy import Generation, RolloutBackend


class Trajectory(BaseModel):
    """One finished rollout: ids for the update, messages for people and exporters, the reward."""

    sample_id: Annotated[str, Field(description="Verified sample rolled out.")]
    seed: Annotated[int, Field(description="Seed the rollout's generation seeds derive from.")]
    messages: Annotated[
        list[dict[str, Any]], Field(description="OpenAI messages: the prompt, then every turn.")
    ]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools offered (mixed-in included).")]
    prompt_ids: Annotated[list[int], Field(description="render(prompt, tools) + generation header.")]
    response_ids: Annotated[list[int], Field(description="Everything after the prompt.")]
    response_mask: Annotated[list[int], Field(description="1 on generated tokens, 0 elsewhere.")]
    logprobs: Annotated[
        list[float], Field(description="Rollout log-prob per response token (0 where mask 0).")
    ]
    turns: Annotated[int, Field(ge=0, description="Assistant turns generated.")]
    tool_calls: Annotated[int, Field(ge=0, description="Calls emitted, invalid ones included (c).")]
    invalid_calls: Annotated[int, Field(ge=0, description="Emitted <tool_call> blocks that did not parse.")]
    failed_calls: Annotated[
        int,
        Field(ge=0, description="Parsed calls whose observation is an error (unknown tool, bad args...)."),
    ]
    user_turns: Annotated[int, Field(ge=0, description="User-simulator replies (interactive samples).")]
    tool_outputs: Annotated[list[str], Field(description="Outputs of the successful calls, in order.")]
    tool_results: Annotated[
        list[ToolResult],
        Field(description="Every executed call (invalid blocks and failed calls included), in order."),
    ] = Field(default_factory=list)
    stop: Annotated[Stop, Field(description="Why the rollout ended.")]
    reward: Annotated[float, Field(description="Environment reward.")] = 0.0
    reward_parts: dict[str, float] = Field(default_factory=dict, description="Reward components.")

    def for_update(self) -> dict[str, Any]:
        """The fields the GRPO update needs (a ``Group`` rollout); messages and raw outputs stay out
        of the checkpointed buffer."""
        return self.model_dump(include=set(UPDATE_FIELDS))


def group_of(
    sample_id: str, trajectories: Sequence[Trajectory], *, born_step: int, behaviour_step: int
) -> Group:
    """One prompt's G trajectories as a trainable ``Group``: their rewards and update fields."""
    return Group(
        sample_id=sample_id,
        rewards=[t.reward for t in trajectories],
        rollouts=[t.for_update() for t in trajectories],
        born_step=born_step,
        behaviour_step=behaviour_step,
    )


UPDATE_FIELDS = (
    "prompt_ids",
    "response_ids",
    "response_mask",
    "logprobs",
    "reward",
    "reward_parts",
    "turns",
    "tool_calls",
    "stop",
)
"""``Trajectory`` fields a ``Group`` keeps for the update."""


def derive_seed(seed: int, *path: int | str) -> int:
    """A 31-bit seed from ``seed`` and a path (group index, turn): stable across runs and processes."""
    text = ":".join(str(p) for p in (seed, *path))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") % (2**31 - 1)


log = logging.getLogger("arena.rollout")

_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _generation_lock(backend: object) -> asyncio.Lock:
    locks = _locks.setdefault(asyncio.get_running_loop(), {})
    return locks.setdefault(id(backend), asyncio.Lock())


async def _call_backend(
    backend: RolloutBackend, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
) -> list[Generation]:
    """One ``generate`` call, off the event loop, one at a time per backend."""
    async with _generation_lock(backend):
        return await asyncio.to_thread(
            backend.generate, prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
        )


STALL_S = 60.0
"""A lockstep batch whose waiting turns have not moved for this long goes out without the rest."""


class _Lockstep:
    """Batches the turns of a set of rollouts: a turn is generated once every live rollout waits.

    ``generate`` parks a rollout's request; ``leave`` takes a finished (or failed) rollout out of
    the set. When the waiting requests are all the live rollouts, they go out as one call, rows in
    rollout order, seeded by ``derive_seed(seed, "turn", k)`` for the batch's k-th call. A batch
    bigger than the sandbox pool could wait forever (a member waiting for a session the others
    hold), so the callers cut batches to the pool's size; should one still stall for ``STALL_S``,
    the waiting turns go out alone (logged: the composition then depends on timing).
    """

    def __init__(self, backend: RolloutBackend, live: int, *, temperature: float, seed: int) -> None:
        self.backend = backend
        self.live = live
        self.temperature = temperature
        self.seed = seed
        self.calls = 0
        self._waiting: dict[int, tuple[list[int], int, asyncio.Future[Generation]]] = {}
        self._running: set[asyncio.Task[None]] = set()  # strong references: a bare task may be collected

    async def generate(self, index: int, prompt: list[int], budget: int) -> Generation:
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        self._waiting[index] = (prompt, budget, future)
        self._maybe_dispatch()
        try:
            return await asyncio.wait_for(asyncio.shield(future), STALL_S)
        except TimeoutError:
            if self._waiting.get(index, (None, None, None))[2] is future:
                log.warning(
                    "lockstep batch stalled %.0f s with %d of %d rollouts waiting; generating them alone "
                    "(cut batches to the sandbox pool's size)",
                    STALL_S,
                    len(self._waiting),
                    self.live,
                )
                self._dispatch()
            return await future

    def leave(self) -> None:
        self.live -= 1
        self._maybe_dispatch()

    def _maybe_dispatch(self) -> None:
        if self._waiting and len(self._waiting) >= self.live:
            self._dispatch()

    def _dispatch(self) -> None:
        batch = [self._waiting[i] for i in sorted(self._waiting)]
        self._waiting = {}
        seed = derive_seed(self.seed, "turn", self.calls)
        self.calls += 1
        task = asyncio.get_running_loop().create_task(self._run(batch, seed))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[tuple[list[int], int, asyncio.Future[Generation]]], seed: int) -> None:
        try:
            gens = await _call_backend(
                self.backend,
                [prompt for prompt, _, _ in batch],
                max_new_tokens=max(budget for _, budget, _ in batch),
                temperature=self.temperature,
                seed=seed,
            )
        except BaseException as exc:  # every waiting rollout gets the failure, none hangs
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, future), gen in zip(batch, gens, strict=True):
            if not future.done():
                future.set_result(gen)


class _Tokens:
    """The token side of one rollout (``TurnLoop``'s ``Generate`` and ``Budget``): samples each turn
    from the backend, closes and parses it, and keeps the ids within ``max_seq_len``."""

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer: Tokenizer,
        env: Environment,
        sample: VerifiedSample,
        limits: _Limits,
        *,
        seed: int,
        lockstep: _Lockstep | None = None,
        index: int = 0,
    ) -> None:
        self.backend = backend
        self.lockstep = lockstep
        self.index = index
        self.tok = tokenizer
        self.max_seq_len = limits.max_seq_len
        self.max_new_tokens = limits.max_new_tokens
        self.temperature = limits.temperature
        self.seed = seed
        self.im_end = im_end_id(tokenizer)
        self.header = generation_header(tokenizer)
        self.suffix = turn_suffix_ids(tokenizer)
        self.prompt_ids = (
            render(tokenizer, [dict(m) for m in sample.prompt], env.tools).input_ids + self.header
        )
        self.response_ids: list[int] = []
        self.mask: list[int] = []
        self.logprobs: list[float] = []

    def room(self) -> int:
        return self.max_seq_len - len(self.prompt_ids) - len(self.response_ids)

    async def generate(self, messages: list[dict[str, Any]], turn: int) -> Turn | None:
        """Assistant turn ``turn``: sample it, close it, parse it (``None``: no room left for it)."""
        if self.room() <= 0:
            return None
        budget = min(self.max_new_tokens, self.room())
        context = self.prompt_ids + self.response_ids
        if self.lockstep is not None:
            gen = await self.lockstep.generate(self.index, context, budget)
        else:
            (gen,) = await _call_backend(
                self.backend,
                [context],
                max_new_tokens=budget,
                temperature=self.temperature,
                seed=derive_seed(self.seed, "turn", turn - 1),
            )
        ids, logprobs = list(gen.token_ids[:budget]), list(gen.logprobs[:budget])
        self._add(ids, logprobs, mask=1)
        closed = bool(ids) and ids[-1] == self.im_end
        body = ids[:-1] if closed else ids
        if not closed and self.room() <= 0:
            # Cut by the sequence budget: the turn stays open and the rollout ends.
            return Turn(message={"role": "assistant", "content": self._decode(body)}, cut=True)
        if not closed:
            self._context([self.im_end])  # cut at max_new_tokens: close the message (not the model's token)
        text = self._decode(body)
        parsed = parse_assistant(text)
        return Turn(
            message=self._message(parsed, text, turn),
            content=parsed.content,
            calls=parsed.tool_calls,
            invalid=parsed.invalid_calls,
        )

    def admit_tools(self, outputs: list[str]) -> bool:
        return self._admit(observation_ids(self.tok, outputs))

    def admit_user(self, reply: str) -> bool:
        return self._admit(user_ids(self.tok, reply))

    def open_turn(self) -> bool:
        if self.room() < len(self.header) + 1:
            return False
        self._context(self.header)
        return True

    def close(self) -> None:
        """The ``\\n`` after a closed final message, when it fits (so render(messages) matches)."""
        if self.room() >= len(self.suffix):
            self._context(self.suffix)

    def _admit(self, segment: list[int]) -> bool:
        """The separator and ``segment`` (mask 0), if they fit."""
        if self.room() < len(self.suffix) + len(segment):
            return False
        self._context(self.suffix + segment)
        return True

    def _add(self, ids: list[int], logprobs: list[float], *, mask: int) -> None:
        self.response_ids += ids
        self.mask += [mask] * len(ids)
        self.logprobs += logprobs

    def _context(self, ids: list[int]) -> None:
        self._add(ids, [0.0] * len(ids), mask=0)

    def _decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    @staticmethod
    def _message(parsed: ParsedTurn, text: str, turn: int) -> dict[str, Any]:
        """The OpenAI message of a turn; the raw text when the parse does not render back to it."""
        message = parsed.to_message()
        for i, call in enumerate(message.get("tool_calls", [])):
            call["id"] = f"call_{turn}_{i}"
        if assistant_text(message) == text:
            return message
        return {"role": "assistant", "content": text}


async def rollout(
    backend: RolloutBackend,
    tokenizer: Tokenizer,
    env: Environment,
    sample: VerifiedSample,
    *,
    max_turns: int = 32,
    max_seq_len: int = 8192,
    max_new_tokens: int = 1024,
    temperature: float = 1.0,
    seed: int = 0,
) -> Trajectory:
    """Roll ``sample`` out in ``env`` (a fresh instance) and score it with ``env.reward``.

    The episode is over afterwards: ``env`` is closed (its sandbox session and pool slot freed),
    whether the rollout finished or raised.
    """
    try:
        limits = _Limits(max_turns, max_seq_len, max_new_tokens, temperature)
    except ValueError:
        await env.close()
        raise
    return await _episode(backend, tokenizer, env, sample, limits, seed=seed)


@dataclass(frozen=True)
class _Limits:
    max_turns: int
    max_seq_len: int
    max_new_tokens: int
    temperature: float

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_new_tokens < 1:
            raise ValueError("max_turns and max_new_tokens must be at least 1")


async def _episode(
    backend: RolloutBackend,
    tokenizer: Tokenizer,
    env: Environment,
    sample: VerifiedSample,
    limits: _Limits,
    *,
    seed: int,
    lockstep: _Lockstep | None = None,
    index: int = 0,
) -> Trajectory:
    """One rollout from start to reward; ``env`` is closed at the end, and a lockstep left, whatever happens."""
    try:
        try:
            tokens = _Tokens(
                backend, tokenizer, env, sample, limits, seed=seed, lockstep=lockstep, index=index
            )
            loop = TurnLoop(
                env=env, sample=sample, max_turns=limits.max_turns, generate=tokens.generate, budget=tokens
            )
            episode = await loop.run()
        finally:
            if lockstep is not None:  # done generating (or failed): the batch's next turns go without it
                lockstep.leave()
        trajectory = trajectory_of(
            episode,
            sample_id=sample.sample_id,
            seed=seed,
            tools=list(env.tools),
            prompt_ids=tokens.prompt_ids,
            response_ids=tokens.response_ids,
            response_mask=tokens.mask,
            logprobs=tokens.logprobs,
        )
        return await scored(env, trajectory)
    finally:
        await env.close()


def trajectory_of(
    episode: Episode,
    *,
    sample_id: str,
    seed: int,
    tools: list[dict[str, Any]],
    prompt_ids: list[int] | None = None,
    response_ids: list[int] | None = None,
    response_mask: list[int] | None = None,
    logprobs: list[float] | None = None,
) -> Trajectory:
    """The ``Trajectory`` of a finished episode, unscored; without token ids (an endpoint's), those
    four fields are empty."""
    return Trajectory(
        sample_id=sample_id,
        seed=seed,
        messages=episode.messages,
        tools=tools,
        prompt_ids=prompt_ids or [],
        response_ids=response_ids or [],
        response_mask=response_mask or [],
        logprobs=logprobs or [],
        turns=episode.turns,
        tool_calls=episode.tool_calls,
        invalid_calls=episode.invalid_calls,
        failed_calls=episode.failed_calls,
        user_turns=episode.user_turns,
        tool_outputs=episode.tool_outputs,
        tool_results=episode.tool_results,
        stop=episode.stop,
    )


async def scored(env: Environment, trajectory: Trajectory) -> Trajectory:
    """``trajectory`` with the environment's reward and its components."""
    reward, parts = await env.reward(trajectory)
    return trajectory.model_copy(update={"reward": reward, "reward_parts": parts})


@dataclass(frozen=True)
class RolloutJob:
    """One rollout of a batch: the sample, how to make its fresh environment, its seed."""

    sample: VerifiedSample
    make_env: Callable[[], Environment]
    seed: int


async def rollout_batch(
    backend: RolloutBackend,
    tokenizer: Tokenizer,
    jobs: Sequence[RolloutJob],
    *,
    seed: int,
    max_turns: int = 32,
    max_seq_len: int = 8192,
    max_new_tokens: int = 1024,
    temperature: float = 1.0,
    chunk: int | None = None,
) -> list[Trajectory]:
    """Roll every job out together, in lockstep: each turn of all live rollouts is one batched
    ``generate`` call (seeded from ``seed``), their tool and user steps run concurrently.

    ``chunk`` caps the rollouts in one lockstep batch; chunks run one after another. Give the
    sandbox pool's size: each rollout holds one session until it ends, and a rollout waiting for a
    free session would hold up its whole batch's next turn (with sessions held by that batch).
    Results are in job order and depend only on the seeds and the batch's composition. Each rollout
    closes its environment (one that never called holds no sandbox session, so none is left open
    if a ``make_env`` raises part-way); a rollout that raises leaves the batch and the error is
    raised once the others have finished.
    """
    limits = _Limits(max_turns, max_seq_len, max_new_tokens, temperature)
    size = len(jobs) if chunk is None else max(1, chunk)
    out: list[Trajectory] = []
    for c, start in enumerate(range(0, len(jobs), size)):
        part = jobs[start : start + size]
        out += await _lockstep_batch(backend, tokenizer, part, limits, seed=derive_seed(seed, "chunk", c))
    return out


async def _lockstep_batch(
    backend: RolloutBackend, tokenizer: Tokenizer, jobs: Sequence[RolloutJob], limits: _Limits, *, seed: int
) -> list[Trajectory]:
    lockstep = _Lockstep(backend, len(jobs), temperature=limits.temperature, seed=seed)
    episodes: list[Coroutine[Any, Any, Trajectory]] = []
    for i, job in enumerate(jobs):
        try:
            env = job.make_env()
        except BaseException:
            for episode in episodes:  # not started: their environments never opened a session
                episode.close()
            raise
        episodes.append(
            _episode(backend, tokenizer, env, job.sample, limits, seed=job.seed, lockstep=lockstep, index=i)
        )
    results = await asyncio.gather(*episodes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return [r for r in results if isinstance(r, Trajectory)]


async def rollout_group(
    backend: RolloutBackend,
    tokenizer: Tokenizer,
    make_env: Callable[[], Environment],
    sample: VerifiedSample,
    *,
    g: int,
    seed: int,
    max_turns: int = 32,
    max_seq_len: int = 8192,
    max_new_tokens: int = 1024,
    temperature: float = 1.0,
    chunk: int | None = None,
) -> list[Trajectory]:
    """G rollouts of one sample in lockstep batches (``rollout_batch``; ``chunk``: at most this many
    per batch, the sandbox pool's size); trajectory i has seed ``derive_seed(seed, "group", i)``."""
    jobs = [RolloutJob(sample, make_env, derive_seed(seed, "group", i)) for i in range(g)]
    return await rollout_batch(
        backend,
        tokenizer,
        jobs,
        seed=seed,
        max_turns=max_turns,
        max_seq_len=max_seq_len,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        chunk=chunk,
    )

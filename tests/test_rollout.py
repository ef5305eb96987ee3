"""The multi-turn rollout state machine, in the real sandbox with real environments.

Two backends drive it. A scripted backend (below) stands in for the model: it returns
predetermined assistant turns encoded with the real tokenizer, so every stop condition is hit
deterministically and the rewards are known. The real tiny ``HfBackend`` (random weights) writes
garbage, and the machine must still stop with consistent ids, masks and log-probs.

Every trajectory is checked the same way: the backend's outputs sit right after the prompts it
was given, the mask is 1 exactly on those tokens, the log-probs are the backend's there and 0
elsewhere, and rendering the final messages gives the rollout's ids back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import torch

from arena.llm.gateway import Gateway
from environments.environment import InteractiveEnvironment, QaEnvironment
from environments.render import IM_END, Tokenizer, assistant_text, encode_segment, render
from sandbox import SandboxPool
from simulator.backend import RulesBackend
from streams.envs.samples_verified import sample_of
from tests.test_environments import ORDER_SAMPLE, POOL, WEATHER, CountingPool, library_package
from trainer.policy import Generation, HfBackend, load_policy, stop_ids_of
from trainer.rollout import Trajectory, derive_seed, rollout, rollout_group
from trainer.tiny import build_tiny

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
PACKAGE = library_package()
SAMPLE = sample_of(PACKAGE)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Tokenizer]:
    torch.set_num_threads(1)
    texts = [SAMPLE.prompt[1]["content"], *(json.dumps(t) for t in SAMPLE.tools)]
    path = build_tiny(tmp_path_factory.mktemp("tiny"), texts, seed=0, vocab_size=512)
    return load_policy(path)


@pytest.fixture(scope="module")
def tok(tiny: tuple[Any, Tokenizer]) -> Tokenizer:
    return tiny[1]


def sandboxed(scenario: Callable[[SandboxPool], Awaitable[T]]) -> T:
    async def main() -> T:
        async with SandboxPool(POOL) as pool:
            return await scenario(pool)

    return asyncio.run(main())


class Recorder:
    """What a backend was asked and what it returned (prompt, max_new_tokens, seed, generation)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], int, int, Generation]] = []


class ScriptedBackend(Recorder):
    """Stands in for the model: the i-th call returns the i-th scripted turn (the last one repeats)."""

    def __init__(self, tokenizer: Tokenizer, turns: list[str], logprob: float = -0.25) -> None:
        super().__init__()
        self.turns = [encode_segment(tokenizer, text + IM_END) for text in turns]
        self.logprob = logprob
        self.batches = 0

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        """A batch (a lockstep turn of several rollouts) gets the call's scripted turn in every row."""
        ids = self.turns[min(self.batches, len(self.turns) - 1)]
        self.batches += 1
        out = ids[:max_new_tokens]
        gens = []
        for prompt in prompts:
            gen = Generation(token_ids=out, logprobs=[self.logprob] * len(out), finished=len(out) == len(ids))
            self.calls.append((prompt, max_new_tokens, seed, gen))
            gens.append(gen)
        return gens

    def load_weights(self, model: torch.nn.Module) -> None:
        return None


class Recording(Recorder):
    """The real backend, with its calls recorded (one entry per row of a batched call)."""

    def __init__(self, backend: HfBackend) -> None:
        super().__init__()
        self.backend = backend
        self.batches: list[int] = []
        """Rows of each call."""

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        gens = self.backend.generate(
            prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
        )
        self.batches.append(len(prompts))
        self.calls += [(p, max_new_tokens, seed, g) for p, g in zip(prompts, gens, strict=True)]
        return gens

    def load_weights(self, model: torch.nn.Module) -> None:
        self.backend.load_weights(model)


def turn(content: str = "", *calls: tuple[str, dict[str, Any]]) -> str:
    """An assistant body as the model would write it (the render layout of an OpenAI message)."""
    tool_calls = [{"function": {"name": n, "arguments": json.dumps(a)}} for n, a in calls]
    return assistant_text({"role": "assistant", "content": content, "tool_calls": tool_calls})


def check(traj: Trajectory, backend: Recorder, tok: Tokenizer, *, exact: bool = True) -> None:
    """Shapes, mask, log-probs and rendering of a trajectory against what the backend did."""
    full = traj.prompt_ids + traj.response_ids
    assert len(traj.response_ids) == len(traj.response_mask) == len(traj.logprobs)
    assert len(backend.calls) == traj.turns
    expected_mask = [0] * len(full)
    expected_logprobs = [0.0] * len(full)
    for prompt, _budget, _seed, gen in backend.calls:
        assert full[: len(prompt)] == prompt  # each turn continued exactly the sequence so far
        span = slice(len(prompt), len(prompt) + len(gen.token_ids))
        assert full[span] == gen.token_ids
        expected_mask[span] = [1] * len(gen.token_ids)
        expected_logprobs[span] = gen.logprobs
    assert traj.response_mask == expected_mask[len(traj.prompt_ids) :]  # 1 exactly on generated tokens
    assert traj.logprobs == expected_logprobs[len(traj.prompt_ids) :]
    rendered = render(tok, traj.messages, traj.tools).input_ids
    last_open = bool(traj.response_mask) and traj.response_mask[-1] == 1 and full[-1] != tok.eos_token_id
    if last_open:  # cut by the sequence budget: render closes the message the rollout left open
        rendered = rendered[: len(full)]
    if exact:
        assert rendered == full
    else:  # sampled ids need not be the tokenizer's own encoding of their text; the text is the same
        assert tok.decode(rendered, skip_special_tokens=False) == tok.decode(full, skip_special_tokens=False)


def qa_rollout(tok: Tokenizer, turns: list[str], **kwargs: Any) -> tuple[Trajectory, ScriptedBackend]:
    backend = ScriptedBackend(tok, turns)

    async def scenario(pool: SandboxPool) -> Trajectory:
        env = QaEnvironment(SAMPLE, PACKAGE, pool)
        return await rollout(backend, tok, env, SAMPLE, **{"seed": 7, "max_new_tokens": 256, **kwargs})

    return sandboxed(scenario), backend


LOOKUP_BOOK = turn("Looking up the book first.", ("get_book_author", {"book_id": "B-7"}))
LOOKUP_AUTHOR = turn("", ("get_author_country", {"author_id": "AU-3"}))
ANSWER = turn("The author of B-7 is from Portugal.")


def test_tool_calls_then_an_answer_stop_with_no_tool_call_and_f1_one(tok: Tokenizer) -> None:
    traj, backend = qa_rollout(tok, [LOOKUP_BOOK, LOOKUP_AUTHOR, ANSWER])
    check(traj, backend, tok)
    assert traj.stop == "no_tool_call" and traj.turns == 3 and traj.tool_calls == 2
    # n = 2 sub-tasks, both answers in the outputs, c = 2: r = p = 1, F1 = 1.
    assert traj.reward == pytest.approx(1.0)
    assert traj.reward_parts["n_hat"] == 2.0 and traj.reward_parts["c"] == 2.0
    assert [json.loads(o) for o in traj.tool_outputs] == [{"author_id": "AU-3"}, {"country": "Portugal"}]
    assert [m["role"] for m in traj.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    first = traj.messages[2]
    assert first["content"] == "Looking up the book first."
    assert first["tool_calls"][0]["function"] == {
        "name": "get_book_author",
        "arguments": '{"book_id": "B-7"}',
    }
    assert traj.messages[3]["tool_call_id"] == first["tool_calls"][0]["id"] == "call_1_0"
    assert traj.messages[-1] == {"role": "assistant", "content": "The author of B-7 is from Portugal."}
    assert [seed for _, _, seed, _ in backend.calls] == [derive_seed(7, "turn", t) for t in range(3)]
    assert all(budget == 256 for _, budget, _, _ in backend.calls)


class FailingBackend(ScriptedBackend):
    """Scripted turns until ``fail_at`` generations, then the backend breaks."""

    def __init__(self, tokenizer: Tokenizer, turns: list[str], fail_at: int) -> None:
        super().__init__(tokenizer, turns)
        self.fail_at = fail_at

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        if len(self.calls) >= self.fail_at:
            raise RuntimeError("backend gone")
        return super().generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)


def test_qa_rollouts_run_their_calls_in_one_session_each_closed_at_the_end(tok: Tokenizer) -> None:
    both = turn("", ("get_book_author", {"book_id": "B-7"}), ("get_city_temperature", {"city": "Oslo"}))

    async def scenario(pool: SandboxPool) -> tuple[Trajectory, list[Trajectory], CountingPool]:
        counting = CountingPool(pool)
        # Own tools and a mixed-in package's, three calls over two turns: one session.
        env = QaEnvironment(SAMPLE, PACKAGE, counting, {"get_city_temperature": WEATHER})
        one = await rollout(ScriptedBackend(tok, [both, LOOKUP_AUTHOR, ANSWER]), tok, env, SAMPLE, seed=7)
        assert len(counting.sessions) == 1 and counting.open == 0
        group = await rollout_group(
            ScriptedBackend(tok, [LOOKUP_BOOK]),
            tok,
            lambda: QaEnvironment(SAMPLE, PACKAGE, counting),
            SAMPLE,
            g=3,
            seed=1,
            max_turns=2,
            chunk=POOL.pool_size,  # lockstep batches no bigger than the pool: none waits for a session
        )
        assert len(counting.sessions) == 4 and counting.open == 0
        # A rollout that raises after its first call still frees its session.
        broken = QaEnvironment(SAMPLE, PACKAGE, counting)
        with pytest.raises(RuntimeError, match="backend gone"):
            await rollout(FailingBackend(tok, [LOOKUP_BOOK], fail_at=1), tok, broken, SAMPLE)
        assert len(counting.sessions) == 5 and counting.open == 0
        return one, group, counting

    one, group, _ = sandboxed(scenario)
    assert one.tool_calls == 3 and one.failed_calls == 0 and one.reward == pytest.approx(0.8)
    assert [json.loads(o) for o in one.tool_outputs] == [
        {"author_id": "AU-3"},
        {"celsius": -3},
        {"country": "Portugal"},
    ]
    assert [(t.tool_calls, len(t.tool_outputs), t.stop) for t in group] == [(2, 2, "max_turns")] * 3


def test_max_turns_stops_after_the_last_turns_calls_ran(tok: Tokenizer) -> None:
    traj, backend = qa_rollout(tok, [LOOKUP_BOOK], max_turns=3)
    check(traj, backend, tok)
    assert traj.stop == "max_turns" and traj.turns == 3 and traj.tool_calls == 3
    assert traj.messages[-1]["role"] == "tool" and len(traj.tool_outputs) == 3
    # n_hat = 1 (AU-3), c = 3: r = 1/2, p = 1/3, F1 = 2 * (1/3) * (1/2) / (1/3 + 1/2) = 0.4.
    assert traj.reward == pytest.approx(0.4)


def test_max_length_truncates_the_generation_budget(tok: Tokenizer) -> None:
    script = [LOOKUP_BOOK, LOOKUP_AUTHOR, ANSWER]
    free, free_backend = qa_rollout(tok, script)
    second_prompt = len(free_backend.calls[1][0])  # where the second turn starts

    traj, backend = qa_rollout(tok, script, max_seq_len=second_prompt + 5)
    check(traj, backend, tok)
    assert traj.stop == "max_length" and traj.turns == 2
    room = second_prompt + 5 - len(traj.prompt_ids)
    assert [budget for _, budget, _, _ in backend.calls] == [min(256, room), 5]  # cut to what fits
    assert len(traj.prompt_ids) + len(traj.response_ids) == second_prompt + 5
    assert traj.response_ids == free.response_ids[: len(traj.response_ids)]
    assert traj.tool_calls == 1 and traj.reward == pytest.approx(2 / 3)  # r = 1/2, p = 1: F1 = 2/3

    # The observation of the first turn does not fit: dropped, so nothing is solved.
    first_turn = len(free.prompt_ids) + len(backend.calls[0][3].token_ids)
    cut, cut_backend = qa_rollout(tok, script, max_seq_len=first_turn + 3)
    check(cut, cut_backend, tok)
    assert cut.stop == "max_length" and cut.turns == 1 and cut.tool_calls == 1
    assert cut.tool_outputs == [] and cut.messages[-1]["role"] == "assistant" and cut.reward == 0.0

    # A prompt that does not fit at all: no turn.
    none, none_backend = qa_rollout(tok, script, max_seq_len=len(free.prompt_ids))
    assert (
        none.stop == "max_length" and none.turns == 0 and none.response_ids == [] and not none_backend.calls
    )


def test_invalid_and_failed_calls_count_in_c(tok: Tokenizer) -> None:
    invalid = '<tool_call>\n{"name": "get_book_author", "arguments": "B-7"}\n</tool_call>'
    unknown = turn("", ("get_book_price", {"book_id": "B-7"}))
    traj, backend = qa_rollout(tok, [f"{invalid}\n{LOOKUP_BOOK}", unknown, ANSWER])
    check(traj, backend, tok)
    assert traj.stop == "no_tool_call" and traj.turns == 3
    assert traj.tool_calls == 3 and traj.invalid_calls == 1 and traj.failed_calls == 1
    tool_texts = [m["content"] for m in traj.messages if m["role"] == "tool"]
    assert tool_texts[1].startswith("error: invalid tool call") and "unknown tool" in tool_texts[2]
    # The turn with an invalid block keeps its raw text, so it renders back to what was generated.
    assert traj.messages[2] == {"role": "assistant", "content": f"{invalid}\n{LOOKUP_BOOK}"}
    # n_hat = 1, c = 3: r = 1/2, p = 1/3, F1 = 0.4.
    assert traj.reward == pytest.approx(0.4) and traj.reward_parts["c"] == 3.0


def test_a_turn_cut_at_max_new_tokens_is_closed_unchosen(tok: Tokenizer) -> None:
    traj, backend = qa_rollout(tok, [ANSWER], max_new_tokens=4)
    check(traj, backend, tok)
    assert traj.stop == "no_tool_call" and traj.turns == 1
    # 4 generated tokens, then <|im_end|> and the separator added with mask 0.
    assert traj.response_mask == [1, 1, 1, 1, 0, 0]
    assert traj.response_ids[4] == tok.eos_token_id and traj.logprobs[4:] == [0.0, 0.0]


def test_interactive_rollout_runs_until_the_user_stops(tok: Tokenizer) -> None:
    script = [
        turn("", ("get_order", {"order_id": "O-1001"})),
        turn("I found order O-1001. Why do you want to cancel it?"),
        turn("", ("cancel_order", {"order_id": "O-1001", "reason": "no longer needed"})),
        turn("Your order O-1001 has been cancelled."),
    ]
    backend = ScriptedBackend(tok, script)

    async def scenario(pool: SandboxPool) -> Trajectory:
        env = InteractiveEnvironment(ORDER_SAMPLE, pool, Gateway(RulesBackend(seed=0)))
        return await rollout(backend, tok, env, ORDER_SAMPLE, seed=1, max_new_tokens=256)

    traj = sandboxed(scenario)
    check(traj, backend, tok)
    assert traj.stop == "user_stop" and traj.turns == 4 and traj.user_turns == 1 and traj.tool_calls == 2
    assert traj.reward == 1.0 and traj.reward_parts["key_call"] == 1.0
    user = [m["content"] for m in traj.messages if m["role"] == "user"]
    assert len(user) == 2 and user[1].casefold().endswith("the reason is: no longer needed.")


def test_tiny_hf_backend_rollouts_stop_with_consistent_shapes(tiny: tuple[Any, Tokenizer]) -> None:
    model, tok = tiny
    hf = HfBackend(model, tok, stop_ids_of(tok))

    async def scenario(
        pool: SandboxPool,
    ) -> tuple[list[Trajectory], list[Trajectory], Trajectory, list[Recording]]:
        backends = [Recording(hf) for _ in range(3)]
        groups = []
        for backend in backends[:2]:
            groups.append(
                await rollout_group(
                    backend,
                    tok,
                    lambda: QaEnvironment(SAMPLE, PACKAGE, pool),
                    SAMPLE,
                    g=2,
                    seed=11,
                    max_new_tokens=12,
                    max_seq_len=2048,
                )
            )
        # Interactive: the rules user keeps the dialogue going for a few turns of garbage.
        env = InteractiveEnvironment(ORDER_SAMPLE, pool, Gateway(RulesBackend(seed=0)))
        dialogue = await rollout(
            backends[2], tok, env, ORDER_SAMPLE, seed=3, max_new_tokens=12, max_seq_len=2048
        )
        return groups[0], groups[1], dialogue, backends

    first, again, dialogue, backends = sandboxed(scenario)
    assert [t.response_ids for t in first] == [t.response_ids for t in again]  # seeded
    assert [t.seed for t in first] == [derive_seed(11, "group", i) for i in range(2)]
    assert first[0].response_ids != first[1].response_ids  # distinct seeds, distinct samples
    for traj in [*first, dialogue]:
        assert traj.stop in ("no_tool_call", "max_turns", "max_length", "user_stop")
        assert len(traj.response_ids) == len(traj.response_mask) == len(traj.logprobs)
        assert all(lp < 0 for lp, m in zip(traj.logprobs, traj.response_mask, strict=True) if m)
    # The group's trajectories interleave on one recorder; check the dialogue on its own.
    check(dialogue, backends[2], tok, exact=False)
    assert dialogue.turns >= 2 and dialogue.user_turns >= 1 and dialogue.stop == "user_stop"
    assert dialogue.reward == 0.0  # nothing was cancelled
    # The group's rollouts were batched: every call carried the live rollouts' turns as its rows.
    assert backends[0].batches[0] == 2 and sum(backends[0].batches) == sum(t.turns for t in first)
    for traj in first:  # each row belongs to the rollout whose sequence it continues
        full = traj.prompt_ids + traj.response_ids
        mine = Recorder()
        mine.calls = [
            c
            for c in backends[0].calls
            if full[: len(c[0])] == c[0]
            and full[len(c[0]) : len(c[0]) + len(c[3].token_ids)] == c[3].token_ids
        ]
        check(traj, mine, tok, exact=False)

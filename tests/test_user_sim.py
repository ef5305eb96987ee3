"""The user simulator as text a policy learns and speaks (EigenData §5 user-model fine-tuning).

- ``user_view_messages`` -> ``render`` -> the simulator's prompt and a gold body -> ``parse_user_turn``
  round-trips, and the simulator's prompt is exactly the prefix SFT trained on;
- a tiny Llama SFT-trained on a handful of user-target samples plays the user of a real
  ``InteractiveEnvironment`` (customer-service pack, real sandbox): its generated body is parsed,
  its user tool runs in the sandbox and its ###STOP### ends the rollout;
- the trainer service freezes the policy at the end of SFT as the user of GRPO rollouts, records
  the choice, and reloads the same frozen weights on resume.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from arena.config import ArenaSettings
from arena.records.envs import VerifiedSample
from arena.records.sft import SftSample
from environments.environment import InteractiveEnvironment
from environments.factory import environment_for
from environments.render import IM_END, ToolCall, encode_segment, render, render_text
from environments.user_view import (
    STOP,
    GatewayUserSimulator,
    ParsedUserTurn,
    UserContext,
    ViewTurn,
    user_body,
    user_view_messages,
)
from sandbox import SandboxPool
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.verification import build_instance, interactive_sample
from tests.fixtures.domain import sandboxed
from trainer.policy import Generation, HfBackend, stop_ids_of
from trainer.rollout import rollout
from trainer.service import TrainerService, TrainOptions, UserSimChoice, user_simulator_kind
from trainer.sft import sft_example, sft_loss_backward
from trainer.tiny import build_tiny
from trainer.user_sim import PolicyUserSimulator, read_user_generation, user_prompt_ids

pytestmark = pytest.mark.timeout(240)
torch.set_num_threads(1)

SEED = 3
ASKS = [
    "I have sent a verification code to your phone. Please confirm it in the app.",
    "A one-time code is on its way to your phone; please confirm it in your app.",
    "Please confirm the code I just texted you, in the app.",
    "Code sent. Could you confirm it in the app, please?",
]
"""Agent messages asking the user to confirm the texted code (the tiny user model trains on the first two)."""
TRAINED_ASKS = ASKS[:2]
THANKS = "Thanks, I confirmed the code in the app."


def instance(pack: DomainPack) -> tuple[dict[str, Any], VerifiedSample]:
    built = build_instance(pack, SEED)
    return built, interactive_sample(pack, built)


def confirm_call(built: dict[str, Any]) -> ToolCall:
    """The reference's user-tool call that confirms the texted code."""
    call = next(c for c in built["reference_calls"] if c["name"] == "confirm_identity_code")
    assert call["actor"] == "user"
    return ToolCall(name=call["name"], arguments=call["arguments"])


def context(built: dict[str, Any], turns: Sequence[ViewTurn], turn: int = 0) -> UserContext:
    return UserContext(
        instructions=built["user_instructions"],
        requirements=built["requirements"],
        user_tools=built["user_tools"],
        turns=list(turns),
        turn=turn,
    )


def opening(built: dict[str, Any]) -> ViewTurn:
    return ViewTurn(role="user", text=built["requirements"][0], actions=[])


def gold_messages(built: dict[str, Any], ask: str) -> list[dict[str, Any]]:
    """A user-view SFT conversation: opening, the agent's request, the gold confirming reply + STOP."""
    turns = [
        opening(built),
        ViewTurn(role="assistant", text=ask, actions=[]),
        ViewTurn(role="user", text=THANKS, actions=[confirm_call(built)]),
    ]
    return user_view_messages(
        built["user_instructions"], built["requirements"], built["user_tools"], turns, end_signal="stop"
    )


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory, pack: DomainPack) -> Path:
    built, sample = instance(pack)
    texts = [render_text(gold_messages(built, a), built["user_tools"]) for a in ASKS] + [
        render_text(sample.prompt, sample.tools)
    ]
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", texts, seed=0)


def tokenizer_of(path: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


# --------------------------------------------------------------------------- text round trip


def test_user_view_render_parse_round_trip(tiny_path: Path, pack: DomainPack) -> None:
    tok = tokenizer_of(tiny_path)
    built, _ = instance(pack)
    messages = gold_messages(built, ASKS[0])
    assert messages[-1] == {"role": "user", "content": user_body(THANKS, [confirm_call(built)], "stop")}
    rendered = render(tok, messages, built["user_tools"], role_target="user")
    # The simulator's prompt for the dialogue before the last user turn is the SFT render's prefix.
    prompt = user_prompt_ids(
        tok, context(built, [opening(built), ViewTurn(role="assistant", text=ASKS[0], actions=[])])
    )
    assert rendered.input_ids[: len(prompt)] == prompt
    assert rendered.loss_mask[len(prompt) - 1] == 0  # the user header is never trained
    # What follows the prompt is the trained gold body, closed by <|im_end|>, then the separator.
    end = len(rendered.input_ids) - len(encode_segment(tok, "\n"))
    body = rendered.input_ids[len(prompt) : end]
    assert set(rendered.loss_mask[len(prompt) : end]) == {1} and set(rendered.loss_mask[end:]) == {0}
    assert body == encode_segment(tok, messages[-1]["content"] + IM_END)
    parsed = read_user_generation(tok, body)
    assert parsed == ParsedUserTurn(message=THANKS, actions=[confirm_call(built)], signal="stop")
    # user bodies only: the agent's turn is context
    agent_start = len(render(tok, messages[:2], built["user_tools"], role_target="user").input_ids)
    assert set(rendered.loss_mask[agent_start : agent_start + 5]) == {0}


def test_reading_generations_never_fails_a_rollout(tiny_path: Path) -> None:
    tok = tokenizer_of(tiny_path)

    def read(text: str) -> ParsedUserTurn:
        return read_user_generation(tok, encode_segment(tok, text))

    assert read("") == STOP
    assert read(IM_END) == STOP
    assert read("   " + IM_END + "Sure.") == STOP  # nothing before <|im_end|>
    only_call = read('<tool_call>{"name": "approve_charge", "arguments": {"charge_id": "CH-1"}}</tool_call>')
    assert only_call.signal == "stop" and [a.name for a in only_call.actions] == ["approve_charge"]
    assert read("<tool_call>{not json</tool_call>") == STOP  # an unparseable call is dropped
    assert read("Yes, go ahead." + IM_END) == ParsedUserTurn(
        message="Yes, go ahead.", actions=[], signal="continue"
    )
    cut = read("I will wait. ###TRANSFER### and some trailing words")
    assert (cut.message, cut.signal) == ("I will wait.", "transfer")
    assert read("No idea. ###OUT-OF-SCOPE###").signal == "out_of_scope"


# --------------------------------------------------------------------------- a trained policy user


def sft_train(
    path: Path, built: dict[str, Any], steps: int = 200
) -> tuple[Any, PreTrainedTokenizerBase, float]:
    """A few steps of SFT on user-target samples (the trainer's loss), until the gold reply is learned."""
    tok = tokenizer_of(path)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    model.train()
    samples = [
        SftSample(
            sample_id=f"u-{i}",
            messages=gold_messages(built, ask),
            tools=built["user_tools"],  # as the EigenData stage emits them
            role_target="user",
            source="test",
        )
        for i, ask in enumerate(TRAINED_ASKS)
    ]
    examples = [sft_example(tok, s, 4096) for s in samples]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    loss = float("inf")
    for _ in range(steps):
        loss, _tokens = sft_loss_backward(model, examples, int(tok.pad_token_id), micro=4)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if loss < 0.02:
            break
    model.eval()
    return model, tok, loss


@pytest.fixture(scope="module")
def trained(tiny_path: Path, pack: DomainPack) -> tuple[Any, PreTrainedTokenizerBase]:
    built, _ = instance(pack)
    model, tok, loss = sft_train(tiny_path, built)
    assert loss < 0.02, f"the tiny model did not learn the user reply (loss {loss:.3f})"
    return model, tok


class ScriptedAgent:
    """A RolloutBackend for the agent: sends the verification code, then asks the user to confirm it."""

    def __init__(self, tok: PreTrainedTokenizerBase, user_id: str) -> None:
        self.tok = tok
        self.call = json.dumps({"name": "send_verification_code", "arguments": {"user_id": user_id}})

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        out = []
        for prompt in prompts:
            text = self.tok.decode(prompt, skip_special_tokens=False)
            body = ASKS[0] if "<tool_response>" in text else f"<tool_call>\n{self.call}\n</tool_call>"
            ids = encode_segment(self.tok, body + IM_END)
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), finished=True))
        return out

    def load_weights(self, model: torch.nn.Module) -> None:
        pass


def test_sft_trained_policy_user_runs_its_tool_and_stops_the_rollout(
    trained: tuple[Any, PreTrainedTokenizerBase],
    pack: DomainPack,
) -> None:
    model, tok = trained
    built, sample = instance(pack)
    confirm = confirm_call(built)
    user_id = confirm.arguments["user_id"]
    backend = HfBackend(model, tok, stop_ids_of(tok))
    agent = ScriptedAgent(tok, user_id)
    user = PolicyUserSimulator(backend, tok, max_new_tokens=160, temperature=0.3, seed=7, lock_with=agent)

    async def scenario(
        pool: SandboxPool,
    ) -> tuple[InteractiveEnvironment, Any, ParsedUserTurn, ParsedUserTurn]:
        # The generated body itself: parsed into the gold call, message and signal, reproducibly.
        ctx = context(built, [opening(built), ViewTurn(role="assistant", text=ASKS[0], actions=[])])
        first, again = await user.reply(ctx), await user.reply(ctx)
        env = environment_for(sample, pool, user=user)
        assert isinstance(env, InteractiveEnvironment)
        trajectory = await rollout(
            agent, tok, env, sample, max_turns=4, max_seq_len=8192, max_new_tokens=64, seed=1
        )
        return env, trajectory, first, again

    env, trajectory, first, again = sandboxed(scenario)
    assert first == again == ParsedUserTurn(message=THANKS, actions=[confirm], signal="stop")
    # The rollout: agent call, agent message, the user's tool + ###STOP### -> user_stop.
    assert trajectory.stop == "user_stop" and trajectory.turns == 2 and trajectory.user_turns == 0
    assert env.signal == "stop" and env.user_replies == 0
    assert [(c.name, c.actor, c.ok, c.changed_state) for c in env.calls] == [
        ("send_verification_code", "agent", True, True),
        ("confirm_identity_code", "user", True, True),  # ran in the sandbox against the same state
    ]
    assert env.state["session"]["verified_user_id"] == user_id
    assert trajectory.reward == 0.0  # the rest of the task was never done: the verifier says no


def test_an_untrained_policy_user_never_breaks_the_dialogue(tiny_path: Path, pack: DomainPack) -> None:
    tok = tokenizer_of(tiny_path)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_path), dtype=torch.float32, local_files_only=True)
    built, sample = instance(pack)
    user = PolicyUserSimulator(HfBackend(model, tok, stop_ids_of(tok)), tok, max_new_tokens=24, seed=1)

    class NeverCalled:
        def generate(self, prompts: list[list[int]], **_: Any) -> list[Generation]:
            raise AssertionError("a prompt with no room left must not be generated from")

        def load_weights(self, model: torch.nn.Module) -> None:
            pass

    cramped = PolicyUserSimulator(NeverCalled(), tok, max_seq_len=64)

    async def scenario(pool: SandboxPool) -> list[str | None]:
        env = InteractiveEnvironment(sample, pool, user)
        try:
            replies = [await env.user_turn(ask) for ask in ASKS]
            offered = {t["function"]["name"] for t in built["user_tools"]}
            assert all(c.actor == "user" and c.name in offered for c in env.calls)  # only user tools ever run
            assert await cramped.reply(env.user_context()) == STOP
        finally:
            await env.close()
        return replies

    replies = sandboxed(scenario)
    # Random weights write garbage: it is either a message for the agent or the end of the dialogue.
    said = [r for r in replies if r is not None]
    assert all(r.strip() for r in said)
    assert replies == sandboxed(lambda pool: _replay(pool, sample, user))  # seeded: the same again


async def _replay(pool: SandboxPool, sample: VerifiedSample, user: PolicyUserSimulator) -> list[str | None]:
    env = InteractiveEnvironment(sample, pool, user)
    try:
        return [await env.user_turn(ask) for ask in ASKS]
    finally:
        await env.close()


# --------------------------------------------------------------------------- the trainer's choice


def test_user_simulator_kind_rule() -> None:
    assert user_simulator_kind("auto", 0) == "gateway"
    assert user_simulator_kind("auto", 3) == "policy"
    assert user_simulator_kind("gateway", 3) == "gateway"
    assert user_simulator_kind("policy", 0) == "policy"


def _params(model: Any) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _same(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_service_freezes_the_sft_policy_as_user_and_reloads_it_on_resume(tmp_path: Path) -> None:
    settings = ArenaSettings(home=tmp_path / "home", train={"run": "usersim", "sft_steps": 2})
    out = io.StringIO()

    def service(resume: bool) -> TrainerService:
        return TrainerService(
            settings, "127.0.0.1:9", TrainOptions(tiny=True, resume=resume), Console(file=out)
        )

    first = service(False)
    first._load()
    assert first.learner is not None and first.episodes is not None
    assert first.phase == "sft" and first.user_sim is None and first._user_sim_metrics() == {}
    # Two SFT steps happened; some of their samples were user-target ones.
    with torch.no_grad():
        for p in first.learner.model.parameters():
            p.add_(0.01)
    first.step = first.sft_step = 2
    first.sft_user_samples = 3
    sft_end = _params(first.learner.model)
    asyncio.run(first._enter_grpo())
    assert first.user_sim == UserSimChoice(kind="policy", sft_step=2)
    assert first._user_sim_metrics() == {"user_sim_policy": 1.0, "user_sim_sft_step": 2.0}
    user = first.episodes.user_simulator()
    assert isinstance(user, PolicyUserSimulator) and user.lock_with is first.learner.backend
    assert isinstance(user.backend, HfBackend) and user.backend.model is not first.learner.model
    assert not any(p.requires_grad for p in user.backend.model.parameters())
    assert 2 in first.checkpoints.weights_steps()
    # GRPO changes the policy, never the user.
    with torch.no_grad():
        for p in first.learner.model.parameters():
            p.mul_(1.5)
    grpo_weights = _params(first.learner.model)
    assert _same(_params(user.backend.model), sft_end) and not _same(grpo_weights, sft_end)
    first.step = 3
    first.checkpoints.save_state(3, "grpo", first._state(), keep=2)
    _dispose(first)

    again = service(True)
    again._load()
    assert again.learner is not None and again.episodes is not None
    assert again.phase == "grpo" and again.user_sim == UserSimChoice(kind="policy", sft_step=2)
    assert again.sft_user_samples == 3
    restored = again.episodes.user_simulator()
    assert isinstance(restored, PolicyUserSimulator) and isinstance(restored.backend, HfBackend)
    assert _same(_params(restored.backend.model), sft_end)
    assert _same(_params(again.learner.model), grpo_weights)
    assert "the policy frozen at step 2" in out.getvalue()
    _dispose(again)

    # auto without user-target SFT samples: the gateway's role plays the user.
    settings = ArenaSettings(home=tmp_path / "home", train={"run": "gateway-user", "sft_steps": 2})
    plain = service(False)
    plain._load()
    assert plain.episodes is not None
    asyncio.run(plain._enter_grpo())
    assert plain.user_sim == UserSimChoice(kind="gateway") and plain._user_sim_metrics() == {
        "user_sim_policy": 0.0
    }
    assert isinstance(plain.episodes.user_simulator(), GatewayUserSimulator)
    _dispose(plain)


def _dispose(svc: TrainerService) -> None:
    if svc.episodes is not None:
        asyncio.run(svc.episodes.close())
    svc.checkpoints.dispose()
    svc.catalog.dispose()
    svc._tmp.cleanup()

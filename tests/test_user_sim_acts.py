"""The rules user simulator acts in its app (issue 17 item 2), in synthesis and in RL/eval alike.

Real sandbox, the built-in customer_service pack's reference task (a damaged item refunded after
the user confirms the identity code and reports the damage in the app, both user tools), and its
generated verification function as the score. The user is the DEFAULT simulated user: the
gateway's rules backend with the stock ``user_simulator`` rule, which knows no tool names. Only
the agent is scripted:

- a perfect agent makes the reference agent calls and asks the user, in words, to do the user's
  part in the app; it scores 1.0 -- the user's own tool calls ran (nothing fills them in);
- a do-nothing agent apologises every turn; it scores 0.

The same holds in the EigenData dialogue loop (``synthesize_dialog``) and in an interactive
RL/eval episode (``trainer.evaluate.evaluate`` over ``InteractiveEnvironment``). Then each
behaviour rate (incomplete information, goal changes, mistakes) and the persona's tone changes
what the user does, measurably, and the perfect agent still scores 1.0.
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel
from transformers import AutoTokenizer

from arena.config import ArenaSettings, SandboxSettings
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import (
    DialogueMessage,
    UserAction,
    UserActionResult,
    UserBehaviour,
    UserSimInput,
    user_behaviour,
)
from arena.records.eigen import Dialog, DifficultyFactors, Goal, GoalCall, Persona, UserIntent
from environments.environment import InteractiveEnvironment, read_verdict, verify_program
from environments.render import IM_END, encode_segment, render_text
from environments.user_view import GatewayUserSimulator
from sandbox import SandboxPool
from simulator import RULES
from simulator.backend import RulesBackend
from simulator.user_sim import CHANGED_MIND, DETAILS, THANKS, changed, user_turn
from synthesis.eigen.dialog_loop import synthesize_dialog
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.roles.dialogs import AgentStep, AgentToolCall, TrajectoryAgentInput
from synthesis.eigen.roles.tasks import DEFAULT_PERSONAS
from synthesis.eigen.verification import build_instance, interactive_sample
from trainer.evaluate import EvalReport, evaluate, interactive_cases
from trainer.policy import Generation
from trainer.tiny import build_tiny

pytestmark = pytest.mark.timeout(300)
torch.set_num_threads(1)

SEEDS = (3, 5)
DONE = "Everything is done. Is there anything else?"
SORRY = "Sorry, I cannot help with that."
POOL = SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 10.0})


def ask(call: dict[str, Any]) -> str:
    """How a perfect agent asks for a user action: in words, naming what to do in the app."""
    return f"Please {call['name'].replace('_', ' ')} in the app."


def segments(built: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The reference calls as runs of one actor, in order."""
    runs: list[tuple[str, list[dict[str, Any]]]] = []
    for call in built["reference_calls"]:
        if runs and runs[-1][0] == call["actor"]:
            runs[-1][1].append(call)
        else:
            runs.append((call["actor"], [call]))
    return runs


@pytest.fixture(scope="module")
def built(pack: DomainPack) -> list[dict[str, Any]]:
    out = [build_instance(pack, seed) for seed in SEEDS]
    for instance in out:  # the task is dual control: the user has its part to do
        assert {c["name"] for c in instance["reference_calls"] if c["actor"] == "user"} == {
            "confirm_identity_code",
            "report_damage",
        }
    return out


def intent_of(pack: DomainPack, instance: dict[str, Any], persona: Persona | None = None) -> UserIntent:
    """The reference task as a user intent: its requirements, the user's planned app actions, and
    only the email as a structured fact (the code on the phone is in the instructions' words)."""
    calls = instance["reference_calls"]
    email = next(c["arguments"]["email"] for c in calls if c["name"] == "find_user_by_email")
    writes = [c for c in calls if c["actor"] == "user" or c["changed_state"]]
    return UserIntent(
        domain=pack.name,
        seed=instance["seed"],
        persona=persona or DEFAULT_PERSONAS[0],
        objective=instance["user_instructions"],
        reason_for_call=instance["requirements"][0],
        known_info={"email": email},
        requirements=instance["requirements"],
        difficulty=DifficultyFactors(required_calls=len(calls)),
        goals=[
            Goal(
                kind="reference",
                requirement=instance["requirements"][0],
                calls=[GoalCall(name=c["name"], arguments=c["arguments"], actor=c["actor"]) for c in writes],
            )
        ],
    )


# --------------------------------------------------------------------------- synthesis


def scripted_agent(instances: list[dict[str, Any]], perfect: bool) -> Any:
    """A TrajectoryAgent rule: the reference calls and the asks for the user's part, in order; a step
    is done when its calls ran (agent) or the app reports them done (user), so a failed user action
    is asked for again. It asks for the email first when the user has not given it."""
    plans = {i["requirements"][0]: segments(i) for i in instances}

    def rule(inputs: BaseModel, rng: random.Random) -> BaseModel:
        assert isinstance(inputs, TrajectoryAgentInput)
        if not perfect:
            return AgentStep(message=SORRY)
        users = " ".join(str(m.get("content")) for m in inputs.messages if m.get("role") == "user")
        plan = next(p for opening, p in plans.items() if opening in users)
        email = plan[0][1][0]["arguments"]["email"]
        if email not in users:
            return AgentStep(message="Could you tell me the email on your account?")
        ran = [
            (call["function"]["name"], json.loads(call["function"]["arguments"]))
            for m in inputs.messages
            for call in m.get("tool_calls") or []
        ]
        for actor, calls in plan:
            if actor == "agent" and any((c["name"], c["arguments"]) not in ran for c in calls):
                return AgentStep(
                    tool_calls=[AgentToolCall(name=c["name"], arguments=c["arguments"]) for c in calls]
                )
            if actor == "user":
                todo = [c for c in calls if not any(e.ok and e.name == c["name"] for e in inputs.app_events)]
                if todo:
                    return AgentStep(message=" ".join(ask(c) for c in todo))
        return AgentStep(message=DONE)

    return rule


def synthesize(
    pack: DomainPack,
    instances: list[dict[str, Any]],
    *,
    perfect: bool = True,
    behaviour: UserBehaviour | None = None,
    persona: Persona | None = None,
) -> list[tuple[Dialog, float]]:
    """One dialogue per instance with the default user and the scripted agent, and its score."""
    rules = {**RULES, "eigen_trajectory_agent": scripted_agent(instances, perfect)}
    gateway = Gateway(RulesBackend(seed=0, rules=rules))

    async def main() -> list[tuple[Dialog, float]]:
        out = []
        async with SandboxPool(POOL) as pool:
            for instance in instances:
                dialog = await synthesize_dialog(
                    pack,
                    intent_of(pack, instance, persona),
                    instance["initial_state"],
                    gateway,
                    pool,
                    behaviour=behaviour,
                )
                program = verify_program(
                    instance["verify"], dialog.initial_state, dialog.final_state, dialog.records()
                )
                verdict = read_verdict(await pool.run(program))
                assert not isinstance(verdict, str), verdict
                out.append((dialog, 1.0 if verdict.passed else 0.0))
        return out

    return asyncio.run(main())


def user_texts(dialog: Dialog) -> list[str]:
    return [str(m["content"]) for m in dialog.messages if m["role"] == "user"]


def test_synthesis_perfect_agent_scores_1_and_do_nothing_0_against_the_default_user(
    pack: DomainPack, built: list[dict[str, Any]]
) -> None:
    perfect = synthesize(pack, built)
    for (dialog, score), instance in zip(perfect, built, strict=True):
        assert score == 1.0 and dialog.end_signal == "stop", user_texts(dialog)
        user_calls = [(c.name, c.ok) for c in dialog.calls if c.actor == "user"]
        assert user_calls == [("confirm_identity_code", True), ("report_damage", True)]
        # The code came from the instructions' words, the report from the user's own plan.
        confirm = next(c for c in dialog.calls if c.name == "confirm_identity_code")
        assert confirm.arguments["code"] in instance["user_instructions"]
        # The user reported what the app showed.
        assert any('"verified": true' in t for t in user_texts(dialog))
    for dialog, score in synthesize(pack, built, perfect=False):
        assert score == 0.0 and not [c for c in dialog.calls if c.actor == "user"]


def test_behaviour_rates_change_the_user_and_the_perfect_agent_still_scores_1(
    pack: DomainPack, built: list[dict[str, Any]]
) -> None:
    plain = synthesize(pack, built[:1])[0][0]
    assert not any(CHANGED_MIND in t or DETAILS in t for t in user_texts(plain))

    mistaken, score = synthesize(pack, built[:1], behaviour=UserBehaviour(mistakes=1.0))[0]
    tries = [(c.name, c.ok) for c in mistaken.calls if c.actor == "user"]
    # The first code is mistyped: the app refuses it, the user says so, the agent asks again and
    # the user enters the right one.
    assert tries[:2] == [("confirm_identity_code", False), ("confirm_identity_code", True)], tries
    assert any("but it says" in t and "does not match" in t for t in user_texts(mistaken))
    assert score == 1.0

    switched, score = synthesize(pack, built[:1], behaviour=UserBehaviour(goal_change=1.0))[0]
    texts = user_texts(switched)
    # A request is first stated with a number changed, then restated right on the next reply.
    fixed = next(n for n, t in enumerate(texts) if CHANGED_MIND in t)
    wrong_first = [
        r for r in built[0]["requirements"] if str(changed(r)) in texts[fixed - 1] and r in texts[fixed]
    ]
    assert wrong_first and score == 1.0

    withheld, score = synthesize(pack, built[:1], behaviour=UserBehaviour(incomplete_info=1.0))[0]
    texts = user_texts(withheld)
    email = intent_of(pack, built[0]).known_info["email"]
    assert email not in texts[0] and any(f"My email is {email}." in t for t in texts[1:])
    assert score == 1.0

    curt, score = synthesize(
        pack, built[:1], persona=Persona(role="buyer", expertise="frequent", tone="curt")
    )[0]
    assert (user_texts(plain)[-1], user_texts(curt)[-1]) == (THANKS, "Thanks.") and score == 1.0


def test_rates_between_0_and_1_are_seeded_draws() -> None:
    half = UserBehaviour(mistakes=0.5, seed=1)
    draws = [half.happens(half.mistakes, "scenario", n) for n in range(400)]
    assert 150 < sum(draws) < 250
    assert draws == [half.happens(half.mistakes, "scenario", n) for n in range(400)]
    other = UserBehaviour(mistakes=0.5, seed=2)
    assert draws != [other.happens(other.mistakes, "scenario", n) for n in range(400)]


def test_settings_feed_the_behaviour(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARENA_USER_SIM__MISTAKES", "0.25")
    monkeypatch.setenv("ARENA_USER_SIM__SEED", "7")
    behaviour = user_behaviour(ArenaSettings())
    assert (behaviour.mistakes, behaviour.incomplete_info, behaviour.goal_change, behaviour.seed) == (
        0.25,
        0,
        0,
        7,
    )


# --------------------------------------------------------------------------- a pack it has never seen

DEVICE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "toggle_airplane_mode",
            "description": "Switch airplane mode on the user's phone on or off.",
            "parameters": {
                "type": "object",
                "properties": {"enabled": {"type": "boolean", "description": "On (true) or off (false)."}},
                "required": ["enabled"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "reboot_device",
            "description": "Restart the phone.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "enter_pin",
            "description": "Type the SIM PIN into the phone.",
            "parameters": {
                "type": "object",
                "properties": {"pin": {"type": "string", "description": "The four-digit PIN."}},
                "required": ["pin"],
            },
        },
    },
]


def device_turn(agent: str, **extra: Any) -> Any:
    inputs = UserSimInput(
        instructions="You are Kim. Your phone has no signal. Your SIM PIN is 4821.",
        requirements=["My phone has no signal."],
        dialogue=[
            DialogueMessage(role="user", content="My phone has no signal."),
            DialogueMessage(role="assistant", content=agent),
        ],
        user_tools=DEVICE_TOOLS,
        turn=1,
        **extra,
    )
    return user_turn(inputs, random.Random(0))


def test_the_user_picks_its_tool_and_arguments_from_the_agents_words() -> None:
    off = device_turn("Please turn airplane mode off on your phone.")
    assert [(a.name, a.arguments) for a in off.tool_calls] == [("toggle_airplane_mode", {"enabled": False})]
    assert off.message == ""
    reboot = device_turn("Could you reboot your device, please?")
    assert [(a.name, a.arguments) for a in reboot.tool_calls] == [("reboot_device", {})]
    pin = device_turn("Please enter the PIN of your SIM.")
    assert [(a.name, a.arguments) for a in pin.tool_calls] == [("enter_pin", {"pin": "4821"})]
    # Not asked to act: no call (a question it cannot answer is out of scope).
    assert not device_turn("Is airplane mode on?").tool_calls
    # The structured hint wins over the words.
    hinted = device_turn("Please do this.", action_requests=[UserAction(name="reboot_device")])
    assert [a.name for a in hinted.tool_calls] == ["reboot_device"]
    # Asked again after it ran: it reports what it saw instead of repeating the call.
    ran = UserActionResult(name="reboot_device", arguments={}, ok=True, output={"status": "rebooted"}, turn=1)
    report = device_turn("Could you reboot your device, please?", own_actions=[ran])
    assert not report.tool_calls and "rebooted" in report.message


# --------------------------------------------------------------------------- RL / eval episode


class ScriptedPolicy:
    """A RolloutBackend playing the perfect agent (or, ``perfect=False``, the do-nothing one): the
    reference agent calls as tool-call blocks, a worded ask for each run of user calls, then done."""

    def __init__(self, tok: Any, instances: list[dict[str, Any]], perfect: bool) -> None:
        self.tok = tok
        self.perfect = perfect
        self.plans: dict[str, list[str]] = {}
        for instance in instances:
            turns = [
                "\n".join(
                    "<tool_call>\n"
                    + json.dumps({"name": c["name"], "arguments": c["arguments"]})
                    + "\n</tool_call>"
                    for c in calls
                )
                if actor == "agent"
                else " ".join(ask(c) for c in calls)
                for actor, calls in segments(instance)
            ]
            self.plans[instance["requirements"][0]] = [*turns, DONE]

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        out = []
        for prompt in prompts:
            text = self.tok.decode(prompt, skip_special_tokens=False)
            plan = next(p for opening, p in self.plans.items() if opening in text)
            turn = text.count("<|im_start|>assistant") - 1
            body = plan[min(turn, len(plan) - 1)] if self.perfect else SORRY
            ids = encode_segment(self.tok, body + IM_END)[:max_new_tokens]
            out.append(Generation(token_ids=ids, logprobs=[0.0] * len(ids), finished=True))
        return out

    def load_weights(self, model: torch.nn.Module) -> None:
        pass


def test_rl_episode_perfect_agent_scores_1_and_do_nothing_0_against_the_default_user(
    tmp_path: Path, pack: DomainPack, built: list[dict[str, Any]]
) -> None:
    samples = [interactive_sample(pack, b).model_copy(update={"split": "heldout"}) for b in built]
    tiny = build_tiny(tmp_path / "model", [render_text(s.prompt, s.tools) for s in samples], seed=0)
    tok = AutoTokenizer.from_pretrained(str(tiny), local_files_only=True)
    user = GatewayUserSimulator(Gateway(RulesBackend(seed=0)))  # the default simulated user

    async def run(perfect: bool) -> EvalReport:
        async with SandboxPool(POOL) as pool:
            return await evaluate(
                ScriptedPolicy(tok, built, perfect),
                tok,
                interactive_cases(samples, pool, user),
                k=1,
                max_turns=16,
                max_seq_len=16384,
                max_new_tokens=1024,
                concurrency=1,
            )

    perfect = asyncio.run(run(True))
    assert [(c.rewards, c.errors) for c in perfect.cases] == [([1.0], [])] * len(SEEDS)
    nothing = asyncio.run(run(False))
    assert [c.rewards for c in nothing.cases] == [[0.0]] * len(SEEDS)


def test_an_interactive_environment_runs_the_users_calls_and_its_rates(
    pack: DomainPack, built: list[dict[str, Any]]
) -> None:
    """The environment RL and eval roll out in: the default user's app calls run there (and are
    logged for the verifier as the user's); the mistakes rate applies there too."""
    instance = built[0]
    sample = interactive_sample(pack, instance)
    send = next(c for c in instance["reference_calls"] if c["name"] == "send_verification_code")

    async def episode(behaviour: UserBehaviour) -> tuple[list[tuple[str, str, bool]], list[str | None]]:
        async with SandboxPool(POOL) as pool:
            env = InteractiveEnvironment(sample, pool, Gateway(RulesBackend(seed=0)), behaviour=behaviour)
            try:
                await env.call(send["name"], send["arguments"])
                replies = [await env.user_turn(ask({"name": "confirm_identity_code"})) for _ in range(2)]
            finally:
                await env.close()
            return [(c.actor, c.name, c.ok) for c in env.calls], replies

    calls, replies = asyncio.run(episode(UserBehaviour()))
    assert calls == [("agent", "send_verification_code", True), ("user", "confirm_identity_code", True)]
    assert replies[0] is not None and '"verified": true' in replies[0]
    assert replies[1] is not None and replies[1].startswith("I already did that.")
    calls, replies = asyncio.run(episode(UserBehaviour(mistakes=1.0)))
    assert [ok for actor, _, ok in calls if actor == "user"] == [False, True]
    assert replies[0] is not None and "does not match" in replies[0]

"""One tau2 episode's bookkeeping, shared by `arena eval --bench tau2` and tau2 synthesis.

A conversation is kept twice: as the agent's OpenAI chat (system prompt, user and assistant
messages, ``tool_calls`` and ``tool`` results) and as tau2 messages (``requestor`` on every call,
user tool calls included), which tau2's evaluator and Arena's ``Tau2Verification`` score. Calls run
the domain's own code in a ``Tau2Session``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from arena.llm.roles.user_sim import UserActionResult
from environments.tau2_env import Tau2Session, ToolAnswer
from environments.tau2_tasks import Tau2Task
from environments.user_view import UserContext, UserSimulator, ViewTurn

AGENT_INSTRUCTION = (
    "You are a customer service agent that helps the user according to the <policy> provided below.\n"
    "In each turn you can either:\n- Send a message to the user.\n- Make a tool call.\n"
    "You cannot do both at the same time.\n\n"
    "Try to be helpful and always follow the policy. Always make sure you generate valid JSON only."
)
"""tau2's ``LLMAgent`` instruction (tau2/agent/llm_agent.py), so the model sees what tau2 shows it."""
GREETING = "Hi! How can I help you today?"
"""tau2's orchestrator's first agent message."""
MAX_AGENT_STEPS = 30
"""Agent turns (tool rounds and messages) per trial before it is cut (tau2: max_steps)."""
MAX_USER_TURNS = 12
MAX_USER_ACTS = 3
"""User-tool rounds within one user reply (act, see the result, act again)."""


def system_prompt(policy: str) -> str:
    return f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{policy}\n</policy>"


@dataclass
class Episode:
    """One trial's conversation, in the agent's OpenAI messages and in tau2's messages."""

    chat: list[dict[str, Any]]
    tau2: list[dict[str, Any]]
    turns: list[ViewTurn] = field(default_factory=list)
    calls: int = 0

    def say(self, role: Literal["assistant", "user"], text: str) -> None:
        self.chat.append({"role": role, "content": text})
        self.tau2.append({"role": role, "content": text})
        self.turns.append(ViewTurn(role=role, text=text))


async def run_calls(
    session: Tau2Session,
    episode: Episode,
    calls: list[tuple[str, dict[str, Any]]],
    requestor: Literal["assistant", "user"],
    content: str | None,
) -> list[ToolAnswer]:
    """Run one message's calls in the domain's code; record them in both message lists."""
    ids = [f"call_{episode.calls + i}" for i in range(len(calls))]
    episode.calls += len(calls)
    tau2_calls = [
        {"id": i, "name": n, "arguments": a, "requestor": requestor}
        for i, (n, a) in zip(ids, calls, strict=True)
    ]
    episode.tau2.append({"role": requestor, "content": content or None, "tool_calls": tau2_calls})
    if requestor == "assistant":
        episode.chat.append(
            {
                "role": "assistant",
                "content": content or "",
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
                    for i, (n, a) in zip(ids, calls, strict=True)
                ],
            }
        )
    answers: list[ToolAnswer] = []
    for call_id, (name, arguments) in zip(ids, calls, strict=True):
        answer = await session.tool(name, arguments, requestor=requestor, call_id=call_id)
        answers.append(answer)
        episode.tau2.append(
            {
                "role": "tool",
                "id": call_id,
                "content": answer.content,
                "requestor": requestor,
                "error": answer.error,
            }
        )
        if requestor == "assistant":
            episode.chat.append(
                {"role": "tool", "tool_call_id": call_id, "name": name, "content": answer.content}
            )
    return answers


async def user_move(
    session: Tau2Session,
    episode: Episode,
    user: UserSimulator,
    context: UserContext,
    seen: list[UserActionResult],
) -> tuple[str, str, list[UserActionResult]]:
    """The user's reply, running its own tool calls first as often as it asks (``MAX_USER_ACTS``):
    (text, signal, the calls it ran with what each returned). ``seen``: its earlier calls."""
    ran: list[UserActionResult] = []
    for _ in range(MAX_USER_ACTS):
        move = await user.reply(context.model_copy(update={"own_actions": [*seen, *ran]}))
        if move.actions:
            calls = [(a.name, dict(a.arguments)) for a in move.actions]
            answers = await run_calls(session, episode, calls, "user", None)
            ran += [
                UserActionResult(
                    name=name,
                    arguments=arguments,
                    ok=not answer.error,
                    output=answer.content,
                    turn=context.turn,
                )
                for (name, arguments), answer in zip(calls, answers, strict=True)
            ]
            if not move.message:
                continue  # the user reports what its app showed on the next reply
        return move.message, move.signal, ran
    return "", "stop", ran


async def do_nothing_reward(session: Tau2Session, task: Tau2Task) -> float:
    """tau2's reward of an agent that greets, calls nothing and stops."""
    await session.reset(task.raw)
    history = list((task.raw.get("initial_state") or {}).get("message_history") or [])
    messages = [*history, {"role": "assistant", "content": GREETING}]
    return float((await session.tau2_reward(task.raw, messages, "agent_stop"))["reward"])

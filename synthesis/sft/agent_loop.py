"""The agent loop of ASTRA §2.1.4 as an explicit state machine.

GENERATING: the policy (role ``agent_policy``) sees the messages so far and
the tool schemas, and answers with text and zero or more tool calls.
CALLING_TOOLS: every call of the turn is made at once (one grouped round); the
session applies them in the order made, since a tool server keeps state, and
each result becomes a ``tool`` message. DONE: a turn without tool calls
is the final answer; ``max_turns`` assistant turns end the loop without one.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from arena.llm.core import Answer
from arena.llm.gateway import Gateway
from arena.llm.roles.agent import AGENT_POLICY, AgentTurnInput, PlannedCall
from arena.records.sft import CallStatus
from synthesis.tools.tool_results import ToolSession

SYSTEM_PROMPT = (
    "You are a helpful assistant that solves the user's request with the tools provided. "
    "Call tools when you need data or actions; several independent calls may go in one turn. "
    "Use values from earlier tool results instead of guessing them. When done, answer the user "
    "with the results."
)


class LoopState(StrEnum):
    generating = "generating"
    calling_tools = "calling_tools"
    done = "done"


@dataclass
class LoopResult:
    """What one rollout produced."""

    messages: list[dict[str, Any]]
    call_status: list[CallStatus]
    stop_reason: Literal["answer", "max_turns"]
    turns: int
    answers: list[Answer[Any]] = field(default_factory=list)


@dataclass
class AgentLoop:
    gateway: Gateway
    tools: ToolSession
    openai_tools: list[dict[str, Any]]
    max_turns: int

    async def run(self, task: str) -> LoopResult:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task},
        ]
        statuses: list[CallStatus] = []
        answers: list[Answer[Any]] = []
        state, turns = LoopState.generating, 0
        pending: list[PlannedCall] = []
        while state is not LoopState.done:
            if state is LoopState.generating:
                if turns >= self.max_turns:
                    return LoopResult(messages, statuses, "max_turns", turns, answers)
                answer = await self.gateway.call(
                    AGENT_POLICY, AgentTurnInput(messages=messages, tools=self.openai_tools)
                )
                answers.append(answer)
                turns += 1
                pending = list(answer.output.tool_calls)
                messages.append(assistant_message(answer.output.content, pending, turns, answer.reasoning))
                state = LoopState.calling_tools if pending else LoopState.done
            else:
                ids = [c["id"] for c in messages[-1]["tool_calls"]]
                results = await asyncio.gather(*(self.tools.call(c.name, c.arguments) for c in pending))
                for call_id, call, result in zip(ids, pending, results, strict=True):
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call_id,
                            "name": call.name,
                            "content": result.content,
                        }
                    )
                    statuses.append(
                        CallStatus(
                            call_id=call_id,
                            tool=call.name,
                            ok=result.ok,
                            source=result.source,
                            error_kind=result.error_kind,
                            latency_ms=result.latency_ms,
                        )
                    )
                state = LoopState.generating
        return LoopResult(messages, statuses, "answer", turns, answers)


def assistant_message(
    content: str, calls: list[PlannedCall], turn: int, reasoning: str = ""
) -> dict[str, Any]:
    """An OpenAI assistant message; arguments are JSON strings as the API sends them.

    A reasoning model's reasoning is kept in the trace as ``reasoning_content`` (vLLM's field),
    apart from the content, so it is never parsed nor sent back as the answer."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [
            {
                "id": f"call_{turn}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
            }
            for i, c in enumerate(calls)
        ]
    return message

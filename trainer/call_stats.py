"""How a trajectory's tool calls went: failed observations and grounded arguments (``arena eval``).

A low F1 has several causes that the reward alone does not tell apart: calls that fail (an unknown
tool, bad arguments, an unparseable block) and calls that run but ask about something the question
never mentioned (an id the model made up rather than copied). Two counts separate them:

- **failed**: tool observations the environment marked failed (``"error": true``) or whose content
  reports an error (``arena.tool_reward.error_payload``, the reward's rule);
- **grounded**: parsed calls whose every argument value (string or number leaves of the arguments
  object; booleans and nulls carry no content) is stated earlier in the conversation, in a system,
  user or tool message or in the offered tool schemas, on token boundaries
  (``arena.tool_reward.answer_in``: case, accents and number formatting folded). A call without
  arguments counts as grounded; arguments that are not a JSON object do not.

Grounding is a heuristic for copy errors, not a verdict: a real model may derive a value (a date
reformatted, a sum) that is right and still not stated anywhere. It reads OpenAI chat messages only,
so it applies to any policy's trajectories (local rollouts, endpoint models, recorded files).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from arena.llm.replies import parse_arguments
from arena.tool_reward import answer_in, error_payload
from environments.rewards import calls_of_messages, message_text

_SOURCES = frozenset({"system", "user", "tool"})


class CallStats(BaseModel):
    """Tool-call counts of one trajectory."""

    model_config = ConfigDict(frozen=True)

    calls: Annotated[int, Field(ge=0, description="Parsed tool calls in assistant messages.")]
    observations: Annotated[int, Field(ge=0, description="Tool messages (invalid blocks' errors included).")]
    failed: Annotated[int, Field(ge=0, description="Tool messages that report a failure.")]
    grounded: Annotated[
        int, Field(ge=0, description="Parsed calls whose argument values all occur in earlier context.")
    ]


def _leaves(value: object) -> Iterator[str]:
    """String and number leaves of a JSON value (booleans and nulls carry no content)."""
    if isinstance(value, Mapping):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, str):
        if value.strip():
            yield value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)


def grounded(call: Mapping[str, Any], context: str) -> bool:
    """Whether every argument value of ``call`` (an OpenAI tool call) is stated in ``context``."""
    arguments = parse_arguments((call.get("function") or {}).get("arguments", {}))
    if arguments is None:
        return False
    return all(answer_in(leaf, context) for leaf in _leaves(arguments))


def call_stats(messages: Sequence[dict[str, Any]], tools: Sequence[Mapping[str, Any]] = ()) -> CallStats:
    """Count the calls of one trajectory; ``tools`` are the schemas it was offered (their enums and
    descriptions are context a call may copy from). Observations are read as the reward reads them
    (``environments.rewards.calls_of_messages``)."""
    _, results = calls_of_messages(messages)
    context = json.dumps(list(tools), ensure_ascii=False) if tools else ""
    calls = good = 0
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                calls += 1
                good += grounded(call, context)
        if role in _SOURCES:
            context += "\n" + message_text(message.get("content"))
    failed = sum(not r.ok or error_payload(r.content) for r in results)
    return CallStats(calls=calls, observations=len(results), failed=failed, grounded=good)

"""Trajectory rewards for QA environments: the F1 reward of ASTRA §3 (eq. 29-31) and its ablation variants.

A job is the list of sub-tasks (q_i, a_i) of a verified sample (``VerifiedSample.reward_spec["jobs"]``).
The rule that decides which sub-tasks a trajectory solved is ``arena.tool_reward`` (one rule for the
trainer, ``arena env verify``, ``arena reward score`` and the exported verl reward): only successful
calls solve (no failed call, no error payload, no mixed-in tool), answers match on token boundaries with
numbers compared as numbers, and calls are matched one-to-one to the sub-tasks they solve:

    r = solved / n,   p = solved / c,   F1 = 2pr / (p + r),   all 0 when nothing is solved,

where c counts every tool call the policy emitted (invalid ones included). Recall-only (r) and
precision-only (p) are the ablation rewards of ASTRA Fig. 7.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from arena.tool_reward import CallResult, distinct_jobs, f1_score, job_answers

RewardMode = Literal["f1", "recall", "precision"]


class ToolResult(BaseModel):
    """One executed tool call of a trajectory, as the reward sees it."""

    model_config = ConfigDict(frozen=True)

    name: Annotated[
        str, Field(description="The tool called, as the model wrote it ('' for an invalid block).")
    ]
    content: Annotated[str, Field(description="The observation: the output, or the error text.")]
    ok: Annotated[bool, Field(description="False when the environment marked the call failed.")] = True


class F1Parts(BaseModel):
    """The parts of the F1 reward of one trajectory."""

    n: Annotated[int, Field(description="sub-tasks in the job")]
    n_hat: Annotated[
        int, Field(description="sub-tasks solved, each by its own successful call (maximum matching)")
    ]
    c: Annotated[int, Field(description="tool calls emitted, invalid, failed and mixed-in ones included")]
    recall: Annotated[float, Field(description="n_hat / n (0 for an empty job)")]
    precision: Annotated[float, Field(description="n_hat / c (0 without calls); at most 1")]
    f1: Annotated[float, Field(description="2pr / (p + r); 0 when n_hat == 0; at most 1")]


def f1_reward(
    jobs: Sequence[dict[str, Any]],
    results: Sequence[ToolResult],
    emitted_calls: int,
    *,
    irrelevant: Collection[str] = (),
) -> F1Parts:
    """ASTRA eq. 30-31 for one trajectory: ``results`` are its executed calls (failed ones included),
    ``emitted_calls`` every call the policy emitted, ``irrelevant`` the mixed-in tools' names."""
    parts = f1_score(
        job_answers(jobs),
        [CallResult(name=r.name, content=r.content, ok=r.ok) for r in results],
        emitted_calls,
        irrelevant=irrelevant,
    )
    return F1Parts(
        n=parts.n,
        n_hat=parts.solved,
        c=parts.calls,
        recall=parts.recall,
        precision=parts.precision,
        f1=parts.f1,
    )


def solved_jobs(
    jobs: Sequence[dict[str, Any]], results: Sequence[ToolResult], *, irrelevant: Collection[str] = ()
) -> set[int]:
    """Indices (each job's "index", else its position) of the sub-tasks the matching solves."""
    parts = f1_score(
        job_answers(jobs),
        [CallResult(name=r.name, content=r.content, ok=r.ok) for r in results],
        irrelevant=irrelevant,
    )
    kept = distinct_jobs(jobs)
    return {int(kept[i].get("index", jobs.index(kept[i]))) for i in parts.solved_indices}


def reward_value(parts: F1Parts, mode: RewardMode = "f1") -> float:
    """The scalar reward the policy is trained on: F1 (default), or recall-only / precision-only (ablations)."""
    if mode == "f1":
        return parts.f1
    if mode == "recall":
        return parts.recall
    if mode == "precision":
        return parts.precision
    raise ValueError(f"unknown reward mode {mode!r}")


# --------------------------------------------------------------------------- from chat messages


class Subtask(BaseModel):
    """One sub-task of a trajectory to rescore."""

    model_config = ConfigDict(extra="allow")

    answer: Annotated[str | int | float, Field(description="The sub-task's answer a_i.")]
    question: Annotated[str, Field(description="The sub-task's question q_i (optional).")] = ""


class ScoreRequest(BaseModel):
    """One line of ``arena reward score``: a trajectory as OpenAI chat messages and its sub-tasks."""

    model_config = ConfigDict(extra="allow")

    subtasks: Annotated[list[Subtask], Field(description="The job: sub-tasks with their answers.")]
    messages: Annotated[
        list[dict[str, Any]],
        Field(description="OpenAI chat messages: assistant `tool_calls` and `tool` results, in order."),
    ]
    mixed_tools: Annotated[
        list[str], Field(description="Names of mixed-in irrelevant tools: a call to one never solves.")
    ] = Field(default_factory=list)
    emitted_calls: Annotated[
        int | None,
        Field(
            ge=0,
            description="Calls the policy emitted, when a recorder knows of calls that left no message "
            "(a block cut off by the length budget); at least the calls the messages show.",
        ),
    ] = None


def message_text(content: Any) -> str:
    """A message's content as text (a list of content parts joined)."""
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    if content is None:
        return ""
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


def calls_of_messages(messages: Sequence[dict[str, Any]]) -> tuple[int, list[ToolResult]]:
    """(calls emitted, executed calls) of a chat transcript.

    Every entry of an assistant message's ``tool_calls`` is an emitted call; every ``tool`` message is
    an executed one, named by its ``name`` or its call's; a ``tool`` message answering no declared call
    (an invalid call block the environment answered with an error) is an emitted call too. A ``tool``
    message with ``"error": true`` is a failed call; one whose content is an error payload is judged so
    by the rule itself.
    """
    names: dict[str, str] = {}
    declared = 0
    results: list[ToolResult] = []
    answered: set[str] = set()
    unanswered = 0
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or []:
                declared += 1
                function = call.get("function") if isinstance(call, dict) else None
                name = function.get("name") if isinstance(function, dict) else None
                if isinstance(call, dict) and call.get("id") is not None:
                    names[str(call["id"])] = str(name or "")
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            known = call_id in names
            if not known or call_id in answered:  # no declared call, or a second answer to one
                unanswered += 1
            answered.add(call_id)
            name = message.get("name") or names.get(call_id, "")
            failed = message.get("error") is True
            results.append(
                ToolResult(name=str(name), content=message_text(message.get("content")), ok=not failed)
            )
    return declared + unanswered, results


def score_messages(request: ScoreRequest) -> F1Parts:
    """The F1 reward of a chat transcript (``arena reward score``), the rule the trainer scores with."""
    emitted, results = calls_of_messages(request.messages)
    if request.emitted_calls is not None:
        emitted = max(emitted, request.emitted_calls)
    jobs = [s.model_dump() for s in request.subtasks]
    return f1_reward(jobs, results, emitted, irrelevant=set(request.mixed_tools))

"""tau2 tasks as Arena tasks: their evaluation criteria as an Arena verification, and episodes.

A tau2 task's ``evaluation_criteria`` becomes a ``Tau2Verification``: the reward is the product of
the checks its ``reward_basis`` names (as in tau2), each computed by Arena on the LIVE session:

- ``DB``: the session's agent and user database hashes equal those after the task's initial state
  plus its gold actions (a scratch environment in the same session);
- ``ENV_ASSERTION``: each env assertion holds on the live environment;
- ``ACTION``: each gold action is matched by some call of the trajectory (its ``compare_args``);
- ``COMMUNICATE``: each ``communicate_info`` string occurs in an assistant message;
- ``NL_ASSERTION``: needs a judge endpoint (as in tau2): without one the task is not scorable.

tau2's own evaluator instead replays the trajectory in fresh environments; ``tests/test_tau2.py``
and ``bench/tau2_gold.py`` check that both agree on the same trajectories.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from environments.tau2_env import DbHashes, Tau2Session

RewardKind = Literal["DB", "ENV_ASSERTION", "ACTION", "COMMUNICATE", "NL_ASSERTION"]
DEFAULT_BASIS: list[RewardKind] = ["DB", "COMMUNICATE"]
"""tau2's default ``reward_basis``."""


class GoldAction(BaseModel):
    """One gold action of a tau2 task."""

    action_id: Annotated[str, Field(description="tau2's id of the action.")] = ""
    name: Annotated[str, Field(description="Tool name.")]
    arguments: Annotated[dict[str, Any], Field(description="Tool arguments.")]
    requestor: Annotated[Literal["assistant", "user"], Field(description="Who makes the call.")] = "assistant"
    compare_args: Annotated[
        list[str] | None, Field(description="Arguments a matching call must equal (None: all the call's).")
    ] = None

    def matches(self, name: str, arguments: dict[str, Any]) -> bool:
        """tau2's ``Action.compare_with_tool_call``: same name, equal compared arguments."""
        if name != self.name:
            return False
        keys = list(arguments) if self.compare_args is None else self.compare_args
        return {k: v for k, v in arguments.items() if k in keys} == {
            k: v for k, v in self.arguments.items() if k in keys
        }


class Tau2Verification(BaseModel):
    """The Arena verification of one tau2 task (from its ``evaluation_criteria``)."""

    reward_basis: Annotated[list[RewardKind], Field(description="Checks whose product is the reward.")]
    actions: Annotated[list[GoldAction], Field(description="Gold actions, in order.")]
    env_assertions: Annotated[
        list[dict[str, Any]],
        Field(description="tau2 EnvAssertion dicts (env_type, func_name, arguments, ...)."),
    ]
    communicate_info: Annotated[list[str], Field(description="Strings an assistant message must contain.")]
    nl_assertions: Annotated[list[str], Field(description="Natural-language assertions (judge only).")]

    @property
    def needs_judge(self) -> bool:
        return "NL_ASSERTION" in self.reward_basis


class Tau2Task(BaseModel):
    """One imported tau2 task: the original (for the domain's code and tau2's evaluator) and its mapping."""

    task_id: Annotated[str, Field(description="tau2's task id.")]
    split: Annotated[
        Literal["train", "test", "other", "new"],
        Field(
            description="From split_tasks.json (test is never synthesised on); 'new': an instance Arena "
            "made over the domain's database (synthesis/eigen/tau2_instances.py)."
        ),
    ]
    instructions: Annotated[str, Field(description="The simulated user's private instructions (rendered).")]
    requirements: list[str] = Field(
        default_factory=list, description="What the user brings up, in order: why they call, what they know."
    )
    verification: Annotated[Tau2Verification, Field(description="The Arena verification.")]
    raw: Annotated[
        dict[str, Any], Field(description="The tau2 task as shipped (tau2.data_model.tasks.Task).")
    ]


class CheckResult(BaseModel):
    """One check of a verification on one trajectory."""

    kind: Annotated[RewardKind, Field(description="Which check.")]
    passed: Annotated[bool, Field(description="It held.")]
    detail: Annotated[str, Field(description="Why, in one line.")] = ""


class Tau2Reward(BaseModel):
    """Arena's reward of one trajectory on one task."""

    reward: Annotated[float, Field(description="Product of the reward-basis checks (0 or 1).")]
    checks: Annotated[list[CheckResult], Field(description="Every check computed, basis or not.")]


def verification_of(task: dict[str, Any]) -> Tau2Verification:
    """Map a tau2 task's ``evaluation_criteria`` (absent: nothing to check, reward 1)."""
    criteria = task.get("evaluation_criteria") or {}
    basis = criteria.get("reward_basis")
    return Tau2Verification(
        reward_basis=list(basis) if basis is not None else list(DEFAULT_BASIS) if criteria else [],
        actions=[
            GoldAction(
                action_id=str(a.get("action_id") or ""),
                name=a["name"],
                arguments=dict(a.get("arguments") or {}),
                requestor=a.get("requestor") or "assistant",
                compare_args=a.get("compare_args"),
            )
            for a in criteria.get("actions") or []
        ],
        env_assertions=list(criteria.get("env_assertions") or []),
        communicate_info=[str(s) for s in criteria.get("communicate_info") or []],
        nl_assertions=[str(s) for s in criteria.get("nl_assertions") or []],
    )


def user_instructions(task: dict[str, Any]) -> str:
    """The user scenario as one text (tau2's ``UserScenario.__str__`` layout, in plain sections)."""
    scenario = task.get("user_scenario") or {}
    instructions = scenario.get("instructions")
    parts: list[str] = []
    if scenario.get("persona"):
        parts.append(f"Persona:\n{scenario['persona']}")
    if isinstance(instructions, dict):
        for key, title in (
            ("reason_for_call", "Reason for call"),
            ("known_info", "Known info"),
            ("unknown_info", "Unknown info"),
            ("task_instructions", "Task instructions"),
        ):
            if instructions.get(key):
                parts.append(f"{title}:\n{str(instructions[key]).strip()}")
    elif instructions:
        parts.append(str(instructions))
    return "\n\n".join(parts)


_SUBJECT_AFTER = {
    "and",
    "but",
    "because",
    "that",
    "if",
    "so",
    "as",
    "when",
    "since",
    "while",
    "although",
    "or",
}
_SECOND_PERSON = {
    "you are": "I am",
    "you're": "I'm",
    "you were": "I was",
    "you have": "I have",
    "you've": "I've",
    "your": "my",
    "yours": "mine",
    "yourself": "myself",
}
_YOU_RE = re.compile(r"\b(you are|you're|you were|you have|you've|yourself|yours|your|you)\b", re.IGNORECASE)


VERBS_AFTER_SUBJECT = frozenset(
    "am was think believe guess know feel hope noticed notice see saw found heard realized realise "
    "realize understand suppose mean worry fear wonder just also really still already do did don't "
    "didn't can can't could would will should must may might have had need want wanted said "
    "expected assumed thought".split()
)
"""Words a person puts right after "I" or "you" ("I think it is", "you know the line is"): after any
other word, "you X is" is a lost "your" and "I X is" a template slip."""

_POSSESSIVE_SLIP = re.compile(r"\s+[a-z]+\s+(?:[a-z]+\s+)?(?:is|are|isn't|aren't|was|were|has|keeps)\b")
"""After a bare "you": a noun phrase, then its verb (a "your" with its r lost)."""


def _verb_after(text: str, end: int) -> bool:
    """Whether the word after position ``end`` is a verb a person puts after "you" ("you think it is")."""
    word = re.match(r"\s+([a-z']+)", text[end:])
    return word is None or word.group(1) in VERBS_AFTER_SUBJECT


def first_person(text: str) -> str:
    """A scenario paragraph ("You want to cancel your order") as the user says it ("I want to cancel
    my order"): "you" is "I" where it starts a clause, else "me"."""

    def swap(match: re.Match[str]) -> str:
        before = text[: match.start()].rstrip()
        sentence_start = not before or before[-1] in ".!?\n"
        key = match.group(0).casefold()
        if key in _SECOND_PERSON:
            new = _SECOND_PERSON[key]
        elif _POSSESSIVE_SLIP.match(text, match.end()) and not _verb_after(text, match.end()):
            new = "my"  # "You mobile data is not working": the scenario meant "Your"
        else:
            previous = re.findall(r"[\w']+", before[-20:])
            clause_start = (
                sentence_start
                or before[-1] in ";:,("
                or (bool(previous) and previous[-1].casefold() in _SUBJECT_AFTER)
            )
            new = "I" if clause_start else "me"
        return new[0].upper() + new[1:] if sentence_start else new

    return _YOU_RE.sub(swap, text)


def user_requirements(task: dict[str, Any]) -> list[str]:
    """The scenario's reason for calling, then what the user knows (each a paragraph, as the user
    says it: in the first person)."""
    instructions = (task.get("user_scenario") or {}).get("instructions")
    if not isinstance(instructions, dict):
        return []
    return [
        first_person(str(instructions[k]).strip())
        for k in ("reason_for_call", "known_info")
        if instructions.get(k)
    ]


def mapped_task(raw: dict[str, Any], split: Literal["train", "test", "other", "new"]) -> Tau2Task:
    """A tau2 task dict as Arena maps it: the user's instructions and requirements, the verification."""
    return Tau2Task(
        task_id=str(raw["id"]),
        split=split,
        instructions=user_instructions(raw),
        requirements=user_requirements(raw),
        verification=verification_of(raw),
        raw=raw,
    )


def tool_calls_of(messages: Sequence[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments) of every assistant and user tool call of a tau2 trajectory, in order."""
    return [
        (c["name"], dict(c.get("arguments") or {}))
        for m in messages
        if m.get("role") in ("assistant", "user")
        for c in m.get("tool_calls") or []
    ]


def communicated(messages: Sequence[dict[str, Any]], info: str) -> bool:
    """tau2's communicate check: ``info`` (lowercased) in an assistant text without commas."""
    needle = info.lower()
    return any(
        m.get("role") == "assistant"
        and m.get("content")
        and needle in str(m["content"]).lower().replace(",", "")
        for m in messages
    )


async def arena_reward(
    session: Tau2Session, task: Tau2Task, messages: Sequence[dict[str, Any]], gold: DbHashes
) -> Tau2Reward:
    """Arena's reward of the episode that just ran in ``session`` (its live state) on ``task``."""
    v = task.verification
    if v.needs_judge:
        raise ValueError(f"task {task.task_id}: its reward needs NL assertions, which need a judge endpoint")
    live = await session.hashes()
    holds = await session.assertions(v.env_assertions) if v.env_assertions else []
    calls = tool_calls_of(messages)
    missing_actions = [a.name for a in v.actions if not any(a.matches(n, args) for n, args in calls)]
    missing_info = [s for s in v.communicate_info if not communicated(messages, s)]
    checks = [
        CheckResult(
            kind="DB",
            passed=live.agent == gold.agent and live.user == gold.user,
            detail="databases equal the gold replay's"
            if live == gold
            else "a database differs from the gold replay's",
        ),
        CheckResult(
            kind="ENV_ASSERTION",
            passed=all(holds),
            detail=f"{sum(holds)}/{len(holds)} env assertions hold",
        ),
        CheckResult(
            kind="ACTION",
            passed=not missing_actions,
            detail=f"gold actions not called: {missing_actions}"
            if missing_actions
            else "every gold action called",
        ),
        CheckResult(
            kind="COMMUNICATE",
            passed=not missing_info,
            detail=f"not communicated: {missing_info}" if missing_info else "everything communicated",
        ),
    ]
    reward = 1.0
    for check in checks:
        if check.kind in v.reward_basis and not check.passed:
            reward = 0.0
    return Tau2Reward(reward=reward, checks=checks)


class Replay(BaseModel):
    """A scripted trajectory run in a session, with both rewards."""

    task_id: str
    arena: Annotated[float, Field(description="Arena's reward (Tau2Verification on the live session).")]
    tau2: Annotated[float, Field(description="tau2's evaluator's reward on the same trajectory.")]
    checks: list[CheckResult] = Field(default_factory=list)
    messages: list[dict[str, Any]] = Field(default_factory=list)


async def replay(
    session: Tau2Session,
    task: Tau2Task,
    actions: Sequence[GoldAction],
    *,
    say: Sequence[str] = (),
    with_tau2: bool = True,
) -> Replay:
    """Run ``actions`` as the trajectory's calls (then an assistant message saying ``say``); score it.

    The trajectory holds, per action, a message of its requestor with one tool call and the tool's
    answer from the live session: what tau2's orchestrator would record.
    """
    await session.reset(task.raw)
    gold = await session.gold(task.raw)
    history = (task.raw.get("initial_state") or {}).get("message_history") or []
    messages: list[dict[str, Any]] = [*history, {"role": "user", "content": "Hi, I need help."}]
    for i, action in enumerate(actions):
        call_id = f"call_{i}"
        answer = await session.tool(
            action.name, action.arguments, requestor=action.requestor, call_id=call_id
        )
        call = {
            "id": call_id,
            "name": action.name,
            "arguments": action.arguments,
            "requestor": action.requestor,
        }
        messages.append({"role": action.requestor, "content": None, "tool_calls": [call]})
        messages.append(
            {
                "role": "tool",
                "id": call_id,
                "content": answer.content,
                "requestor": action.requestor,
                "error": answer.error,
            }
        )
    messages.append({"role": "assistant", "content": " ".join(say) or "Done."})
    ours = await arena_reward(session, task, messages, gold)
    theirs = (await session.tau2_reward(task.raw, messages))["reward"] if with_tau2 else float("nan")
    return Replay(
        task_id=task.task_id, arena=ours.reward, tau2=float(theirs), checks=ours.checks, messages=messages
    )

"""BFCL's multi-turn items as Arena environments: bfcl-eval's simulated APIs, its turns, its checker.

A multi-turn item (file system, trading bot, travel booking, vehicle control... in
``initial_config``) is a scripted conversation: the user's turns are fixed, and after each one the
agent calls tools until it answers without a call. ``BfclEnvironment`` is that item behind Arena's
``Environment`` protocol, so any policy's episode loop drives it like a pack:

- ``call``: one call (any name the model emits, as bfcl-eval decodes it: a held-out function
  called early runs all the same), executed by bfcl-eval's own ``execute_multi_turn_func_call`` in a persistent
  ``bfcl_checker.py serve`` process under the bfcl virtualenv (``BfclRuntime``), in the trial's own
  namespace, so state carries from call to call as in bfcl-eval's inference loop. The call string
  is built here from the parsed name and JSON arguments (``name(arg=repr(value), ...)``, as
  bfcl-eval's OpenAI handler decodes a tool call): model text is never evaluated as code.
- ``user_turn``: the agent answered without a call, so the turn is over: the next turn's user
  message, or, on a turn where bfcl-eval adds held-out functions (``multi_turn_miss_func``), its
  "I have updated some more functions..." message with those tools added to ``tools`` (the list
  is extended in place, so the endpoint sees them from then on). None once every turn is done.
- ``reward``: bfcl-eval's ``multi_turn_checker`` on the calls per turn (1.0 when valid), as its
  ``eval_runner`` scores the entry; a trial that did not reach the last turn is force-terminated.

Each call is its own step in the record the checker reads: the checker executes steps in order
and compares each turn's combined results, so this is the same verdict as grouping a reply's
calls. bfcl-eval also cuts a turn after 20 steps; here the episode's ``max_turns`` bounds the whole
conversation instead (``MAX_STEPS_PER_TURN`` per turn).

These are benchmark items: Arena never publishes them to ``samples.verified`` and the trainer
refuses the ``bfcl`` kind, so the categories stay apart from training data; the environment is
usable for RL on items a run does not evaluate.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, Field

from arena.records.envs import VerifiedSample
from environments.environment import MAX_OUTPUT_CHARS, Observation, Trajectory

if TYPE_CHECKING:
    from asyncio.subprocess import Process

CHECKER = Path(__file__).with_name("bfcl_checker.py")
ADDED_FUNCTIONS = "I have updated some more functions you can choose from. What about now?"
"""bfcl-eval's user message on a turn that adds held-out functions (its FC prompt)."""
MAX_STEPS_PER_TURN = 20
"""bfcl-eval's ``MAXIMUM_STEP_LIMIT``."""
EXECUTION_ERROR = "Error during execution"


class MultiTurnItem(BaseModel):
    """One multi-turn BFCL item, as ``bfcl_checker.py items`` loads it."""

    id: Annotated[str, Field(description="bfcl-eval's item id, e.g. 'multi_turn_base_0'.")]
    category: Annotated[str, Field(description="multi_turn_base, _miss_func, _miss_param or _long_context.")]
    turns: Annotated[
        list[list[dict[str, Any]]], Field(description="The user's messages per turn (a held-out turn: none).")
    ]
    tools: Annotated[list[dict[str, Any]], Field(description="The tools offered from the start (OpenAI).")]
    missed: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict, description="Turn index -> tools added on that turn (miss_func)."
    )
    initial_config: Annotated[dict[str, Any], Field(description="The simulated APIs' starting state.")]
    involved_classes: Annotated[list[str], Field(description="bfcl-eval's API classes the item uses.")]
    ground_truth: Annotated[list[list[str]], Field(description="The expected call strings per turn.")]

    def sample(self) -> VerifiedSample:
        """The episode's opening: the first turn's messages, the starting tools (never published)."""
        return VerifiedSample(
            sample_id=f"bfcl-{self.id}",
            kind="bfcl",
            prompt=[dict(m) for m in self.turns[0]],
            tools=list(self.tools),
            env_ref=self.id,
            reward_spec={},
            domain=self.category,
            split="test",
        )

    def wire(self) -> dict[str, Any]:
        """What the checker process reads of the item."""
        return self.model_dump(
            include={"id", "category", "initial_config", "involved_classes", "ground_truth"}
        )


class BfclUnavailable(RuntimeError):
    """The bfcl-eval process is not there or stopped answering."""


class BfclRuntime:
    """One ``bfcl_checker.py serve`` process: requests one at a time, answers in order."""

    def __init__(self, python: Path) -> None:
        self.python = python
        self._proc: Process | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            str(self.python),
            "-I",
            str(CHECKER),
            "serve",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,  # bfcl-eval prints as it runs; answers are on stdout
            limit=1 << 26,
        )

    async def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdout is None:
            raise BfclUnavailable("the bfcl-eval process is not started")
        async with self._lock:
            proc.stdin.write((json.dumps(payload) + "\n").encode())
            await proc.stdin.drain()
            line = await proc.stdout.readline()
        if not line:
            raise BfclUnavailable(f"the bfcl-eval process exited (code {proc.returncode})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise BfclUnavailable(f"bfcl-eval: {answer['error']}")
        return answer

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()

    async def __aenter__(self) -> BfclRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """bfcl-eval's decoding of a tool call (``convert_to_function_call``): literals only."""
    if not name.isidentifier() or not all(isinstance(k, str) and k.isidentifier() for k in arguments):
        raise ValueError(f"not a call bfcl-eval can run: {name}({', '.join(map(str, arguments))})")
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


class BfclEnvironment:
    """One trial of a multi-turn item (see the module docstring)."""

    def __init__(self, item: MultiTurnItem, runtime: BfclRuntime, namespace: str) -> None:
        self.item = item
        self.runtime = runtime
        self.namespace = namespace
        self.tools: list[dict[str, Any]] = list(item.tools)
        self.turn = 0
        self.calls: list[list[list[str]]] = [[]]
        """Per turn reached, per step (one call each), the call strings the checker reads."""
        self.verdict: dict[str, Any] | None = None

    async def call(self, name: str, arguments: dict[str, Any]) -> Observation:
        """Run the call as bfcl-eval's inference loop does, offered or not: a held-out function the
        model calls before its turn runs on the API class all the same (and the checker sees it),
        an unknown name gets bfcl-eval's own error text."""
        try:
            call = call_string(name, arguments)
        except ValueError as exc:
            return Observation(text=f"error: {exc}", ok=False, tool=name)
        self.calls[-1].append([call])
        answer = await self.runtime.request(
            {"op": "execute", "namespace": self.namespace, "item": self.item.wire(), "calls": [call]}
        )
        (text,) = answer["results"]
        if len(text) > MAX_OUTPUT_CHARS:
            text = text[:MAX_OUTPUT_CHARS] + f"... [cut at {MAX_OUTPUT_CHARS} characters]"
        return Observation(text=text, ok=not text.startswith(EXECUTION_ERROR), tool=name)

    async def user_turn(self, assistant_text: str) -> str | None:
        """The turn is over (an answer without a call): the next turn's user message, or None."""
        if self.turn + 1 >= len(self.item.turns):
            return None
        self.turn += 1
        self.calls.append([])
        added = self.item.missed.get(str(self.turn))
        if added:
            self.tools.extend(added)  # in place: the episode's generator holds this list
            return ADDED_FUNCTIONS
        return "\n".join(
            str(m.get("content") or "") for m in self.item.turns[self.turn] if m.get("role") == "user"
        )

    async def reward(self, trajectory: Trajectory) -> tuple[float, dict[str, float]]:
        """bfcl-eval's multi-turn checker on the calls; 1.0 when it accepts them."""
        self.verdict = await self.runtime.request(
            {"op": "check", "item": {**self.item.wire(), "calls": self.calls}}
        )
        value = 1.0 if self.verdict["valid"] else 0.0
        return value, {"pass": value, "turns_reached": float(len(self.calls))}

    async def close(self) -> None:
        try:
            await self.runtime.request({"op": "forget", "namespace": self.namespace})
        except BfclUnavailable:
            pass  # the process is gone: so are its instances

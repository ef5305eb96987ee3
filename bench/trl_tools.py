"""Arena's QA environments as TRL environments, for TRL's multi-turn tool path (``bench/trainer.py``).

TRL >= 1.16 trains on tools through ``GRPOTrainer(environment_factory=...)``: one environment
instance per rollout, ``reset(**row)`` at the start, its public methods are the tools (their
schemas come from the method signatures and docstrings), and ``get_reward()`` scores the rollout.
Here every prompt gets its own environment class, whose methods are exactly the tools Arena
offers that prompt's rollouts (own and mixed-in), so both trainers see the same tools:

- a method's signature, annotations and docstring are built from the tool's JSON schema, so
  ``transformers.utils.get_json_schema`` gives the model the same names, types, descriptions and
  required arguments;
- a call runs in a fresh ``QaEnvironment`` on Arena's warm sandbox pool (the same environment
  code, sessions and output cut as Arena's rollouts), on an event loop thread the bench owns;
  the methods are coroutines, so TRL runs one rollout's calls concurrently (its best path);
- ``get_reward`` is Arena's reward: ``environments.rewards.f1_reward`` over the calls' results,
  with c = the calls that reached the environment (a call TRL could not parse or dispatch never
  does; Arena counts those in c).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from arena.records.tools import tool_name

T = TypeVar("T")

# JSON schema type -> the annotation get_json_schema maps back to that type.
_ANNOTATIONS: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
}


class LoopThread:
    """An asyncio event loop on a daemon thread: Arena's sandbox pool lives and is used there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="bench-env-loop", daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(_awaited(coro), self.loop)

    def run(self, coro: Awaitable[T]) -> T:
        return self.submit(coro).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()


async def _awaited(coro: Awaitable[T]) -> T:
    return await coro


def _docstring(function: dict[str, Any]) -> str:
    """Google-style docstring that ``get_json_schema`` parses back into the tool's descriptions."""
    properties = (function.get("parameters") or {}).get("properties") or {}
    lines = [str(function.get("description") or function.get("name") or "A tool.").replace("\n", " ")]
    if properties:
        lines += ["", "Args:"]
        for name, prop in properties.items():
            text = str(prop.get("description") or name).replace("\n", " ")
            if prop.get("enum"):
                text += f" (choices: {list(prop['enum'])!r})".replace("'", '"')
            lines.append(f"    {name}: {text}")
    return "\n".join(lines)


def _signature(function: dict[str, Any]) -> tuple[inspect.Signature, dict[str, Any]]:
    parameters = function.get("parameters") or {}
    required = set(parameters.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    for name, prop in (parameters.get("properties") or {}).items():
        kind = prop.get("type")
        annotation = _ANNOTATIONS.get(kind, str) if isinstance(kind, str) else str
        annotations[name] = annotation if name in required else annotation | None
        default = inspect.Parameter.empty if name in required else None
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotations[name]
            )
        )
    return inspect.Signature(params, return_annotation=str), annotations


def tool_method(spec: dict[str, Any]) -> Callable[..., Awaitable[str]]:
    """A coroutine method named after the tool whose schema TRL derives from the tool's own schema."""
    function = spec.get("function", spec)
    name = tool_name(spec)

    async def method(self: ArenaToolEnv, **arguments: Any) -> str:
        given = {k: v for k, v in arguments.items() if v is not None}
        return await self._call(name, given)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = _docstring(function)
    method.__signature__, method.__annotations__ = _signature(function)  # type: ignore[attr-defined]
    return method


class ArenaToolEnv:
    """Base of the per-prompt environment classes: one ``QaEnvironment`` per rollout, Arena's reward."""

    sample: Any
    package: Any
    extras: dict[str, Any]
    offered: list[dict[str, Any]]
    pool: Any
    loop: LoopThread
    clock: Any

    # TRL takes every public method but reset/get_reward for a tool: the helpers here are private.
    def __init__(self) -> None:
        self.env: Any = None
        self.results: list[Any] = []
        self.calls = 0
        self.clock.environments.append(self)

    def reset(self, **_row: Any) -> None:
        """A fresh environment for the next rollout (the previous one's session goes back to the pool)."""
        from environments.environment import QaEnvironment

        if self.env is not None:
            self.loop.run(self.env.close())
        self.env = QaEnvironment(self.sample, self.package, self.pool, self.extras, tools=self.offered)
        self.results, self.calls = [], 0

    async def _call(self, name: str, arguments: dict[str, Any]) -> str:
        from environments.rewards import ToolResult

        self.calls += 1
        observation = await asyncio.wrap_future(self.loop.submit(self.env.call(name, arguments)))
        self.results.append(ToolResult(name=name, content=observation.text, ok=observation.ok))
        self.clock.tool_calls += 1
        return str(observation.text)

    def get_reward(self) -> float:
        from environments.rewards import f1_reward, reward_value

        parts = f1_reward(self.env.jobs, self.results, self.calls, irrelevant=self.env.irrelevant)
        reward = reward_value(parts, self.env.mode)
        self.clock.reward_sum += reward
        self.clock.completions += 1
        return reward


def environment_classes(
    samples: Sequence[Any],
    packages: Sequence[Any],
    extras: Sequence[dict[str, Any]],
    tools: Sequence[list[dict[str, Any]]],
    pool: Any,
    loop: LoopThread,
    clock: Any,
) -> dict[str, type[ArenaToolEnv]]:
    """``{environment name: class}``, one per prompt, for ``environment_factory`` (a dataset row's
    ``environment`` column picks its class)."""
    classes: dict[str, type[ArenaToolEnv]] = {}
    for i, (sample, package, extra, offered) in enumerate(zip(samples, packages, extras, tools, strict=True)):
        members: dict[str, Any] = {tool_name(t): tool_method(t) for t in offered}
        clash = set(members) & set(dir(ArenaToolEnv))
        if clash:
            raise ValueError(f"tool names clash with the environment's own members: {sorted(clash)}")
        members.update(
            sample=sample,
            package=package,
            extras=extra,
            offered=list(offered),
            pool=pool,
            loop=loop,
            clock=clock,
        )
        classes[f"prompt{i}"] = type(f"ArenaToolEnv{i}", (ArenaToolEnv,), members)
    return classes


async def close_environments(environments: Sequence[ArenaToolEnv]) -> None:
    """Close the rollouts' last environments (run on the environment loop)."""
    await asyncio.gather(*(e.env.close() for e in environments if e.env is not None))

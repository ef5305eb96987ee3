"""A verl ``BaseTool`` that runs Arena environment packages (issue 5, item 9: scale-out on verl).

Only imported inside a verl environment (``arena export verl`` copies this file next to the exported
data as ``arena_verl_tool.py``; the tool config names ``arena_verl_tool.ArenaEnvTool``). One tool
object exists per tool name; every rollout's ``tools_kwargs[<name>]["create_kwargs"]`` carries the
package that implements the name for that sample (``{"env_id": ..., "package": <EnvPackage JSON>}``),
so the same name can be served by different packages in one batch.

A call runs ``<tool>(**arguments)`` against the package under Arena's execution contract
(``sandbox.env_runtime.call_program``) and answers with the observation text Arena's own rollouts
see (``environments.environment.QaEnvironment``): missing or unknown arguments are refused before any
run (``error: <tool>: ...``), a failed run is ``error: <kind>: <message>``, a good one is stdout
followed by the return value as JSON, cut at 8192 characters.

Where it runs (``config`` of the tool entry in ``tool_config.yaml``):

- ``sandbox: arena`` (default): Arena's isolated sandbox (``sandbox.pool``: namespaces, seccomp,
  limits; needs root). Needs the Arena repository on ``PYTHONPATH`` and ``pydantic-settings`` in
  the verl environment. ``warm_pool: true`` keeps a warm ``SandboxPool`` per event loop instead of
  a one-slot pool per call; other keys (``timeout_s``, ``memory_mb``, ``pool_size``, ``uid_base``,
  ...) override ``arena.config.SandboxSettings``. Each call is a throw-away session
  (``SandboxPool.run``), not one session per trajectory as in Arena's own rollouts: verl's
  ``ToolAgentLoop._call_tool`` creates and releases an instance around every single call, and
  nothing tells a tool that a trajectory has ended (a session kept past its call would never be
  closed).
- ``sandbox: subprocess``: a plain ``python -I`` child per call with CPU/memory rlimits and a
  timeout, **no isolation**; for clusters where the sandbox cannot run (no root) and the packages
  are trusted. Needs nothing from Arena.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import resource
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

logger = logging.getLogger(__name__)

PACKAGE_CACHE = 256
"""Parsed packages kept per process (a rollout creates an instance per call; parse each package once)."""
RESULT_MARK = "\x00arena-return-value\x00"
EXCERPT = 2000
MAX_OUTPUT_CHARS = 8192
"""As ``environments.environment.MAX_OUTPUT_CHARS`` (verl may cut further: max_tool_response_length)."""


@dataclass
class _Package:
    """What a call needs of an ``EnvPackage``; ``model`` is the validated Arena record when importable."""

    env_id: str
    tools: list[dict[str, Any]]
    code: str
    data: dict[str, Any]
    model: Any = None


class ArenaEnvTool(BaseTool):
    """One Arena tool name; each rollout's create_kwargs say which package implements it."""

    _packages: ClassVar[OrderedDict[str, _Package]] = OrderedDict()
    """Shared by the tool objects of one process."""

    def __init__(self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | None) -> None:
        super().__init__(config, tool_schema)
        self.sandbox = str(config.get("sandbox", "arena"))
        if self.sandbox not in ("arena", "subprocess"):
            raise ValueError(f"sandbox must be 'arena' or 'subprocess', not {self.sandbox!r}")
        self.warm_pool = bool(config.get("warm_pool", False))
        self.timeout_s = float(config.get("timeout_s", 10.0))
        self.memory_mb = int(config.get("memory_mb", 512))
        self._instances: dict[str, _Package] = {}
        self._pools: dict[int, Any] = {}
        self._settings: Any = None
        if self.sandbox == "arena":
            self._settings = _sandbox_settings(config)  # fails here, at start-up, when Arena is missing

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Bind an instance to its package.

        verl's agent loop passes ``create_kwargs={...}``; the older SGLang rollout passed the
        create kwargs themselves: both are accepted.
        """
        create_kwargs = kwargs.get("create_kwargs", kwargs) or {}
        if "package" not in create_kwargs:
            raise ValueError(f"{self.name}: create_kwargs need 'package' (got {sorted(create_kwargs)})")
        instance_id = instance_id or str(uuid4())
        self._instances[instance_id] = self._package(create_kwargs["package"], create_kwargs.get("env_id"))
        return instance_id, ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run the call in the sandbox; the step reward is 0 (the F1 reward is computed per trajectory)."""
        package = self._instances.get(instance_id)
        if package is None:
            return ToolResponse(text=f"error: unknown instance {instance_id}"), 0.0, {"ok": False}
        if not isinstance(parameters, Mapping):
            return ToolResponse(text="error: arguments must be a JSON object"), 0.0, {"ok": False}
        spec = next((t for t in package.tools if t.get("function", t).get("name") == self.name), None)
        problem = argument_error(spec, parameters) if spec is not None else None
        if problem is not None:
            return ToolResponse(text=f"error: {self.name}: {problem}"), 0.0, {"ok": False}
        try:
            source = self._program(package, dict(parameters))
        except ValueError as exc:
            return ToolResponse(text=f"error: {exc}"), 0.0, {"ok": False}
        ok, text, wall_s = await self._run(source)
        if ok:
            text = cut(text, MAX_OUTPUT_CHARS)
        return ToolResponse(text=text), 0.0, {"ok": ok, "wall_s": wall_s, "env_id": package.env_id}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """No per-tool reward: the F1 reward needs the whole trajectory (``reward.py:compute_score``)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)

    # --- packages and programs ---------------------------------------------------------------------
    def _package(self, raw: str | Mapping[str, Any], env_id: str | None) -> _Package:
        key = env_id or (raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True))
        cached = self._packages.get(key)
        if cached is not None:
            self._packages.move_to_end(key)
            return cached
        obj = json.loads(raw) if isinstance(raw, str) else dict(raw)
        model = None
        if self.sandbox == "arena":
            from arena.records.envs import EnvPackage

            model = EnvPackage.model_validate(obj)
        package = _Package(
            env_id=str(obj.get("env_id", env_id or "")),
            tools=list(obj.get("tools", [])),
            code=str(obj.get("code", "")),
            data=dict(obj.get("data", {})),
            model=model,
        )
        self._packages[key] = package
        while len(self._packages) > PACKAGE_CACHE:
            self._packages.popitem(last=False)
        return package

    def _program(self, package: _Package, arguments: dict[str, Any]) -> str:
        if package.model is not None:
            from sandbox.env_runtime import call_program

            return call_program(package.model, self.name, arguments)
        return call_program_standalone(package.tools, package.code, package.data, self.name, arguments)

    # --- execution -----------------------------------------------------------------------------------
    async def _run(self, source: str) -> tuple[bool, str, float]:
        if self.sandbox == "subprocess":
            return await run_subprocess(source, self.timeout_s, self.memory_mb)
        from sandbox.env_runtime import output_text
        from sandbox.pool import SandboxPool, SandboxUnavailable, run_once

        try:
            if self.warm_pool:
                loop_id = id(asyncio.get_running_loop())
                if loop_id not in self._pools:  # asyncio objects of a pool belong to one loop
                    self._pools[loop_id] = SandboxPool(self._settings)
                result = await self._pools[loop_id].run(source)
            else:
                result = await run_once(source, self._settings)
        except SandboxUnavailable as exc:
            return False, f"error: sandbox_error: {exc}", 0.0
        if result.ok:
            return True, output_text(result), result.wall_s
        failure = f"{result.error_type}: {result.error}" if result.error else str(result.error_type)
        return False, f"error: {failure}", result.wall_s


def _sandbox_settings(config: Mapping[str, Any]) -> Any:
    """``arena.config.SandboxSettings`` with the tool config's overrides."""
    try:
        from arena.config import SandboxSettings
    except ImportError as exc:
        raise ImportError(
            "ArenaEnvTool with sandbox: arena needs Arena importable in the verl environment: put the "
            "Arena repository on PYTHONPATH and install pydantic-settings (or set sandbox: subprocess)"
        ) from exc
    fields = set(SandboxSettings.model_fields)
    return SandboxSettings.model_validate({k: v for k, v in config.items() if k in fields})


def argument_error(spec: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """As ``environments.environment.argument_error``: missing required or unknown argument names."""
    params = spec.get("function", spec).get("parameters") or {}
    properties = params.get("properties") or {}
    missing = [p for p in params.get("required") or [] if p not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(map(repr, missing))}"
    if properties and params.get("additionalProperties") is not True:
        unknown = [a for a in arguments if a not in properties]
        if unknown:
            return f"unknown argument(s) {', '.join(map(repr, unknown))}; parameters: {sorted(properties)}"
    return None


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [cut at {limit} characters]"


def call_program_standalone(
    tools: list[dict[str, Any]], code: str, data: Mapping[str, Any], tool: str, arguments: Mapping[str, Any]
) -> str:
    """``sandbox.env_runtime.call_program`` without Arena (same text; tests compare them)."""
    names = {t.get("function", t).get("name") for t in tools}
    if tool not in names or not tool.isidentifier():
        raise ValueError(f"package has no tool {tool!r} (tools: {sorted(map(str, names))})")
    payload = json.dumps(data, ensure_ascii=False, sort_keys=True)
    args = json.dumps(dict(arguments), ensure_ascii=False)
    invocation = f"{tool}(**json.loads({args!r}))"
    return f"import json\nDATA = json.loads({payload!r})\n{code.rstrip()}\n{invocation}\n"


_CHILD = f"""
import ast, json, sys
tree = ast.parse(sys.stdin.read())
last = tree.body.pop()
scope = {{"__name__": "__arena_env__"}}
exec(compile(tree, "<env>", "exec"), scope)
value = eval(compile(ast.Expression(last.value), "<env>", "eval"), scope)
sys.stdout.write({RESULT_MARK!r} + json.dumps(value, ensure_ascii=False, default=repr))
"""


async def run_subprocess(source: str, timeout_s: float, memory_mb: int) -> tuple[bool, str, float]:
    """Run ``source`` in a plain child interpreter (no isolation); output text as Arena's sandbox gives it."""
    loop = asyncio.get_running_loop()
    start = loop.time()

    def limits() -> None:  # runs in the child before exec
        cpu = max(1, int(timeout_s + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    with tempfile.TemporaryDirectory(prefix="arena-tool-") as cwd:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-c",
            _CHILD,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"},
            preexec_fn=limits,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(source.encode()), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return False, f"error: timeout: wall-clock timeout after {timeout_s:g} s", loop.time() - start
    wall = loop.time() - start
    stdout = out.decode(errors="replace")
    if proc.returncode != 0 or RESULT_MARK not in stdout:
        last = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        return False, f"error: exception: {last[0][:EXCERPT]}", wall
    printed, _, value = stdout.rpartition(RESULT_MARK)
    return True, printed + value, wall

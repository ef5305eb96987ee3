"""The environment runtime: how an ``EnvPackage`` becomes a program, and how a job is judged.

Execution contract. A job (or an agent's tool call) runs, in the sandbox, the
program::

    import json
    DATA = json.loads(<json.dumps(package.data)>)
    <package.code>
    <invocation>          # final expression statement; its value is the return value

The sandbox returns the trailing expression's value as ``return_value``.
``verify_package`` runs that program in two parts: the package is loaded once in a session
(DATA bound as the same JSON value, ``json`` imported, the code run; ``load_package``) and each
invocation then runs on it without committing, its output after what the loading printed -- so
a job's outcome is that of its whole program, without the package being rebuilt per job. A job
passes when the run is ok and the output text (stdout followed by the JSON of
the return value) is no error payload and contains the answer (the "output contains a_i"
rule of ASTRA §2.2.3) by ``arena.tool_reward.answer_in``, the rule of the F1 reward: the
answer's tokens on token boundaries after Unicode and case normalisation, numbers compared as
numbers within tolerance (so ``3`` is not found in ``13``).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Protocol

from pydantic import BaseModel, Field

from arena.records.envs import Cell, EnvJob, EnvPackage
from arena.tool_reward import answer_in, error_payload
from sandbox.pool import SandboxResult

EXCERPT_CHARS = 400


class EnvSession(Protocol):
    """One environment instance in the sandbox for a whole episode (``sandbox.pool.Session``).

    Its namespaces (``space``) keep globals between requests, so an environment's tools and state
    are loaded once and each tool call is a message. A request that fails, or is sent with
    ``commit=False``, leaves the session as it was."""

    @property
    def alive(self) -> bool:
        """The session can still take requests (not closed, its process not gone)."""
        ...

    async def run(
        self,
        source: str,
        *,
        bind: dict[str, Any] | None = None,
        space: str = "main",
        commit: bool = True,
        timeout_s: float | None = None,
    ) -> SandboxResult:
        """Execute ``source`` in ``space`` after binding ``bind`` (JSON values) as its globals."""
        ...

    async def call(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        space: str = "main",
        commit: bool = True,
        timeout_s: float | None = None,
    ) -> SandboxResult:
        """``tool(**arguments)``, ``tool`` a function of ``space``."""
        ...

    async def read(self, name: str, *, space: str = "main") -> SandboxResult:
        """The value of the global ``name`` of ``space`` (e.g. the environment's state)."""
        ...

    async def close(self) -> None:
        """End the session; its processes are gone when this returns."""
        ...


class Runner(Protocol):
    """What runs sandboxed code: ``sandbox.SandboxPool`` (or anything with its ``run`` and
    ``open_session``). ``run`` is one program in a throw-away session; ``open_session`` waits while
    the pool's ``pool_size`` sessions are open (back-pressure)."""

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> SandboxResult: ...

    async def open_session(
        self, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> EnvSession: ...


MACHINE_FAILURES = frozenset({"timeout", "killed", "crash", "sandbox_error"})
"""Ways a run ends that say more about the machine (load, a pool restarted under a killed worker)
than about the program: worth running again before judging anything by them."""


class SandboxUnsettled(RuntimeError):
    """A sandboxed run kept failing for machine reasons: the record is dead-lettered, not judged."""


async def run_settled(
    runner: Runner, code: str, *, timeout_s: float | None = None, attempts: int = 3
) -> SandboxResult:
    """``runner.run``, run again (up to ``attempts`` in all) while it ends in a ``MACHINE_FAILURES``.

    A gate that reads a timeout or a killed run as the program's verdict gives a record another
    outcome when it is handled again on a quieter machine; a run that keeps failing this way raises
    ``SandboxUnsettled`` instead, so the stage dead-letters the record (replayable) and goes on.
    """
    for attempt in range(1, attempts + 1):
        result = await runner.run(code, timeout_s=timeout_s)
        if result.ok or result.error_type not in MACHINE_FAILURES:
            return result
        if attempt == attempts:
            raise SandboxUnsettled(f"{attempts} sandbox runs ended with {result.error_type}: {result.error}")
    raise AssertionError("unreachable")


class JobOutcome(BaseModel):
    """The verdict on one job of a package."""

    index: Annotated[int, Field(description="Sub-question index of the job.")]
    question: Annotated[str, Field(description="Sub-question q_i.")]
    answer: Annotated[str, Field(description="Answer a_i the output had to contain.")]
    invocation: Annotated[str, Field(description="The call that was run.")]
    passed: Annotated[bool, Field(description="Run ok and output contains the answer.")]
    error: Annotated[
        str | None, Field(description="Why it failed: the sandbox error, or the answer missing.")
    ] = None
    output: Annotated[str, Field(description="Excerpt of the output text (stdout + return value JSON).")] = ""
    wall_s: Annotated[float, Field(description="Sandbox wall time of the run (seconds).")] = 0.0


def check_invocation(invocation: str) -> str:
    """``invocation`` stripped if it is one expression (so it is the program's last statement)."""
    text = invocation.strip()
    try:
        ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"invocation is not one Python expression: {exc.msg}: {text[:120]!r}") from exc
    return text


def program(data: Mapping[str, Sequence[Mapping[str, Cell]]], code: str, invocation: str) -> str:
    """The program of the execution contract (data loaded from JSON so no value is Python source)."""
    payload = json.dumps(data, ensure_ascii=False, sort_keys=True)
    return f"import json\nDATA = json.loads({payload!r})\n{code.rstrip()}\n{check_invocation(invocation)}\n"


def job_program(package: EnvPackage, job: EnvJob) -> str:
    """The program that runs ``job`` against ``package``."""
    return program(package.data, package.code, job.invocation)


def call_program(package: EnvPackage, tool: str, arguments: Mapping[str, Any]) -> str:
    """The program that runs one agent tool call: ``tool(**arguments)`` against ``package``."""
    names = {t.get("function", t).get("name") for t in package.tools}
    if tool not in names or not tool.isidentifier():
        raise ValueError(f"package {package.env_id} has no tool {tool!r} (tools: {sorted(map(str, names))})")
    args = json.dumps(dict(arguments), ensure_ascii=False)
    # Arguments travel as a JSON string literal: model-written values never become code.
    return program(package.data, package.code, f"{tool}(**json.loads({args!r}))")


def normalise(text: str) -> str:
    return " ".join(text.casefold().split())


def output_text(result: SandboxResult) -> str:
    """stdout followed by the return value as JSON (non-ASCII kept, so 'Zürich' matches)."""
    return result.stdout + json.dumps(result.return_value, ensure_ascii=False, default=repr)


def contains_answer(result: SandboxResult, answer: str) -> bool:
    """The run is ok, its output is no error payload and states ``answer`` (``arena.tool_reward``: the
    rule the F1 reward uses, token boundaries and numbers as numbers); an empty answer never does."""
    if not result.ok:
        return False
    text = output_text(result)
    return not error_payload(text) and answer_in(answer, text)


def judge(job: EnvJob, result: SandboxResult) -> JobOutcome:
    """The outcome of ``job`` given its run."""
    text = output_text(result)
    error: str | None = None
    if not result.ok:
        error = f"{result.error_type}: {result.error}" if result.error else str(result.error_type)
    elif error_payload(text):
        error = "the output is an error payload (an error never answers a sub-task)"
    elif not contains_answer(result, job.answer):
        error = f"output does not contain the answer {job.answer!r}"
    return JobOutcome(
        index=job.index,
        question=job.question,
        answer=job.answer,
        invocation=job.invocation,
        passed=error is None,
        error=error,
        output=text[:EXCERPT_CHARS],
        wall_s=result.wall_s,
    )


async def run_job(package: EnvPackage, job: EnvJob, pool: Runner) -> JobOutcome:
    """One job as one throw-away program (``job_program``); an invocation that is not an expression
    fails without a sandbox run. ``verify_package`` gives the same outcome without reloading."""
    try:
        source = job_program(package, job)
    except ValueError as exc:
        return not_run(job, str(exc))
    return judge(job, await pool.run(source))


def not_run(job: EnvJob, error: str) -> JobOutcome:
    """The outcome of a job that failed before anything ran."""
    return JobOutcome(
        index=job.index,
        question=job.question,
        answer=job.answer,
        invocation=job.invocation,
        passed=False,
        error=error,
    )


LOAD_PRELUDE = "import json\n# DATA is bound by the session\n"
"""What ``program`` has before the package's code, two lines as there, so a SyntaxError's line
number (part of the error text) is the same in a session as in a job program."""


def bound_data(data: Mapping[str, Sequence[Mapping[str, Cell]]]) -> dict[str, Any]:
    """DATA as ``program`` builds it: ``json.loads`` of sorted-key JSON (key order is visible to code)."""
    loaded: dict[str, Any] = json.loads(json.dumps(data, ensure_ascii=False, sort_keys=True))
    return loaded


def load_source(code: str) -> str:
    """The package's code as a session runs it; the final ``pass`` keeps a trailing expression of
    the code a plain statement (as in ``program``), not a return value to encode."""
    return f"{LOAD_PRELUDE}{code.rstrip()}\npass\n"


async def load_package(session: EnvSession, package: EnvPackage, *, space: str = "main") -> SandboxResult:
    """Bind ``package``'s DATA and run its code in ``space`` of ``session`` (committed: later
    requests see it)."""
    source = load_source(package.code)
    return await session.run(source, bind={"DATA": bound_data(package.data)}, space=space)


def after_load(loaded: SandboxResult, result: SandboxResult) -> SandboxResult:
    """``result`` of a request on a loaded package as the job program would report it: what the
    package's code printed while loading comes first in the output."""
    if not (loaded.stdout or loaded.stderr):
        return result
    return result.model_copy(
        update={"stdout": loaded.stdout + result.stdout, "stderr": loaded.stderr + result.stderr}
    )


class PackageSession:
    """A package loaded once in a session of ``pool``; each invocation runs on it without committing.

    A session that dies (an invocation ran over its time, or crashed) is replaced by a fresh one with
    the package loaded again, so one job's end never fails the next, as with one program per job."""

    def __init__(self, package: EnvPackage, pool: Runner) -> None:
        self.package = package
        self.pool = pool
        self._session: EnvSession | None = None
        self._loaded: SandboxResult | None = None

    async def _ready(self) -> tuple[EnvSession, SandboxResult]:
        session, loaded = self._session, self._loaded
        if session is None or loaded is None or (loaded.ok and not session.alive):
            await self.close()
            session = self._session = await self.pool.open_session()
            loaded = self._loaded = await load_package(session, self.package)
        return session, loaded

    async def run(self, invocation: str) -> SandboxResult:
        """The result of ``invocation`` (one expression) on the package; a package whose code does not
        load gives that load's result."""
        session, loaded = await self._ready()
        if not loaded.ok:
            return loaded
        result = await session.run(invocation, commit=False)
        # A request that ended the session brings no output (as a job program that died has none).
        return after_load(loaded, result) if session.alive else result

    async def close(self) -> None:
        session, self._session, self._loaded = self._session, None, None
        if session is not None:
            await session.close()


async def verify_package(package: EnvPackage, pool: Runner) -> list[JobOutcome]:
    """Every job of ``package``, in job order, one after another in one session where the package is
    loaded once; each job sees the package as loaded (no job sees another's changes). Outcomes are
    those of ``run_job``: the same program, split into its load and its invocation."""
    outcomes: list[JobOutcome] = []
    loaded = PackageSession(package, pool)
    try:
        for job in package.jobs:
            try:
                invocation = check_invocation(job.invocation)
            except ValueError as exc:
                outcomes.append(not_run(job, str(exc)))
                continue
            outcomes.append(judge(job, await loaded.run(invocation)))
    finally:
        await loaded.close()
    return outcomes

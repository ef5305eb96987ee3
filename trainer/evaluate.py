"""``arena eval``: pass^k and pass@k of a policy on held-out environments (issue 5 item 8, issue 6 item 6).

The held-out cases are the catalog's held-out qa packages (environment track, ``env_packages``) and
its held-out interactive instances (EigenData track, ``eigen_instances``), reported together, one
row per domain. Every case (a held-out sample and how to build a fresh environment for it) is rolled
out ``trials`` times (n >= k) with distinct seeds; an interactive trial gets a fresh
``InteractiveEnvironment`` with the user simulator in the loop (the gateway's ``user_simulator``
role by default, or the evaluated policy speaking as the user).

The policy is a local checkpoint, rolled out token by token (``trainer.rollout``), or a model
served at an OpenAI-compatible endpoint (``--model openai://host:port/v1?model=NAME``), driven one
chat turn at a time through the gateway's native ``agent_policy`` role
(``trainer.endpoint_policy``). Both end in a ``Trajectory`` scored by the same environment, so
what follows holds for both. A trial succeeds when

- ``qa``: the final assistant message contains the main answer a0 (``reward_spec["answer"]``,
  matched by ``arena.tool_reward.answer_in``, the reward's rule; an empty answer never counts); the trial's F1
  reward (ASTRA eq. 30-31) is kept alongside;
- ``interactive``: the verification function passed (reward 1, EigenData §5).

With c successes out of n trials, per case (unbiased estimators, both from ``math.comb``):

    pass^k = C(c, k) / C(n, k)          all of k trials succeed (tau-bench)
    pass@k = 1 - C(n - c, k) / C(n, k)  at least one of k trials succeeds (Chen et al. 2021)

Per domain and overall, each metric is the mean over cases, with a 95% confidence interval from a
percentile bootstrap over cases (2000 resamples, numpy ``default_rng(seed)``); a group of one case
has a zero-width interval.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field
from rich.markup import escape
from rich.table import Table

from arena.config import ArenaSettings
from arena.hashing import content_hash
from arena.llm.roles.user_sim import UserBehaviour, user_behaviour
from arena.records.envs import EnvPackage, VerifiedSample
from arena.tool_reward import answer_in
from lake.eigen_catalog import EigenCatalog
from lake.env_packages import EnvPackageStore
from streams.envs.samples_verified import sample_of
from trainer.call_stats import CallStats, call_stats

if TYPE_CHECKING:
    from environments.environment import Environment
    from environments.user_view import UserSimulator
    from sandbox.env_runtime import Runner
    from trainer.endpoint_policy import EndpointPolicy
    from trainer.policy import RolloutBackend
    from trainer.rollout import Trajectory

log = logging.getLogger(__name__)

EvalUser = Literal["gateway", "policy"]
"""Who plays the user of interactive cases: the gateway's role (ARENA_LLM), or the evaluated policy."""

BOOTSTRAP_RESAMPLES = 2000
CI_METHOD = f"95% percentile bootstrap over cases ({BOOTSTRAP_RESAMPLES} resamples, seeded)"


# --- estimators ----------------------------------------------------------------------------------
def _check(n: int, c: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if n < k:
        raise ValueError(f"need n >= k trials, got n={n}, k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"successes c={c} must lie in [0, n={n}]")


def pass_hat_k(n: int, c: int, k: int) -> float:
    """tau-bench's pass^k: the chance that k trials drawn without replacement from n all succeed."""
    _check(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s pass@k: the chance that at least one of k trials drawn from n succeeds."""
    _check(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# --- trials --------------------------------------------------------------------------------------
def final_answer(trajectory: Trajectory) -> str:
    """Content of the trajectory's last assistant message ('' when it has none)."""
    for message in reversed(trajectory.messages):
        if message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
            return str(content or "")
    return ""


def answer_given(answer: str, text: str) -> bool:
    """``text`` states ``answer`` (``arena.tool_reward.answer_in``: token boundaries, numbers as numbers,
    so "3" does not pass because the text says "30"); never an empty answer."""
    return answer_in(answer, text)


def trial_success(sample: VerifiedSample, trajectory: Trajectory) -> bool:
    """qa: the final message states a0; interactive: the verification function passed (reward 1)."""
    if sample.kind == "qa":
        return answer_given(str(sample.reward_spec.get("answer") or ""), final_answer(trajectory))
    return trajectory.reward >= 1.0 - 1e-9


def trial_seed(seed: int, sample_id: str, trial: int) -> int:
    """Distinct per trial of a case (consecutive from a per-case base), stable across runs."""
    base = int(content_hash({"seed": seed, "sample": sample_id}, length=8), 16) % (1 << 30)
    return base + trial


# --- models --------------------------------------------------------------------------------------
class EvalCase(BaseModel):
    """A held-out sample and a factory of fresh environment instances for it (one per trial)."""

    sample: Annotated[VerifiedSample, Field(description="The sample rolled out.")]
    make_env: Annotated[
        Callable[[], Any], Field(description="Returns a new Environment (environments.environment) per call.")
    ]


class HeldOut(BaseModel):
    """A held-out package from the catalog and its qa sample."""

    sample: Annotated[VerifiedSample, Field(description="sample_of(package), split heldout.")]
    package: Annotated[EnvPackage, Field(description="The package the environment runs.")]


class Metric(BaseModel):
    """A mean over cases and its 95% confidence interval."""

    mean: Annotated[float, Field(description="Mean over cases.")]
    ci_low: Annotated[float, Field(description="Lower end of the 95% interval.")]
    ci_high: Annotated[float, Field(description="Upper end of the 95% interval.")]


class CaseResult(BaseModel):
    """The trials of one case."""

    sample_id: Annotated[str, Field(description="Sample id.")]
    env_ref: Annotated[str, Field(description="Package or instance id.")]
    domain: Annotated[str, Field(description="Domain.")]
    kind: Annotated[str, Field(description="qa or interactive.")]
    trials: Annotated[int, Field(description="n: trials run.")]
    successes: Annotated[int, Field(description="c: successful trials.")]
    pass_hat: Annotated[dict[int, float], Field(description="j -> pass^j for j = 1..k.")]
    pass_at_k: Annotated[float, Field(description="pass@k.")]
    f1: Annotated[list[float], Field(description="F1 reward per trial (qa; empty for interactive).")]
    rewards: Annotated[list[float], Field(description="Training reward per trial.")]
    turns: Annotated[list[int], Field(description="Assistant turns per trial.")]
    tool_calls: Annotated[list[int], Field(description="Emitted tool calls per trial.")]
    call_stats: list[CallStats] = Field(
        default_factory=list, description="Failed observations and grounded calls per trial."
    )
    errors: list[str] = Field(default_factory=list, description="Trials that raised (counted as failures).")


class GroupReport(BaseModel):
    """Metrics of one domain, or of all cases."""

    name: Annotated[str, Field(description="Domain, or 'all'.")]
    cases: Annotated[int, Field(description="Cases in the group.")]
    trials: Annotated[int, Field(description="Trials run in the group.")]
    pass_hat: Annotated[dict[int, Metric], Field(description="j -> mean pass^j over cases, j = 1..k.")]
    pass_at_k: Annotated[Metric, Field(description="Mean pass@k over cases.")]
    f1: Annotated[Metric | None, Field(description="Mean over qa cases of the mean trial F1.")]
    mean_turns: Annotated[float, Field(description="Mean assistant turns per trial.")]
    mean_tool_calls: Annotated[float, Field(description="Mean emitted tool calls per trial.")]
    failed_call_share: Annotated[
        float | None,
        Field(description="Tool observations that report a failure / all (None without any)."),
    ] = None
    grounded_call_share: Annotated[
        float | None,
        Field(
            description="Parsed calls whose argument values occur in earlier context / all (None without any)."
        ),
    ] = None


class EvalReport(BaseModel):
    """What ``arena eval`` prints (``--json``: ``model_dump_json()``)."""

    model: Annotated[str | None, Field(description="Policy evaluated.")] = None
    data_version: Annotated[
        str | None,
        Field(description="The data version the evaluated run trained on (None: not a run's weights)."),
    ] = None
    k: Annotated[int, Field(description="k of pass^k / pass@k.")]
    trials: Annotated[int, Field(description="n: trials per case (>= k).")]
    seed: Annotated[int, Field(description="Base seed of the trials and the bootstrap.")]
    ci_method: Annotated[str, Field(description="How the intervals were computed.")] = CI_METHOD
    domains: Annotated[list[GroupReport], Field(description="One group per domain, sorted.")]
    overall: Annotated[GroupReport, Field(description="All cases.")]
    cases: Annotated[list[CaseResult], Field(description="Per-case results.")]
    wall_s: Annotated[float, Field(description="Seconds the evaluation took.")] = 0.0


# --- aggregation ---------------------------------------------------------------------------------
def bootstrap_ci(values: Sequence[float], rng: np.random.Generator) -> Metric:
    """Mean of ``values`` and its 95% percentile-bootstrap interval (resampling the values)."""
    data = np.asarray(values, dtype=float)
    mean = float(data.mean())
    if len(data) < 2:
        return Metric(mean=mean, ci_low=mean, ci_high=mean)
    picks = rng.integers(0, len(data), size=(BOOTSTRAP_RESAMPLES, len(data)))
    means = data[picks].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return Metric(mean=mean, ci_low=float(low), ci_high=float(high))


def case_result(sample: VerifiedSample, trajectories: Sequence[Trajectory | str], k: int) -> CaseResult:
    """Count the successes of one case's trials (a string is a trial that raised) and apply the estimators."""
    done = [t for t in trajectories if not isinstance(t, str)]
    n = len(trajectories)
    c = sum(trial_success(sample, t) for t in done)
    return CaseResult(
        sample_id=sample.sample_id,
        env_ref=sample.env_ref,
        domain=sample.domain,
        kind=sample.kind,
        trials=n,
        successes=c,
        pass_hat={j: pass_hat_k(n, c, j) for j in range(1, k + 1)},
        pass_at_k=pass_at_k(n, c, k),
        f1=[float(t.reward_parts.get("f1", 0.0)) for t in done] if sample.kind == "qa" else [],
        rewards=[float(t.reward) for t in done],
        turns=[int(t.turns) for t in done],
        tool_calls=[int(t.tool_calls) for t in done],
        call_stats=[call_stats(t.messages, t.tools) for t in done],
        errors=[t for t in trajectories if isinstance(t, str)],
    )


def group_report(name: str, cases: Sequence[CaseResult], k: int, seed: int) -> GroupReport:
    """Means over cases with bootstrap intervals (seeded per group name, so groups do not share draws)."""
    rng = np.random.default_rng([seed, int(content_hash(name, length=8), 16)])
    qa = [c for c in cases if c.kind == "qa"]
    turns = [t for c in cases for t in c.turns]
    calls = [t for c in cases for t in c.tool_calls]
    stats = [s for c in cases for s in c.call_stats]
    observations, parsed = sum(s.observations for s in stats), sum(s.calls for s in stats)
    return GroupReport(
        name=name,
        cases=len(cases),
        trials=sum(c.trials for c in cases),
        pass_hat={j: bootstrap_ci([c.pass_hat[j] for c in cases], rng) for j in range(1, k + 1)},
        pass_at_k=bootstrap_ci([c.pass_at_k for c in cases], rng),
        f1=bootstrap_ci([sum(c.f1) / len(c.f1) if c.f1 else 0.0 for c in qa], rng) if qa else None,
        mean_turns=sum(turns) / len(turns) if turns else 0.0,
        mean_tool_calls=sum(calls) / len(calls) if calls else 0.0,
        failed_call_share=sum(s.failed for s in stats) / observations if observations else None,
        grounded_call_share=sum(s.grounded for s in stats) / parsed if parsed else None,
    )


def aggregate(results: Sequence[CaseResult], *, k: int, trials: int, seed: int) -> EvalReport:
    if not results:
        raise ValueError("no cases to evaluate")
    domains = sorted({r.domain for r in results})
    return EvalReport(
        k=k,
        trials=trials,
        seed=seed,
        domains=[group_report(d, [r for r in results if r.domain == d], k, seed) for d in domains],
        overall=group_report("all", results, k, seed),
        cases=list(results),
    )


# --- evaluation ----------------------------------------------------------------------------------
TrialRunner = Callable[["EvalCase", "Environment", int], Awaitable["Trajectory"]]
"""Runs one trial: a case, a fresh environment of it, the trial's seed -> the scored trajectory."""


async def run_trials(
    cases: Sequence[EvalCase],
    run_trial: TrialRunner,
    *,
    k: int,
    trials: int | None = None,
    seed: int = 0,
    concurrency: int = 4,
    on_trial: Callable[[], None] | None = None,
) -> EvalReport:
    """Run every case ``trials`` (default k) times with ``run_trial`` and report pass^1..pass^k, pass@k.

    At most ``concurrency`` trials are in flight. Trial t of a case gets a fresh environment (closed
    when the trial is over) and the seed ``trial_seed(seed, sample_id, t)``. A trial that raises is
    logged, recorded in ``CaseResult.errors`` and counts as a failure, so one broken environment (or
    one turn the policy could not answer) cannot stop the evaluation.
    """
    from trainer.endpoint_policy import TurnFailed

    n = k if trials is None else trials
    if n < k:
        raise ValueError(f"trials ({n}) must be >= k ({k})")
    gate = asyncio.Semaphore(concurrency)
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def trial(case: EvalCase, t: int) -> Trajectory | str:
        async with gate:
            env: Environment | None = None
            try:
                env = case.make_env()
                return await run_trial(case, env, trial_seed(seed, case.sample.sample_id, t))
            except TurnFailed as exc:  # the policy gave no usable reply: data, not a crash
                log.warning("eval trial %d of %s failed: %s", t, case.sample.sample_id, exc)
                return f"{type(exc).__name__}: {exc}"
            except Exception as exc:
                log.exception("eval trial %d of %s failed", t, case.sample.sample_id)
                return f"{type(exc).__name__}: {exc}"
            finally:
                if env is not None:
                    await env.close()  # frees its sandbox session whatever the trial did
                if on_trial is not None:
                    on_trial()

    per_case = await asyncio.gather(*(asyncio.gather(*(trial(c, t) for t in range(n))) for c in cases))
    results = [case_result(c.sample, trajs, k) for c, trajs in zip(cases, per_case, strict=True)]
    report = aggregate(results, k=k, trials=n, seed=seed)
    report.wall_s = round(loop.time() - start, 3)
    return report


async def evaluate(
    backend: RolloutBackend,
    tokenizer: Any,
    cases: Sequence[EvalCase],
    *,
    k: int,
    trials: int | None = None,
    max_turns: int = 32,
    max_seq_len: int = 4096,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    seed: int = 0,
    concurrency: int = 4,
    on_trial: Callable[[], None] | None = None,
) -> EvalReport:
    """Roll every case out ``trials`` (default k) times with a local policy; see ``run_trials``.

    Tool calls of one rollout overlap generation of another (generation is serialised per backend).
    """
    from trainer.rollout import rollout

    async def run_trial(case: EvalCase, env: Environment, trial_seed: int) -> Trajectory:
        return await rollout(
            backend,
            tokenizer,
            env,
            case.sample,
            max_turns=max_turns,
            max_seq_len=max_seq_len,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            seed=trial_seed,
        )

    return await run_trials(
        cases, run_trial, k=k, trials=trials, seed=seed, concurrency=concurrency, on_trial=on_trial
    )


async def evaluate_endpoint(
    policy: EndpointPolicy,
    cases: Sequence[EvalCase],
    *,
    k: int,
    trials: int | None = None,
    max_turns: int = 32,
    seed: int = 0,
    concurrency: int = 4,
    on_trial: Callable[[], None] | None = None,
) -> EvalReport:
    """Run every case ``trials`` (default k) times with a model at an endpoint (message-level
    episodes through the gateway's ``agent_policy`` role, ``trainer.endpoint_policy``); see
    ``run_trials``. A turn without a usable reply fails its trial (``CaseResult.errors``)."""
    from trainer.endpoint_policy import endpoint_episode

    async def run_trial(case: EvalCase, env: Environment, trial_seed: int) -> Trajectory:
        return await endpoint_episode(policy, env, case.sample, max_turns=max_turns, seed=trial_seed)

    return await run_trials(
        cases, run_trial, k=k, trials=trials, seed=seed, concurrency=concurrency, on_trial=on_trial
    )


def heldout_cases(settings: ArenaSettings | EnvPackageStore) -> list[HeldOut]:
    """The held-out packages of the catalog (never published to samples.verified), with their qa samples."""
    store = settings if isinstance(settings, EnvPackageStore) else EnvPackageStore(settings.catalog)
    try:
        rows = store.rows("heldout")
    finally:
        if store is not settings:
            store.dispose()
    packages = sorted((EnvPackage.model_validate_json(row.package) for row in rows), key=lambda p: p.env_id)
    return [HeldOut(sample=sample_of(p).model_copy(update={"split": "heldout"}), package=p) for p in packages]


def qa_cases(heldout: Sequence[HeldOut], runner: Runner, *, timeout_s: float | None = None) -> list[EvalCase]:
    """One case per held-out package: a fresh ``QaEnvironment`` (no mixed-in tools) per trial."""
    from environments.environment import QaEnvironment

    def factory(h: HeldOut) -> Callable[[], Any]:
        return lambda: QaEnvironment(h.sample, h.package, runner, timeout_s=timeout_s)

    return [EvalCase(sample=h.sample, make_env=factory(h)) for h in heldout]


def heldout_instances(settings: ArenaSettings | EigenCatalog) -> list[VerifiedSample]:
    """The held-out interactive instances of the catalog (never published), as split-heldout samples.

    Sorted by instance id. A row whose sample is not interactive is skipped with a warning (the
    table only ever holds interactive instances; a bad row must not stop the evaluation).
    """
    catalog = settings if isinstance(settings, EigenCatalog) else EigenCatalog(settings.catalog)
    try:
        rows = catalog.instances(split="heldout")
    finally:
        if catalog is not settings:
            catalog.dispose()
    samples = []
    for row in rows:
        sample = VerifiedSample.model_validate_json(row.sample)
        if sample.kind != "interactive":
            log.warning("eigen instance %s holds a %s sample; skipped", row.instance_id, sample.kind)
            continue
        samples.append(sample.model_copy(update={"split": "heldout"}))
    return samples


def interactive_cases(
    samples: Sequence[VerifiedSample],
    runner: Runner,
    user: UserSimulator,
    *,
    timeout_s: float | None = None,
    behaviour: UserBehaviour | None = None,
) -> list[EvalCase]:
    """One case per held-out instance: a fresh ``InteractiveEnvironment`` per trial, ``user`` as the
    user (with ``behaviour``'s rates; default all off)."""
    from environments.environment import InteractiveEnvironment

    def factory(sample: VerifiedSample) -> Callable[[], Any]:
        return lambda: InteractiveEnvironment(sample, runner, user, timeout_s=timeout_s, behaviour=behaviour)

    return [EvalCase(sample=s, make_env=factory(s)) for s in samples]


def run_eval(
    settings: ArenaSettings,
    model_path: str,
    *,
    k: int = 4,
    trials: int | None = None,
    max_turns: int | None = None,
    seed: int = 0,
    limit: int | None = None,
    only: Collection[str] | None = None,
    concurrency: int = 4,
    progress: bool = True,
    user: EvalUser = "gateway",
) -> EvalReport:
    """``arena eval``: load the policy, roll out every held-out package and instance in the sandbox, report.

    ``model_path`` is a local model folder, or an OpenAI-compatible endpoint
    (``openai://host:port/v1?model=NAME``, ``openais://`` for https; ``trainer.endpoint_policy``):
    the model then acts through the gateway's native ``agent_policy`` role with the ``llm_*``
    settings (``ARENA_LLM_API_KEY``, ``ARENA_LLM_TIMEOUT_S``, ...), and an endpoint that does not
    serve raises ``EndpointError`` before anything runs.

    Local rollout limits default to ``settings.train`` (max_turns, max_seq_len, max_new_tokens,
    temperature); ``settings.train.backend`` picks transformers (CPU) or vLLM. An endpoint's turns
    sample at ``settings.train.temperature`` within ``max_turns``. ``limit`` caps the held-out
    packages (the first by env_id) and, separately, the interactive instances (the first by
    instance id). ``only``: evaluate just the held-out packages and instances with these ids (env
    ids, instance ids), before ``limit``. ``user`` picks who plays the user of interactive cases:
    the gateway settings describe (``ARENA_LLM``; closed afterwards), or the evaluated policy
    itself (for a policy SFT-trained on user-simulator samples too; an endpoint plays it through
    the gateway's ``user_simulator`` role). Raises ``ValueError`` when there is nothing held out,
    or ``only`` names none of it.
    """
    from trainer.endpoint_policy import check_endpoint_url, is_endpoint

    endpoint = is_endpoint(model_path)
    if endpoint:
        check_endpoint_url(model_path)
    heldout = heldout_cases(settings)
    instances = heldout_instances(settings)
    if not heldout and not instances:
        raise ValueError(
            "no held-out packages or interactive instances in the catalog "
            "(run the environment track or the EigenData track first)"
        )
    if only is not None:
        heldout = [h for h in heldout if h.package.env_id in only]
        instances = [s for s in instances if s.env_ref in only]
        if not heldout and not instances:
            raise ValueError("none of the ids to evaluate is a held-out package or interactive instance")
    heldout, instances = heldout[:limit], instances[:limit]
    plan = _EvalPlan(
        heldout=heldout,
        instances=instances,
        k=k,
        trials=k if trials is None else trials,
        max_turns=max_turns or settings.train.max_turns,
        seed=seed,
        concurrency=concurrency,
        progress=progress,
        user=user,
    )
    if endpoint:
        report = asyncio.run(_eval_endpoint(settings, model_path, plan))
    else:
        report = _eval_local(settings, model_path, plan)
    report.model = model_path
    return report


@dataclass(frozen=True)
class _EvalPlan:
    """What ``run_eval`` evaluates (held-out packages and instances) and how (see its arguments)."""

    heldout: list[HeldOut]
    instances: list[VerifiedSample]
    k: int
    trials: int
    max_turns: int
    seed: int
    concurrency: int
    progress: bool
    user: EvalUser


EvalRun = Callable[[list[EvalCase], Callable[[], None]], Awaitable[EvalReport]]
"""Evaluates the cases, calling the tick after each trial."""


def _eval_local(settings: ArenaSettings, model_path: str, plan: _EvalPlan) -> EvalReport:
    """A local checkpoint: token-level rollouts (``trainer.rollout``) on its backend."""
    cfg = settings.train
    backend, tokenizer = load_backend(settings, model_path)

    def policy_user() -> UserSimulator:
        return _policy_user(backend, tokenizer, settings, plan.seed)

    def run(cases: list[EvalCase], tick: Callable[[], None]) -> Awaitable[EvalReport]:
        return evaluate(
            backend,
            tokenizer,
            cases,
            k=plan.k,
            trials=plan.trials,
            max_turns=plan.max_turns,
            max_seq_len=cfg.max_seq_len,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            seed=plan.seed,
            concurrency=plan.concurrency,
            on_trial=tick,
        )

    return asyncio.run(_evaluate_held_out(settings, plan, run, policy_user))


async def _eval_endpoint(settings: ArenaSettings, url: str, plan: _EvalPlan) -> EvalReport:
    """An endpoint: probed first, then message-level episodes through its gateway."""
    from environments.user_view import GatewayUserSimulator
    from trainer.endpoint_policy import open_endpoint_policy

    policy = await open_endpoint_policy(settings, url)

    def policy_user() -> UserSimulator:
        return GatewayUserSimulator(policy.gateway)

    def run(cases: list[EvalCase], tick: Callable[[], None]) -> Awaitable[EvalReport]:
        return evaluate_endpoint(
            policy,
            cases,
            k=plan.k,
            trials=plan.trials,
            max_turns=plan.max_turns,
            seed=plan.seed,
            concurrency=plan.concurrency,
            on_trial=tick,
        )

    try:
        return await _evaluate_held_out(settings, plan, run, policy_user)
    finally:
        await policy.aclose()


async def _evaluate_held_out(
    settings: ArenaSettings, plan: _EvalPlan, run: EvalRun, policy_user: Callable[[], UserSimulator]
) -> EvalReport:
    """Build the cases over a sandbox pool and run them under a progress bar on stderr.

    The user of interactive cases is ``policy_user()`` when ``plan.user`` is ``policy``, else the
    gateway the settings describe (closed afterwards).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from arena.llm.gateway import Gateway
    from environments.user_view import GatewayUserSimulator
    from lake.catalog import open_gateway
    from sandbox import SandboxPool

    pool = SandboxPool(settings.sandbox)
    await pool.start()
    gateway: Gateway | None = None
    try:
        cases = qa_cases(plan.heldout, pool)
        if plan.instances:
            simulator: UserSimulator
            if plan.user == "policy":
                simulator = policy_user()
            else:
                gateway = open_gateway(settings)
                simulator = GatewayUserSimulator(gateway)
            cases += interactive_cases(plan.instances, pool, simulator, behaviour=user_behaviour(settings))
        with Progress(
            TextColumn("eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),  # stdout may carry --json
            disable=not plan.progress,
        ) as bar:
            task = bar.add_task("trials", total=len(cases) * plan.trials)
            return await run(cases, lambda: bar.advance(task))
    finally:
        await pool.close()
        if gateway is not None:
            await gateway.aclose()


def _policy_user(
    backend: RolloutBackend, tokenizer: Any, settings: ArenaSettings, seed: int
) -> UserSimulator:
    """The evaluated policy as the user (its own backend, so its generation shares the agent's lock)."""
    from trainer.user_sim import PolicyUserSimulator

    cfg = settings.train
    return PolicyUserSimulator(
        backend,
        tokenizer,
        max_new_tokens=cfg.max_new_tokens,
        max_seq_len=cfg.max_seq_len,
        temperature=cfg.temperature,
        seed=seed,
    )


def load_backend(settings: ArenaSettings, model_path: str) -> tuple[RolloutBackend, Any]:
    """A local checkpoint's rollout backend (transformers, or vLLM per ``settings.train.backend``) and tokenizer."""
    from trainer.policy import (
        HfBackend,
        VllmBackend,
        load_policy,
        resolve_device,
        resolve_precision,
        stop_ids_of,
    )

    cfg = settings.train
    if cfg.backend == "vllm":
        from transformers import AutoTokenizer

        vllm_tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
        precision = resolve_precision(cfg.precision, "cuda")
        return VllmBackend.for_settings(model_path, vllm_tokenizer, precision, cfg), vllm_tokenizer
    device = resolve_device(settings.train.device)
    model, tokenizer = load_policy(model_path, device)
    model.eval()
    precision = resolve_precision(settings.train.precision, device)
    return HfBackend(model, tokenizer, stop_ids_of(tokenizer), precision=precision), tokenizer


# --- display -------------------------------------------------------------------------------------
def _cell(metric: Metric | None) -> str:
    if metric is None:
        return "-"
    return f"{metric.mean:.3f} [{metric.ci_low:.2f}, {metric.ci_high:.2f}]"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def report_table(report: EvalReport) -> Table:
    """Per-domain rows and an 'all' row: cases, trials, pass^1..pass^k, pass@k, mean F1 (95% CI),
    and the shares of failed calls and of calls with grounded arguments (``trainer.call_stats``)."""
    table = Table(title=f"held-out evaluation: n={report.trials} trials per case, k={report.k}")
    table.caption = escape(
        f"each cell: mean [95% CI low, high]; {report.ci_method}; failed: tool observations that report"
        " an error; grounded: calls whose argument values all occur earlier in the conversation"
    )
    for column in ("domain", "cases", "trials"):
        table.add_column(column, justify="left" if column == "domain" else "right")
    for j in range(1, report.k + 1):
        table.add_column(f"pass^{j}", justify="right")
    table.add_column(f"pass@{report.k}", justify="right")
    table.add_column("mean F1", justify="right")
    table.add_column("failed", justify="right")
    table.add_column("grounded", justify="right")
    for i, group in enumerate([*report.domains, report.overall]):
        table.add_row(
            group.name,
            str(group.cases),
            str(group.trials),
            *(_cell(group.pass_hat[j]) for j in range(1, report.k + 1)),
            _cell(group.pass_at_k),
            _cell(group.f1),
            _share(group.failed_call_share),
            _share(group.grounded_call_share),
            style="bold" if i == len(report.domains) else None,
            end_section=i == len(report.domains) - 1,
        )
    return table

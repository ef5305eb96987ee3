"""Episodes: a verified sample -> an isolated environment -> G rollouts -> one ``Group``.

For a ``qa`` sample the environment is its package from the catalog plus
irrelevant tools mixed in from other verified packages (each runs against its
own package, so every offered tool is executable); for an ``interactive``
sample it is the instance's state machine, and for a ``tau2`` sample the tau2
domain's own code in a session (``environments.tau2_environment``), each with
the user simulator in the loop: the gateway's ``user_simulator`` role, or the frozen SFT-tuned policy once
the service has set one (``use_user_simulator``). Each trajectory runs in its
own environment instance, which holds one sandbox session from its first
tool call until its rollout ends (``rollout`` closes it). All rollouts of a
round are one lockstep batch (one batched generate call per turn), cut into
chunks of ``sandbox.pool_size`` rollouts run one after another, so a batch never
waits on the pool for a session its own members hold.
Seeds derive from (global seed, step, round, sample, trajectory index), so a
step redone after a crash rolls out the same trajectories.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from arena.config import ArenaSettings
from arena.llm.roles.user_sim import user_behaviour
from arena.records.envs import EnvPackage, VerifiedSample
from arena.records.tools import tool_name
from environments.environment import Environment
from environments.factory import environment_for
from environments.tau2_environment import Tau2Environment, Tau2EnvSpec, load_spec_databases
from environments.user_view import GatewayUserSimulator, UserSimulator
from lake.env_packages import EnvPackageStore
from lake.store import ObjectStore, open_store
from sandbox import SandboxPool
from trainer.batching import Group
from trainer.learner import Learner
from trainer.mixing import ToolMixer, pool_from_store
from trainer.rollout import RolloutJob, Trajectory, derive_seed, group_of, rollout_batch
from trainer.rollout_log import rollout_line, tau2_rollout_line


class Episodes:
    """Runs group rollouts for the service; owns the sandbox pool, package store and tool mixer."""

    def __init__(self, settings: ArenaSettings, learner: Learner) -> None:
        self.settings = settings
        self.cfg = settings.train
        self.learner = learner
        self.store = EnvPackageStore(settings.catalog)
        self.pool: SandboxPool | None = None
        self._mixer: ToolMixer | None = None
        self._mixer_size = -1
        self._gateway: Any = None
        self._user: UserSimulator | None = None
        self._packages: dict[str, EnvPackage] = {}
        self._databases: dict[tuple[str, str | None], tuple[str, str | None]] = {}
        self._store: ObjectStore | None = None
        self.recorded: list[dict[str, Any]] = []
        """QA and tau2 trajectories rolled out since the last ``take_recorded`` (``trainer.rollout_log`` lines)."""

    async def start(self) -> None:
        self.pool = SandboxPool(self.settings.sandbox)
        await self.pool.start()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        if self._gateway is not None:
            await self._gateway.aclose()
        self.store.dispose()

    def _mixer_for_now(self) -> ToolMixer | None:
        """The mixer over the current pool (rebuilt when new verified packages have landed)."""
        if self.cfg.mixing == "none":
            return None
        size = self.store.count("train")
        if self._mixer is None or size != self._mixer_size:
            from lake.tool_index import lancedb_storage_options

            self._mixer = ToolMixer(
                pool_from_store(self.store),
                self.settings.lancedb,
                k_per_band=self.cfg.k_per_band,
                seed=self.settings.seed,
                storage_options=lancedb_storage_options(self.settings),
            )
            self._mixer_size = size
        return self._mixer

    def _gateway_for(self) -> Any:
        if self._gateway is None:
            from lake.catalog import open_gateway

            self._gateway = open_gateway(self.settings)
        return self._gateway

    def use_user_simulator(self, user: UserSimulator | None) -> None:
        """Interactive rollouts from now on talk to ``user`` (None: the gateway's role)."""
        self._user = user

    def user_simulator(self) -> UserSimulator:
        """The user of interactive rollouts: the one set, else the gateway's role (gateway made on first use)."""
        if self._user is None:
            self._user = GatewayUserSimulator(self._gateway_for())
        return self._user

    def _package(self, env_id: str) -> EnvPackage | None:
        """A verified package by id, read from the catalog once (packages are immutable: content-hashed)."""
        if env_id not in self._packages:
            found = self.store.get(env_id)
            if found is None:
                return None
            self._packages[env_id] = found[0]
        return self._packages[env_id]

    def _tau2_databases(self, sample: VerifiedSample) -> tuple[str, str | None] | str:
        """The databases a tau2 sample runs on, read from the lake once per content hash."""
        try:
            spec = Tau2EnvSpec.model_validate(sample.reward_spec)
        except ValidationError as exc:
            return f"tau2 sample {sample.sample_id}: its reward_spec is not a Tau2EnvSpec ({exc.error_count()} errors)"
        key = (spec.db.sha256, spec.user_db.sha256 if spec.user_db else None)
        if key not in self._databases:
            if self._store is None:
                self._store = open_store(self.settings)
            try:
                self._databases[key] = load_spec_databases(self._store, spec)
            except (KeyError, FileNotFoundError, ValueError) as exc:
                return f"tau2 databases of {sample.env_ref} are not in the lake: {exc}"
        return self._databases[key]

    def _prepare(self, sample: VerifiedSample, mixer: ToolMixer | None) -> dict[str, Any] | str:
        """Keyword arguments for ``environment_for``, or why the sample cannot be rolled out."""
        if sample.kind == "bfcl":  # benchmark items stay apart from training data
            return "a bfcl sample is a benchmark item: it is evaluated, never trained on"
        if sample.kind == "interactive":
            return {"user": self.user_simulator(), "behaviour": user_behaviour(self.settings)}
        if sample.kind == "tau2":
            databases = self._tau2_databases(sample)
            if isinstance(databases, str):
                return databases
            return {
                "user": self.user_simulator(),
                "behaviour": user_behaviour(self.settings),
                "tau2_databases": databases,
            }
        package = self._package(sample.env_ref)
        if package is None:
            return f"package {sample.env_ref} is not in the catalog"
        if mixer is None:
            return {"package": package}
        mixed = mixer.mix(sample.tools, sample.domain, self.cfg.mixing, rng_key=sample.sample_id)
        extras: dict[str, EnvPackage] = {}
        for tool in mixed.mixed:
            other = self._package(tool.env_id)
            if other is not None:
                extras[tool.name] = other
        own = {tool_name(t) for t in sample.tools}
        tools = [t for t in mixed.tools if tool_name(t) in extras or tool_name(t) in own]
        return {"package": package, "extras": extras, "tools": tools}

    async def groups(
        self, samples: list[VerifiedSample], *, step: int, round_: int, behaviour_step: int | None = None
    ) -> tuple[list[Group], dict[str, str]]:
        """One group of G trajectories per usable sample, and why the others were skipped.

        ``behaviour_step``: the training step whose weights the rollout backend holds (recorded on
        each group, for the update's staleness figures; default: the step before ``step``).

        Every rollout of the round -- G per sample, all samples -- is one lockstep batch
        (``rollout_batch``): each turn of all of them is one batched generate call.
        """
        assert self.pool is not None
        pool, cfg = self.pool, self.cfg
        skipped: dict[str, str] = {}
        prepared: list[tuple[VerifiedSample, dict[str, Any]]] = []
        mixer = await asyncio.to_thread(self._mixer_for_now)  # once per round: new packages join the pool
        for sample in samples:
            kwargs = await asyncio.to_thread(self._prepare, sample, mixer)
            if isinstance(kwargs, str):
                skipped[sample.sample_id] = kwargs
            else:
                prepared.append((sample, kwargs))
        made: dict[int, Environment] = {}  # job index -> its environment (a tau2 one records its trajectory)
        jobs = [
            RolloutJob(
                sample,
                _env_factory(sample, pool, cfg.reward, kwargs, made, k * cfg.group_size + i),
                derive_seed(
                    derive_seed(self.settings.seed, "step", step, round_, sample.sample_id), "group", i
                ),
            )
            for k, (sample, kwargs) in enumerate(prepared)
            for i in range(cfg.group_size)
        ]
        trajectories = await rollout_batch(
            self.learner.backend,
            self.learner.tokenizer,
            jobs,
            seed=derive_seed(self.settings.seed, "step", step, round_),
            max_turns=cfg.max_turns,
            max_seq_len=cfg.max_seq_len,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            chunk=self.settings.sandbox.pool_size,  # one session per rollout: a batch never waits on the pool
        )
        groups = []
        for k, (sample, kwargs) in enumerate(prepared):
            mine = trajectories[k * cfg.group_size : (k + 1) * cfg.group_size]
            envs = [made[j] for j in range(k * cfg.group_size, (k + 1) * cfg.group_size)]
            self._record(sample, kwargs, mine, envs, step=step, round_=round_)
            behaviour = step - 1 if behaviour_step is None else behaviour_step
            groups.append(group_of(sample.sample_id, mine, born_step=step, behaviour_step=behaviour))
        return groups, skipped

    def _record(
        self,
        sample: VerifiedSample,
        env_kwargs: dict[str, Any],
        trajectories: list[Trajectory],
        envs: list[Environment],
        *,
        step: int,
        round_: int,
    ) -> None:
        """Keep a QA group's trajectories as ``arena reward score`` lines, a tau2 group's as
        ``arena reward tau2`` lines (``take_recorded``)."""
        if sample.kind == "tau2":
            self.recorded += [
                tau2_rollout_line(t, env.rollout(), step=step, round_=round_, index=i)
                for i, (t, env) in enumerate(zip(trajectories, envs, strict=True))
                if isinstance(env, Tau2Environment)
            ]
            return
        if sample.kind != "qa":
            return
        package = env_kwargs["package"]
        own = {tool_name(t) for t in package.tools}  # as QaEnvironment tells mixed-in tools
        mixed = [name for name in env_kwargs.get("extras") or {} if name not in own]
        self.recorded += [
            rollout_line(sample, t, mixed_tools=mixed, step=step, round_=round_, index=i)
            for i, t in enumerate(trajectories)
        ]

    def take_recorded(self) -> list[dict[str, Any]]:
        """The recorded QA and tau2 trajectories since the last call, in rollout order (then forgotten)."""
        taken, self.recorded = self.recorded, []
        return taken


def _env_factory(
    sample: VerifiedSample,
    pool: SandboxPool,
    reward: Any,
    env_kwargs: dict[str, Any],
    made: dict[int, Environment],
    index: int,
) -> Callable[[], Environment]:
    """A fresh environment per rollout (``environment_for`` with the sample's prepared package),
    kept in ``made[index]`` for what it recorded."""

    def make() -> Environment:
        made[index] = environment_for(sample, pool, mode=reward, **env_kwargs)
        return made[index]

    return make

"""``environment_for``: a fresh environment instance for a verified sample, whatever its kind.

- ``qa``: ``QaEnvironment`` over its package (and mixed-in tools), ``environments.environment``;
- ``interactive``: ``InteractiveEnvironment`` over a pack instance's spec, same module;
- ``tau2``: ``Tau2Environment``, the tau2 domain's own code in a session
  (``environments.tau2_environment``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from arena.llm.core import Sampling
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import UserBehaviour
from arena.records.envs import EnvPackage, VerifiedSample
from environments.environment import InteractiveEnvironment, QaEnvironment
from environments.rewards import RewardMode
from environments.tau2_environment import Tau2Environment
from environments.user_view import GatewayUserSimulator, UserSimulator
from sandbox.env_runtime import Runner


def environment_for(
    sample: VerifiedSample,
    runner: Runner,
    *,
    package: EnvPackage | None = None,
    extras: Mapping[str, EnvPackage] | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
    gateway: Gateway | None = None,
    user: UserSimulator | None = None,
    mode: RewardMode = "f1",
    sampling: Sampling | None = None,
    timeout_s: float | None = None,
    behaviour: UserBehaviour | None = None,
    tau2_databases: tuple[str, str | None] | None = None,
) -> QaEnvironment | InteractiveEnvironment | Tau2Environment:
    """A fresh environment instance for ``sample`` (qa: needs its package; interactive and tau2: a
    user simulator, or a gateway whose ``user_simulator`` role plays the user, ``user`` winning;
    tau2: also the databases its spec names, ``environments.tau2_environment.load_spec_databases``)."""
    if sample.kind == "bfcl":
        raise ValueError(
            f"bfcl sample {sample.sample_id}: a BFCL item runs in trainer.benchmarks.bfcl_env.BfclEnvironment "
            "(arena eval --bench bfcl), never as training data"
        )
    if sample.kind == "qa":
        if package is None:
            raise ValueError(f"qa sample {sample.sample_id} needs its EnvPackage ({sample.env_ref})")
        return QaEnvironment(sample, package, runner, extras, tools=tools, mode=mode, timeout_s=timeout_s)
    simulator = user if user is not None else gateway
    if simulator is None:
        raise ValueError(
            f"{sample.kind} sample {sample.sample_id} needs a user simulator (or an LLM gateway) for its user"
        )
    if sample.kind == "tau2":
        if tau2_databases is None:
            raise ValueError(f"tau2 sample {sample.sample_id} needs its databases ({sample.env_ref})")
        if isinstance(simulator, Gateway):
            simulator = GatewayUserSimulator(simulator, sampling)
        return Tau2Environment(sample, runner, simulator, tau2_databases, behaviour=behaviour)
    return InteractiveEnvironment(
        sample, runner, simulator, sampling=sampling, timeout_s=timeout_s, behaviour=behaviour
    )

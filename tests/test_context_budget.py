"""Environment-track prompts fit a 4096-token context window on the demo knowledge bases.

Every role call of the real stage functions (QA synthesis -> quality -> environment synthesis in
the sandbox -> merging) is measured as it is sent (``role.messages`` with ``prompt_tokens``) and
must fit ``budget_for(settings, role)``; knowledge that had to be cut is recorded on the records.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from arena.config import ArenaSettings, SandboxSettings
from arena.llm.budget import prompt_tokens
from arena.llm.core import Answer, InvalidOutput, Role
from arena.llm.gateway import Gateway
from arena.llm.routing import budget_for
from arena.records.envs import EnvPackage, QaTrace
from producers.builtin_knowledge import BUILTIN_DOMAINS, PROSE_DOMAINS, builtin_knowledge
from producers.knowledge import unconditional_seed
from sandbox import SandboxPool
from simulator.backend import RulesBackend
from synthesis.envs.env_synthesis import synthesize_package
from synthesis.envs.merging import merge_package
from synthesis.envs.qa_synthesis import synthesis_inputs, synthesize
from synthesis.envs.quality import validate
from synthesis.envs.roles.envs import HOMOGENEOUS_GROUPS
from synthesis.envs.roles.qa import QA_SYNTHESIS

pytestmark = pytest.mark.timeout(120)


class Measuring:
    """A gateway that records the largest prompt sent per role (and delegates the call)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.largest: dict[str, int] = {}

    async def call(self, role: Role[Any, Any], inputs: Any) -> Answer[Any]:
        tokens = prompt_tokens(role.messages(inputs))
        self.largest[role.name] = max(tokens, self.largest.get(role.name, 0))
        return await self.gw.call(role, inputs)


async def run_track(
    settings: ArenaSettings, domain: str
) -> tuple[Measuring, list[QaTrace], list[EnvPackage]]:
    seed = unconditional_seed(builtin_knowledge(domain, 0), hop_budget=2, count=4)
    gw = Measuring(Gateway(RulesBackend(seed=0), max_attempts=2))
    real = cast(Gateway, gw)
    traces: list[QaTrace] = []
    packages: list[EnvPackage] = []
    async with SandboxPool(SandboxSettings.model_validate({"pool_size": 4, "timeout_s": 5.0})) as pool:
        for outcome in await synthesize(seed, real, settings):
            if isinstance(outcome, InvalidOutput):
                continue
            verdict = await validate(outcome[0], real, settings)
            traces.append(verdict.trace)
            if not verdict.keep:
                continue
            built = await synthesize_package(verdict.trace, real, pool, settings)
            if built.package is not None:
                budget = budget_for(settings, HOMOGENEOUS_GROUPS.name)
                packages.append((await merge_package(built.package, real, pool, budget=budget)).package)
    return gw, traces, packages


@pytest.mark.parametrize("domain", [*BUILTIN_DOMAINS, *PROSE_DOMAINS])
def test_every_env_track_prompt_fits_4096_tokens(domain: str) -> None:
    settings = ArenaSettings.model_validate({"llm_context_tokens": 4096})
    whole = prompt_tokens(
        QA_SYNTHESIS.messages(synthesis_inputs(unconditional_seed(builtin_knowledge(domain, 0)), 0, 0))
    )
    gw, traces, packages = asyncio.run(run_track(settings, domain))
    assert traces and packages, "the track still yields environments at 4096 tokens"
    for role, tokens in gw.largest.items():
        assert tokens <= budget_for(settings, role).prompt_tokens, (role, tokens)
    limit = budget_for(settings, QA_SYNTHESIS.name).prompt_tokens
    if whole > limit:  # the whole knowledge base does not fit: every trace records its cut
        for trace in traces:
            cut = next(c for c in trace.context_cut if c.role == QA_SYNTHESIS.name)
            assert cut.rows_cut + cut.passages_cut > 0 and cut.prompt_tokens <= cut.budget_tokens == limit


def test_default_budget_cuts_nothing_on_the_demo() -> None:
    settings = ArenaSettings.model_validate({})
    _, traces, packages = asyncio.run(run_track(settings, "real_estate"))
    assert traces and all(t.context_cut == [] for t in traces)
    assert packages and all(p.context_cut == [] for p in packages)

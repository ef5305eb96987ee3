"""Publishing QA seeds to ``qa.seeds``: knowledge sources (unconditional) or main questions."""

from __future__ import annotations

from collections.abc import Iterable

from arena.records.envs import QaSeed
from producers.publish import publish
from streams.runtime import Emit


def seed_emits(seeds: Iterable[QaSeed]) -> list[Emit]:
    """One record per seed, keyed by its content hash (re-publishing is idempotent downstream)."""
    return [Emit("qa.seeds", seed.seed_id, seed) for seed in seeds]


async def publish_seeds(bootstrap: str, seeds: Iterable[QaSeed]) -> int:
    return await publish(bootstrap, seed_emits(seeds))

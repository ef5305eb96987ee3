"""`bench/llm_concurrency.py`: every role and stage is counted for a track.

Its `--quick` run (the SFT track on two sample tool docs, at latency 0 and 0.05 s, against `arena
llm serve` through `openai://`) and the checks on its JSON are in `tests/test_bench_quick.py`,
with every other bench's.
"""

from __future__ import annotations

from app.registry import WORKERS
from arena.llm.roles.registry import roles
from bench.llm_concurrency import ALSO_CALLED_BY, OFF_STREAM, ROLE_STAGE, TRACKS


def test_every_role_and_stage_belongs_to_a_track() -> None:
    stages = {s for track in TRACKS.values() for s in track.stages}
    assert stages <= set(WORKERS)
    assert set(roles()) <= set(ROLE_STAGE) | set(OFF_STREAM), "map a new role to the stage that calls it"
    assert not set(ROLE_STAGE) & set(OFF_STREAM)
    assert set(ROLE_STAGE.values()) <= stages
    assert {s for also in ALSO_CALLED_BY.values() for s in also} <= stages

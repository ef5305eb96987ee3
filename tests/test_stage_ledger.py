"""After `arena demo`, every stage accounts for every input record, and its counts are the topics'.

`arena stages --json` sums the `stages.ledger` entries; these checks count the topics themselves
(read_committed) and compare, so a ledger that miscounted or a stage that skipped would fail here.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from app.registry import CLIENTS, STAGES
from arena.topics import topic
from tests.cli import read_all, run_arena
from tests.fixtures.demo import Demo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1500)]


def test_every_stage_balances_after_the_demo_and_its_outputs_are_the_topics(demo_run: Demo) -> None:
    ledgers = {row["stage"]: row for row in json.loads(run_arena(["stages", "--json"], demo_run.env).stdout)}
    assert set(ledgers) == {stage.name for stage in STAGES}
    for name, ledger in ledgers.items():
        assert ledger["balanced"] and ledger["in_flight"] == 0, ledger
        assert ledger["in"] == ledger["produced"] + ledger["rejected"] + ledger["dead_lettered"], ledger
        assert sum(ledger["rejected_by_gate"].values()) == ledger["rejected"], ledger
        assert sum(ledger["dead_lettered_by_kind"].values()) == ledger["dead_lettered"], ledger
        # Stages say why they dropped a record; the runtime's catch-all is for stages that forget.
        assert "no_output" not in ledger["rejected_by_gate"], (name, ledger)
    # Both tracks ran: every SFT and environment stage handled something.
    for name in ("tools-servers", "chains", "trajectories", "samples-sft", "qa-traces", "samples-verified"):
        assert ledgers[name]["in"] > 0 and ledgers[name]["produced"] > 0, ledgers[name]

    # Each output topic holds exactly the records the ledgers say its writers emitted: the records
    # whose lineage names a stage (a test sharing this home may publish a record of its own, e.g.
    # tests/test_eigen_stages.py's unrepairable intent).
    emitted: Counter[str] = Counter()
    for ledger in ledgers.values():
        emitted.update(ledger["outputs_by_topic"])
    published = {name for client in CLIENTS for name in client.writes}  # e.g. pilot metrics
    names = {stage.name.encode() for stage in STAGES}
    for name in sorted({out for stage in STAGES for out in stage.outputs} - published):
        if topic(name).side_of is None:
            by_stages = [
                r for r in read_all(demo_run.bootstrap, name) if dict(r.headers).get("arena-stage") in names
            ]
            assert len(by_stages) == emitted[name], name
    # ... and each input topic the records the ledger counted in.
    for stage in STAGES:
        assert len(read_all(demo_run.bootstrap, stage.input)) == ledgers[stage.name]["in"], stage.name

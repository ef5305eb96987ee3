"""`arena trace` on the shared demo run: every hop of a sample's lineage, and where it came from.

The demo's lineage edges are the ones the stages and the lake sink recorded, so these tests catch a
stage that keys an output like its input (the edge then points at itself and the hop between them
disappears from every trace) and a source shown only as a hash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from arena.config import ArenaSettings
from lake.catalog import Catalog
from lake.trace import KEY_QUERY
from tests.cli import lake_json, run_arena
from tests.fixtures.demo import Demo

pytestmark = pytest.mark.integration

SFT_PATH = ["samples.sft", "trajectories.scored", "trajectories", "tasks", "tools.servers", "tools.raw"]
"""A sample's hops up to its tool doc (tasks-from-servers); tasks-from-chains adds ``chains``."""


def _path_up(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The nodes from the traced record up to its source, following each node's (one) parent."""
    parent = {e["child"]: e["parent"] for e in report["ancestors"]}
    nodes, key = [], report["record"]["id"]
    while key is not None:
        nodes.append(report["nodes"][key])
        key = parent.get(key)
    return nodes


def test_trace_of_a_sample_shows_every_hop_and_its_tool_doc(demo_run: Demo) -> None:
    assert lake_json(KEY_QUERY, demo_run.env)  # the query the error hint names works
    (row,) = lake_json(
        "select _key from samples_sft where source = 'astra' order by _key limit 1", demo_run.env
    )
    key = row["_key"]
    report = json.loads(run_arena(["trace", key[:12], "--json"], demo_run.env).stdout)

    assert not [e for e in report["ancestors"] if e["parent"] == e["child"]]
    path = _path_up(report)
    topics = [n["topic"] for n in path]
    assert topics in (SFT_PATH, [*SFT_PATH[:4], "chains", *SFT_PATH[4:]]), topics
    stages = {e["child"]: e["stage"] for e in report["ancestors"]}
    assert [stages.get(n["id"]) for n in path[:3]] == ["samples-sft", "trajectories-scored", "trajectories"]

    raw, server = path[-1], path[-2]
    # A sample whose content another tool doc also produced (a test of this group republishes the
    # docs) has one source per doc: the path followed here ends at one of them.
    assert raw["kind"] == "source" and raw["id"] in report["sources"]
    assert all(report["nodes"][s]["kind"] == "source" for s in report["sources"])
    (doc,) = lake_json(f"select source, server from tools_raw where _key = '{raw['id']}'", demo_run.env)
    assert (raw["file"], raw["server"]) == (doc["source"], doc["server"]) and doc["source"] and doc["server"]
    assert (server["file"], server["server"]) == (doc["source"], doc["server"])  # the server it formed

    tree = run_arena(["trace", key], demo_run.env).stdout
    assert f"server {doc['server']}, file {doc['source']}" in tree
    for name in SFT_PATH:
        assert name in tree


def test_every_lineage_edge_joins_two_records(demo_run: Demo) -> None:
    """Over both tracks: no edge from a key to itself, and no key recorded in two topics."""
    catalog = Catalog(ArenaSettings(home=Path(demo_run.home)).catalog)
    try:
        with catalog.engine.connect() as con:
            selfs = con.execute(
                text(
                    "select child_topic, stage, count(*) from lineage_edges where child_key = parent_key group by 1, 2"
                )
            ).all()
            shared = con.execute(
                text(
                    "select child_key from lineage_edges group by child_key having count(distinct child_topic) > 1"
                )
            ).all()
            edges = con.execute(text("select count(*) from lineage_edges")).scalar_one()
    finally:
        catalog.dispose()
    assert edges > 0
    assert selfs == [] and shared == [], (selfs, shared[:5])

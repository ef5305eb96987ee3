"""A drained run reads lag 0 everywhere: `arena lag`, /metrics, the dashboard's API and its page.

The shared demo home (tests/fixtures/demo.py) is drained: every stage committed past its last data
record, and the commit markers of its inputs' transactions lie behind those commits, so the raw
offset distance stays above 0 (it once showed as lag 4-12 on every SFT edge). A group that never
ran (the trainer's: the demo trains nothing) reads idle, not lagging, and a topic box counts the
data records the lake holds, not end offsets.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from starlette.testclient import TestClient

from app.metrics_http import LagCollector, serve
from app.registry import STAGES
from app.ui import create_app
from arena.config import ArenaSettings
from tests.cli import arena_env, lake_json, run_arena
from tests.fixtures.demo import Demo
from tests.test_metrics import scrape
from tests.test_ui_browser import browser_page, check_graph_geometry, chromium_path, running_ui

pytestmark = pytest.mark.integration

RAN = {"arena-tools-servers", "arena-chains", "arena-samples-sft", "arena-qa-traces", "arena-eigen-verified"}
TRAINER_EDGES = {"trainer:samples.sft->trainer.metrics", "trainer:samples.verified->trainer.metrics"}


def test_arena_lag_and_metrics_read_zero_on_a_drained_run(demo_run: Demo) -> None:
    rows = json.loads(run_arena(["lag", "--json"], demo_run.env).stdout)
    ran = [r for r in rows if not r["idle"]]
    assert RAN <= {r["group"] for r in ran}
    assert [r for r in ran if r["lag"] or r["pending"] or r["pending_capped"]] == []
    assert sum(r["offset_lag"] for r in ran) > 0  # markers lie behind the commits: the old LAG was not 0
    table = run_arena(["lag"], demo_run.env).stdout
    assert "LAG = PENDING: data records" in table

    server = None
    try:
        registry = CollectorRegistry()
        registry.register(LagCollector.for_broker(demo_run.bootstrap, cache_s=0))
        server = serve(registry, "127.0.0.1", 0)
        samples = scrape(server.port)
    finally:
        if server is not None:
            server.stop()
    lag = {labels: v for (name, labels), v in samples.items() if name == "arena_consumer_group_lag"}
    pending = {labels: v for (name, labels), v in samples.items() if name == "arena_consumer_group_pending"}
    assert len(lag) == len(pending) == len(ran) and set(lag.values()) == set(pending.values()) == {0.0}


def test_the_dashboard_reads_zero_and_the_trainer_idle_on_a_drained_run(
    demo_run: Demo, tmp_path: Path
) -> None:
    cfg = ArenaSettings(home=demo_run.home, broker=demo_run.bootstrap)
    with TestClient(create_app(cfg, demo_run.bootstrap)) as client:
        view = client.get("/api/graph").json()
    edges = {e["id"]: e for e in view["edges"]}
    nodes = {n["id"]: n for n in view["nodes"]}
    # the trainer never ran: idle, with the samples that wait for it; every other edge reads 0
    assert all(edges[e]["idle"] and edges[e]["lag"] > 0 for e in TRAINER_EDGES)
    assert [
        e for i, e in edges.items() if i not in TRAINER_EDGES and (e["lag"], e["pending"]) != (0, 0)
    ] == []
    assert [g for g in view["groups"] if not g["idle"] and (g["lag"], g["pending"]) != (0, 0)] == []
    assert not any(edges[e]["idle"] for e in edges if edges[e]["group"] in RAN)
    assert nodes["trainer.metrics"]["idle"] is True
    # samples.sft: its data records are the lake's rows; its end offsets count the markers too
    (lake,) = lake_json("select count(*) as n from samples_sft", demo_run.env)
    sft = nodes["samples.sft"]
    assert (sft["records"], sft["records_complete"]) == (lake["n"], True) and sft["end"] > sft["records"] > 0

    # The page on the same home: every label of an edge that ran says lag 0, the graph fits.
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is a dev extra")
    chromium_path()  # skips before the dashboard starts when there is no Chromium
    with (
        running_ui(arena_env(demo_run.home), tmp_path / "ui.log") as url,
        browser_page(sync_api, viewport={"width": 1400, "height": 900}) as (page, _errors),
    ):
        page.goto(url)
        labels = page.locator('#graph-svg [data-testid="edge-label"]')
        sync_api.expect(labels).to_have_count(len(edges), timeout=30_000)
        for width in (1400, 1000):
            check_graph_geometry(page, width, tmp_path)
        texts = dict(labels.evaluate_all("ls => ls.map((l) => [l.dataset.edge, l.textContent])"))
        assert all(texts[e] == "idle" for e in TRAINER_EDGES)
        others = {e: t for e, t in texts.items() if e not in TRAINER_EDGES}
        assert [t for t in others.values() if not re.match(r"(lag 0 · |idle$)", t)] == [], others
        # The stage ledger: a row per stage, every one balanced, nothing in flight, none flagged.
        rows = page.locator('[data-testid="stage-row"]')
        sync_api.expect(rows).to_have_count(len(STAGES), timeout=30_000)
        cells = rows.evaluate_all(
            "rs => rs.map((r) => [r.dataset.stage, r.className,"
            " r.querySelector('[data-col=\"balanced\"]').textContent,"
            " r.querySelector('[data-col=\"in-flight\"]').textContent])"
        )
        assert [c for c in cells if c[1:] != ["", "yes", "0"]] == [], cells
        assert page.locator('[data-testid="stages-note"]').text_content() == ""

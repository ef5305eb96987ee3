"""`arena ui` in a real headless Chromium (Playwright), against the session's real broker and a lake.

`arena ui` runs as a subprocess (the CLI as a user starts it) on a free loopback port; the page is
driven like a user would: the stage graph fits a 1400 px window (and a 1000 px one) with no two
edge labels overlapping, a topic box counts data records (not transaction markers), the trainer's
box says idle while no trainer ran, the lag of a paused consumer group grows on screen as records
arrive, a query typed in the query box returns rows, a write without the start's token is refused, a nav
link scrolls a section's title into view below the sticky header, and training metrics become a
curve. The dead letters ticked are replayed with one button, and a letter's own button replays it
again (each lands on its source topic, and the result shows beside the button clicked).

Chromium is Debian's (`scripts/test.sh` installs it); Playwright's own browser download is not
used. The test is skipped only when no Chromium or no Playwright is installed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka import KafkaProducer, TopicPartition

from app.registry import STAGES
from arena.config import ArenaSettings
from arena.records.trainer import TrainerMetrics
from consumers.ledger import stage_ledgers
from tests.cli import ARENA, arena_env, end_offsets, read_all
from tests.test_ui_api import (
    DLQ_SOURCE,
    commit,
    produce,
    produce_dead_letter,
    record_versions,
    replayed_values,
    version_spec,
    write_chains,
    write_version_lake,
)

pytestmark = pytest.mark.integration

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 20_000


def chromium_path() -> str:
    path = os.environ.get("ARENA_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).is_file():
        pytest.skip(f"no Chromium at {path} (scripts/test.sh installs Debian's `chromium`)")
    return path


@contextmanager
def browser_page(sync_api: Any, **page_args: Any) -> Iterator[tuple[Any, list[str]]]:
    """A page of headless Chromium (``chromium_path``) and the uncaught page errors it collects."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(**page_args)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page, errors
        finally:
            browser.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_ui(env: dict[str, str], log_path: Path) -> Iterator[str]:
    """`arena ui` as a user starts it, on a free loopback port, for ``env``'s home; its URL."""
    port = _free_port()
    log = log_path.open("w")
    proc = subprocess.Popen(
        [ARENA, "ui", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"arena ui exited {proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"arena ui did not answer in 120 s:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.fixture
def ui(broker: str, tmp_path: Path) -> Iterator[tuple[str, ArenaSettings]]:
    """`arena ui` on a free port for a fresh ARENA_HOME on the session broker; its URL and settings.

    The trainer's group is one no other test commits under, so no trainer ever ran for this dashboard.
    """
    home = tmp_path / "home"
    trainer_group = f"trainer-{uuid.uuid4().hex[:8]}"
    cfg = ArenaSettings(home=home, broker=broker, train={"group_id": trainer_group})
    env = arena_env(home, ARENA_BROKER=broker, ARENA_TRAIN__GROUP_ID=trainer_group)
    with running_ui(env, tmp_path / "ui.log") as url:
        yield url, cfg


# Every pair of edge labels whose boxes intersect, and the graph's and the page's widths.
GEOMETRY_JS = """() => {
  const boxes = [...document.querySelectorAll('#graph-svg [data-testid="edge-label"]')].map((t) => {
    const r = t.getBoundingClientRect();
    return { id: t.dataset.edge, text: t.textContent, x: r.left, y: r.top, w: r.width, h: r.height };
  });
  const overlapping = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h) overlapping.push([a, b]);
  }
  return {
    labels: boxes.length, overlapping,
    graph: document.getElementById("graph-svg").getBoundingClientRect().width,
    page: document.documentElement.scrollWidth, window: window.innerWidth,
  };
}"""


def check_graph_geometry(page: Any, width: int, shots: Path) -> None:
    """At ``width`` px: the graph and the page fit the window, and no two edge labels overlap."""
    page.set_viewport_size({"width": width, "height": 900})
    page.wait_for_timeout(1500)  # a resize redraws at once; one more poll redraws with fresh data
    page.screenshot(path=str(shots / f"graph-{width}.png"), full_page=True)
    geometry = page.evaluate(GEOMETRY_JS)
    assert geometry["labels"] >= 20, geometry  # every registry edge has its label
    assert geometry["overlapping"] == [], geometry["overlapping"]
    assert geometry["graph"] <= geometry["window"] and geometry["page"] <= geometry["window"], geometry


def test_dashboard_in_a_real_browser(
    ui: tuple[str, ArenaSettings],
    broker: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    tmp_path: Path,
) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is a dev extra: pip install -e .[dev]"
    )
    chromium_path()  # skips before any set-up when there is no Chromium
    log, shots = tmp_path / "ui.log", tmp_path
    url, cfg = ui
    counted = "eigen.pilot.metrics"  # a registry topic no worker of this test reads
    txn = KafkaProducer(bootstrap_servers=broker, transactional_id=unique_name("ui-txn"))
    txn.init_transactions()
    for n in (3, 2):  # two transactions: two commit markers among the data records
        txn.begin_transaction()
        for i in range(n):
            txn.send(counted, f"x-{i}".encode())
        txn.commit_transaction()
    txn.close()
    records = len(read_all(broker, counted))
    assert sum(end_offsets(broker, counted).values()) >= records + 2
    topic, group = new_topic(partitions=1), unique_name("paused")
    produce(broker, topic, 3)
    commit(broker, group, {TopicPartition(topic, 0): 3})  # caught up, then stopped consuming
    write_chains(cfg, 3)
    reason = uuid.uuid4().hex
    run = f"ui-{reason[:8]}"

    expect = sync_api.expect
    with browser_page(sync_api) as (page, errors):
        page.on(
            "console",
            lambda msg: (
                errors.append(msg.text)
                if msg.type == "error" and not msg.text.startswith("Failed to load resource")
                else None
            ),
        )
        # Every request succeeds but the refused query below (answered 400 on purpose).
        page.on(
            "response",
            lambda resp: (
                errors.append(f"{resp.status} {resp.url}")
                if resp.status >= 400 and not resp.url.endswith("/api/lake/query")
                else None
            ),
        )
        page.set_viewport_size({"width": 1400, "height": 900})
        page.goto(url)
        expect(page).to_have_title("Arena dashboard")

        # The stage graph: registry edges drawn, inside the window, labels apart; records are data
        # records; the trainer's box and edges say idle.
        expect(page.locator('#graph-svg [data-edge="chains:tools.servers->chains"]').first).to_be_visible(
            timeout=WAIT_MS
        )
        sub = page.locator(f'#graph-svg [data-node="{counted}"] [data-testid="node-sub"]')
        expect(sub).to_have_text(re.compile(rf"(^|· ){records} records"), timeout=WAIT_MS)
        trainer = page.locator('#graph-svg [data-node="trainer.metrics"] [data-testid="node-sub"]')
        expect(trainer).to_contain_text("idle", timeout=WAIT_MS)
        expect(
            page.locator('#graph-svg text[data-edge="trainer:samples.sft->trainer.metrics"]')
        ).to_have_text("idle")
        expect(
            page.locator('tr[data-edge="trainer:samples.sft->trainer.metrics"] td[data-col="lag"]')
        ).to_have_text("idle")
        for width in (1400, 1000):
            check_graph_geometry(page, width, shots)
        page.set_viewport_size({"width": 1400, "height": 900})
        lag = page.locator(f'tr[data-group="{group}"][data-topic="{topic}"] td[data-col="lag"]')
        expect(lag).to_have_text("0", timeout=WAIT_MS)
        produce(broker, topic, 5)
        expect(lag).to_have_text("5", timeout=WAIT_MS)
        produce(broker, topic, 7)
        expect(lag).to_have_text("12", timeout=WAIT_MS)

        # The stage ledger: one row per stage; a row is flagged exactly when its stage does not
        # balance (the session broker carries other tests' records, so both may show up).
        stage_rows = page.locator('[data-testid="stage-row"]')
        expect(stage_rows).to_have_count(len(STAGES), timeout=WAIT_MS)
        shown = dict(
            stage_rows.evaluate_all(
                "rs => rs.map((r) => [r.dataset.stage,"
                " [r.className, r.querySelector('[data-col=\"balanced\"]').textContent]])"
            )
        )
        for ledger in stage_ledgers(broker, {stage.name: stage.input for stage in STAGES}):
            flag, verdict = shown[ledger.stage]
            if ledger.balanced:
                assert flag != "unbalanced" and not verdict.startswith("NO"), (ledger, flag, verdict)
            else:
                assert flag == "unbalanced" and verdict.startswith("NO: "), (ledger, flag, verdict)

        # The lake browser: the table's row count, then a query typed in the box returns rows.
        expect(page.locator('tr[data-view="chains"] td[data-col="rows"]')).to_have_text("3", timeout=WAIT_MS)
        page.fill("#sql", "select chain_id, origin from chains order by chain_id")
        page.click("#run-query")
        rows = page.locator('#query-result tr[data-testid="result-row"]')
        expect(rows).to_have_count(3, timeout=WAIT_MS)
        expect(rows.first.locator("td").first).to_have_text("chain-0")
        expect(page.locator("#query-result thead th")).to_have_text(["chain_id", "origin"])
        page.fill("#sql", "drop table chains")
        page.click("#run-query")
        expect(page.locator("#query-error")).to_contain_text("only read-only queries", timeout=WAIT_MS)

        # The page's buttons send the token `arena ui` printed; a request without it is refused.
        token = page.locator('meta[name="arena-token"]').get_attribute("content") or ""
        assert len(token) >= 16 and f"write token of this start: {token}" in log.read_text()
        status = page.evaluate(
            """(sql) => fetch("/api/lake/query", {method: "POST", headers: {"Content-Type": "application/json"},
               body: JSON.stringify({sql})}).then((r) => r.status)""",
            "select 1",
        )
        assert status == 403

        # The sticky header leaves a section's title visible when its nav link scrolls to it.
        for section in ("stages", "dlq", "lake", "training", "trace"):
            page.click(f'header nav a[href="#{section}"]')
            page.wait_for_timeout(300)
            header = page.locator("header").bounding_box()
            title = page.locator(f"#{section} h2").bounding_box()
            assert header and title and title["y"] >= header["y"] + header["height"], (
                section,
                header,
                title,
            )

        # Training curves: published steps become a line in the loss chart.
        producer = KafkaProducer(bootstrap_servers=broker)
        try:
            for step in range(1, 6):
                value = TrainerMetrics(
                    run_id=run, step=step, metrics={"loss": 2.0 / step, "reward_mean": 0.1 * step}
                )
                producer.send("trainer.metrics", value.model_dump_json().encode())
            producer.flush()
        finally:
            producer.close()
        line = page.locator(f'[data-metric="loss"] polyline[data-run="{run}"]')
        expect(line).to_have_count(1, timeout=WAIT_MS)
        assert len((line.get_attribute("points") or "").split()) == 5
        assert errors == []


def test_dead_letters_replay_in_a_real_browser(ui: tuple[str, ArenaSettings], broker: str) -> None:
    """The letters ticked, and only they, are replayed with "Replay selected", whose result shows
    beside it; a row's "replay again" forces one more replay of its letter, with the result in the row."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is a dev extra: pip install -e .[dev]"
    )
    chromium_path()  # skips before any set-up when there is no Chromium
    url, _ = ui
    reason = uuid.uuid4().hex
    raws = {name: produce_dead_letter(broker, f"{reason}-{name}") for name in "abc"}
    query = {"topic": f"{DLQ_SOURCE}.dlq", "reason": reason}
    failures = {r["reason"][-1]: r["failure_id"] for r in httpx.get(f"{url}api/dlq", params=query).json()}

    expect = sync_api.expect
    with browser_page(sync_api) as (page, errors):
        page.on(
            "response",
            lambda resp: errors.append(f"{resp.status} {resp.url}") if resp.status >= 400 else None,
        )
        page.goto(url)
        page.fill("#dlq-topic", query["topic"])
        page.fill("#dlq-reason", reason)
        page.click("#dlq-filter button[type=submit]")
        expect(page.locator('tr[data-testid="dlq-row"]')).to_have_count(3, timeout=WAIT_MS)

        def row(name: str) -> Any:
            return page.locator('tr[data-testid="dlq-row"]', has_text=f"{reason}-{name}")

        row("a").locator('input[data-testid="select"]').check()
        row("c").locator('input[data-testid="select"]').check()
        expect(page.locator("#dlq-replay-selected")).to_have_text("Replay selected (2)")
        page.click("#dlq-replay-selected")
        expect(page.locator("#dlq-result")).to_contain_text("2 selected: replayed 2", timeout=WAIT_MS)
        for name, replayed in (("a", "yes"), ("b", "no"), ("c", "yes")):
            expect(row(name)).to_have_attribute("data-replayed", replayed, timeout=WAIT_MS)
        assert {n: replayed_values(broker, f) for n, f in failures.items()} == {
            "a": [raws["a"]],
            "b": [],
            "c": [raws["c"]],
        }

        again = row("a").locator('button[data-testid="replay"]')
        expect(again).to_have_text("replay again")
        again.click()
        expect(row("a").locator('[data-testid="replay-note"]')).to_have_text("replayed 1", timeout=WAIT_MS)
        assert replayed_values(broker, failures["a"]) == [raws["a"], raws["a"]]
        assert replayed_values(broker, failures["b"]) == []
        expect(row("a").locator('td[data-col="history"]')).to_contain_text("replay #2 (forced)")
        assert errors == []


def test_data_versions_and_their_comparison_in_a_real_browser(ui: tuple[str, ArenaSettings]) -> None:
    """The Versions panel lists main and the catalog's versions with their progress, and its form
    compares two of them as `arena diff` does: figures per stage, upstream matches, examples side by side."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is a dev extra: pip install -e .[dev]"
    )
    chromium_path()
    url, cfg = ui
    name = f"ui{uuid.uuid4().hex[:8]}"  # no version topics or groups of this name on the session broker
    write_version_lake(cfg, name)
    record_versions(cfg, version_spec(name))

    expect = sync_api.expect
    with browser_page(sync_api, viewport={"width": 1400, "height": 900}) as (page, errors):
        page.on(
            "response",
            lambda resp: errors.append(f"{resp.status} {resp.url}") if resp.status >= 400 else None,
        )
        page.goto(url)
        page.click('nav a[href="#versions"]')
        rows = page.locator('tr[data-testid="version-row"]')
        expect(rows).to_have_count(2, timeout=WAIT_MS)
        expect(rows.first).to_have_attribute("data-version", "main")
        mine = page.locator(f'tr[data-version="{name}"]')
        expect(mine).to_have_attribute("data-state", "idle")  # its workers never ran
        expect(mine.locator('td[data-col="stages"]')).to_have_text("tasks-from-chains")
        expect(mine.locator('td[data-col="overrides"]')).to_have_text("ARENA_SFT__TASKS_PER_CHAIN")
        expect(mine.locator('td[data-col="records"]')).to_have_text("2")

        # A defaults to main, B to the newest version; the stages offered are those B ran
        expect(page.locator("#diff-a")).to_have_value("main")
        expect(page.locator("#diff-b")).to_have_value(name)
        expect(page.locator("#diff-stage option")).to_have_text(["all it ran", "tasks-from-chains"])
        page.click("#run-diff")
        stage = page.locator('[data-testid="diff-stage"][data-stage="tasks-from-chains"]')
        expect(stage).to_have_count(1, timeout=WAIT_MS)
        figures = stage.locator('[data-testid="diff-figures"]')
        for label, a, b in [
            ("records in", "4", "3"),
            ("outputs", "3", "2"),
            ("rejected: quality", "0", "1"),
            ("dead letters: crash", "1", "0"),
            ("tokens / output", "200", "150"),
        ]:
            row = figures.locator(f'tr[data-row="{label}"]')
            expect(row.locator('td[data-side="a"]')).to_have_text(a)
            expect(row.locator('td[data-side="b"]')).to_have_text(b)
        expect(stage.locator('[data-testid="diff-match"]')).to_have_text(
            f"upstream records: 0 only in main, 0 only in {name}, 2 in both (1 with identical outputs)"
        )
        example = stage.locator('tr[data-testid="diff-example"]')
        expect(example).to_have_attribute("data-root", "chain-1")
        expect(example.locator("td")).to_have_text(["chain-1", "find a hotel", "find a hotel near the sea"])

        # the other way round: A is the version
        page.select_option("#diff-a", name)
        page.select_option("#diff-b", "main")
        page.click("#run-diff")
        expect(stage).to_have_count(1, timeout=WAIT_MS)
        expect(stage.locator('tr[data-row="records in"] td[data-side="a"]')).to_have_text("3")

        # the lake's tables count main's rows and say how many more the versions have
        chains = page.locator('tr[data-view="chains"] td[data-col="rows"]')
        expect(chains).to_have_text("4 +3 in versions", timeout=WAIT_MS)
        assert errors == []

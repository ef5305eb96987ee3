"""`arena ui` in a real headless Chromium (Playwright), against the session's real broker and a lake.

`arena ui` runs as a subprocess (the CLI as a user starts it) on a free loopback port; the page is
driven like a user would: the lag of a paused consumer group grows on screen as records arrive,
a query typed in the query box returns rows, and training metrics become a curve; the dead letters
ticked are replayed with one button, and a letter's own button replays it again (each lands on its
source topic, and the result shows beside the button clicked).

Chromium is Debian's (`scripts/test.sh` installs it); Playwright's own browser download is not
used. The test is skipped only when no Chromium or no Playwright is installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka import KafkaProducer, TopicPartition

from arena.config import ArenaSettings
from arena.records.trainer import TrainerMetrics
from tests.cli import ARENA, arena_env
from tests.test_ui_api import DLQ_SOURCE, commit, produce, produce_dead_letter, replayed_values, write_chains

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


def _chromium() -> str:
    path = os.environ.get("ARENA_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).is_file():
        pytest.skip(f"no Chromium at {path} (scripts/test.sh installs Debian's `chromium`)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def ui(broker: str, tmp_path: Path) -> Iterator[tuple[str, ArenaSettings]]:
    """`arena ui` on a free port for a fresh ARENA_HOME on the session broker; its URL and settings."""
    home = tmp_path / "home"
    cfg = ArenaSettings(home=home, broker=broker)
    port = _free_port()
    log = (tmp_path / "ui.log").open("w")
    proc = subprocess.Popen(
        [ARENA, "ui", "--port", str(port)],
        env=arena_env(home, ARENA_BROKER=broker),
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
                raise AssertionError(
                    f"arena ui exited {proc.returncode}:\n{(tmp_path / 'ui.log').read_text()}"
                )
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"arena ui did not answer in 120 s:\n{(tmp_path / 'ui.log').read_text()}"
                )
            time.sleep(0.2)
        yield url, cfg
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_dashboard_in_a_real_browser(
    ui: tuple[str, ArenaSettings],
    broker: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is a dev extra: pip install -e .[dev]"
    )
    chromium = _chromium()
    url, cfg = ui
    topic, group = new_topic(partitions=1), unique_name("paused")
    produce(broker, topic, 3)
    commit(broker, group, {TopicPartition(topic, 0): 3})  # caught up, then stopped consuming
    write_chains(cfg, 3)
    reason = uuid.uuid4().hex
    run = f"ui-{reason[:8]}"

    expect = sync_api.expect
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
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
            page.goto(url)
            expect(page).to_have_title("Arena dashboard")

            # The stage graph: registry edges drawn; the paused group's lag grows on screen.
            expect(page.locator('#graph-svg [data-edge="chains:tools.servers->chains"]').first).to_be_visible(
                timeout=WAIT_MS
            )
            lag = page.locator(f'tr[data-group="{group}"][data-topic="{topic}"] td[data-col="lag"]')
            expect(lag).to_have_text("0", timeout=WAIT_MS)
            produce(broker, topic, 5)
            expect(lag).to_have_text("5", timeout=WAIT_MS)
            produce(broker, topic, 7)
            expect(lag).to_have_text("12", timeout=WAIT_MS)

            # The lake browser: the table's row count, then a query typed in the box returns rows.
            expect(page.locator('tr[data-view="chains"] td[data-col="rows"]')).to_have_text(
                "3", timeout=WAIT_MS
            )
            page.fill("#sql", "select chain_id, origin from chains order by chain_id")
            page.click("#run-query")
            rows = page.locator('#query-result tr[data-testid="result-row"]')
            expect(rows).to_have_count(3, timeout=WAIT_MS)
            expect(rows.first.locator("td").first).to_have_text("chain-0")
            expect(page.locator("#query-result thead th")).to_have_text(["chain_id", "origin"])
            page.fill("#sql", "drop table chains")
            page.click("#run-query")
            expect(page.locator("#query-error")).to_contain_text("only read-only queries", timeout=WAIT_MS)

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
        finally:
            browser.close()


def test_dead_letters_replay_in_a_real_browser(ui: tuple[str, ArenaSettings], broker: str) -> None:
    """The letters ticked, and only they, are replayed with "Replay selected", whose result shows
    beside it; a row's "replay again" forces one more replay of its letter, with the result in the row."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is a dev extra: pip install -e .[dev]"
    )
    chromium = _chromium()
    url, _ = ui
    reason = uuid.uuid4().hex
    raws = {name: produce_dead_letter(broker, f"{reason}-{name}") for name in "abc"}
    query = {"topic": f"{DLQ_SOURCE}.dlq", "reason": reason}
    failures = {r["reason"][-1]: r["failure_id"] for r in httpx.get(f"{url}api/dlq", params=query).json()}

    expect = sync_api.expect
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
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
            expect(row("a").locator('[data-testid="replay-note"]')).to_have_text(
                "replayed 1", timeout=WAIT_MS
            )
            assert replayed_values(broker, failures["a"]) == [raws["a"], raws["a"]]
            assert replayed_values(broker, failures["b"]) == []
            expect(row("a").locator('td[data-col="history"]')).to_contain_text("replay #2 (forced)")
            assert errors == []
        finally:
            browser.close()

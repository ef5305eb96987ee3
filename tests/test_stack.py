"""The embedded stack lifecycle (real noida broker) and topic administration."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app import stack
from app.stack import (
    ExternalBrokerConfigured,
    StackNotRunning,
    StackStartError,
    down,
    kafka_answers,
    resolve_broker,
    status,
    up,
)
from arena.config import ArenaSettings
from arena.records.common import DeadLetter
from arena.topics import TOPICS, TopicSpec
from streams.admin import TopicPartitionMismatch, admin_client, ensure_topics, partition_counts

pytestmark = pytest.mark.integration


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[ArenaSettings]:
    s = ArenaSettings(home=tmp_path / "home", broker=None)
    try:
        yield s
    finally:
        down(s)  # never leave a broker behind, whatever the test did


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _free_closed_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


# -- stack ---------------------------------------------------------------


def test_up_status_down(settings: ArenaSettings) -> None:
    state = up(settings)
    assert state.fresh
    assert state.pgid == state.pid  # its own session: down() can stop the whole group
    assert kafka_answers(state.broker)

    recorded = json.loads((settings.home / "stack.json").read_text())
    assert {"pid", "pgid", "broker", "started_at"} <= recorded.keys()
    assert "fresh" not in recorded
    assert recorded["broker"] == state.broker
    assert not list(settings.home.glob(".stack.json*"))  # no temp file left behind

    # folders for the lake, LanceDB and the catalog, and the broker log
    assert (settings.home / "lake").is_dir()
    assert (settings.home / "lancedb").is_dir()
    assert (settings.home / "broker").is_dir()
    assert "kafka" in (settings.home / "logs" / "broker.log").read_text()

    st = status(settings)
    assert st.running and st.embedded and not st.stale
    assert st.broker == state.broker and st.pid == state.pid
    assert st.lake == f"file://{settings.home / 'lake'}"
    assert st.catalog == f"sqlite:///{settings.home / 'catalog.db'}"

    assert down(settings) is True
    assert not stack.pid_alive(state.pid)
    assert not kafka_answers(state.broker, 0.3)
    assert not (settings.home / "stack.json").exists()
    assert not status(settings).running
    assert down(settings) is False  # nothing left to stop


def test_up_is_idempotent_and_keeps_data(settings: ArenaSettings) -> None:
    first = up(settings)
    again = up(settings)
    assert again.pid == first.pid and again.broker == first.broker
    assert not again.fresh
    assert resolve_broker(settings, start=False) == (first.broker, False)

    ensure_topics(first.broker, [TOPICS["chains"]])
    down(settings)
    restarted = up(settings)
    assert restarted.fresh and restarted.pid != first.pid
    with admin_client(restarted.broker) as admin:
        assert partition_counts(admin, ["chains"]) == {"chains": 4}  # the data dir survived


def test_resolve_broker(settings: ArenaSettings) -> None:
    with pytest.raises(StackNotRunning, match="arena up"):
        resolve_broker(settings, start=False)
    address, started = resolve_broker(settings, start=True)
    assert started and kafka_answers(address)
    assert resolve_broker(settings, start=True) == (address, False)


def test_external_broker_is_never_started(tmp_path: Path) -> None:
    external = _free_closed_port()
    s = ArenaSettings(home=tmp_path / "home", broker=external)
    assert resolve_broker(s, start=True) == (external, False)
    assert resolve_broker(s, start=False) == (external, False)
    with pytest.raises(ExternalBrokerConfigured):
        up(s)
    assert not (s.home / "stack.json").exists()
    st = status(s)
    assert not st.embedded and not st.running and st.broker == external


def test_stale_state_is_replaced(settings: ArenaSettings) -> None:
    settings.home.mkdir(parents=True)
    dead = _dead_pid()
    stale = {
        "pid": dead,
        "pgid": dead,
        "broker": _free_closed_port(),
        "started_at": "2026-01-01T00:00:00Z",
        "data_dir": str(settings.home / "broker"),
        "log": str(settings.home / "logs" / "broker.log"),
    }
    (settings.home / "stack.json").write_text(json.dumps(stale))

    st = status(settings)
    assert st.stale and not st.running and "arena up" in st.message
    with pytest.raises(StackNotRunning):
        resolve_broker(settings, start=False)

    state = up(settings)
    assert state.fresh and state.pid != dead
    assert json.loads((settings.home / "stack.json").read_text())["pid"] == state.pid


def test_corrupt_state_file_counts_as_stale(settings: ArenaSettings) -> None:
    settings.home.mkdir(parents=True)
    (settings.home / "stack.json").write_text("{not json")
    assert status(settings).stale
    assert down(settings) is False
    assert not (settings.home / "stack.json").exists()


def test_secrets_are_redacted_in_status(tmp_path: Path) -> None:
    s = ArenaSettings(
        home=tmp_path / "home",
        broker=None,
        catalog_url="postgresql://arena:hunter2@db:5432/arena",  # type: ignore[arg-type]
    )
    st = status(s)
    assert "hunter2" not in st.model_dump_json()
    assert st.catalog == "postgresql://arena:***@db:5432/arena"


def _fake_binary(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "fake-broker"
    script.write_text(f"#!/bin/sh\necho fake broker starting\n{body}\n")
    script.chmod(0o755)
    return script


def test_start_timeout_points_at_log_and_cleans_up(settings: ArenaSettings, tmp_path: Path) -> None:
    pidfile = tmp_path / "fake.pid"
    binary = _fake_binary(tmp_path, f"echo $$ > {pidfile}\nexec sleep 60")
    with pytest.raises(StackStartError) as err:
        up(settings, timeout_s=1.0, binary=binary)
    message = str(err.value)
    assert str(settings.home / "logs" / "broker.log") in message
    assert "fake broker starting" in message
    assert not stack.pid_alive(int(pidfile.read_text()))  # its process group was stopped
    assert not (settings.home / "stack.json").exists()


def test_early_exit_reports_code(settings: ArenaSettings, tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path, "echo 'error: something broke' >&2\nexit 3")
    t0 = time.monotonic()
    with pytest.raises(StackStartError, match=r"code 3[\s\S]*something broke"):
        up(settings, timeout_s=20.0, binary=binary)
    assert time.monotonic() - t0 < 5  # did not wait for the timeout


def test_stop_escalates_to_sigkill() -> None:
    proc = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"], start_new_session=True
    )
    stack._CHILDREN[proc.pid] = proc
    time.sleep(0.2)  # let the trap be installed
    t0 = time.monotonic()
    stack._stop_process(proc.pid, proc.pid, timeout_s=0.5)
    assert proc.poll() == -signal.SIGKILL
    assert time.monotonic() - t0 < 5


def test_down_from_another_process(settings: ArenaSettings) -> None:
    """`arena up` and `arena down` run in different processes: the broker is not our child."""
    code = (
        "from arena.config import ArenaSettings; from app.stack import up; "
        f"print(up(ArenaSettings(home={str(settings.home)!r}, broker=None)).pid)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    )
    pid = int(out.stdout.strip().splitlines()[-1])
    assert pid not in stack._CHILDREN
    assert status(settings).running
    assert down(settings) is True
    deadline = time.monotonic() + 5
    while stack.pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stack.pid_alive(pid)


# -- topics --------------------------------------------------------------


def _specs(unique_name: Callable[[str], str], partitions: list[int]) -> list[TopicSpec]:
    return [
        TopicSpec(unique_name(f"p{n}"), n, "test key", DeadLetter, retention_ms=3_600_000) for n in partitions
    ]


def test_ensure_topics_creates_exact_partitions_and_configs(
    broker: str, unique_name: Callable[[str], str]
) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    specs = _specs(unique_name, [1, 3, 5])
    created = ensure_topics(broker, specs)
    assert created == sorted(s.name for s in specs)
    with admin_client(broker) as admin:
        assert partition_counts(admin, [s.name for s in specs]) == {s.name: s.partitions for s in specs}
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, specs[1].name)])
    topic_configs = configs["topic"][specs[1].name]
    assert topic_configs["retention.ms"]["value"] == "3600000"
    assert topic_configs["cleanup.policy"]["value"] == "delete"

    assert ensure_topics(broker, specs) == []  # idempotent


def test_ensure_topics_detects_partition_mismatch(broker: str, unique_name: Callable[[str], str]) -> None:
    (spec,) = _specs(unique_name, [2])
    ensure_topics(broker, [spec])
    grown = dataclasses.replace(spec, partitions=6)
    with pytest.raises(TopicPartitionMismatch, match=rf"{spec.name} has 2 partitions, declared 6"):
        ensure_topics(broker, [grown])


def test_ensure_topics_whole_registry(tmp_path: Path) -> None:
    """On a fresh broker: every registry topic, exact partition counts, twice."""
    s = ArenaSettings(home=tmp_path / "home", broker=None)
    state = up(s)
    try:
        assert ensure_topics(state.broker) == sorted(TOPICS)
        assert ensure_topics(state.broker) == []
        with admin_client(state.broker) as admin:
            counts = partition_counts(admin, TOPICS)
        assert counts == {name: spec.partitions for name, spec in TOPICS.items()}
    finally:
        down(s)


def test_ensure_topics_unreachable_broker_is_clear() -> None:
    from streams.admin import BrokerUnreachable

    with pytest.raises(BrokerUnreachable, match="arena up"):
        with admin_client(_free_closed_port(), bootstrap_timeout_ms=500):
            pass


def test_a_recorded_service_runs_until_down_stops_it(tmp_path: Path) -> None:
    """The demo's deployed MCP server is such a service: later runs call the URL its records name."""
    settings = ArenaSettings(home=tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)  # arena-test-service"], start_new_session=True
    )
    try:
        state = stack.ServiceState(
            name="svc",
            pid=proc.pid,
            pgid=proc.pid,
            address="http://127.0.0.1:1/mcp",
            command="arena-test-service",
        )
        stack.record_service(settings, state)
        deadline = time.monotonic() + 10  # the child names itself once its exec is through
        while stack.live_service(settings, "svc") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stack.live_service(settings, "svc") == state
        assert [s.name for s in stack.live_services(settings)] == ["svc"]
        assert stack.down(settings)  # no broker ran, but the service did
        assert proc.wait(timeout=15) != 0
        assert stack.live_services(settings) == [] and stack.live_service(settings, "svc") is None
    finally:
        if proc.poll() is None:
            proc.kill()

"""Lifecycle of the embedded stack that lives under ``settings.home``.

The embedded default needs no setup: ``arena up`` starts the Kafka-protocol
broker from PyPI ``noida-db`` on a free loopback port and prepares the local
folders of the lake, LanceDB and the SQLite catalog. Everything about the
running broker is recorded in ``$ARENA_HOME/stack.json`` so that every later
command (workers, ``arena lag``, tests) finds it again.

Only this module knows that the embedded broker is noida; everything else
speaks plain Kafka to whatever :func:`resolve_broker` returns, so a real
cluster only needs ``ARENA_BROKER``.

Layout under ``$ARENA_HOME``::

    stack.json        pid, pgid, broker address, start time (written atomically)
    services/<name>.json   a service the stack owns besides the broker (the demo's deployed MCP
                      server): pid, pgid, address; ``down`` stops it too
    stack.lock        serialises concurrent ``up``/``down`` calls
    broker/           broker data
    logs/broker.log   broker stdout + stderr
    lake/ lancedb/ catalog.db   (defaults; other modules create the content)
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.resources
import os
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from pydantic import BaseModel, Field, ValidationError

from arena.config import ArenaSettings

STATE_FILE = "stack.json"
LOCK_FILE = "stack.lock"
LOG_FILE = Path("logs") / "broker.log"
DATA_DIR = "broker"
LOOPBACK = "127.0.0.1"

DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_STOP_TIMEOUT_S = 10.0

# Children started by this very process: kept so that they are reaped (no
# zombies that would look alive to kill(pid, 0)) and no ResourceWarning fires.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class StackError(RuntimeError):
    """The embedded stack could not be started, found or stopped."""


class StackNotRunning(StackError):
    """No embedded broker is running and the caller asked not to start one."""


class StackStartError(StackError):
    """The embedded broker did not come up; the message points at its log."""


class ExternalBrokerConfigured(StackError):
    """``ARENA_BROKER`` is set, so there is no embedded broker to manage."""


class StackState(BaseModel):
    """What ``stack.json`` records about a running embedded broker."""

    pid: int = Field(description="Process id of the broker.")
    pgid: int = Field(description="Its process group; `down` signals the whole group.")
    broker: str = Field(description="Kafka bootstrap address, host:port.")
    started_at: datetime = Field(description="When the broker was started (UTC).")
    data_dir: Path = Field(description="Broker data folder.")
    log: Path = Field(description="Broker stdout/stderr log file.")
    fresh: bool = Field(
        default=False,
        exclude=True,
        description="True when this call started the broker (not persisted).",
    )


class StackStatus(BaseModel):
    """What ``arena status`` shows; secrets are redacted by ``settings.public_view()``."""

    running: bool = Field(description="The broker answers a Kafka metadata request.")
    embedded: bool = Field(description="False when ARENA_BROKER points at an external cluster.")
    broker: str | None = Field(description="Bootstrap address, when known.")
    pid: int | None = None
    started_at: datetime | None = None
    stale: bool = Field(
        default=False,
        description="stack.json points at a broker that is gone; `arena up` replaces it.",
    )
    home: str
    log: str | None = None
    lake: str
    lancedb: str
    catalog: str
    message: str


# -- paths -----------------------------------------------------------------


def state_path(settings: ArenaSettings) -> Path:
    return settings.home / STATE_FILE


def log_path(settings: ArenaSettings) -> Path:
    return settings.home / LOG_FILE


def noida_binary() -> Path:
    """The real broker binary shipped inside the ``noida-db`` wheel.

    The wheel's console script is a Python wrapper that spawns this binary; we
    run it directly so that the pid we record is the broker itself.
    """
    path = Path(str(importlib.resources.files("noida_db").joinpath("noida-db")))
    if not path.is_file():
        raise StackStartError(f"noida-db broker binary not found at {path}; reinstall `noida-db`")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)  # the wrapper does the same
    return path


def _local_path(url: str) -> Path | None:
    """Path of a local location (plain path or file://), None for remote ones."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "" or (len(parsed.scheme) == 1 and os.name == "nt"):
        return Path(url)
    return None


def _sqlite_path(url: str) -> Path | None:
    """Database file of a ``sqlite:///...`` SQLAlchemy URL (None for memory/other)."""
    scheme, sep, rest = url.partition(":///")
    if not sep or not scheme.startswith("sqlite"):
        return None
    rest = rest.split("?", 1)[0]
    if not rest or rest == ":memory:":
        return None
    return Path(rest)


def prepare_local_dirs(settings: ArenaSettings) -> list[Path]:
    """Create the folders of the local lake, LanceDB and SQLite catalog.

    Folders only: the lake, index and catalog modules create their content.
    Remote locations (s3://, postgresql://) are left alone. Returns the
    folders that now exist.
    """
    folders = [settings.home, settings.home / DATA_DIR, log_path(settings).parent]
    for loc in (_local_path(settings.lake), _local_path(settings.lancedb)):
        if loc is not None:
            folders.append(loc)
    db = _sqlite_path(settings.catalog)
    if db is not None:
        folders.append(db.parent)
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    return folders


# -- state file ------------------------------------------------------------


def _read_state(settings: ArenaSettings) -> StackState | None:
    path = state_path(settings)
    try:
        return StackState.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (ValidationError, ValueError, OSError):
        # A truncated or hand-edited file is treated like a stale one.
        return None


def _write_state(settings: ArenaSettings, state: StackState) -> None:
    path = state_path(settings)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(state.model_dump_json(indent=2) + "\n")
    # rename is atomic: readers never see a half-written stack.json.
    os.replace(tmp, path)


def _remove_state(settings: ArenaSettings) -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path(settings).unlink()


@contextlib.contextmanager
def _locked(settings: ArenaSettings) -> Iterator[None]:
    """Serialise up/down: two workers calling ``resolve_broker(start=True)``
    at once must not start two brokers on one data folder."""
    settings.home.mkdir(parents=True, exist_ok=True)
    with open(settings.home / LOCK_FILE, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


# -- process helpers -------------------------------------------------------


def pid_alive(pid: int) -> bool:
    """True when ``pid`` is a running (not zombie) process."""
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            _CHILDREN.pop(pid, None)
            return False
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) still answers kill(0).
    with contextlib.suppress(OSError, IndexError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def _processes() -> dict[int, tuple[int, str]]:
    """Every process: pid -> (parent pid, command line), from /proc."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found[int(entry.name)] = (int(stat.rsplit(")", 1)[1].split()[1]), cmd)
    return found


def descendants_of(pid: int) -> dict[int, str]:
    """Every process below ``pid`` (children, their children, ...) and its command line.

    The stage processes of `arena worker` are its fork server's children (``app.forkserver``).
    """
    table = _processes()
    found: dict[int, str] = {}
    parents = {pid}
    while parents:
        below = {
            child: cmd for child, (parent, cmd) in table.items() if parent in parents and child not in found
        }
        found.update(below)
        parents = set(below)
    return found


def _is_our_broker(state: StackState) -> bool:
    """The recorded pid is alive and is still our broker (not a reused pid)."""
    if not pid_alive(state.pid):
        return False
    try:
        if os.getpgid(state.pid) != state.pgid:
            return False
    except ProcessLookupError:
        return False
    cmdline = Path(f"/proc/{state.pid}/cmdline")
    if cmdline.exists():
        with contextlib.suppress(OSError):
            return str(state.data_dir) in cmdline.read_bytes().decode(errors="replace")
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    return host.strip("[]") or LOOPBACK, int(port)


def kafka_answers(address: str, timeout_s: float = 1.0) -> bool:
    """True when ``host:port`` answers a Kafka Metadata request.

    A raw Metadata v4 request asking for no topics: cheap on any broker, needs
    no client library (whose bootstrap retries would blur the timeout), and
    proves the Kafka protocol is served, not just that a port is open.
    """
    try:
        host, port = _split_address(address)
    except ValueError:
        return False
    correlation_id = int.from_bytes(os.urandom(3), "big")
    client_id = b"arena-probe"
    body = (
        struct.pack(">hhih", 3, 4, correlation_id, len(client_id))
        + client_id
        + struct.pack(">ib", 0, 0)  # topics: [] (none), allow_auto_topic_creation: false
    )
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exactly(sock, 16)
    except OSError:
        return False
    if header is None:
        return False
    _size, got_id, _throttle, n_brokers = struct.unpack(">iiii", header)
    return got_id == correlation_id and n_brokers > 0


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _any_answers(bootstrap: str, timeout_s: float = 1.0) -> bool:
    return any(kafka_answers(a, timeout_s) for a in bootstrap.split(",") if a.strip())


def _log_tail(path: Path, since: int = 0, lines: int = 20) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(since)
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _wait_dead(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def _stop_process(pid: int, pgid: int, timeout_s: float) -> None:
    """SIGTERM the group, then SIGKILL it if it has not exited in time."""
    _signal_group(pgid, signal.SIGTERM)
    if not _wait_dead(pid, timeout_s):
        _signal_group(pgid, signal.SIGKILL)
        _wait_dead(pid, 5.0)
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)


# -- services ----------------------------------------------------------------


class ServiceState(BaseModel):
    """A process the stack owns besides the broker (``services/<name>.json``)."""

    name: str
    pid: int
    pgid: int
    address: str = Field(description="Where it serves, e.g. http://127.0.0.1:8000/mcp.")
    command: str = Field(description="A part of its command line that identifies it (not a reused pid).")


def _service_path(settings: ArenaSettings, name: str) -> Path:
    return settings.home / "services" / f"{name}.json"


def record_service(settings: ArenaSettings, state: ServiceState) -> None:
    """Remember a service so that later commands find it and ``down`` stops it (written atomically)."""
    path = _service_path(settings, state.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(state.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)


def live_service(settings: ArenaSettings, name: str) -> ServiceState | None:
    """The recorded service ``name`` when its process still runs (and is still it)."""
    try:
        state = ServiceState.model_validate_json(_service_path(settings, name).read_bytes())
    except (FileNotFoundError, ValidationError, ValueError, OSError):
        return None
    try:
        cmdline = Path(f"/proc/{state.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return None
    return state if pid_alive(state.pid) and state.command in cmdline else None


def live_services(settings: ArenaSettings) -> list[ServiceState]:
    """Every recorded service that still runs."""
    found = (
        live_service(settings, path.stem) for path in sorted((settings.home / "services").glob("*.json"))
    )
    return [state for state in found if state is not None]


def stop_services(settings: ArenaSettings, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> list[str]:
    """Stop every recorded service; returns the names of those that were running."""
    stopped = []
    for path in sorted((settings.home / "services").glob("*.json")):
        state = live_service(settings, path.stem)
        if state is not None:
            _stop_process(state.pid, state.pgid, timeout_s)
            stopped.append(state.name)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return stopped


# -- public API ------------------------------------------------------------


def live_state(settings: ArenaSettings, *, probe_timeout_s: float = 1.0) -> StackState | None:
    """The recorded embedded broker if its process lives and its port answers."""
    state = _read_state(settings)
    if state is None or not _is_our_broker(state):
        return None
    return state if kafka_answers(state.broker, probe_timeout_s) else None


def up(
    settings: ArenaSettings,
    *,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    binary: Path | None = None,
) -> StackState:
    """Start the embedded broker (or reuse the live one) and prepare local folders.

    Idempotent: when ``stack.json`` points at a live broker that answers, that
    one is returned (``fresh=False``). A stale ``stack.json`` (dead pid) is
    replaced. Raises :class:`ExternalBrokerConfigured` when ``ARENA_BROKER`` is
    set and :class:`StackStartError` (naming the log) when the broker does not
    answer within ``timeout_s``.
    """
    if settings.broker:
        raise ExternalBrokerConfigured(
            f"ARENA_BROKER is set to {settings.broker}: Arena uses that Kafka cluster and "
            "starts no embedded broker (unset ARENA_BROKER to use the embedded stack)"
        )
    prepare_local_dirs(settings)
    with _locked(settings):
        state = _read_state(settings)
        if state is not None and _is_our_broker(state):
            # A broker that was just started by someone else may need a moment.
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline:
                if kafka_answers(state.broker, 0.5):
                    return state
                time.sleep(0.1)
            # Alive but deaf: stop it, a second broker may not share its data dir.
            _stop_process(state.pid, state.pgid, DEFAULT_STOP_TIMEOUT_S)
        _remove_state(settings)
        state = _start(settings, timeout_s=timeout_s, binary=binary or noida_binary())
        _write_state(settings, state)
        return state


def _start(settings: ArenaSettings, *, timeout_s: float, binary: Path) -> StackState:
    log = log_path(settings)
    data_dir = settings.home / DATA_DIR
    last_error = ""
    for _attempt in range(3):
        port = free_port()
        address = f"{LOOPBACK}:{port}"
        since = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as fh:
            fh.write(f"--- arena up {datetime.now(UTC).isoformat()} on {address}\n".encode())
            fh.flush()
            proc = subprocess.Popen(
                [
                    str(binary),
                    "start",
                    "--data-dir",
                    str(data_dir),
                    "--only",
                    "kafka",
                    "--kafka-port",
                    str(port),
                    "--host",
                    LOOPBACK,
                ],
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: `down` stops all of it
                close_fds=True,
            )
        _CHILDREN[proc.pid] = proc
        started_at = datetime.now(UTC)
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                _CHILDREN.pop(proc.pid, None)
                tail = _log_tail(log, since)
                last_error = (
                    f"the embedded broker exited with code {proc.returncode} before answering "
                    f"on {address}; see {log}:\n{tail}"
                )
                break
            if kafka_answers(address, 0.5):
                return StackState(
                    pid=proc.pid,
                    pgid=os.getpgid(proc.pid),
                    broker=address,
                    started_at=started_at,
                    data_dir=data_dir,
                    log=log,
                    fresh=True,
                )
            if time.monotonic() >= deadline:
                _stop_process(proc.pid, proc.pid, 2.0)
                raise StackStartError(
                    f"the embedded broker did not answer on {address} within {timeout_s:.0f}s; "
                    f"see {log}:\n{_log_tail(log, since)}"
                )
            time.sleep(0.05)
        # Another process may have grabbed the port between probe and bind: retry.
        if "in use" not in last_error:
            break
    raise StackStartError(last_error)


def status(settings: ArenaSettings) -> StackStatus:
    """Where the stack stands: broker address, pid, and the data locations."""
    view = settings.public_view()
    common = {
        "home": str(settings.home),
        "lake": str(view["lake"]),
        "lancedb": str(view["lancedb"]),
        "catalog": str(view["catalog"]),
    }
    if settings.broker:
        running = _any_answers(settings.broker)
        return StackStatus(
            running=running,
            embedded=False,
            broker=settings.broker,
            message=f"external Kafka at {settings.broker} " + ("answers" if running else "does not answer"),
            **common,
        )
    state = _read_state(settings)
    if state is None:
        stale = state_path(settings).exists()  # present but unreadable
        return StackStatus(
            running=False,
            embedded=True,
            broker=None,
            stale=stale,
            message="the embedded stack is not running; start it with `arena up`",
            **common,
        )
    if not _is_our_broker(state):
        return StackStatus(
            running=False,
            embedded=True,
            broker=state.broker,
            pid=state.pid,
            started_at=state.started_at,
            stale=True,
            log=str(state.log),
            message=f"stack.json is stale (broker pid {state.pid} is gone); `arena up` starts a fresh one",
            **common,
        )
    running = kafka_answers(state.broker)
    return StackStatus(
        running=running,
        embedded=True,
        broker=state.broker,
        pid=state.pid,
        started_at=state.started_at,
        log=str(state.log),
        message=f"embedded broker at {state.broker} (pid {state.pid})"
        if running
        else f"broker pid {state.pid} is alive but {state.broker} does not answer; see {state.log}",
        **common,
    )


def down(settings: ArenaSettings, *, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> bool:
    """Stop the embedded broker's process group and remove ``stack.json``.

    SIGTERM first, SIGKILL after ``timeout_s``. Returns True when a running
    broker was stopped, False when there was nothing to stop (a stale
    ``stack.json`` is removed either way). Broker data is kept.
    """
    with _locked(settings):
        state = _read_state(settings)
        stopped = bool(stop_services(settings, timeout_s))
        if state is not None and _is_our_broker(state):
            _stop_process(state.pid, state.pgid, timeout_s)
            stopped = True
        _remove_state(settings)
        return stopped


def resolve_broker(settings: ArenaSettings, *, start: bool) -> tuple[str, bool]:
    """The Kafka bootstrap address every command should use.

    ``ARENA_BROKER`` wins (an external cluster: nothing is ever started).
    Otherwise the live embedded broker; otherwise, with ``start=True``, a
    freshly started one. The second value is True when the broker was just
    started, so the CLI can say so. With ``start=False`` and no live broker,
    raises :class:`StackNotRunning`.
    """
    if settings.broker:
        return settings.broker, False
    state = live_state(settings)
    if state is not None:
        return state.broker, False
    if not start:
        raise StackNotRunning(
            f"no embedded broker is running under {settings.home}: run `arena up` "
            "(or set ARENA_BROKER to use an external Kafka cluster)"
        )
    state = up(settings)
    return state.broker, state.fresh

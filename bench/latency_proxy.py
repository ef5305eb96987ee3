"""A small HTTP proxy that adds a fixed latency to every request, for `bench/llm_concurrency.py --proxy`.

Usage::

    python bench/latency_proxy.py --upstream http://127.0.0.1:8000 --port 8001 --latency 0.25 [--capacity 64]

Put it in front of ``arena llm serve --latency 0`` and point Arena at it
(``ARENA_LLM=openai://127.0.0.1:8001/v1?model=rules-v1``): every request waits for one of
``--capacity`` slots, holds it for the upstream's answer plus ``--latency`` seconds, then gets the
upstream's answer unchanged. ``GET /v1/arena/stats`` answers the proxy's own figures, in the
shape of the server's (requests, errors, in flight now / most / time-weighted mean, by_role),
plus LLM tokens per role and, per calling process, calls and tokens (``by_stage``): a worker
process ``python -m app.run NAME`` counts as stage NAME. The caller of a connection is found
once per connection from ``/proc/net/tcp`` and ``/proc/PID/fd`` (Linux; elsewhere ``unknown``);
``connections`` and ``caller_lookup_s`` (wall seconds of those lookups, in threads, summed) say
what that cost.

Plain asyncio streams and HTTP/1.1 with ``Content-Length`` bodies (what httpx sends); the
upstream is reached with httpx. Stdlib plus httpx, no web framework.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:  # `python bench/X.py`: see bench/__init__.py
    _BENCH = Path(__file__).resolve().parent
    sys.path[:] = [str(_BENCH.parent), *(p for p in sys.path if Path(p or ".").resolve() != _BENCH)]

import httpx

from app.llm_server import ServerStats

HOP_BY_HOP = frozenset(
    {"host", "connection", "keep-alive", "content-length", "transfer-encoding", "proxy-connection", "upgrade"}
)
MAX_HEADER_BYTES = 64 * 1024
ESTABLISHED = "01"
"""TCP state of a live connection in /proc/net/tcp."""


@dataclass
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def add(self, prompt: int, completion: int) -> None:
        self.calls += 1
        self.prompt_tokens += prompt
        self.completion_tokens += completion

    def as_dict(self) -> dict[str, int]:
        return {
            "calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


@dataclass
class ProxyStats:
    """What the proxy saw: the server's figures (``app.llm_server.ServerStats``) plus tokens and callers."""

    server: ServerStats = field(default_factory=ServerStats)
    """Requests, errors and requests in flight, counted the way ``arena llm serve`` counts them."""
    connections: int = 0
    caller_lookup_s: float = 0.0
    tokens_by_role: dict[str, Usage] = field(default_factory=dict)
    by_stage: dict[str, Usage] = field(default_factory=dict)

    def enter(self, role: str) -> None:
        self.server.enter(role)

    def leave(self) -> None:
        self.server.leave()

    def failed(self) -> None:
        self.server.errors += 1

    def answered(self, role: str, stage: str, prompt: int, completion: int) -> None:
        self.tokens_by_role.setdefault(role, Usage()).add(prompt, completion)
        self.by_stage.setdefault(stage, Usage()).add(prompt, completion)

    def snapshot(self) -> dict[str, Any]:
        return {
            **self.server.snapshot(),
            "connections": self.connections,
            "caller_lookup_s": round(self.caller_lookup_s, 3),
            "tokens_by_role": {k: v.as_dict() for k, v in sorted(self.tokens_by_role.items())},
            "by_stage": {k: v.as_dict() for k, v in sorted(self.by_stage.items())},
        }


# --- who is calling ---------------------------------------------------------------------------


def _socket_inode(peer_port: int, own_port: int) -> str | None:
    """Inode of the client's end of the loopback TCP connection peer_port -> own_port."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10:
                continue
            local, remote, state, inode = cols[1], cols[2], cols[3], cols[9]
            if state != ESTABLISHED or inode == "0":  # e.g. an earlier connection on that port in TIME_WAIT
                continue
            if (
                int(local.rsplit(":", 1)[1], 16) == peer_port
                and int(remote.rsplit(":", 1)[1], 16) == own_port
            ):
                return inode
    return None


def _owns(pid: int, target: str) -> bool:
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone, or not ours
        return False
    for fd in fds:
        try:
            if os.readlink(fd) == target:
                return True
        except OSError:  # closed meanwhile: a busy worker opens and closes sockets all the time
            continue
    return False


def _pid_of_inode(inode: str, known: list[int]) -> int | None:
    """The process holding socket ``inode``: the callers seen before first, then every process."""
    target = f"socket:[{inode}]"
    for pid in known:
        if _owns(pid, target):
            return pid
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _owns(int(entry.name), target):
            if int(entry.name) not in known:
                known.append(int(entry.name))
            return int(entry.name)
    return None


def stage_of(pid: int) -> str:
    """``python -m app.run NAME`` -> NAME; `arena publish ...` -> ``publish``; else the program name."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")
    except OSError:
        return "unknown"
    argv = [a for a in argv if a]
    if "app.run" in argv and argv.index("app.run") + 1 < len(argv):
        return argv[argv.index("app.run") + 1]
    words = [Path(a).name for a in argv]
    if "arena" in words or "app.cli" in argv:
        rest = argv[(words.index("arena") if "arena" in words else argv.index("app.cli")) + 1 :]
        return rest[0] if rest else "arena"
    return words[0] if words else "unknown"


def caller_of(peer_port: int, own_port: int, known: list[int]) -> str:
    """The stage (or program) on the other end of a loopback connection; ``known``: pids seen before."""
    inode = _socket_inode(peer_port, own_port)
    pid = _pid_of_inode(inode, known) if inode else None
    if pid is None:
        print(f"caller of port {peer_port} not found (socket inode {inode})", file=sys.stderr, flush=True)
    return stage_of(pid) if pid else "unknown"


# --- HTTP ----------------------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def keep_alive(self) -> bool:
        return self.headers.get("connection", "").lower() != "close"


class BadRequest(Exception):
    pass


async def read_request(reader: asyncio.StreamReader) -> Request | None:
    """The next request on the connection, or None when the client closed it."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise BadRequest("connection closed inside the request head") from None
        return None
    except asyncio.LimitOverrunError:
        raise BadRequest("request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, path, _version = lines[0].split(" ", 2)
    except ValueError:
        raise BadRequest(f"bad request line {lines[0]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise BadRequest("chunked request bodies are not supported")
    length = int(headers.get("content-length") or 0)
    body = await reader.readexactly(length) if length else b""
    return Request(method.upper(), path, headers, body)


def response_bytes(
    status: int, body: bytes, headers: dict[str, str] | None = None, close: bool = False
) -> bytes:
    reason = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}"]
    for name, value in (headers or {"content-type": "application/json"}).items():
        lines.append(f"{name}: {value}")
    lines.append(f"content-length: {len(body)}")
    if close:
        lines.append("connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _json(payload: Any) -> bytes:
    return json.dumps(payload).encode("utf-8")


def _role(body: bytes) -> str:
    try:
        data = json.loads(body)
        name = data["response_format"]["json_schema"]["name"]
    except (ValueError, KeyError, TypeError):
        return "chat"
    return name if isinstance(name, str) else "chat"


def _usage(body: bytes) -> tuple[int, int]:
    try:
        usage = json.loads(body).get("usage") or {}
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    except (ValueError, AttributeError, TypeError):
        return 0, 0


class LatencyProxy:
    def __init__(self, upstream: str, latency_s: float, capacity: int) -> None:
        if latency_s < 0 or capacity < 1:
            raise ValueError("latency must be >= 0 and capacity >= 1")
        self.upstream = upstream.rstrip("/")
        self.latency_s = latency_s
        self.stats = ProxyStats()
        self._slots = asyncio.Semaphore(capacity)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(600.0),
            # idle connections close before uvicorn's 5 s keep-alive timeout would close them under us
            limits=httpx.Limits(
                max_connections=capacity, max_keepalive_connections=capacity, keepalive_expiry=2.0
            ),
        )
        self.port = 0
        self._known_pids: list[int] = []
        """Processes that called before: looked at first when a new connection comes."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        self.stats.connections += 1
        caller: str | None = None
        try:
            while True:
                try:
                    request = await read_request(reader)
                except BadRequest as exc:
                    writer.write(response_bytes(400, _json({"error": {"message": str(exc)}}), close=True))
                    await writer.drain()
                    return
                if request is None:
                    return
                if caller is None and request.method == "POST":
                    port = int(peer[1]) if isinstance(peer, tuple) else 0
                    started = time.monotonic()
                    caller = await asyncio.to_thread(caller_of, port, self.port, self._known_pids)
                    self.stats.caller_lookup_s += time.monotonic() - started
                status, headers, body = await self.answer(request, caller or "unknown")
                writer.write(response_bytes(status, body, headers, close=not request.keep_alive))
                await writer.drain()
                if not request.keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def answer(self, request: Request, caller: str) -> tuple[int, dict[str, str], bytes]:
        if request.method == "GET" and request.path == "/v1/arena/stats":
            return 200, {"content-type": "application/json"}, _json(self.stats.snapshot())
        if request.method == "GET" and request.path == "/health":
            return 200, {"content-type": "application/json"}, _json({"status": "ok"})
        if request.method != "POST":
            return await self.forward(request)
        role = _role(request.body)
        self.stats.enter(role)
        try:
            async with self._slots:
                status, headers, body = await self.forward(request)
                if self.latency_s:
                    await asyncio.sleep(self.latency_s)
        finally:
            self.stats.leave()
        if status == 200:
            self.stats.answered(role, caller, *_usage(body))
        else:
            self.stats.failed()
        return status, headers, body

    async def forward(self, request: Request) -> tuple[int, dict[str, str], bytes]:
        headers = {k: v for k, v in request.headers.items() if k not in HOP_BY_HOP}
        try:
            try:
                response = await self._client.request(
                    request.method, self.upstream + request.path, content=request.body, headers=headers
                )
            except httpx.RemoteProtocolError:
                # the upstream closed an idle keep-alive connection as we reused it: not processed, so resend
                response = await self._client.request(
                    request.method, self.upstream + request.path, content=request.body, headers=headers
                )
        except httpx.HTTPError as exc:
            print(f"upstream {request.method} {request.path}: {exc!r}", file=sys.stderr, flush=True)
            return (
                502,
                {"content-type": "application/json"},
                _json({"error": {"message": f"upstream: {exc!r}"}}),
            )
        out = {k: v for k, v in response.headers.items() if k.lower() in ("content-type", "retry-after")}
        return response.status_code, out, response.content

    async def serve(self, host: str, port: int) -> None:
        server = await asyncio.start_server(self.handle, host, port, limit=MAX_HEADER_BYTES)
        self.port = int(server.sockets[0].getsockname()[1])
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with server:
            await stop.wait()
        await self._client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An HTTP proxy adding a fixed latency per request.")
    parser.add_argument(
        "--upstream", required=True, help="Base URL of the server, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.25, help="Seconds added to every POST.")
    parser.add_argument("--capacity", type=int, default=64, help="Requests handled at once; the rest wait.")
    args = parser.parse_args(argv)
    proxy = LatencyProxy(args.upstream, args.latency, args.capacity)
    asyncio.run(proxy.serve(args.host, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Two small, real MCP servers used as *deployed* tool servers (ASTRA §2.1.4).

- ``samples.mcp.notes``: a notes service (create, list, search, read, tag, update, delete).
- ``samples.mcp.library``: a lending-library catalogue (search, details, availability,
  reservations).

Both keep their state in the server process, return structured JSON (every tool
declares an ``outputSchema``) and chain naturally: ids returned by one tool are
the required arguments of the next. Run one with::

    python -m samples.mcp.notes --transport stdio
    python -m samples.mcp.library --transport http --host 127.0.0.1 --port 8931

Over HTTP the streamable-HTTP endpoint is ``http://HOST:PORT/mcp``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from mcp.server.mcpserver import MCPServer

DEFAULT_PATH = "/mcp"


class Clock:
    """The servers' time: the wall clock, or a logical one started at a fixed instant.

    A logical clock advances one second per reading, so the timestamps a session's tools return
    depend only on its calls: two runs of the same trajectories then match record for record.
    """

    def __init__(self) -> None:
        self._next: datetime | None = None

    def start_at(self, start: datetime | None) -> None:
        self._next = start.astimezone(UTC).replace(microsecond=0) if start else None

    def now(self) -> str:
        """ISO 8601 UTC, to the second."""
        if self._next is None:
            return datetime.now(UTC).replace(microsecond=0).isoformat()
        now, self._next = self._next, self._next + timedelta(seconds=1)
        return now.isoformat()


CLOCK = Clock()
"""The process's clock (one server per process); ``--clock`` starts it at a fixed instant."""


def parse_args(prog: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options shared by the sample servers."""
    parser = argparse.ArgumentParser(prog=prog, description="Run a sample MCP server.")
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="MCP transport.")
    parser.add_argument("--host", default="127.0.0.1", help="http: interface to bind.")
    parser.add_argument("--port", type=int, default=8000, help="http: TCP port to bind.")
    parser.add_argument("--path", default=DEFAULT_PATH, help="http: path of the streamable-HTTP endpoint.")
    parser.add_argument(
        "--clock",
        type=datetime.fromisoformat,
        default=None,
        help="start of a logical clock (ISO 8601) that advances 1 s per reading; default: wall time",
    )
    return parser.parse_args(argv)


def serve(build: Callable[[], MCPServer], prog: str, argv: Sequence[str] | None = None) -> None:
    """Build a fresh server (fresh state) and run it on the transport the command line picks."""
    args = parse_args(prog, argv)
    CLOCK.start_at(args.clock)
    server = build()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host=args.host, port=args.port, streamable_http_path=args.path)

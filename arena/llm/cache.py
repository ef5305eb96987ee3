"""The gateway's response cache: one SQLite file shared by every worker process.

Keys are content hashes of (role, prompt version, output schema, inputs, backend, model,
sampling), values the raw text a backend produced plus its token usage. WAL journaling lets
readers run beside a writer in other processes; a busy timeout makes concurrent writers wait
instead of failing. Every SQLite call runs in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field

from arena.llm.core import Usage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    raw TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    created_at REAL NOT NULL
)
"""


class CachedResponse(BaseModel):
    """A stored backend answer."""

    raw: Annotated[str, Field(description="The raw text the backend produced (valid when stored).")]
    prompt_tokens: Annotated[int, Field(ge=0, description="Prompt tokens spent producing it.")]
    completion_tokens: Annotated[int, Field(ge=0, description="Completion tokens spent producing it.")]

    @property
    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens)


class ResponseCache:
    """Raw LLM responses by cache key, in SQLite at ``path`` (created on first use)."""

    def __init__(self, path: str | Path, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()  # one connection, used from worker threads one at a time

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r})"

    def _connection(self) -> sqlite3.Connection:
        """The open connection (caller holds the lock); opens and migrates on first use."""
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Autocommit: each statement is its own short transaction, so locks are held briefly.
            conn = sqlite3.connect(
                self.path, timeout=self.busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
            self._set_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(_SCHEMA)
            self._conn = conn
        return self._conn

    def _set_wal(self, conn: sqlite3.Connection) -> None:
        """Switch a fresh file to WAL (persistent, so later openers find it set).

        The switch needs an exclusive lock and SQLite answers "database is locked" at
        once, without its busy handler, while another process holds the file; so retry.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                    return
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _get(self, key: str) -> CachedResponse | None:
        with self._lock:
            row = (
                self._connection()
                .execute("SELECT raw, prompt_tokens, completion_tokens FROM responses WHERE key = ?", (key,))
                .fetchone()
            )
        if row is None:
            return None
        return CachedResponse(raw=row[0], prompt_tokens=row[1], completion_tokens=row[2])

    def _put(self, key: str, role: str, raw: str, usage: Usage) -> None:
        with self._lock:
            self._connection().execute(
                "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?)",
                (key, role, raw, usage.prompt_tokens, usage.completion_tokens, time.time()),
            )

    def _count(self) -> int:
        with self._lock:
            return int(self._connection().execute("SELECT COUNT(*) FROM responses").fetchone()[0])

    def _close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    async def get(self, key: str) -> CachedResponse | None:
        """The stored response for ``key``, or None."""
        return await asyncio.to_thread(self._get, key)

    async def put(self, key: str, role: str, raw: str, usage: Usage) -> None:
        """Store a (valid) response; a later put for the same key replaces it."""
        await asyncio.to_thread(self._put, key, role, raw, usage)

    async def count(self) -> int:
        """How many responses are stored."""
        return await asyncio.to_thread(self._count)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._close)

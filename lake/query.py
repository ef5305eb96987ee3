"""SQL over the artifact lake with DuckDB.

Every topic in the registry is a view named after ``TopicSpec.table`` (``tools.raw.rejected``
-> ``tools_raw_rejected``). DuckDB reads Arrow objects registered from Python, so no DuckDB
extension is ever downloaded (httpfs is not reachable offline): local lakes register lazy
Arrow datasets over the files in place; S3 lakes read the objects through the store first.
"""

from __future__ import annotations

from collections import defaultdict

import duckdb
import pyarrow as pa

from arena.topics import TOPICS
from lake.parquet import arrow_schema, read_topic_files, topic_dataset
from lake.store import LocalStore, ObjectStore


class LakeQueryError(Exception):
    """A query failed; the message is DuckDB's, meant to be shown to the user as is."""


class LakeQuery:
    """Run SQL over the lake; each call sees the files present when it starts."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def _files_by_topic(self) -> dict[str, list[str]]:
        # One listing for the whole lake instead of one request per topic.
        files: dict[str, list[str]] = defaultdict(list)
        for path in self.store.list("topic="):
            if path.endswith(".parquet"):
                files[path.split("/", 1)[0].removeprefix("topic=")].append(path)
        return files

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with one view per registered topic."""
        con = duckdb.connect(
            ":memory:",
            # Never reach for the network: json and parquet are built into the wheel.
            config={"autoinstall_known_extensions": False, "autoload_known_extensions": False},
        )
        con.execute("SET TimeZone = 'UTC'")
        files = self._files_by_topic()
        for spec in TOPICS.values():
            paths = files.get(spec.name, [])
            source: object
            if not paths:
                source = arrow_schema(spec.name).empty_table()
            elif isinstance(self.store, LocalStore):
                source = topic_dataset(self.store, spec.name, paths)  # lazy, read in place
            else:
                source = read_topic_files(self.store, spec.name, paths)
            con.register(spec.table, source)
        return con

    def query(self, sql: str) -> pa.Table:
        """Run one SQL statement; its result as an Arrow table (empty for statements without one)."""
        con = self.connect()
        try:
            rel = con.sql(sql)
            return rel.to_arrow_table() if rel is not None else pa.table({})
        except duckdb.Error as exc:
            raise LakeQueryError(str(exc)) from None
        finally:
            con.close()

    def tables(self) -> list[str]:
        """View names, one per topic."""
        return sorted(spec.table for spec in TOPICS.values())

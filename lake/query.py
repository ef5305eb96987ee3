"""SQL over the artifact lake with DuckDB.

Every topic in the registry is a view named after ``TopicSpec.table`` (``tools.raw.rejected``
-> ``tools_raw_rejected``), over every data version's files: the ``_version`` column says which
version a row belongs to (``main``: the live pipeline; ``arena.versions``), and so does ``version``
in every view whose records have no ``version`` field of their own (``envs_code`` and
``envs_verified`` keep their package version there). DuckDB reads Arrow objects registered from Python, so no DuckDB
extension is ever downloaded (httpfs is not reachable offline): local lakes register lazy
Arrow datasets over the files in place; S3 lakes read the objects through the store first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import duckdb
import pyarrow as pa

from arena.topics import TOPICS, TopicSpec
from arena.versions import MAIN, split_wire
from lake.parquet import arrow_schema, lake_files, read_topic_files, topic_dataset
from lake.store import LocalStore, ObjectStore

VERSION_COLUMN = "_version"
"""The data version of a row, in every view."""


class LakeQueryError(Exception):
    """A query failed; the message is DuckDB's, meant to be shown to the user as is."""


class LakeQuery:
    """Run SQL over the lake; each call sees the files present when it starts."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def _files_by_version(self) -> dict[str, dict[str, list[str]]]:
        """Registry topic -> data version -> its files (one listing for the whole lake)."""
        files: dict[str, dict[str, list[str]]] = {}
        for name, paths in lake_files(self.store).items():
            version, base = split_wire(name)
            files.setdefault(base, {})[version] = paths
        return files

    def _source(self, name: str, paths: list[str]) -> object:
        if not paths:
            return arrow_schema(name).empty_table()
        if isinstance(self.store, LocalStore):
            return topic_dataset(self.store, name, paths)  # lazy, read in place
        return read_topic_files(self.store, name, paths)

    def _register(
        self, con: duckdb.DuckDBPyConnection, spec: TopicSpec, by_version: dict[str, list[str]]
    ) -> None:
        """The view of one topic: each version's files as a source, tagged with the version."""
        versions = sorted(by_version, key=lambda v: (v != MAIN, v)) or [MAIN]
        own_field = "version" in spec.value.model_fields
        parts = []
        for index, version in enumerate(versions):
            source = f"__{spec.table}__{index}"
            con.register(source, self._source(spec.name, by_version.get(version, [])))
            alias = "" if own_field else f", '{version}' AS version"
            parts.append(f"SELECT *, '{version}' AS {VERSION_COLUMN}{alias} FROM {source}")
        con.execute(f"CREATE VIEW {spec.table} AS " + " UNION ALL ".join(parts))

    def connect(self, topics: Iterable[TopicSpec] | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with one view per topic of ``topics`` (default: every
        registered topic)."""
        con = duckdb.connect(
            ":memory:",
            # Never reach for the network: json and parquet are built into the wheel.
            config={"autoinstall_known_extensions": False, "autoload_known_extensions": False},
        )
        con.execute("SET TimeZone = 'UTC'")
        files = self._files_by_version()
        for spec in TOPICS.values() if topics is None else topics:
            self._register(con, spec, files.get(spec.name, {}))
        return con

    def query(self, sql: str) -> pa.Table:
        """Run one SQL statement; its result as an Arrow table (empty for statements without one)."""
        con = self.connect(named_topics(sql))
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


def named_topics(sql: str) -> list[TopicSpec]:
    """The topics whose views ``sql`` names, or every topic when it names none (``SHOW TABLES``,
    ``information_schema``). A query registers only these: registering all of them took a few
    tenths of a second per statement, most of a short query's time. A word that only looks like a
    view name (a column, a string) registers one view too many, which costs nothing else."""
    words = {word.lower() for word in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", sql)}
    named = [spec for spec in TOPICS.values() if spec.table in words]
    return named or list(TOPICS.values())

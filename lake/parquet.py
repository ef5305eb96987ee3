"""Parquet layout of the artifact lake, and the idempotent writer the lake sink uses.

Layout (Hive-style, so DuckDB/Arrow/Spark read it as partitioned data)::

    topic=<topic name>/date=YYYY-MM-DD/part-<partition>-<first offset:012d>-<content hash 12>.parquet
    version=<name>/topic=<topic name>/date=.../part-....parquet      (a data version other than main)

The writer and readers take a topic's Kafka name: a data version's copy of a topic
(``version.<name>.<topic>``, ``arena.versions``) has the registry topic's schema and lives in the
version's folder, so ``main``'s files are never touched by a replay.

Each topic's Arrow schema is derived from its pydantic value model: meta columns first
(``_key``, ``_partition``, ``_offset``, ``_timestamp``, ``_headers``, ``_valid``, ``_error``,
``_raw``), then one column per model field. A value that is not UTF-8 JSON or does not
validate still lands in the lake, as a ``_valid = false`` row with the reason and raw text:
the lake is the record of what was on the topic, so it never drops or raises on bad data.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import threading
import types
import typing
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from arena.topics import TOPICS
from arena.topics import topic as topic_spec
from arena.versions import MAIN, split_wire, wire
from lake.store import CLAIM_ERROR_HEADER, LocalStore, ObjectStore

if TYPE_CHECKING:  # SQLModel and SQLAlchemy (~0.7 s): the sink's cost, not `arena lake query`'s
    from lake.catalog import Catalog, LineageEdge

log = logging.getLogger(__name__)

META_FIELDS: tuple[pa.Field, ...] = (
    pa.field("_key", pa.string(), nullable=False),
    pa.field("_partition", pa.int32(), nullable=False),
    pa.field("_offset", pa.int64(), nullable=False),
    pa.field("_timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
    pa.field("_headers", pa.string(), nullable=False),
    pa.field("_valid", pa.bool_(), nullable=False),
    pa.field("_error", pa.string()),
    pa.field("_raw", pa.string()),
)
META_COLUMNS = tuple(f.name for f in META_FIELDS)

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_MAX_ERROR_CHARS = 2000

ColumnKind = Literal["string", "enum", "int", "float", "bool", "datetime", "json"]
_ARROW_TYPES: dict[ColumnKind, pa.DataType] = {
    "string": pa.string(),
    "enum": pa.string(),
    "int": pa.int64(),
    "float": pa.float64(),
    "bool": pa.bool_(),
    "datetime": pa.timestamp("us", tz="UTC"),
    "json": pa.string(),
}


# Records -------------------------------------------------------------------
class LakeRow(BaseModel):
    """One Kafka record as the lake sink hands it to the writer."""

    model_config = ConfigDict(frozen=True)

    key: str = Field(description="Record key (a content hash): the lake de-duplicates on it.")
    topic: str
    partition: int = Field(ge=0, lt=2**31)
    offset: int = Field(ge=0, le=_INT64_MAX)
    timestamp_ms: int = Field(ge=-1, le=253_402_300_799_999, description="Kafka timestamp (-1: none).")
    headers: dict[str, str] = Field(default_factory=dict)
    value: bytes

    @field_validator("headers", mode="before")
    @classmethod
    def _decode_headers(cls, v: Any) -> Any:
        """Accept Kafka's ``[(name, bytes)]`` or ``{name: bytes}`` as well as plain strings."""
        if v is None:
            return {}
        items = v.items() if isinstance(v, dict) else v
        out: dict[str, str] = {}
        for name, raw in items:
            if raw is None:
                continue
            out[str(name)] = (
                raw.decode("utf-8", "replace") if isinstance(raw, bytes | bytearray) else str(raw)
            )
        return out

    @property
    def date(self) -> str:
        """UTC date of the record's timestamp, the lake's date partition."""
        return datetime.fromtimestamp(max(self.timestamp_ms, -1) / 1000, UTC).date().isoformat()


class WriteResult(BaseModel):
    """What one ``LakeWriter.write`` call did."""

    files: list[str] = Field(default_factory=list, description="Paths written, relative to the lake root.")
    written: int = Field(0, description="Rows written (new keys).")
    skipped_duplicates: int = Field(
        0, description="Rows dropped: key already in the lake or repeated in the batch."
    )
    invalid: int = Field(0, description="Written rows whose value did not validate (_valid = false).")


class TopicListing(BaseModel):
    """Size of one topic in the lake."""

    topic: str
    files: int
    rows: int
    bytes: int


# Schema derivation ---------------------------------------------------------
def _column_kind(annotation: Any) -> tuple[ColumnKind, bool]:
    """Arrow column kind of a pydantic field annotation, and whether it is Optional."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _column_kind(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        kinds = {_column_kind(a)[0] for a in args}
        if len(kinds) == 1:
            kind = kinds.pop()
        elif kinds == {"int", "float"}:
            kind = "float"
        else:
            kind = "json"  # a mixed union has no one Arrow type: keep it as JSON
        return kind, optional
    if origin is Literal:
        values = typing.get_args(annotation)
        if all(isinstance(v, str) for v in values):
            return "string", False
        if all(isinstance(v, bool) for v in values):
            return "bool", False
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return "int", False
        return "json", False
    if isinstance(annotation, type):
        if issubclass(annotation, Enum):
            return "enum", False
        if issubclass(annotation, bool):  # before int: bool is an int subclass
            return "bool", False
        if issubclass(annotation, int):
            return "int", False
        if issubclass(annotation, float):
            return "float", False
        if issubclass(annotation, str):
            return "string", False
        if issubclass(annotation, datetime):
            return "datetime", False
    return "json", False


def _model_columns(model: type[BaseModel]) -> list[tuple[str, ColumnKind, bool, str]]:
    cols = []
    for name, info in model.model_fields.items():
        kind, optional = _column_kind(info.annotation)
        cols.append((name, kind, optional, info.description or ""))
    return cols


def arrow_schema(topic: str) -> pa.Schema:
    """The lake schema of ``topic``: meta columns, then one column per value-model field.

    Field columns are always nullable in Arrow because invalid rows null them; whether the
    model field itself is Optional is kept in the field metadata (``optional``), with the
    field's description and ``encoding: json`` for columns holding JSON text.
    """
    spec = topic_spec(split_wire(topic)[1])
    fields = list(META_FIELDS)
    for name, kind, optional, description in _model_columns(spec.value):
        meta = {"optional": str(optional).lower(), "description": description}
        if kind == "json":
            meta["encoding"] = "json"
        fields.append(pa.field(name, _ARROW_TYPES[kind], nullable=True, metadata=meta))
    return pa.schema(
        fields,
        metadata={
            "arena.topic": spec.name,
            "arena.model": f"{spec.value.__module__}.{spec.value.__qualname__}",
        },
    )


def topic_prefix(topic: str) -> str:
    """Folder prefix of a topic's files in the lake (a data version's copy: in the version's folder)."""
    version, base = split_wire(topic)
    return f"topic={base}/" if version == MAIN else f"version={version}/topic={base}/"


def version_prefix(version: str) -> str:
    """Folder of every file of data ``version`` (not main: its files are the top-level topics)."""
    return f"version={version}/"


# Value conversion ----------------------------------------------------------
def _to_utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _convert(kind: ColumnKind, py: Any, js: Any) -> Any:
    """Arrow-ready value of one field from its python-mode (``py``) and JSON-mode (``js``) dumps."""
    if py is None:
        return None
    if kind == "json":
        return _json_text(js)
    if kind == "enum":
        raw = py.value if isinstance(py, Enum) else py
        return raw if isinstance(raw, str) else _json_text(js)
    if kind == "string":
        return str(py)
    if kind == "bool":
        return bool(py)
    if kind == "int":
        if not _INT64_MIN <= int(py) <= _INT64_MAX:
            raise ValueError(f"integer {py} does not fit int64")
        return int(py)
    if kind == "float":
        return float(py)
    if kind == "datetime":
        return _to_utc(py)
    raise AssertionError(kind)


def _validation_reason(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False)
    if any(e["type"] == "json_invalid" for e in errors):
        return "invalid JSON: " + "; ".join(e["msg"] for e in errors)
    parts = [f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in errors]
    return f"schema violation ({len(errors)} error(s)): " + "; ".join(parts)


class _TopicCodec:
    """Turns raw values of one topic into Arrow columns."""

    def __init__(self, topic: str) -> None:
        self.spec = topic_spec(split_wire(topic)[1])
        self.schema = arrow_schema(topic)
        self.columns = [(name, kind) for name, kind, _opt, _desc in _model_columns(self.spec.value)]

    def decode(self, value: bytes) -> tuple[dict[str, Any] | None, str | None]:
        """Field values of a valid record, or ``(None, reason)``; never raises."""
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, f"not UTF-8: {exc}"
        try:
            model = self.spec.value.model_validate_json(text)
        except ValidationError as exc:
            return None, _validation_reason(exc)[:_MAX_ERROR_CHARS]
        try:
            py = model.model_dump(mode="python")
            js = model.model_dump(mode="json")
            return {name: _convert(kind, py.get(name), js.get(name)) for name, kind in self.columns}, None
        except Exception as exc:  # e.g. an int beyond int64: still keep the record, as invalid
            return None, f"not representable in the lake schema: {exc}"[:_MAX_ERROR_CHARS]

    def table(self, rows: list[LakeRow]) -> tuple[pa.Table, int]:
        """Arrow table of ``rows`` (in order) and how many of them are invalid."""
        cols: dict[str, list[Any]] = {f.name: [] for f in self.schema}
        invalid = 0
        for row in rows:
            claim_error = row.headers.get(CLAIM_ERROR_HEADER)  # the lake sink could not read its claim
            fields, error = (None, f"claim error: {claim_error}") if claim_error else self.decode(row.value)
            cols["_key"].append(row.key)
            cols["_partition"].append(row.partition)
            cols["_offset"].append(row.offset)
            cols["_timestamp"].append(row.timestamp_ms)
            cols["_headers"].append(_json_text(dict(sorted(row.headers.items()))))
            cols["_valid"].append(error is None)
            cols["_error"].append(error)
            cols["_raw"].append(None if error is None else row.value.decode("utf-8", "replace"))
            if error is not None:
                invalid += 1
            for name, _kind in self.columns:
                cols[name].append(fields[name] if fields is not None else None)
        return pa.Table.from_pydict(cols, schema=self.schema), invalid


def row_value(topic: str, row: dict[str, Any]) -> bytes:
    """The record value a lake row of ``topic`` holds: the inverse of ``_TopicCodec.table``.

    An invalid row gives back its raw text; a valid one its fields, validated and encoded as the
    record's JSON (what the stage sent, for Arena's value models). Raises ``ValueError`` when the
    fields do not rebuild a record (a file written under an older model).
    """
    if not row.get("_valid", True):
        return str(row.get("_raw") or "").encode("utf-8")
    spec = topic_spec(split_wire(topic)[1])
    fields: dict[str, Any] = {}
    for name, kind, _optional, _description in _model_columns(spec.value):
        value = row.get(name)
        fields[name] = json.loads(value) if kind == "json" and isinstance(value, str) else value
    try:
        return spec.value.model_validate(fields).model_dump_json().encode("utf-8")
    except ValidationError as exc:
        raise ValueError(f"its fields do not rebuild a {spec.value.__name__}: {exc.errors()[:2]}") from None


# Lineage -------------------------------------------------------------------
def lineage_edges(topic: str, row: LakeRow) -> list[LineageEdge]:
    """Catalog edges from a row's ``arena-*`` headers (one per ``arena-source-ids`` parent)."""
    from lake.catalog import LineageEdge

    h = row.headers
    parents = [p.strip() for p in h.get("arena-source-ids", "").split(",") if p.strip()]
    if not parents:
        return []
    try:
        at = _to_utc(datetime.fromisoformat(h["arena-time"]))
    except (KeyError, ValueError):
        at = datetime.fromtimestamp(max(row.timestamp_ms, 0) / 1000, UTC)
    return [
        LineageEdge(
            child_key=row.key,
            child_topic=topic,
            parent_key=parent,
            stage=h.get("arena-stage", "?"),
            stage_version=h.get("arena-stage-version", "?"),
            prompt_version=h.get("arena-prompt-version"),
            backend=h.get("arena-backend"),
            model=h.get("arena-model"),
            at=at,
        )
        for parent in dict.fromkeys(parents)  # ordered de-duplication
    ]


# Writer --------------------------------------------------------------------
def _content_hash(rows: Iterable[LakeRow]) -> str:
    """Hash of the rows' keys and values: a replayed batch gets the very same file name."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(row.key.encode())
        digest.update(b"\0")
        digest.update(row.value)
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def _parquet_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


class LakeWriter:
    """Writes batches of topic records as Parquet files, at most once per key.

    Keys already in the lake are loaded once per topic per process (from the ``_key`` column
    of the topic's files), so replaying a batch after a crash adds nothing. One writer per
    topic at a time is assumed (the lake sink's consumer group guarantees it); two concurrent
    writers could each add a key once, which readers can still de-duplicate on ``_key``.
    """

    def __init__(
        self, store: ObjectStore, catalog: Catalog | None = None, *, run_id: str | None = None
    ) -> None:
        self.store = store
        self.catalog = catalog
        self.run_id = run_id
        self._keys: dict[str, set[str]] = {}
        self._codecs: dict[str, _TopicCodec] = {}
        self._lock = threading.Lock()

    def _codec(self, topic: str) -> _TopicCodec:
        if topic not in self._codecs:
            self._codecs[topic] = _TopicCodec(topic)
        return self._codecs[topic]

    def known_keys(self, topic: str) -> set[str]:
        """Keys of ``topic`` already in the lake (loaded from its files on first use).

        A file written by a sink killed before it registered the file in the catalog is registered
        here (the keys are durable once the file is: its rows will not be written again).
        """
        if topic not in self._keys:
            keys: set[str] = set()
            registered = {a.path for a in self.catalog.artifacts(topic)} if self.catalog is not None else None
            for path in _topic_files(self.store, topic):
                table = _read_parquet(self.store, path, columns=["_key", "_partition", "_offset"])
                keys.update(table.column("_key").to_pylist())
                if registered is not None and path not in registered and table.num_rows:
                    self._register_found(topic, path, table)
            self._keys[topic] = keys
        return self._keys[topic]

    def _register_found(self, topic: str, path: str, table: pa.Table) -> None:
        assert self.catalog is not None
        offsets = table.column("_offset").to_pylist()
        self.catalog.record_artifact(
            topic=topic,
            path=path,
            rows=table.num_rows,
            nbytes=self.store.size(path),
            partition=int(table.column("_partition")[0].as_py()),
            min_offset=min(offsets),
            max_offset=max(offsets),
            run_id=self.run_id,
        )

    def write(self, topic: str, rows: list[LakeRow]) -> WriteResult:
        """Write the rows whose keys are new; one file per (UTC date, partition) of the batch."""
        topic_spec(split_wire(topic)[1])  # unknown topic: KeyError with the known names
        wrong = {r.topic for r in rows} - {topic}
        if wrong:
            raise ValueError(f"rows of topic(s) {sorted(wrong)} passed to write({topic!r})")
        with self._lock:
            known = self.known_keys(topic)
            fresh: list[LakeRow] = []
            skipped: list[LakeRow] = []
            batch_keys: set[str] = set()
            for row in rows:
                if row.key in known or row.key in batch_keys:
                    skipped.append(row)
                    continue
                batch_keys.add(row.key)
                fresh.append(row)
            result = WriteResult(skipped_duplicates=len(skipped))
            if self.catalog is not None and skipped:
                # A replay after a sink was killed between a file and its catalog rows: the rows are
                # in the lake, their lineage may not be (edges are idempotent).
                edges = [edge for row in skipped for edge in lineage_edges(topic, row)]
                if edges:
                    self.catalog.record_lineage(edges)

            groups: dict[tuple[str, int], list[LakeRow]] = defaultdict(list)
            for row in fresh:
                groups[(row.date, row.partition)].append(row)
            codec = self._codec(topic)
            for (day, partition), group in sorted(groups.items()):
                group.sort(key=lambda r: r.offset)
                table, invalid = codec.table(group)
                data = _parquet_bytes(table)
                path = (
                    f"{topic_prefix(topic)}date={day}/"
                    f"part-{partition}-{group[0].offset:012d}-{_content_hash(group)}.parquet"
                )
                self.store.put(path, data)
                # Only now are the keys durable: a crash before this point replays cleanly.
                known.update(r.key for r in group)
                result.files.append(path)
                result.written += len(group)
                result.invalid += invalid
                if self.catalog is not None:
                    self._register(topic, path, group, len(data))
        return result

    def _register(self, topic: str, path: str, group: list[LakeRow], nbytes: int) -> None:
        assert self.catalog is not None
        self.catalog.record_artifact(
            topic=topic,
            path=path,
            rows=len(group),
            nbytes=nbytes,
            partition=group[0].partition,
            min_offset=group[0].offset,
            max_offset=group[-1].offset,
            run_id=self.run_id,
        )
        edges = [edge for row in group for edge in lineage_edges(topic, row)]
        if edges:
            self.catalog.record_lineage(edges)


# Readers -------------------------------------------------------------------
def _topic_files(store: ObjectStore, topic: str) -> list[str]:
    return [p for p in store.list(topic_prefix(topic)) if p.endswith(".parquet")]


def _read_parquet(store: ObjectStore, path: str, columns: list[str] | None = None) -> pa.Table:
    if isinstance(store, LocalStore):
        return pq.read_table(store.local_path(path), columns=columns)
    return pq.read_table(io.BytesIO(store.get(path)), columns=columns)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns: missing ones null, extra ones dropped.

    Lets files written under an older value model be read with the current schema.
    """
    arrays = []
    for field in schema:
        if field.name in table.column_names:
            arrays.append(table.column(field.name).cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    nullable = pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)
    return pa.Table.from_arrays(arrays, schema=nullable)


def topic_dataset(store: LocalStore, topic: str, paths: list[str] | None = None) -> ds.Dataset:
    """A lazy Arrow dataset over a local topic's files (all of them unless ``paths``)."""
    files = _topic_files(store, topic) if paths is None else paths
    return ds.dataset([str(store.local_path(p)) for p in files], schema=arrow_schema(topic), format="parquet")


def read_topic_files(store: ObjectStore, topic: str, paths: list[str]) -> pa.Table:
    """Rows of the given files of ``topic``, conformed to the current schema."""
    schema = arrow_schema(topic)
    if not paths:
        return schema.empty_table()
    if isinstance(store, LocalStore):
        local = [str(store.local_path(p)) for p in paths]
        return ds.dataset(local, schema=schema, format="parquet").to_table()
    return pa.concat_tables([conform(_read_parquet(store, p), schema) for p in paths])


def read_topic(store: ObjectStore, topic: str) -> pa.Table:
    """Every row of ``topic`` in the lake (an empty table with the schema when there is none)."""
    return read_topic_files(store, topic, _topic_files(store, topic))


def read_rows(
    store: ObjectStore, topic: str, keys: Iterable[str], columns: list[str]
) -> dict[str, dict[str, Any]]:
    """``columns`` of the rows of ``topic`` whose key is one of ``keys``, by key.

    Local lakes read only those columns and rows (the key filter is pushed into the scan); a
    column an older file lacks reads as None.
    """
    wanted = sorted(set(keys))
    paths = _topic_files(store, topic)
    if not wanted or not paths:
        return {}
    schema = arrow_schema(topic)
    names = ["_key", *columns]
    match = ds.field("_key").isin(wanted)
    if isinstance(store, LocalStore):
        local = [str(store.local_path(p)) for p in paths]
        table = ds.dataset(local, schema=schema, format="parquet").to_table(columns=names, filter=match)
    else:
        table = ds.dataset(read_topic_files(store, topic, paths)).to_table(columns=names, filter=match)
    return {row["_key"]: row for row in table.to_pylist()}


def lake_files(store: ObjectStore) -> dict[str, list[str]]:
    """Parquet files per topic, by the topic's Kafka name (a data version's: ``version.<v>.<topic>``)."""
    per_topic: dict[str, list[str]] = defaultdict(list)
    for path in [*store.list("topic="), *store.list("version=")]:
        if not path.endswith(".parquet"):
            continue
        parts = path.split("/")
        if parts[0].startswith("version=") and len(parts) > 1:
            name = wire(parts[1].removeprefix("topic="), parts[0].removeprefix("version="))
        else:
            name = parts[0].removeprefix("topic=")
        per_topic[name].append(path)
    return per_topic


def lake_listing(store: ObjectStore) -> list[TopicListing]:
    """Files, rows and bytes per topic present in the lake (rows from Parquet footers)."""
    per_topic = lake_files(store)
    listings = []
    for name, paths in sorted(per_topic.items()):
        rows = nbytes = 0
        for path in paths:
            if isinstance(store, LocalStore):
                local = store.local_path(path)
                rows += pq.read_metadata(local).num_rows
                nbytes += local.stat().st_size
            else:
                data = store.get(path)
                rows += pq.read_metadata(io.BytesIO(data)).num_rows
                nbytes += len(data)
        listings.append(TopicListing(topic=name, files=len(paths), rows=rows, bytes=nbytes))
    return listings


def known_topics() -> list[str]:
    """Every topic name the lake may hold."""
    return list(TOPICS)

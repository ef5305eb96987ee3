"""LanceDB index of tool docs, for semantic tool search and irrelevant-tool mixing.

The table declares its embedding function by a registered name (``arena-minilm``) that calls
``arena.embed.embed_texts``. LanceDB stores that declaration in the table's schema metadata;
because the function takes no arguments, the metadata holds no model path, so a table built on
one machine opens on another whose model lives elsewhere.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import lancedb
import pyarrow as pa
from lancedb.embeddings import EmbeddingFunctionConfig, TextEmbeddingFunction, get_registry, register

from arena.embed import DIM, embed_texts
from arena.records.tools import ToolServer
from arena.retry import RetryPolicy, call_with_retry

if TYPE_CHECKING:
    from arena.config import ArenaSettings

log = logging.getLogger(__name__)

EMBEDDING_NAME = "arena-minilm"
TABLE = "tools"
LANCE_WRITES = RetryPolicy(attempts=6, base_s=0.2, max_s=5.0)
"""Tries of a LanceDB write that lost a commit race to another writer (each retry re-reads the table)."""


@register(EMBEDDING_NAME)
class ArenaMiniLM(TextEmbeddingFunction):
    """all-MiniLM-L6-v2 from the packaged weights, L2-normalised (cosine = dot product)."""

    def ndims(self) -> int:
        return DIM

    def generate_embeddings(self, texts: Any, *args: Any, **kwargs: Any) -> list[Any]:
        return list(embed_texts([str(t) for t in texts]))  # one float32 row per text


def _embedding() -> ArenaMiniLM:
    # create() (not the constructor) records the arguments LanceDB serialises: none at all.
    return get_registry().get(EMBEDDING_NAME).create()  # type: ignore[no-any-return]


def tools_schema() -> pa.Schema:
    """Columns of the ``tools`` table (without the embedding metadata LanceDB adds)."""
    return pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("server_id", pa.string(), nullable=False),
            pa.field("server", pa.string(), nullable=False),
            pa.field("domain", pa.string(), nullable=False),
            pa.field("tool", pa.string(), nullable=False),
            pa.field("description", pa.string(), nullable=False),
            pa.field("text", pa.string(), nullable=False),
            pa.field("vector", pa.list_(pa.float32(), DIM)),
        ]
    )


def tool_text(name: str, description: str) -> str:
    """What gets embedded for a tool: its name and its description."""
    return f"{name}: {description}".strip()


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def s3_storage_options(creds: dict[str, str]) -> dict[str, str]:
    """LanceDB (object_store) options for an S3-compatible endpoint; contains secrets, never log."""
    options = {
        "aws_endpoint": creds["endpoint"],
        "aws_access_key_id": creds["access_key"],
        "aws_secret_access_key": creds["secret_key"],
        "aws_region": creds.get("region") or "us-east-1",
    }
    if creds["endpoint"].startswith("http://"):
        options["allow_http"] = "true"  # local MinIO/SeaweedFS speak plain HTTP
    return options


def lancedb_storage_options(settings: ArenaSettings) -> dict[str, str] | None:
    """Storage options for the settings' LanceDB URI: S3 credentials for s3://, none for a folder."""
    return s3_storage_options(settings.s3_credentials()) if settings.lancedb.startswith("s3://") else None


class ToolIndex:
    """The ``tools`` table of a LanceDB database (a folder or ``s3://bucket/prefix``)."""

    def __init__(
        self,
        uri: str,
        storage_options: dict[str, str] | None = None,
        *,
        read_consistency_s: float = 0.0,
        retry: RetryPolicy = LANCE_WRITES,
    ) -> None:
        self.uri = uri
        self.retry = retry
        # LanceDB otherwise never re-reads a table it has opened: a long-lived searcher would
        # miss what the indexer worker adds. 0 = check for a newer version on every read.
        self._db = lancedb.connect(
            uri,
            storage_options=storage_options,
            read_consistency_interval=timedelta(seconds=read_consistency_s),
        )
        self._table: Any = None

    def __repr__(self) -> str:  # storage options carry credentials: never show them
        return f"ToolIndex({self.uri!r})"

    @classmethod
    def from_settings(cls, settings: ArenaSettings) -> ToolIndex:
        return cls(settings.lancedb, lancedb_storage_options(settings))

    def _open(self, create: bool) -> Any:
        if self._table is None:
            try:
                self._table = self._db.open_table(TABLE)
            except ValueError:  # "Table 'tools' was not found"
                if not create:
                    return None
                self._table = self._db.create_table(
                    TABLE,
                    schema=tools_schema(),
                    embedding_functions=[
                        EmbeddingFunctionConfig(
                            source_column="text", vector_column="vector", function=_embedding()
                        )
                    ],
                    exist_ok=True,  # another worker may create it at the same time
                )
        return self._table

    def table(self) -> Any:
        """The LanceDB table (created empty if missing)."""
        return self._open(create=True)

    def upsert(self, server: ToolServer) -> int:
        """Index every tool of ``server``; returns rows inserted or changed (0 when up to date).

        A write that lost a commit race (another worker wrote the table first) is tried again on
        the table's latest version (``self.retry``); any other error is raised at once.
        """
        return call_with_retry(
            lambda: self._upsert(server),
            self.retry,
            what=f"tool index upsert of {server.server_id}",
            on_retry=self._reopen,
        )

    def _reopen(self, exc: BaseException) -> None:
        self._table = None  # the next try opens the table at its latest version

    def _upsert(self, server: ToolServer) -> int:
        rows = [
            {
                "id": f"{server.server_id}/{tool.function.name}",
                "server_id": server.server_id,
                "server": server.name,
                "domain": server.domain,
                "tool": tool.function.name,
                "description": tool.function.description,
                "text": tool_text(tool.function.name, tool.function.description),
            }
            for tool in server.tools
        ]
        rows = list({r["id"]: r for r in rows}.values())
        table = self.table()
        # Skip rows already indexed with the same content: no re-embedding, no new version.
        ids = ", ".join(_sql_str(r["id"]) for r in rows)
        existing = (
            table.search()
            .where(f"id IN ({ids})")
            .select(["id", "text", "server", "domain"])
            .limit(len(rows))
            .to_list()
            if rows
            else []
        )
        current = {e["id"]: (e["text"], e["server"], e["domain"]) for e in existing}
        changed = [r for r in rows if current.get(r["id"]) != (r["text"], r["server"], r["domain"])]
        if not changed:
            return 0
        table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(changed)
        return len(changed)

    def search(self, text: str, k: int = 5) -> list[dict[str, Any]]:
        """The ``k`` tools nearest to ``text``; each with ``score`` = cosine similarity."""
        table = self._open(create=False)
        if table is None:
            return []
        hits = (
            table.search(text, vector_column_name="vector")
            .distance_type("cosine")
            .select(["id", "server_id", "server", "domain", "tool", "description", "_distance"])
            .limit(k)
            .to_list()
        )
        out = []
        for hit in hits:
            distance = float(hit.pop("_distance"))
            hit.pop("vector", None)
            hit["score"] = 1.0 - distance
            out.append(hit)
        return out

    def count(self) -> int:
        """Rows in the index (0 when the table does not exist yet)."""
        table = self._open(create=False)
        return 0 if table is None else int(table.count_rows())

"""Object stores for the artifact lake: a local folder or any S3 endpoint (MinIO, SeaweedFS, AWS).

Paths are relative, ``/``-separated keys (``topic=chains/date=2026-11-21/part-...parquet``).
Every ``put`` is atomic: a reader sees either the old object or the whole new one, never a
partial file, so the lake never holds half-written Parquet.

``ClaimCheck`` keeps record values too large for the broker: the value is stored once under
``claims/<sha256>`` and the record carries a ``Claim`` (key, size, hash), checked on read.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Protocol, runtime_checkable
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError

if TYPE_CHECKING:
    from arena.config import ArenaSettings

log = logging.getLogger(__name__)

# ``list`` is a method name on the stores, so annotate its result through an alias.
PathList = list[str]

_TMP_PREFIX = ".tmp-"
"""Local temp files start with this; listings skip them so readers never see partial writes."""

_MISSING_CODES = frozenset({"NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"})


def clean_path(path: str) -> str:
    """Normalise a relative object path and refuse anything that could escape the store root."""
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts) or path.startswith("/"):
        raise ValueError(f"invalid object path {path!r}: must be relative, without '..'")
    return "/".join(parts)


@runtime_checkable
class ObjectStore(Protocol):
    """What the lake needs from storage; keys are relative ``/``-separated paths."""

    url: str
    """Where the store points, without credentials (``file:///...`` or ``s3://bucket/prefix``)."""

    def put(self, path: str, data: bytes) -> None:
        """Write ``data`` atomically (replacing any previous object)."""
        ...

    def get(self, path: str) -> bytes:
        """Read a whole object; ``FileNotFoundError`` when missing."""
        ...

    def list(self, prefix: str = "") -> PathList:
        """All object paths starting with ``prefix`` (recursive, relative, sorted)."""
        ...

    def exists(self, path: str) -> bool:
        """Whether an object is at ``path``."""
        ...

    def delete(self, path: str) -> None:
        """Remove an object; deleting a missing object is not an error."""
        ...

    def size(self, path: str) -> int:
        """Object size in bytes; ``FileNotFoundError`` when missing."""
        ...


class LocalStore:
    """A folder on the local file system."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def local_path(self, path: str) -> Path:
        """Absolute file path of an object (lets Arrow/DuckDB read files in place)."""
        return self.root / clean_path(path)

    def put(self, path: str, data: bytes) -> None:
        target = self.local_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        # Temp file in the same directory so os.replace is a same-filesystem atomic rename.
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_TMP_PREFIX)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def get(self, path: str) -> bytes:
        return self.local_path(path).read_bytes()

    def list(self, prefix: str = "") -> PathList:
        # Prefix semantics match S3 (plain string prefix), so walk from the deepest folder
        # the prefix names and filter.
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root / head if head else self.root
        if not start.is_dir():
            return []
        found: PathList = []
        for dirpath, _dirs, files in os.walk(start):
            for name in files:
                if name.startswith(_TMP_PREFIX):
                    continue
                rel = Path(dirpath, name).relative_to(self.root).as_posix()
                if rel.startswith(prefix):
                    found.append(rel)
        return sorted(found)

    def exists(self, path: str) -> bool:
        return self.local_path(path).is_file()

    def delete(self, path: str) -> None:
        self.local_path(path).unlink(missing_ok=True)

    def size(self, path: str) -> int:
        return self.local_path(path).stat().st_size


class S3Store:
    """A bucket (and optional key prefix) on an S3-compatible server, through the MinIO client."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str,
        access_key: str,
        secret_key: str,
        region: str = "us-east-1",
    ) -> None:
        parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
        if not parsed.netloc:
            raise ValueError(f"S3 endpoint needs a host: {endpoint!r}")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint = f"{parsed.scheme}://{parsed.netloc}"
        self.url = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        # Imported here: the MinIO client (~0.3 s) is only an S3 lake's cost, and every stage
        # process and CLI command imports this module for the claim checks and the local lake.
        from minio import Minio

        # The client holds the secrets; this object's repr never shows them.
        self._client = Minio(
            parsed.netloc,
            access_key=access_key or None,
            secret_key=secret_key or None,
            secure=parsed.scheme == "https",
            region=region,
        )
        self._ensure_bucket()

    def __repr__(self) -> str:
        return f"S3Store({self.url!r}, endpoint={self.endpoint!r})"

    def _ensure_bucket(self) -> None:
        from minio.error import S3Error

        if self._client.bucket_exists(self.bucket):
            return
        try:
            self._client.make_bucket(self.bucket)
            log.info("created bucket %s at %s", self.bucket, self.endpoint)
        except S3Error as exc:
            # Another worker may have created it between our check and our call.
            if exc.code not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _key(self, path: str) -> str:
        key = clean_path(path)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put(self, path: str, data: bytes) -> None:
        # A single PUT is atomic on S3: the object appears whole or not at all.
        self._client.put_object(self.bucket, self._key(path), io.BytesIO(data), len(data))

    def get(self, path: str) -> bytes:
        from minio.error import S3Error

        try:
            resp = self._client.get_object(self.bucket, self._key(path))
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                raise FileNotFoundError(f"{self.url}/{path}") from None
            raise
        try:
            return resp.read()
        finally:
            resp.close()
            resp.release_conn()

    def list(self, prefix: str = "") -> PathList:
        base = f"{self.prefix}/" if self.prefix else ""
        objects = self._client.list_objects(self.bucket, prefix=base + prefix, recursive=True)
        return sorted(
            o.object_name[len(base) :] for o in objects if o.object_name is not None and not o.is_dir
        )

    def exists(self, path: str) -> bool:
        from minio.error import S3Error

        try:
            self._client.stat_object(self.bucket, self._key(path))
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                return False
            raise
        return True

    def delete(self, path: str) -> None:
        self._client.remove_object(self.bucket, self._key(path))

    def size(self, path: str) -> int:
        from minio.error import S3Error

        try:
            stat = self._client.stat_object(self.bucket, self._key(path))
        except S3Error as exc:
            if exc.code in _MISSING_CODES:
                raise FileNotFoundError(f"{self.url}/{path}") from None
            raise
        return int(stat.size or 0)


def store_from_url(
    url: str,
    *,
    endpoint: str = "",
    access_key: str = "",
    secret_key: str = "",
    region: str = "us-east-1",
) -> ObjectStore:
    """A store for ``file:///path`` or ``s3://bucket/prefix`` (S3 needs ``endpoint``)."""
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return LocalStore(Path(parsed.netloc + parsed.path))
    if parsed.scheme == "s3":
        if not endpoint:
            raise ValueError("an s3:// lake needs an S3 endpoint (ARENA_S3_ENDPOINT)")
        return S3Store(
            parsed.netloc,
            parsed.path,
            endpoint=endpoint,
            access_key=access_key,
            secret_key=secret_key,
            region=region,
        )
    raise ValueError(f"lake URL must start with file:// or s3://, got {url!r}")


def open_store(settings: ArenaSettings) -> ObjectStore:
    """The lake store ``settings.lake`` points at."""
    creds = settings.s3_credentials()
    return store_from_url(
        settings.lake,
        endpoint=creds["endpoint"],
        access_key=creds["access_key"],
        secret_key=creds["secret_key"],
        region=creds["region"],
    )


# Claim check ---------------------------------------------------------------
CLAIM_PREFIX = "claims/"
"""Store folder of claimed record values: ``claims/<sha256 of the value>``."""
CLAIM_HEADER = "arena-claim"
"""Header of a record whose value is in the store: the ``Claim`` as JSON."""
CLAIM_ERROR_HEADER = "arena-claim-error"
"""Set by the lake sink on a row whose claim could not be read: why (the row is kept as invalid)."""

Headers = Sequence[tuple[str, bytes]]
"""Kafka record headers: ``(name, value)`` pairs."""


class Claim(BaseModel):
    """A reference to a record value kept in the object store instead of on the broker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: Annotated[
        str,
        Field(
            pattern=r"^claims/[0-9a-f]{64}$",
            description="Object key of the value in the lake's store: claims/<sha256>.",
        ),
    ]
    size: Annotated[int, Field(ge=0, description="Length of the value in bytes.")]
    sha256: Annotated[
        str, Field(pattern=r"^[0-9a-f]{64}$", description="SHA-256 of the value (hex); checked on read.")
    ]

    @classmethod
    def of(cls, data: bytes) -> Claim:
        """The claim that ``data`` gets: its hash names its object, so one value is stored once."""
        digest = hashlib.sha256(data).hexdigest()
        return cls(key=f"{CLAIM_PREFIX}{digest}", size=len(data), sha256=digest)


class ClaimError(Exception):
    """A claim that cannot be honoured: malformed, its object missing, or not matching its hash."""


class ClaimCheck:
    """Values larger than ``threshold`` bytes go to the object store once, and travel as a ``Claim``.

    ``store`` is an ``ObjectStore`` or a function that opens one; a function is called on the
    first large value only, so a process that only ever sends small records touches no store.
    """

    def __init__(self, store: ObjectStore | Callable[[], ObjectStore], threshold: int) -> None:
        if threshold < 1:
            raise ValueError("claim threshold must be at least 1 byte")
        self.threshold = threshold
        self._store = store if isinstance(store, ObjectStore) else None
        self._open = None if isinstance(store, ObjectStore) else store
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: ArenaSettings) -> ClaimCheck:
        """Claims in the lake ``settings`` points at, above ``settings.claim_threshold_bytes``."""
        return cls(lambda: open_store(settings), settings.claim_threshold_bytes)

    @property
    def store(self) -> ObjectStore:
        with self._lock:
            if self._store is None:
                assert self._open is not None
                self._store = self._open()
            return self._store

    def needs_claim(self, data: bytes) -> bool:
        return len(data) > self.threshold

    def check_in(self, data: bytes) -> Claim:
        """Store ``data`` under its hash (atomic; skipped when that object is already whole there)."""
        claim = Claim.of(data)
        store = self.store
        try:
            present = store.size(claim.key) == claim.size
        except FileNotFoundError:
            present = False
        if not present:
            store.put(claim.key, data)
        return claim

    def check_out(self, claim: Claim) -> bytes:
        """The value ``claim`` names, verified; ``ClaimError`` when it is missing or corrupt.

        Other store failures (S3 unreachable) propagate: the record is fine, the store is not.
        """
        store = self.store
        try:
            data = store.get(claim.key)
        except FileNotFoundError:
            raise ClaimError(f"claimed value {claim.key} is missing from the lake {store.url}") from None
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != claim.size or digest != claim.sha256:
            raise ClaimError(
                f"claimed value {claim.key} in {store.url} is corrupt: {len(data)} bytes with sha256 "
                f"{digest}, the record says {claim.size} bytes with sha256 {claim.sha256}"
            )
        return data

    async def check_in_async(self, data: bytes) -> Claim:
        """``check_in`` in a worker thread, so a large upload does not stall the event loop."""
        return await asyncio.to_thread(self.check_in, data)

    def seal(self, value: bytes, headers: Headers) -> tuple[bytes, list[tuple[str, bytes]]]:
        """A record's wire value and headers: ``value`` itself when small, else a claim to it."""
        if not self.needs_claim(value):
            return value, list(headers)
        return claimed_record(self.check_in(value), headers)

    async def seal_async(self, value: bytes, headers: Headers) -> tuple[bytes, list[tuple[str, bytes]]]:
        """``seal`` with the upload in a worker thread (small values never leave the loop)."""
        if not self.needs_claim(value):
            return value, list(headers)
        return claimed_record(await self.check_in_async(value), headers)


class ClaimEnvelope(BaseModel):
    """The small value a claimed record carries on the broker; the value itself is in the lake."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    arena_claim: Annotated[Claim, Field(description="Where the value is and how to check it.")]


def claimed_record(claim: Claim, headers: Headers) -> tuple[bytes, list[tuple[str, bytes]]]:
    """Envelope value and headers (``arena-claim`` added) of a record whose value is claimed."""
    value = ClaimEnvelope(arena_claim=claim).model_dump_json().encode("utf-8")
    kept = [(k, v) for k, v in headers if k != CLAIM_HEADER]
    return value, [*kept, (CLAIM_HEADER, claim.model_dump_json().encode("utf-8"))]


def header(headers: Headers | Mapping[str, bytes] | None, name: str) -> bytes | None:
    """The value of header ``name`` (the last one if repeated), from pairs or a mapping."""
    if not headers:
        return None
    if isinstance(headers, Mapping):
        found = headers.get(name)
        return bytes(found) if found is not None else None
    values = [v for k, v in headers if k == name]
    return bytes(values[-1]) if values and values[-1] is not None else None


def claim_of(headers: Headers | Mapping[str, bytes] | None) -> Claim | None:
    """The claim a record's headers carry, None when it carries its value itself."""
    raw = header(headers, CLAIM_HEADER)
    if raw is None:
        return None
    try:
        return Claim.model_validate_json(raw)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in problem["loc"]) or "<root>"
        raise ClaimError(
            f"the {CLAIM_HEADER} header is not a valid claim ({where}: {problem['msg']})"
        ) from None


def open_claim(
    value: bytes | None, headers: Headers | Mapping[str, bytes] | None, claims: ClaimCheck | None
) -> bytes:
    """A record's real value: ``value`` itself, or the verified value its claim names.

    ``ClaimError`` when the claim is malformed, missing or corrupt, or there is no ``claims``
    to read it with.
    """
    claim = claim_of(headers)
    if claim is None:
        return value or b""
    if claims is None:
        raise ClaimError(f"the record's value is claimed ({claim.key}) but this reader has no claim check")
    return claims.check_out(claim)


async def open_claim_async(
    value: bytes | None, headers: Headers | Mapping[str, bytes] | None, claims: ClaimCheck | None
) -> bytes:
    """``open_claim`` with the download in a worker thread (unclaimed values never leave the loop)."""
    if header(headers, CLAIM_HEADER) is None:
        return value or b""
    return await asyncio.to_thread(open_claim, value, headers, claims)

"""Object stores: the same contract on a local folder and on a real S3 server (SeaweedFS)."""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path

import pytest

from arena.config import ArenaSettings
from lake.store import LocalStore, ObjectStore, S3Store, open_store
from tests.fixtures.s3 import S3Server


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "lake")
    server: S3Server = request.getfixturevalue("s3_server")
    return S3Store(server.new_bucket(), "lake/v1", **_creds(server))


def _creds(server: S3Server) -> dict[str, str]:
    return {
        "endpoint": server.endpoint,
        "access_key": server.access_key,
        "secret_key": server.secret_key,
        "region": server.region,
    }


def test_put_get_list_exists_delete_size(store: ObjectStore) -> None:
    assert isinstance(store, ObjectStore)
    assert store.list() == []
    store.put("topic=a/date=2026-01-01/part-0.parquet", b"one")
    store.put("topic=a/date=2026-01-02/part-1.parquet", b"three")
    store.put("topic=ab/x.parquet", b"22")
    store.put("other.txt", b"")

    assert store.get("topic=a/date=2026-01-02/part-1.parquet") == b"three"
    assert store.size("topic=ab/x.parquet") == 2
    assert store.size("other.txt") == 0
    assert store.list() == [
        "other.txt",
        "topic=a/date=2026-01-01/part-0.parquet",
        "topic=a/date=2026-01-02/part-1.parquet",
        "topic=ab/x.parquet",
    ]
    # Prefixes are plain string prefixes, as on S3.
    assert store.list("topic=a/") == [
        "topic=a/date=2026-01-01/part-0.parquet",
        "topic=a/date=2026-01-02/part-1.parquet",
    ]
    assert store.list("topic=a") == [*store.list("topic=a/"), "topic=ab/x.parquet"]
    assert store.list("topic=a/date=2026-01-0") == store.list("topic=a/")
    assert store.list("nothing/") == []

    assert store.exists("other.txt")
    assert not store.exists("topic=a")  # a "folder" is not an object
    store.put("other.txt", b"replaced")
    assert store.get("other.txt") == b"replaced"
    store.delete("other.txt")
    store.delete("other.txt")  # deleting twice is fine
    assert not store.exists("other.txt")
    with pytest.raises(FileNotFoundError):
        store.get("other.txt")
    with pytest.raises(FileNotFoundError):
        store.size("other.txt")


def test_paths_cannot_escape(store: ObjectStore) -> None:
    for bad in ("../x", "a/../../x", "/etc/passwd", ""):
        with pytest.raises(ValueError):
            store.put(bad, b"x")


def test_puts_are_atomic_for_concurrent_readers(store: ObjectStore) -> None:
    """A reader racing a writer sees one whole version or the other, never a mix or a prefix."""
    size = 1 << 20
    versions = [bytes([65 + i]) * size for i in range(2)]
    store.put("big.bin", versions[0])
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            i = 0
            while not stop.is_set():
                i += 1
                store.put("big.bin", versions[i % 2])
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for _ in range(40):
            data = store.get("big.bin")
            assert data in versions
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert store.list() == ["big.bin"]  # no temp files left visible


def test_local_store_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    for i in range(5):
        store.put("d/f.bin", bytes([i]) * 10)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["f.bin"]
    assert store.url == tmp_path.resolve().as_uri()


def test_open_store_dispatches_on_lake_url(
    tmp_path: Path, s3_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    local = open_store(ArenaSettings(home=tmp_path))
    assert isinstance(local, LocalStore)
    assert local.root == (tmp_path / "lake").resolve()

    caplog.set_level(logging.DEBUG)
    bucket = f"fresh-{uuid.uuid4().hex[:12]}"
    settings = ArenaSettings(
        home=tmp_path, lake_url=f"s3://{bucket}/some/prefix", **s3_server.settings_kwargs()
    )
    s3 = open_store(settings)  # creates the bucket
    assert isinstance(s3, S3Store)
    assert s3.url == f"s3://{bucket}/some/prefix"
    s3.put("k/v.txt", b"hi")
    assert s3_server.client().bucket_exists(bucket)
    assert [o.object_name for o in s3_server.client().list_objects(bucket, recursive=True)] == [
        "some/prefix/k/v.txt"
    ]
    # Secrets appear in no repr and no log line.
    assert s3_server.secret_key not in repr(s3)
    assert s3_server.secret_key not in caplog.text
    assert s3_server.access_key not in repr(s3)


def test_wrong_credentials_are_refused(s3_server: S3Server) -> None:
    from minio.error import S3Error

    with pytest.raises(S3Error):
        S3Store(
            "whatever-bucket",
            endpoint=s3_server.endpoint,
            access_key=s3_server.access_key,
            secret_key="not-the-secret",
        )

"""Dropping a data version: everything it owns, and nothing else.

A version owns its topics (``version.<name>.*``), its consumer groups (``arena-*@<name>``), its lake
folder (``version=<name>/``), its catalog rows (artifacts and lineage of its topics, its
``data_versions`` row) and its folder under ``$ARENA_HOME/versions``. ``main`` owns none of those
names, so dropping a version can never touch it (``check_name(new=True)`` refuses ``main``).
"""

from __future__ import annotations

import shutil

from kafka.errors import KafkaError
from pydantic import BaseModel

from app.versions import version_folder
from arena.config import ArenaSettings
from arena.versions import check_name, split_wire, split_worker
from lake.catalog import Catalog
from lake.parquet import version_prefix
from lake.store import open_store
from streams.admin import admin_client


class Dropped(BaseModel):
    """What ``drop_version`` deleted."""

    topics: int = 0
    groups: int = 0
    files: int = 0
    rows: int = 0


def drop_version(settings: ArenaSettings, bootstrap: str, name: str) -> Dropped:
    """Delete data version ``name`` (never ``main``); a part already gone counts 0."""
    check_name(name, new=True)
    dropped = Dropped()
    with admin_client(bootstrap) as admin:
        topics = [t for t in admin.list_topics() if split_wire(t)[0] == name]
        groups = [
            str(g["group_id"]) for g in admin.list_groups() if split_worker(str(g["group_id"]))[1] == name
        ]
        if groups:
            try:
                admin.delete_groups(groups)
                dropped.groups = len(groups)
            except KafkaError:
                pass  # a group with live members: its workers still run; its topics go anyway
        if topics:
            admin.delete_topics(topics)
            dropped.topics = len(topics)
    store = open_store(settings)
    for path in store.list(version_prefix(name)):
        store.delete(path)
        dropped.files += 1
    catalog = Catalog(settings.catalog)
    try:
        dropped.rows = sum(catalog.drop_version(name).values())
    finally:
        catalog.dispose()
    shutil.rmtree(version_folder(settings.home, name), ignore_errors=True)
    return dropped

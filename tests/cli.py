"""Helpers to run the real `arena` CLI as a subprocess against a private stack."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient

ARENA = shutil.which("arena", path=str(Path(sys.executable).parent)) or "arena"

BACKBONE_WORKERS = ["tools-servers", "tool-index", "lake-sink"]
"""The backbone's workers: tests of the backbone run these, not the SFT track's stages."""
BACKBONE_ARGS = [arg for name in BACKBONE_WORKERS for arg in ("--stage", name)]


def arena_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment for a CLI run: a private ARENA_HOME, no inherited ARENA_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARENA_")}
    env.update(ARENA_HOME=str(home), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    env.update(extra)
    return env


def run_arena(
    args: list[str],
    env: dict[str, str],
    *,
    timeout: float = 300,
    check: int | None = 0,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [ARENA, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )
    if check is not None and proc.returncode != check:
        raise AssertionError(
            f"arena {' '.join(args)} exited {proc.returncode} (wanted {check})\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def lake_json(sql: str, env: dict[str, str]) -> list[dict[str, Any]]:
    out = run_arena(["lake", "query", "--json", sql], env).stdout
    rows: list[dict[str, Any]] = json.loads(out)
    return rows


def broker_of(home: Path) -> str:
    state = json.loads((home / "stack.json").read_text())
    return str(state["broker"])


@contextmanager
def stack_stopped_after(env: dict[str, str]) -> Iterator[None]:
    try:
        yield
    finally:
        run_arena(["down"], env, check=None)


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """Committed offsets of a group, read with kafka-python."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
    finally:
        admin.close()
    return {(tp.topic, tp.partition): meta.offset for tp, meta in offsets.items() if meta.offset >= 0}


def end_offsets(bootstrap: str, topic: str) -> dict[tuple[str, int], int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        ends = consumer.end_offsets([TopicPartition(topic, p) for p in parts])
    finally:
        consumer.close()
    return {(tp.topic, tp.partition): off for tp, off in ends.items()}


def read_all(bootstrap: str, topic: str, *, stall_s: float = 60.0) -> list[Any]:
    """Every committed record of a topic (read_committed), from the beginning.

    Reads up to each partition's read_committed end as of the call (the last stable offset: every
    transaction committed before the call lies below it), so it returns as soon as it got there
    instead of waiting for the topic to go quiet. A read whose positions stop moving for
    ``stall_s`` fails: part of a topic would make a count assertion fail for the wrong reason.
    """
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        records: list[Any] = []
        positions = {tp: consumer.position(tp) for tp in tps}
        left = {tp for tp in tps if ends[tp] > positions[tp]}
        moved_at = time.monotonic()
        while left:
            for batch in consumer.poll(timeout_ms=200).values():
                records += batch
            for tp in list(left):
                if (at := consumer.position(tp)) != positions[tp]:  # records and markers move it
                    positions[tp], moved_at = at, time.monotonic()
                if at >= ends[tp]:
                    left.discard(tp)
            if left and time.monotonic() - moved_at > stall_s:
                raise AssertionError(f"reading {topic}: {sorted(map(str, left))} stopped short of {ends}")
        return records
    finally:
        consumer.close()

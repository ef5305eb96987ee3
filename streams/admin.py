"""Kafka administration: create every declared topic before workers start.

Faust only creates its own internal topics, so every stage topic must exist,
with its declared partition count and configs, before any worker runs. This
module is synchronous (kafka-python); call it through ``asyncio.to_thread``
when on an event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from kafka import KafkaAdminClient
from kafka.errors import KafkaError, KafkaTimeoutError

from arena.topics import TOPICS, TopicSpec

# Kafka protocol error codes we act on.
_NONE = 0
_UNKNOWN_TOPIC = 3
_TOPIC_ALREADY_EXISTS = 36

CLIENT_ID = "arena-admin"


class TopicAdminError(RuntimeError):
    """A topic could not be created or does not match its declaration."""


class TopicPartitionMismatch(TopicAdminError):
    """An existing topic has a different partition count than declared.

    Kafka can only grow partitions, and growing them would re-route keys, so
    this is never fixed silently: the operator decides.
    """

    def __init__(self, mismatches: dict[str, tuple[int, int]]) -> None:
        self.mismatches = mismatches
        detail = ", ".join(
            f"{name} has {actual} partitions, declared {declared}"
            for name, (declared, actual) in sorted(mismatches.items())
        )
        super().__init__(
            f"existing topics do not match the registry: {detail}. "
            "Delete and re-create them (losing their data) or change the declaration."
        )


class BrokerUnreachable(TopicAdminError):
    """No broker answered at the bootstrap address."""


@contextlib.contextmanager
def admin_client(
    bootstrap: str, *, timeout_ms: int = 30_000, bootstrap_timeout_ms: int = 10_000
) -> Iterator[KafkaAdminClient]:
    """A kafka-python admin client, closed on exit, with a clear unreachable error."""
    try:
        client = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id=CLIENT_ID,
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=bootstrap_timeout_ms,
        )
    except KafkaTimeoutError as exc:
        raise BrokerUnreachable(
            f"no Kafka broker answers at {bootstrap}; is the stack up (`arena up`) or ARENA_BROKER right?"
        ) from exc
    try:
        yield client
    finally:
        client.close()


def partition_counts(admin: KafkaAdminClient, names: Iterable[str]) -> dict[str, int]:
    """Partition count of each existing topic among ``names`` (missing ones omitted)."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    counts: dict[str, int] = {}
    for meta in admin.describe_topics(wanted):
        code = meta.get("error_code", _NONE)
        if code == _UNKNOWN_TOPIC:
            continue
        if code != _NONE:
            raise TopicAdminError(f"describing topic {meta.get('name')!r} failed with error code {code}")
        counts[str(meta["name"])] = len(meta.get("partitions") or [])
    return counts


def ensure_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec] = TOPICS.values(),
    *,
    replication_factor: int = -1,
    timeout_ms: int = 30_000,
) -> list[str]:
    """Create every missing topic of ``specs`` with its exact partitions and configs.

    Idempotent: existing topics are left as they are (and a concurrent creator
    winning the race is fine), but an existing topic whose partition count
    differs from its declaration raises :class:`TopicPartitionMismatch`,
    because records keyed for N partitions would be routed differently.
    ``replication_factor=-1`` takes the broker's default. Returns the names
    of the topics this call created, sorted.
    """
    declared: dict[str, TopicSpec] = {}
    for spec in specs:
        if spec.name in declared and declared[spec.name] != spec:
            raise TopicAdminError(f"topic {spec.name!r} is declared twice, differently")
        declared[spec.name] = spec
    if not declared:
        return []

    with admin_client(bootstrap, timeout_ms=timeout_ms) as admin:
        existing = partition_counts(admin, declared)
        _check_partitions(declared, existing)
        missing = sorted(set(declared) - set(existing))
        if not missing:
            return []
        request: dict[str, dict[str, Any]] = {
            name: {
                "num_partitions": declared[name].partitions,
                "replication_factor": replication_factor,
                "configs": declared[name].configs(),
            }
            for name in missing
        }
        try:
            # wait_for_metadata: workers started right after must see every partition's leader.
            response = admin.create_topics(
                request, timeout_ms=timeout_ms, raise_errors=False, wait_for_metadata=True
            )
        except KafkaError as exc:
            raise TopicAdminError(f"creating topics {missing} failed: {exc!r}") from exc

        created: list[str] = []
        raced: list[str] = []
        failures: list[str] = []
        for result in response.get("topics", []):
            name, code = str(result["name"]), int(result.get("error_code", _NONE))
            if code == _NONE:
                created.append(name)
            elif code == _TOPIC_ALREADY_EXISTS:
                raced.append(name)  # someone else created it between describe and create
            else:
                failures.append(f"{name}: error {code} {result.get('error_message') or ''}".strip())
        if failures:
            raise TopicAdminError("could not create topics: " + "; ".join(failures))
        if raced:
            _check_partitions(declared, partition_counts(admin, raced))
        return sorted(created)


def _check_partitions(declared: dict[str, TopicSpec], existing: dict[str, int]) -> None:
    mismatches = {
        name: (declared[name].partitions, actual)
        for name, actual in existing.items()
        if name in declared and actual != declared[name].partitions
    }
    if mismatches:
        raise TopicPartitionMismatch(mismatches)

"""Consumer lag per group and partition, like ``kafka-consumer-groups.sh --describe``.

Two numbers per partition, because exactly-once producers make the usual one
misleading:

- ``lag = end - committed``: the raw offset distance, as kafka-consumer-groups
  shows it, with ``end`` the read_committed end offset (last stable offset).
- ``pending``: how many *data* records a read_committed consumer would still
  receive between ``committed`` and ``end``. A transaction commit (or abort)
  marker occupies an offset but is never delivered, and aborted records are
  skipped, so ``lag`` can stay > 0 forever on a fully processed partition;
  ``pending`` is the number to wait on.

``pending`` is measured by reading: one read_committed consumer (no group, no
commits) is assigned the lagging partitions, seeks to each start offset and
counts records until its position reaches ``end``. Counting stops at
``pending_cap`` records per partition (the row says so with
``pending_capped``), so a huge backlog costs a bounded read.

Everything is synchronous (kafka-python); run it in a thread from async code.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from kafka import IsolationLevel, KafkaConsumer, TopicPartition
from kafka.admin import KafkaAdminClient, OffsetSpec
from kafka.errors import KafkaError, UnsupportedVersionError
from pydantic import BaseModel, Field
from rich.table import Table

from streams import read_committed
from streams.admin import admin_client, partition_counts

PENDING_CAP = 10_000
"""Records counted per partition at most; beyond it ``pending`` is a lower bound."""

PROBE_TIMEOUT_S = 10.0


class LagRow(BaseModel):
    """One (group, topic, partition) line of the lag report."""

    group: str
    topic: str
    partition: int
    committed: int | None = Field(
        description="Committed offset; None when the group has committed nothing here "
        "(it will start at the earliest offset)."
    )
    end: int = Field(description="read_committed end offset (last stable offset).")
    log_end: int = Field(description="read_uncommitted end offset (high watermark).")
    lag: int = Field(description="end - committed (earliest offset when none), never below 0.")
    pending: int = Field(description="Data records a read_committed consumer would still receive.")
    pending_capped: bool = Field(
        default=False,
        description="pending is a lower bound: counting stopped at the cap or timed out.",
    )
    waiting: str | None = Field(
        default=None,
        description="Set when the group's worker is paused waiting for its LLM endpoint: why (the last failure).",
    )

    @property
    def open_transaction(self) -> bool:
        """A transaction holds records beyond the last stable offset."""
        return self.log_end > self.end


class LagReport(BaseModel):
    """The JSON form of a lag report (``arena lag --json``)."""

    rows: list[LagRow]
    total_lag: int
    total_pending: int
    pending_capped: bool
    open_transactions: int = Field(description="Partitions with an open transaction.")


# -- gathering -------------------------------------------------------------


def _group_ids(
    admin: KafkaAdminClient, groups: list[str] | None, topics_by_group: Mapping[str, list[str]]
) -> list[str]:
    """Requested groups (all the cluster knows when None) plus the explicit ones, in order."""
    if groups is None:
        groups = sorted(str(g["group_id"]) for g in admin.list_groups())
    return list(dict.fromkeys([*groups, *topics_by_group]))


def _committed_offsets(admin: KafkaAdminClient, group_ids: list[str]) -> dict[str, dict[TopicPartition, int]]:
    """Committed offsets per group; partitions without a commit are left out."""
    try:
        raw = admin.list_group_offsets({g: None for g in group_ids})
    except UnsupportedVersionError:
        # Brokers before OffsetFetch v8 take one group per request.
        raw = {}
        for g in group_ids:
            raw.update(admin.list_group_offsets({g: None}))
    out: dict[str, dict[TopicPartition, int]] = {}
    for g in group_ids:
        offsets = raw.get(g) or {}
        # -1 is the wire's "no committed offset".
        out[g] = {tp: int(om.offset) for tp, om in offsets.items() if om is not None and om.offset >= 0}
    return out


def _member_topics(admin: KafkaAdminClient, group_ids: list[str]) -> dict[str, set[str]]:
    """Topics each group's live members subscribe to or are assigned."""
    out: dict[str, set[str]] = defaultdict(set)
    try:
        described = admin.describe_groups(group_ids)
    except KafkaError:
        return out  # best effort: committed offsets and explicit topics still count
    for g, info in described.items():
        for member in info.get("members") or []:
            meta = member.get("member_metadata")
            if isinstance(meta, dict):
                out[g].update(str(t) for t in meta.get("topics") or [])
            assignment = member.get("member_assignment")
            if isinstance(assignment, dict):
                for part in assignment.get("assigned_partitions") or []:
                    out[g].add(str(part["topic"]))
    return out


def _offsets(
    admin: KafkaAdminClient, tps: list[TopicPartition], spec: OffsetSpec, level: IsolationLevel
) -> dict[TopicPartition, int]:
    if not tps:
        return {}
    res = admin.list_partition_offsets(dict.fromkeys(tps, spec), isolation_level=level)
    return {tp: int(v.offset) for tp, v in res.items()}


# -- pending probe ---------------------------------------------------------


def _count_pending(
    bootstrap: str,
    probes: list[tuple[TopicPartition, int, int]],
    *,
    cap: int,
    timeout_s: float,
) -> dict[tuple[TopicPartition, int], tuple[int, bool]]:
    """Count data records in ``[start, end)`` per probe, as read_committed sees them.

    Returns ``{(tp, start): (count, capped)}``. A consumer holds one position
    per partition, so probes of the same partition at different starts (e.g.
    a stage group and the lake sink on one topic) run in successive rounds
    over one reused consumer.
    """
    if not probes:
        return {}
    rounds: list[dict[TopicPartition, tuple[int, int]]] = []
    for tp, start, end in sorted(set(probes), key=lambda p: (p[0].topic, p[0].partition, p[1])):
        for rnd in rounds:
            if tp not in rnd:
                rnd[tp] = (start, end)
                break
        else:
            rounds.append({tp: (start, end)})

    results: dict[tuple[TopicPartition, int], tuple[int, bool]] = {}
    read_committed.install()
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="arena-lag",
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,  # a done partition must not stall the others
        max_poll_records=2_000,
    )
    deadline = time.monotonic() + timeout_s
    try:
        for rnd in rounds:
            consumer.assign(list(rnd))
            for tp, (start, _end) in rnd.items():
                consumer.seek(tp, start)
            counts = dict.fromkeys(rnd, 0)
            open_tps = set(rnd)
            while open_tps:
                if time.monotonic() >= deadline:
                    break
                batch = consumer.poll(timeout_ms=50)
                for tp, records in batch.items():
                    if tp in open_tps:
                        end = rnd[tp][1]
                        # end is a snapshot: records committed since are not counted.
                        counts[tp] += sum(1 for r in records if r.offset < end)
                for tp in list(open_tps):
                    # position passes commit markers and aborted records too.
                    if counts[tp] >= cap or consumer.position(tp) >= rnd[tp][1]:
                        open_tps.discard(tp)
                        consumer.pause(tp)
            for tp, (start, _end) in rnd.items():
                capped = tp in open_tps or counts[tp] >= cap
                results[(tp, start)] = (min(counts[tp], cap), capped)
            consumer.unsubscribe()
    finally:
        consumer.close(autocommit=False)
    return results


# -- public API ------------------------------------------------------------


def compute_lag(
    bootstrap: str,
    groups: list[str] | None = None,
    *,
    topics_by_group: Mapping[str, Iterable[str]] | None = None,
    pending_cap: int = PENDING_CAP,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> list[LagRow]:
    """Lag rows for consumer groups, sorted by group, topic, partition.

    ``groups=None`` means every group the cluster knows. A group's topics are
    those its live members subscribe to or are assigned, those it has
    committed offsets on, and those listed in ``topics_by_group`` (which also
    adds groups that have not started yet). On a partition where a group has
    committed nothing, counting starts at the earliest offset, as a consumer
    with ``auto_offset_reset=earliest`` would. Topics that do not exist yield
    no rows.
    """
    explicit = {g: list(ts) for g, ts in (topics_by_group or {}).items()}
    with admin_client(bootstrap) as admin:
        group_ids = _group_ids(admin, groups, explicit)
        if not group_ids:
            return []
        committed = _committed_offsets(admin, group_ids)
        members = _member_topics(admin, group_ids)
        topics_of: dict[str, set[str]] = {
            g: {tp.topic for tp in committed.get(g, {})} | members.get(g, set()) | set(explicit.get(g, []))
            for g in group_ids
        }
        counts = partition_counts(admin, set().union(*topics_of.values()))
        tps = [TopicPartition(t, p) for t in sorted(counts) for p in range(counts[t])]
        earliest = _offsets(admin, tps, OffsetSpec.EARLIEST, IsolationLevel.READ_UNCOMMITTED)
        stable = _offsets(admin, tps, OffsetSpec.LATEST, IsolationLevel.READ_COMMITTED)
        high = _offsets(admin, tps, OffsetSpec.LATEST, IsolationLevel.READ_UNCOMMITTED)

    pending_rows: list[tuple[str, TopicPartition, int | None, int]] = []
    probes: list[tuple[TopicPartition, int, int]] = []
    for g in group_ids:
        for t in sorted(topics_of[g] & counts.keys()):
            for p in range(counts[t]):
                tp = TopicPartition(t, p)
                done = committed[g].get(tp)
                # Below the earliest offset (retention removed it) reading restarts at earliest.
                start = max(done if done is not None else earliest[tp], earliest[tp])
                pending_rows.append((g, tp, done, start))
                if stable[tp] > start:
                    probes.append((tp, start, stable[tp]))

    counted = _count_pending(bootstrap, probes, cap=pending_cap, timeout_s=timeout_s)
    rows: list[LagRow] = []
    for g, tp, done, start in pending_rows:
        end = stable[tp]
        pending, capped = counted.get((tp, start), (0, False))
        base = done if done is not None else earliest[tp]
        rows.append(
            LagRow(
                group=g,
                topic=tp.topic,
                partition=tp.partition,
                committed=done,
                end=end,
                log_end=high[tp],
                lag=max(end - base, 0),
                pending=pending,
                pending_capped=capped,
            )
        )
    rows.sort(key=lambda r: (r.group, r.topic, r.partition))
    return rows


def drained(
    bootstrap: str,
    topics_by_group: Mapping[str, Iterable[str]],
    *,
    rows: list[LagRow] | None = None,
) -> bool:
    """True when every listed group has nothing left to read on its listed topics.

    That is: every ``pending`` is 0 (not capped), and no transaction is open
    on those topics (read_uncommitted end == read_committed end), so nothing
    is on its way either. ``lag`` may still be > 0 because of commit markers.
    Pass ``rows`` from :func:`compute_lag` to avoid asking twice.
    """
    wanted = {g: set(ts) for g, ts in topics_by_group.items()}
    if rows is None:
        rows = compute_lag(bootstrap, list(wanted), topics_by_group={g: list(t) for g, t in wanted.items()})
    for row in rows:
        if row.topic not in wanted.get(row.group, ()):
            continue
        if row.pending > 0 or row.pending_capped or row.open_transaction:
            return False
    return True


def lag_report(rows: list[LagRow]) -> LagReport:
    """Rows with totals, for the JSON form."""
    return LagReport(
        rows=rows,
        total_lag=sum(r.lag for r in rows),
        total_pending=sum(r.pending for r in rows),
        pending_capped=any(r.pending_capped for r in rows),
        open_transactions=len({(r.topic, r.partition) for r in rows if r.open_transaction}),
    )


def lag_json(rows: list[LagRow], *, indent: int | None = 2) -> str:
    """``arena lag --json``: the report as JSON."""
    return lag_report(rows).model_dump_json(indent=indent)


def render_lag_table(rows: list[LagRow], *, title: str | None = "Consumer lag") -> Table:
    """A rich table with the columns of ``kafka-consumer-groups.sh --describe``, plus PENDING."""
    table = Table(title=title)
    table.add_column("GROUP", style="cyan", no_wrap=True)
    table.add_column("TOPIC", no_wrap=True)
    table.add_column("PARTITION", justify="right")
    table.add_column("COMMITTED", justify="right")
    table.add_column("END", justify="right")
    table.add_column("LAG", justify="right")
    table.add_column("PENDING", justify="right")
    table.add_column("NOTE")
    for r in rows:
        notes: list[str] = []
        if r.committed is None:
            notes.append("no commit: from earliest")
        if r.open_transaction:
            notes.append(f"open txn (+{r.log_end - r.end})")
        if r.pending_capped:
            notes.append(f"counted up to {r.pending}")
        if r.waiting:
            notes.append(f"[red]waiting on its LLM endpoint: {r.waiting}[/red]")
        pending = f">={r.pending}" if r.pending_capped else str(r.pending)
        table.add_row(
            r.group,
            r.topic,
            str(r.partition),
            "-" if r.committed is None else str(r.committed),
            str(r.end),
            str(r.lag),
            f"[yellow]{pending}[/yellow]" if r.pending else pending,
            ", ".join(notes),
        )
    return table


def rows_as_dicts(rows: list[LagRow]) -> list[dict[str, Any]]:
    """Plain dicts (with ``open_transaction``) for callers that build their own output."""
    return [{**r.model_dump(), "open_transaction": r.open_transaction} for r in rows]


def mark_waiting(rows: list[LagRow], waiting: dict[str, str]) -> list[LagRow]:
    """``rows`` with ``waiting`` set for the groups in ``waiting`` (group id -> reason)."""
    return [r.model_copy(update={"waiting": waiting[r.group]}) if r.group in waiting else r for r in rows]

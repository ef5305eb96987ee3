"""Consumer lag per group and partition, like ``kafka-consumer-groups.sh --describe``.

Exactly-once producers make the usual number misleading: a transaction commit
(or abort) marker occupies an offset but is never delivered, and aborted
records are skipped, so ``end - committed`` stays > 0 forever on a fully
processed partition. So each row has:

- ``lag`` (and ``pending``, the same count under the name the drain check
  uses): how many *data* records a read_committed consumer would still
  receive between ``committed`` and ``end`` (the read_committed end offset,
  last stable offset). 0 on a drained partition.
- ``offset_lag = end - committed``: the raw offset distance, as
  kafka-consumer-groups shows it.
- ``idle``: the group never ran (no committed offset on any partition, no live
  member), e.g. the trainer's group before any `arena train`. Its ``lag`` says
  how many records wait for it; reports show it as idle, not lagging.

``lag`` is measured by reading: one read_committed consumer (no group, no
commits) is assigned the lagging partitions, seeks to each start offset and
counts records until its position reaches ``end``. Counting stops at
``pending_cap`` records per partition (the row says so with
``pending_capped``: ``lag`` is then a lower bound), so a huge backlog costs a
bounded read.

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
from pydantic import BaseModel, Field, computed_field
from rich.table import Table

from arena.versions import split_worker
from streams import read_committed
from streams.admin import admin_client, partition_counts

PENDING_CAP = 10_000
"""Records counted per partition at most; beyond it ``pending`` is a lower bound."""

PROBE_TIMEOUT_S = 10.0

Probe = tuple[TopicPartition, int, int]
"""A counted offset range: (partition, start, end), end a last stable offset."""

CountMemo = dict[Probe, int]
"""Exact counts of ranges counted before. A range below the last stable offset never changes (every
transaction in it is decided), so a poller (``arena worker --until-drained``) passes one memo to
each ``compute_lag`` and reads only the ranges that moved since."""


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
    lag: int = Field(
        description="Data records a read_committed consumer would still receive between committed "
        "(earliest offset when none) and end: transaction markers and aborted records not counted."
    )
    offset_lag: int = Field(
        description="end - committed (earliest offset when none), never below 0: the raw offset "
        "distance kafka-consumer-groups shows, markers included."
    )
    pending_capped: bool = Field(
        default=False,
        description="lag (and pending) is a lower bound: counting stopped at the cap or timed out.",
    )
    idle: bool = Field(
        default=False,
        description="The group never ran: no committed offset on any partition and no live member.",
    )
    waiting: str | None = Field(
        default=None,
        description="Set when the group's worker is paused waiting for its LLM endpoint: why (the last failure).",
    )

    @computed_field(  # type: ignore[prop-decorator]
        description="The same count as lag: data records still to read (the name the drain check uses)."
    )
    @property
    def pending(self) -> int:
        return self.lag

    @computed_field(  # type: ignore[prop-decorator]
        description="The data version the group works for (``arena-<stage>@<version>``; main otherwise)."
    )
    @property
    def version(self) -> str:
        return split_worker(self.group)[1]

    @property
    def open_transaction(self) -> bool:
        """A transaction holds records beyond the last stable offset."""
        return self.log_end > self.end


class LagReport(BaseModel):
    """Lag rows with totals over the groups that ran."""

    rows: list[LagRow]
    total_lag: int = Field(description="Sum of lag over the rows of groups that ran (idle groups left out).")
    total_pending: int = Field(description="The same sum as total_lag.")
    pending_capped: bool = Field(description="Some row's count is a lower bound.")
    open_transactions: int = Field(description="Partitions with an open transaction.")
    idle_groups: list[str] = Field(description="Groups that never ran (no commit, no live member).")


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


def _members(admin: KafkaAdminClient, group_ids: list[str]) -> tuple[dict[str, set[str]], set[str]]:
    """Topics each group's live members subscribe to or are assigned, and the groups with a live member."""
    out: dict[str, set[str]] = defaultdict(set)
    live: set[str] = set()
    try:
        described = admin.describe_groups(group_ids)
    except KafkaError:
        # best effort: committed offsets and explicit topics still count; no group is called
        # idle on a failed answer (it would hide a running group's backlog)
        return out, set(group_ids)
    for g, info in described.items():
        if info.get("members"):
            live.add(g)
        for member in info.get("members") or []:
            meta = member.get("member_metadata")
            if isinstance(meta, dict):
                out[g].update(str(t) for t in meta.get("topics") or [])
            assignment = member.get("member_assignment")
            if isinstance(assignment, dict):
                for part in assignment.get("assigned_partitions") or []:
                    out[g].add(str(part["topic"]))
    return out, live


def _offsets(
    admin: KafkaAdminClient, tps: list[TopicPartition], spec: OffsetSpec, level: IsolationLevel
) -> dict[TopicPartition, int]:
    if not tps:
        return {}
    res = admin.list_partition_offsets(dict.fromkeys(tps, spec), isolation_level=level)
    return {tp: int(v.offset) for tp, v in res.items()}


# -- pending probe ---------------------------------------------------------


def counting_consumer(bootstrap: str, client_id: str) -> KafkaConsumer:
    """A read_committed consumer with no group and no commits, for counting data records."""
    read_committed.install()
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id=client_id,
        group_id=None,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,  # a done partition must not stall the others
        max_poll_records=2_000,
    )


OFFSET_ATTEMPTS = 3
"""kafka-python's offset lookups raise ``KeyError`` for a partition the broker's answer left out
(seen once under a loaded CI run, on ``tools.raw``); asked again they answer."""


def consumer_offsets(lookup: Any, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    """``lookup(tps)`` (a kafka-python consumer's ``beginning_offsets`` or ``end_offsets``), asked
    again when it drops a partition from the broker's answer (see ``OFFSET_ATTEMPTS``)."""
    for attempt in range(1, OFFSET_ATTEMPTS):
        try:
            return dict(lookup(tps))
        except KeyError:
            time.sleep(0.2 * attempt)
    return dict(lookup(tps))  # the last attempt's error propagates


def _count_pending(
    bootstrap: str,
    probes: list[Probe],
    *,
    cap: int,
    timeout_s: float,
    memo: CountMemo,
) -> dict[tuple[TopicPartition, int], tuple[int, bool]]:
    """Count data records in ``[start, end)`` per probe, as read_committed sees them.

    Returns ``{(tp, start): (count, capped)}``. A consumer holds one position
    per partition, so probes of the same partition at different starts (e.g.
    a stage group and the lake sink on one topic) run in successive rounds
    over one reused consumer. Ranges in ``memo`` are not read again; exact counts are added to it.
    """
    wanted = set(probes)
    for stale in memo.keys() - wanted:  # ranges that moved on are not asked for again
        del memo[stale]
    results: dict[tuple[TopicPartition, int], tuple[int, bool]] = {}
    rounds: list[dict[TopicPartition, tuple[int, int]]] = []
    for tp, start, end in sorted(wanted, key=lambda p: (p[0].topic, p[0].partition, p[1])):
        if (tp, start, end) in memo:
            count = memo[(tp, start, end)]
            results[(tp, start)] = (min(count, cap), count >= cap)
            continue
        for rnd in rounds:
            if tp not in rnd:
                rnd[tp] = (start, end)
                break
        else:
            rounds.append({tp: (start, end)})

    if not rounds:
        return results
    consumer = counting_consumer(bootstrap, "arena-lag")
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
            for tp, (start, end) in rnd.items():
                capped = tp in open_tps or counts[tp] >= cap
                results[(tp, start)] = (min(counts[tp], cap), capped)
                if not capped:
                    memo[(tp, start, end)] = counts[tp]
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
    memo: CountMemo | None = None,
) -> list[LagRow]:
    """Lag rows for consumer groups, sorted by group, topic, partition.

    ``groups=None`` means every group the cluster knows. A group's topics are
    those its live members subscribe to or are assigned, those it has
    committed offsets on, and those listed in ``topics_by_group`` (which also
    adds groups that have not started yet: their rows are ``idle``). On a
    partition where a group has committed nothing, counting starts at the
    earliest offset, as a consumer with ``auto_offset_reset=earliest`` would.
    Topics that do not exist yield no rows. ``memo``: see ``CountMemo``.
    """
    explicit = {g: list(ts) for g, ts in (topics_by_group or {}).items()}
    with admin_client(bootstrap) as admin:
        group_ids = _group_ids(admin, groups, explicit)
        if not group_ids:
            return []
        committed = _committed_offsets(admin, group_ids)
        members, live = _members(admin, group_ids)
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
    probes: list[Probe] = []
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

    counted = _count_pending(
        bootstrap, probes, cap=pending_cap, timeout_s=timeout_s, memo={} if memo is None else memo
    )
    rows: list[LagRow] = []
    for g, tp, done, start in pending_rows:
        end = stable[tp]
        records, capped = counted.get((tp, start), (0, False))
        base = done if done is not None else earliest[tp]
        rows.append(
            LagRow(
                group=g,
                topic=tp.topic,
                partition=tp.partition,
                committed=done,
                end=end,
                log_end=high[tp],
                lag=records,
                offset_lag=max(end - base, 0),
                pending_capped=capped,
                idle=not committed[g] and g not in live,
            )
        )
    rows.sort(key=lambda r: (r.group, r.topic, r.partition))
    return rows


def unsettled(bootstrap: str, topics: Iterable[str]) -> list[TopicPartition]:
    """Partitions of ``topics`` whose read_committed end is short of their end: a transaction there
    is open, or committed and not yet visible to readers (the embedded broker can show a
    transaction's offset commit before the records it wrote, seconds apart under load)."""
    with admin_client(bootstrap) as admin:
        counts = partition_counts(admin, set(topics))
        tps = [TopicPartition(t, p) for t in sorted(counts) for p in range(counts[t])]
        stable = _offsets(admin, tps, OffsetSpec.LATEST, IsolationLevel.READ_COMMITTED)
        high = _offsets(admin, tps, OffsetSpec.LATEST, IsolationLevel.READ_UNCOMMITTED)
    return [tp for tp in tps if stable.get(tp, 0) < high.get(tp, 0)]


def drained(
    bootstrap: str,
    topics_by_group: Mapping[str, Iterable[str]],
    *,
    rows: list[LagRow] | None = None,
    memo: CountMemo | None = None,
) -> bool:
    """True when every listed group has nothing left to read on its listed topics.

    That is: every ``lag`` is 0 (not capped), and no transaction is open
    on those topics (read_uncommitted end == read_committed end), so nothing
    is on its way either. A group that never ran counts too: its records wait
    for it. ``offset_lag`` may still be > 0 because of commit markers.
    Pass ``rows`` from :func:`compute_lag` to avoid asking twice, or a poller's ``memo`` (``CountMemo``).
    """
    wanted = {g: set(ts) for g, ts in topics_by_group.items()}
    if rows is None:
        rows = compute_lag(
            bootstrap, list(wanted), topics_by_group={g: list(t) for g, t in wanted.items()}, memo=memo
        )
    for row in rows:
        if row.topic not in wanted.get(row.group, ()):
            continue
        if row.lag > 0 or row.pending_capped or row.open_transaction:
            return False
    return True


def lag_report(rows: list[LagRow]) -> LagReport:
    """Rows with totals over the groups that ran."""
    ran = [r for r in rows if not r.idle]
    total = sum(r.lag for r in ran)
    return LagReport(
        rows=rows,
        total_lag=total,
        total_pending=total,
        pending_capped=any(r.pending_capped for r in ran),
        open_transactions=len({(r.topic, r.partition) for r in rows if r.open_transaction}),
        idle_groups=sorted({r.group for r in rows if r.idle}),
    )


def lag_json(rows: list[LagRow], *, indent: int | None = 2) -> str:
    """The report as JSON (``arena lag --json`` prints the rows alone)."""
    return lag_report(rows).model_dump_json(indent=indent)


LAG_CAPTION = (
    "LAG = PENDING: data records still to read (transaction markers and aborted records not counted); "
    "OFFSET LAG: end - committed, as kafka-consumer-groups shows it"
)


def _notes(r: LagRow) -> str:
    notes: list[str] = []
    if r.idle:
        notes.append(f"idle: never ran (no commit, no live member); {r.lag} records wait for it")
    elif r.committed is None:
        notes.append("no commit: from earliest")
    if r.open_transaction:
        notes.append(f"open txn (+{r.log_end - r.end})")
    if r.pending_capped:
        notes.append(f"counted up to {r.lag}")
    if r.waiting:
        notes.append(f"[red]waiting on its LLM endpoint: {r.waiting}[/red]")
    return ", ".join(notes)


class VersionProgress(BaseModel):
    """How far one data version's groups are: records read and still to read (``arena lag``)."""

    version: str
    groups: int
    pending: int = Field(description="Data records its groups still have to read.")
    read: int = Field(description="Offsets its groups committed past (markers included).")


def version_progress(rows: list[LagRow]) -> list[VersionProgress]:
    """Per data version (main first): its groups, what they still have to read and what they read."""
    found: dict[str, VersionProgress] = {}
    groups: dict[str, set[str]] = {}
    for r in rows:
        p = found.setdefault(r.version, VersionProgress(version=r.version, groups=0, pending=0, read=0))
        groups.setdefault(r.version, set()).add(r.group)
        p.pending += r.lag
        p.read += r.committed or 0
    for version, names in groups.items():
        found[version].groups = len(names)
    return sorted(found.values(), key=lambda p: (p.version != "main", p.version))


def render_versions_table(rows: list[LagRow]) -> Table:
    """Progress per data version: a replay is drained when its pending reaches 0."""
    table = Table(title="Per data version")
    for column in ("VERSION", "GROUPS", "PENDING", "READ"):
        table.add_column(column, justify="left" if column == "VERSION" else "right")
    for p in version_progress(rows):
        table.add_row(p.version, str(p.groups), str(p.pending), str(p.read))
    return table


def render_lag_table(rows: list[LagRow], *, title: str | None = "Consumer lag") -> Table:
    """A rich table with the columns of ``kafka-consumer-groups.sh --describe``, plus PENDING and OFFSET LAG."""
    table = Table(title=title, caption=LAG_CAPTION)
    table.add_column("GROUP", style="cyan", no_wrap=True)
    table.add_column("TOPIC", no_wrap=True)
    table.add_column("PARTITION", justify="right")
    table.add_column("COMMITTED", justify="right")
    table.add_column("END", justify="right")
    table.add_column("LAG", justify="right")
    table.add_column("PENDING", justify="right")
    table.add_column("OFFSET LAG", justify="right")
    table.add_column("NOTE")
    for r in rows:
        count = f">={r.lag}" if r.pending_capped else str(r.lag)
        if r.idle:
            shown = "[dim]idle[/dim]"
        else:
            shown = f"[yellow]{count}[/yellow]" if r.lag else count
        table.add_row(
            r.group,
            r.topic,
            str(r.partition),
            "-" if r.committed is None else str(r.committed),
            str(r.end),
            shown,
            shown,
            str(r.offset_lag),
            _notes(r),
        )
    return table


def rows_as_dicts(rows: list[LagRow]) -> list[dict[str, Any]]:
    """Plain dicts (with ``open_transaction``) for callers that build their own output."""
    return [{**r.model_dump(), "open_transaction": r.open_transaction} for r in rows]


def mark_waiting(rows: list[LagRow], waiting: dict[str, str]) -> list[LagRow]:
    """``rows`` with ``waiting`` set for the groups in ``waiting`` (group id -> reason)."""
    return [r.model_copy(update={"waiting": waiting[r.group]}) if r.group in waiting else r for r in rows]

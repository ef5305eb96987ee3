"""Consumer lag on a real broker, with and without exactly-once producers.

Lag counts data records: transaction markers and aborted records occupy offsets but are never
delivered, so a drained partition reads 0 whatever lies behind its commit (``offset_lag`` keeps the
raw distance). A group that never ran is idle, not lagging.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from rich.console import Console

from consumers.lag import (
    CountMemo,
    LagRow,
    compute_lag,
    drained,
    lag_json,
    lag_report,
    render_lag_table,
    unsettled,
)

pytestmark = pytest.mark.integration


def _commit(broker: str, group: str, offsets: dict[TopicPartition, int]) -> None:
    """Commit offsets for a group without joining it (like a stage that stopped)."""
    consumer = KafkaConsumer(bootstrap_servers=broker, group_id=group, enable_auto_commit=False)
    try:
        consumer.commit({tp: OffsetAndMetadata(off, "", -1) for tp, off in offsets.items()})
    finally:
        consumer.close(autocommit=False)


def _produce(broker: str, topic: str, counts: dict[int, int]) -> None:
    producer = KafkaProducer(bootstrap_servers=broker)
    try:
        for partition, n in counts.items():
            for i in range(n):
                producer.send(topic, f"{partition}-{i}".encode(), partition=partition)
        producer.flush()
    finally:
        producer.close()


@pytest.fixture
def txn_producer(broker: str, unique_name: Callable[[str], str]) -> Iterator[KafkaProducer]:
    producer = KafkaProducer(bootstrap_servers=broker, transactional_id=unique_name("txn"))
    producer.init_transactions()
    try:
        yield producer
    finally:
        producer.close(timeout=2)


def _txn(producer: KafkaProducer, topic: str, n: int, *, commit: bool = True) -> None:
    producer.begin_transaction()
    for i in range(n):
        producer.send(topic, f"tx-{i}".encode(), partition=0)
    producer.flush()
    if commit:
        producer.commit_transaction()
    else:
        producer.abort_transaction()


def _data_offsets(broker: str, topic: str) -> list[int]:
    """Offsets of the data records of partition 0, as a read_committed consumer gets them."""
    consumer = KafkaConsumer(
        bootstrap_servers=broker, isolation_level="read_committed", enable_auto_commit=False
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    end = consumer.end_offsets([tp])[tp]
    offsets: list[int] = []
    deadline = time.monotonic() + 10
    try:
        while consumer.position(tp) < end and time.monotonic() < deadline:
            offsets += [r.offset for recs in consumer.poll(timeout_ms=100).values() for r in recs]
    finally:
        consumer.close(autocommit=False)
    return offsets


def _row(rows: list[LagRow], group: str, topic: str, partition: int = 0) -> LagRow:
    (row,) = [r for r in rows if (r.group, r.topic, r.partition) == (group, topic, partition)]
    return row


def test_plain_records(broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]) -> None:
    topic = new_topic(partitions=2)
    group = unique_name("g")
    _produce(broker, topic, {0: 10, 1: 4})
    _commit(broker, group, {TopicPartition(topic, 0): 6})

    # The topic is found through the group's commits; a partition without a
    # commit counts from the earliest offset (auto_offset_reset=earliest).
    rows = compute_lag(broker, [group])
    assert [(r.partition, r.committed, r.end, r.lag, r.pending, r.offset_lag) for r in rows] == [
        (0, 6, 10, 4, 4, 4),
        (1, None, 4, 4, 4, 4),
    ]
    assert not any(r.idle for r in rows)  # it committed on partition 0: it ran
    assert rows == compute_lag(broker, [group], topics_by_group={group: [topic]})
    assert not drained(broker, {group: [topic]}, rows=rows)

    _commit(broker, group, {TopicPartition(topic, 0): 10, TopicPartition(topic, 1): 4})
    rows = compute_lag(broker, [group])
    assert all(r.lag == 0 and r.pending == 0 for r in rows)
    assert drained(broker, {group: [topic]})


def test_group_that_never_started(
    broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = new_topic(partitions=1)
    _produce(broker, topic, {0: 3})
    group = unique_name("not-yet")
    row = _row(compute_lag(broker, [], topics_by_group={group: [topic]}), group, topic)
    assert (row.committed, row.end, row.lag, row.pending, row.idle) == (None, 3, 3, 3, True)
    # idle, but its records wait for it: not drained
    assert not drained(broker, {group: [topic]})
    # a topic that does not exist yet has nothing to drain
    assert compute_lag(broker, [], topics_by_group={group: [unique_name("missing")]}) == []


def test_live_member_subscription_is_discovered(
    broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = new_topic(partitions=2)
    _produce(broker, topic, {0: 2, 1: 3})
    group = unique_name("live")
    consumer = KafkaConsumer(topic, bootstrap_servers=broker, group_id=group, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + 10
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100, max_records=1)  # joins the group; commits nothing
        rows = compute_lag(broker, [group])  # no commits, no declared topics
    finally:
        consumer.close(autocommit=False)
    assert {(r.partition, r.committed, r.pending) for r in rows} == {(0, None, 2), (1, None, 3)}
    assert not any(r.idle for r in rows)  # a live member: running, not idle


def test_transaction_markers_do_not_count_as_lag(
    broker: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    txn_producer: KafkaProducer,
) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("eos")
    for n in (5, 2, 3):
        _txn(txn_producer, topic, n)  # 10 data records, each transaction closed by a commit marker

    # The consumer processed every data record: it commits last data offset + 1 (a stage's
    # released prefix), so the last commit marker lies behind its commit.
    last_data = _data_offsets(broker, topic)[-1]
    _commit(broker, group, {TopicPartition(topic, 0): last_data + 1})
    row = _row(compute_lag(broker, [group]), group, topic)
    assert row.committed == last_data + 1
    # Real Kafka (and noida 0.2.3) give each marker an offset: end == 13 after 10 records.
    assert row.end == 13 and row.offset_lag == 1
    assert (row.lag, row.pending) == (0, 0) and not row.open_transaction and not row.idle
    assert drained(broker, {group: [topic]})

    # Half-way: 5 data records are behind the commit (the middle transaction's marker is not one).
    middle = _data_offsets(broker, topic)[4] + 1
    _commit(broker, group, {TopicPartition(topic, 0): middle})
    row = _row(compute_lag(broker, [group]), group, topic)
    assert (row.lag, row.offset_lag) == (5, 13 - middle) and row.offset_lag > row.lag


def test_a_memo_reads_only_the_ranges_that_moved(
    broker: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    txn_producer: KafkaProducer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`arena worker --until-drained` polls with one memo: an unchanged range is not read again."""
    import consumers.lag as lag

    topic = new_topic(partitions=1)
    group = unique_name("memo")
    _txn(txn_producer, topic, 3)
    reads: list[str] = []
    real = lag.counting_consumer

    def counted_consumer(bootstrap: str, client_id: str) -> KafkaConsumer:
        reads.append(client_id)
        return real(bootstrap, client_id)

    monkeypatch.setattr(lag, "counting_consumer", counted_consumer)
    memo: CountMemo = {}
    first = _row(compute_lag(broker, [], topics_by_group={group: [topic]}, memo=memo), group, topic)
    again = _row(compute_lag(broker, [], topics_by_group={group: [topic]}, memo=memo), group, topic)
    assert (first.lag, again.lag, len(reads)) == (3, 3, 1)  # the second answer came from the memo
    capped = _row(
        compute_lag(broker, [], topics_by_group={group: [topic]}, pending_cap=2, memo=memo), group, topic
    )
    assert (capped.lag, capped.pending_capped, len(reads)) == (2, True, 1)  # a memo answers any cap

    _txn(txn_producer, topic, 2)  # the range's end moved: counted again, the old range forgotten
    moved = _row(compute_lag(broker, [], topics_by_group={group: [topic]}, memo=memo), group, topic)
    assert (moved.lag, len(reads), len(memo)) == (5, 2, 1)


def test_aborted_records_and_several_groups(
    broker: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    txn_producer: KafkaProducer,
) -> None:
    topic = new_topic(partitions=1)
    _txn(txn_producer, topic, 3)  # 3 committed records
    _txn(txn_producer, topic, 4, commit=False)  # 4 aborted: never delivered
    _txn(txn_producer, topic, 2)  # 2 committed records
    behind, middle = unique_name("behind"), unique_name("middle")
    consumer = KafkaConsumer(
        bootstrap_servers=broker, isolation_level="read_committed", enable_auto_commit=False
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    offsets: list[int] = []
    deadline = time.monotonic() + 10
    while len(offsets) < 5 and time.monotonic() < deadline:
        offsets += [r.offset for recs in consumer.poll(timeout_ms=100).values() for r in recs]
    consumer.close(autocommit=False)
    assert len(offsets) == 5
    # "middle" has processed the first batch and nothing of the second.
    _commit(broker, middle, {tp: offsets[2] + 1})

    rows = compute_lag(broker, [], topics_by_group={behind: [topic], middle: [topic]})
    b, m = _row(rows, behind, topic), _row(rows, middle, topic)
    assert (b.committed, b.lag, b.pending) == (None, 5, 5)  # aborted records and markers are not lag
    assert b.offset_lag == b.end >= 12 and b.idle
    assert (m.committed, m.lag, m.pending) == (offsets[2] + 1, 2, 2)
    assert m.offset_lag == m.end - offsets[2] - 1 and not m.idle


def test_open_transaction_blocks_drained(
    broker: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    txn_producer: KafkaProducer,
) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("g")
    tp = TopicPartition(topic, 0)
    _txn(txn_producer, topic, 2)
    end = _row(compute_lag(broker, [], topics_by_group={group: [topic]}), group, topic).end
    _commit(broker, group, {tp: end})
    assert drained(broker, {group: [topic]})

    txn_producer.begin_transaction()
    for i in range(3):
        txn_producer.send(topic, f"open-{i}".encode(), partition=0)
    txn_producer.flush()
    row = _row(compute_lag(broker, [group]), group, topic)
    assert row.open_transaction and row.log_end > row.end
    assert row.end == end and row.lag == 0  # nothing readable yet...
    assert not drained(broker, {group: [topic]})  # ...but something is on its way

    txn_producer.commit_transaction()
    row = _row(compute_lag(broker, [group]), group, topic)
    assert not row.open_transaction and row.lag == 3
    assert not drained(broker, {group: [topic]})


def test_unsettled_names_the_partitions_with_a_transaction_readers_cannot_see_yet(
    broker: str, new_topic: Callable[..., str], txn_producer: KafkaProducer
) -> None:
    """What `arena worker --until-drained` waits for on a stage's outputs before it says drained."""
    topic, other = new_topic(partitions=2), new_topic(partitions=1)
    _txn(txn_producer, topic, 2)
    assert unsettled(broker, [topic, other]) == []
    txn_producer.begin_transaction()
    txn_producer.send(topic, b"open", partition=1)
    txn_producer.flush()
    assert unsettled(broker, [topic, other]) == [TopicPartition(topic, 1)]
    txn_producer.commit_transaction()
    assert unsettled(broker, [topic, other]) == []
    assert unsettled(broker, ["no.such.topic"]) == []


def test_pending_is_capped(
    broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("g")
    _produce(broker, topic, {0: 50})
    row = _row(compute_lag(broker, [], topics_by_group={group: [topic]}, pending_cap=10), group, topic)
    assert (row.lag, row.pending, row.pending_capped, row.offset_lag) == (10, 10, True, 50)
    assert not drained(broker, {group: [topic]}, rows=[row])


def test_table_and_json(
    broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = new_topic(partitions=2)
    group, never = unique_name("g"), unique_name("never")
    _produce(broker, topic, {0: 3, 1: 2})
    _commit(broker, group, {TopicPartition(topic, 0): 1})
    rows = compute_lag(broker, [], topics_by_group={group: [topic], never: [topic]})

    out = io.StringIO()
    Console(file=out, width=250, color_system=None).print(render_lag_table(rows))
    text = out.getvalue()
    for column in ("GROUP", "TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "PENDING", "OFFSET LAG"):
        assert column in text
    assert group in text and "from earliest" in text
    (idle_line,) = [line for line in text.splitlines() if never in line and " 0 │" in line]
    assert "idle" in idle_line and "never ran" in idle_line and "3 records wait for it" in idle_line

    data = json.loads(lag_json(rows))
    # the group that ran: 2 behind on partition 0, 2 on partition 1; the idle one is not lagging
    assert data["total_lag"] == 4 and data["total_pending"] == 4
    assert data["idle_groups"] == [never]
    first = _row(rows, group, topic)
    (as_json,) = [r for r in data["rows"] if (r["group"], r["partition"]) == (group, 0)]
    assert as_json == {**first.model_dump(), "lag": 2, "pending": 2, "offset_lag": 2, "idle": False}
    assert lag_report(rows).rows == rows


def test_sixty_partitions_under_a_second(
    broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topics = [new_topic(partitions=4) for _ in range(15)]
    producer = KafkaProducer(bootstrap_servers=broker)
    for t in topics:
        for p in range(4):
            for _ in range(5):
                producer.send(t, b"x", partition=p)
    producer.flush()
    producer.close()
    stage, sink = unique_name("stage"), unique_name("sink")
    _commit(broker, stage, {TopicPartition(t, p): 2 for t in topics for p in range(4)})
    by_group = {stage: topics, sink: topics}

    compute_lag(broker, [], topics_by_group=by_group)  # warm-up (imports, first connections)
    t0 = time.perf_counter()
    rows = compute_lag(broker, [], topics_by_group=by_group)
    elapsed = time.perf_counter() - t0
    assert len(rows) == 120
    assert all(r.pending == (3 if r.group == stage else 5) for r in rows)
    assert elapsed < 1.0, f"compute_lag over 60 partitions x 2 groups took {elapsed:.2f}s"

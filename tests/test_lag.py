"""Consumer lag on a real broker, with and without exactly-once producers."""

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
    LagRow,
    compute_lag,
    drained,
    lag_json,
    lag_report,
    render_lag_table,
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
    assert [(r.partition, r.committed, r.end, r.lag, r.pending) for r in rows] == [
        (0, 6, 10, 4, 4),
        (1, None, 4, 4, 4),
    ]
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
    assert (row.committed, row.end, row.lag, row.pending) == (None, 3, 3, 3)
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


def test_transaction_markers_do_not_count_as_pending(
    broker: str,
    new_topic: Callable[..., str],
    unique_name: Callable[[str], str],
    txn_producer: KafkaProducer,
) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("eos")
    _txn(txn_producer, topic, 5)  # data at offsets 0..4, then the commit marker

    # The consumer processed every data record: it commits last data offset + 1.
    _commit(broker, group, {TopicPartition(topic, 0): 5})
    row = _row(compute_lag(broker, [group]), group, topic)
    assert row.committed == 5
    # Real Kafka (and noida 0.2.3) give the marker an offset: end == 6, lag 1.
    assert row.end - 5 in (0, 1)
    assert row.lag == row.end - 5
    assert row.pending == 0 and not row.open_transaction
    assert drained(broker, {group: [topic]})


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
    assert (b.committed, b.pending) == (None, 5)  # aborted records are not pending
    assert b.lag == b.end >= 9
    assert (m.committed, m.pending) == (offsets[2] + 1, 2)
    assert m.lag == m.end - offsets[2] - 1


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
    assert row.end == end and row.pending == 0  # nothing readable yet...
    assert not drained(broker, {group: [topic]})  # ...but something is on its way

    txn_producer.commit_transaction()
    row = _row(compute_lag(broker, [group]), group, topic)
    assert not row.open_transaction and row.pending == 3
    assert not drained(broker, {group: [topic]})


def test_pending_is_capped(
    broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("g")
    _produce(broker, topic, {0: 50})
    row = _row(compute_lag(broker, [], topics_by_group={group: [topic]}, pending_cap=10), group, topic)
    assert (row.lag, row.pending, row.pending_capped) == (50, 10, True)
    assert not drained(broker, {group: [topic]}, rows=[row])


def test_table_and_json(
    broker: str, new_topic: Callable[..., str], unique_name: Callable[[str], str]
) -> None:
    topic = new_topic(partitions=1)
    group = unique_name("g")
    _produce(broker, topic, {0: 3})
    rows = compute_lag(broker, [], topics_by_group={group: [topic]})

    out = io.StringIO()
    Console(file=out, width=250, color_system=None).print(render_lag_table(rows))
    text = out.getvalue()
    for column in ("GROUP", "TOPIC", "PARTITION", "COMMITTED", "END", "LAG", "PENDING"):
        assert column in text
    assert group in text and "from earliest" in text

    data = json.loads(lag_json(rows))
    assert data["total_lag"] == 3 and data["total_pending"] == 3
    assert data["rows"][0]["committed"] is None
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

"""read_committed that holds on the embedded broker: stale aborted-transaction lists are repaired.

A read_committed fetch answer carries the partition's records and a list of aborted transactions,
``(producer id, first offset)``, and the client drops a transactional batch of producer P when a
listed transaction of P began at or before it and no ABORT marker of P came in between. Kafka
lists only the aborted transactions that *overlap* the fetched range. The embedded broker
(noida-db 0.2.3) lists every aborted transaction of the partition that began before the end of the
range, including those whose ABORT marker lies before the fetch offset. A producer keeps its id
after an abort (Arena aborts open transactions on a rebalance, and a restarted worker's producer
fences its killed predecessor under the same id), so every later read that starts past the
marker treats that producer's *committed* batches as aborted and skips them: a consumer that
polls along, or a worker restarted at its committed offset, silently loses them, while a reader
starting from offset 0 sees them (the marker closes the transaction before they come).
Reproduction against the broker alone: ``tests/test_read_committed.py``.

The repair, applied to every answer before the client filters it, uses control markers: a
transactional batch's fate is the type of its producer's next marker. For each listed transaction
that began *before* the fetch offset (only those can be stale):

- a marker of its producer that this process read earlier lies between its first offset and the
  fetch offset (``Markers``): it ended before the range; the entry is dropped;
- the producer's first batch in the answer is an ABORT marker, or a data batch followed by one:
  the transaction is still open at the fetch offset; the entry stays;
- a COMMIT marker comes first: the entry is stale (that transaction ended before the fetch
  offset); it is dropped;
- the producer has data batches in the answer but no marker after them (the marker lies past the
  answer's end, cut by the last stable offset or the size limit): undecidable, so the answer is cut
  before the first such batch and the client fetches from there again, when the marker is in range.

Entries that begin inside the fetched range are exact in Kafka and on the embedded broker alike.
On a broker that lists only overlapping transactions the repair changes nothing.
"""

from __future__ import annotations

import bisect
import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("arena.read_committed")

_HEADER = struct.Struct(">qi")  # baseOffset, batchLength
_BATCH_MIN = 61  # v2 batch header size up to and including recordCount
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
ABORT, COMMIT = 0, 1

_installed = False


@dataclass(frozen=True)
class Batch:
    """The header facts of one v2 record batch in a fetch answer."""

    start: int
    """Byte position of the batch in the answer."""
    base_offset: int
    producer_id: int
    transactional: bool
    marker: int | None
    """ABORT or COMMIT for a control batch, None for data."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint at ``pos``: (value, position after it)."""
    shift = result = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7


def _marker_type(data: bytes, records_start: int) -> int | None:
    """The type of the control record that opens a control batch's records (None when unreadable)."""
    try:
        _, pos = _varint(data, records_start)  # record length
        pos += 1  # attributes
        _, pos = _varint(data, pos)  # timestamp delta
        _, pos = _varint(data, pos)  # offset delta
        key_length, pos = _varint(data, pos)
        if key_length < 4:
            return None
        _version, kind = struct.unpack_from(">hh", data, pos)
    except (IndexError, struct.error):
        return None
    return kind


def batches(data: bytes) -> list[Batch]:
    """The complete v2 batches of a fetch answer, in order (a trailing partial batch is left out)."""
    out: list[Batch] = []
    pos = 0
    while pos + _BATCH_MIN <= len(data):
        base_offset, length = _HEADER.unpack_from(data, pos)
        end = pos + 12 + length
        if end > len(data) or data[pos + 16] != 2:
            break  # partial batch, or an old message format that carries no transactions
        attributes = struct.unpack_from(">h", data, pos + 21)[0]
        producer_id = struct.unpack_from(">q", data, pos + 43)[0]
        control = bool(attributes & _CONTROL)
        out.append(
            Batch(
                start=pos,
                base_offset=base_offset,
                producer_id=producer_id,
                transactional=bool(attributes & _TRANSACTIONAL),
                marker=_marker_type(data, pos + _BATCH_MIN) if control else None,
            )
        )
        pos = end
    return out


def _fate(found: list[Batch], producer_id: int) -> tuple[bool | None, Batch | None]:
    """Whether a transaction of ``producer_id`` open before the answer was aborted.

    (True, _): an ABORT marker of the producer comes before any COMMIT marker of it;
    (False, _): a COMMIT marker comes first, or the producer has no batch here (nothing to filter);
    (None, first data batch): data of the producer with no marker after it in this answer.
    """
    first_data: Batch | None = None
    for batch in found:
        if batch.producer_id != producer_id:
            continue
        if batch.marker is not None:
            return batch.marker == ABORT, None
        if batch.transactional and first_data is None:
            first_data = batch
    return (None, first_data) if first_data is not None else (False, None)


class Markers:
    """Control markers this process has read, per partition and producer (a fact of the log).

    A listed transaction of P that began at ``first`` ended at P's first marker at or after
    ``first``; a marker of P seen in ``[first, fetch offset)`` proves the entry stale without
    waiting for a marker in the answer. A consumer reading along has seen the abort marker, so it
    never has to wait; a reader starting past it (a restarted worker) waits for a later marker.
    """

    KEPT = 64
    """Marker offsets remembered per (partition, producer): the latest ones."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, int, int], list[int]] = {}

    def record(self, partition: tuple[str, int], found: Sequence[Batch]) -> None:
        for batch in found:
            if batch.marker is None:
                continue
            offsets = self._seen.setdefault((*partition, batch.producer_id), [])
            if batch.base_offset not in offsets:
                bisect.insort(offsets, batch.base_offset)
                del offsets[: -self.KEPT]

    def ended_between(self, partition: tuple[str, int], producer_id: int, low: int, high: int) -> bool:
        """A marker of ``producer_id`` was read at an offset in ``[low, high)``."""
        offsets = self._seen.get((*partition, producer_id), [])
        index = bisect.bisect_left(offsets, low)
        return index < len(offsets) and offsets[index] < high


MARKERS = Markers()


def repair(
    fetch_offset: int,
    aborted: Sequence[tuple[int, int]],
    data: bytes,
    partition: tuple[str, int] = ("", -1),
    markers: Markers | None = None,
) -> tuple[list[int], int]:
    """Which aborted-list entries to keep, and how many bytes of ``data`` to hand to the client.

    ``aborted``: (producer id, first offset) per listed transaction; ``partition``: (topic,
    partition) of the answer, for ``markers`` (the process's, by default). Returns the indices of
    the entries to keep and the length of the answer's prefix whose transactional batches can be
    judged.
    """
    markers = MARKERS if markers is None else markers
    found = batches(data)
    keep: list[int] = []
    cut = len(data)
    for index, (producer_id, first_offset) in enumerate(aborted):
        if first_offset >= fetch_offset:
            keep.append(index)  # began inside the range: exact
            continue
        if markers.ended_between(partition, producer_id, first_offset, fetch_offset):
            continue  # ended before the range: stale
        aborted_here, undecided = _fate(found, producer_id)
        if aborted_here:
            keep.append(index)
        elif undecided is not None:
            keep.append(index)  # the batches from ``cut`` on are not handed over, so it filters nothing
            cut = min(cut, undecided.start)
    markers.record(partition, found)
    if cut < len(data):
        log.debug(
            "read_committed: %s answer from offset %d cut at byte %d (marker not in range yet)",
            partition,
            fetch_offset,
            cut,
        )
    return keep, cut


def _repaired(
    partition: tuple[str, int],
    fetch_offset: int,
    aborted: Sequence[Any],
    pairs: list[tuple[int, int]],
    data: bytes,
) -> tuple[list[Any], bytes]:
    keep, cut = repair(fetch_offset, pairs, data, partition)
    if len(keep) < len(pairs):
        log.debug(
            "read_committed: dropped %d stale aborted-transaction entr(ies) before offset %d",
            len(pairs) - len(keep),
            fetch_offset,
        )
    return [aborted[i] for i in keep], data[:cut]


def _install_aiokafka() -> None:
    from aiokafka.consumer import fetcher

    original_records = fetcher.MemoryRecords

    class KeptRecords(original_records):  # type: ignore[misc, valid-type]
        """Fetched records that keep their bytes, for the repair."""

        def __init__(self, data: bytes) -> None:
            super().__init__(data)
            self.raw = data

    original_init = fetcher.PartitionRecords.__init__

    def init(
        self: Any, tp: Any, records: Any, aborted_transactions: Any, fetch_offset: int, *rest: Any
    ) -> None:
        isolation_level = rest[-1] if rest else None
        raw = getattr(records, "raw", None)
        if aborted_transactions and raw is not None and isolation_level == fetcher.READ_COMMITTED:
            pairs = [(int(pid), int(first)) for pid, first in aborted_transactions]
            aborted_transactions, data = _repaired(
                (tp.topic, tp.partition), fetch_offset, aborted_transactions, pairs, bytes(raw)
            )
            if len(data) < len(raw):
                records = original_records(data)
        original_init(self, tp, records, aborted_transactions, fetch_offset, *rest)

    fetcher.MemoryRecords = KeptRecords
    fetcher.PartitionRecords.__init__ = init


def _install_kafka_python() -> None:
    from kafka.consumer import fetcher
    from kafka.record import MemoryRecords

    original_init = fetcher.Fetcher.PartitionRecords.__init__

    def init(self: Any, fetch_offset: int, tp: Any, records: Any, *args: Any, **kwargs: Any) -> None:
        aborted = kwargs.get("aborted_transactions")
        raw = getattr(records, "_buffer", None)
        read_committed = kwargs.get("isolation_level") == fetcher.IsolationLevel.READ_COMMITTED
        if aborted and raw is not None and read_committed:
            pairs = [(int(txn.producer_id), int(txn.first_offset)) for txn in aborted]
            kwargs["aborted_transactions"], data = _repaired(
                (tp.topic, tp.partition), fetch_offset, aborted, pairs, bytes(raw)
            )
            if len(data) < len(raw):
                records = MemoryRecords(data)
        original_init(self, fetch_offset, tp, records, *args, **kwargs)

    fetcher.Fetcher.PartitionRecords.__init__ = init


def install() -> None:
    """Repair every read_committed fetch answer of aiokafka and kafka-python (once per process)."""
    global _installed
    if _installed:
        return
    _install_aiokafka()
    _install_kafka_python()
    _installed = True

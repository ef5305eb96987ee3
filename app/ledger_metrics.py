"""/metrics families of the per-stage ledger (``consumers.ledger.stage_ledgers``, `arena stages`).

Computed when scraped, from the stages.ledger topic and the stages' input topics, and reused for
``cache_s``: reading the topics costs more than a lag probe, and the counts move slowly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from consumers.ledger import StageLedger, stage_ledgers

log = logging.getLogger("arena.metrics")

LedgerSource = Callable[[], list[StageLedger]]

OUTCOMES = ("produced", "rejected", "dead_lettered", "in_flight")


class LedgerCollector(Collector):
    """Per stage: input records by outcome, rejections by gate, dead letters by kind, balance."""

    def __init__(self, source: LedgerSource, *, cache_s: float = 15.0) -> None:
        self._source = source
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._ledgers: list[StageLedger] = []
        self._at = -float("inf")

    @classmethod
    def for_stages(
        cls, bootstrap: str, stages: Mapping[str, str], *, cache_s: float = 15.0
    ) -> LedgerCollector:
        """The ledgers of ``stages`` (name -> input topic) on ``bootstrap``."""
        wanted = dict(stages)
        return cls(lambda: stage_ledgers(bootstrap, wanted), cache_s=cache_s)

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # registering must not read topics

    def ledgers(self) -> list[StageLedger]:
        """The ledgers, recomputed when older than ``cache_s``; the last ones when the broker fails."""
        with self._lock:
            if time.monotonic() - self._at >= self.cache_s:
                try:
                    self._ledgers = self._source()
                except Exception as exc:  # a scrape must answer even when the broker is away
                    log.warning("stage ledger for /metrics failed: %s", exc)
                self._at = time.monotonic()
            return self._ledgers

    def collect(self) -> Iterator[GaugeMetricFamily]:
        ledgers = self.ledgers()
        inputs = GaugeMetricFamily(
            "arena_stage_ledger_in",
            "Data records on the stage's input topic (`arena stages` IN).",
            labels=["stage"],
        )
        records = GaugeMetricFamily(
            "arena_stage_ledger_records",
            "Input records by outcome: produced, rejected, dead_lettered, in_flight (they sum to IN).",
            labels=["stage", "outcome"],
        )
        outputs = GaugeMetricFamily(
            "arena_stage_ledger_outputs", "Records the stage emitted to its output topics.", labels=["stage"]
        )
        gates = GaugeMetricFamily(
            "arena_stage_ledger_rejected", "Rejected input records by gate.", labels=["stage", "gate"]
        )
        kinds = GaugeMetricFamily(
            "arena_stage_ledger_dead_lettered",
            "Dead-lettered input records by kind.",
            labels=["stage", "kind"],
        )
        balanced = GaugeMetricFamily(
            "arena_stage_ledger_balanced",
            "1 when in = produced + rejected + dead_lettered + in_flight; 0 flags records unaccounted for.",
            labels=["stage"],
        )
        for ledger in ledgers:
            inputs.add_metric([ledger.stage], ledger.in_)
            for outcome in OUTCOMES:
                records.add_metric([ledger.stage, outcome], getattr(ledger, outcome))
            outputs.add_metric([ledger.stage], ledger.outputs)
            for gate, n in sorted(ledger.rejected_by_gate.items()):
                gates.add_metric([ledger.stage, gate], n)
            for kind, n in sorted(ledger.dead_lettered_by_kind.items()):
                kinds.add_metric([ledger.stage, kind], n)
            balanced.add_metric([ledger.stage], int(ledger.balanced))
        yield from (inputs, records, outputs, gates, kinds, balanced)

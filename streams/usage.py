"""Every stage worker reports what its LLM calls cost: per role, every few seconds, to ``llm.usage``.

The gateway counts per (stage, role) (``Gateway.usage.stages``; the stage comes from
``arena.llm.core.CALLER``). A timer turns the counters' growth since the last report into
``LlmUsage`` records and sends them with a plain idempotent producer (accounting, not a stage
output: it is not part of the input's transaction); the lake sink persists them, so
``arena lake query "select stage, role, sum(attempts), sum(prompt_tokens) from llm_usage group by 1, 2"``
answers what each stage spent. Keys hash (stage, role, pid, window end): a resent record is
stored once.
"""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime

from aiokafka import AIOKafkaProducer

from arena.config import ArenaSettings
from arena.hashing import content_hash
from arena.llm.gateway import GatewayUsage, RoleUsage
from arena.records.llm import LlmUsage
from arena.versions import MAIN, wire
from streams.resources import open_gateway_of

log = logging.getLogger("arena.stage")

TOPIC = "llm.usage"


def usage_records(
    stage: str,
    now: GatewayUsage,
    before: dict[str, RoleUsage],
    since: datetime,
    until: datetime,
    pid: int,
) -> list[LlmUsage]:
    """One record per role of ``stage`` whose counters grew between ``before`` and ``now``."""
    records = []
    for role, usage in sorted(now.stages.get(stage, {}).items()):
        previous = before.get(role, RoleUsage())
        delta = {name: getattr(usage, name) - getattr(previous, name) for name in RoleUsage.model_fields}
        if not any(delta.values()):
            continue
        records.append(
            LlmUsage(
                stage=stage,
                role=role,
                backend=now.backend,
                model=now.model,
                pid=pid,
                window_start=since,
                window_end=until,
                **delta,
            )
        )
    return records


class UsageReporter:
    """Sends one worker's per-role usage deltas for its stage."""

    def __init__(self, settings: ArenaSettings, stage: str, bootstrap: str, *, version: str = MAIN) -> None:
        self.settings = settings
        self.stage = stage
        self.topic = wire(TOPIC, version)
        """``llm.usage`` of the data version the stage runs in."""
        self.bootstrap = bootstrap
        self._reported: dict[str, RoleUsage] = {}
        self._since = datetime.now(UTC)
        self._producer: AIOKafkaProducer | None = None

    async def report(self) -> int:
        """Send the growth since the last report; returns how many records were sent."""
        gateway = open_gateway_of(self.settings)
        if gateway is None:
            return 0
        now, until = gateway.usage, datetime.now(UTC)
        records = usage_records(self.stage, now, self._reported, self._since, until, os.getpid())
        if not records:
            return 0
        try:
            producer = await self._open()
            for record in records:
                key = content_hash([record.stage, record.role, record.pid, record.window_end.isoformat()])
                await producer.send_and_wait(self.topic, record.model_dump_json().encode(), key=key.encode())
        except Exception as exc:  # accounting must never stop a stage; the deltas go in the next report
            log.warning("%s: could not report LLM usage: %s", self.stage, exc)
            return 0
        self._reported = dict(now.stages.get(self.stage, {}))
        self._since = until
        return len(records)

    async def _open(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, enable_idempotence=True, acks="all")
            await producer.start()
            self._producer = producer
        return self._producer

    async def close(self) -> None:
        """Report what is left, then close the producer."""
        await self.report()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

"""Publishing records to Arena's topics: content-hash keys, lineage headers, idempotent producer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from arena.records.common import Lineage
from arena.topics import topic

PUBLISH_VERSION = "1"


@dataclass(frozen=True)
class Outgoing:
    topic: str
    key: str
    value: BaseModel
    source_ids: tuple[str, ...] = ()


async def publish(bootstrap: str, records: Iterable[Outgoing], *, stage: str = "publish") -> int:
    """Send records with acks=all and idempotence; returns how many were sent."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        max_request_size=8 * 1024 * 1024,
        request_timeout_ms=30_000,
    )
    await producer.start()
    sent = 0
    try:
        futures = []
        for rec in records:
            topic(rec.topic)  # undeclared topics fail before anything is sent
            headers = Lineage(source_ids=list(rec.source_ids), stage=stage, stage_version=PUBLISH_VERSION)
            futures.append(
                await producer.send(
                    rec.topic,
                    rec.value.model_dump_json().encode("utf-8"),
                    key=rec.key.encode("utf-8"),
                    headers=headers.to_headers(),
                )
            )
        for fut in futures:
            await fut
            sent += 1
    finally:
        await producer.stop()
    return sent

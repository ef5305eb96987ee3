"""Publishing records to Arena's topics: content-hash keys, lineage headers, idempotent producer."""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaProducer

from streams.runtime import Emit, encode

PUBLISH_STAGE = "publish"
PUBLISH_VERSION = "1"


async def publish(bootstrap: str, records: Iterable[Emit]) -> int:
    """Send records with acks=all and idempotence; returns how many were sent."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        max_request_size=8 * 1024 * 1024,
        request_timeout_ms=30_000,
    )
    await producer.start()
    try:
        futures = []
        for rec in records:
            # encode() rejects undeclared topics before anything is sent
            key, value, headers = encode(rec, stage=PUBLISH_STAGE, stage_version=PUBLISH_VERSION)
            futures.append(await producer.send(rec.topic, value, key=key, headers=headers))
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return len(futures)

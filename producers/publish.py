"""Publishing records to Arena's topics: content-hash keys, lineage headers, idempotent producer.

A value larger than ``claim_threshold_bytes`` is written once to the lake and the record carries a
claim to it (``streams.runtime.encode_claimed``), so a huge tool document never meets the broker's
message limit.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka import AIOKafkaProducer

from arena.config import ArenaSettings
from lake.store import ClaimCheck
from streams.runtime import Emit, encode_claimed

PUBLISH_STAGE = "publish"
PUBLISH_VERSION = "1"


async def publish(bootstrap: str, records: Iterable[Emit], *, claims: ClaimCheck | None = None) -> int:
    """Send records with acks=all and idempotence; returns how many were sent.

    ``claims`` keeps large values in the lake; by default the lake of the environment's settings
    (``ARENA_*``), which the workers read too. It is opened on the first large value only.
    """
    if claims is None:
        claims = ClaimCheck.from_settings(ArenaSettings())
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        request_timeout_ms=30_000,
    )
    await producer.start()
    try:
        futures = []
        for rec in records:
            # encode_claimed() rejects undeclared topics before anything is sent
            key, value, headers = await encode_claimed(
                rec, stage=PUBLISH_STAGE, stage_version=PUBLISH_VERSION, claims=claims
            )
            futures.append(await producer.send(rec.topic, value, key=key, headers=headers))
        for fut in futures:
            await fut
    finally:
        await producer.stop()
    return len(futures)

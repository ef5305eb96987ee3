"""Stable content hashes: the keys that make every consumer idempotent."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel


def canonical_json(obj: Any) -> bytes:
    """JSON with sorted keys and no whitespace, so equal content hashes equally."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode(
        "utf-8"
    )


def content_hash(obj: Any, *, prefix: str = "", length: int = 32) -> str:
    """Hex sha256 of the canonical JSON of ``obj`` (``bytes`` are hashed as-is)."""
    data = obj if isinstance(obj, bytes) else canonical_json(obj)
    digest = hashlib.sha256(data).hexdigest()[:length]
    return f"{prefix}{digest}"

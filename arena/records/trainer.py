"""Trainer records. Declared here so the registry is complete."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from arena.records.common import Record


class TrainerMetrics(Record):
    """Metrics of one training step; value of ``trainer.metrics``."""

    run_id: Annotated[str, Field(description="Training run.")]
    step: Annotated[int, Field(ge=0, description="Optimizer step.")]
    metrics: Annotated[dict[str, float], Field(description="loss, reward mean, fill ratio, ...")]

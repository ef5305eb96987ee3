"""EigenData-track records (EigenData §4). Declared here so the registry is complete."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from arena.records.common import Record


class EigenItem(Record):
    """One work item of an EigenData stage: seeds, intents, tasks, dialogs, validated, verified.

    The stages share one envelope; ``payload`` holds the worker's typed output.
    """

    item_id: Annotated[str, Field(description="Content hash of the payload.")]
    domain: Annotated[str, Field(description="Domain pack name.")]
    prompt_set: Annotated[str, Field(description="Prompt set (phase-1 set id) that produced it.")]
    parent_id: Annotated[str | None, Field(description="Item of the previous stage.")] = None
    payload: Annotated[dict[str, Any], Field(description="The worker's output.")]


class PilotMetrics(Record):
    """Per-iteration metrics of phase-2 pilot optimisation; value of ``eigen.pilot.metrics``."""

    prompt_set: Annotated[str, Field(description="Prompt set being optimised.")]
    iteration: Annotated[int, Field(ge=0, description="Pilot iteration.")]
    metrics: Annotated[dict[str, float], Field(description="infeasibility, tool_call_validity, quality, ...")]

"""Records every stage shares: dead letters, rejections and lineage."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field


def utcnow() -> datetime:
    return datetime.now(UTC)


MEASURED_FIELDS = frozenset({"latency_ms"})
"""Fields that measure a run (wall time) rather than describe its content: two faithful runs over
the same input differ there and nowhere else (``arena diff`` compares records without them)."""


class Record(BaseModel):
    """Base for topic values: strict about unknown fields so drift is caught."""

    model_config = ConfigDict(extra="forbid")


class DeadLetterKind(StrEnum):
    parse_error = "parse_error"
    """The value is not valid UTF-8 JSON."""
    schema_violation = "schema_violation"
    """The JSON does not match the topic's value schema."""
    crash = "crash"
    """The stage raised while processing a valid record."""
    llm_invalid_output = "llm_invalid_output"
    """An LLM role kept producing invalid output (or its judge stayed undecidable) after every retry."""
    claim_error = "claim_error"
    """The record's value is in the lake (claim check) but is missing there or does not match its hash."""


class DeadLetter(Record):
    """A record a stage could not process; value of ``<topic>.dlq``."""

    stage: Annotated[str, Field(description="Stage that gave up on the record.")]
    topic: Annotated[str, Field(description="Topic the record was read from.")]
    partition: Annotated[int | None, Field(description="Source partition, if read from Kafka.")] = None
    offset: Annotated[int | None, Field(description="Source offset, if read from Kafka.")] = None
    source_key: Annotated[
        str | None, Field(description="Key of the source record (UTF-8, replaced if not).")
    ] = None
    kind: Annotated[DeadLetterKind, Field(description="Machine-readable class of failure.")]
    reason: Annotated[str, Field(description="Human-readable explanation, e.g. the parse error.")]
    payload_text: Annotated[
        str, Field(description="The raw value decoded as UTF-8 with replacement characters.")
    ]
    payload_b64: Annotated[str, Field(description="The exact raw value, base64, so nothing is lost.")]
    llm_role: Annotated[str | None, Field(description="For llm_invalid_output: the role that failed.")] = None
    llm_raw: Annotated[
        str | None, Field(description="For llm_invalid_output: the last raw text the backend produced.")
    ] = None
    replay_of: Annotated[
        str | None,
        Field(
            description="The replay (`arena dlq replay`, '<failure id>#<attempt>') whose record the stage "
            "failed on again; None for a first failure."
        ),
    ] = None
    at: datetime = Field(default_factory=utcnow, description="When the stage gave up (UTC).")


class Rejection(Record):
    """A record a quality gate dropped; value of ``<topic>.rejected``."""

    stage: Annotated[str, Field(description="Stage whose gate said no.")]
    topic: Annotated[str, Field(description="Topic the rejected record was read from.")]
    source_key: Annotated[str, Field(description="Key of the source record.")]
    gate: Annotated[str, Field(description="Machine-readable gate name, e.g. 'min_tools'.")]
    reason: Annotated[str, Field(description="Human-readable explanation with the measured value.")]
    subject: Annotated[str, Field(description="What was dropped, e.g. 'server' or 'server/tool'.")]
    details: dict[str, Any] = Field(default_factory=dict, description="Measured values behind the decision.")
    record: Annotated[
        dict[str, Any] | None, Field(description="The dropped item as JSON, for inspection.")
    ] = None
    at: datetime = Field(default_factory=utcnow, description="When the gate decided (UTC).")


class Lineage(BaseModel):
    """Provenance carried in Kafka headers (``arena-*``) on every record."""

    source_ids: list[str] = Field(default_factory=list, description="Keys of the input records.")
    stage: str = Field(description="Producing stage (or 'publish').")
    stage_version: str = Field(description="Version of the producing stage's code.")
    prompt_version: str | None = Field(default=None, description="Prompt version id, for LLM stages.")
    backend: str | None = Field(default=None, description="LLM backend, e.g. 'rules'.")
    model: str | None = Field(default=None, description="Model name, for LLM backends.")
    version: str = Field(
        default="main", description="Data version that produced the record (arena.versions)."
    )
    at: datetime = Field(default_factory=utcnow, description="Production time (UTC).")

    def to_headers(self) -> list[tuple[str, bytes]]:
        pairs: list[tuple[str, str | None]] = [
            ("arena-source-ids", ",".join(self.source_ids)),
            ("arena-stage", self.stage),
            ("arena-stage-version", self.stage_version),
            ("arena-prompt-version", self.prompt_version),
            ("arena-backend", self.backend),
            ("arena-model", self.model),
            ("arena-version", self.version),
            ("arena-time", self.at.isoformat()),
        ]
        return [(k, v.encode()) for k, v in pairs if v]

    @classmethod
    def from_headers(cls, headers: dict[str, bytes] | list[tuple[str, bytes]] | None) -> Lineage | None:
        items = dict(headers or {})
        if "arena-stage" not in items:
            return None
        text = {k: v.decode("utf-8", "replace") for k, v in items.items() if v is not None}
        return cls(
            source_ids=[s for s in text.get("arena-source-ids", "").split(",") if s],
            stage=text["arena-stage"],
            stage_version=text.get("arena-stage-version", "?"),
            prompt_version=text.get("arena-prompt-version"),
            backend=text.get("arena-backend"),
            model=text.get("arena-model"),
            version=text.get("arena-version", "main"),
            at=datetime.fromisoformat(text["arena-time"]) if "arena-time" in text else utcnow(),
        )


class Outcome(StrEnum):
    """What a stage made of one input record (``LedgerEntry.outcome``)."""

    emitted = "emitted"
    """At least one output to a stage topic."""
    rejected = "rejected"
    """Only rejections: every candidate the record gave was dropped by a gate."""
    dead_letter = "dead_letter"
    """Dead letters (and maybe rejections), no output: the record or some of its calls failed."""
    duplicate = "duplicate"
    """Its key was handled before (``streams.dedupe``): skipped, no outputs."""
    empty = "empty"
    """Handled, and the handler returned nothing at all (entries from before every such record
    became a ``no_output`` rejection; counted as rejected)."""
    stored = "stored"
    """Its output went outside Kafka (``StageDef.effect``: the LanceDB index, the env catalog)."""
    not_addressed = "not_addressed"
    """A dead-letter replay addressed to another stage: skipped, no outputs."""


class LedgerEntry(Record):
    """One input record a stage handled; value of ``stages.ledger``.

    Written in the same transaction as the record's outputs and its offset, so an input record
    below a stage's committed offset has exactly one entry; a record without one was skipped
    (``consumers.ledger`` finds them).
    """

    stage: Annotated[str, Field(description="The stage (worker name).")]
    topic: Annotated[str, Field(description="The stage's input topic.")]
    partition: Annotated[int, Field(description="Partition of the input record.")]
    offset: Annotated[int, Field(description="Offset of the input record.")]
    key: Annotated[str, Field(description="Key of the input record (its content hash).")]
    outcome: Annotated[Outcome, Field(description="What the stage made of it.")]
    outputs: dict[str, int] = Field(
        default_factory=dict, description="Records emitted per topic (side topics included)."
    )
    rejections: dict[str, int] = Field(
        default_factory=dict, description="Rejections emitted per gate, in the order first emitted."
    )
    dead_letters: dict[str, int] = Field(
        default_factory=dict, description="Dead letters emitted per kind, in the order first emitted."
    )

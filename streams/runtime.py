"""What every stage shares: decoding, dead letters, rejections, lineage, sending.

A stage is a ``StageDef[In]``: its input topic and that topic's value model
``In``, a version, a processing guarantee, the topics it emits to, and a
``handler`` that turns one validated ``In`` record into ``Emit``s. The runtime
owns everything around the handler, so stage modules stay small:

* bytes that are not JSON, or JSON that does not match the input topic's value
  schema, go to ``<input>.dlq`` (``parse_error`` / ``schema_violation``);
* values too large for the broker travel as claims to the lake (``encode_claimed``); decoding
  reads them back and verifies their hash, and a missing or corrupt one goes to ``<input>.dlq``
  (``claim_error``);
* a handler that raises sends the record to ``<input>.dlq`` (``crash``);
* gate drops are ``Emit``s to ``<input>.rejected`` built with ``Context.reject``; a handler that
  returns nothing at all (and writes no ``effect``) gets a ``no_output`` rejection, so every input
  record ends with an output, a reason or a dead letter;
* every emitted record is keyed by a content hash and carries lineage headers;
* a stage emits only to the topics it declares (``StageDef.may_emit``): its
  ``outputs``, its input's ``.dlq``/``.rejected`` and its outputs' ``.rejected``;
  anything else raises ``UndeclaredTopic`` (a bug in the stage, not in the record).
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from arena.config import ArenaSettings
from arena.hashing import content_hash
from arena.llm.core import Answer, InvalidOutput
from arena.records.common import DeadLetter, DeadLetterKind, LedgerEntry, Lineage, Outcome, Rejection
from arena.topics import TopicSpec, topic
from arena.versions import MAIN
from lake.store import CLAIM_HEADER, ClaimCheck, ClaimError, header, open_claim

log = logging.getLogger("arena.stage")

Guarantee = Literal["exactly_once", "at_least_once"]

In = TypeVar("In", bound=BaseModel)
"""A stage's input record type: the value model of its input topic."""
M = TypeVar("M", bound=BaseModel)


class StageContractError(ValueError):
    """A ``StageDef`` that contradicts the topic registry (unknown topic, wrong input model)."""


class UndeclaredTopic(RuntimeError):
    """A stage emitted to a topic it did not declare."""

    def __init__(self, stage: str, topic: str, declared: Sequence[str]) -> None:
        self.stage = stage
        self.topic = topic
        self.declared = tuple(declared)
        super().__init__(
            f"stage {stage!r} emitted to {topic!r}, which it did not declare; "
            f"it may emit to: {', '.join(self.declared)} (fix: add the topic to the StageDef's outputs)"
        )


@dataclass(frozen=True)
class Emit:
    """One output record of a stage."""

    topic: str
    key: str
    value: BaseModel
    source_ids: tuple[str, ...] = ()
    prompt_version: str | None = None
    backend: str | None = None
    model: str | None = None


@dataclass
class Context:
    """Per-record context handed to a handler."""

    stage: str
    stage_version: str
    input: TopicSpec
    source_key: str
    settings: ArenaSettings
    raw: bytes = b""
    """The input record's exact bytes (dead letters carry them so nothing is lost)."""
    record_time: datetime | None = None
    """When the input record was written to its topic (its log time); None outside Kafka. The same
    every time the record is handled, so state it selects by time keeps re-handling deterministic."""

    def llm_dead_letter(self, exc: InvalidOutput, subject: str) -> Emit:
        """An ``Emit`` to ``<input>.dlq`` for one LLM call that never gave valid output.

        Stages that make many calls per input use it per item, so one bad
        answer does not cost the record's other outputs.
        """
        letter = dead_letter(
            self.input,
            self.raw,
            DeadLetterKind.llm_invalid_output,
            f"{subject}: {exc}",
            stage=self.stage,
            source_key=self.source_key,
        ).model_copy(update={"llm_role": exc.role, "llm_raw": exc.raw[:20000]})
        return Emit(self.input.dlq, dead_letter_key(letter), letter, (self.source_key,))

    def reject(
        self,
        gate: str,
        subject: str,
        reason: str,
        *,
        details: dict[str, Any] | None = None,
        record: dict[str, Any] | None = None,
        candidate_of: str | None = None,
    ) -> Emit:
        """An ``Emit`` to ``<topic>.rejected`` for a quality-gate drop.

        The topic is the input's, or with ``candidate_of`` the output topic the
        dropped candidate was meant for (a rejected chain goes to ``chains.rejected``).
        """
        value = Rejection(
            stage=self.stage,
            topic=self.input.name,
            source_key=self.source_key,
            gate=gate,
            reason=reason,
            subject=subject,
            details=details or {},
            record=record,
        )
        key = content_hash([self.source_key, gate, subject])
        target = topic(candidate_of).rejected if candidate_of else self.input.rejected
        return Emit(target, key, value, (self.source_key,))


Handler = Callable[[In, Context], Awaitable[Sequence[Emit]]]
"""``async def handle(record: In, ctx: Context) -> Sequence[Emit]``."""


@dataclass(frozen=True)
class StageDef(Generic[In]):
    """A stream processor between topics.

    ``input_model`` must be the value model the registry gives ``input`` (checked here, so a
    stage cannot be typed for records its topic does not carry); ``outputs`` must be
    registered topics.
    """

    name: str
    """CLI name and consumer group suffix (group id ``arena-<name>``)."""
    input: str
    """Input topic name (from the registry)."""
    input_model: type[In]
    """The input topic's value model: what the handler receives, validated."""
    version: str
    """Bumped when the stage's output for the same input changes."""
    handler: Handler[In]
    guarantee: Guarantee = "exactly_once"
    outputs: tuple[str, ...] = field(default=())
    """Topics the handler may emit to (besides the side topics, see ``may_emit``)."""
    description: str = ""
    dedupe: bool = False
    """Skip an input whose key this stage already handled (see ``streams.dedupe``)."""
    effect: str | None = None
    """Where the stage writes outside Kafka, e.g. "the LanceDB tools table". Such a stage may
    return no emits for a record it handled fully (its ledger outcome is ``stored``); any other
    stage that returns nothing gets a ``no_output`` rejection (``run_handler``)."""

    def __post_init__(self) -> None:
        try:
            spec = topic(self.input)
            for name in self.outputs:
                topic(name)
        except KeyError as exc:
            raise StageContractError(f"stage {self.name!r}: {exc.args[0]}") from None
        if spec.value is not self.input_model:
            raise StageContractError(
                f"stage {self.name!r} declares input model {self.input_model.__name__} but topic "
                f"{self.input!r} carries {spec.value.__name__} ({spec.value.__module__}); "
                f"fix: input_model={spec.value.__name__}"
            )

    @property
    def group(self) -> str:
        return f"arena-{self.name}"

    @property
    def may_emit(self) -> tuple[str, ...]:
        """Every topic the stage may emit to, sorted.

        Its ``outputs``; its input's ``.dlq`` (dead letters) and ``.rejected`` (gate drops);
        and each output's ``.rejected`` (a dropped candidate, ``Context.reject(candidate_of=...)``).
        """
        spec = topic(self.input)
        sides = [topic(name).rejected for name in self.outputs]
        return tuple(sorted({*self.outputs, spec.dlq, spec.rejected, *sides}))

    def check_emits(self, emits: Sequence[Emit]) -> None:
        """Raise ``UndeclaredTopic`` for the first emit to a topic the stage did not declare."""
        allowed = self.may_emit
        for emit in emits:
            if emit.topic not in allowed:
                raise UndeclaredTopic(self.name, emit.topic, allowed)


@dataclass(frozen=True)
class Decoded(Generic[M]):
    """Result of decoding one raw input value."""

    record: M | None
    dead_letter: DeadLetter | None
    raw: bytes = b""
    """The value that was decoded: the record's bytes, or for a claimed record the value from the lake."""


RecordHeaders = Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None
"""A Kafka record's headers as clients hand them over (pairs, or a mapping)."""


def decode(
    spec: TopicSpec,
    raw: bytes | None,
    *,
    stage: str,
    source_key: str | None,
    partition: int | None = None,
    offset: int | None = None,
    headers: RecordHeaders = None,
    claims: ClaimCheck | None = None,
) -> Decoded[BaseModel]:
    """Validate ``raw`` against the topic's value schema, or explain why not.

    A record with an ``arena-claim`` header has its value in the lake: it is read with ``claims``
    and verified first (a missing or corrupt one is a ``claim_error`` dead letter). Stream code
    uses ``decode_async``, which reads it in a worker thread.
    """
    return _decode(spec.value, spec, raw, stage, source_key, partition, offset, headers, claims)


def decode_input(
    stage: StageDef[In],
    raw: bytes | None,
    *,
    source_key: str | None,
    partition: int | None = None,
    offset: int | None = None,
    headers: RecordHeaders = None,
    claims: ClaimCheck | None = None,
) -> Decoded[In]:
    """``decode`` for ``stage``'s input topic, typed as the stage's input model.

    ``StageDef`` checked that its ``input_model`` is the topic's value model, so this is the
    same validation ``decode`` does.
    """
    return _decode(
        stage.input_model, topic(stage.input), raw, stage.name, source_key, partition, offset, headers, claims
    )


async def decode_async(
    spec: TopicSpec,
    raw: bytes | None,
    *,
    stage: str,
    source_key: str | None,
    partition: int | None = None,
    offset: int | None = None,
    headers: RecordHeaders = None,
    claims: ClaimCheck | None = None,
) -> Decoded[BaseModel]:
    """``decode`` that reads and validates a claimed value in a worker thread (the loop never waits)."""
    run = partial(_decode, spec.value, spec, raw, stage, source_key, partition, offset, headers, claims)
    return run() if header(headers, CLAIM_HEADER) is None else await asyncio.to_thread(run)


async def decode_input_async(
    stage: StageDef[In],
    raw: bytes | None,
    *,
    source_key: str | None,
    partition: int | None = None,
    offset: int | None = None,
    headers: RecordHeaders = None,
    claims: ClaimCheck | None = None,
) -> Decoded[In]:
    """``decode_input`` that reads and validates a claimed value in a worker thread."""
    spec = topic(stage.input)
    run = partial(
        _decode, stage.input_model, spec, raw, stage.name, source_key, partition, offset, headers, claims
    )
    return run() if header(headers, CLAIM_HEADER) is None else await asyncio.to_thread(run)


def _decode(
    model: type[M],
    spec: TopicSpec,
    raw: bytes | None,
    stage: str,
    source_key: str | None,
    partition: int | None,
    offset: int | None,
    headers: RecordHeaders = None,
    claims: ClaimCheck | None = None,
) -> Decoded[M]:
    data = raw or b""
    kind: DeadLetterKind
    try:
        data = open_claim(data, headers, claims)
        return Decoded(model.model_validate_json(data.decode("utf-8")), None, data)
    except ClaimError as exc:
        kind, reason = DeadLetterKind.claim_error, f"{exc} (fix: re-publish the record)"
    except UnicodeDecodeError as exc:
        kind, reason = DeadLetterKind.parse_error, f"not UTF-8: {exc}"
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            kind, reason = DeadLetterKind.parse_error, f"not JSON: {exc.errors()[0]['msg']}"
        else:
            kind, reason = DeadLetterKind.schema_violation, _short_validation_error(spec, exc)
    return Decoded(
        None,
        dead_letter(
            spec, data, kind, reason, stage=stage, source_key=source_key, partition=partition, offset=offset
        ),
        data,
    )


def dead_letter(
    spec: TopicSpec,
    raw: bytes,
    kind: DeadLetterKind,
    reason: str,
    *,
    stage: str,
    source_key: str | None,
    partition: int | None = None,
    offset: int | None = None,
) -> DeadLetter:
    return DeadLetter(
        stage=stage,
        topic=spec.name,
        partition=partition,
        offset=offset,
        source_key=source_key,
        kind=kind,
        reason=reason[:4000],
        payload_text=raw.decode("utf-8", "replace"),
        payload_b64=base64.b64encode(raw).decode("ascii"),
    )


def dead_letter_key(letter: DeadLetter) -> str:
    """The letter's key: its record, kind and reason, and the replay it failed on (if one)."""
    parts = [letter.topic, letter.payload_b64, letter.kind, letter.reason]
    return content_hash(parts if letter.replay_of is None else [*parts, letter.replay_of])


def place_dead_letters(
    emits: Sequence[Emit], dlq: str, *, partition: int, offset: int, replay_of: str | None
) -> list[Emit]:
    """``emits`` with each dead letter to ``dlq`` stamped with where its record was read and the
    replay it came in (``replay_of``), keyed anew.

    Every letter a stage sends then says it was read from the topic (``arena dlq replay`` addresses
    its replay to that stage alone) and which replay, if any, failed again.
    """
    out: list[Emit] = []
    for emit in emits:
        if emit.topic == dlq and isinstance(emit.value, DeadLetter):
            letter = emit.value.model_copy(
                update={"partition": partition, "offset": offset, "replay_of": replay_of}
            )
            emit = replace(emit, key=dead_letter_key(letter), value=letter)
        out.append(emit)
    return out


def _short_validation_error(spec: TopicSpec, exc: ValidationError) -> str:
    problems = [
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}" for err in exc.errors()[:5]
    ]
    more = f" (+{exc.error_count() - 5} more)" if exc.error_count() > 5 else ""
    return f"does not match {spec.value.__name__}: " + "; ".join(problems) + more


def encode(
    emit: Emit, *, stage: str, stage_version: str, version: str = MAIN
) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Key bytes, value bytes and lineage headers of an ``Emit`` (the whole value; see ``encode_claimed``).

    ``version``: the data version whose stage made it (its ``arena-version`` header).
    """
    topic(emit.topic)  # fail loudly on an undeclared topic
    lineage = Lineage(
        source_ids=list(emit.source_ids),
        stage=stage,
        stage_version=stage_version,
        prompt_version=emit.prompt_version,
        backend=emit.backend,
        model=emit.model,
        version=version,
    )
    value = emit.value.model_dump_json().encode("utf-8")
    return emit.key.encode("utf-8"), value, lineage.to_headers()


async def encode_claimed(
    emit: Emit, *, stage: str, stage_version: str, claims: ClaimCheck, version: str = MAIN
) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """``encode`` for the wire: a value over ``claims.threshold`` is written once to the lake and
    the record carries a small claim to it (``arena-claim`` header, JSON envelope value).

    Small values are sent exactly as ``encode`` makes them. Every producer of Arena records sends
    through here, so no record can exceed the broker's message limit.
    """
    key, value, headers = encode(emit, stage=stage, stage_version=stage_version, version=version)
    value, headers = await claims.seal_async(value, headers)
    return key, value, headers


async def run_handler(stage: StageDef[In], record: In, ctx: Context, raw: bytes) -> list[Emit]:
    """Call the handler; a crash becomes a dead letter instead of killing the worker.

    Every path from a handler to Kafka goes through here, so this is where the stage's declared
    topics are enforced: an emit to any other topic raises ``UndeclaredTopic`` (a bug in the
    stage, the same for every record, so it is not dead-lettered).
    """
    try:
        emits = list(await stage.handler(record, ctx))
    except InvalidOutput as exc:
        log.warning("stage %s: %s on %s", stage.name, exc, ctx.source_key)
        return [ctx.llm_dead_letter(exc, "record")]
    except Exception as exc:  # a stage never dies on one record
        log.exception("stage %s crashed on %s", stage.name, ctx.source_key)
        letter = dead_letter(
            ctx.input,
            raw,
            DeadLetterKind.crash,
            f"{type(exc).__name__}: {exc}",
            stage=stage.name,
            source_key=ctx.source_key,
        )
        return [Emit(ctx.input.dlq, dead_letter_key(letter), letter, (ctx.source_key,))]
    if not emits and stage.effect is None:
        emits = [no_output(ctx)]
    stage.check_emits(emits)
    return emits


NO_OUTPUT_GATE = "no_output"


def no_output(ctx: Context) -> Emit:
    """The rejection of a record its stage handled without an output, a rejection or a dead letter.

    A drop is data: the ledger and ``<input>.rejected`` say which record ended here. Stages name
    their own gates where they know why (``chains``: ``no_walk``); this one says they did not.
    """
    return ctx.reject(
        NO_OUTPUT_GATE,
        ctx.source_key,
        f"stage {ctx.stage} made no output from this record and named no gate",
    )


LEDGER_TOPIC = "stages.ledger"


def outcome_of(
    emits: Sequence[Emit], *, duplicate: bool = False, stored: bool = False, not_addressed: bool = False
) -> Outcome:
    """What ``emits`` say a stage made of its input record (see ``Outcome``).

    ``stored``: the stage writes its output outside Kafka (``StageDef.effect``), so a record that
    made no emit at all was stored there.
    """
    if not_addressed:
        return Outcome.not_addressed
    if duplicate:
        return Outcome.duplicate
    sides = [topic(emit.topic).side_of is not None for emit in emits]
    if not all(sides):
        return Outcome.emitted
    if any(emit.topic.endswith(".dlq") for emit in emits):
        return Outcome.dead_letter
    if emits:
        return Outcome.rejected
    return Outcome.stored if stored else Outcome.empty


def ledger_emit(
    stage: str,
    input_topic: str,
    partition: int,
    offset: int,
    key: str,
    emits: Sequence[Emit],
    *,
    duplicate: bool,
    stored: bool = False,
    not_addressed: bool = False,
) -> Emit:
    """The ``stages.ledger`` entry of one handled input record (sent in its transaction)."""
    outputs: dict[str, int] = {}
    rejections: dict[str, int] = {}
    dead_letters: dict[str, int] = {}
    for emit in emits:
        outputs[emit.topic] = outputs.get(emit.topic, 0) + 1
        if isinstance(emit.value, Rejection):
            rejections[emit.value.gate] = rejections.get(emit.value.gate, 0) + 1
        elif isinstance(emit.value, DeadLetter):
            dead_letters[emit.value.kind] = dead_letters.get(emit.value.kind, 0) + 1
    entry = LedgerEntry(
        stage=stage,
        topic=input_topic,
        partition=partition,
        offset=offset,
        key=key,
        outcome=outcome_of(emits, duplicate=duplicate, stored=stored, not_addressed=not_addressed),
        outputs=outputs,
        rejections=rejections,
        dead_letters=dead_letters,
    )
    ledger_key = content_hash([stage, input_topic, partition, offset], prefix="led-", length=24)
    return Emit(LEDGER_TOPIC, ledger_key, entry, (key,))


def llm_lineage(answers: Sequence[Answer[Any]]) -> dict[str, str | None]:
    """Lineage fields (prompt versions, backend, model) for an output built from these answers."""
    if not answers:
        return {"prompt_version": None, "backend": None, "model": None}
    versions = sorted({f"{a.role}={a.prompt_version}" for a in answers})
    return {"prompt_version": ";".join(versions), "backend": answers[0].backend, "model": answers[0].model}

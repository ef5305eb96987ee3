"""`arena replay`: plan a data version, copy its input, create its topics, record it.

A replay of stage S into version V runs S and every stage downstream of it (``downstream``) in V,
over a chosen range of S's input in the parent version, with setting and prompt overrides. The
plan says which topics V has (``version_topics``), which records it replays and which it inherits
(``producers.version_input``), and what that is likely to cost (``estimate_calls``, from the
parent's ``llm_usage`` and ledger in the lake). Nothing upstream of S runs again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from app.cli_common import UserError
from app.registry import CLIENTS, STAGES
from arena.config import ArenaSettings, did_you_mean, env_name, redact_url, setting_keys
from arena.llm.core import PromptError, with_prompt
from arena.topics import TOPICS, topic
from arena.versions import MAIN, VersionNameError, VersionSpec, check_name, wire
from lake.catalog import Catalog
from lake.query import LakeQuery, LakeQueryError
from lake.store import ClaimCheck, open_store
from producers.version_input import (
    CopiedRecord,
    VersionInputError,
    bounds,
    copied,
    copy_into,
    input_ranges,
    offsets_at,
    read_replayed,
    written_elsewhere,
)
from streams.admin import ensure_topics
from streams.runtime import LEDGER_TOPIC, StageDef

USAGE_TOPIC = "llm.usage"

TRAINER_INPUTS = ("samples.sft", "samples.verified")
"""What `arena train --version` reads: every version has them (empty where no stage of it writes
them), so the trainer never meets a topic a client auto-created with the broker's default partitions."""

FIXED_SETTINGS = ("home", "broker", "lake_url", "lancedb_uri", "catalog_url", "metrics", "worker_fork")
"""Settings a version cannot override: where the stack is (a version lives in the same one)."""


def _stage(name: str) -> StageDef[Any]:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise UserError(f"unknown stage {name!r} (fix: one of {', '.join(s.name for s in STAGES)})")


def downstream(name: str) -> tuple[str, ...]:
    """Stage ``name`` and every stage that reads, directly or not, what it writes (side topics
    aside), in registry (dataflow) order."""
    chosen = {name}
    grew = True
    while grew:
        made = {t for s in STAGES if s.name in chosen for t in s.outputs}
        more = {s.name for s in STAGES if s.input in made} - chosen
        chosen |= more
        grew = bool(more)
    return tuple(s.name for s in STAGES if s.name in chosen)


def version_topics(stages: Sequence[str]) -> tuple[str, ...]:
    """Registry topics a version running ``stages`` has its own copy of: what they read and may write,
    their ledger and LLM usage."""
    names: set[str] = {LEDGER_TOPIC, USAGE_TOPIC, *trainer_topics()}
    for stage in STAGES:
        if stage.name in stages:
            names |= {stage.input, *stage.may_emit}
    return tuple(t for t in TOPICS if t in names)


def trainer_topics() -> list[str]:
    """The trainer's inputs and their side topics (where it sends samples it cannot use)."""
    return [t for name in TRAINER_INPUTS for t in (name, topic(name).dlq, topic(name).rejected)]


def inherited_topics(stages: Sequence[str], replayed: str) -> tuple[str, ...]:
    """Inputs of ``stages`` (other than the replayed one's) that something outside them writes too."""
    running = set(stages)
    inputs = {s.input for s in STAGES if s.name in running} - {replayed}
    outside = {t for s in STAGES if s.name not in running for t in s.outputs}
    outside |= {t for client in CLIENTS for t in client.writes}
    return tuple(t for t in TOPICS if t in inputs and t in outside)


class Bound(BaseModel):
    """One end of the replayed range, as given: an offset (every partition) or a time."""

    offset: int | None = Field(default=None, ge=0)
    time_ms: int | None = None


def parse_bound(text: str | None, option: str) -> Bound | None:
    """``--from``/``--until``: an offset (``120``) or an ISO time (``2026-11-30T08:00:00Z``)."""
    if text is None:
        return None
    if text.isdigit():
        return Bound(offset=int(text))
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(
            f"{option} {text!r} is neither an offset nor a time (fix: an offset such as 120, or an ISO "
            "time such as 2026-11-30T08:00:00Z)"
        ) from None
    when = when if when.tzinfo else when.replace(tzinfo=UTC)
    return Bound(time_ms=int(when.timestamp() * 1000))


def parse_settings(pairs: Sequence[str]) -> dict[str, str]:
    """``--set KEY=VALUE`` (``sft.theta_question_quality=0.9``) as environment values, checked."""
    keys = setting_keys()
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UserError(
                f"--set {pair!r} is not KEY=VALUE (fix: e.g. --set sft.theta_question_quality=0.9)"
            )
        if key not in keys:
            raise UserError(
                f"--set {key}: no such setting{did_you_mean(key)} (fix: `arena config` lists every key)"
            )
        if key.split(".")[0] in FIXED_SETTINGS:
            raise UserError(f"--set {key}: a version lives in the same stack; where it is cannot change")
        env[env_name(key)] = value
    try:
        with _environment(env):
            ArenaSettings()
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"])
        raise UserError(f"--set: {where}: {problem['msg']} (fix: give a value the setting takes)") from None
    return env


class _environment:
    """``os.environ`` with ``values`` on top, inside the block (to validate overrides)."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)
        self.before: dict[str, str | None] = {}

    def __enter__(self) -> None:
        for name, value in self.values.items():
            self.before[name] = os.environ.get(name)
            os.environ[name] = value

    def __exit__(self, *exc: object) -> None:
        for name, value in self.before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def parse_prompts(pairs: Sequence[str]) -> dict[str, str]:
    """``--prompt ROLE=FILE`` as role -> prompt text, checked against the role (``with_prompt``)."""
    from arena.llm.roles.registry import roles

    known = roles()
    texts: dict[str, str] = {}
    for pair in pairs:
        role, sep, file = pair.partition("=")
        if not sep or role not in known:
            raise UserError(
                f"--prompt {pair!r}: no role {role!r} (fix: ROLE=FILE with a role from `arena llm prompt --list`)"
            )
        path = Path(file).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(
                f"--prompt {role}={file}: {exc.strerror or exc} (fix: name a readable file)"
            ) from None
        try:
            with_prompt(known[role], text)
        except PromptError as exc:
            raise UserError(f"--prompt {role}={file}: {exc}") from None
        texts[role] = text
    return texts


@dataclass(frozen=True)
class ReplayPlan:
    """What a replay will do: the version's spec, and the records it copies into the version."""

    spec: VersionSpec
    copies: dict[str, list[CopiedRecord]]
    """Target topic (the version's) -> the records copied there: the replayed range, the inherited."""
    estimate: dict[str, float]
    """Estimated LLM use (``estimate_calls``); empty when the parent has no usage in the lake."""


async def plan(
    settings: ArenaSettings,
    bootstrap: str,
    *,
    stage: str,
    name: str,
    parent: str,
    start: Bound | None,
    until: Bound | None,
    every: bool,
    overrides: dict[str, str],
    prompts: dict[str, str],
) -> ReplayPlan:
    """Resolve the range, read the records to copy and build the version's spec."""
    try:
        check_name(name, new=True)
        check_name(parent)
    except VersionNameError as exc:
        raise UserError(str(exc)) from None
    replayed = _stage(stage)
    if not every and start is None:
        raise UserError("say which input records to replay (fix: --all, --from OFFSET or --from TIME)")
    catalog = Catalog(settings.catalog)
    try:
        if catalog.data_version(name) is not None:
            raise UserError(
                f"data version {name!r} exists (fix: another name, or `arena data-versions drop {name}`)"
            )
        parent_spec = catalog.data_version(parent) if parent != MAIN else None
    finally:
        catalog.dispose()
    if parent != MAIN and (parent_spec is None or replayed.name not in parent_spec.stages):
        raise UserError(
            f"version {parent!r} does not run stage {stage!r}, so it has no input for it "
            "(fix: --parent main, or a version made by replaying that stage or one upstream of it)"
        )
    stages = downstream(replayed.name)
    source = wire(replayed.input, parent)
    spec_in = topic(replayed.input)
    ranges = await _ranges(bootstrap, source, spec_in.partitions, start, until, every)
    store = open_store(settings)
    try:
        replay = await read_replayed(bootstrap, store, source, ranges)
        copies = {wire(replayed.input, name): replay}
        inherited: dict[str, int] = {}
        # Only a replay of the whole input makes a complete alternative to the parent; one of a range
        # holds what descends from that range alone (inheriting would re-run every other record).
        complete = every and until is None
        outside = written_elsewhere(stages)
        for shared in inherited_topics(stages, replayed.input) if complete else ():
            parent_topic = wire(shared, parent)
            held = await bounds(bootstrap, parent_topic, topic(shared).partitions)
            every_record = [(b.partition, 0, b.end) for b in held]
            found = await read_replayed(bootstrap, store, parent_topic, every_record)
            kept = [r for r in found if outside(r)]
            copies[wire(shared, name)] = kept
            inherited[shared] = len(kept)
    except VersionInputError as exc:
        raise UserError(f"{exc} (fix: a narrower range, or let the lake sink catch up)") from None
    prompt_versions = {role: _prompt_version(role, text) for role, text in prompts.items()}
    spec = VersionSpec(
        name=name,
        parent=parent,
        stage=replayed.name,
        stages=stages,
        input_topic=replayed.input,
        topics=version_topics(stages),
        ranges=tuple(input_ranges(replay, ranges)),
        inherited=inherited,
        settings=overrides,
        prompts=prompts,
        prompt_versions=prompt_versions,
        llm=redact_url(_llm_of(settings, overrides)),
        created_at=datetime.now(UTC),
    )
    return ReplayPlan(spec, copies, estimate_calls(settings, spec))


def _llm_of(settings: ArenaSettings, overrides: Mapping[str, str]) -> str:
    return overrides.get(env_name("llm"), settings.llm)


def _prompt_version(role: str, text: str) -> str:
    from arena.llm.roles.registry import roles

    return with_prompt(roles()[role], text).version


async def _ranges(
    bootstrap: str, source: str, partitions: int, start: Bound | None, until: Bound | None, every: bool
) -> list[tuple[int, int, int]]:
    """(partition, start, end) of the replayed range of every partition of ``source``."""
    held = {b.partition: b for b in await bounds(bootstrap, source, partitions)}
    begin = await _resolve(bootstrap, source, partitions, None if every else start, held, default=0)
    end = await _resolve(bootstrap, source, partitions, until, held, default=None)
    return [(p, begin[p], max(begin[p], min(end[p], held[p].end))) for p in sorted(held)]


async def _resolve(
    bootstrap: str,
    source: str,
    partitions: int,
    bound: Bound | None,
    held: dict[int, Any],
    default: int | None,
) -> dict[int, int]:
    """One bound as an offset per partition (``default`` None: the partition's end)."""
    if bound is None:
        return {p: (b.end if default is None else default) for p, b in held.items()}
    if bound.offset is not None:
        return {p: bound.offset for p in held}
    assert bound.time_ms is not None
    at = await offsets_at(bootstrap, source, partitions, bound.time_ms)
    return {p: (held[p].end if at[p] is None else int(at[p] or 0)) for p in held}


def estimate_calls(settings: ArenaSettings, spec: VersionSpec) -> dict[str, float]:
    """The LLM calls (and requests, tokens) the version's stages are likely to make, from what they
    cost in the parent (``llm_usage``, ledger): empty when the lake has none of the parent yet.

    The replayed stage costs its calls per input record times the records replayed. A stage
    downstream of it costs, of its calls in the parent, the share that the replayed records fed: all
    of them when the version inherits the rest (a replay of the whole input), else the replayed
    share of the records the stage read that the replayed stage made (``tasks`` is also written by
    ``tasks-from-servers``). Requests are an upper bound: a cached answer costs none.
    """
    stages = ", ".join(f"'{s}'" for s in spec.stages)
    usage_sql = (
        "select stage, coalesce(sum(calls), 0) as calls, coalesce(sum(attempts), 0) as requests, "
        "coalesce(sum(prompt_tokens + completion_tokens), 0) as tokens from llm_usage "
        f"where _version = '{spec.parent}' and stage in ({stages}) group by stage"
    )
    made_sql = (
        f"select count(*) filter (where stage = '{spec.stage}') as handled, "
        f"count(*) filter (where stage = '{spec.stage}' and outcome in ('emitted', 'stored')) as produced "
        f"from stages_ledger where _version = '{spec.parent}' and outcome != 'not_addressed'"
    )
    try:
        query = LakeQuery(open_store(settings))
        usage = {row["stage"]: row for row in query.query(usage_sql).to_pylist()}
        made = query.query(made_sql).to_pylist()[0]
        share = _fed_share(query, spec) if not spec.inherited else 1.0
    except LakeQueryError:
        return {}
    handled = int(made["handled"] or 0)
    if not handled or not usage:
        return {}
    replayed = spec.records / handled
    totals = {"calls": 0.0, "requests": 0.0, "tokens": 0.0}
    for stage, row in usage.items():
        scale = replayed if stage == spec.stage else replayed * share
        for name in totals:
            totals[name] += float(row[name]) * scale
    return {**{k: round(v, 1) for k, v in totals.items()}, "parent_inputs": float(handled)}


def _fed_share(query: LakeQuery, spec: VersionSpec) -> float:
    """Of the records the replayed stage's outputs topics hold in the parent, the share it wrote."""
    replayed = next(s for s in STAGES if s.name == spec.stage)
    outputs = [topic(t).table for t in replayed.outputs]
    if not outputs:
        return 1.0
    parts = " union all ".join(f"select _headers from {t} where _version = '{spec.parent}'" for t in outputs)
    row = query.query(
        f"select count(*) as total, count(*) filter (where json_extract_string(_headers, '$.\"arena-stage\"') "
        f"= '{spec.stage}') as mine from ({parts})"
    ).to_pylist()[0]
    return float(row["mine"]) / float(row["total"]) if row["total"] else 1.0


def create_topics(bootstrap: str, spec: VersionSpec) -> list[str]:
    """Create the version's topics (same partitions and configs as the registry's); returns new ones."""
    return versioned_topics(bootstrap, spec.name, spec.topics)


def versioned_topics(bootstrap: str, version: str, names: Sequence[str]) -> list[str]:
    """Create ``version``'s copies of registry topics ``names`` that are missing; returns new ones."""
    return ensure_topics(bootstrap, [replace(topic(t), name=wire(t, version)) for t in names])


async def execute(settings: ArenaSettings, bootstrap: str, plan: ReplayPlan) -> int:
    """Create the version's topics, copy its input in one transaction and record it in the catalog.

    Returns the records copied. A replay killed after its copy committed but before the catalog
    row was written is finished here without copying again (``copied`` finds the committed input).
    """
    spec = plan.spec
    create_topics(bootstrap, spec)
    target = wire(spec.input_topic, spec.name)
    sent = 0
    if await copied(bootstrap, target, topic(spec.input_topic).partitions) == 0:
        claims = ClaimCheck(open_store(settings), settings.claim_threshold_bytes)
        sent = await copy_into(
            bootstrap, claims, plan.copies, parent=spec.parent, transactional_id=f"arena-replay-{spec.name}"
        )
    catalog = Catalog(settings.catalog)
    try:
        for role, text in spec.prompts.items():
            catalog.register_prompt(role, with_prompt(_role(role), text).prompt_text)
        if not catalog.record_version(spec):
            raise UserError(f"data version {spec.name!r} was made meanwhile by another replay")
    finally:
        catalog.dispose()
    return sent


def _role(name: str) -> Any:
    from arena.llm.roles.registry import roles

    return roles()[name]

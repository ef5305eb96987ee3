"""`arena trace`: where a record came from and what it fed, from the catalog's lineage edges.

Backward, edges lead from the record (a sample, trajectory, environment, dead letter, ...) up to
its roots: the published source documents (``tools.raw``, ``qa.seeds``, ``eigen.seeds`` keys),
each edge with its stage and version, the prompt versions of its LLM roles (joined to the
catalog's ``prompt_versions``: role and version number), backend and model. Forward, edges lead
down to every descendant, the samples (``samples.*``) among them, and from the samples to the
training steps that used them (``trainer_step_samples``, written with each step record).

A dead letter's edge leads to the key of the record that failed, so its trace goes on from there.
Source documents and tool servers carry where they came from, read from their lake rows: the file
(or URI) they were published from and the tool server they belong to.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.config import ArenaSettings
from arena.versions import split_wire
from lake.catalog import Catalog, LineageEdge, StepSample

MIN_PREFIX = 8
"""Shortest key prefix accepted (like git's abbreviated hashes)."""
SOURCE_TOPICS = ("tools.raw", "qa.seeds", "eigen.seeds")
"""Topics records are published to: where every lineage chain starts."""
ORIGIN_FIELDS: dict[str, dict[str, str]] = {
    "tools.raw": {"file": "source", "server": "server"},
    "tools.servers": {"file": "source", "server": "name"},
    "qa.seeds": {"file": "source"},
    "eigen.seeds": {},
}
"""Topics read from the lake for a trace: ``TraceNode`` field -> the value field that holds it."""
KEY_QUERY = "select _key from samples_sft limit 5"
"""A lake query that lists record keys (any topic's view has the ``_key`` column)."""

NodeKind = Literal["source", "record", "sample", "dead_letter", "training_step"]


class TraceError(ValueError):
    """An id that names no record, or more than one; the message says how to find keys."""


class PromptRef(BaseModel):
    """A prompt version an edge's LLM role used."""

    role: Annotated[str, Field(description="The LLM role, e.g. 'agent_policy'.")]
    id: Annotated[str, Field(description="Prompt version id (pv-...), a catalog prompt_versions row.")]
    version: Annotated[
        int | None, Field(description="The role's version number; None when not in the catalog.")
    ]


class TraceNode(BaseModel):
    """A record (or a training step) on the trace."""

    id: Annotated[str, Field(description="The record key; for a training step '<run>@<step>'.")]
    kind: Annotated[NodeKind, Field(description="source, record, sample, dead_letter or training_step.")]
    topic: Annotated[str | None, Field(description="Topic of the record; None when the catalog cannot tell.")]
    depth: Annotated[
        int, Field(description="Hops from the traced record: negative up (ancestors), positive down.")
    ]
    run: Annotated[str | None, Field(description="Training steps: the run name.")] = None
    step: Annotated[int | None, Field(description="Training steps: the optimizer step.")] = None
    phase: Annotated[str | None, Field(description="Training steps: sft or grpo.")] = None
    file: Annotated[
        str | None,
        Field(description="File or URI the record was published from (tools.raw, tools.servers, qa.seeds)."),
    ] = None
    server: Annotated[
        str | None, Field(description="Tool server the record belongs to (tools.raw, tools.servers).")
    ] = None


class TraceEdge(BaseModel):
    """``child`` was made from ``parent`` (or, for a training step, used ``parent``)."""

    parent: Annotated[str, Field(description="Node id of the input.")]
    child: Annotated[str, Field(description="Node id of the output.")]
    stage: Annotated[str, Field(description="Stage that made the child ('train' for a training step).")]
    stage_version: Annotated[str, Field(description="Version of the stage's code.")] = ""
    data_version: Annotated[
        str, Field(description="The data version the child belongs to (main, or one `arena replay` made).")
    ] = "main"
    prompts: Annotated[list[PromptRef], Field(description="Prompt versions of the LLM roles used.")] = []
    backend: Annotated[str | None, Field(description="LLM backend, e.g. 'rules'.")] = None
    model: Annotated[str | None, Field(description="LLM model name.")] = None
    at: Annotated[datetime | None, Field(description="When the child was produced (UTC).")] = None
    roles: Annotated[
        list[str], Field(description="Training steps: what the step did with the sample (trained, ...).")
    ] = []


class TraceReport(BaseModel):
    """Everything `arena trace ID` shows."""

    record: Annotated[TraceNode, Field(description="The traced record.")]
    nodes: Annotated[dict[str, TraceNode], Field(description="Every node on the trace by id.")]
    ancestors: Annotated[list[TraceEdge], Field(description="Edges from the record up to its sources.")]
    descendants: Annotated[
        list[TraceEdge], Field(description="Edges from the record down to samples and training steps.")
    ]
    sources: Annotated[list[str], Field(description="Ids of the source documents the record came from.")]
    samples: Annotated[list[str], Field(description="Ids of the samples it became (or is).")]
    training_steps: Annotated[list[str], Field(description="Ids ('<run>@<step>') of the steps it fed.")]
    truncated: Annotated[bool, Field(description="The walk stopped at ``depth`` with edges left.")] = False


def parse_prompts(text: str | None, known: dict[str, tuple[str, int]]) -> list[PromptRef]:
    """``role=pv-..;role2=pv-..`` (``streams.runtime.llm_lineage``) as prompt refs.

    ``known`` maps prompt version ids to (role, version) from the catalog.
    """
    refs: list[PromptRef] = []
    for part in (text or "").split(";"):
        part = part.strip()
        if not part:
            continue
        role, _, pid = part.rpartition("=")
        entry = known.get(pid)
        refs.append(
            PromptRef(role=role or (entry[0] if entry else "?"), id=pid, version=entry[1] if entry else None)
        )
    return refs


def _prompt_ids(edges: Iterable[LineageEdge]) -> list[str]:
    ids = {part.rpartition("=")[2].strip() for e in edges for part in (e.prompt_version or "").split(";")}
    return sorted(i for i in ids if i)


def resolve_id(catalog: Catalog, record_id: str) -> str:
    """The full key ``record_id`` names: itself when the catalog knows it, else its unique prefix."""
    rid = record_id.strip()
    hint = f'find keys with `arena lake query "{KEY_QUERY}"` (any topic\'s view)'
    if not rid:
        raise TraceError(f"give a record id; {hint}")
    matches = catalog.keys_with_prefix(rid)
    if rid in matches:
        return rid
    if len(rid) < MIN_PREFIX:
        raise TraceError(
            f"{rid!r} is not a known key and too short for a prefix (give at least {MIN_PREFIX} characters)"
        )
    if not matches:
        raise TraceError(f"no record {rid!r} in the catalog's lineage; {hint}")
    if len(matches) > 1:
        raise TraceError(
            f"{rid!r} is ambiguous: it starts {', '.join(matches[:5])}{' ...' if len(matches) > 5 else ''}; give more characters"
        )
    return matches[0]


def _kind(topic: str | None, has_parents: bool) -> NodeKind:
    topic = None if topic is None else split_wire(topic)[1]  # a data version's copy of the topic
    if topic is not None and topic.endswith(".dlq"):
        return "dead_letter"
    if topic is not None and topic.startswith("samples."):
        return "sample"
    if not has_parents:
        return "source"
    return "record"


class _Walk:
    """Breadth-first walks over the lineage edges, remembering each key's distance."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.truncated = False
        self.up_levels: dict[str, int] = {}
        self.down_levels: dict[str, int] = {}

    def up(self, key: str, depth: int) -> list[LineageEdge]:
        found: list[LineageEdge] = []
        frontier, seen = [key], {key}
        self.up_levels[key] = 0
        for level in range(1, depth + 1):
            edges = self.catalog.parents_of(frontier)
            if not edges:
                break
            found.extend(edges)
            frontier = sorted({e.parent_key for e in edges} - seen)
            for parent in frontier:
                self.up_levels[parent] = -level
            seen.update(frontier)
            if not frontier:
                break
        else:
            self.truncated = self.truncated or bool(self.catalog.parents_of(frontier))
        return found

    def down(self, key: str, depth: int) -> list[LineageEdge]:
        found: list[LineageEdge] = []
        frontier, seen = [key], {key}
        self.down_levels[key] = 0
        for level in range(1, depth + 1):
            edges = self.catalog.children_of(frontier)
            if not edges:
                break
            found.extend(edges)
            frontier = sorted({e.child_key for e in edges} - seen)
            for child in frontier:
                self.down_levels[child] = level
            seen.update(frontier)
            if not frontier:
                break
        else:
            self.truncated = self.truncated or bool(self.catalog.children_of(frontier))
        return found


def _origins(
    settings: ArenaSettings, roots: set[str], topics: dict[str, str]
) -> dict[str, tuple[str, dict[str, Any]]]:
    """Topic and origin (``ORIGIN_FIELDS``) of the keys found in the lake's origin topics.

    Roots are looked for in every source topic (no lineage edge names their topic); other keys in
    the topic their edges name.
    """
    from lake.parquet import read_rows
    from lake.store import open_store

    store = open_store(settings)
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    for name, fields in ORIGIN_FIELDS.items():
        keys = {k for k, t in topics.items() if t == name} | (roots if name in SOURCE_TOPICS else set())
        for key, row in read_rows(store, name, keys - found.keys(), sorted(set(fields.values()))).items():
            found[key] = (name, {field: row[column] for field, column in fields.items()})
    return found


def _edge(e: LineageEdge, prompts: dict[str, tuple[str, int]]) -> TraceEdge:
    return TraceEdge(
        parent=e.parent_key,
        child=e.child_key,
        stage=e.stage,
        stage_version=e.stage_version,
        data_version=split_wire(e.child_topic)[0],
        prompts=parse_prompts(e.prompt_version, prompts),
        backend=e.backend,
        model=e.model,
        at=e.at,
    )


def _step_edges(rows: list[StepSample], depth_of: dict[str, int]) -> tuple[list[TraceEdge], list[TraceNode]]:
    roles: dict[tuple[str, str], list[str]] = {}
    nodes: dict[str, TraceNode] = {}
    for row in rows:
        sid = f"{row.run}@{row.step}"
        roles.setdefault((row.sample_key, sid), []).append(row.role)
        depth = depth_of.get(row.sample_key, 0) + 1
        nodes[sid] = TraceNode(
            id=sid, kind="training_step", topic=None, depth=depth, run=row.run, step=row.step, phase=row.phase
        )
    edges = [
        TraceEdge(parent=sample, child=sid, stage="train", roles=sorted(r))
        for (sample, sid), r in roles.items()
    ]
    return edges, sorted(nodes.values(), key=lambda n: (n.run or "", n.step or 0))


def trace_record(settings: ArenaSettings, record_id: str, *, depth: int = 20) -> TraceReport:
    """Trace ``record_id`` (a full key or a unique prefix of at least 8 characters) up and down.

    Raises ``TraceError`` for an unknown or ambiguous id.
    """
    catalog = Catalog(settings.catalog)
    try:
        return _trace(catalog, settings, resolve_id(catalog, record_id), depth)
    finally:
        catalog.dispose()


def _trace(catalog: Catalog, settings: ArenaSettings, key: str, depth: int) -> TraceReport:
    walk = _Walk(catalog)
    up = walk.up(key, depth)
    down = walk.down(key, depth)
    levels = {**walk.up_levels, **walk.down_levels}
    all_keys = sorted(levels)
    topics = catalog.topics_of(all_keys)
    with_parents = {e.child_key for e in up} | {e.child_key for e in down} | ({key} if up else set())
    roots = {k for k in walk.up_levels if k not in with_parents and k not in topics}
    origins = _origins(settings, roots, topics)
    topics.update({k: name for k, (name, _) in origins.items()})
    where = {k: fields for k, (_, fields) in origins.items()}
    nodes = {
        k: TraceNode(
            id=k,
            kind=_kind(topics.get(k), k not in roots),
            topic=topics.get(k),
            depth=levels[k],
            **where.get(k, {}),
        )
        for k in all_keys
    }
    known = {
        pv.id: (pv.role, pv.version)
        for pv in catalog.prompt_versions_by_id(_prompt_ids([*up, *down])).values()
    }
    samples = sorted(k for k, n in nodes.items() if n.kind == "sample")
    step_edges, step_nodes = _step_edges(catalog.steps_of(samples), levels)
    nodes.update({n.id: n for n in step_nodes})
    return TraceReport(
        record=nodes[key],
        nodes=nodes,
        ancestors=[_edge(e, known) for e in up],
        descendants=[_edge(e, known) for e in down] + step_edges,
        sources=sorted(k for k, n in nodes.items() if n.kind == "source"),
        samples=samples,
        training_steps=[n.id for n in step_nodes],
        truncated=walk.truncated,
    )

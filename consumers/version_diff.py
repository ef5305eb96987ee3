"""`arena diff A B`: two data versions compared stage by stage, from the lake.

Per stage and version: records in (ledger entries), what became of them (outputs, rejections by
gate, dead letters by kind), the scores its outputs carry (the 7-dimension trajectory reward, QA
validation scores, sample rewards: mean with a 95% interval), LLM calls, requests and tokens per
output (``llm_usage``), and the outputs matched across the versions by lineage: an output's
*root* is the record of the replayed stage's input it descends from (``arena-source-ids`` headers,
followed back through the version's topics), so "only in A", "only in B" and "in both" count
upstream records, whatever keys the outputs got. A few roots whose outputs changed are shown side
by side.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import BaseModel, Field
from rich.table import Table

from arena.records.common import MEASURED_FIELDS
from arena.topics import topic as topic_spec
from arena.versions import INHERITED_HEADER, MAIN, split_wire, wire
from lake.parquet import lake_files, read_topic
from lake.store import ObjectStore
from streams.tracks import tracks

# Two-sided 97.5% quantiles of Student's t, by degrees of freedom (1-30); beyond: the normal's.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.960

SCORED = {
    "trajectories.scored": ("overall", "scores"),
    "qa.validated": (None, "scores"),
    "samples.sft": ("reward", None),
}
"""Output topics whose records carry scores: (a number field, a field of named scores)."""


class Interval(BaseModel):
    """A mean with its 95% confidence interval (Student's t; a single value has none)."""

    n: int
    mean: float | None = None
    low: float | None = None
    high: float | None = None

    def __str__(self) -> str:
        if self.mean is None:
            return "-"
        if self.low is None or self.high is None:
            return f"{self.mean:.3f} (n={self.n})"
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}] (n={self.n})"


def mean_interval(values: Sequence[float]) -> Interval:
    """Mean and 95% interval ``mean ± t(0.975, n-1) · s / sqrt(n)`` of ``values``."""
    n = len(values)
    if n == 0:
        return Interval(n=0)
    mean = sum(values) / n
    if n == 1:
        return Interval(n=1, mean=mean)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    t = _T975[n - 2] if n - 1 <= len(_T975) else _Z975
    half = t * sd / math.sqrt(n)
    return Interval(n=n, mean=mean, low=mean - half, high=mean + half)


class VersionStage(BaseModel):
    """One stage in one version."""

    records_in: int = Field(0, description="Input records the stage accounted for (ledger entries).")
    produced: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    outputs: int = Field(0, description="Records written to its output topics.")
    rejections_by_gate: dict[str, int] = Field(default_factory=dict)
    dead_letters_by_kind: dict[str, int] = Field(default_factory=dict)
    llm_calls: int = 0
    llm_requests: int = Field(0, description="Requests sent to the endpoint (cache hits send none).")
    llm_tokens: int = 0
    calls_per_output: float | None = None
    tokens_per_output: float | None = None
    scores: dict[str, Interval] = Field(default_factory=dict, description="Score name -> mean and interval.")


class Example(BaseModel):
    """One upstream record whose outputs differ between the versions."""

    root: str
    a: list[str]
    b: list[str]


class StageDiff(BaseModel):
    stage: str
    a: VersionStage
    b: VersionStage
    only_a: int = Field(
        0,
        description="Upstream records with outputs in A only (of those a non-main version took from its "
        "parent: a replay of part of the input is compared on that part).",
    )
    only_b: int = Field(0, description="Upstream records with outputs in B only.")
    both: int = Field(0, description="Upstream records with outputs in both.")
    identical: int = Field(0, description="Of those, how many have the very same outputs (keys and values).")
    examples: list[Example] = Field(default_factory=list)


class VersionDiff(BaseModel):
    a: str
    b: str
    stages: list[StageDiff]


# -- reading the lake ---------------------------------------------------------------------------


def _rows(store: ObjectStore, name: str, version: str) -> list[dict[str, Any]]:
    return [r for r in read_topic(store, wire(name, version)).to_pylist() if r["_valid"]]


def _ledger(store: ObjectStore, version: str) -> dict[str, list[dict[str, Any]]]:
    by_stage: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in _rows(store, "stages.ledger", version):
        if row["outcome"] != "not_addressed":
            by_stage[row["stage"]].append(row)
    return by_stage


def _usage(store: ObjectStore, version: str) -> dict[str, tuple[int, int, int]]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for row in _rows(store, "llm.usage", version):
        t = totals[row["stage"]]
        t[0] += row["calls"] or 0
        t[1] += row["attempts"] or 0
        t[2] += (row["prompt_tokens"] or 0) + (row["completion_tokens"] or 0)
    return {stage: (t[0], t[1], t[2]) for stage, t in totals.items()}


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else (value or {})


def _stage_figures(entries: list[dict[str, Any]], usage: tuple[int, int, int] | None) -> VersionStage:
    figures = VersionStage(records_in=len(entries))
    gates: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for entry in entries:
        outcome = entry["outcome"]
        if outcome in ("emitted", "stored"):
            figures.produced += 1
        elif outcome == "dead_letter":
            figures.dead_lettered += 1
        else:
            figures.rejected += 1
        for name, n in _json(entry["outputs"]).items():
            if topic_spec(name).side_of is None:
                figures.outputs += int(n)
        gates.update({g: int(n) for g, n in _json(entry["rejections"]).items()})
        if outcome == "duplicate":
            gates["duplicate"] += 1
        kinds.update({k: int(n) for k, n in _json(entry["dead_letters"]).items()})
    figures.rejections_by_gate = dict(sorted(gates.items()))
    figures.dead_letters_by_kind = dict(sorted(kinds.items()))
    if usage is not None:
        figures.llm_calls, figures.llm_requests, figures.llm_tokens = usage
    if figures.outputs:
        figures.calls_per_output = round(figures.llm_calls / figures.outputs, 3)
        figures.tokens_per_output = round(figures.llm_tokens / figures.outputs, 1)
    return figures


def _scores(rows: Iterable[dict[str, Any]], topic: str) -> dict[str, Interval]:
    number, named = SCORED.get(topic, (None, None))
    values: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if number and row.get(number) is not None:
            values[number].append(float(row[number]))
        if named:
            for name, value in _json(row.get(named)).items():
                values[name].append(float(value))
    return {name: mean_interval(v) for name, v in sorted(values.items())}


def _parents(row: dict[str, Any]) -> list[str]:
    headers = _json(row["_headers"])
    return [p for p in str(headers.get("arena-source-ids", "")).split(",") if p]


def _root(key: str, parents: dict[str, list[str]], roots: set[str]) -> str:
    """The first ancestor of ``key`` in ``roots`` (following first parents); the oldest one found else."""
    seen = {key}
    while key not in roots and parents.get(key):
        nxt = parents[key][0]
        if nxt in seen:
            break
        seen.add(nxt)
        key = nxt
    return key


def _summary(row: dict[str, Any]) -> str:
    """A short text of an output for the side-by-side view."""
    for field in ("text", "question", "task", "answer"):
        if isinstance(row.get(field), str):
            return str(row[field])[:160]
    body = {k: v for k, v in row.items() if not k.startswith("_")}
    return json.dumps(body, default=str, ensure_ascii=False)[:160]


def _unmeasured(value: Any) -> Any:
    """``value`` without the fields that measure a run (``MEASURED_FIELDS``), at any depth."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: _unmeasured(v) for k, v in value.items() if k not in MEASURED_FIELDS}
    if isinstance(value, list):
        return [_unmeasured(v) for v in value]
    return value


def _identity(row: dict[str, Any]) -> str:
    """A row's key and content, measurements aside: equal for the same output of two faithful runs."""
    body = {k: _unmeasured(v) for k, v in row.items() if not k.startswith("_")}
    return row["_key"] + json.dumps(body, default=str, sort_keys=True)


# -- comparing ----------------------------------------------------------------------------------


def _stage_topics() -> dict[str, tuple[str, ...]]:
    """Stage name -> its output topics (side topics aside), in dataflow order."""
    return {stage.name: stage.outputs for track in tracks() for stage in track.stages}


def _outputs(
    rows_of: dict[str, list[dict[str, Any]]], stage: str, topics: Sequence[str]
) -> list[dict[str, Any]]:
    """The rows ``stage`` wrote to ``topics`` (a topic may have several writers)."""
    return [
        row
        for t in topics
        for row in rows_of.get(t, [])
        if _json(row["_headers"]).get("arena-stage") == stage
    ]


def compare(
    store: ObjectStore, a: str, b: str, *, stage: str | None = None, examples: int = 3
) -> VersionDiff:
    """Compare data versions ``a`` and ``b`` stage by stage.

    The stages compared are those that ran in the version(s) other than main (all of main's when
    both are main), or ``stage`` alone.
    """
    outputs_of = _stage_topics()
    ledgers = {v: _ledger(store, v) for v in dict.fromkeys((a, b))}
    usage = {v: _usage(store, v) for v in ledgers}
    replayed = [v for v in ledgers if v != MAIN] or [MAIN]
    ran = {name for v in replayed for name in ledgers[v]}
    names = [n for n in outputs_of if n in ran and (stage is None or n == stage)]
    topics = sorted({t for n in names for t in outputs_of[n]})
    rows = {v: {t: _rows(store, t, v) for t in topics} for v in ledgers}
    roots = _roots(store, [v for v in ledgers if v != MAIN])
    parents = {v: {row["_key"]: _parents(row) for t in topics for row in rows[v][t]} for v in ledgers}
    diffs = []
    for name in names:
        by_topic = {v: {t: _outputs(rows[v], name, [t]) for t in outputs_of[name]} for v in ledgers}
        mine = {v: [row for t in outputs_of[name] for row in by_topic[v][t]] for v in ledgers}
        figures = {}
        for v in ledgers:
            figures[v] = _stage_figures(ledgers[v].get(name, []), usage[v].get(name))
            figures[v].scores = {
                f"{t}:{score}" if len(outputs_of[name]) > 1 else score: interval
                for t in outputs_of[name]
                for score, interval in _scores(by_topic[v][t], t).items()
            }
        diffs.append(
            _matched(name, figures[a], figures[b], mine[a], mine[b], parents[a], parents[b], roots, examples)
        )
    return VersionDiff(a=a, b=b, stages=diffs)


def _roots(store: ObjectStore, versions: Sequence[str]) -> set[str]:
    """Keys of the records the versions took from their parents (their replayed input, the inherited):
    the ``arena-inherited-from`` rows of their topics."""
    found: set[str] = set()
    for wired in lake_files(store):
        owner, base = split_wire(wired)
        if owner not in versions or topic_spec(base).side_of is not None:
            continue
        found.update(
            row["_key"] for row in _rows(store, base, owner) if INHERITED_HEADER in _json(row["_headers"])
        )
    return found


def _matched(
    name: str,
    fa: VersionStage,
    fb: VersionStage,
    rows_a: list[dict[str, Any]],
    rows_b: list[dict[str, Any]],
    parents_a: dict[str, list[str]],
    parents_b: dict[str, list[str]],
    roots: set[str],
    examples: int,
) -> StageDiff:
    by_root_a: dict[str, list[dict[str, Any]]] = defaultdict(list)
    by_root_b: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for rows, by_root, parents in ((rows_a, by_root_a, parents_a), (rows_b, by_root_b, parents_b)):
        for row in rows:
            root = _root(row["_key"], parents, roots)
            # A version that replayed part of its parent's input is compared on that part only.
            if not roots or root in roots:
                by_root[root].append(row)
    both = sorted(set(by_root_a) & set(by_root_b))
    same = [r for r in both if sorted(map(_identity, by_root_a[r])) == sorted(map(_identity, by_root_b[r]))]
    changed = [r for r in both if r not in set(same)]
    shown = [
        Example(root=r, a=[_summary(x) for x in by_root_a[r][:2]], b=[_summary(x) for x in by_root_b[r][:2]])
        for r in changed[:examples]
    ]
    return StageDiff(
        stage=name,
        a=fa,
        b=fb,
        only_a=len(set(by_root_a) - set(by_root_b)),
        only_b=len(set(by_root_b) - set(by_root_a)),
        both=len(both),
        identical=len(same),
        examples=shown,
    )


# -- rendering ----------------------------------------------------------------------------------


def render_diff(diff: VersionDiff) -> list[Any]:
    """Rich renderables: one table of figures per stage, then its examples."""
    out: list[Any] = []
    for stage in diff.stages:
        table = Table(title=f"{stage.stage}: {diff.a} vs {diff.b}", title_justify="left")
        table.add_column("")
        table.add_column(diff.a, justify="right")
        table.add_column(diff.b, justify="right")
        rows: list[tuple[str, Any, Any]] = [
            ("records in", stage.a.records_in, stage.b.records_in),
            ("produced", stage.a.produced, stage.b.produced),
            ("rejected", stage.a.rejected, stage.b.rejected),
            ("dead-lettered", stage.a.dead_lettered, stage.b.dead_lettered),
            ("outputs", stage.a.outputs, stage.b.outputs),
        ]
        for gate in sorted({*stage.a.rejections_by_gate, *stage.b.rejections_by_gate}):
            rows.append(
                (
                    f"  rejected: {gate}",
                    stage.a.rejections_by_gate.get(gate, 0),
                    stage.b.rejections_by_gate.get(gate, 0),
                )
            )
        for kind in sorted({*stage.a.dead_letters_by_kind, *stage.b.dead_letters_by_kind}):
            rows.append(
                (
                    f"  dead letters: {kind}",
                    stage.a.dead_letters_by_kind.get(kind, 0),
                    stage.b.dead_letters_by_kind.get(kind, 0),
                )
            )
        for score in sorted({*stage.a.scores, *stage.b.scores}):
            rows.append(
                (
                    f"score {score}",
                    stage.a.scores.get(score, Interval(n=0)),
                    stage.b.scores.get(score, Interval(n=0)),
                )
            )
        rows += [
            ("LLM calls", stage.a.llm_calls, stage.b.llm_calls),
            ("LLM requests", stage.a.llm_requests, stage.b.llm_requests),
            ("calls / output", stage.a.calls_per_output, stage.b.calls_per_output),
            ("tokens / output", stage.a.tokens_per_output, stage.b.tokens_per_output),
        ]
        for label, x, y in rows:
            table.add_row(label, "-" if x is None else str(x), "-" if y is None else str(y))
        table.caption = (
            f"upstream records: {stage.only_a} only in {diff.a}, {stage.only_b} only in {diff.b}, "
            f"{stage.both} in both ({stage.identical} with identical outputs)"
        )
        out.append(table)
        for example in stage.examples:
            side = Table(title=f"changed: {example.root}", title_justify="left", show_lines=True)
            side.add_column(diff.a)
            side.add_column(diff.b)
            side.add_row("\n".join(example.a) or "-", "\n".join(example.b) or "-")
            out.append(side)
    return out

"""Decontamination: synthesized tasks that near-duplicate a benchmark test item never reach training.

A model scored on BFCL or tau2 must not have trained on their test items, and a synthesis engine
seeded from public tool docs or domains can produce them again nearly word for word. Each
benchmark test item (a BFCL question; a tau2 test-split task's user scenario: reason for call,
known and unknown info, instructions) is cut into word n-grams (lower-cased, ``NGRAM`` words); a
synthesized text near-duplicates it when the n-grams they share cover at least ``threshold`` of
the smaller of the two (containment: a benchmark question pasted inside a longer task counts, as
does a task that is a benchmark scenario cut short). Items shorter than ``NGRAM`` words are one
n-gram of all their words. A paraphrase shares few n-grams, so a text that passes them is also
embedded (``arena.embed``, MiniLM): a cosine of at least ``cosine`` with an item flags it too, the
same test the tau2 new-instance screen applies (``synthesis.eigen.tau2_instances``).

The benchmark items are loaded from the installed benchmark packages (bfcl-eval's bundled
questions through ``trainer.benchmarks.bfcl``; tau2's shipped ``tasks.json`` and
``split_tasks.json``) by ``arena decontam index`` into ``$ARENA_HOME/decontam/benchmarks.json``, their
embeddings into ``benchmarks.npy`` beside it.
Once that file exists the trainer screens every sample it takes (``screen``: ``samples.sft`` and
``samples.verified``): a near-duplicate goes to ``<topic>.rejected`` (gate ``decontam``, naming the
benchmark item and the overlap) instead of into a batch. ``arena decontam report`` scans what the
lake holds of the synthesis topics (``SCANNED_TOPICS``) and lists what would be excluded.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from arena.files import write_atomic
from arena.overlap import NEAR_DUPLICATE, NEAR_DUPLICATE_COSINE, NGRAM, ngrams

if TYPE_CHECKING:
    from lake.store import ObjectStore

THRESHOLD = NEAR_DUPLICATE
"""Share of the smaller text's n-grams the two must have in common to be near-duplicates."""
COSINE = NEAR_DUPLICATE_COSINE
"""Embedding cosine at or above which a text near-duplicates an item (the tau2 instance screen's)."""
INDEX_FILE = Path("decontam") / "benchmarks.json"
"""Where ``arena decontam index`` writes the benchmark items, under ``$ARENA_HOME``."""
VECTORS_FILE = Path("decontam") / "benchmarks.npy"
"""Their embeddings, one row per item in the index's order."""
GATE = "decontam"
SCANNED_TOPICS = ("tasks", "samples.sft", "samples.verified", "eigen.intents", "eigen.tasks")
"""Topics holding synthesized tasks: ASTRA's SFT tasks and samples, its environment samples, EigenData's
intents and tasks."""
TAU2_DOMAINS = ("airline", "retail", "telecom")


class BenchmarkItem(BaseModel):
    """One benchmark test item's text, the thing a synthesized task must not repeat."""

    bench: Annotated[str, Field(description="'bfcl' or 'tau2'.")]
    item_id: Annotated[
        str, Field(description="The benchmark's id: '<category>/<id>' or '<domain>/<task id>'.")
    ]
    text: Annotated[str, Field(description="What a model reads of it (question, user scenario).")]


class BenchmarkIndex(BaseModel):
    """The benchmark items decontamination checks against (``$ARENA_HOME/decontam/benchmarks.json``)."""

    ngram: Annotated[int, Field(ge=1, description="Words per n-gram.")] = NGRAM
    threshold: Annotated[float, Field(gt=0, le=1, description="Containment that flags a pair.")] = THRESHOLD
    cosine: Annotated[
        float | None,
        Field(
            gt=0, le=1, description="Embedding cosine that flags a pair (a paraphrase); None: n-grams only."
        ),
    ] = COSINE
    items: Annotated[list[BenchmarkItem], Field(description="The benchmark test items.")]


class Contamination(BaseModel):
    """A synthesized text that near-duplicates a benchmark item."""

    topic: Annotated[str, Field(description="Topic the synthesized record is on.")]
    key: Annotated[str, Field(description="Its record key.")]
    bench: Annotated[str, Field(description="Benchmark of the item it repeats.")]
    item_id: Annotated[str, Field(description="The benchmark item.")]
    overlap: Annotated[float, Field(description="Shared n-grams over the smaller text's n-grams.")]
    by: Annotated[
        Literal["ngram", "embedding"],
        Field(description="The test that flagged it: shared n-grams or cosine."),
    ] = "ngram"
    cosine: Annotated[
        float | None, Field(description="Embedding cosine with the item (when the embedding test ran).")
    ] = None
    text: Annotated[str, Field(description="The synthesized text (first 300 characters).")]
    benchmark_text: Annotated[str, Field(description="The benchmark item's text (first 300 characters).")]


class DecontamReport(BaseModel):
    """What ``arena decontam report`` prints: per topic, records scanned and flagged."""

    ngram: Annotated[int, Field(description="Words per n-gram.")]
    threshold: Annotated[float, Field(description="Containment that flags a pair.")]
    cosine: Annotated[float | None, Field(description="Embedding cosine that flags a pair (None: not used).")]
    benchmarks: Annotated[dict[str, int], Field(description="Benchmark -> items checked against.")]
    scanned: Annotated[dict[str, int], Field(description="Topic -> records scanned.")]
    flagged: Annotated[list[Contamination], Field(description="Near-duplicates found.")]


class NgramIndex:
    """Benchmark items by n-gram, for the best containment match of a text."""

    def __init__(self, index: BenchmarkIndex) -> None:
        self.ngram = index.ngram
        self.threshold = index.threshold
        self.items = index.items
        self._grams = [ngrams(item.text, self.ngram) for item in index.items]
        self._postings: dict[str, list[int]] = defaultdict(list)
        for i, grams in enumerate(self._grams):
            for gram in grams:
                self._postings[gram].append(i)

    def best(self, text: str) -> tuple[BenchmarkItem, float] | None:
        """The benchmark item sharing the largest share of n-grams with ``text``, and that share."""
        grams = ngrams(text, self.ngram)
        shared: dict[int, int] = defaultdict(int)
        for gram in grams:
            for i in self._postings.get(gram, ()):
                shared[i] += 1
        if not shared:
            return None
        scored = ((count / min(len(grams), len(self._grams[i])), i) for i, count in shared.items())
        overlap, i = max(scored)
        return self.items[i], overlap

    def match(self, text: str) -> tuple[BenchmarkItem, float] | None:
        """The benchmark item ``text`` near-duplicates (overlap >= threshold), if any."""
        found = self.best(text)
        return found if found is not None and found[1] >= self.threshold else None


def embed_items(items: list[BenchmarkItem]) -> np.ndarray:
    """The items' embeddings (L2-normalised rows, in order)."""
    from arena.embed import DIM, embed_texts

    return embed_texts([i.text for i in items]) if items else np.zeros((0, DIM), dtype=np.float32)


@dataclass(frozen=True)
class Match:
    """A benchmark item a text near-duplicates, and by which test."""

    item: BenchmarkItem
    by: Literal["ngram", "embedding"]
    overlap: float
    """Shared n-grams over the smaller text's (0 when none are shared)."""
    cosine: float | None
    """Embedding cosine with the item, when the embedding test ran."""


class NearDuplicates:
    """Both tests of a text against the benchmark items: shared n-grams, then embedding cosine.

    ``vectors`` are the items' embeddings (``load_vectors``); made here when not given and the
    index has a ``cosine``."""

    def __init__(self, index: BenchmarkIndex, vectors: np.ndarray | None = None) -> None:
        self.index = index
        self.ngrams = NgramIndex(index)
        self.vectors: np.ndarray | None = None
        if index.cosine is not None:
            self.vectors = vectors if vectors is not None else embed_items(index.items)

    def match(self, text: str) -> Match | None:
        """The item ``text`` near-duplicates, if any: by n-grams first (the cheaper and exact test)."""
        found = self.ngrams.best(text)
        overlap = found[1] if found is not None else 0.0
        if found is not None and overlap >= self.index.threshold:
            return Match(found[0], "ngram", overlap, None)
        if self.vectors is None or self.index.cosine is None or not len(self.vectors) or not text.strip():
            return None
        from arena.embed import embed_texts

        scores = self.vectors @ embed_texts([text])[0]
        best = int(np.argmax(scores))
        cosine = float(scores[best])
        if cosine < self.index.cosine:
            return None
        item = self.index.items[best]
        shared = overlap if found is not None and found[0] is item else 0.0
        return Match(item, "embedding", shared, round(cosine, 4))


# --------------------------------------------------------------------------- synthesized texts


def _json(value: Any) -> Any:
    """A lake column's value: JSON columns hold JSON text."""
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _message_texts(messages: Any, roles: tuple[str, ...]) -> list[str]:
    if not isinstance(messages, list):
        return []
    return [
        str(m.get("content") or "")
        for m in messages
        if isinstance(m, dict) and m.get("role") in roles and isinstance(m.get("content"), str)
    ]


def record_text(topic: str, record: dict[str, Any]) -> str:
    """The task text of a synthesized record (a record as JSON, or a lake row).

    ``tasks``: the task; ``samples.verified``: its prompt's user messages; ``samples.sft``: its user
    messages (and, for user-simulator samples, the system prompt holding the scenario);
    ``eigen.intents`` / ``eigen.tasks``: the intent's objective and reason for call.
    """
    if topic == "tasks":
        return str(record.get("text") or "")
    if topic == "samples.verified":
        return "\n".join(_message_texts(_json(record.get("prompt")), ("user",)))
    if topic == "samples.sft":
        roles = ("system", "user") if record.get("role_target") == "user" else ("user",)
        return "\n".join(_message_texts(_json(record.get("messages")), roles))
    if topic in ("eigen.intents", "eigen.tasks"):
        payload = _json(record.get("payload"))
        intent = payload.get("intent") if isinstance(payload, dict) else None
        if not isinstance(intent, dict):
            return ""
        return "\n".join(str(intent.get(k) or "") for k in ("objective", "reason_for_call"))
    raise ValueError(f"no task text known for topic {topic!r} (known: {', '.join(SCANNED_TOPICS)})")


def scan(
    index: NearDuplicates, records: Iterable[tuple[str, str, dict[str, Any]]], benchmarks: dict[str, int]
) -> DecontamReport:
    """Flag every (topic, key, record) whose task text near-duplicates a benchmark item."""
    scanned: dict[str, int] = defaultdict(int)
    flagged = []
    for topic, key, record in records:
        scanned[topic] += 1
        text = record_text(topic, record)
        found = index.match(text)
        if found is not None:
            flagged.append(
                Contamination(
                    topic=topic,
                    key=key,
                    bench=found.item.bench,
                    item_id=found.item.item_id,
                    overlap=round(found.overlap, 4),
                    by=found.by,
                    cosine=found.cosine,
                    text=text[:300],
                    benchmark_text=found.item.text[:300],
                )
            )
    return DecontamReport(
        ngram=index.index.ngram,
        threshold=index.index.threshold,
        cosine=index.index.cosine,
        benchmarks=benchmarks,
        scanned=dict(scanned),
        flagged=flagged,
    )


# --------------------------------------------------------------------------- benchmark items


def bfcl_items(categories: list[str] | None = None) -> list[BenchmarkItem]:
    """Every question of bfcl-eval's categories (bfcl-eval's bundled data); a multi-turn item is all
    its user turns."""
    from trainer.benchmarks.bfcl import CATEGORIES, load_items

    single, multi = load_items(list(categories or CATEGORIES))
    out = [
        BenchmarkItem(
            bench="bfcl",
            item_id=f"{item.category}/{item.id}",
            text="\n".join(_message_texts(item.messages, ("user",))),
        )
        for item in single
    ]
    out += [
        BenchmarkItem(
            bench="bfcl",
            item_id=f"{item.category}/{item.id}",
            text="\n".join(t for turn in item.turns for t in _message_texts(turn, ("user",))),
        )
        for item in multi
    ]
    return out


def tau2_items(data_dir: Path, domains: Iterable[str] = TAU2_DOMAINS) -> list[BenchmarkItem]:
    """The user scenarios of each domain's test split (``<data_dir>/<domain>/tasks.json``,
    ``split_tasks.json``), as tau2 ships them."""
    out = []
    for domain in domains:
        folder = data_dir / domain
        tasks_file, split_file = folder / "tasks.json", folder / "split_tasks.json"
        if not tasks_file.is_file() or not split_file.is_file():
            raise FileNotFoundError(
                f"{folder}: no tasks.json and split_tasks.json (is {domain!r} a tau2 domain?)"
            )
        test = set(json.loads(split_file.read_text())["test"])
        for task in json.loads(tasks_file.read_text()):
            if str(task["id"]) not in test:
                continue
            scenario = (task.get("user_scenario") or {}).get("instructions") or {}
            if isinstance(scenario, str):
                text = scenario
            else:
                keys = ("reason_for_call", "known_info", "unknown_info", "task_instructions")
                text = "\n".join(str(scenario.get(k)) for k in keys if scenario.get(k))
            out.append(BenchmarkItem(bench="tau2", item_id=f"{domain}/{task['id']}", text=text))
    return out


def index_path(home: Path) -> Path:
    return home / INDEX_FILE


def save_index(home: Path, index: BenchmarkIndex) -> Path:
    """Write the index and, when it has a ``cosine``, its items' embeddings (each atomically)."""
    vectors = home / VECTORS_FILE
    if index.cosine is not None:
        write_atomic(vectors, lambda out: np.save(out, embed_items(index.items)))
    else:
        vectors.unlink(missing_ok=True)
    return write_atomic(index_path(home), lambda out: out.write(index.model_dump_json().encode()))


def load_index(home: Path) -> BenchmarkIndex | None:
    """The saved benchmark index, or None when ``arena decontam index`` has not run."""
    path = index_path(home)
    return BenchmarkIndex.model_validate_json(path.read_text()) if path.is_file() else None


def load_vectors(home: Path, index: BenchmarkIndex) -> np.ndarray | None:
    """The saved embeddings of ``index``'s items; None when missing or not one row per item."""
    try:
        vectors = np.load(home / VECTORS_FILE)
    except (OSError, ValueError):
        return None
    return vectors if vectors.shape[:1] == (len(index.items),) else None


def near_duplicates(home: Path) -> NearDuplicates | None:
    """Both tests against the index saved under ``home`` (None before ``arena decontam index``)."""
    index = load_index(home)
    if index is None:
        return None
    return NearDuplicates(index, load_vectors(home, index) if index.cosine is not None else None)


def bench_counts(index: BenchmarkIndex) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for item in index.items:
        counts[item.bench] += 1
    return dict(sorted(counts.items()))


# --------------------------------------------------------------------------- the trainer's screen


class Screen:
    """What the trainer's sample sources ask of every sample: is it a near-duplicate, and of what."""

    def __init__(self, index: BenchmarkIndex | NearDuplicates) -> None:
        self.tests = index if isinstance(index, NearDuplicates) else NearDuplicates(index)

    def __call__(self, topic: str, record: BaseModel) -> dict[str, Any] | None:
        """None to train on ``record``; else the Rejection fields (gate, subject, reason, details)."""
        found = self.tests.match(record_text(topic, record.model_dump(mode="json")))
        if found is None:
            return None
        index, item = self.tests.index, found.item
        if found.by == "ngram":
            why = f"{found.overlap:.0%} of {index.ngram}-grams shared, threshold {index.threshold:.0%}"
        else:
            why = f"embedding cosine {found.cosine:.2f}, threshold {index.cosine:.2f}"
        return {
            "gate": GATE,
            "subject": item.item_id,
            "reason": f"near-duplicate of {item.bench} test item {item.item_id} ({why})",
            "details": {
                "bench": item.bench,
                "item_id": item.item_id,
                "by": found.by,
                "overlap": round(found.overlap, 4),
                "cosine": found.cosine,
            },
        }


def trainer_screen(home: Path) -> Screen | None:
    """The screen for the trainer when ``arena decontam index`` has run under ``home``; else None."""
    tests = near_duplicates(home)
    return Screen(tests) if tests is not None else None


def lake_records(store: ObjectStore, topics: Iterable[str]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(topic, key, row) of every valid record the lake holds of ``topics``."""
    from lake.parquet import read_topic

    for name in topics:
        for row in read_topic(store, name).to_pylist():
            if row.get("_valid"):
                yield name, str(row.get("_key") or ""), row

"""Irrelevant-tool mixing (ASTRA §3.2.2, eq. 24-28).

Each training instance's tool list is augmented with tools from other domains, sampled from three
semantic-similarity bands so that the policy sees near-miss distractors as well as obviously
unrelated ones, and so learns to leave irrelevant tools alone (the precision term of the F1 reward).

- Pool: the tools of every verified environment package (train split), deduplicated by exact tool
  name, the first by ``env_id`` order kept. Each pool tool remembers the package that implements
  it, so a call to a mixed-in tool is executable (the rollout runs it against that package).
- Embeddings (eq. 24): the tool documentation string (name, description, argument descriptions),
  embedded by the ``arena-minilm`` function of ``lake.tool_index`` and stored in the LanceDB table
  ``mix_tools`` (keyed by tool name; unchanged tools are never re-embedded). The mixer loads the
  vectors once and computes cosine similarities (eq. 25) as dot products in memory: it needs every
  candidate's score, not a top-k search.
- Normalisation (eq. 26): per instance tool, min-max over its candidates, i.e. the pool minus the
  instance's domain and minus the instance's own tools (by name). The paper takes min/max over
  every other tool before excluding the same domain; over the candidates instead, each instance
  tool's nearest cross-domain tool scores 1 and its farthest 0, so every band is populated. When
  all of an instance tool's candidate scores are equal, min-max is 0/0: we set them all to 0 (low).
- Bands (eq. 27): high > 0.85, 0.4 <= medium <= 0.85, low < 0.4.
- Union (eq. 28): a candidate is in band b when it falls in b for some instance tool. A candidate
  that falls in several bands for different instance tools is put in its highest band only (it is
  a near-miss for at least one tool the task needs), so the band sets are disjoint and no tool is
  sampled twice.
- Sampling: up to K per band, uniformly, then shuffled into the instance's tool list; the RNG is
  seeded by (seed, rng_key), so a sample's mixing is reproducible.

Ablations (ASTRA §4.1): ``none`` (the tool list unchanged) and ``random`` (5-9 tools drawn
uniformly from other domains).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from arena.records.envs import EnvPackage
from arena.records.tools import tool_name
from arena.retry import call_with_retry

if TYPE_CHECKING:
    from lake.env_packages import EnvPackageStore, Split

MixMode = Literal["bands", "none", "random"]
Band = Literal["high", "medium", "low"]
BANDS: tuple[Band, ...] = ("high", "medium", "low")  # highest first
HIGH = 0.85
LOW = 0.4
RANDOM_COUNT = (5, 9)  # ASTRA §4.1: 5-9 random tools from other domains
TABLE = "mix_tools"


class PoolTool(BaseModel):
    """One executable tool of the mixing pool."""

    name: Annotated[str, Field(description="Tool name (unique in the pool).")]
    domain: Annotated[str, Field(description="Domain of the package implementing it.")]
    env_id: Annotated[str, Field(description="Verified package that implements it (where calls run).")]
    spec: Annotated[dict[str, Any], Field(description="OpenAI tool spec, as the package declares it.")]


class MixedTools(BaseModel):
    """An instance's tool list after mixing."""

    tools: Annotated[
        list[dict[str, Any]], Field(description="OpenAI tool specs: the instance's own plus mixed-in tools.")
    ]
    mixed: Annotated[list[PoolTool], Field(description="The mixed-in tools, with the package to run them.")]
    bands: Annotated[
        dict[str, list[str]],
        Field(
            description="Names mixed in, per band (high, medium, low); {'random': [...]} in random mode, "
            "{} in none mode."
        ),
    ]


def tool_doc(spec: dict[str, Any]) -> str:
    """The documentation string d(tau) that gets embedded: name, description, argument descriptions."""
    from lake.tool_index import tool_text  # imports lancedb (slow): only when embedding

    function = spec.get("function", spec)
    description = str(function.get("description") or "").strip()
    properties = (function.get("parameters") or {}).get("properties") or {}
    args = []
    for arg, schema in properties.items():
        schema = schema if isinstance(schema, dict) else {}
        text = f"{arg} ({schema.get('type', 'any')})"
        if schema.get("description"):
            text += f": {schema['description']}"
        args.append(text)
    if args:
        description = f"{description} Arguments: {'; '.join(args)}."
    return tool_text(str(function["name"]), description)


def pool_from_packages(packages: Iterable[EnvPackage]) -> list[PoolTool]:
    """The pool: every package's tools, deduplicated by name (first by ``env_id`` order, then spec order)."""
    pool: dict[str, PoolTool] = {}
    for package in sorted(packages, key=lambda p: p.env_id):
        for spec in package.tools:
            name = tool_name(spec)
            if name not in pool:
                pool[name] = PoolTool(name=name, domain=package.domain, env_id=package.env_id, spec=spec)
    return list(pool.values())


def pool_from_store(store: EnvPackageStore, split: Split | None = "train") -> list[PoolTool]:
    """The pool from the catalog's verified packages; train split only by default (held-out tools stay unseen)."""
    packages = (EnvPackage.model_validate_json(row.package) for row in store.rows(split))
    return pool_from_packages(packages)


def band_of(score: float) -> Band:
    """Band of a normalised similarity (eq. 27): high > 0.85, 0.4 <= medium <= 0.85, low < 0.4."""
    if score > HIGH:
        return "high"
    if score >= LOW:
        return "medium"
    return "low"


def min_max(scores: np.ndarray | Sequence[float] | Sequence[Sequence[float]]) -> np.ndarray:
    """Min-max normalisation along the last axis (eq. 26); a row whose scores are all equal becomes 0."""
    values = np.asarray(scores, dtype=np.float64)
    low = values.min(axis=-1, keepdims=True)
    span = values.max(axis=-1, keepdims=True) - low
    # 0/0 has no similarity structure: every candidate of that row goes to the low band.
    return np.divide(values - low, span, out=np.zeros_like(values), where=span > 0)


def select_bands(sim: np.ndarray | Sequence[Sequence[float]], names: Sequence[str]) -> dict[Band, list[str]]:
    """Candidate sets P^b (eq. 28) from raw similarities ``sim[instance tool, candidate]``.

    Rows are min-max normalised per instance tool, each entry banded, and each candidate put in the
    highest band it reaches for any instance tool. Names keep the candidates' order.
    """
    matrix = np.asarray(sim, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[1] != len(names):
        raise ValueError(f"sim must be (instance tools, {len(names)} candidates), got {matrix.shape}")
    bands: dict[Band, list[str]] = {band: [] for band in BANDS}
    if matrix.size == 0:  # no instance tools or no candidates: nothing to band
        return bands
    normalised = min_max(matrix)
    for name, column in zip(names, normalised.T, strict=True):
        bands[band_of(float(column.max()))].append(name)  # highest band = highest normalised score
    return bands


class ToolMixer:
    """Mixes irrelevant tools from ``pool`` into instance tool lists; embeddings in LanceDB at ``db_uri``."""

    def __init__(
        self,
        pool: list[PoolTool],
        db_uri: str,
        *,
        k_per_band: int = 2,
        seed: int = 0,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        names = [tool.name for tool in pool]
        if len(set(names)) != len(names):
            raise ValueError(
                "pool tool names must be unique (build it with pool_from_packages/pool_from_store)"
            )
        self.pool = list(pool)
        self.db_uri = db_uri
        self.k_per_band = k_per_band
        self.seed = seed
        self._by_name = {tool.name: tool for tool in self.pool}
        self._vectors: dict[str, np.ndarray] = {}  # doc text -> unit vector (pool and seen instance tools)
        from lake.tool_index import LANCE_WRITES  # imports lancedb (slow): only when a mixer is built

        # Each try connects anew, so a sync that lost a commit race re-reads the latest version.
        self._table = call_with_retry(
            lambda: self._sync(storage_options), LANCE_WRITES, what="mix_tools sync"
        )

    def __repr__(self) -> str:  # storage options may carry credentials: never show them
        return f"ToolMixer({len(self.pool)} tools, {self.db_uri!r}, k_per_band={self.k_per_band})"

    def _sync(self, storage_options: dict[str, str] | None) -> Any:
        """Make ``mix_tools`` hold every pool tool's current doc and embedding; load the vectors."""
        import lancedb
        import pyarrow as pa
        from lancedb.embeddings import EmbeddingFunctionConfig, get_registry

        from arena.embed import DIM
        from lake.tool_index import EMBEDDING_NAME  # importing it registers the embedding function

        db = lancedb.connect(
            self.db_uri, storage_options=storage_options, read_consistency_interval=timedelta(0)
        )
        try:
            table = db.open_table(TABLE)
        except ValueError:  # not found
            schema = pa.schema(
                [
                    pa.field("name", pa.string(), nullable=False),
                    pa.field("domain", pa.string(), nullable=False),
                    pa.field("env_id", pa.string(), nullable=False),
                    pa.field("spec", pa.string(), nullable=False),
                    pa.field("text", pa.string(), nullable=False),
                    pa.field("vector", pa.list_(pa.float32(), DIM)),
                ]
            )
            function = get_registry().get(EMBEDDING_NAME).create()
            table = db.create_table(
                TABLE,
                schema=schema,
                embedding_functions=[
                    EmbeddingFunctionConfig(source_column="text", vector_column="vector", function=function)
                ],
                exist_ok=True,
            )
        rows = [
            {
                "name": tool.name,
                "domain": tool.domain,
                "env_id": tool.env_id,
                "spec": json.dumps(tool.spec, sort_keys=True),
                "text": tool_doc(tool.spec),
            }
            for tool in self.pool
        ]
        stored = {row["name"]: row for row in self._read(table)}
        keys = ("domain", "env_id", "spec", "text")
        changed = [
            row
            for row in rows
            if row["name"] not in stored or any(stored[row["name"]][k] != row[k] for k in keys)
        ]
        if changed:  # only new or changed docs are embedded (by LanceDB, through arena-minilm)
            table.merge_insert("name").when_matched_update_all().when_not_matched_insert_all().execute(
                changed
            )
            stored = {row["name"]: row for row in self._read(table)}
        for row in rows:
            self._vectors[row["text"]] = stored[row["name"]]["vector"]
        return table

    @staticmethod
    def _read(table: Any) -> list[dict[str, Any]]:
        from arena.embed import DIM

        data = table.to_arrow().select(["name", "domain", "env_id", "spec", "text", "vector"])
        vectors = data.column("vector").combine_chunks()
        matrix = vectors.flatten().to_numpy().astype(np.float32).reshape(len(vectors), DIM)
        out = data.drop_columns(["vector"]).to_pylist()
        for row, vector in zip(out, matrix, strict=True):
            row["vector"] = vector
        return out

    def table(self) -> Any:
        """The LanceDB ``mix_tools`` table."""
        return self._table

    def _embed(self, specs: list[dict[str, Any]]) -> np.ndarray:
        """Unit vectors of ``specs``' docs; docs not in the pool are embedded here and cached."""
        from arena.embed import DIM, embed_texts

        texts = [tool_doc(spec) for spec in specs]
        missing = sorted({t for t in texts if t not in self._vectors})
        for text, vector in zip(missing, embed_texts(missing), strict=True):
            self._vectors[text] = vector
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        return np.stack([self._vectors[t] for t in texts])

    def candidates(self, instance_tools: list[dict[str, Any]], domain: str) -> list[PoolTool]:
        """Pool tools that may be mixed in: other domains, and not one of the instance's tools by name."""
        own = {tool_name(spec) for spec in instance_tools}
        return [tool for tool in self.pool if tool.domain != domain and tool.name not in own]

    def scores(self, instance_tools: list[dict[str, Any]], candidates: list[PoolTool]) -> np.ndarray:
        """Cosine similarities (eq. 25), shape (len(instance_tools), len(candidates))."""
        queries = self._embed(instance_tools)
        keys = self._embed([tool.spec for tool in candidates])
        return (queries.astype(np.float64) @ keys.astype(np.float64).T).reshape(len(queries), len(keys))

    def mix(
        self, instance_tools: list[dict[str, Any]], domain: str, mode: MixMode = "bands", rng_key: str = ""
    ) -> MixedTools:
        """The instance's tools plus irrelevant ones (``mode``), shuffled; reproducible for a ``rng_key``."""
        if mode == "none":
            return MixedTools(tools=list(instance_tools), mixed=[], bands={})
        rng = random.Random(f"{self.seed}:{rng_key}")  # str seeds hash with SHA-512: stable across runs
        candidates = self.candidates(instance_tools, domain)
        bands: dict[str, list[str]]
        if mode == "random":
            count = rng.randint(*RANDOM_COUNT)
            picked = rng.sample(candidates, min(count, len(candidates)))
            bands = {"random": [tool.name for tool in picked]}
        elif mode == "bands":
            sets = select_bands(self.scores(instance_tools, candidates), [tool.name for tool in candidates])
            bands = {band: rng.sample(sets[band], min(self.k_per_band, len(sets[band]))) for band in BANDS}
            picked = [self._by_name[name] for band in BANDS for name in bands[band]]
        else:
            raise ValueError(f"unknown mixing mode {mode!r}")
        tools = list(instance_tools) + [tool.spec for tool in picked]
        rng.shuffle(tools)
        return MixedTools(tools=tools, mixed=picked, bands=bands)

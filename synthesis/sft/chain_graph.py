"""The per-server tool transition graph and its random walks (ASTRA §2.1.2).

Synthesised chains c_l = (f_1, ..., f_n) of one server aggregate into a
directed graph G = (V, E, w): one node per tool, an edge f_i -> f_j when the
pair appears consecutively in any chain, and w(f_i -> f_j) = the number of
distinct chains (by chain id) containing that consecutive pair. Candidate
chains are length-bounded random walks on G biased by w.

Pure and deterministic given the ``random.Random`` passed in: neighbours are
visited in sorted order, so the same graph and seed give the same walks.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, Field

START_SMOOTHING = 1.0
"""Pseudo-count every walkable node adds to its chain-start count (see ``start_weights``)."""


class Walk(BaseModel):
    """One sampled candidate chain."""

    tools: Annotated[list[str], Field(min_length=1, description="Tool names in walk order.")]
    weight: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="Product of the normalised transition probabilities w(a->b) / sum_c w(a->c) "
            "along the walk (1 for a single node).",
        ),
    ]


class TransitionGraph:
    """Weighted transition graph of one server, built from its synthesised chains.

    ``nodes`` fixes the vertex set (the server's current tools): chains may name
    other tools (an older version of the server), whose edges are then ignored.
    Without ``nodes`` the vertex set is every tool of every chain added.
    """

    def __init__(self, nodes: Iterable[str] | None = None) -> None:
        self._fixed = nodes is not None
        self._nodes: set[str] = set(nodes or ())
        self._chains: dict[str, tuple[str, ...]] = {}
        self._edges: dict[tuple[str, str], int] | None = None  # derived, rebuilt lazily
        self._out: dict[str, dict[str, int]] = {}

    # ----------------------------------------------------------------------------------- build

    def add_chain(self, chain_id: str, tools: Sequence[str]) -> bool:
        """Add a chain; False (and no change) when ``chain_id`` is already in the graph."""
        if chain_id in self._chains or not tools:
            return False
        self._chains[chain_id] = tuple(tools)
        if not self._fixed:
            self._nodes.update(tools)
        self._edges = None
        return True

    def restrict(self, nodes: Iterable[str]) -> TransitionGraph:
        """The same chains over a fixed vertex set (e.g. the server's tools now)."""
        graph = TransitionGraph(nodes)
        for chain_id, tools in self._chains.items():
            graph.add_chain(chain_id, tools)
        return graph

    # ------------------------------------------------------------------------------------ read

    @property
    def nodes(self) -> list[str]:
        return sorted(self._nodes)

    @property
    def chain_count(self) -> int:
        """Distinct chains aggregated into the graph."""
        return len(self._chains)

    @property
    def chains(self) -> dict[str, tuple[str, ...]]:
        return dict(self._chains)

    @property
    def edges(self) -> dict[tuple[str, str], int]:
        """(src, dst) -> number of distinct chains with src immediately followed by dst."""
        return dict(self._derive())

    def _derive(self) -> dict[tuple[str, str], int]:
        if self._edges is None:
            edges: dict[tuple[str, str], int] = {}
            for tools in self._chains.values():
                pairs = set(itertools.pairwise(tools))
                for a, b in pairs:
                    if a in self._nodes and b in self._nodes:
                        edges[(a, b)] = edges.get((a, b), 0) + 1
            out: dict[str, dict[str, int]] = {}
            for (a, b), w in sorted(edges.items()):
                out.setdefault(a, {})[b] = w
            self._edges, self._out = edges, out
        return self._edges

    def weight(self, src: str, dst: str) -> int:
        return self._derive().get((src, dst), 0)

    def successors(self, node: str) -> dict[str, int]:
        """Out-neighbours of ``node`` with edge weights, sorted by name."""
        self._derive()
        return dict(self._out.get(node, {}))

    def transition_probability(self, src: str, dst: str) -> float:
        """w(src -> dst) normalised over all of src's out-edges."""
        out = self.successors(src)
        total = sum(out.values())
        return out.get(dst, 0) / total if total else 0.0

    def start_counts(self) -> dict[str, int]:
        """How many chains start at each node."""
        counts = dict.fromkeys(self.nodes, 0)
        for tools in self._chains.values():
            if tools[0] in counts:
                counts[tools[0]] += 1
        return counts

    def start_weights(self, min_length: int) -> dict[str, float]:
        """Unnormalised start distribution of walks.

        Choice: a walk starts at node v with probability proportional to
        (number of chains starting at v) + ``START_SMOOTHING``, over the nodes a
        walk of ``min_length`` can start from (nodes with out-edges when
        ``min_length`` > 1). The synthesised starts dominate, while the
        smoothing still lets walks begin mid-chain (e.g. at a lookup tool whose
        identifier the user already has), which is how walks add chains the
        synthesis did not produce.
        """
        starts = self.start_counts()
        out = {a for a, _ in self._derive()}
        return {v: starts[v] + START_SMOOTHING for v in self.nodes if min_length <= 1 or v in out}

    # ----------------------------------------------------------------------------------- walks

    def random_walks(
        self,
        rng: random.Random,
        n: int,
        min_length: int = 2,
        max_length: int = 4,
        acyclic: bool = True,
        max_attempts: int | None = None,
    ) -> list[Walk]:
        """Up to ``n`` distinct walks with ``min_length`` <= length <= ``max_length``.

        Each attempt draws a start (``start_weights``) and a target length
        uniformly in [min_length, max_length], then steps to a successor with
        probability proportional to the edge weight (never revisiting a node when
        ``acyclic``) until the target length or a dead end. Walks shorter than
        ``min_length`` and duplicates are discarded; at most ``max_attempts``
        (default 20 n + 50) attempts are made, so a small graph returns fewer.
        """
        if min_length < 1 or max_length < min_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {min_length}, {max_length}")
        starts = self.start_weights(min_length)
        if n <= 0 or not starts:
            return []
        names, weights = list(starts), list(starts.values())
        walks: list[Walk] = []
        seen: set[tuple[str, ...]] = set()
        for _ in range(max_attempts if max_attempts is not None else 20 * n + 50):
            if len(walks) >= n:
                break
            start = rng.choices(names, weights)[0]
            walk = self._walk(rng, start, rng.randint(min_length, max_length), acyclic)
            if len(walk.tools) >= min_length and tuple(walk.tools) not in seen:
                seen.add(tuple(walk.tools))
                walks.append(walk)
        return walks

    def _walk(self, rng: random.Random, start: str, length: int, acyclic: bool) -> Walk:
        path, weight = [start], 1.0
        while len(path) < length:
            out = self.successors(path[-1])
            allowed = {b: w for b, w in out.items() if not (acyclic and b in path)}
            if not allowed:
                break
            nxt = rng.choices(list(allowed), list(allowed.values()))[0]
            weight *= out[nxt] / sum(out.values())
            path.append(nxt)
        return Walk(tools=path, weight=weight)

    # ----------------------------------------------------------------------------- serialise

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: the vertex set (when fixed) and the chains; edges are derived."""
        return {
            "nodes": self.nodes if self._fixed else None,
            "chains": {cid: list(tools) for cid, tools in sorted(self._chains.items())},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransitionGraph:
        graph = cls(data.get("nodes"))
        for chain_id, tools in (data.get("chains") or {}).items():
            graph.add_chain(str(chain_id), [str(t) for t in tools])
        return graph

    def __repr__(self) -> str:
        return (
            f"TransitionGraph(nodes={len(self._nodes)}, chains={len(self._chains)}, edges={len(self.edges)})"
        )

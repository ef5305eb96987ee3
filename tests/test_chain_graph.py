"""Transition graph and random walks (synthesis/sft/chain_graph.py) and its store (synthesis/sft/chain_graph_store.py)."""

from __future__ import annotations

import math
import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from synthesis.sft.chain_graph import TransitionGraph, Walk
from synthesis.sft.chain_graph_store import ChainGraphStore


def graph_of(*chains: list[str], nodes: list[str] | None = None) -> TransitionGraph:
    graph = TransitionGraph(nodes)
    for i, chain in enumerate(chains):
        graph.add_chain(f"c{i}", chain)
    return graph


def random_graph(rng: random.Random, size: int = 7, chains: int = 12) -> TransitionGraph:
    tools = [f"t{i}" for i in range(size)]
    graph = TransitionGraph(tools)
    for i in range(chains):
        graph.add_chain(f"c{i}", [rng.choice(tools) for _ in range(rng.randint(1, 5))])
    return graph


# ------------------------------------------------------------------------------------ building


def test_edges_weights_count_distinct_chains() -> None:
    graph = graph_of(["a", "b", "c"], ["a", "b"], ["b", "c", "b", "c"])
    # (b, c) occurs twice in the third chain: it still counts once for that chain.
    assert graph.edges == {("a", "b"): 2, ("b", "c"): 2, ("c", "b"): 1}
    assert graph.weight("a", "c") == 0
    assert graph.successors("b") == {"c": 2}
    assert graph.start_counts() == {"a": 2, "b": 1, "c": 0}
    assert graph.transition_probability("a", "b") == 1.0


def test_add_chain_is_idempotent_per_chain_id_and_graph_grows() -> None:
    graph = TransitionGraph(["a", "b", "c"])
    assert graph.add_chain("x", ["a", "b"]) is True
    assert graph.add_chain("x", ["a", "b"]) is False
    assert graph.add_chain("x", ["b", "c"]) is False  # the id is taken: nothing changes
    assert graph.edges == {("a", "b"): 1} and graph.chain_count == 1
    assert graph.add_chain("y", ["a", "b", "c"]) is True
    assert graph.edges == {("a", "b"): 2, ("b", "c"): 1} and graph.chain_count == 2


def test_fixed_nodes_ignore_unknown_tools_and_restrict() -> None:
    free = graph_of(["a", "gone", "b"], ["a", "b"])
    assert set(free.nodes) == {"a", "b", "gone"}
    fixed = free.restrict(["a", "b"])
    # a -> gone -> b is not an a -> b transition; only the second chain gives one.
    assert fixed.edges == {("a", "b"): 1}
    assert fixed.nodes == ["a", "b"] and fixed.chain_count == 2


def test_round_trip_through_dict() -> None:
    graph = graph_of(["a", "b", "c"], ["c", "a"], nodes=["a", "b", "c", "d"])
    copy = TransitionGraph.from_dict(graph.to_dict())
    assert copy.edges == graph.edges and copy.nodes == graph.nodes and copy.chains == graph.chains
    free = TransitionGraph.from_dict(graph_of(["a", "b"]).to_dict())
    assert free.nodes == ["a", "b"]


# --------------------------------------------------------------------------------------- walks


@pytest.mark.parametrize("acyclic", [True, False])
def test_walks_respect_length_bounds_edges_and_acyclicity(acyclic: bool) -> None:
    for seed in range(40):
        rng = random.Random(seed)
        graph = random_graph(rng)
        min_len, max_len = rng.randint(1, 3), rng.randint(3, 6)
        walks = graph.random_walks(rng, 8, min_length=min_len, max_length=max_len, acyclic=acyclic)
        assert len(walks) == len({tuple(w.tools) for w in walks}) <= 8
        for walk in walks:
            assert min_len <= len(walk.tools) <= max_len
            assert all(graph.weight(a, b) > 0 for a, b in zip(walk.tools, walk.tools[1:], strict=False))
            if acyclic:
                assert len(set(walk.tools)) == len(walk.tools)


def test_cyclic_walks_can_revisit_and_acyclic_ones_cannot() -> None:
    graph = graph_of(["a", "b", "a", "b"], ["b", "a"])
    cyclic = graph.random_walks(random.Random(0), 10, min_length=3, max_length=4, acyclic=False)
    assert cyclic and all(len(set(w.tools)) < len(w.tools) for w in cyclic)
    assert graph.random_walks(random.Random(0), 10, min_length=3, max_length=4, acyclic=True) == []


def test_walk_weight_is_product_of_transition_probabilities() -> None:
    graph = graph_of(["a", "b", "c"], ["a", "b"], ["a", "c"], ["b", "d"])
    for walk in graph.random_walks(random.Random(1), 10, min_length=2, max_length=3):
        expected = math.prod(
            graph.transition_probability(a, b) for a, b in zip(walk.tools, walk.tools[1:], strict=False)
        )
        assert walk.weight == pytest.approx(expected)
    assert Walk(tools=["a"], weight=1.0).weight == 1.0


def test_edge_weights_bias_the_walks() -> None:
    chains = [["a", "b"]] * 9 + [["a", "c"]]
    graph = TransitionGraph(["a", "b", "c"])
    for i, chain in enumerate(chains):
        graph.add_chain(f"c{i}", chain)
    seen: Counter[tuple[str, ...]] = Counter()
    for seed in range(2000):
        (walk,) = graph.random_walks(random.Random(seed), 1, min_length=2, max_length=2)
        seen[tuple(walk.tools)] += 1
    share = seen[("a", "b")] / 2000
    assert 0.86 < share < 0.94, seen  # w(a->b) / (w(a->b) + w(a->c)) = 0.9


def test_start_nodes_are_biased_by_chain_starts() -> None:
    graph = TransitionGraph(["x", "y", "z"])
    for i in range(9):
        graph.add_chain(f"x{i}", ["x", "z"] if i % 2 else ["x", "z", "y"])
    graph.add_chain("y0", ["y", "z"])
    # Start weights: x 9 + 1, y 1 + 1 (z has out-edges too: z -> y, weight 1, no chain starts there).
    assert graph.start_weights(2) == {"x": 10.0, "y": 2.0, "z": 1.0}
    starts: Counter[str] = Counter()
    for seed in range(1300):
        (walk,) = graph.random_walks(random.Random(seed), 1, min_length=2, max_length=2)
        starts[walk.tools[0]] += 1
    assert starts["x"] / 1300 == pytest.approx(10 / 13, abs=0.04)
    assert starts["x"] > starts["y"] > 0 and starts["z"] > 0


def test_walks_are_deterministic_for_a_seed_and_vary_across_seeds() -> None:
    graph = random_graph(random.Random(3), size=8, chains=20)
    first = graph.random_walks(random.Random(11), 6, 2, 4)
    assert first == graph.random_walks(random.Random(11), 6, 2, 4)
    others = {tuple(tuple(w.tools) for w in graph.random_walks(random.Random(s), 6, 2, 4)) for s in range(5)}
    assert len(others) > 1


def test_small_or_empty_graph_gives_fewer_walks() -> None:
    graph = graph_of(["a", "b"])
    assert [w.tools for w in graph.random_walks(random.Random(0), 5, 2, 4)] == [["a", "b"]]
    assert TransitionGraph(["a", "b"]).random_walks(random.Random(0), 5, 2, 4) == []
    assert graph.random_walks(random.Random(0), 0, 2, 4) == []
    singles = graph.random_walks(random.Random(0), 5, 1, 1)
    assert sorted(w.tools[0] for w in singles) == ["a", "b"]
    with pytest.raises(ValueError):
        graph.random_walks(random.Random(0), 5, 3, 2)


# --------------------------------------------------------------------------------------- store


def test_store_round_trip_idempotent_and_growing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    store = ChainGraphStore(url)
    assert store.add("hotels", "c1", ["search", "rooms", "book"]) is True
    assert store.add("hotels", "c1", ["search", "rooms", "book"]) is False
    assert store.add("hotels", "c2", ["search", "rooms"]) is True
    assert store.add("notes", "c1", ["create", "get"]) is True  # same chain id, other server
    graph = store.load("hotels", ["search", "rooms", "book"])
    assert graph.edges == {("search", "rooms"): 2, ("rooms", "book"): 1}
    assert store.chain_count("hotels") == 2 and store.load("notes").edges == {("create", "get"): 1}
    store.dispose()

    # A restarted worker sees the same graph, keeps growing it, and restricts it to today's tools.
    again = ChainGraphStore(url)
    assert again.load("hotels").to_dict() == graph.to_dict() | {"nodes": None}
    assert again.add("hotels", "c3", ["search", "details"]) is True
    grown = again.load("hotels", ["search", "rooms", "details"])
    assert grown.edges == {("search", "rooms"): 2, ("search", "details"): 1}
    assert grown.chain_count == 3 and "book" not in grown.nodes
    assert again.load("unknown").chain_count == 0


def test_store_concurrent_adds_record_a_chain_once(tmp_path: Path) -> None:
    store = ChainGraphStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    results: list[bool] = []

    def add() -> None:
        results.append(store.add("srv", "same", ["a", "b", "c"]))

    threads = [threading.Thread(target=add) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]
    assert store.chains("srv") == {"same": ["a", "b", "c"]}

"""Grouping a collection of unrelated functions into candidate servers of bounded size.

A function-calling dataset (BFCL, xLAM, ToolACE, glaive dumps) is a bag of functions,
not a server. ``group_tools`` turns it into servers the SFT track can use:

1. functions sharing a namespace (``spotify.play``, ``spotify.pause`` -> ``spotify``)
   or offered together in one dataset line (co-occurrence) are joined (union-find);
2. a joined component within ``[min_size, bound]`` is a server;
3. a component over ``bound`` is dissolved into its namespaces (each chunked to the
   bound) and loose functions;
4. everything smaller than ``min_size`` is packed, most similar first, into groups of
   at most ``pack_size`` (lexical similarity: TF-IDF over hashed name, namespace and
   description tokens; deterministic, no model download, ~1 s for thousands of tools).

Every group is labelled by its dominant namespace or name token, for the server name.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

HASH_DIM = 512
"""Width of the hashed token vectors."""
BLOCK = 1500
"""Loose functions are packed in blocks of at most this many (sorted by key): O(block^2) per block,
so packing is linear in the number of functions."""

_STOP = frozenset(
    """a an and are as at be by for from get given in into is it its of on or set
    the this that to use used uses using with which will your you based specified
    specific provided return returns data information details value values""".split()
)


@dataclass
class Member:
    """One distinct function to group."""

    name: str
    description: str = ""
    units: frozenset[int] = field(default_factory=frozenset)
    """Dataset lines it was offered in (co-occurrence)."""


@dataclass
class Group:
    """Indices into the members, and a label for the server name."""

    members: list[int]
    label: str


def namespace(name: str) -> str | None:
    """``spotify.play`` -> ``spotify``; ``files/read`` -> ``files``; None without a separator."""
    for sep in (".", "/", "::"):
        if sep in name:
            head = name.split(sep, 1)[0].strip()
            return head.lower() or None
    return None


def name_tokens(name: str) -> list[str]:
    """Lower-case word tokens of an identifier (camelCase, snake_case, dotted)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [t for t in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if t and not t.isdigit()]


def _words(text: str) -> list[str]:
    return [w for w in re.findall(r"[a-z][a-z0-9]{2,}", text.lower()) if w not in _STOP]


def group_tools(members: list[Member], *, bound: int, min_size: int = 3, pack_size: int = 8) -> list[Group]:
    """Partition ``members`` into groups of at most ``bound`` (and, where possible, at least ``min_size``)."""
    if not members:
        return []
    bound = max(1, bound)
    pack_size = max(min(pack_size, bound), min(min_size, bound))
    final: list[list[int]] = []
    small: list[list[int]] = []
    for comp in _components(members):
        if len(comp) > bound:
            pieces = _dissolve(members, comp, bound)
        else:
            pieces = [comp]
        for piece in pieces:
            (final if len(piece) >= min_size else small).append(piece)
    final.extend(_pack(members, small, min_size=min_size, cap=pack_size))
    final.sort(key=lambda g: min(g))
    return [Group(members=sorted(g), label=_label(members, g)) for g in final]


# ---------------------------------------------------------------------------------------------
# Union-find over namespaces and co-occurrence


def _components(members: list[Member]) -> list[list[int]]:
    parent = list(range(len(members)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    first_of: dict[tuple[str, object], int] = {}
    for i, m in enumerate(members):
        keys: list[tuple[str, object]] = [("unit", u) for u in m.units]
        ns = namespace(m.name)
        if ns is not None:
            keys.append(("ns", ns))
        for key in keys:
            if key in first_of:
                union(first_of[key], i)
            else:
                first_of[key] = i
    comps: dict[int, list[int]] = {}
    for i in range(len(members)):
        comps.setdefault(find(i), []).append(i)
    return list(comps.values())


def _dissolve(members: list[Member], comp: list[int], bound: int) -> list[list[int]]:
    """An oversized component: its namespaces (chunked to ``bound``) and its loose functions."""
    by_ns: dict[str | None, list[int]] = {}
    for i in comp:
        by_ns.setdefault(namespace(members[i].name), []).append(i)
    out: list[list[int]] = [[i] for i in by_ns.pop(None, [])]
    for _, idx in sorted(by_ns.items(), key=lambda kv: str(kv[0])):
        out.extend(chunk(sorted(idx, key=lambda i: members[i].name), bound))
    return out


def chunk(items: list[int], bound: int) -> list[list[int]]:
    """``items`` in order, cut into the fewest near-equal contiguous chunks of at most ``bound``."""
    if len(items) <= bound:
        return [items]
    parts = math.ceil(len(items) / bound)
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for p in range(parts):
        end = start + size + (1 if p < extra else 0)
        out.append(items[start:end])
        start = end
    return out


# ---------------------------------------------------------------------------------------------
# Packing small groups by lexical similarity


def _vectors(members: list[Member], groups: list[list[int]]) -> np.ndarray:
    """One L2-normalised TF-IDF vector per group (hashed tokens; deterministic across runs)."""
    bags: list[Counter[str]] = []
    for g in groups:
        bag: Counter[str] = Counter()
        for i in g:
            m = members[i]
            ns = namespace(m.name)
            if ns:
                bag[f"ns:{ns}"] += 3
            for t in name_tokens(m.name):
                bag[t] += 2
            for w in _words(m.description[:400]):
                bag[w] += 1
        bags.append(bag)
    df: Counter[str] = Counter(t for bag in bags for t in bag)
    n = len(bags)
    out = np.zeros((n, HASH_DIM), dtype=np.float32)
    for row, bag in enumerate(bags):
        for token, tf in bag.items():
            h = zlib.crc32(token.encode("utf-8"))
            sign = 1.0 if h & 0x80000000 else -1.0
            out[row, h % HASH_DIM] += sign * (1.0 + math.log(tf)) * math.log(1.0 + n / df[token])
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return out / norms


def _sort_key(members: list[Member], g: list[int]) -> tuple[str, str]:
    first = members[min(g)]
    tokens = name_tokens(first.name)
    return (namespace(first.name) or (tokens[-1] if tokens else ""), first.name)


def _pack(members: list[Member], small: list[list[int]], *, min_size: int, cap: int) -> list[list[int]]:
    if not small:
        return []
    ordered = sorted(small, key=lambda g: _sort_key(members, g))
    out: list[list[int]] = []
    for start in range(0, len(ordered), BLOCK):
        out.extend(_pack_block(members, ordered[start : start + BLOCK], min_size=min_size, cap=cap))
    return out


def _pack_block(
    members: list[Member], groups: list[list[int]], *, min_size: int, cap: int
) -> list[list[int]]:
    """Greedy agglomeration: each group under ``min_size`` absorbs its most similar neighbour that fits."""
    groups = [list(g) for g in groups]
    vec = _vectors(members, groups)
    sizes = np.array([len(g) for g in groups], dtype=np.int64)
    alive = np.ones(len(groups), dtype=bool)
    sim = vec @ vec.T
    np.fill_diagonal(sim, -np.inf)
    order = sorted(range(len(groups)), key=lambda i: (sizes[i], i))
    for i in order:
        while alive[i] and sizes[i] < min_size:
            fits = alive & (sizes + sizes[i] <= cap)
            fits[i] = False
            if not fits.any():
                break
            scores = np.where(fits, sim[i], -np.inf)
            j = int(np.argmax(scores))
            merged = vec[i] * sizes[i] + vec[j] * sizes[j]
            norm = float(np.linalg.norm(merged)) or 1.0
            vec[i] = merged / norm
            groups[i].extend(groups[j])
            sizes[i] += sizes[j]
            alive[j] = False
            sim[j, :] = -np.inf
            sim[:, j] = -np.inf
            # einsum, not BLAS gemv: one merge is too small to share out, and BLAS threads that
            # spin-wait on a busy machine made this loop 5-20 times slower.
            row = np.einsum("ij,j->i", vec, vec[i])
            row[~alive] = -np.inf
            row[i] = -np.inf
            sim[i, :] = row
            sim[:, i] = row
    return [groups[i] for i in range(len(groups)) if alive[i]]


def _label(members: list[Member], g: list[int]) -> str:
    spaces = Counter(ns for i in g if (ns := namespace(members[i].name)))
    if spaces:
        return sorted(spaces.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    tokens: Counter[str] = Counter()
    for i in g:
        tokens.update({t for t in name_tokens(members[i].name) if t not in _STOP and len(t) > 2})
    if tokens:
        return sorted(tokens.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return members[min(g)].name or "tools"

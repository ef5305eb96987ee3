"""The tracks: each folder of ``streams/`` that holds stages, and the stages it holds.

A stage registers itself by living in its track's folder: a module there that defines a
module-level ``StageDef`` is found (``arena.plugins.instances``), so adding a stage touches its
track folder and the topic table (``arena/topics.py``), and nothing else that lists stages.
``app.registry`` builds the workers from ``tracks()``; ``arena worker --track NAME`` runs one;
``docker-compose.yml`` runs one service per track (``tests/test_compose.py`` holds it to this).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import streams
from arena.plugins import instances
from streams.runtime import StageDef

DATAFLOW_ORDER = ("tools", "sft", "envs", "eigen")
"""Tracks in the order data flows through them (tool docs feed sft and envs); others follow by name."""


@dataclass(frozen=True)
class Track:
    """One track: its name (the folder's), what it is, and its stages in dataflow order."""

    name: str
    description: str
    """The first line of the track package's docstring."""
    stages: tuple[StageDef[Any], ...]


def _rank(name: str) -> tuple[int, str]:
    return (DATAFLOW_ORDER.index(name) if name in DATAFLOW_ORDER else len(DATAFLOW_ORDER), name)


def _side_topic(name: str) -> bool:
    return name.endswith((".dlq", ".rejected"))


def depths(stages: Sequence[StageDef[Any]]) -> dict[str, int]:
    """Each stage's depth in the topic graph: its admission priority (higher is nearer the output).

    A stage reading a topic no stage writes has depth 0; any other stage has one more than the
    deepest stage writing its input (the longest path from a source topic), so a stage whose
    outputs feed another stage ranks below it. Side topics (``.dlq``, ``.rejected``) are not
    edges; an edge that would close a cycle is ignored.
    """
    writers: dict[str, list[StageDef[Any]]] = {}
    for stage in stages:
        for name in stage.outputs:
            if not _side_topic(name):
                writers.setdefault(name, []).append(stage)
    depth: dict[str, int] = {}
    on_path: set[str] = set()

    def visit(stage: StageDef[Any]) -> int:
        if stage.name in depth:
            return depth[stage.name]
        on_path.add(stage.name)
        upstream = [visit(w) for w in writers.get(stage.input, ()) if w.name not in on_path]
        on_path.discard(stage.name)
        depth[stage.name] = 1 + max(upstream) if upstream else 0
        return depth[stage.name]

    return {stage.name: visit(stage) for stage in stages}


def tracks() -> tuple[Track, ...]:
    """Every subpackage of ``streams`` with at least one stage, in dataflow order (``DATAFLOW_ORDER``).

    Within a track, stages come by their depth in the topic graph (``depths``), then by name.
    """
    found: list[Track] = []
    for info in pkgutil.iter_modules(streams.__path__):
        if not info.ispkg:
            continue
        package = importlib.import_module(f"streams.{info.name}")
        stages = tuple(instances(package, StageDef))
        if stages:
            doc = (package.__doc__ or info.name).strip().splitlines()[0]
            found.append(Track(info.name, doc, stages))
    depth = depths([stage for track in found for stage in track.stages])
    ordered = (
        Track(t.name, t.description, tuple(sorted(t.stages, key=lambda s: (depth[s.name], s.name))))
        for t in found
    )
    return tuple(sorted(ordered, key=lambda t: _rank(t.name)))

"""Writers and readers per topic (``app.registry.topic_roles``), built from the stage registry."""

from __future__ import annotations

import json

from app.registry import CLIENTS, STAGES, WORKERS, TopicRoles, topic_roles
from arena.topics import TOPICS, topic


def test_every_topic_has_roles_and_every_stage_topic_a_writer() -> None:
    roles = topic_roles()
    assert list(roles) == list(TOPICS)
    assert all(isinstance(r, TopicRoles) for r in roles.values())
    for name, r in roles.items():
        assert list(r.writers) == sorted(set(r.writers)) and list(r.readers) == sorted(set(r.readers))
        if TOPICS[name].side_of is None:
            assert r.writers, f"nobody writes {name}"
    # A side topic is written by the stages that read its topic (and by writers that dead-letter
    # at the source, like `arena publish tools`). Only the lake sink reads eigen.verified,
    # eigen.pilot.metrics and trainer.metrics, and the sink never dead-letters or rejects, so
    # some of their side topics have no writer; every other side topic has one.
    sink_only = {n for n, r in roles.items() if r.readers == ("lake-sink",) and TOPICS[n].side_of is None}
    sink_only.add("stages.ledger")  # also read by `arena worker`'s drain check, which never dead-letters
    unwritten = {n for n, r in roles.items() if not r.writers}
    assert unwritten <= {n for n, spec in TOPICS.items() if spec.side_of in sink_only}, unwritten
    assert unwritten == {
        "eigen.verified.dlq",
        "eigen.pilot.metrics.dlq",
        "trainer.metrics.dlq",
        "trainer.metrics.rejected",
        "llm.usage.dlq",
        "llm.usage.rejected",
        "stages.ledger.dlq",
        "stages.ledger.rejected",
    }
    assert set(roles["llm.usage"].writers) == {s.name for s in STAGES}  # every stage reports its LLM use
    assert set(roles["stages.ledger"].writers) == {s.name for s in STAGES}  # and accounts for its inputs
    assert roles["stages.ledger"].readers == ("arena worker", "lake-sink")


def test_stage_inputs_are_readers_and_declared_emits_are_writers() -> None:
    roles = topic_roles()
    for stage in STAGES:
        assert stage.name in roles[stage.input].readers
        spec = topic(stage.input)
        for name in (*stage.outputs, spec.dlq, spec.rejected):
            assert stage.name in roles[name].writers, (stage.name, name)
    for name in TOPICS:
        assert "lake-sink" in roles[name].readers
    assert set(WORKERS) >= {s.name for s in STAGES}


def test_publishers_and_the_trainer_are_declared() -> None:
    roles = topic_roles()
    assert "arena publish tools" in roles["tools.raw"].writers
    assert "arena publish qa" in roles["qa.seeds"].writers
    assert {"arena publish domain"} <= set(roles["eigen.seeds"].writers)
    assert "arena publish domain" in roles["eigen.pilot.metrics"].writers
    assert roles["trainer.metrics"].writers == ("arena train",)
    for name in ("samples.sft", "samples.verified"):
        assert "arena train" in roles[name].readers
        assert "arena train" in roles[topic(name).dlq].writers
    for client in CLIENTS:
        for name in (*client.writes, *client.reads):
            assert topic(name).name == name  # registered names only
    assert not {c.name for c in CLIENTS} & set(WORKERS)


def test_arena_topics_list_shows_writers_and_readers() -> None:
    from typer.testing import CliRunner

    from app.cli import app

    result = CliRunner().invoke(app, ["topics", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["topic"]: row for row in json.loads(result.output)}
    assert list(rows) == list(TOPICS)
    assert rows["tools.servers"]["writers"] == ["tools-servers"]
    assert {"chains", "tasks-from-servers", "tool-index", "lake-sink"} <= set(
        rows["tools.servers"]["readers"]
    )
    assert rows["samples.verified"]["writers"] == ["eigen-verified", "samples-verified"]

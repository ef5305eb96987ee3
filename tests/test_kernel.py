"""Fast unit tests of the kernel: config, topic registry, hashing, lineage, stage runtime."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from arena.config import ArenaSettings, redact_url
from arena.hashing import content_hash
from arena.records.common import DeadLetter, DeadLetterKind, Lineage, Rejection
from arena.records.tools import RawToolServer
from arena.topics import TOPICS, by_table, topic
from streams.runtime import Context, Emit, StageDef, decode, encode, run_handler

DESIGN_TOPICS = (
    "tools.raw tools.servers chains tasks trajectories trajectories.scored samples.sft "
    "qa.seeds qa.traces qa.validated envs.code envs.verified samples.verified "
    "eigen.seeds eigen.intents eigen.tasks eigen.dialogs eigen.dialogs.validated eigen.verified "
    "eigen.pilot.metrics trainer.metrics"
).split()
ADDED_TOPICS = ["llm.usage", "stages.ledger"]
"""Topics added since DESIGN.md: LLM usage per stage and role (the real-LLM throughput issue) and
the outcome of every input record a stage handled (the exactly-once issue)."""


def test_every_design_topic_is_declared_with_side_topics() -> None:
    for name in DESIGN_TOPICS + ADDED_TOPICS:
        spec = topic(name)
        assert spec.partitions >= 1 and spec.key and issubclass(spec.value, BaseModel)
        assert topic(spec.dlq).value is DeadLetter and topic(spec.dlq).side_of == name
        assert topic(spec.rejected).value is Rejection
    assert len(TOPICS) == 3 * len(DESIGN_TOPICS + ADDED_TOPICS)
    assert by_table("tools_raw_rejected").name == "tools.raw.rejected"
    with pytest.raises(KeyError, match="unknown topic"):
        topic("tools.rwa")


def test_settings_precedence_toml_and_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ARENA_")]:
        monkeypatch.delenv(key)
    toml = tmp_path / "arena.toml"
    toml.write_text('broker = "toml:9092"\nllm = "rules"\nseed = 7\n')
    monkeypatch.setenv("ARENA_CONFIG", str(toml))
    monkeypatch.setenv("ARENA_SEED", "3")
    monkeypatch.setenv("ARENA_HOME", str(tmp_path / "h"))
    cfg = ArenaSettings()
    assert cfg.broker == "toml:9092" and cfg.seed == 3  # env beats the file
    assert cfg.lake == f"file://{tmp_path / 'h' / 'lake'}"
    assert cfg.catalog == f"sqlite:///{tmp_path / 'h' / 'catalog.db'}"

    cfg = ArenaSettings(
        s3_secret_key="s3cr3t", catalog_url="postgresql://u:pw@db:5432/arena", s3_endpoint="http://x:9000"
    )
    assert "s3cr3t" not in repr(cfg) and "pw" not in str(cfg.public_view())
    assert cfg.s3_credentials()["secret_key"] == "s3cr3t"
    assert redact_url("postgresql://u:pw@db/a") == "postgresql://u:***@db/a"


def test_settings_validation_errors() -> None:
    with pytest.raises(ValidationError, match="file:// or s3://"):
        ArenaSettings(lake_url="ftp://x/y")
    with pytest.raises(ValidationError, match="ARENA_S3_ENDPOINT"):
        ArenaSettings(lake_url="s3://bucket/lake")
    with pytest.raises(ValidationError):
        ArenaSettings(commit_interval_s=0)


def test_content_hash_ignores_key_order() -> None:
    assert content_hash({"a": 1, "b": [1, 2]}) == content_hash({"b": [1, 2], "a": 1})
    assert content_hash({"a": 1}) != content_hash({"a": 2})
    assert content_hash(b"raw") == content_hash(b"raw") and len(content_hash("x")) == 32


def test_lineage_headers_round_trip() -> None:
    lineage = Lineage(source_ids=["k1", "k2"], stage="tools-servers", stage_version="1", backend="rules")
    back = Lineage.from_headers(lineage.to_headers())
    assert back is not None and back.model_dump() == lineage.model_dump()
    assert Lineage.from_headers([("other", b"x")]) is None


def test_decode_classifies_broken_input() -> None:
    spec = topic("tools.raw")
    cases = {
        b'{"server": "a"': DeadLetterKind.parse_error,
        b"\xff\xfe": DeadLetterKind.parse_error,
        b'{"server": 3}': DeadLetterKind.schema_violation,
    }
    for raw, kind in cases.items():
        letter = decode(spec, raw, stage="s", source_key="k", partition=2, offset=9).dead_letter
        assert letter is not None and letter.kind == kind and letter.reason
        assert base64.b64decode(letter.payload_b64) == raw and (letter.partition, letter.offset) == (2, 9)
    good = RawToolServer(server="s", source="f.json", format="openai", entries=[])
    decoded = decode(spec, good.model_dump_json().encode(), stage="s", source_key="k")
    assert decoded.dead_letter is None and decoded.record == good


def _ctx() -> Context:
    return Context("demo", "1", topic("tools.raw"), "src-key", ArenaSettings())


def test_reject_and_encode() -> None:
    emit = _ctx().reject("min_tools", "srv", "2 tools", details={"tools": 2})
    assert emit.topic == "tools.raw.rejected" and emit.source_ids == ("src-key",)
    key, value, headers = encode(emit, stage="demo", stage_version="1")
    assert key == emit.key.encode() and Rejection.model_validate_json(value).gate == "min_tools"
    assert dict(headers)["arena-source-ids"] == b"src-key"
    with pytest.raises(KeyError):
        encode(Emit("not.a.topic", "k", emit.value), stage="demo", stage_version="1")


def test_a_crashing_handler_becomes_a_dead_letter() -> None:
    async def boom(record: RawToolServer, ctx: Context) -> list[Emit]:
        raise ZeroDivisionError("division by zero")

    stage = StageDef(name="demo", input="tools.raw", input_model=RawToolServer, version="1", handler=boom)
    record = RawToolServer(server="s", source="f", format="openai", entries=[])
    emits = asyncio.run(run_handler(stage, record, _ctx(), b"raw-bytes"))
    assert len(emits) == 1 and emits[0].topic == "tools.raw.dlq"
    letter = emits[0].value
    assert isinstance(letter, DeadLetter) and letter.kind == DeadLetterKind.crash
    assert "ZeroDivisionError" in letter.reason and base64.b64decode(letter.payload_b64) == b"raw-bytes"

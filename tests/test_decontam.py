"""Decontamination: synthesized near-duplicates of benchmark test items are flagged and never trained on.

The benchmark items are real: BFCL questions from bfcl-eval's wheel (``.venv-bfcl``), and tau2
test-split user scenarios in tau2's layout (``<domain>/tasks.json`` + ``split_tasks.json``; the
scenarios here are written for the test, so the split's effect is visible). Near-duplicates are
planted: a benchmark question lightly reworded, one pasted into a longer task, a tau2 scenario
cut short. The trainer's sample source is checked against a real broker, the report command
against a real lake.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from arena.config import ArenaSettings
from arena.records.common import Rejection
from arena.records.envs import VerifiedSample
from arena.topics import topic
from lake.parquet import LakeRow, LakeWriter
from lake.store import open_store
from streams.admin import ensure_topics
from streams.runtime import Emit, encode
from tests.cli import arena_env, read_all, run_arena
from trainer.decontam import (
    BenchmarkIndex,
    NearDuplicates,
    NgramIndex,
    Screen,
    bench_counts,
    bfcl_items,
    ngrams,
    record_text,
    scan,
    tau2_items,
)
from trainer.samples_source import SampleSource

pytestmark = pytest.mark.integration

TEST_SCENARIO = {
    "reason_for_call": "You want to cancel reservation EHGLP3 because your trip to Denver was called off "
    "and you expect a full refund to the original credit card.",
    "known_info": "You are Emma Kim. Your user id is emma_kim_9957.",
    "task_instructions": "Do not accept a travel voucher instead of a refund.",
}
TRAIN_SCENARIO = {
    "reason_for_call": "You want to add two checked bags to reservation QX81JD for your flight to Boston "
    "next Tuesday and pay with the gift card on file.",
    "known_info": "You are Omar Reyes. Your user id is omar_reyes_1204.",
}
CLEAN_TASKS = [
    "Look up the asking price of listing L-101 and book a viewing for Friday at 10am.",
    "Search my notes for 'quarterly plan', then e-mail the first result to dana@example.com.",
    "What is the weather in Lisbon tomorrow, and convert 30 euros to dollars?",
]


def tau2_layout(root: Path) -> Path:
    """tau2's shipped layout for one domain: tasks.json and split_tasks.json (test: task 1)."""
    folder = root / "airline"
    folder.mkdir(parents=True)
    tasks = [
        {
            "id": "0",
            "user_scenario": {"persona": None, "instructions": {"domain": "airline", **TRAIN_SCENARIO}},
        },
        {
            "id": "1",
            "user_scenario": {"persona": None, "instructions": {"domain": "airline", **TEST_SCENARIO}},
        },
    ]
    (folder / "tasks.json").write_text(json.dumps(tasks))
    (folder / "split_tasks.json").write_text(json.dumps({"train": ["0"], "test": ["1"], "base": ["0", "1"]}))
    return root


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> BenchmarkIndex:
    data = tau2_layout(tmp_path_factory.mktemp("tau2"))
    return BenchmarkIndex(items=bfcl_items(["simple_python", "parallel"]) + tau2_items(data, ["airline"]))


def sample(text: str) -> VerifiedSample:
    return VerifiedSample(
        sample_id=f"s-{abs(hash(text))}",
        kind="interactive",
        prompt=[{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": text}],
        tools=[],
        env_ref="instance-1",
        reward_spec={},
        domain="test",
    )


PLANTED = {
    # simple_python_0: "Find the area of a triangle with a base of 10 units and height of 5 units."
    "Please find the area of a triangle with a base of 10 units and height of 5 units, thanks!": "simple_python_0",
    "First list my open tickets. Then find the area of a triangle with a base of 10 units and height of 5 "
    "units, and finally send the result to my manager by e-mail with a short summary of the tickets.": (
        "simple_python_0"
    ),
    # the tau2 test scenario, cut short and reworded at the end
    "I want to cancel reservation EHGLP3 because your trip to Denver was called off and you expect a full "
    "refund please. I am Emma Kim.": "airline/1",
}


def test_index_holds_bfcl_questions_and_only_tau2_test_scenarios(index: BenchmarkIndex) -> None:
    counts = bench_counts(index)
    assert counts["bfcl"] == 400 + 200 and counts["tau2"] == 1  # simple_python + parallel; test split only
    by_id = {i.item_id: i for i in index.items}
    assert by_id["simple_python/simple_python_0"].text.startswith("Find the area of a triangle")
    assert "EHGLP3" in by_id["airline/1"].text and "airline/0" not in by_id
    assert ngrams("One two") == {"one two"} and len(ngrams("a b c d e f")) == 2


@pytest.fixture(scope="module")
def tests_of(index: BenchmarkIndex) -> NearDuplicates:
    return NearDuplicates(index)  # the items embedded: n-grams, then cosine >= 0.9


PARAPHRASE = "Compute the area of a triangle whose base is 10 units and whose height is 5 units."
"""simple_python_0 reworded: it shares a 5-gram or two, a cosine of about 0.96."""


def test_planted_near_duplicates_are_flagged_and_the_rest_is_not(
    index: BenchmarkIndex, tests_of: NearDuplicates
) -> None:
    ngram_index = NgramIndex(index)
    for text, item in PLANTED.items():
        found = ngram_index.match(text)
        assert found is not None and found[0].item_id.endswith(item), (text, found)
        assert found[1] >= index.threshold
    train_copy = TRAIN_SCENARIO["reason_for_call"]  # the train split is fair game for synthesis
    for text in [*CLEAN_TASKS, train_copy]:
        assert ngram_index.match(text) is None, (text, ngram_index.best(text))
    # A report over records of every scanned shape.
    records = [
        ("samples.verified", f"k{i}", sample(t).model_dump(mode="json")) for i, t in enumerate(PLANTED)
    ]
    records += [("tasks", "t0", {"text": CLEAN_TASKS[0]}), ("tasks", "t1", {"text": next(iter(PLANTED))})]
    intent = {"objective": "Cancel a booking", "reason_for_call": list(PLANTED)[2]}
    records.append(("eigen.intents", "e0", {"payload": json.dumps({"intent": intent})}))
    user_side = {"role_target": "user", "messages": [{"role": "system", "content": CLEAN_TASKS[1]}]}
    records.append(("samples.sft", "u0", user_side))
    records.append(("tasks", "p0", {"text": PARAPHRASE}))
    report = scan(tests_of, records, bench_counts(index))
    assert sorted(c.key for c in report.flagged) == ["e0", "k0", "k1", "k2", "p0", "t1"]
    by = {c.key: c for c in report.flagged}
    assert by["k0"].by == "ngram" and by["k0"].cosine is None
    assert by["p0"].by == "embedding" and by["p0"].item_id == "simple_python/simple_python_0"
    assert by["p0"].cosine is not None and by["p0"].cosine >= 0.9 and by["p0"].overlap < index.threshold
    assert report.scanned == {"samples.verified": 3, "tasks": 3, "eigen.intents": 1, "samples.sft": 1}
    assert record_text("samples.sft", user_side) == CLEAN_TASKS[1]


def test_a_paraphrase_passes_the_ngrams_and_is_caught_by_its_embedding(
    index: BenchmarkIndex, tests_of: NearDuplicates
) -> None:
    assert NgramIndex(index).match(PARAPHRASE) is None
    ngrams_only = NearDuplicates(index.model_copy(update={"cosine": None}))
    assert ngrams_only.vectors is None and ngrams_only.match(PARAPHRASE) is None
    found = tests_of.match(PARAPHRASE)
    assert found is not None and found.by == "embedding" and found.item.item_id.endswith("simple_python_0")
    for text in [*CLEAN_TASKS, TRAIN_SCENARIO["reason_for_call"], ""]:
        assert tests_of.match(text) is None, text
    why = Screen(tests_of)("samples.verified", sample(PARAPHRASE))
    assert why is not None and why["details"]["by"] == "embedding" and "embedding cosine" in why["reason"]


def test_the_trainer_source_leaves_out_near_duplicates(tests_of: NearDuplicates, broker: str) -> None:
    spec = topic("samples.verified")
    ensure_topics(broker, [spec, topic(spec.rejected), topic(spec.dlq)])
    planted, clean = sample(list(PLANTED)[1]), sample(CLEAN_TASKS[0])

    async def run() -> list[str]:
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        try:
            for record in (planted, clean):
                key, value, headers = encode(
                    Emit(spec.name, record.sample_id, record), stage="test", stage_version="1"
                )
                await producer.send_and_wait(spec.name, value, key=key, headers=headers)
            source: SampleSource[VerifiedSample] = SampleSource(
                broker, spec.name, group_id="decontam-test", screen=Screen(tests_of)
            )
            await source.start(producer)
            try:
                # The session's broker is shared: other tests' samples may be on the topic too.
                taken: list[str] = []
                for _ in range(30):
                    taken += [t.record.sample_id for t in await source.take(50, wait_s=2)]
                    if clean.sample_id in taken and source.screened_out >= 1:
                        break
                return [i for i in taken if i in {planted.sample_id, clean.sample_id}]
            finally:
                await source.stop()
        finally:
            await producer.stop()

    assert asyncio.run(run()) == [clean.sample_id]
    rejected = [Rejection.model_validate_json(r.value) for r in read_all(broker, spec.rejected)]
    (why,) = [r for r in rejected if r.source_key == planted.sample_id]
    assert why.gate == "decontam" and why.subject == "simple_python/simple_python_0"
    assert why.details["bench"] == "bfcl" and why.details["overlap"] >= 0.5 and "near-duplicate" in why.reason


def test_decontam_cli_indexes_and_reports_the_lake(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = arena_env(home)
    missing = run_arena(["decontam", "report"], env, check=2)
    assert "Traceback" not in missing.stderr and "arena decontam index" in missing.stderr
    data = tau2_layout(tmp_path / "tau2")
    args = ["decontam", "index", "--bfcl", "simple", "--tau2", "airline", "--tau2-data", str(data)]
    indexed = run_arena(args, env, timeout=240)
    assert "401 benchmark test items" in indexed.stdout and "bfcl 400" in indexed.stdout
    assert (home / "decontam" / "benchmarks.npy").is_file()  # the items' embeddings, saved once

    planted, clean = sample(list(PLANTED)[2]), sample(CLEAN_TASKS[2])
    rows = [
        LakeRow(
            key=s.sample_id,
            topic="samples.verified",
            partition=0,
            offset=i,
            timestamp_ms=0,
            value=s.model_dump_json().encode(),
        )
        for i, s in enumerate((planted, clean))
    ]
    LakeWriter(open_store(ArenaSettings(home=home))).write("samples.verified", rows)
    out = run_arena(["decontam", "report", "--json"], env).stdout
    report = json.loads(out)
    assert report["scanned"]["samples.verified"] == 2 and report["benchmarks"] == {"bfcl": 400, "tau2": 1}
    (flagged,) = report["flagged"]
    assert flagged["key"] == planted.sample_id and flagged["item_id"] == "airline/1"

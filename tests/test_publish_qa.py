"""`arena publish qa` on the real stack: both synthesis modes, and clear errors for bad input.

Question mode is run through the `qa-traces` worker: a question in the rules
backend's grammar decomposes into the instance it came from; a free-form one
is dead-lettered with a reason that names the fix (an LLM backend).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from arena.records.envs import QaSeed, QaTrace
from producers.builtin_knowledge import builtin_knowledge
from producers.knowledge import unconditional_seed
from simulator.qa import FREE_FORM, synthesize_instance
from synthesis.envs.qa_synthesis import synthesis_inputs
from tests.cli import arena_env, broker_of, read_all, run_arena, stack_stopped_after
from tests.test_cli import assert_user_error

pytestmark = pytest.mark.integration

FREE_QUESTION = "Which neighbourhood has the friendliest agents?"


def templated_question() -> tuple[str, str]:
    """A main question (and its answer) the rules backend writes for the built-in real-estate KB."""
    seed = unconditional_seed(builtin_knowledge("real_estate", 0), hop_budget=2, count=1)
    draft, _ = synthesize_instance(synthesis_inputs(seed, 2, 0.0), random.Random(7))
    return draft.question, draft.answer


def test_publish_qa_modes_and_question_decomposition(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = arena_env(home)
    corpus = tmp_path / "clinic.md"
    corpus.write_text(
        "# Clinics\n\n| clinic_id | name | city |\n|---|---|---|\n| C1 | North Clinic | Oslo |\n"
        "| C2 | South Clinic | Bergen |\n\nThe city of clinic C3 is Tromso.\n"
    )
    question, answer = templated_question()
    questions = tmp_path / "questions.jsonl"
    questions.write_text(
        json.dumps({"question": question}) + "\n" + json.dumps({"question": FREE_QUESTION}) + "\n"
    )
    with stack_stopped_after(env):
        out = run_arena(
            ["publish", "qa", str(corpus), "--builtin", "healthcare", "--hops", "3", "--count", "5"], env
        ).stdout
        assert "qa.seeds" in out
        out = run_arena(
            ["publish", "qa", "--builtin", "real_estate", "--questions", str(questions)], env
        ).stdout
        seeds = [QaSeed.model_validate_json(r.value) for r in read_all(broker_of(home), "qa.seeds")]
        unconditional = [s for s in seeds if s.mode == "unconditional"]
        assert sorted(s.source for s in unconditional) == sorted([str(corpus), "builtin:healthcare"])
        assert all(s.hop_budget == 3 and s.count == 5 for s in unconditional)
        md = next(s for s in unconditional if s.source == str(corpus))
        assert {t.name for t in md.knowledge.tables} >= {"clinics"}
        asked = sorted(s.question or "" for s in seeds if s.mode == "question")
        assert asked == sorted([question, FREE_QUESTION])

        run_arena(["worker", "--stage", "qa-traces", "--until-drained", "--timeout", "240"], env, timeout=300)
        traces = [QaTrace.model_validate_json(r.value) for r in read_all(broker_of(home), "qa.traces")]
        decomposed = [t for t in traces if t.question == question]
        assert len(decomposed) == 1 and decomposed[0].answer == answer
        letters = [json.loads(r.value) for r in read_all(broker_of(home), "qa.seeds.dlq")]
        assert len(letters) == 1 and FREE_FORM in letters[0]["reason"], letters


def test_publish_qa_errors_name_the_input_and_the_fix(tmp_path: Path) -> None:
    env = arena_env(tmp_path / "home")
    assert_user_error(run_arena(["publish", "qa"], env, check=None), "--builtin")
    assert_user_error(
        run_arena(["publish", "qa", "--builtin", "astrology"], env, check=None), "astrology", "real_estate"
    )
    assert_user_error(
        run_arena(["publish", "qa", str(tmp_path / "none.csv")], env, check=None), "none.csv", "fix"
    )
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert_user_error(run_arena(["publish", "qa", str(bad)], env, check=None), "bad.json", "fix")

"""`arena reward score`: offline rescoring of chat transcripts with the trainer's F1 reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from environments.environment import QaEnvironment
from environments.rewards import ScoreRequest, calls_of_messages, score_messages
from sandbox import SandboxPool
from streams.envs.samples_verified import sample_of
from tests.cli import arena_env, run_arena
from tests.fixtures.domain import sandboxed
from tests.test_environments import ECHO_CODE, library_package
from trainer.reference import reference_conversation


def call(call_id: str, name: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def tool(call_id: str, content: str, **extra: object) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": content, **extra}


SUBTASKS = [{"answer": "AU-3"}, {"answer": "Portugal"}]
HONEST = [
    {"role": "user", "content": "Where is the author of B-7 from?"},
    {"role": "assistant", "content": "", "tool_calls": [call("a", "get_book_author")]},
    tool("a", '{"author_id": "AU-3"}'),
    {"role": "assistant", "content": "", "tool_calls": [call("b", "get_author_country")]},
    tool("b", '{"country": "Portugal"}'),
    {"role": "assistant", "content": "Portugal"},
]


def test_messages_count_emitted_and_failed_calls() -> None:
    messages = [
        {"role": "assistant", "tool_calls": [call("a", "x"), call("b", "y")]},
        tool("a", "Portugal", error=True),  # marked failed by the environment
        tool("b", '{"error": "no record with AU-3"}'),  # an error payload
        tool("call_1_invalid_0", "error: invalid tool call"),  # answers no declared call: emitted too
    ]
    emitted, results = calls_of_messages(messages)
    assert emitted == 3 and [r.ok for r in results] == [False, True, True]
    parts = score_messages(ScoreRequest.model_validate({"subtasks": SUBTASKS, "messages": messages}))
    assert parts.n_hat == 0 and parts.f1 == 0.0
    honest = score_messages(ScoreRequest.model_validate({"subtasks": SUBTASKS, "messages": HONEST}))
    assert (honest.n_hat, honest.c, honest.f1) == (2, 2, 1.0)
    mixed = ScoreRequest.model_validate(
        {"subtasks": SUBTASKS, "messages": HONEST, "mixed_tools": ["get_book_author"]}
    )
    assert score_messages(mixed).n_hat == 1


def test_cli_scores_each_valid_line_in_order_and_names_bad_ones(tmp_path: Path) -> None:
    good = {"subtasks": SUBTASKS, "messages": HONEST}
    half = {"subtasks": SUBTASKS, "messages": HONEST[:3]}
    lines = [
        json.dumps(good),
        "{truncated",
        json.dumps({"subtasks": [{"no": 1}], "messages": []}),
        "[]",
        json.dumps(half),
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = run_arena(["reward", "score", str(path)], arena_env(tmp_path / "home"), check=1)
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["line"] for r in rows] == [1, 5]
    assert rows[0] | {"line": 0} == {
        "line": 0,
        "f1": 1.0,
        "precision": 1.0,
        "recall": 1.0,
        "solved": 2,
        "calls": 2,
        "subtasks": 2,
    }
    assert rows[1]["f1"] == pytest.approx(2 / 3) and rows[1]["solved"] == 1
    assert f"{path}:2: not JSON" in out.stderr
    assert f"{path}:3: field subtasks.0.answer" in out.stderr
    assert f"{path}:4: expected a JSON object" in out.stderr
    assert "Traceback" not in out.stderr
    missing = run_arena(
        ["reward", "score", str(tmp_path / "nope.jsonl")], arena_env(tmp_path / "home"), check=2
    )
    assert "no such file" in missing.stderr


def test_cli_tau2_names_bad_lines_and_skips_qa_ones(tmp_path: Path) -> None:
    """`arena reward tau2` reads the trainer's rollouts file: QA lines are `arena reward score`'s,
    a tau2 line without its rollout or with a broken one is named with its line number."""
    lines = [
        json.dumps({"subtasks": SUBTASKS, "messages": HONEST}),
        "{truncated",
        json.dumps({"kind": "tau2", "reward": 1.0}),
        json.dumps({"kind": "tau2", "reward": 1.0, "tau2": {"sample_id": "vs-1"}}),
    ]
    path = tmp_path / "rollouts.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = run_arena(["reward", "tau2", str(path)], arena_env(tmp_path / "home"), check=1)
    assert out.stdout == ""
    assert f"{path}:2: not JSON" in out.stderr
    assert f"{path}:3: field tau2" in out.stderr
    assert f"{path}:4: field domain" in out.stderr
    assert "3 malformed line(s)" in out.stderr and "Traceback" not in out.stderr
    missing = run_arena(
        ["reward", "tau2", str(tmp_path / "nope.jsonl")], arena_env(tmp_path / "home"), check=2
    )
    assert "no such file" in missing.stderr


def test_rescoring_a_sandboxed_conversation() -> None:
    """The reference conversation, run in the real sandbox against a tool that echoes guesses in its
    errors, plus one guessing call: rescored offline, the guess solves nothing and costs precision."""
    package = library_package(code=ECHO_CODE)
    sample = sample_of(package)

    async def scenario(pool: SandboxPool) -> tuple[float, float]:
        env = QaEnvironment(sample, package, pool)
        try:
            messages, _outputs = await reference_conversation(sample, package, env)
            guess = await env.call("get_author_country", {"author_id": "Portugal"})
        finally:
            await env.close()
        messages = [
            *messages[:-1],
            {"role": "assistant", "content": "", "tool_calls": [call("g", "get_author_country")]},
        ]
        messages.append(tool("g", guess.text))
        jobs = sample.reward_spec["jobs"]
        request = ScoreRequest.model_validate({"subtasks": jobs, "messages": messages})
        offline = score_messages(request)
        return offline.f1, offline.precision

    f1, precision = sandboxed(scenario)
    # 2 sub-tasks solved by 2 honest calls; the echoed guess is a third call that solves nothing
    assert precision == pytest.approx(2 / 3) and f1 == pytest.approx(0.8)

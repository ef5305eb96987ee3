"""docs/add_a_stage.md, followed to the letter: a stage with one LLM role touches at most 4 files.

The walkthrough's blocks are applied to a copy of the repository (``<!-- file: PATH -->`` writes
a new file, ``<!-- insert-after: PATH: LINE -->`` inserts after that line); the copy then runs
the new stage on the embedded stack until drained, through the real CLI, and its records land
on the new topic. Nothing registers the stage, the role or the rule by hand.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli import ARENA, arena_env, broker_of, read_all, run_arena, stack_stopped_after

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "add_a_stage.md"
BLOCK = re.compile(r"<!-- (file|insert-after): (.+?) -->\n```(?:python|text)\n(.*?)```", re.S)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]


def copy_repository(dest: Path) -> None:
    """Tracked and new (not ignored) files, as a fresh clone plus this change would have them."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = ROOT / rel
        if source.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / rel)


def apply_walkthrough(repo: Path) -> list[str]:
    """Apply every block of the doc to ``repo``; the files it touched, in order."""
    touched: list[str] = []
    for kind, where, code in BLOCK.findall(DOC.read_text()):
        if kind == "file":
            path = repo / where
            assert not path.exists(), f"{where} exists already: the walkthrough must add it"
            path.write_text(code)
        else:
            rel, anchor = where.split(": ", 1)
            path = repo / rel
            text = path.read_text()
            at = text.index(anchor + "\n") + len(anchor) + 1
            path.write_text(text[:at] + code + text[at:])
            where = rel
        touched.append(where)
    return touched


def test_the_walkthrough_touches_four_files_and_its_stage_runs_until_drained(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    copy_repository(repo)
    touched = apply_walkthrough(repo)
    assert touched == [
        "arena/topics.py",
        "synthesis/sft/roles/terse.py",
        "streams/sft/tasks_terse.py",
        "simulator/terse.py",
    ]
    assert len(set(touched)) <= 4

    home = tmp_path / "home"
    env = arena_env(home, PYTHONPATH=str(repo))
    with stack_stopped_after(env):
        listed = subprocess.run(
            [ARENA, "topics", "list"], env=env, cwd=repo, capture_output=True, text=True, check=True
        ).stdout
        assert "tasks.terse" in listed and "tasks-terse" in listed
        # From the copy: `python -m app.run` (each worker) puts its cwd first on sys.path.
        run_arena(["publish", "tools", str(repo / "samples/tools/good/weather_openai.json")], env, cwd=repo)
        stages = ["tools-servers", "tasks-from-servers", "tasks-terse"]
        run_arena(
            ["worker", *[a for s in stages for a in ("--stage", s)], "--until-drained", "--timeout", "400"],
            env,
            timeout=480,
            cwd=repo,
        )
        bootstrap = broker_of(home)
        tasks = [json.loads(r.value) for r in read_all(bootstrap, "tasks")]
        terse = [json.loads(r.value) for r in read_all(bootstrap, "tasks.terse")]
    assert tasks, "the SFT stages made no task to shorten"
    assert {r["parent_task_id"] for r in terse} == {r["task_id"] for r in tasks}
    for record in terse:
        assert 1 <= len(record["text"].split()) <= 12, record["text"]

"""The README's short tour runs as written, and the README and docs/ link only to what exists.

The README is the front door (what Arena is, the two set-up commands, a short tour, links; at most
250 lines); the reference lives in docs/, with docs/README.md as its table of contents.

Every line of the fenced ``bash`` blocks under the README's "## A short tour" is one command:
blank lines, comments and ``source`` lines are skipped and a trailing ``# comment`` is dropped.
Each command runs through this virtualenv's ``arena`` script, in a fresh working folder, with the
environment of the shared demo home (tests/fixtures/demo.py: a finished, drained ``arena demo``),
and must exit 0 and print something. The tour therefore holds only ``arena`` commands that end on
their own and leave that home as it was: no publishing, no workers, no ``arena ui``, no ``arena
down`` (other tests read the same home). The longer tour, docs/tour.md, has the rest.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli import ARENA
from tests.fixtures.demo import Demo

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TOUR_HEADING = "## A short tour"
MAX_README_LINES = 250
SHELL_LANGUAGES = {"bash", "sh", "shell"}
COMMAND_TIMEOUT_S = 180  # each takes seconds; generous for a loaded 2-core machine


@dataclass(frozen=True)
class Command:
    line: str  # as written in the README
    argv: tuple[str, ...]  # without the trailing comment


def _outside_fences(text: str) -> list[tuple[str, str | None]]:
    """Each line with the language of the fenced block it lies in (None outside a block).

    Fence lines themselves are reported as outside a block.
    """
    lines: list[tuple[str, str | None]] = []
    language: str | None = None
    for line in text.splitlines():
        if line.startswith("```"):
            language = (line[3:].strip() or "text") if language is None else None
            lines.append((line, None))
        else:
            lines.append((line, language))
    return lines


def section(text: str, heading: str) -> list[tuple[str, str | None]]:
    """The lines under ``heading`` (a level-2 heading), up to the next level-2 heading."""
    lines = _outside_fences(text)
    starts = [i for i, (line, language) in enumerate(lines) if language is None and line == heading]
    assert len(starts) == 1, f"README.md needs exactly one {heading!r} heading, found {len(starts)}"
    body = []
    for line, language in lines[starts[0] + 1 :]:
        if language is None and line.startswith("## "):
            break
        body.append((line, language))
    return body


def tour_commands(text: str) -> list[Command]:
    """The commands of the tour's shell blocks; a line ending in a backslash continues."""
    commands: list[Command] = []
    pending = ""
    for line, language in section(text, TOUR_HEADING):
        if language not in SHELL_LANGUAGES:
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = pending + line, ""
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
        if not tokens or tokens[0] == "source":
            continue
        operators = [t for t in tokens if set(t) <= set(lexer.punctuation_chars)]
        assert not operators, f"the tour's commands run without a shell; {line!r} uses {operators}"
        assert tokens[0] == "arena", f"the tour runs `arena` commands only, not {line!r}"
        commands.append(Command(line.strip(), tuple(tokens)))
    return commands


TOUR = tour_commands(README.read_text())


def test_the_tour_has_commands() -> None:
    assert len(TOUR) >= 5, TOUR


@pytest.mark.parametrize("command", TOUR, ids=[" ".join(c.argv[1:])[:50] for c in TOUR])
def test_tour_command_runs_as_written(command: Command, demo_run: Demo, tmp_path: Path) -> None:
    proc = subprocess.run(
        [ARENA, *command.argv[1:]],
        cwd=tmp_path,
        env=demo_run.env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    said = f"{command.line}\nexit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, said
    assert proc.stdout.strip() or proc.stderr.strip(), f"printed nothing: {said}"


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move reference to docs/"


# --- links ----------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    for line, language in _outside_fences(path.read_text()):
        match = re.match(r"#{1,6} (.+)", line)
        if language is None and match:
            base = slug(match.group(1))
            anchor, n = base, 0
            while anchor in found:  # repeated headings get -1, -2, ...
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file, code blocks and code spans aside."""
    return [
        target
        for line, language in _outside_fences(path.read_text())
        if language is None
        for target in LINK.findall(CODE_SPAN.sub("", line))
    ]


MARKDOWN = [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("path", MARKDOWN, ids=[p.relative_to(ROOT).as_posix() for p in MARKDOWN])
def test_links_resolve(path: Path) -> None:
    broken = []
    for target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            broken.append(f"{target}: no {where}")
        elif anchor and (where.suffix != ".md" or anchor not in anchors(where)):
            broken.append(f"{target}: no heading #{anchor} in {where.name}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_reference_file_is_linked_from_the_readme_and_the_table_of_contents() -> None:
    files = {p for p in DOCS.glob("*.md") if p.name != "README.md"}
    assert files, "docs/ holds the reference"
    from_readme = {(ROOT / t.partition("#")[0]).resolve() for t in links(README)}
    from_toc = {(DOCS / t.partition("#")[0]).resolve() for t in links(DOCS / "README.md")}
    assert DOCS / "README.md" in from_readme, "the README links the table of contents"
    assert not files - from_readme, sorted(p.name for p in files - from_readme)
    assert not files - from_toc, sorted(p.name for p in files - from_toc)

"""`arena reward score FILE.jsonl`: rescore trajectories offline with the trainer's F1 reward."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
from pydantic import ValidationError

from app.cli_common import UserError, err

reward_app = typer.Typer(no_args_is_help=True, help="The F1 reward of tool-use trajectories.")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each non-blank line; ``-`` reads standard input."""
    stream: TextIO = sys.stdin if str(path) == "-" else path.open(encoding="utf-8", errors="replace")
    try:
        for number, text in enumerate(stream, start=1):
            if text.strip():
                yield number, text
    finally:
        if stream is not sys.stdin:
            stream.close()


def _problem(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "the line"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field {where}: {first['msg']}{more}"


def score_line(text: str) -> dict[str, Any]:
    """The reward of one input line; raises ``ValueError`` naming what is wrong with it."""
    from environments.rewards import ScoreRequest, score_messages

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    try:
        request = ScoreRequest.model_validate(value)
    except ValidationError as exc:
        raise ValueError(_problem(exc)) from None
    parts = score_messages(request)
    return {
        "f1": parts.f1,
        "precision": parts.precision,
        "recall": parts.recall,
        "solved": parts.n_hat,
        "calls": parts.c,
        "subtasks": parts.n,
    }


@reward_app.command("score")
def score(
    path: Annotated[
        Path,
        typer.Argument(
            help="JSONL, one trajectory per line: {'subtasks': [{'answer': ...}], 'messages': [...], "
            "'mixed_tools': [...]} ('-' reads standard input).",
        ),
    ],
) -> None:
    """Print one JSON line per trajectory (f1, precision, recall, solved, calls), in input order.

    A tool message with "error": true, or whose content is a JSON object with an "error", is a failed
    call. A malformed line is reported on stderr with its line number; the others are still scored.
    """
    if str(path) != "-" and not path.is_file():
        raise UserError(f"no such file: {path} (fix: give a JSONL file, or - for standard input)")
    bad = 0
    for number, text in _lines(path):
        try:
            result = score_line(text)
        except ValueError as exc:
            bad += 1
            err.print(f"[red]error[/red] {path}:{number}: {exc}", markup=True, highlight=False)
            continue
        sys.stdout.write(json.dumps({"line": number, **result}) + "\n")
    sys.stdout.flush()
    if bad:
        err.print(f"{bad} malformed line(s) skipped (fix: each line needs 'subtasks' and 'messages')")
        raise typer.Exit(1)

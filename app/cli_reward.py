"""`arena reward score FILE.jsonl`: rescore trajectories offline with the trainer's F1 reward;
`arena reward tau2 FILE.jsonl`: rescore the trainer's tau2 rollouts with tau2's own evaluator."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TextIO, TypeVar

import typer
from pydantic import ValidationError

from app.cli_common import UserError, err

reward_app = typer.Typer(
    no_args_is_help=True, help="Rescore trajectories: the F1 reward, or tau2's evaluator on tau2 rollouts."
)


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


T = TypeVar("T")


def _parsed(path: Path, parse: Callable[[str], T], what: str) -> tuple[list[tuple[int, T]], int]:
    """Each non-blank line of ``path`` parsed, with its number, and how many lines were malformed
    (each reported on stderr with its number: ``parse`` raises ``ValueError`` saying why)."""
    if str(path) != "-" and not path.is_file():
        raise UserError(f"no such file: {path} (fix: give {what}, or - for standard input)")
    good: list[tuple[int, T]] = []
    bad = 0
    for number, text in _lines(path):
        try:
            good.append((number, parse(text)))
        except ValueError as exc:
            bad += 1
            err.print(f"[red]error[/red] {path}:{number}: {exc}", markup=True, highlight=False)
    return good, bad


def _problem(exc: ValidationError) -> str:
    first = exc.errors(include_url=False)[0]
    where = ".".join(str(p) for p in first["loc"]) or "the line"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"field {where}: {first['msg']}{more}"


def _json_object(text: str) -> dict[str, Any]:
    """One line as a JSON object; ``ValueError`` saying why it is not one."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {type(value).__name__}")
    return value


def score_line(text: str) -> dict[str, Any]:
    """The reward of one input line; raises ``ValueError`` naming what is wrong with it."""
    from environments.rewards import ScoreRequest, score_messages

    value = _json_object(text)
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
    scored, bad = _parsed(path, score_line, "a JSONL file")
    for number, result in scored:
        sys.stdout.write(json.dumps({"line": number, **result}) + "\n")
    sys.stdout.flush()
    if bad:
        err.print(f"{bad} malformed line(s) skipped (fix: each line needs 'subtasks' and 'messages')")
        raise typer.Exit(1)


def tau2_rollout(text: str) -> tuple[Any, float] | None:
    """(the ``Tau2Rollout``, the reward the trainer recorded) of one rollout line, None for a line of
    another kind (QA: ``arena reward score``); raises ``ValueError`` naming what is wrong with it."""
    from environments.tau2_environment import Tau2Rollout

    value = _json_object(text)
    if value.get("kind") != "tau2":
        return None
    if not isinstance(value.get("tau2"), dict):
        raise ValueError("field tau2: the trainer's tau2 lines carry the rollout as a 'tau2' object")
    try:
        return Tau2Rollout.model_validate(value["tau2"]), float(value.get("reward", 0.0))
    except ValidationError as exc:
        raise ValueError(_problem(exc)) from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"field reward: {exc}") from None


@reward_app.command("tau2")
def tau2(
    path: Annotated[
        Path,
        typer.Argument(
            help="A trainer run's rollouts file (trainer/<run>/rollouts/step-N.jsonl from the lake), or "
            "any JSONL of its tau2 lines ('-' reads standard input).",
        ),
    ],
) -> None:
    """Rescore tau2 rollouts with tau2's own evaluator, on the databases they ran on (from the lake).

    Prints one JSON line per tau2 rollout: the reward the trainer recorded, tau2's, and whether they
    agree; then a summary on stderr. Lines of other kinds are skipped; a malformed one is reported.
    """
    import asyncio

    from app.cli_common import settings

    lines, bad = _parsed(path, tau2_rollout, "a rollouts JSONL file")
    rollouts = [(number, *found) for number, found in lines if found is not None]
    cfg = settings()

    async def go() -> list[dict[str, Any]]:
        from environments.tau2_env import Tau2Session, tau2_pool
        from environments.tau2_environment import load_spec_databases, rescore
        from lake.store import open_store

        store = open_store(cfg)
        out: list[dict[str, Any]] = []
        by_db: dict[tuple[str, str], list[tuple[int, Any, float]]] = {}
        for item in rollouts:
            by_db.setdefault((item[1].domain, item[1].db.sha256), []).append(item)
        if not by_db:  # no tau2 rollout in the file: nothing to import tau2 for
            return out
        domains = sorted({domain for domain, _ in by_db})
        async with tau2_pool(cfg.sandbox, *domains, pool_size=1) as pool:
            for items in by_db.values():
                try:
                    databases = load_spec_databases(store, items[0][1])
                except (FileNotFoundError, ValueError) as exc:
                    raise UserError(
                        f"{path}: the {items[0][1].domain} database of line {items[0][0]} is not in this "
                        f"lake ({exc}) (fix: point ARENA_HOME or ARENA_LAKE at the run's lake)"
                    ) from None
                async with Tau2Session(pool, items[0][1].domain, *databases) as session:
                    for number, rollout, recorded in items:
                        theirs = await rescore(session, rollout)
                        out.append(
                            {
                                "line": number,
                                "sample_id": rollout.sample_id,
                                "reward": recorded,
                                "tau2": theirs,
                                "agree": theirs == recorded,
                            }
                        )
        return sorted(out, key=lambda r: r["line"])

    from environments.tau2_env import Tau2Unavailable
    from sandbox.pool import SandboxUnavailable

    try:
        results = asyncio.run(go()) if rollouts else []
    except (Tau2Unavailable, SandboxUnavailable) as exc:
        raise UserError(str(exc)) from None
    for result in results:
        sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    agree = sum(r["agree"] for r in results)
    err.print(
        f"{agree} of {len(results)} tau2 rollouts: tau2's evaluator gives the reward the trainer recorded"
    )
    if bad:
        err.print(f"{bad} malformed line(s) skipped")
    if bad or agree < len(results):
        raise typer.Exit(1)

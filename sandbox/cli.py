"""`arena sandbox run FILE`: execute a Python file in the sandbox and print the result as JSON."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from sandbox.pool import SandboxUnavailable, run_once

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Run untrusted Python in the isolated sandbox.",
)


@app.callback()
def _group() -> None:
    """Run untrusted Python in the isolated sandbox."""


def _fail(message: str) -> typer.Exit:
    """A user-fixable problem: one line on stderr, exit 2, no traceback."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


@app.command()
def run(
    file: Annotated[
        Path, typer.Argument(help="Python file to execute; its trailing expression is the return value.")
    ],
    timeout: Annotated[float | None, typer.Option("--timeout", help="Wall-clock limit (seconds).")] = None,
    memory_mb: Annotated[int | None, typer.Option("--memory-mb", help="Address-space cap (MiB).")] = None,
) -> None:
    """Run FILE in a fresh sandbox; prints the SandboxResult JSON (exit 0 when ok, 1 otherwise)."""
    from arena.config import ArenaSettings

    try:
        code = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _fail(f"{file}: no such file (fix: pass the path of a Python file)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"{file}: cannot read it as UTF-8 text ({exc.__class__.__name__})") from None
    if (timeout is not None and timeout <= 0) or (memory_mb is not None and memory_mb < 16):
        raise _fail("--timeout must be > 0 and --memory-mb at least 16")
    try:
        settings = ArenaSettings().sandbox
    except ValidationError as exc:  # a bad ARENA_* variable or settings file: say which, no traceback
        raise _fail(
            "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors(include_url=False))
        ) from None
    try:
        result = asyncio.run(run_once(code, settings, timeout_s=timeout, memory_mb=memory_mb))
    except SandboxUnavailable as exc:
        raise _fail(str(exc)) from None
    sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    raise typer.Exit(0 if result.ok else 1)


if __name__ == "__main__":
    app()

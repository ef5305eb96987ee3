"""What every `arena` command shares: the consoles, user errors, settings and the broker.

User mistakes (a missing file, a bad setting, bad SQL) raise ``UserError``: `arena` prints one
clear message naming what and how to fix it, and exits 2 without a traceback.
"""

from __future__ import annotations

from pydantic import ValidationError
from rich.console import Console

from arena.config import ArenaSettings

console = Console()
err = Console(stderr=True)


class UserError(Exception):
    """A mistake the user can fix; printed without a traceback."""


def settings() -> ArenaSettings:
    try:
        return ArenaSettings()
    except ValidationError as exc:
        problems = "; ".join(
            f"ARENA_{'_'.join(str(p) for p in e['loc']).upper() or 'CONFIG'}: {e['msg']}"
            for e in exc.errors()
        )
        raise UserError(f"invalid configuration (environment or arena.toml): {problems}") from None


def broker(cfg: ArenaSettings) -> str:
    """The bootstrap address; starts the embedded stack if needed and says so."""
    from app.stack import StackNotRunning, resolve_broker

    try:
        address, started = resolve_broker(cfg, start=True)
    except StackNotRunning as exc:
        raise UserError(str(exc)) from None
    if started:
        err.print(f"[cyan]started the embedded stack[/cyan] (broker {address}); `arena down` stops it")
    return address


def ready_broker(cfg: ArenaSettings) -> str:
    """A broker with every topic created with its declared partition count."""
    from streams.admin import ensure_topics

    address = broker(cfg)
    ensure_topics(address)
    return address

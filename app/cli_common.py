"""What every `arena` command shares: the consoles, user errors, settings and the broker.

User mistakes (a missing file, a bad setting, bad SQL) raise ``UserError``: `arena` prints one
clear message naming what and how to fix it, and exits 2 without a traceback.
"""

from __future__ import annotations

import os
import re

from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console

from arena.config import ArenaSettings, unparsable_env_vars

console = Console()
err = Console(stderr=True)


INVALID_SETTINGS = "invalid configuration (ARENA_* environment variables or the settings file):\n"


class UserError(Exception):
    """A mistake the user can fix; printed without a traceback."""


def settings() -> ArenaSettings:
    """The settings from the environment and the settings file; a bad one is a ``UserError``."""
    try:
        return ArenaSettings()
    except ValidationError as exc:
        raise UserError(settings_problems(exc)) from None
    except SettingsError as exc:  # a list or mapping setting whose value is not JSON
        raise UserError(settings_parse_problem(exc)) from None


def settings_problems(exc: ValidationError) -> str:
    """One line per problem, each naming its variable (``ARENA_SFT__WALKS``) or file key."""
    lines = []
    for error in exc.errors(include_url=False):
        msg = str(error["msg"]).removeprefix("Value error, ")
        loc = [str(p) for p in error["loc"]]
        if msg.startswith("ARENA_") or error["type"] in ("unknown_setting", "invalid_setting"):
            lines.append(f"  {msg}")  # names its key already
            continue
        name = f"ARENA_{loc[0].upper()}" + "".join(f"__{p.upper()}" for p in loc[1:2]) if loc else "ARENA_*"
        rest = f" (at {'.'.join(loc[2:])})" if len(loc) > 2 else ""
        lines.append(f"  {name}{rest}: {msg}")
    return INVALID_SETTINGS + "\n".join(lines)


def settings_parse_problem(exc: SettingsError) -> str:
    """The variables whose value could not be parsed (pydantic-settings names only the field or
    section), and the fix."""
    found = re.search(r'field "([a-z_]+)"', str(exc))
    name = found.group(1) if found else ""
    names = unparsable_env_vars(os.environ) or [f"ARENA_{name.upper()}" if name else "ARENA_*"]
    return (
        INVALID_SETTINGS
        + f"  {', '.join(names)}: the value could not be parsed; list and mapping settings take JSON, "
        """e.g. '["get_order_status"]' or '{"trajectories": 64}'"""
    )


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


def known_version(cfg: ArenaSettings, name: str) -> str:
    """``name`` when it is ``main`` or a data version in the catalog; a ``UserError`` naming the
    known ones otherwise."""
    from app.versions import data_versions

    if name == "main":
        return name
    known = [spec.name for spec in data_versions(cfg)]
    if name not in known:
        listed = ", ".join(["main", *known])
        raise UserError(f"no data version {name!r} (fix: one of {listed}; `arena data-versions list`)")
    return name

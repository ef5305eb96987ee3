"""What every `arena` command shares: the consoles, user errors, settings and the broker.

User mistakes (a missing file, a bad setting, bad SQL) raise ``UserError``: `arena` prints one
clear message naming what and how to fix it, and exits 2 without a traceback.
"""

from __future__ import annotations

import json
import os
import re
from typing import get_origin

from pydantic import ValidationError
from pydantic_settings import SettingsError
from rich.console import Console

from arena.config import ArenaSettings, Section

console = Console()
err = Console(stderr=True)


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
    return "invalid configuration (ARENA_* environment variables or the settings file):\n" + "\n".join(lines)


def settings_parse_problem(exc: SettingsError) -> str:
    """The variables whose value could not be parsed (pydantic-settings names only the field or
    section), and the fix."""
    found = re.search(r'field "([a-z_]+)"', str(exc))
    name = found.group(1) if found else ""
    names = _not_json(name) or [f"ARENA_{name.upper()}" if name else "ARENA_*"]
    return (
        "invalid configuration (ARENA_* environment variables or the settings file):\n"
        f"  {', '.join(names)}: the value could not be parsed; list and mapping settings take JSON, "
        """e.g. '["get_order_status"]' or '{"trajectories": 64}'"""
    )


def _not_json(name: str) -> list[str]:
    """The set variables of field ``name`` (or of its section's fields) that take JSON but hold none."""
    field = ArenaSettings.model_fields.get(name)
    if field is None:
        return []
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, Section):
        wanted = {f"ARENA_{name}__{sub}".upper(): f.annotation for sub, f in annotation.model_fields.items()}
    else:
        wanted = {f"ARENA_{name}".upper(): annotation}
    bad = []
    for var, value in os.environ.items():
        kind = wanted.get(var.upper())
        if get_origin(kind) in (list, dict) or kind in (list, dict):
            try:
                json.loads(value)
            except ValueError:
                bad.append(var)
    return sorted(bad)


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

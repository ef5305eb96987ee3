"""Every role by name: how a server in front of a backend (``arena llm serve``) knows what it is asked.

Arena's ``openai://`` client names the role in ``response_format.json_schema.name`` and sends the
role's input as JSON inside its prompt template (``Role.messages``); with this registry and
``Role.inputs_from`` a server recovers the typed input, so a backend that needs it (the ``rules``
simulator) can answer over HTTP exactly as it answers in process.

Roles live with what uses them: the roles several tracks share here in ``arena.llm.roles``, a
track's own in ``synthesis/<track>/``. The kernel imports no track: the packages to search are
the entry points of ``arena.roles`` (pyproject.toml), so a package outside Arena adds roles the
same way.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from arena.llm.core import Role
from arena.plugins import instances, packages_of

ROLE_PACKAGES = "arena.roles"
"""Entry-point group: each entry names a package whose module-level ``Role`` objects are roles."""


@cache
def roles() -> dict[str, Role[Any, Any]]:
    """Role name -> role (its input and output models and its prompt template)."""
    found: dict[str, Role[Any, Any]] = {}
    for package in packages_of(ROLE_PACKAGES):
        for role in instances(package, Role):
            other = found.setdefault(role.name, role)
            if other is not role:
                raise ValueError(f"two roles are named {role.name!r}: role names must be unique")
    return found

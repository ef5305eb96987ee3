"""Parts that register themselves by where they live: module-level instances found in a package.

A track is a folder: a stage module in ``streams/<track>/`` holds its ``StageDef``, a role
module in ``synthesis/<track>/`` its ``Role``, a rule module of the simulator its ``RULES``.
Nothing lists them by hand; ``instances`` walks a package's modules (recursively, in name
order) and returns the module-level objects of one type. Packages outside Arena take part
through entry points (``packages_of``), as LLM backends do.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from importlib.metadata import entry_points
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")


def modules(package: ModuleType) -> Iterator[ModuleType]:
    """``package`` and every module under it, imported, in name order (a folder after its modules)."""
    yield package
    path = getattr(package, "__path__", None)
    if path is None:
        return
    for info in sorted(pkgutil.iter_modules(path), key=lambda i: i.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        if info.ispkg:
            yield from modules(module)
        else:
            yield module


def instances(package: ModuleType, kind: type[T]) -> list[T]:
    """Module-level objects of type ``kind`` defined under ``package``, each once, in module order.

    An object a module only imports from another module counts where it is defined (by
    identity), so a re-export does not register it twice.
    """
    seen: set[int] = set()
    found: list[T] = []
    for module in modules(package):
        for value in vars(module).values():
            if isinstance(value, kind) and id(value) not in seen:
                seen.add(id(value))
                found.append(value)
    return found


def packages_of(group: str) -> list[ModuleType]:
    """The packages the entry points of ``group`` name (``name = "package"``), by entry-point name."""
    return [ep.load() for ep in sorted(entry_points(group=group), key=lambda ep: ep.name)]

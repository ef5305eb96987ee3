"""Byte-code for what Arena's processes import (scripts/compile.sh runs it once per install).

The install leaves the virtualenv's 20,000 files uncompiled (compiling them all was most of the
install's CPU); with PYTHONDONTWRITEBYTECODE set, every process would then compile whatever it
imports again. So this imports every module of Arena's packages, and every module they import
anywhere (function bodies too: the lazy imports of transformers' model classes, the MCP SDK,
LanceDB), with byte-code writing on: what is imported gets compiled, once. An import that fails
here (an optional extra, a GPU-only package) is skipped: it fails the same way at run time.
"""

from __future__ import annotations

import ast
import importlib
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (
    "app",
    "arena",
    "bench",
    "consumers",
    "environments",
    "lake",
    "producers",
    "sandbox",
    "samples",
    "simulator",
    "streams",
    "synthesis",
    "trainer",
)


def arena_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def imported_by(module: str) -> set[tuple[str, str]]:
    """(module, name) for every absolute import in ``module``'s source, at any depth of its code
    (name empty for ``import X``)."""
    path = ROOT / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found.update((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update((node.module, alias.name) for alias in node.names)
    return found


def load(module: str, name: str) -> None:
    """What ``from module import name`` loads: a submodule, or an attribute (transformers and
    others load a class's module on first access)."""
    loaded = importlib.import_module(module)
    if name and name != "*" and not hasattr(loaded, name):
        importlib.import_module(f"{module}.{name}")


def main() -> int:
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: nothing would be written", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    own = arena_modules()
    wanted = {(module, "") for module in own}
    for module in own:
        wanted |= imported_by(module)
    warnings.simplefilter("ignore")
    for module, name in sorted(wanted):
        try:
            load(module, name)
        except (Exception, SystemExit):  # an optional extra, a GPU-only package, a module that exits
            continue
    print(f"byte-code for {len(sys.modules)} modules", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

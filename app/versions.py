"""Running data versions: which exist, and the environment a version's workers run in.

A version's workers (``app.registry.version_workers``) are ordinary stage workers reading and
writing the version's topics; what makes their outputs differ from the parent's is the
environment built here from the version's spec: its setting overrides (``ARENA_*`` values) and
its prompt overrides (files under ``$ARENA_HOME/versions/<name>/prompts/``, named by
``ARENA_LLM_PROMPT_FILES``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from arena.config import ArenaSettings
from arena.versions import VersionSpec
from lake.catalog import Catalog


def data_versions(settings: ArenaSettings) -> list[VersionSpec]:
    """Every data version the catalog holds (main excluded), oldest first."""
    catalog = Catalog(settings.catalog)
    try:
        return catalog.data_versions()
    finally:
        catalog.dispose()


def data_version(settings: ArenaSettings, name: str) -> VersionSpec | None:
    catalog = Catalog(settings.catalog)
    try:
        return catalog.data_version(name)
    finally:
        catalog.dispose()


def version_folder(home: Path, name: str) -> Path:
    return Path(home) / "versions" / name


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def version_env(spec: VersionSpec, home: Path) -> dict[str, str]:
    """The environment values a worker of ``spec`` adds to its own: setting and prompt overrides."""
    env = dict(spec.settings)
    if spec.prompts:
        folder = version_folder(home, spec.name) / "prompts"
        files: dict[str, str] = {}
        for role, text in sorted(spec.prompts.items()):
            path = folder / f"{role}.txt"
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                _write_atomic(path, text)
            files[role] = str(path)
        env["ARENA_LLM_PROMPT_FILES"] = json.dumps(files)
    return env

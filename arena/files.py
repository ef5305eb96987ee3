"""Atomic file writes (a temp file in the target's folder, then a rename, so a crash never leaves a
torn file and a reader sees the old file or the new one), and scratch folders a crash does not leak."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: Path, write: Callable[[BinaryIO], object], *, mode: int = 0o644) -> Path:
    """Write ``path`` through ``write(file)``, atomically; the file gets ``mode`` (mkstemp's is 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


SCRATCH = "tmp"
"""Folder under ``$ARENA_HOME`` of the trainer's and the evaluator's temporary model copies."""


def scratch_dir(home: Path, kind: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder under ``$ARENA_HOME/tmp`` named ``KIND-HOST-PID-...``.

    A process killed by SIGKILL cannot remove its folder, and a model copy is the model's size:
    making one here first removes every folder this host's processes left behind when they died
    (folders of other hosts sharing the home, and of live processes, are kept).
    """
    root = home / SCRATCH
    root.mkdir(parents=True, exist_ok=True)
    host = _host()
    for folder in root.iterdir():
        owner = folder.name.split("-")
        if len(owner) >= 3 and owner[1] == host and owner[2].isdigit() and not _alive(int(owner[2])):
            shutil.rmtree(folder, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=f"{kind}-{host}-{os.getpid()}-", dir=root)


def _host() -> str:
    return socket.gethostname().replace("-", "_") or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True

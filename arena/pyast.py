"""``ast.parse`` and ``ast.literal_eval`` that are safe to call from several threads at once.

CPython 3.11 (up to at least 3.11.7, the interpreter CI runs) keeps the AST converter's recursion
depth in per-interpreter state, so two threads building Python AST objects at once can fail with
``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905). Stage handlers parse
generated code in worker threads (``asyncio.to_thread``), so every parse in Arena goes through one
lock. ``compile(source, name, "exec")`` builds no Python AST objects and needs no lock.
"""

from __future__ import annotations

import ast
import threading
from typing import Any, Literal

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>", mode: Literal["exec", "eval"] = "exec") -> Any:
    """``ast.parse(source, filename, mode)`` under the process-wide lock."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)


def literal_eval(text: str) -> Any:
    """``ast.literal_eval(text)``, its parse under the lock (the evaluation builds no AST)."""
    return ast.literal_eval(parse(text.lstrip(" \t"), mode="eval"))

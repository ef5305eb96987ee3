"""Isolated execution of generated code and the environment runtime (ASTRA §2.2).

``SandboxPool`` runs untrusted Python as unprivileged uids in their own namespaces (no network,
read-only filesystem except a private job dir) under CPU, memory, process, file-size and output
limits: ``open_session`` gives an environment instance one process for its whole episode
(``Session.run`` / ``call`` / ``read``), ``run`` one program; ``run_once`` is the CLI's one-off form.
"""

from sandbox.pool import Preload, SandboxPool, SandboxResult, SandboxUnavailable, Session, run_once

__all__ = ["Preload", "SandboxPool", "SandboxResult", "SandboxUnavailable", "Session", "run_once"]

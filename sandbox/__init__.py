"""Isolated execution of generated code and the environment runtime (ASTRA §2.2).

``SandboxPool`` runs untrusted Python as an unprivileged uid in fresh namespaces (no network,
read-only filesystem except a private job dir) under CPU, memory, process, file-size and
output limits; ``run_once`` is the one-off form the CLI uses.
"""

from sandbox.pool import SandboxPool, SandboxResult, SandboxUnavailable, run_once

__all__ = ["SandboxPool", "SandboxResult", "SandboxUnavailable", "run_once"]

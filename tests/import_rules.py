"""The import rules of Arena's layout, and a checker over ``ast`` that enforces them.

Layers, top to bottom (a package may import only packages in layers below its own)::

    app                                  CLI, demo, worker runner and registry, embedded stack
    trainer | producers | consumers      training service; publishers; sinks, lag, exports
    streams | simulator                  Faust runtime + one thin module per stage (<track>/); the ``rules`` backend
    synthesis                            what each track computes, free of Kafka (<track>/, roles included)
    environments                         environment runtime, F1 reward, rendering, user view
    lake | sandbox | samples             artifact lake and catalog; isolated execution; bundled sample data
    arena                                kernel: config, topics, records, hashing, metrics, LLM gateway

Packages that share a layer do not import each other. ``simulator`` is reached only through the
``arena.llm_backends`` entry points (pyproject.toml), so no package imports it. There are no
import cycles, between packages or between modules. No kernel module serves one track alone
(its importers, the simulator aside, are not all in ``synthesis.<t>``/``streams.<t>`` of one ``t``),
and every module of a ``streams/<track>/`` folder defines a stage.

What counts as an import: every ``import``/``from ... import`` statement anywhere in a module
(inside functions too), relative imports resolved, and ``importlib.import_module("x.y")`` /
``__import__("x")`` with a literal name. Imports under ``if TYPE_CHECKING:`` do not count.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LAYERS: tuple[tuple[str, ...], ...] = (
    ("app",),
    ("trainer", "producers", "consumers"),
    ("streams", "simulator"),
    ("synthesis",),
    ("environments",),
    ("lake", "sandbox", "samples"),
    ("arena",),
)
"""Arena's layers, top to bottom; packages in one tuple are siblings."""

ENTRY_POINT_ONLY: tuple[str, ...] = ("simulator",)
"""Packages no other package imports (loaded through entry points)."""


@dataclass(frozen=True)
class Contracts:
    """The rules a tree must follow."""

    layers: tuple[tuple[str, ...], ...] = LAYERS
    entry_point_only: tuple[str, ...] = ENTRY_POINT_ONLY
    unchecked: tuple[str, ...] = ("tests", "bench")
    """Packages outside the layout (they may import any layer)."""
    kernel: str = "arena"
    """The kernel: no module of it may serve one track alone (``single-track-kernel``)."""
    track_packages: tuple[str, ...] = ("synthesis", "streams")
    """Packages split into one folder per track (``<package>.<track>``)."""
    neutral: tuple[str, ...] = ("simulator",)
    """Importers that do not make a kernel module shared (the simulator answers for every track)."""
    stage_package: str = "streams"
    """Its track folders hold stage modules only: each defines a module-level ``StageDef(...)``."""


@dataclass(frozen=True, order=True)
class Violation:
    """One broken rule: who imports what, where, and which rule it breaks."""

    kind: str
    """upward, sibling, entry-point-only, unplaced-package, package-cycle, module-cycle,
    single-track-kernel or stageless-stage-module."""
    importer: str
    imported: str
    where: str = ""
    """``path:line`` of the import (empty for cycles, which name their members in ``imported``)."""

    def __str__(self) -> str:
        at = f" ({self.where})" if self.where else ""
        return f"{self.kind}: {self.importer} -> {self.imported}{at}"


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: dict[str, int] = field(default_factory=dict)
    """First-party module imported -> first line that imports it."""


def first_party_packages(root: Path) -> list[str]:
    """Top-level folders of ``root`` that are Python packages (have ``__init__.py``)."""
    return sorted(p.name for p in root.iterdir() if (p / "__init__.py").is_file())


def discover(root: Path, packages: Sequence[str]) -> dict[str, Module]:
    """Every module of ``packages`` under ``root``, by dotted name."""
    modules: dict[str, Module] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            name = ".".join(parts)
            modules[name] = Module(name, path, is_package)
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, skipping the bodies of ``if TYPE_CHECKING:`` (their ``else`` still counts)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _literal_import(node: ast.Call) -> str | None:
    """The module of ``importlib.import_module("x")`` or ``__import__("x")`` with a literal name."""
    func = node.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__")
    )
    if named and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def _imported_names(module: Module, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        # ``from a import b`` names module ``a.b`` when there is one, else a name in ``a``
        base = _absolute(module, node)
        return [f"{base}.{alias.name}" for alias in node.names]
    if isinstance(node, ast.Call):
        name = _literal_import(node)
        return [name] if name else []
    return []


def _known(name: str, modules: Mapping[str, Module]) -> str | None:
    """The longest first-party module that ``name`` is, or lies in (``a.b.C`` -> ``a.b``)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def read_imports(modules: dict[str, Module]) -> None:
    """Fill ``Module.imports`` from each module's source."""
    for module in modules.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
        for node in _statements(tree):
            for raw in _imported_names(module, node):
                target = _known(raw, modules)
                if target is not None and target != module.name:
                    module.imports.setdefault(target, getattr(node, "lineno", 0))


def strongly_connected(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Components of more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def track_of(module: str, contracts: Contracts) -> str | None:
    """``synthesis.sft.x`` -> ``sft``; ``None`` for a module outside the track folders."""
    parts = module.split(".")
    if parts[0] in contracts.track_packages and len(parts) > 2:
        return parts[1]
    return None


def _defines_stage(path: Path) -> bool:
    """A module-level ``NAME = StageDef(...)`` (annotated or not)."""
    for node in ast.parse(path.read_text()).body:
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "StageDef":
            return True
    return False


def track_violations(root: Path, modules: Mapping[str, Module], contracts: Contracts) -> list[Violation]:
    """Kernel modules that serve one track alone, and modules of a stage folder that hold no stage."""
    importers: dict[str, set[str]] = {}
    for module in modules.values():
        for target in module.imports:
            importers.setdefault(target, set()).add(module.name)
    found: list[Violation] = []
    for name, module in sorted(modules.items()):
        top = name.split(".")[0]
        if top == contracts.kernel and not module.is_package:
            users = {u for u in importers.get(name, set()) if u.split(".")[0] not in contracts.neutral}
            tracks = {track_of(u, contracts) for u in users}
            if len(tracks) == 1 and None not in tracks:
                where = str(module.path.relative_to(root))
                found.append(Violation("single-track-kernel", name, f"only {tracks.pop()} uses it", where))
        parts = name.split(".")
        if top == contracts.stage_package and len(parts) > 2 and not module.is_package:
            if not _defines_stage(module.path):
                where = str(module.path.relative_to(root))
                found.append(Violation("stageless-stage-module", name, "defines no StageDef", where))
    return found


def check(root: Path, contracts: Contracts = Contracts()) -> list[Violation]:
    """Every violation of ``contracts`` by the first-party packages under ``root``."""
    packages = [p for p in first_party_packages(root) if p not in contracts.unchecked]
    layer_of = {pkg: n for n, layer in enumerate(contracts.layers) for pkg in layer}
    violations = [
        Violation("unplaced-package", pkg, "", "add it to a layer of tests/import_rules.py")
        for pkg in packages
        if pkg not in layer_of
    ]
    modules = discover(root, [p for p in packages if p in layer_of])
    read_imports(modules)
    package_graph: dict[str, set[str]] = {}
    for module in modules.values():
        importer_pkg = module.name.split(".")[0]
        for target, line in sorted(module.imports.items()):
            target_pkg = target.split(".")[0]
            if target_pkg == importer_pkg:
                continue
            package_graph.setdefault(importer_pkg, set()).add(target_pkg)
            where = f"{module.path.relative_to(root)}:{line}"
            if target_pkg in contracts.entry_point_only:
                violations.append(Violation("entry-point-only", module.name, target, where))
            elif layer_of[target_pkg] < layer_of[importer_pkg]:
                violations.append(Violation("upward", module.name, target, where))
            elif layer_of[target_pkg] == layer_of[importer_pkg]:
                violations.append(Violation("sibling", module.name, target, where))
    violations += track_violations(root, modules, contracts)
    for cycle in strongly_connected(package_graph):
        violations.append(Violation("package-cycle", cycle[0], " -> ".join(cycle)))
    module_graph = {m.name: set(m.imports) for m in modules.values()}
    for cycle in strongly_connected(module_graph):
        violations.append(Violation("module-cycle", cycle[0], " <-> ".join(cycle)))
    return sorted(violations)


if __name__ == "__main__":
    import sys

    found = check(Path(__file__).resolve().parents[1])
    for violation in found:
        print(violation)
    print(f"{len(found)} import rule violation(s)")
    sys.exit(1 if found else 0)

"""The layout's import rules hold for the repository, and the checker does fail on each kind of break."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tests.import_rules import LAYERS, Contracts, check

ROOT = Path(__file__).resolve().parents[1]

SMALL = Contracts(
    layers=(("app",), ("stage", "other"), ("plugin",), ("kernel",)), entry_point_only=("plugin",)
)


def tree(root: Path, files: dict[str, str]) -> Path:
    """A package tree under ``root``: every folder of a file gets an ``__init__.py``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in path.relative_to(root).parents:
            if str(folder) != ".":
                (root / folder / "__init__.py").touch()
        path.write_text(textwrap.dedent(text))
    for package in ("app", "stage", "other", "plugin", "kernel"):
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()
    return root


def kinds(root: Path) -> list[tuple[str, str, str]]:
    return [(v.kind, v.importer, v.imported) for v in check(root, SMALL)]


def test_the_repository_follows_its_layers() -> None:
    violations = check(ROOT)
    assert not violations, "\n".join(str(v) for v in violations)


def test_every_package_of_the_repository_has_a_layer() -> None:
    placed = {pkg for layer in LAYERS for pkg in layer}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()} - {"tests", "bench"}
    assert packages <= placed


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "app/cli.py": "from stage.run import go\nimport kernel.config\n",
            "stage/run.py": "from kernel.config import X\n",
            "kernel/config.py": "X = 1\n",
        },
    )
    assert kinds(tmp_path) == []


def test_an_upward_import_fails_even_inside_a_function(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "kernel/config.py": "def f():\n    from app.cli import main\n    return main\n",
            "app/cli.py": "def main(): ...\n",
        },
    )
    assert kinds(tmp_path) == [("upward", "kernel.config", "app.cli")]
    assert check(tmp_path, SMALL)[0].where == "kernel/config.py:2"


def test_relative_and_dynamic_imports_count(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "stage/sub/a.py": "from ...app import cli\n",
            "stage/b.py": "import importlib\nmod = importlib.import_module('app.cli')\n",
            "app/cli.py": "",
        },
    )
    assert kinds(tmp_path) == [("upward", "stage.b", "app.cli"), ("upward", "stage.sub.a", "app.cli")]


def test_type_checking_imports_do_not_count_but_their_else_does(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "kernel/a.py": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from app.cli import main
                else:
                    from stage.run import go
            """,
            "app/cli.py": "",
            "stage/run.py": "",
        },
    )
    assert kinds(tmp_path) == [("upward", "kernel.a", "stage.run")]


def test_siblings_and_entry_point_only_packages(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "stage/a.py": "import other.b\n",
            "other/b.py": "",
            "app/cli.py": "from plugin.rules import R\n",
            "plugin/rules.py": "R = 1\n",
        },
    )
    assert kinds(tmp_path) == [
        ("entry-point-only", "app.cli", "plugin.rules"),
        ("sibling", "stage.a", "other.b"),
    ]


def test_module_and_package_cycles_fail(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "stage/a.py": "from stage.b import B\nA = 1\n",
            "stage/b.py": "def f():\n    from stage.a import A\n    return A\nB = 1\n",
            "kernel/x.py": "import kernel.y\n",
            "kernel/y.py": "import kernel.x\n",
        },
    )
    assert kinds(tmp_path) == [
        ("module-cycle", "kernel.x", "kernel.x <-> kernel.y"),
        ("module-cycle", "stage.a", "stage.a <-> stage.b"),
    ]
    package_cycle = Contracts(layers=(("app", "stage", "other", "plugin", "kernel"),), entry_point_only=())
    tree(tmp_path, {"app/m.py": "import kernel.x\n", "kernel/z.py": "import app.m\n"})
    found = [(v.kind, v.imported) for v in check(tmp_path, package_cycle) if v.kind == "package-cycle"]
    assert found == [("package-cycle", "app -> kernel")]


def test_a_package_outside_every_layer_fails(tmp_path: Path) -> None:
    tree(tmp_path, {"newpkg/m.py": ""})
    assert ("unplaced-package", "newpkg", "") in kinds(tmp_path)


TRACKS = Contracts(
    layers=(("stage",), ("other",), ("kernel",)),
    entry_point_only=(),
    kernel="kernel",
    track_packages=("stage", "other"),
    stage_package="stage",
)


def test_a_kernel_module_one_track_alone_uses_is_found(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "kernel/lonely.py": "X = 1\n",
            "kernel/shared.py": "Y = 1\n",
            "other/sft/lib.py": "from kernel.lonely import X\nfrom kernel.shared import Y\n",
            "other/envs/lib.py": "from kernel.shared import Y\n",
        },
    )
    found = [(v.kind, v.importer) for v in check(root, TRACKS) if v.kind != "unplaced-package"]
    assert found == [("single-track-kernel", "kernel.lonely")]


def test_a_stage_folder_module_without_a_stage_is_found(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "stage/sft/chains.py": "STAGE = StageDef(name='chains')\n",
            "stage/sft/typed.py": "STAGE: object = StageDef(name='typed')\n",
            "stage/sft/helper.py": "def helper() -> int:\n    return 1\n",
            "stage/runtime.py": "def run() -> None: ...\n",
        },
    )
    found = [(v.kind, v.importer) for v in check(root, TRACKS) if v.kind != "unplaced-package"]
    assert found == [("stageless-stage-module", "stage.sft.helper")]

"""``arena train``'s checks before torch loads (``trainer.preflight``): a missing model, a resume
without state and an unavailable backend are answered from the lake and the settings alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.cli import arena_env

PROBE = """
import json, sys
from arena.config import ArenaSettings
from trainer.preflight import BackendUnavailable, NoCheckpoint, NoModel, check_backend, check_start

errors = {}
for name, call in {
    "no_model": lambda: check_start(ArenaSettings(), tiny=False, resume=False),
    "tiny": lambda: check_start(ArenaSettings(), tiny=True, resume=False),
    "resume": lambda: check_start(ArenaSettings(), tiny=True, resume=True),
    "vllm": lambda: check_backend("cpu", "vllm"),
    "hf_cpu": lambda: check_backend("cpu", "hf"),
}.items():
    try:
        call()
        errors[name] = None
    except (NoModel, NoCheckpoint, BackendUnavailable) as exc:
        errors[name] = [type(exc).__name__, str(exc)]
print(json.dumps({"errors": errors, "torch": "torch" in sys.modules, "transformers": "transformers" in sys.modules}))
"""


def _probe(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    found: dict = json.loads(out.stdout.splitlines()[-1])
    return found


def test_train_mistakes_are_found_without_loading_torch(tmp_path: Path) -> None:
    empty = tmp_path / "no-config"
    empty.mkdir()
    found = _probe(arena_env(tmp_path / "home"))
    assert (found["torch"], found["transformers"]) == (False, False)
    errors = found["errors"]
    assert errors["no_model"][0] == "NoModel" and "ARENA_TRAIN__MODEL" in errors["no_model"][1]
    assert "--tiny" in errors["no_model"][1]
    assert errors["tiny"] is None and errors["hf_cpu"] is None
    assert errors["resume"][0] == "NoCheckpoint" and "no training state" in errors["resume"][1]
    if errors["vllm"] is not None:  # the gpu extra is not installed here
        assert errors["vllm"][0] == "BackendUnavailable" and "ARENA_TRAIN__BACKEND=hf" in errors["vllm"][1]

    with_folder = _probe(arena_env(tmp_path / "home", ARENA_TRAIN__MODEL=str(empty)))
    assert not with_folder["torch"]
    assert with_folder["errors"]["no_model"][0] == "NoModel"
    assert f"ARENA_TRAIN__MODEL={empty}: no config.json there" in with_folder["errors"]["no_model"][1]
    assert with_folder["errors"]["tiny"][0] == "NoModel"  # a model that is set must be usable, --tiny or not

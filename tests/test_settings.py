"""Strict, immutable settings: empty or unusable values, unknown keys and assignments are errors."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from arena.config import NOT_SETTINGS_ENV, ArenaSettings, RoleSettings, unknown_env_vars
from tests.cli import ARENA, arena_env


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """No inherited ARENA_* variables, no ./arena.toml; returns the settings file path (absent)."""
    for name in list(os.environ):
        if name.upper().startswith("ARENA_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    toml = tmp_path / "settings.toml"
    monkeypatch.setenv("ARENA_CONFIG", str(toml))
    monkeypatch.setenv("ARENA_HOME", str(tmp_path / "home"))
    yield toml


def messages(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    return "\n".join(str(e["msg"]) for e in exc.value.errors())


@pytest.mark.parametrize("name", ["ARENA_HOME", "ARENA_LAKE_URL", "ARENA_BROKER", "ARENA_TRAIN__MODEL"])
def test_an_empty_setting_is_an_error_naming_it(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(name, "")
    with pytest.raises(ValidationError) as exc:
        ArenaSettings()
    assert f"{name} is set but empty" in messages(exc) and "fix:" in messages(exc)


def test_unusable_home_and_lake_paths(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("x")
    monkeypatch.setenv("ARENA_HOME", str(tmp_path / "a-file"))
    with pytest.raises(ValidationError) as exc:
        ArenaSettings()
    assert "is not a folder" in messages(exc)
    monkeypatch.setenv("ARENA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ARENA_LAKE_URL", "file://")
    with pytest.raises(ValidationError, match="names no folder"):
        ArenaSettings()
    monkeypatch.delenv("ARENA_LAKE_URL")
    monkeypatch.setenv("ARENA_CONFIG", str(tmp_path))
    with pytest.raises(ValidationError, match="is a folder, not a settings file"):
        ArenaSettings()


def test_unknown_environment_variables_are_errors_with_the_closest_key(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ARENA_SFT__WALK", "3")
    monkeypatch.setenv("ARENA_MAX_TURN", "9")
    monkeypatch.setenv("ARENA_LLM_API_KE", "sk-secret-value")
    with pytest.raises(ValidationError) as exc:
        ArenaSettings(seed=1)  # keyword arguments do not bypass the check
    text = messages(exc)
    assert "ARENA_SFT__WALK is not an Arena setting (did you mean ARENA_SFT__WALKS?)" in text
    assert "ARENA_MAX_TURN is not an Arena setting (did you mean ARENA_SFT__MAX_TURNS" in text
    assert "ARENA_TRAIN__MAX_TURNS" in text and "did you mean ARENA_LLM_API_KEY?" in text
    assert "sk-secret-value" not in str(exc.value)  # a mistyped secret is never echoed


def test_variables_that_are_not_settings_are_allowed(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in NOT_SETTINGS_ENV - {"ARENA_CONFIG"}:
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("ARENA_TEST_BROKER", "127.0.0.1:1")
    assert ArenaSettings().seed == 0
    assert unknown_env_vars({"ARENA_WORKER_SLOT": "2", "ARENA_TEST_ANYTHING": "x", "PATH": "/bin"}) == []


def test_unknown_keys_in_the_settings_file_are_errors(clean_env: Path) -> None:
    clean_env.write_text("seed = 3\nmax_turn = 4\n[sft]\nwalk = 2\nwalks = 5\n")
    with pytest.raises(ValidationError) as exc:
        ArenaSettings()
    text = messages(exc)
    assert f"{clean_env}: unknown key 'max_turn' (did you mean sft.max_turns" in text
    assert f"{clean_env}: unknown key [sft] 'walk' (did you mean sft.walks?)" in text
    clean_env.write_text("[llm_roles.judge]\ntemprature = 0\n")  # role tables forbid extra keys too
    with pytest.raises(ValidationError) as exc:
        ArenaSettings()
    assert exc.value.errors()[0]["loc"] == ("llm_roles", "judge", "temprature")


def test_settings_are_frozen(clean_env: Path) -> None:
    settings = ArenaSettings()
    with pytest.raises(ValidationError, match="frozen"):
        settings.seed = 4  # type: ignore[misc]
    with pytest.raises(ValidationError, match="frozen"):
        settings.train.lr = 0.5  # type: ignore[misc]
    changed = settings.model_copy(update={"train": settings.train.model_copy(update={"lr": 0.5})})
    assert changed.train.lr == 0.5 and settings.train.lr != 0.5


def test_every_settings_model_is_frozen_and_strict() -> None:
    sections = [RoleSettings] + [
        info.annotation
        for info in ArenaSettings.model_fields.values()
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
    ]
    assert len(sections) >= 6
    for model in [ArenaSettings, *sections]:
        assert model.model_config.get("frozen") is True, model
        assert model.model_config.get("extra") == "forbid", model


def test_valid_nested_overrides_still_work(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clean_env.write_text("seed = 3\n[train]\nlr = 0.25\n[sandbox]\npool_size = 4\n")
    monkeypatch.setenv("ARENA_SFT__WALKS", "11")
    monkeypatch.setenv("ARENA_TRAIN__MAX_TURNS", "5")
    monkeypatch.setenv("ARENA_LLM_ROLES__judge__temperature", "0")
    monkeypatch.setenv("ARENA_STAGE_CONCURRENCY_BY_STAGE", '{"chains": 2}')
    settings = ArenaSettings()
    assert (settings.seed, settings.train.lr, settings.sandbox.pool_size) == (3, 0.25, 4)
    assert (settings.sft.walks, settings.train.max_turns) == (11, 5)
    assert settings.llm_roles["judge"].temperature == 0 and settings.concurrency_of("chains") == 2


def test_the_cli_reports_bad_settings_without_a_traceback(tmp_path: Path) -> None:
    bad = (
        {"ARENA_HOME": ""},
        {"ARENA_SFT__WALK": "3"},
        {"ARENA_ENVS__HELDOUT_FAMILIES": "get_order_status"},  # not JSON: a parse error, not a validation one
        {"ARENA_STAGE_CONCURRENCY_BY_STAGE": "chains=2"},
    )
    for extra in bad:
        env = arena_env(tmp_path / "home", ARENA_CONFIG=str(tmp_path / "none.toml"), **extra)
        proc = subprocess.run(
            [ARENA, "status"], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert proc.returncode == 2, proc
        assert "Traceback" not in proc.stderr and next(iter(extra)) in proc.stderr.replace("\n", " "), (
            proc.stderr
        )

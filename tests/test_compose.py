"""docker-compose.yml and the Dockerfile, checked without Docker.

The file is interpolated the way ``docker compose`` does with an empty
environment (``${VAR:-default}`` -> default, ``$$`` -> ``$``), then parsed and
validated with PyPI ``compose-spec`` (the Rust ``compose_spec`` crate; YAML
merge keys applied), then checked for what the spec cannot know: every
dependency exists and can satisfy its condition, the Arena services are wired
by ARENA_* variables that ``ArenaSettings`` accepts, and every Arena command
the deployment runs is one the CLI tests exercise.

``COMPOSE_ARENA_COMMANDS`` (argv after ``arena``, in file order) is computed
from the file at import, so the CLI tests can assert they cover each one::

    from tests.test_compose import COMPOSE_ARENA_COMMANDS
"""

from __future__ import annotations

import os
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
from compose_spec import PyCompose, PyOptions
from compose_spec.models import ComposeSpecification

from app.registry import TRACKS
from arena.config import ArenaSettings

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

ARENA_IMAGE = "arena"

TRACK_WORKERS = {f"{track.name}-worker": ("worker", "--track", track.name) for track in TRACKS}
"""One compose service per track of the registry, each running its track."""

# Every `arena ...` command the deployment may run; the CLI tests must exercise each.
ALLOWED_ARENA_COMMANDS: frozenset[tuple[str, ...]] = frozenset(
    {
        ("topics", "create"),
        ("worker", "--stage", "lake-sink"),
        *TRACK_WORKERS.values(),
        ("train", "--tiny"),
    }
)

_VAR = re.compile(r"\$\$|\$\{(?P<braced>\w+)(?P<op>:?[-?+])?(?P<arg>[^}]*)\}|\$(?P<bare>\w+)")


def interpolate(text: str, env: dict[str, str] | None = None) -> str:
    """Compose variable interpolation (the subset this repository uses)."""
    env = env or {}

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("bare")
        value = env.get(name)
        op = m.group("op")
        if op in (":-", "-"):
            unset = value is None or (op == ":-" and value == "")
            return m.group("arg") if unset else str(value)
        if op is not None:
            raise ValueError(f"interpolation operator {op!r} not supported in this test: {m.group(0)}")
        return value or ""

    return _VAR.sub(sub, text)


def load_compose(path: Path = COMPOSE_FILE) -> PyCompose:
    compose = PyOptions(apply_merge=True).from_yaml(interpolate(path.read_text()))
    compose.validate()
    return compose


def _argv(command: str | list[str] | None) -> list[str]:
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def _uses_arena_image(service: dict[str, Any]) -> bool:
    image = str(service.get("image") or "")
    if image.split(":", 1)[0] == ARENA_IMAGE:
        return True
    build = service.get("build")
    context = build if isinstance(build, str) else (build or {}).get("context")
    return context in (".", "./")


def _arena_services(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in raw["services"].items() if _uses_arena_image(svc)}


def _arena_commands() -> tuple[tuple[str, ...], ...]:
    raw = load_compose().to_dict()
    commands: list[tuple[str, ...]] = []
    for name, svc in _arena_services(raw).items():
        argv = _argv(svc.get("command"))
        if not argv or argv[0] != "arena":
            raise ValueError(f"service {name!r} runs {argv!r}, not an `arena ...` command")
        if tuple(argv[1:]) not in commands:
            commands.append(tuple(argv[1:]))
    return tuple(commands)


COMPOSE_ARENA_COMMANDS: tuple[tuple[str, ...], ...] = _arena_commands()


@pytest.fixture(scope="module")
def compose() -> PyCompose:
    return load_compose()


@pytest.fixture(scope="module")
def raw(compose: PyCompose) -> dict[str, Any]:
    return compose.to_dict()


def test_validates_against_compose_spec(compose: PyCompose) -> None:
    spec = compose.to_spec()
    assert isinstance(spec, ComposeSpecification)
    assert spec.services is not None
    expected = {
        "kafka",
        "minio",
        "minio-init",
        "postgres",
        "vllm",
        "topics",
        *TRACK_WORKERS,
        "lake-sink",
        "trainer",
    }
    assert expected <= set(spec.services)


def test_every_arena_command_is_allowed() -> None:
    assert COMPOSE_ARENA_COMMANDS, "no Arena services found"
    unknown = set(COMPOSE_ARENA_COMMANDS) - ALLOWED_ARENA_COMMANDS
    assert not unknown, f"compose runs Arena commands the CLI tests do not cover: {sorted(unknown)}"
    assert set(COMPOSE_ARENA_COMMANDS) == ALLOWED_ARENA_COMMANDS  # and the list is not stale


def test_arena_services(raw: dict[str, Any]) -> None:
    arena = _arena_services(raw)
    commands = {name: tuple(_argv(svc["command"])[1:]) for name, svc in arena.items()}
    assert commands == {
        "topics": ("topics", "create"),
        "lake-sink": ("worker", "--stage", "lake-sink"),
        **TRACK_WORKERS,
        "trainer": ("train", "--tiny"),
    }
    assert raw["services"]["trainer"]["profiles"] == ["train"]
    assert raw["services"]["vllm"]["profiles"] == ["gpu"]
    assert raw["services"]["topics"]["restart"] == "no"
    for name in (*TRACK_WORKERS, "lake-sink"):
        deps = raw["services"][name]["depends_on"]
        assert deps["topics"]["condition"] == "service_completed_successfully"
        assert deps["kafka"]["condition"] == "service_healthy"


def test_arena_environment_is_valid_settings(raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    kafka_internal = {
        listener.split("://", 1)[1]
        for listener in raw["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    }
    for name, svc in _arena_services(raw).items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        assert env["ARENA_LAKE_URL"] == "s3://arena/lake", name
        assert env["ARENA_LANCEDB_URI"] == "s3://arena/lancedb", name
        assert env["ARENA_CATALOG_URL"].startswith("postgresql://"), name
        assert env["ARENA_S3_ENDPOINT"] == "http://minio:9000", name
        assert env["ARENA_BROKER"] in kafka_internal, name
        for key in ("ARENA_S3_ACCESS_KEY", "ARENA_S3_SECRET_KEY", "ARENA_LLM"):
            assert key in env, (name, key)
        # What the container's `arena` would load from exactly these variables.
        with monkeypatch.context() as m:
            for key in [k for k in os.environ if k.startswith("ARENA_")]:
                m.delenv(key)
            for key, value in env.items():
                m.setenv(key, value)
            settings = ArenaSettings()
        assert settings.broker == "kafka:9092"
        assert settings.catalog.startswith("postgresql://arena:")
    # the bucket the lake and LanceDB live in is the one minio-init creates
    assert "mb --ignore-existing arena/arena" in " ".join(_argv(raw["services"]["minio-init"]["command"]))


def test_dependencies_exist_and_can_be_met(raw: dict[str, Any]) -> None:
    services: dict[str, dict[str, Any]] = raw["services"]
    declared_volumes = set(raw.get("volumes") or {})
    for name, svc in services.items():
        assert svc.get("image") or svc.get("build"), f"{name} has neither image nor build"
        for dep, how in (svc.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            target = services[dep]
            condition = how["condition"]
            if condition == "service_healthy":
                assert target.get("healthcheck"), (
                    f"{name} waits for {dep} to be healthy; it has no healthcheck"
                )
            if condition == "service_completed_successfully":
                assert target.get("restart") == "no", f"{dep} is waited on to finish; it must be a one-shot"
            # a service outside the default profile cannot be a hard dependency of one inside it
            if target.get("profiles"):
                assert set(svc.get("profiles") or []) & set(target["profiles"]), (name, dep)
        for volume in svc.get("volumes") or []:
            source = volume.split(":", 1)[0] if isinstance(volume, str) else volume.get("source", "")
            if source and not source.startswith((".", "/")):
                assert source in declared_volumes, f"{name} mounts undeclared volume {source}"


def test_infrastructure_healthchecks(raw: dict[str, Any]) -> None:
    for name in ("kafka", "minio", "postgres", "vllm"):
        assert raw["services"][name].get("healthcheck", {}).get("test"), name
    kafka_env = raw["services"]["kafka"]["environment"]
    assert "broker,controller" in kafka_env["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", kafka_env["CLUSTER_ID"])  # base64url UUID
    assert raw["services"]["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia"


def test_validation_rejects_broken_files(tmp_path: Path) -> None:
    broken = COMPOSE_FILE.read_text().replace("condition: service_healthy", "condition: service_ready", 1)
    path = tmp_path / "docker-compose.yml"
    path.write_text(broken)
    with pytest.raises(ValueError, match="service_ready"):
        load_compose(path)


def test_interpolation() -> None:
    assert interpolate("a ${X:-d} $${Y} ${Z}", {"Z": "z"}) == "a d ${Y} z"
    assert interpolate("${X:-d}", {"X": ""}) == "d"
    assert interpolate("${X-d}", {"X": ""}) == ""


def test_dockerfile() -> None:
    text = DOCKERFILE.read_text()
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    torch = next(i for i, line in enumerate(lines) if "torch==2.13.0" in line)
    assert "download.pytorch.org/whl/cpu" in lines[torch]
    install = next(i for i, line in enumerate(lines) if "pip install -c constraints.txt ." in line)
    assert torch < install  # the CPU wheel is in place before anything could pull a CUDA one
    copied = {line.split()[1].rstrip("/") for line in lines if line.startswith("COPY ")}
    # every package setuptools installs must be in the image
    includes = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for pattern in includes["include"]:
        package = pattern.rstrip("*")
        assert package in copied, f"Dockerfile does not copy {package}/"
    assert "torch==2.13.0" in (ROOT / "constraints.txt").read_text()

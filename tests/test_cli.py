"""The CLI: user mistakes get one clear line (no traceback), secrets stay hidden,
and every Arena command that docker-compose.yml runs works."""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from kafka.admin import KafkaAdminClient

from app.cli import app as cli_app
from app.registry import TRACKS, WORKERS
from app.stack import descendants_of
from synthesis.eigen.packs import builtin_pack_path
from tests.cli import ARENA, arena_env, broker_of, read_all, run_arena, stack_stopped_after
from tests.test_compose import COMPOSE_ARENA_COMMANDS

PENDING_COMMANDS: set[tuple[str, ...]] = set()
"""Commands compose runs that the CLI does not have yet (none since `arena train` landed)."""


def assert_user_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_missing_path_names_the_file(tmp_path: Path) -> None:
    proc = run_arena(["publish", "tools", str(tmp_path / "nope.json")], arena_env(tmp_path), check=None)
    assert_user_error(proc, "nope.json", "fix")


def test_bad_setting_names_the_variable(tmp_path: Path) -> None:
    env = arena_env(tmp_path, ARENA_LAKE_URL="ftp://somewhere/lake")
    assert_user_error(run_arena(["lake", "ls"], env, check=None), "ARENA_LAKE_URL", "file:// or s3://")
    env = arena_env(tmp_path, ARENA_LAKE_URL="s3://bucket/lake")
    assert_user_error(run_arena(["lake", "ls"], env, check=None), "ARENA_S3_ENDPOINT")


def test_bad_sql_and_unknown_stage(tmp_path: Path) -> None:
    env = arena_env(tmp_path)
    assert_user_error(
        run_arena(["lake", "query", "select * from no_such_view"], env, check=None), "query failed"
    )
    assert_user_error(
        run_arena(["worker", "--stage", "nope"], env, check=None), "unknown stage", "tools-servers"
    )


def test_unreachable_external_broker_is_a_clear_error(tmp_path: Path) -> None:
    env = arena_env(tmp_path, ARENA_BROKER="127.0.0.1:1")
    proc = run_arena(["topics", "create"], env, check=None, timeout=60)
    assert_user_error(proc, "127.0.0.1:1")


def test_secrets_are_never_printed(tmp_path: Path) -> None:
    env = arena_env(
        tmp_path,
        ARENA_S3_ENDPOINT="http://127.0.0.1:9",
        ARENA_S3_ACCESS_KEY="AKIAEXAMPLE",
        ARENA_S3_SECRET_KEY="supersecret-value",
        ARENA_CATALOG_URL="postgresql://arena:pg-password@127.0.0.1:5/arena",
    )
    for args in (["config"], ["status"]):
        out = run_arena(args, env).stdout
        assert "supersecret-value" not in out and "pg-password" not in out and "AKIAEXAMPLE" not in out
        assert "postgresql://arena:***@127.0.0.1:5/arena" in out


def stable_groups(bootstrap: str, groups: list[str]) -> bool:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_groups(groups)
    finally:
        admin.close()
    return all(described.get(g, {}).get("group_state") == "Stable" for g in groups)


def test_every_compose_command_runs(tmp_path: Path) -> None:
    """The one-shot commands run in file order; then every service runs at once, as under compose."""
    home = tmp_path / "home"
    env = arena_env(home)
    cli_commands = {c.name for c in cli_app.registered_commands} | {g.name for g in cli_app.registered_groups}
    assert set(COMPOSE_ARENA_COMMANDS) - PENDING_COMMANDS, "compose runs no Arena command"
    services: list[tuple[tuple[str, ...], subprocess.Popen[str]]] = []
    with stack_stopped_after(env):
        try:
            for argv in COMPOSE_ARENA_COMMANDS:
                if argv in PENDING_COMMANDS:
                    assert argv[0] not in cli_commands, f"`arena {argv[0]}` exists now: exercise it here"
                elif argv[0] in ("worker", "train"):
                    proc = subprocess.Popen(
                        [ARENA, *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                    )
                    services.append((argv, proc))
                else:
                    run_arena(list(argv), env)
            assert services, "compose runs no Arena service"
            waiting = list(services)
            deadline = time.monotonic() + 300  # every service starts at once on a shared machine
            while waiting:
                waiting = [(argv, proc) for argv, proc in waiting if not _running(argv, proc, home)]
                assert time.monotonic() < deadline, f"never running: {[' '.join(a) for a, _ in waiting]}"
                time.sleep(0.5)
            time.sleep(3)  # the trainer into its wait for samples, the workers into their loops
        finally:
            _stop_all_with_sigterm(services)


def _running(argv: tuple[str, ...], proc: subprocess.Popen[str], home: Path) -> bool:
    """Whether a service started by ``arena ARGV`` runs (a service that died fails here)."""
    assert proc.poll() is None, (argv, proc.communicate()[1][-2000:])
    if argv[0] == "train":
        # The trainer is a service: it starts (building its tiny model), then waits for samples.
        return (home / "lake" / "trainer" / "default" / "base" / "_manifest.json").is_file()
    tracks = {t.name: [s.name for s in t.stages] for t in TRACKS}
    names = [argv[i + 1] for i, a in enumerate(argv) if a == "--stage"]
    names += [n for i, a in enumerate(argv) if a == "--track" for n in tracks[argv[i + 1]]]
    names = names or list(WORKERS)
    groups = [WORKERS[n].group for n in names]
    # Running = its worker processes exist and their groups are stable (static members of an
    # earlier run keep a group stable, so both are needed).
    workers = [c for c in descendants_of(proc.pid).values() if "app.run" in c]
    return len(workers) >= len(names) and stable_groups(broker_of(home), groups)


def _stop_all_with_sigterm(services: list[tuple[tuple[str, ...], subprocess.Popen[str]]]) -> None:
    """SIGTERM every running service at once; each must exit 0 (one that already died fails here)."""
    alive = {id(proc): proc.poll() is None for _, proc in services}
    for _, proc in services:
        if alive[id(proc)]:
            proc.send_signal(signal.SIGTERM)
    failures = []
    for argv, proc in services:
        err = ""
        try:
            _, err = proc.communicate(timeout=60)
        except ValueError:  # its output was read already: it died while starting (reported there)
            pass
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if not alive[id(proc)] or proc.returncode != 0:
            failures.append((argv, proc.returncode, err[-2000:]))
    assert not failures, failures


def run_arena_concurrently(
    runs: list[tuple[list[str], dict[str, str]]],
) -> list[subprocess.CompletedProcess[str]]:
    """``arena ARGS`` for every (args, env) at once, unchecked; the results in the order given.

    For independent commands that each start a process, wait on the stack and fail early: their
    waits overlap (the stack's lock serialises starting it)."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        return list(pool.map(lambda run: run_arena(run[0], run[1], check=None), runs))


def test_train_eval_export_user_errors(tmp_path: Path) -> None:
    env = arena_env(tmp_path / "home")
    with stack_stopped_after(env):
        once = ["train", "--tiny", "--until-drained", "--steps", "1"]
        expected: list[tuple[list[str], dict[str, str], tuple[str, ...]]] = [
            (["train"], env, ("ARENA_TRAIN__MODEL", "--tiny")),
            (["train", "--tiny", "--resume"], env, ("no training state",)),
            (["train", "--run", "a b"], env, ("--run 'a b'",)),
            (["train"], env | {"ARENA_TRAIN__MODEL": str(tmp_path)}, ("no config.json", str(tmp_path))),
        ]
        if importlib.util.find_spec("vllm") is None:  # the gpu extra is not installed here
            no_vllm = ("vllm cannot be imported", "ARENA_TRAIN__BACKEND=hf")
            expected.append((once, env | {"ARENA_TRAIN__BACKEND": "vllm"}, no_vllm))
        if not torch.cuda.is_available():
            expected.append(
                (once, env | {"ARENA_TRAIN__DEVICE": "cuda"}, ("torch sees no GPU", "device auto or cpu"))
            )
        for proc, (_, _, needles) in zip(
            run_arena_concurrently([(args, e) for args, e, _ in expected]), expected, strict=True
        ):
            assert_user_error(proc, *needles)
    after_down: list[tuple[list[str], tuple[str, ...]]] = [
        (["eval"], ("has no weights yet",)),
        (["eval", "--k", "4", "--trials", "2"], ("--trials 2 < --k 4",)),
        (["eval", "--user", "robot"], ("--user 'robot'",)),
        (["eval", "--model", str(tmp_path)], ("no config.json",)),
        (["export", "verl", str(tmp_path / "out")], ("no verified",)),
    ]
    for proc, (_, needles) in zip(
        run_arena_concurrently([(args, env) for args, _ in after_down]), after_down, strict=True
    ):
        assert_user_error(proc, *needles)


def test_publish_domain_and_eigen_user_errors(tmp_path: Path) -> None:
    env = arena_env(tmp_path / "home")
    missing = run_arena(["publish", "domain", str(tmp_path / "nope")], env, check=None)
    assert_user_error(missing, "no such folder", "customer_service")
    broken = tmp_path / "pack"
    shutil.copytree(builtin_pack_path(), broken)
    (broken / "tools.py").unlink()
    assert_user_error(run_arena(["publish", "domain", str(broken)], env, check=None), "tools.py", "Fix:")
    (broken / "tools.py").write_text("def refund(order_id):\n    return 1\n")
    bad_tools = run_arena(["publish", "domain", str(broken)], env, check=None)
    assert_user_error(bad_tools, "tools.py")
    assert not (tmp_path / "home" / "stack.json").exists()  # a bad pack never starts the stack
    assert_user_error(run_arena(["eigen", "critiques", "ps-nope"], env, check=None), "arena eigen sets")


@pytest.mark.parametrize("command", [["up"], ["status"], ["topics", "list"], ["down"]])
def test_stack_commands(tmp_path_factory: pytest.TempPathFactory, command: list[str]) -> None:
    home = tmp_path_factory.getbasetemp() / "stack-commands"
    out = run_arena(command, arena_env(home)).stdout
    assert out.strip()


def test_publish_mcp_errors_and_a_live_stdio_server(tmp_path: Path) -> None:
    env = arena_env(tmp_path / "home")
    assert_user_error(run_arena(["publish", "mcp"], env, check=None), "exactly one of --stdio")
    unreachable = run_arena(["publish", "mcp", "--url", "http://127.0.0.1:9/mcp"], env, check=None)
    assert_user_error(unreachable, "could not list tools", "127.0.0.1:9")
    command = f"{sys.executable} -m samples.mcp.notes --transport stdio"
    with stack_stopped_after(env):
        out = run_arena(["publish", "mcp", "--stdio", command, "--name", "notes"], env)
        assert "published MCP server 'notes'" in out.stdout
        (record,) = [json.loads(r.value) for r in read_all(broker_of(tmp_path / "home"), "tools.raw")]
        assert record["endpoint"] == {"transport": "stdio", "command": command.split(), "url": None}
        assert record["format"] == "mcp" and all("outputSchema" in e for e in record["entries"])

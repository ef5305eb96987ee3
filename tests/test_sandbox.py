"""The sandbox contains hostile programs: each attack ends with a clear error within its
timeout + 1 s, the parent survives, no process of the sandbox uids is left and nothing is
written outside the job's own directory. Real processes, namespaces and limits (no mocks)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from arena.config import SandboxSettings
from sandbox import Preload, SandboxPool, SandboxResult, SandboxUnavailable
from sandbox.cli import app
from sandbox.pool import _pids_of

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (CI runs as root)"),
    pytest.mark.timeout(60),
]

TIMEOUT = 1.5
ESCAPE = "arena-sandbox-escape"
HOST_WRITABLE = [
    p for p in (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path("/run/lock"), Path.cwd()) if p.is_dir()
]
"""Where a job might leave files on the host (world-writable dirs, the working directory)."""
SETTINGS = SandboxSettings.model_validate(
    {"pool_size": 2, "timeout_s": TIMEOUT, "memory_mb": 256, "max_procs": 8}
)


def sandboxed(scenario: Callable[[SandboxPool], Awaitable[Any]], settings: SandboxSettings = SETTINGS) -> Any:
    """Run ``scenario`` with a fresh pool; afterwards the pool still works and nothing leaked."""

    async def main() -> Any:
        async with SandboxPool(settings) as pool:
            value = await scenario(pool)
            for uid in pool.uids:
                assert _pids_of(uid) == [], f"processes of sandbox uid {uid} survived the job"
            after = await pool.run("'still here'")  # the parent and the pool survived
            assert after.ok and after.return_value == "still here", after
            return value

    value = asyncio.run(main())
    for folder in HOST_WRITABLE:
        assert not list(folder.glob(f"{ESCAPE}*")), f"the sandbox wrote into {folder}"
    return value


async def timed(pool: SandboxPool, code: str, **limits: Any) -> tuple[SandboxResult, float]:
    start = time.monotonic()
    result = await pool.run(code, **limits)
    return result, time.monotonic() - start


def assert_contained(result: SandboxResult, elapsed: float, *kinds: str, timeout: float = TIMEOUT) -> None:
    assert not result.ok, result
    assert result.error_type in kinds, result
    assert result.error and "\n" not in result.error, result
    assert elapsed <= timeout + 1.0, (elapsed, result)


# -- normal runs -------------------------------------------------------------------------------


def test_normal_run_returns_its_value() -> None:
    code = (
        "import json\n"
        'DATA = json.loads(\'{"get_price": [{"id": "L1", "price": 420000}]}\')\n'
        "def get_price(id):\n"
        "    return next(r['price'] for r in DATA['get_price'] if r['id'] == id)\n"
        "print('looking up L1')\n"
        "{'price': get_price('L1'), 'ids': {1, 2} and [1, 2]}\n"
    )

    async def scenario(pool: SandboxPool) -> None:
        result = await pool.run(code)
        assert result.ok, result
        assert result.return_value == {"price": 420000, "ids": [1, 2]}
        assert result.stdout == "looking up L1\n"
        assert result.error_type is None and result.error is None and not result.truncated
        assert 0 < result.wall_s < TIMEOUT and result.cpu_s > 0
        non_json = await pool.run("object()")
        assert non_json.ok and str(non_json.return_value).startswith("<object object")
        no_value = await pool.run("x = 1")
        assert no_value.ok and no_value.return_value is None

    sandboxed(scenario)


def test_failed_or_timed_out_job_is_never_ok() -> None:
    async def scenario(pool: SandboxPool) -> None:
        failed = await pool.run("def f():\n    raise ValueError('boom')\nf()")
        assert not failed.ok and failed.error_type == "exception"
        assert failed.error == "ValueError: boom"
        assert "Traceback" in failed.stderr and "worker.py" not in failed.stderr
        exited = await pool.run("import sys\nsys.exit(3)")
        assert not exited.ok and exited.error == "SystemExit: 3"
        syntax = await pool.run("def (:")
        assert not syntax.ok and syntax.error_type == "exception" and "SyntaxError" in (syntax.error or "")
        slow, elapsed = await timed(pool, "import time\ntime.sleep(10)\n'never'", timeout_s=0.5)
        assert_contained(slow, elapsed, "timeout", timeout=0.5)
        assert slow.error == "wall-clock timeout after 0.5 s" and slow.return_value is None

    sandboxed(scenario)


# -- attacks -----------------------------------------------------------------------------------


def test_infinite_loop() -> None:
    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, "while True:\n    pass")
        assert_contained(result, elapsed, "timeout", "cpu_time")

    sandboxed(scenario)


def test_fork_bomb() -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, code)
        assert_contained(result, elapsed, "timeout", "cpu_time")

    sandboxed(scenario)


def test_fork_bomb_hits_the_process_limit() -> None:
    code = "import os, time\npids = []\nwhile True:\n    pids.append(os.fork() or time.sleep(30))\n"

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, code)
        assert_contained(result, elapsed, "exception")
        assert "BlockingIOError" in (result.error or ""), result

    sandboxed(scenario)


def test_memory_bomb() -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n"

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, code, memory_mb=128)
        assert_contained(result, elapsed, "memory")
        assert result.error == "MemoryError"

    sandboxed(scenario)


def test_write_outside_its_dir() -> None:
    targets = [f"{d}/{ESCAPE}" for d in HOST_WRITABLE] + [f"/{ESCAPE}", f"/root/{ESCAPE}", f"/etc/{ESCAPE}"]
    code = (
        "import os\n"
        f"targets = {targets!r}\n"
        "open(os.path.join(os.environ['HOME'], 'mine.txt'), 'w').write('fine')\n"
        "escaped = []\n"
        "for t in targets:\n"
        "    try:\n"
        "        open(t, 'w').write('x')\n"
        "        escaped.append(t)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('escaped', escaped)\n"
        "open(targets[0], 'w')\n"
    )

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, code)
        assert_contained(result, elapsed, "exception")
        assert "escaped []" in result.stdout, result
        assert result.error and result.error.startswith(("PermissionError", "OSError")), result

    sandboxed(scenario)


def test_read_another_rollouts_state() -> None:
    writer = (
        "import builtins, os, time\n"
        "open(os.path.join(os.environ['HOME'], 'secret.txt'), 'w').write('rollout-a-state')\n"
        "builtins.LEFT_BEHIND = 'rollout-a-state'\n"
        "time.sleep(1.0)\n"
        "os.environ['HOME']\n"
    )
    reader = (
        "import builtins, glob, os\n"
        "found = glob.glob('/tmp/**/secret.txt', recursive=True)\n"
        "found += glob.glob('/proc/*/root/tmp/*/secret.txt') + glob.glob('/proc/*/cwd/secret.txt')\n"
        "print('found', found, getattr(builtins, 'LEFT_BEHIND', None))\n"
        "open(found[0] if found else HOME_OF_A + '/secret.txt').read()\n"
    )

    async def scenario(pool: SandboxPool) -> None:
        first = asyncio.create_task(pool.run(writer))
        await asyncio.sleep(0.3)  # the writer is now sleeping on its state
        concurrent = await pool.run("HOME_OF_A = '/tmp/job-unknown'\n" + reader)
        a = await first
        assert a.ok, a
        later, elapsed = await timed(pool, f"HOME_OF_A = {a.return_value!r}\n" + reader)
        for result in (concurrent, later):
            assert_contained(result, elapsed, "exception")
            assert "found [] None" in result.stdout, result
            assert "FileNotFoundError" in (result.error or ""), result
            assert "rollout-a-state" not in result.stdout + result.stderr

    sandboxed(scenario)


def test_read_host_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-fake-arena-secret-1234"
    monkeypatch.setenv("ARENA_FAKE_SECRET", secret)
    code = (
        "import glob, os\n"
        "seen = [str(dict(os.environ))]\n"
        "for path in glob.glob('/proc/*/environ') + [f'/proc/{PARENT}/environ']:\n"
        "    try:\n"
        "        seen.append(open(path, 'rb').read().decode(errors='replace'))\n"
        "    except OSError:\n"
        "        pass\n"
        "print(seen)\n"
        "os.environ['ARENA_FAKE_SECRET']\n"
    )

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, f"PARENT = {os.getpid()}\n" + code)
        assert_contained(result, elapsed, "exception")
        assert result.error == "KeyError: 'ARENA_FAKE_SECRET'"
        assert secret not in result.stdout + result.stderr
        assert "HOME" in result.stdout  # it did see its own, scrubbed environment

    sandboxed(scenario)


def test_socket_to_a_host_listener() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hi')\n"

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, code)
        assert_contained(result, elapsed, "exception")
        assert "unreachable" in (result.error or "").lower(), result

    try:
        sandboxed(scenario)
        readable, _, _ = select.select([listener], [], [], 0)
        assert not readable, "a sandboxed job reached the host listener"
    finally:
        listener.close()


def test_huge_output() -> None:
    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, "while True:\n    print('x' * 10000)")
        assert_contained(result, elapsed, "output_limit")
        assert result.truncated and 0 < len(result.stdout) <= SETTINGS.max_output_bytes

    sandboxed(scenario)


def test_kill_the_parent() -> None:
    code = (
        "import os, signal\n"
        "for pid in (os.getppid(), -1, 1):\n"
        "    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError as exc:\n"
        "        print(pid, type(exc).__name__)\n"
        "os.kill(PARENT, signal.SIGKILL)\n"
    )

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, f"PARENT = {os.getpid()}\n" + code)
        # kill(-1) may take the job itself down; either way the parent is untouched.
        assert_contained(result, elapsed, "exception", "killed")

    sandboxed(scenario)


def test_ctypes_crash() -> None:
    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, "import ctypes\nctypes.string_at(0)")
        assert_contained(result, elapsed, "crash")
        assert result.error == "killed by SIGSEGV"

    sandboxed(scenario)


def test_spawn_a_shell() -> None:
    code = (
        "import os, subprocess\n"
        f"print('system', os.system('touch /tmp/{ESCAPE}-shell'))\n"
        "subprocess.run(['/bin/sh', '-c', 'echo escaped'], check=True)\n"
    )

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, code)
        assert_contained(result, elapsed, "exception")
        assert result.error == "PermissionError: [Errno 1] Operation not permitted: '/bin/sh'", result
        assert "escaped" not in result.stdout

    sandboxed(scenario)


def test_detached_child_is_killed() -> None:
    code = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(0.1)\n"
        "'parent done'\n"
    )

    async def scenario(pool: SandboxPool) -> None:
        result, elapsed = await timed(pool, code)
        assert result.ok and result.return_value == "parent done", result
        assert elapsed <= TIMEOUT + 1.0
        # sandboxed() then checks that no process of the sandbox uids survived.

    sandboxed(scenario)


# -- CLI ---------------------------------------------------------------------------------------


def test_cli_run(tmp_path: Path) -> None:
    runner = CliRunner()
    good = tmp_path / "good.py"
    good.write_text("print('hi')\n6 * 7\n")
    done = runner.invoke(app, ["run", str(good), "--timeout", "2"])
    assert done.exit_code == 0, done.output
    payload = json.loads(done.stdout)
    assert payload["ok"] and payload["return_value"] == 42 and payload["stdout"] == "hi\n"

    bad = tmp_path / "bad.py"
    bad.write_text("while True:\n    pass\n")
    failed = runner.invoke(app, ["run", str(bad), "--timeout", "0.5", "--memory-mb", "128"])
    assert failed.exit_code == 1
    assert json.loads(failed.stdout)["error_type"] in ("timeout", "cpu_time")

    missing = runner.invoke(app, ["run", str(tmp_path / "nope.py")])
    assert missing.exit_code == 2
    assert "nope.py" in missing.stderr and "Traceback" not in missing.output
    assert len(missing.stderr.strip().splitlines()) == 1


# -- sessions ----------------------------------------------------------------------------------

TOOLS = (
    "def add(item):\n"
    "    STATE['items'].append(item)\n"
    "    return len(STATE['items'])\n"
    "def add_then_fail(item):\n"
    "    STATE['items'].append(item)\n"
    "    STATE['flag'] = True\n"
    "    raise ValueError('refused after changing the state')\n"
    "def add_then_bomb(item):\n"
    "    STATE['items'].append(item)\n"
    "    hog = []\n"
    "    while True:\n"
    "        hog.append(bytearray(16 << 20))\n"
    "def add_then_shout(item):\n"
    "    STATE['items'].append(item)\n"
    "    print('x' * (1 << 20))\n"
    "def crash():\n"
    "    import ctypes\n"
    "    ctypes.string_at(0)\n"
)


async def loaded(pool: SandboxPool, **limits: Any) -> Any:
    session = await pool.open_session(**limits)
    result = await session.run(TOOLS, bind={"STATE": {"items": [], "flag": False}})
    assert result.ok, result
    return session


def test_a_failed_call_leaves_the_state_as_it_was() -> None:
    async def scenario(pool: SandboxPool) -> None:
        async with await loaded(pool) as session:
            assert (await session.call("add", {"item": "a"})).return_value == 1
            failed = await session.call("add_then_fail", {"item": "b"})
            assert failed.error_type == "exception" and "refused" in (failed.error or ""), failed
            bomb = await session.call("add_then_bomb", {"item": "c"})
            assert bomb.error_type == "memory", bomb
            shout = await session.call("add_then_shout", {"item": "d"})
            assert shout.error_type == "output_limit" and shout.truncated, shout
            dry = await session.call("add", {"item": "e"}, commit=False)
            assert dry.ok and dry.return_value == 2, dry
            state = await session.read("STATE")
            assert state.return_value == {"items": ["a"], "flag": False}, state
            assert (await session.call("add", {"item": "f"})).return_value == 2  # still serving

    sandboxed(scenario)


def test_sessions_cannot_see_signal_or_change_each_other() -> None:
    secret = "session-a-private-state"
    victim_setup = (
        "import os\n"
        f"SECRET = {secret!r}\n"
        "open(os.path.join(os.environ['HOME'], 'secret.txt'), 'w').write(SECRET)\n"
        "def read_secret():\n"
        "    return [SECRET, open(os.path.join(os.environ['HOME'], 'secret.txt')).read()]\n"
        "(os.getpid(), os.environ['HOME'])\n"
    )
    attack = (
        "import glob, os, signal\n"
        "found, signalled = [], []\n"
        "for path in glob.glob('/tmp/**', recursive=True) + glob.glob('/proc/*/root/tmp/**', recursive=True):\n"
        "    try:\n"
        "        found.append(open(path).read())\n"
        "    except OSError:\n"
        "        pass\n"
        "for name in ('environ', 'cmdline', 'mem'):\n"
        "    for path in glob.glob(f'/proc/*/{name}'):\n"
        "        try:\n"
        "            found.append(open(path, 'rb').read(4096).decode(errors='replace'))\n"
        "        except OSError:\n"
        "            pass\n"
        "for pid in [VICTIM_PID] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    if pid != os.getpid():\n"
        "        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n"
        "            signalled.append(pid)\n"
        "        except OSError:\n"
        "            pass\n"
        "try:\n"
        "    open(VICTIM_HOME + '/secret.txt', 'w').write('overwritten')\n"
        "except OSError as exc:\n"
        "    found.append(type(exc).__name__)\n"
        "[found, signalled]\n"
    )

    async def scenario(pool: SandboxPool) -> None:
        async with await pool.open_session() as victim, await pool.open_session() as attacker:
            assert victim.uid != attacker.uid
            opened = await victim.run(victim_setup)
            assert opened.ok, opened
            pid, home = opened.return_value
            result = await attacker.run(f"VICTIM_PID = {pid}\nVICTIM_HOME = {home!r}\n" + attack)
            assert result.ok, result
            found, signalled = result.return_value
            assert secret not in json.dumps(found), found
            assert pid not in signalled, signalled
            # Same home path, another filesystem: whatever the attacker wrote there is its own.
            after = await victim.call("read_secret", {})
            assert after.ok and after.return_value == [secret, secret], after

    sandboxed(scenario)


def test_a_call_that_dies_ends_only_its_own_session() -> None:
    async def scenario(pool: SandboxPool) -> None:
        async with await loaded(pool) as doomed, await loaded(pool) as other:
            assert (await other.call("add", {"item": "kept"})).ok
            died, elapsed = await timed_call(doomed.call("crash", {}))
            assert_contained(died, elapsed, "crash")
            assert died.error == "killed by SIGSEGV" and not doomed.alive, died
            later = await doomed.call("add", {"item": "x"})
            assert not later.ok and later.error_type == "crash", later
            assert (await other.call("add", {"item": "still"})).return_value == 2
            assert (await other.read("STATE")).return_value["items"] == ["kept", "still"]

    sandboxed(scenario)


def test_a_call_over_its_time_ends_its_session_in_time() -> None:
    async def scenario(pool: SandboxPool) -> None:
        async with await loaded(pool) as session:
            spin, elapsed = await timed_call(session.run("while True:\n    pass", timeout_s=0.5))
            assert_contained(spin, elapsed, "timeout", timeout=0.5)
            assert not session.alive

    sandboxed(scenario)


def test_sessions_wait_for_a_free_slot() -> None:
    async def scenario(pool: SandboxPool) -> None:
        first = await pool.open_session()
        second = asyncio.create_task(pool.open_session())
        await asyncio.sleep(0.3)
        assert not second.done(), "a second session opened while the only slot was taken"
        await first.close()
        async with await asyncio.wait_for(second, 5) as session:
            assert (await session.run("1 + 1")).return_value == 2

    sandboxed(scenario, SETTINGS.model_copy(update={"pool_size": 1}))


async def timed_call(call: Awaitable[SandboxResult]) -> tuple[SandboxResult, float]:
    start = time.monotonic()
    result = await call
    return result, time.monotonic() - start


def _children(pid: int) -> list[int]:
    return [
        int(c)
        for t in os.listdir(f"/proc/{pid}/task")
        for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()
    ]


def test_a_slot_that_dies_is_made_again() -> None:
    async def scenario(pool: SandboxPool) -> None:
        session = await pool.open_session()
        assert (await session.run("1 + 1")).return_value == 2
        assert pool._server is not None
        (server,) = _children(pool._server.proc.pid)
        (slot,) = _children(server)  # one uid, one slot: pid 1 of its namespaces, root
        os.kill(slot, signal.SIGKILL)
        await asyncio.wait_for(asyncio.shield(session._ended), 5)  # the server saw the slot go
        failed = await session.run("1 + 1")
        assert not failed.ok and failed.error_type in ("sandbox_error", "crash", "killed"), failed
        await session.close()
        async with await pool.open_session() as again:
            assert (await again.run("2 + 2")).return_value == 4

    sandboxed(scenario, SETTINGS.model_copy(update={"pool_size": 1}))


# -- preload -----------------------------------------------------------------------------------

PRELOAD_DIR = str(Path(__file__).parent / "fixtures" / "preload")


def test_a_preload_is_imported_once_by_the_server_and_every_session_forks_with_it() -> None:
    preload = Preload(
        paths=(PRELOAD_DIR,), modules=("fractions", "arena_preload_probe"), env={"ARENA_PRELOAD_PROBE": "on"}
    )
    code = (
        "import os, sys\n"
        "probe = sys.modules.get('arena_preload_probe')\n"
        "[probe is not None and probe.IMPORTED_BY != os.getpid(), probe and probe.SETTING, 'fractions' in sys.modules]"
    )

    async def main() -> list[Any]:
        async with SandboxPool(SETTINGS, preload) as pool:
            answers = [await pool.run(code), await pool.run(code)]
        async with SandboxPool(SETTINGS) as pool:  # without a preload, nothing of it is there
            answers.append(
                await pool.run(
                    "import sys\n['arena_preload_probe' in sys.modules, 'fractions' in sys.modules]"
                )
            )
        assert all(a.ok for a in answers), answers
        return [a.return_value for a in answers]

    assert asyncio.run(main()) == [[True, "on", True], [True, "on", True], [False, False]]


@pytest.mark.parametrize(
    ("module", "said"),
    [
        ("arena_no_such_module", "preloading arena_no_such_module: ModuleNotFoundError"),
        ("arena_preload_thread", "thread"),
    ],
)
def test_a_preload_that_fails_or_starts_a_thread_is_refused_with_why(module: str, said: str) -> None:
    async def main() -> None:
        async with SandboxPool(SETTINGS, Preload(paths=(PRELOAD_DIR,), modules=(module,))):
            pass

    with pytest.raises(SandboxUnavailable, match=said):
        asyncio.run(main())

"""The LLM endpoint fails, not the records: nothing is dead-lettered, nothing lost or duplicated.

Real parts throughout: the embedded broker, `arena worker` supervising the stage processes
(concurrent: many records and calls in flight), and `arena llm serve` (the rules simulator
behind the OpenAI API, with latency) reached through Arena's openai:// client. The reference
counts come from running the same stages in process with the rules backend (the simulator
answers over HTTP exactly as in process, see tests/test_llm_serve.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from app.demo import sample_tools_dir
from app.stack import descendants_of
from arena.config import ArenaSettings
from arena.llm.outage import read_states
from producers.publish_tools import raw_key
from producers.tool_docs import load_tool_docs
from streams import resources
from streams.sft import chains
from streams.tools import tools_servers
from tests.cli import ARENA, arena_env, broker_of, read_all, run_arena, stack_stopped_after
from tests.fixtures.llm_serve import llm_server
from tests.test_llm_serve import _run, free_port

pytestmark = pytest.mark.integration

SERVERS = ("filesystem.json", "notes_mcp.json", "restaurants.json", "weather_openai.json")
"""Sample tool servers the runs publish (a few keep the in-process reference quick)."""
OUTAGE_S = float(os.environ.get("ARENA_TEST_OUTAGE_S", "8"))
"""How long the model server stays down mid-run (the acceptance run uses 60 s; the path is the same)."""
STAGES = ["tools-servers", "chains"]


def _docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in SERVERS:
        (docs / name).write_bytes((sample_tools_dir() / "good" / name).read_bytes())
    return docs


def _reference_chain_keys(docs: Path, tmp_path: Path) -> list[str]:
    """Chain keys of tools-servers -> chains on ``docs``, in process with the rules backend."""
    settings = ArenaSettings(home=tmp_path / "reference", llm="rules")
    raws = load_tool_docs([docs]).servers

    async def run() -> list[str]:
        try:
            emits = await _run(tools_servers.STAGE, [(raw_key(r), r) for r in raws], settings)
            servers = [(e.key, e.value) for e in emits if e.topic == "tools.servers"]
            emits = await _run(chains.STAGE, servers, settings)
        finally:
            await resources.gateway_for(settings).aclose()
        return sorted(e.key for e in emits if e.topic == "chains")

    return asyncio.run(run())


def _dead_letters(bootstrap: str) -> dict[str, int]:
    return {t: len(read_all(bootstrap, t)) for t in ("tools.raw.dlq", "tools.servers.dlq")}


def _served(url: str) -> int:
    try:
        return int(httpx.get(f"{url}/arena/stats", timeout=2).json()["requests"])
    except httpx.TransportError:
        return 0


def test_model_server_down_mid_run_and_a_worker_killed_lose_and_dead_letter_nothing(tmp_path: Path) -> None:
    docs = _docs(tmp_path)
    expected = _reference_chain_keys(docs, tmp_path)
    assert expected
    home = tmp_path / "home"
    port = free_port()
    env = arena_env(
        home,
        ARENA_LLM=f"openai://127.0.0.1:{port}/v1?model=rules-v1",
        ARENA_LLM_TIMEOUT_S="5",
        ARENA_STAGE_CONCURRENCY="4",
    )
    with stack_stopped_after(env):
        run_arena(["publish", "tools", str(docs)], env)
        bootstrap = broker_of(home)
        server = llm_server(home / "serve", port, latency=0.3, stop=signal.SIGKILL)
        url = server.__enter__()
        sup = subprocess.Popen(
            [
                ARENA,
                "worker",
                *[a for s in STAGES for a in ("--stage", s)],
                "--until-drained",
                "--timeout",
                "400",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 180
            while _served(url) < 6:  # the chains stage is calling: mid-run
                assert time.monotonic() < deadline, "the chains stage never called the model server"
                assert sup.poll() is None, sup.communicate()[1][-3000:]
                time.sleep(0.2)
            server.__exit__(None, None, None)  # SIGKILL: in-flight requests fail, new ones are refused

            waiting: list[str] = []
            down_until = time.monotonic() + OUTAGE_S
            killed = False
            while time.monotonic() < down_until:
                waiting = [s.stage for s in read_states(home) if s.state == "waiting"]
                if "chains" in waiting and not killed:
                    lag = run_arena(["lag", "--group", "arena-chains"], env).stdout
                    assert "waiting on its LLM endpoint" in lag, lag
                    # And a worker dies while records are in flight: the supervisor restarts it.
                    for pid, cmd in descendants_of(sup.pid).items():
                        if "app.run chains" in cmd:
                            os.kill(pid, signal.SIGKILL)
                            killed = True
                time.sleep(0.2)
            assert killed, f"the chains worker never reported waiting for its endpoint: {read_states(home)}"

            with llm_server(
                home / "serve", port, latency=0.3, stop=signal.SIGKILL
            ) as url_again:  # the server comes back
                _, err = sup.communicate(timeout=400)
                assert _served(url_again) > 0
        finally:
            if sup.poll() is None:
                sup.kill()
        assert sup.returncode == 0, err[-3000:]
        assert (
            "waiting for LLM endpoint" in err
        )  # reported once, clearly (the killed worker never saw it end)

        assert _dead_letters(bootstrap) == {"tools.raw.dlq": 0, "tools.servers.dlq": 0}
        keys = sorted(r.key.decode() for r in read_all(bootstrap, "chains"))
        assert keys == expected  # nothing lost, nothing duplicated, same records as a clean run
        # The workers reported what the calls cost, per stage and role.
        usage = [json.loads(r.value) for r in read_all(bootstrap, "llm.usage")]
        assert sum(u["attempts"] for u in usage if u["stage"] == "chains") > 0
        assert {u["role"] for u in usage if u["stage"] == "chains"}


def test_a_wrong_api_key_is_one_clear_error_and_dead_letters_nothing(tmp_path: Path) -> None:
    home = tmp_path / "home"
    port = free_port()
    env = arena_env(
        home,
        ARENA_LLM=f"openai://127.0.0.1:{port}/v1?model=rules-v1",
        ARENA_LLM_API_KEY="sk-wrong-key-0123",
    )
    with stack_stopped_after(env), llm_server(home / "serve", port, latency=0.0, api_key="sk-right-key-4567"):
        run_arena(["publish", "tools", str(_docs(tmp_path))], env)
        bootstrap = broker_of(home)
        proc = run_arena(
            ["worker", *[a for s in STAGES for a in ("--stage", s)], "--until-drained", "--timeout", "240"],
            env,
            check=1,
        )
        err = proc.stderr
        assert "refuses Arena's requests" in err and "HTTP 401" in err and "ARENA_LLM_API_KEY" in err, err
        assert err.count("refuses Arena's requests") == 1
        assert "sk-wrong-key-0123" not in err + proc.stdout
        assert "Traceback" not in err
        assert _dead_letters(bootstrap) == {"tools.raw.dlq": 0, "tools.servers.dlq": 0}
        assert read_all(bootstrap, "chains") == []
        # The records wait in their topic: a later run with the right key would process them.
        pending = json.loads(run_arena(["lag", "--json", "--group", "arena-chains"], env).stdout)
        assert sum(row["pending"] for row in pending) > 0

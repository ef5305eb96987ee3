"""`bench/sandbox_pool.py --quick`: the bench runs end to end and prints its JSON.

The smoke run (a few seconds) makes the demo's verified environments in-process, then runs the
same seeded tool calls three ways -- a fresh interpreter per call, a forked session per call, and
calls on loaded sessions -- and checks the JSON's shape and that the figures hang together, not
how fast anything is (that is the bench's job, on a quiet machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.sandbox_pool import as_call

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (CI runs as root)")


def test_only_plain_tool_calls_are_calls() -> None:
    assert as_call("get_price(listing_id='L1', year=2024)") == (
        "get_price",
        {"listing_id": "L1", "year": 2024},
    )
    assert as_call("get_price('L1')") is None  # positional: the session call would need the signature
    assert as_call("get_price(listing_id=other())") is None
    assert as_call("x.get(1)") is None and as_call("not python(") is None


@pytest.mark.timeout(300)
def test_quick_run_prints_one_json_object(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sandbox_pool.py"), "--quick"],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    for key in ("fresh_calls_per_s", "fork_calls_per_s", "session_calls_per_s", "sessions_opened_per_s"):
        assert result[key] > 0, key
    assert result["fork_vs_fresh"] == pytest.approx(
        result["fork_calls_per_s"] / result["fresh_calls_per_s"], rel=0.01
    )
    assert result["session_vs_fresh"] == pytest.approx(
        result["session_calls_per_s"] / result["fresh_calls_per_s"], rel=0.01
    )
    for path in ("fresh", "fork", "session"):
        figures = result[path]
        assert figures["calls"] == 40 and 0 < figures["latency_p50_ms"] <= figures["latency_p99_ms"]
    assert 0 < result["environments"]["used"] <= result["environments"]["packages"]

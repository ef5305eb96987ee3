"""`bench/sandbox_pool.py`: which environment jobs it replays as tool calls.

Its `--quick` run (the demo's verified environments made in-process, then the same seeded tool
calls three ways: a fresh interpreter per call, a forked session per call, calls on loaded
sessions) and the checks on its JSON are in `tests/test_bench_quick.py`, with every other bench's.
"""

from __future__ import annotations

from bench.sandbox_pool import as_call


def test_only_plain_tool_calls_are_calls() -> None:
    assert as_call("get_price(listing_id='L1', year=2024)") == (
        "get_price",
        {"listing_id": "L1", "year": 2024},
    )
    assert as_call("get_price('L1')") is None  # positional: the session call would need the signature
    assert as_call("get_price(listing_id=other())") is None
    assert as_call("x.get(1)") is None and as_call("not python(") is None

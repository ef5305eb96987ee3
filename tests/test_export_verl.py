"""``arena export verl``: parquet in verl's agent-loop format, the tool config, the reward and the tool.

Packages are written by hand in the shape the environment track emits (lookup functions over
per-tool tables, one job per sub-question), checked in the real sandbox, and recorded in a real
catalog (SQLite) with their split. The export is read back with pyarrow; the exported
``reward.py`` is imported from the written file and compared with ``environments.rewards`` (with Arena
importable and standalone); ``tests/verl_tool_check.py`` then runs in the verl virtualenv
(``ARENA_VERL_PYTHON``, default ``.venv-verl/bin/python``), loads the tool config with verl's own
loader and executes every job through ``ArenaEnvTool`` in the sandbox. That test fails, never
skips, when the verl python is missing.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from arena.config import SandboxSettings
from arena.hashing import content_hash
from arena.records.envs import EnvJob, EnvPackage
from environments.environment import QaEnvironment
from environments.render import parse_assistant
from environments.rewards import ToolResult, f1_reward
from lake.env_packages import EnvPackageStore
from sandbox import SandboxPool
from sandbox.env_runtime import verify_package
from streams.envs.samples_verified import sample_of
from trainer.export_verl import REWARD_RULE_SOURCE, VERL_REWARD_SOURCE, export_verl, verl_tool_schema
from trainer.verl_reward import RULE_FILE

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[1]

# --------------------------------------------------------------------------- packages

LOOKUP = """
def _row(table, column, value):
    for row in DATA[table]:
        if str(row[column]).casefold() == str(value).strip().casefold():
            return row
    return None

"""


def lookup_tool(name: str, key: str, column: str, description: str) -> tuple[dict[str, Any], str]:
    """An OpenAI spec and its implementation: ``name(key)`` -> ``{column: value}`` from DATA[name]."""
    spec = {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {key: {"type": "string", "description": f"The {key}."}},
                "required": [key],
            },
        },
    }
    code = (
        f"def {name}({key}):\n"
        f"    row = _row({name!r}, {key!r}, {key})\n"
        f"    return {{{column!r}: row[{column!r}]}} if row else {{'error': 'not found'}}\n"
    )
    return spec, code


PRICE = lookup_tool("get_listing_price", "listing_id", "price", "Asking price of a listing.")
AGENT = lookup_tool("get_listing_agent", "listing_id", "agent_id", "Agent who lists a listing.")
AGENT_NAME = lookup_tool("get_agent_name", "agent_id", "name", "Full name of an agent.")
STOCK = lookup_tool("get_product_stock", "sku", "stock", "Units of a product in stock.")
LISTINGS = [
    {"listing_id": "L-101", "price": 450000, "agent_id": "A-01"},
    {"listing_id": "L-104", "price": 615000, "agent_id": "A-02"},
]
AGENTS = [{"agent_id": "A-01", "name": "Maria Lopez"}, {"agent_id": "A-02", "name": "Tom Becker"}]


def package(
    domain: str,
    question: str,
    answer: str,
    tools: list[tuple[dict[str, Any], str]],
    data: dict[str, list[dict[str, Any]]],
    jobs: list[tuple[str, str, str]],
) -> EnvPackage:
    """``jobs``: (sub-question, answer, invocation); each job's tool is its invocation's function."""
    body = {"domain": domain, "question": question, "jobs": jobs}
    return EnvPackage(
        env_id=content_hash(body, prefix="env-", length=16),
        qa_id=content_hash(body, prefix="qa-", length=16),
        seed_id="seed-test",
        domain=domain,
        structure="multi_hop" if len(jobs) > 1 else "single_hop",
        question=question,
        answer=answer,
        sub_qas=[],
        tools=[spec for spec, _ in tools],
        code=LOOKUP + "\n".join(code for _, code in tools),
        data=data,
        jobs=[
            EnvJob(index=i, question=q, answer=a, tool=inv.split("(")[0], invocation=inv)
            for i, (q, a, inv) in enumerate(jobs, start=1)
        ],
    )


def packages() -> dict[str, EnvPackage]:
    """Two real-estate packages sharing a tool (train), one e-commerce package (held out)."""
    return {
        "agent_name": package(
            "real_estate",
            "What is the name of the agent who lists L-104?",
            "Tom Becker",
            [AGENT, AGENT_NAME],
            {"get_listing_agent": LISTINGS, "get_agent_name": AGENTS},
            [
                ("Which agent lists L-104?", "A-02", "get_listing_agent(listing_id='L-104')"),
                ("What is the name of agent A-02?", "Tom Becker", "get_agent_name(agent_id='A-02')"),
            ],
        ),
        "price": package(
            "real_estate",
            "Which is more expensive, L-101 or L-104?",
            "L-104",
            [PRICE, AGENT],
            {"get_listing_price": LISTINGS, "get_listing_agent": LISTINGS},
            [
                ("What is the price of L-101?", "450000", "get_listing_price(listing_id='L-101')"),
                ("What is the price of L-104?", "615000", "get_listing_price(listing_id='L-104')"),
            ],
        ),
        "stock": package(
            "ecommerce",
            "How many units of SKU-9 are in stock?",
            "17",
            [STOCK],
            {"get_product_stock": [{"sku": "SKU-9", "stock": 17}, {"sku": "SKU-3", "stock": 0}]},
            [("How many units of SKU-9 are in stock?", "17", "get_product_stock(sku='SKU-9')")],
        ),
    }


def catalog(tmp_path: Path) -> EnvPackageStore:
    store = EnvPackageStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    pkgs = packages()
    store.record(pkgs["agent_name"], "train")
    store.record(pkgs["price"], "train")
    store.record(pkgs["stock"], "heldout")
    return store


def test_hand_written_packages_verify_in_the_sandbox() -> None:
    async def main() -> list[bool]:
        async with SandboxPool(SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 5.0})) as pool:
            outcomes = [o for p in packages().values() for o in await verify_package(p, pool)]
        return [o.passed for o in outcomes]

    assert asyncio.run(main()) == [True] * 5


# --------------------------------------------------------------------------- parquet + yaml


def test_export_writes_verl_agent_loop_rows(tmp_path: Path) -> None:
    out = tmp_path / "verl"
    summary = export_verl(catalog(tmp_path), out)
    assert summary.train == 2 and summary.test == 1
    assert summary.domains == {"arena/ecommerce": 1, "arena/real_estate": 2}
    assert sorted(summary.files) == sorted(
        ["train.parquet", "test.parquet", "tool_config.yaml", "arena_verl_tool.py", "reward.py", RULE_FILE]
    )
    pkgs = {p.env_id: p for p in packages().values()}

    for name, split, count in (("train", "train", 2), ("test", "test", 1)):
        rows = pq.read_table(out / f"{name}.parquet").to_pylist()
        assert len(rows) == count
        assert [r["extra_info"]["index"] for r in rows] == list(range(count))
        for row in rows:
            assert set(row) == {
                "data_source",
                "agent_name",
                "prompt",
                "ability",
                "reward_model",
                "extra_info",
            }
            info = row["extra_info"]
            pkg = pkgs[info["env_id"]]
            sample = sample_of(pkg)
            assert row["data_source"] == f"arena/{pkg.domain}"
            assert row["agent_name"] == "tool_agent" and row["ability"] == "tool-use"
            assert row["prompt"] == sample.prompt  # system + the main question
            assert row["reward_model"]["style"] == "rule"
            assert json.loads(row["reward_model"]["ground_truth"]) == sample.reward_spec
            assert info["split"] == split and info["need_tools_kwargs"] is True
            assert info["sample_id"] == sample.sample_id
            own = [t["function"]["name"] for t in pkg.tools]
            assert info["tool_selection"] == own
            # tools_kwargs is a struct over the file's tool names: the row's own are set, others null.
            for tool in own:
                create = info["tools_kwargs"][tool]["create_kwargs"]
                assert create["env_id"] == pkg.env_id
                assert EnvPackage.model_validate_json(create["package"]) == pkg
            assert all(v is None for k, v in info["tools_kwargs"].items() if k not in own)

    text = (out / "tool_config.yaml").read_text()
    assert "&id" not in text and "*id" not in text  # plain YAML, no anchors
    config = yaml.safe_load(text)
    names = [t["tool_schema"]["function"]["name"] for t in config["tools"]]
    # get_listing_agent is shared by both real-estate packages: one entry per distinct name.
    assert names == sorted(["get_agent_name", "get_listing_agent", "get_listing_price", "get_product_stock"])
    assert summary.tools == 4 and summary.schema_conflicts == []
    for entry in config["tools"]:
        assert entry["class_name"] == "arena_verl_tool.ArenaEnvTool"
        assert entry["config"] == {"type": "native"}
        assert entry["tool_schema"]["type"] == "function"
    assert config["tools"][2]["tool_schema"] == PRICE[0]  # Arena specs pass through unchanged
    assert (out / "arena_verl_tool.py").read_bytes() == (REPO / "trainer" / "verl_tool.py").read_bytes()


def test_conflicting_specs_and_schema_repair(tmp_path: Path) -> None:
    store = catalog(tmp_path)
    other = packages()["stock"].model_copy(update={"env_id": "env-stock-v2", "domain": "retail"})
    other.tools[0]["function"]["description"] = "Stock level (another wording)."
    store.record(other, "heldout")
    summary = export_verl(store, tmp_path / "verl", tool_config={"sandbox": "subprocess", "timeout_s": 3})
    assert summary.schema_conflicts == ["get_product_stock"]
    config = yaml.safe_load((tmp_path / "verl" / "tool_config.yaml").read_text())
    assert config["tools"][0]["config"] == {"type": "native", "sandbox": "subprocess", "timeout_s": 3}
    # verl needs a description and a type on every property; a bare spec gets them.
    bare = {"name": "f", "parameters": {"type": "object", "properties": {"x": {}}}}
    assert verl_tool_schema(bare) == {
        "type": "function",
        "function": {
            "name": "f",
            "description": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": []},
        },
    }


# --------------------------------------------------------------------------- reward.py


def load_reward(path: Path, standalone: bool) -> ModuleType:
    """Import the exported reward.py; ``standalone`` hides Arena's ``arena.tool_reward`` (as on a
    verl-only machine), so the module takes the rule from the exported copy beside it."""
    spec = importlib.util.spec_from_file_location(f"exported_reward_{standalone}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get("arena.tool_reward")
    if standalone:
        sys.modules["arena.tool_reward"] = None  # type: ignore[assignment]  # import now raises ImportError
    try:
        spec.loader.exec_module(module)
    finally:
        if standalone:
            sys.modules["arena.tool_reward"] = saved  # type: ignore[assignment]
    return module


def call(name: str, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def response(*outputs: str) -> str:
    """A tool-response user turn as verl decodes it (special tokens skipped: 'user' stays)."""
    return (
        "\nuser\n" + "\n".join(f"<tool_response>\n{o}\n</tool_response>" for o in outputs) + "\nassistant\n"
    )


JOBS = [{"index": 1, "question": "q1", "answer": "450000"}, {"index": 2, "question": "q2", "answer": "A-01"}]
TURNS = [
    # (assistant turns, tool outputs of successful calls, all responses)
    # 3 calls (one invalid JSON), 1 job solved: r = 1/2, p = 1/3, F1 = 2*(1/3)(1/2)/(1/3+1/2) = 0.4
    (
        [
            call("get_listing_price", {"listing_id": "L-101"}) + "\n<tool_call>\n{not json}\n</tool_call>",
            call("get_listing_agent", {"listing_id": "L-104"}),
            "It costs 450000.",
        ],
        ['{"price": 450000}', '{"agent_id": "A-02"}'],
        ['{"price": 450000}', '{"agent_id": "A-02"}'],
    ),
    # 2 calls, both jobs solved: r = 1, p = 2/2, F1 = 1
    (
        [
            call("get_listing_price", {"listing_id": "L-101"}),
            call("get_listing_agent", {"listing_id": "L-101"}),
            "ok",
        ],
        ['{"price": 450000}', '{"agent_id": "A-01"}'],
        ['{"price": 450000}', '{"agent_id": "A-01"}'],
    ),
    # an error observation never solves a job, even when it quotes the answer: n_hat = 0, F1 = 0
    (
        [call("get_listing_price", {"id": "450000"}), "no idea"],
        [],
        ["error: get_listing_price: unknown argument(s) 'id' (450000)"],
    ),
    # one output answers both jobs with one call: it solves one, r = 1/2, p = 1, F1 = 2/3 (was 4/3)
    ([call("lookup", {"x": 1}), "done"], ["450000 / a-01"], ["450000 / a-01"]),
    # a call cut off before </tool_call> still counts: c = 2, n_hat = 1, r = 1/2, p = 1/2, F1 = 1/2
    (
        [call("get_listing_price", {"listing_id": "L-101"}), '<tool_call>\n{"name": "get_li'],
        ['{"price": 450000}'],
        ['{"price": 450000}'],
    ),
    # no calls at all: F1 = 0
    (["I think the answer is 450000."], [], []),
]


def transcript(turns: list[str], responses: list[str]) -> str:
    """A decoded verl response: assistant turns with the tool responses after each calling turn."""
    text, queue = "", list(responses)
    for turn in turns:
        text += turn
        emitted = parse_assistant(turn).emitted
        if emitted and queue and "</tool_call>" in turn:
            text += response(*queue[:emitted])
            queue = queue[emitted:]
    return text


@pytest.mark.parametrize("standalone", [False, True])
def test_exported_reward_equals_trainer_rewards(tmp_path: Path, standalone: bool) -> None:
    path = tmp_path / "reward.py"
    path.write_text(VERL_REWARD_SOURCE.read_text())
    (tmp_path / RULE_FILE).write_text(REWARD_RULE_SOURCE.read_text())  # what export_verl writes beside it
    reward = load_reward(path, standalone)
    assert reward.FROM_ARENA is not standalone
    expected_f1 = [0.4, 1.0, 0.0, 2 / 3, 0.5, 0.0]
    truth = json.dumps({"jobs": JOBS, "answer": "450000"})
    for (turns, outputs, responses), f1 in zip(TURNS, expected_f1, strict=True):
        emitted = sum(parse_assistant(t).emitted for t in turns)
        results = [ToolResult(name="t", content=r, ok=r in outputs) for r in responses]
        want = f1_reward(JOBS, results, emitted)
        assert want.f1 == pytest.approx(f1, abs=1e-6)
        text = transcript(turns, responses)
        parsed_emitted, parsed = reward.parse_response(text)
        assert parsed_emitted == emitted
        assert [(r.content, r.ok) for r in parsed] == [(r.content, r.ok) for r in results]
        score = reward.compute_score("arena/real_estate", text, truth, extra_info={"index": 0})
        assert score["score"] == pytest.approx(want.f1)
        assert {k: score[k] for k in ("n", "n_hat", "c")} == {"n": 2, "n_hat": want.n_hat, "c": emitted}
        assert reward.compute_score("d", text, truth, mode="recall")["score"] == pytest.approx(want.recall)
        assert reward.compute_score("d", text, truth, mode="precision")["score"] == pytest.approx(
            want.precision
        )


# --------------------------------------------------------------------------- in a verl environment


def verl_python() -> str:
    return os.environ.get("ARENA_VERL_PYTHON", str(REPO / ".venv-verl" / "bin" / "python"))


def test_arena_tool_runs_in_a_verl_environment(tmp_path: Path) -> None:
    """Fails (never skips) when the verl virtualenv is missing: run scripts/install_verl.sh."""
    python = verl_python()
    assert Path(python).exists(), (
        f"verl python {python} is missing (set ARENA_VERL_PYTHON or run scripts/install_verl.sh)"
    )
    out = tmp_path / "verl"
    export_verl(catalog(tmp_path), out)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [python, str(REPO / "tests" / "verl_tool_check.py"), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=150,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["verl"] == "0.9.1"
    assert result["tools"] == 4
    assert result["calls"] == 5 and result["answered"] == 5  # every job of every package, via verl's loader
    assert result["scores"] == pytest.approx([1.0, 1.0, 1.0])  # a perfect transcript per package, reward.py
    assert result["subprocess_matches_sandbox"] is True
    assert result["errors_are_observations"] is True

    # verl's observations are the ones Arena's own rollouts see for the same calls.
    pkgs = {p.env_id: p for p in packages().values()}

    async def arena_texts() -> list[str]:
        async with SandboxPool(SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 5.0})) as pool:
            texts = []
            for obs in result["observations"]:
                pkg = pkgs[obs["env_id"]]
                env = QaEnvironment(sample_of(pkg), pkg, pool)
                try:
                    texts.append((await env.call(obs["tool"], obs["arguments"])).text)
                finally:
                    await env.close()
            return texts

    observed = [obs["text"] for obs in result["observations"]]
    assert len(observed) == 7  # 5 jobs + a missing and an unknown argument
    assert observed == asyncio.run(arena_texts())

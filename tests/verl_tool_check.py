"""ArenaEnvTool inside a real verl environment (run by the verl virtualenv's python, not by pytest).

    PYTHONPATH=<repo> .venv-verl/bin/python tests/verl_tool_check.py EXPORT_DIR

``tests/test_export_verl.py`` runs it on a fresh ``arena export verl`` folder. It loads the tool
config with verl's own loader (``verl.tools.tool_registry.initialize_tools_from_config``, which
imports ``arena_verl_tool`` from the export folder), reads both parquet files through verl's
``RLHFDataset`` (as the trainer does), and drives every job of every row through the tool the way verl's
``ToolAgentLoop._call_tool`` does (create with the row's ``create_kwargs``, execute, release), in
Arena's sandbox (needs root). Each package's transcript is scored by the exported ``reward.py``.
The ``subprocess`` runner must give the same observations as the sandbox. Prints one JSON line
(observations included, for the caller to compare with Arena's own environments); exits non-zero
on the first failed check.
"""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any


def invocation_call(invocation: str) -> tuple[str, dict[str, Any]]:
    """``f(a='x')`` -> ("f", {"a": "x"}) (jobs' invocations are calls with literal keyword arguments)."""
    node = ast.parse(invocation, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name), invocation
    return node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}


async def call_tool(tool: Any, arguments: dict[str, Any], tools_kwargs: dict[str, Any]) -> str:
    """As verl's ToolAgentLoop._call_tool does for a BaseTool."""
    kwargs = tools_kwargs.get(tool.name, {})
    instance_id, _ = await tool.create(create_kwargs=kwargs.get("create_kwargs", {}))
    try:
        response, step_reward, _metrics = await tool.execute(instance_id, arguments, agent_data=None)
    finally:
        await tool.release(instance_id)
    assert step_reward == 0.0
    assert await tool.calc_reward(instance_id) == 0.0
    return str(response.text)


def normalise(text: str) -> str:
    return " ".join(text.casefold().split())


async def check(out: Path) -> dict[str, Any]:
    sys.path.insert(0, str(out))
    import verl
    from omegaconf import OmegaConf
    from verl.tools.base_tool import BaseTool
    from verl.tools.tool_registry import initialize_tools_from_config
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from arena.records.envs import EnvPackage
    from sandbox.env_runtime import call_program

    tools = {t.name: t for t in initialize_tools_from_config(str(out / "tool_config.yaml"))}
    assert all(isinstance(t, BaseTool) and type(t).__name__ == "ArenaEnvTool" for t in tools.values())
    tool_module = sys.modules["arena_verl_tool"]
    spec = importlib.util.spec_from_file_location("arena_reward", out / "reward.py")
    assert spec is not None and spec.loader is not None
    reward = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reward)

    # verl's own dataset over both files (concatenated: they must share one schema), with the tool
    # config it reads to measure prompts.
    config = OmegaConf.create(
        {
            "return_raw_chat": True,
            "filter_overlong_prompts": False,
            "cache_dir": str(out / ".cache"),
            "tool_config_path": str(out / "tool_config.yaml"),
        }
    )
    dataset = RLHFDataset(
        [str(out / "train.parquet"), str(out / "test.parquet")], tokenizer=None, config=config
    )
    assert dataset.tool_schemas is not None and len(dataset.tool_schemas) == len(tools)
    rows = [dataset[i] for i in range(len(dataset))]
    calls = answered = 0
    scores: list[float] = []
    observations: list[dict[str, Any]] = []
    same = True
    for row in rows:
        info = row["extra_info"]
        tools_kwargs = row["tools_kwargs"]
        assert row["raw_prompt"][-1]["role"] == "user" and row["agent_name"] == "tool_agent"
        selected = info["tool_selection"]
        package = json.loads(tools_kwargs[selected[0]]["create_kwargs"]["package"])
        transcript = ""
        for job in package["jobs"]:
            name, arguments = invocation_call(job["invocation"])
            assert name in selected, (name, selected)
            text = await call_tool(tools[name], arguments, tools_kwargs)
            observations.append(
                {"env_id": package["env_id"], "tool": name, "arguments": arguments, "text": text}
            )
            calls += 1
            answered += normalise(job["answer"]) in normalise(text)
            call = json.dumps({"name": name, "arguments": arguments})
            transcript += f"<tool_call>\n{call}\n</tool_call>\nuser\n<tool_response>\n{text}\n</tool_response>\nassistant\n"
            # the standalone program is Arena's program, and the unsandboxed runner agrees
            model = EnvPackage.model_validate(package)
            standalone = tool_module.call_program_standalone(
                package["tools"], package["code"], package["data"], name, arguments
            )
            same &= standalone == call_program(model, name, arguments)
            plain = tool_module.ArenaEnvTool(
                {"type": "native", "sandbox": "subprocess"}, tools[name].tool_schema
            )
            same &= await call_tool(plain, arguments, tools_kwargs) == text
        transcript += f"The answer is {package['answer']}."
        result = reward.compute_score(
            row["data_source"], transcript, row["reward_model"]["ground_truth"], info
        )
        scores.append(result["score"])

    # Refused calls come back as observations, in Arena's words, from both runners.
    row = rows[0]
    name = row["extra_info"]["tool_selection"][0]
    errors = []
    for runner in ("arena", "subprocess"):
        tool = tool_module.ArenaEnvTool({"type": "native", "sandbox": runner}, tools[name].tool_schema)
        for arguments in ({}, {"nope": 1}):
            text = await call_tool(tool, arguments, row["extra_info"]["tools_kwargs"])
            errors.append(text)
            if runner == "arena":
                observations.append(
                    {
                        "env_id": row["extra_info"]["env_id"],
                        "tool": name,
                        "arguments": arguments,
                        "text": text,
                    }
                )
    errors_ok = all(e.startswith(f"error: {name}: ") for e in errors) and errors[:2] == errors[2:]

    # A warm pool (one per event loop) gives the same observation as a one-slot pool per call.
    warm = tool_module.ArenaEnvTool(
        {"type": "native", "warm_pool": True, "pool_size": 1}, tools[name].tool_schema
    )
    first = next(o for o in observations if o["tool"] == name)
    for _ in range(2):
        same &= await call_tool(warm, first["arguments"], row["extra_info"]["tools_kwargs"]) == first["text"]
    return {
        "verl": verl.__version__,
        "tools": len(tools),
        "calls": calls,
        "answered": answered,
        "scores": scores,
        "subprocess_matches_sandbox": bool(same),
        "errors_are_observations": errors_ok,
        "observations": observations,
    }


def main() -> None:
    result = asyncio.run(check(Path(sys.argv[1]).resolve()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""``arena export verl PATH``: the verified environments as a verl multi-turn GRPO job (issue 5, item 9).

Writes into ``PATH``:

- ``train.parquet`` (packages of split ``train``: what ``samples.verified`` carries) and
  ``test.parquet`` (held-out packages) in verl's agent-loop format: ``data_source``
  (``arena/<domain>``), ``agent_name`` (``tool_agent``), ``prompt`` (chat messages), ``ability``,
  ``reward_model`` (``{"style": "rule", "ground_truth": <reward_spec JSON>}``) and ``extra_info``
  (``index``, ``split``, ``need_tools_kwargs``, ``tools_kwargs`` per tool name with the package in
  ``create_kwargs``, and ``tool_selection``: the sample's own tools, so each prompt sees only them);
- ``tool_config.yaml``: one ``arena_verl_tool.ArenaEnvTool`` entry per distinct tool name;
- ``arena_verl_tool.py``: a copy of ``trainer/verl_tool.py``;
- ``reward.py``: a copy of ``trainer/verl_reward.py``: ``compute_score`` (the F1 reward of ASTRA eq.
  30-31 from the decoded response), and ``arena_tool_reward.py``, a copy of ``arena/tool_reward.py``:
  the rule it scores with when Arena is not installed (the same file the trainer uses).

Nested values that vary per row (the package, the reward spec) are JSON strings, so the parquet
schema stays small; ``tools_kwargs`` is a struct whose fields are every exported tool name (a row's
other tools are null; verl's agent loop never looks them up because of ``tool_selection``). Both
files share one schema.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from pydantic import BaseModel, Field

from arena import tool_reward
from arena.config import ArenaSettings
from arena.records.envs import EnvPackage, VerifiedSample
from lake.env_packages import EnvPackageStore, Split
from streams.envs.samples_verified import sample_of
from trainer.verl_reward import RULE_FILE

TOOL_CLASS = "arena_verl_tool.ArenaEnvTool"
AGENT_NAME = "tool_agent"
ABILITY = "tool-use"
VERL_TOOL_SOURCE = Path(__file__).with_name("verl_tool.py")
# verl loads the reward by path (custom_reward_function.path); the module also works without Arena.
VERL_REWARD_SOURCE = Path(__file__).with_name("verl_reward.py")
REWARD_RULE_SOURCE = Path(tool_reward.__file__)
"""The one reward rule; reward.py imports it from beside itself where Arena is not installed."""
SPLITS: dict[str, Split] = {"train": "train", "test": "heldout"}
"""verl file name -> Arena split."""


class ExportSummary(BaseModel):
    """What ``export_verl`` wrote."""

    out: Annotated[str, Field(description="Output folder.")]
    train: Annotated[int, Field(description="Rows in train.parquet (packages of split train).")]
    test: Annotated[int, Field(description="Rows in test.parquet (held-out packages).")]
    tools: Annotated[int, Field(description="Distinct tool names in tool_config.yaml.")]
    domains: Annotated[dict[str, int], Field(description="Rows per data_source, both files.")]
    schema_conflicts: Annotated[
        list[str],
        Field(
            description="Tool names whose specs differ between packages: verl holds one schema per "
            "name, so the first package's (by env_id) is the one the policy sees."
        ),
    ]
    files: Annotated[list[str], Field(description="Files written, relative to out.")]


def verl_tool_schema(spec: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI spec in the shape verl's ``OpenAIFunctionToolSchema`` validates.

    verl requires ``function.description`` and a ``type`` on every property; Arena's specs have
    both, but specs from other sources may not (a missing type becomes ``string``).
    """
    fn = dict(spec.get("function", spec))
    params = dict(fn.get("parameters") or {})
    properties = {
        name: {"type": "string", **prop} if isinstance(prop, dict) else {"type": "string"}
        for name, prop in (params.get("properties") or {}).items()
    }
    parameters = {"type": "object", "properties": properties, "required": list(params.get("required") or [])}
    function = {**fn, "description": str(fn.get("description") or fn["name"]), "parameters": parameters}
    return {"type": "function", "function": function}


def tool_names(sample: VerifiedSample) -> list[str]:
    return [str(t.get("function", t)["name"]) for t in sample.tools]


def verl_row(sample: VerifiedSample, package: EnvPackage, index: int, split: str) -> dict[str, Any]:
    """One parquet row for the agent loop (``tool_agent``) and the reward manager."""
    create = {"env_id": package.env_id, "package": package.model_dump_json()}
    names = tool_names(sample)
    return {
        "data_source": f"arena/{sample.domain}",
        "agent_name": AGENT_NAME,
        "prompt": [{"role": str(m["role"]), "content": str(m.get("content") or "")} for m in sample.prompt],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": json.dumps(sample.reward_spec, ensure_ascii=False)},
        "extra_info": {
            "index": index,
            "split": split,
            "sample_id": sample.sample_id,
            "env_id": package.env_id,
            "need_tools_kwargs": True,
            "tools_kwargs": {name: {"create_kwargs": create} for name in names},
            "tool_selection": names,
        },
    }


def _packages(store: EnvPackageStore, split: Split) -> list[EnvPackage]:
    packages = [EnvPackage.model_validate_json(row.package) for row in store.rows(split)]
    return sorted(packages, key=lambda p: p.env_id)  # the same catalog always exports the same files


def export_verl(
    source: ArenaSettings | EnvPackageStore, out: Path, *, tool_config: dict[str, Any] | None = None
) -> ExportSummary:
    """Write the verl job files into ``out`` (created if missing; existing files are replaced).

    Raises ``ValueError`` when the catalog holds no package (verl cannot train on empty files).

    ``tool_config`` is merged into every tool entry's ``config`` (e.g. ``{"sandbox": "subprocess"}``
    or sandbox limits, see ``trainer/verl_tool.py``).
    """
    store = source if isinstance(source, EnvPackageStore) else EnvPackageStore(source.catalog)
    try:
        packages = {name: _packages(store, split) for name, split in SPLITS.items()}
    finally:
        if store is not source:
            store.dispose()
    out.mkdir(parents=True, exist_ok=True)
    specs: dict[str, dict[str, Any]] = {}
    conflicts: set[str] = set()
    domains: Counter[str] = Counter()
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in SPLITS:
        rows[name] = []
        for index, package in enumerate(packages[name]):
            sample = sample_of(package)
            rows[name].append(verl_row(sample, package, index, name))
            domains[f"arena/{sample.domain}"] += 1
            for spec in sample.tools:
                tool = verl_tool_schema(spec)
                seen = specs.setdefault(tool["function"]["name"], tool)
                if seen != tool:
                    conflicts.add(tool["function"]["name"])
    # One schema for both files (tools_kwargs over every tool name), so they load together and an
    # empty split still has its columns.
    everything = [row for split_rows in rows.values() for row in split_rows]
    if not everything:
        raise ValueError("no verified packages in the catalog (run the environment track first)")
    schema = pa.Table.from_pylist(everything).schema
    files: list[str] = []
    for name, split_rows in rows.items():
        pq.write_table(pa.Table.from_pylist(split_rows, schema=schema), out / f"{name}.parquet")
        files.append(f"{name}.parquet")
    config = {"type": "native", **(tool_config or {})}
    entries = [
        {"class_name": TOOL_CLASS, "config": dict(config), "tool_schema": specs[n]} for n in sorted(specs)
    ]
    (out / "tool_config.yaml").write_text(
        yaml.safe_dump({"tools": entries}, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    shutil.copyfile(VERL_TOOL_SOURCE, out / "arena_verl_tool.py")
    shutil.copyfile(VERL_REWARD_SOURCE, out / "reward.py")
    shutil.copyfile(REWARD_RULE_SOURCE, out / RULE_FILE)
    files += ["tool_config.yaml", "arena_verl_tool.py", "reward.py", RULE_FILE]
    return ExportSummary(
        out=str(out),
        train=len(rows["train"]),
        test=len(rows["test"]),
        tools=len(specs),
        domains=dict(sorted(domains.items())),
        schema_conflicts=sorted(conflicts),
        files=files,
    )

"""Sub-environment merging (ASTRA §2.2.4): homogeneous sub-questions share one tool.

The ``homogeneous_groups`` role groups sub-questions with the same functional
intent. Per group a base is drawn (seeded); every other member is inserted in
turn: its rows join the base tool's data (duplicates dropped), its own tool and
function leave the package, and ``merge_invocation`` writes its call on the
base tool. After each insertion ALL jobs run again; an insertion that breaks
any job is undone and the member keeps its own tool, with the reason recorded.
The members' ``merge_invocation`` calls do not depend on earlier insertions, so they are asked
at once; the insertions themselves go one after another.
"""

from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass, field
from typing import Any

from arena import pyast
from arena.hashing import content_hash
from arena.llm.budget import ContextBudget
from arena.llm.core import Answer, InvalidOutput
from arena.llm.gateway import Gateway
from arena.records.envs import Cell, EnvJob, EnvPackage
from arena.records.tools import tool_name
from sandbox.env_runtime import Runner, verify_package
from synthesis.envs.env_synthesis import lineage, with_id
from synthesis.envs.roles.envs import (
    HOMOGENEOUS_GROUPS,
    MERGE_INVOCATION,
    HomogeneousInput,
    MergeInvocationInput,
    SubQuestionView,
    ToolInvocation,
    ToolSpec,
)
from synthesis.fanout import gather_all


@dataclass
class MergeResult:
    """The merged package (version 2) and what happened to each group member."""

    package: EnvPackage
    kept: dict[int, str] = field(default_factory=dict)
    """Members that keep their own tool, and why (the insertion broke a job, or no valid invocation)."""
    answers: list[Answer[Any]] = field(default_factory=list)


def dedupe_rows(rows: list[dict[str, Cell]]) -> list[dict[str, Cell]]:
    seen: set[str] = set()
    out: list[dict[str, Cell]] = []
    for row in rows:
        key = json.dumps(row, sort_keys=True, ensure_ascii=False)
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


def drop_function(code: str, name: str) -> str:
    """``code`` without its top-level function(s) ``name`` (decorators included)."""
    lines = code.splitlines(keepends=True)
    spans = [
        (min([n.lineno, *(d.lineno for d in n.decorator_list)]), n.end_lineno or n.lineno)
        for n in pyast.parse(code).body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
    ]
    for start, end in sorted(spans, reverse=True):
        del lines[start - 1 : end]
    return "".join(lines)


def clean_groups(groups: list[list[int]], indices: set[int]) -> list[list[int]]:
    """Groups restricted to job indices, each index once, two members or more."""
    seen: set[int] = set()
    out: list[list[int]] = []
    for group in groups:
        members = [i for i in dict.fromkeys(group) if i in indices and i not in seen]
        if len(members) > 1:
            seen |= set(members)
            out.append(members)
    return out


def insert(package: EnvPackage, base: EnvJob, member: EnvJob, invocation: str) -> EnvPackage:
    """``member`` answered by ``base``'s tool: rows joined, member's tool and function dropped."""
    jobs = [
        j.model_copy(update={"tool": base.tool, "invocation": invocation}) if j.index == member.index else j
        for j in package.jobs
    ]
    data = dict(package.data)
    data[base.tool] = dedupe_rows([*data.get(base.tool, []), *data.get(member.tool, [])])
    tools, code = package.tools, package.code
    if member.tool != base.tool and all(j.tool != member.tool for j in jobs):
        data.pop(member.tool, None)
        tools = [t for t in tools if tool_name(t) != member.tool]
        code = drop_function(code, member.tool)
    return package.model_copy(update={"jobs": jobs, "data": data, "tools": tools, "code": code})


def compact_tool(tool: dict[str, Any], level: int) -> dict[str, Any]:
    """``tool`` shortened for a small context window: 1 = parameter names only, 2 = name and required."""
    fn = tool.get("function", tool)
    params = fn.get("parameters", {}) if isinstance(fn.get("parameters"), dict) else {}
    out: dict[str, Any] = {"name": fn.get("name"), "required": params.get("required", [])}
    if level == 1:
        out |= {"description": fn.get("description", ""), "parameters": sorted(params.get("properties", {}))}
    return out


def fitted_views(views: list[SubQuestionView], budget: ContextBudget) -> HomogeneousInput:
    """The grouping input, its tool specs shortened until the prompt fits (the intent is in the names)."""
    inputs = HomogeneousInput(sub_questions=views)
    for level in (1, 2):
        if budget.fits(HOMOGENEOUS_GROUPS.messages(inputs)):
            break
        inputs = HomogeneousInput(
            sub_questions=[v.model_copy(update={"tool": compact_tool(v.tool, level)}) for v in views]
        )
    return inputs


async def find_groups(
    package: EnvPackage, gw: Gateway, budget: ContextBudget | None = None
) -> tuple[list[list[int]], list[Answer[Any]]]:
    if len(package.jobs) < 2:
        return [], []
    by_index = {q.index: q for q in package.sub_qas}
    tools = {tool_name(t): t for t in package.tools}
    views = [
        SubQuestionView(
            index=j.index,
            question=j.question,
            answer=j.answer,
            grounding=by_index[j.index].grounding if j.index in by_index else None,
            tool=tools.get(j.tool, {"name": j.tool}),
        )
        for j in package.jobs
    ]
    inputs = fitted_views(views, budget) if budget is not None else HomogeneousInput(sub_questions=views)
    answer = await gw.call(HOMOGENEOUS_GROUPS, inputs)
    return clean_groups(answer.output.groups, {j.index for j in package.jobs}), [answer]


def base_of(package: EnvPackage, group: list[int], seed: int) -> int:
    """The seeded random base of ``group`` (stable for a package and group)."""
    key = content_hash({"seed": seed, "env": package.env_id, "group": group}, length=16)
    return random.Random(int(key, 16)).choice(group)


async def merge_invocations(
    package: EnvPackage, bases: list[tuple[list[int], int]], gw: Gateway
) -> dict[int, Answer[ToolInvocation] | InvalidOutput | None]:
    """Every member's ``merge_invocation`` answer, asked at once, by member index.

    None where the base tool is missing (nothing to ask). What a member's call is asked depends
    only on ``package``, never on the insertions before it: an insertion changes the member's own
    job and drops the member's own tool, never a base job (groups are disjoint) nor a base tool (its
    base job still uses it). So the calls run concurrently, and the insertions, each re-running
    every job, still go one after another in group order.
    """
    jobs = {j.index: j for j in package.jobs}
    by_index = {q.index: q for q in package.sub_qas}
    members = [(base_index, i) for group, base_index in bases for i in group if i != base_index]

    async def ask(pair: tuple[int, int]) -> Answer[ToolInvocation] | InvalidOutput | None:
        base_index, index = pair
        base, member = jobs[base_index], jobs[index]
        base_tool = next((t for t in package.tools if tool_name(t) == base.tool), None)
        if base_tool is None:
            return None
        grounding = by_index[index].grounding if index in by_index else None
        inputs = MergeInvocationInput(
            base=ToolSpec.from_openai(base_tool),
            base_example=base.invocation,
            question=member.question,
            grounding=grounding,
        )
        try:
            return await gw.call(MERGE_INVOCATION, inputs)
        except InvalidOutput as exc:
            return exc

    answers = await gather_all(ask(pair) for pair in members)
    return {index: answer for (_, index), answer in zip(members, answers, strict=True)}


async def merge_package(
    package: EnvPackage, gw: Gateway, pool: Runner, *, seed: int = 0, budget: ContextBudget | None = None
) -> MergeResult:
    """Version 2 of ``package`` with homogeneous sub-environments merged; every job still passes.

    ``budget`` is the grouping role's context budget (tool specs are shortened to fit it).
    Raises ``InvalidOutput`` when the grouping role gives no valid answer.
    """
    groups, answers = await find_groups(package, gw, budget)
    bases = [(group, base_of(package, group, seed)) for group in groups]
    invocations = await merge_invocations(package, bases, gw)
    state = package
    kept: dict[int, str] = {}
    merged: list[list[int]] = []
    for group, base_index in bases:
        accepted = [base_index]
        for index in (i for i in group if i != base_index):
            jobs = {j.index: j for j in state.jobs}
            base, member = jobs[base_index], jobs[index]
            call = invocations[index]
            if call is None:
                kept[index] = f"the base tool {base.tool!r} is not among the package's tools"
                continue
            if isinstance(call, InvalidOutput):
                kept[index] = f"no valid merge invocation: {'; '.join(call.errors[-1:])}"
                continue
            answers.append(call)
            candidate = insert(state, base, member, call.output.invocation)
            failing = [o for o in await verify_package(candidate, pool) if not o.passed]
            if failing:
                kept[index] = (
                    f"inserting it into {base.tool} breaks job {failing[0].index}: {failing[0].error}"
                )
                continue
            state, accepted = candidate, [*accepted, index]
        if len(accepted) > 1:
            merged.append(sorted(accepted))
    before = package.tools_before_merge or len(package.tools)
    v2 = state.model_copy(
        update={
            "version": 2,
            "tools_before_merge": before,
            "merged_groups": merged,
            "lineage": {**package.lineage, **lineage(answers)},
        }
    )
    return MergeResult(with_id(v2), kept, answers)

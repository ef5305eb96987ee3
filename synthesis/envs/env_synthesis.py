"""Environment synthesis (ASTRA §2.2.3): a validated QA trace -> an executable ``EnvPackage``.

Every tool-needing sub-question (no-tool leaves are skipped) becomes a
sub-environment: tool spec -> complexity scaling -> [invocation ->
implementation -> sandbox verification], the bracket retried from the
invocation up to ``envs.synthesis_attempts`` times with the last failure as
feedback. Verification runs the execution contract of
``sandbox.env_runtime`` and then a tamper check: with the grounded row's
answer cell changed, the output must no longer contain the answer, so an
implementation that writes the answer as a literal never passes. The
sub-environments are then assembled into one package, which must pass every
job again as a whole.

A passage-grounded sub-question gets a tool over text: its data is the trace's
passage chunks as ``{"id", "text"}`` rows, and its tamper check removes the
answer from every chunk. The implementation prompt carries the rows that fit
the role's context budget (the grounded ones first); the tool's data is always
the whole table. What a prompt left out is recorded on the package
(``context_cut``, not part of its content hash).
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass, field
from typing import Any

from arena import pyast
from arena.config import ArenaSettings, EnvSettings
from arena.hashing import content_hash
from arena.llm.core import Answer, InvalidOutput
from arena.llm.gateway import Gateway
from arena.records.envs import (
    Cell,
    ContextCut,
    EnvJob,
    EnvPackage,
    Grounding,
    KbTable,
    QaTrace,
    SubQA,
    variant_name,
)
from sandbox.env_runtime import Runner, contains_answer, judge, normalise, program, verify_package
from synthesis.envs.context import role_budget
from synthesis.envs.kb_fit import fit_rows
from synthesis.envs.passages import chunk_passages
from synthesis.envs.roles.envs import (
    TOOL_IMPLEMENTATION,
    TOOL_INVOCATION,
    TOOL_SCALING,
    TOOL_SPEC,
    DependencyContext,
    ToolImplementationInput,
    ToolInvocationInput,
    ToolScalingInput,
    ToolSpec,
    ToolSpecInput,
)
from synthesis.fanout import gather_all

Rows = list[dict[str, Cell]]
SAMPLE_ROWS = 3
TAMPERED = "<changed by the tamper check>"


@dataclass
class SubEnvironment:
    """One verified sub-environment: a tool, its implementation, its data and the job it answers."""

    sub_qa: SubQA
    spec: ToolSpec
    invocation: str
    code: str
    rows: Rows
    cuts: list[ContextCut] = field(default_factory=list)
    """What the implementation prompt left out (context window)."""


@dataclass
class Built:
    """What building one sub-environment gave: the sub-environment or the last failure."""

    env: SubEnvironment | None
    attempts: int
    failure: str | None = None
    answers: list[Answer[Any]] = field(default_factory=list)


@dataclass
class SynthesisResult:
    """The package, or which sub-question failed and why; answers for lineage either way."""

    package: EnvPackage | None
    reason: str = ""
    """Why there is no package (empty when there is one)."""
    failed_index: int | None = None
    """The sub-question whose sub-environment failed every attempt, if one did."""
    attempts: dict[int, int] = field(default_factory=dict)
    """Attempts used per tool-needing sub-question index."""
    answers: list[Answer[Any]] = field(default_factory=list)


def package_id(package: EnvPackage) -> str:
    """Content hash of the package without its ``env_id``."""
    return content_hash(package.model_dump(mode="json", exclude={"env_id", "context_cut"}), prefix="env-")


def with_id(package: EnvPackage) -> EnvPackage:
    return package.model_copy(update={"env_id": package_id(package)})


def lineage(answers: list[Answer[Any]]) -> dict[str, str]:
    """Prompt version per role, plus the backend and model that answered."""
    out = {a.role: a.prompt_version for a in answers}
    if answers:
        out |= {"backend": answers[0].backend, "model": answers[0].model}
    return dict(sorted(out.items()))


def env_settings(settings: ArenaSettings | EnvSettings) -> EnvSettings:
    return settings.envs if isinstance(settings, ArenaSettings) else settings


def table_for(trace: QaTrace, grounding: Grounding | None) -> KbTable | None:
    if grounding is None or grounding.is_passage:
        return None
    return next((t for t in trace.knowledge.tables if t.name == grounding.table), None)


PASSAGE_COLUMNS = ["id", "text"]
"""Columns of a passage tool's rows: the chunk id and its text."""


def passage_rows(trace: QaTrace) -> Rows:
    """The trace's passage chunks as rows of a passage tool."""
    return [{"id": c.id, "text": c.text} for c in chunk_passages(trace.knowledge.passages)]


def grounded_rows(trace: QaTrace, grounding: Grounding | None) -> tuple[Rows, list[str]]:
    """The rows a sub-question's tool computes from, and their columns (none when ungrounded)."""
    if grounding is not None and grounding.is_passage:
        return passage_rows(trace), list(PASSAGE_COLUMNS)
    table = table_for(trace, grounding)
    return ([dict(r) for r in table.rows], list(table.columns)) if table else ([], [])


def grounds(row: dict[str, Cell], grounding: Grounding | None) -> bool:
    """Whether ``row`` is the one the grounding looks up (its key, or its chunk)."""
    if grounding is None:
        return False
    if grounding.is_passage:
        return row.get("id") == grounding.passage
    return normalise(str(row.get(grounding.key_column, ""))) == normalise(grounding.key)


def unique_names(specs: list[ToolSpec]) -> list[ToolSpec]:
    """Specs renamed ``name_2``, ``name_3``... where an earlier spec already took the name."""
    taken: set[str] = set()
    out: list[ToolSpec] = []
    for spec in specs:
        name, n = spec.name, 1
        while name in taken:
            n += 1
            name = variant_name(spec.name, n)
        taken.add(name)
        out.append(spec if name == spec.name else spec.model_copy(update={"name": name}))
    return out


async def design(
    trace: QaTrace, qa: SubQA, gw: Gateway, extra_params: int
) -> tuple[ToolSpec, list[Answer[Any]]]:
    """Tool spec, then complexity scaling (name and required parameters kept whatever the role says)."""
    table = table_for(trace, qa.grounding)
    rows, columns = grounded_rows(trace, qa.grounding)
    samples = [r for r in rows if grounds(r, qa.grounding)][:1] + [
        r for r in rows if not grounds(r, qa.grounding)
    ]
    by_index = {q.index: q for q in trace.sub_qas}
    spec_in = ToolSpecInput(
        domain=trace.domain,
        question=qa.question,
        answer=qa.answer,
        dependencies=[
            DependencyContext(index=d, question=by_index[d].question, answer=by_index[d].answer)
            for d in qa.depends_on
            if d in by_index
        ],
        grounding=qa.grounding,
        entity=table.entity if table else None,
        columns=columns,
        sample_rows=list(rows[:SAMPLE_ROWS]) if table else samples[:1],
    )
    spec = await gw.call(TOOL_SPEC, spec_in)
    scale_in = ToolScalingInput(spec=spec.output, extra_params=extra_params, columns=columns)
    scaled = await gw.call(TOOL_SCALING, scale_in)
    return keep_contract(spec.output, scaled.output), [spec, scaled]


def keep_contract(base: ToolSpec, scaled: ToolSpec) -> ToolSpec:
    """``scaled`` with the base name, required list and every base parameter (scaling only adds)."""
    properties = {**base.properties, **scaled.properties}
    for name, schema in base.properties.items():
        wider = scaled.properties.get(name, {}).get("enum")
        widened = isinstance(wider, list) and set(map(str, schema.get("enum", []))) <= set(map(str, wider))
        properties[name] = {**schema, "enum": wider} if "enum" in schema and widened else schema
    parameters = {**scaled.parameters, "properties": properties, "required": base.required}
    return ToolSpec(name=base.name, description=scaled.description, parameters=parameters)


def static_problem(spec: ToolSpec, code: str, invocation: str) -> str | None:
    """What is wrong before running anything: the function missing, or a call of another tool."""
    defined = {
        n.name for n in pyast.parse(code).body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    if spec.name not in defined:
        return f"the code defines no top-level function {spec.name!r} (defines: {sorted(defined)})"
    call = pyast.parse(invocation, mode="eval").body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == spec.name):
        return f"the invocation must call {spec.name}(...), got {invocation!r}"
    return None


def tampered(rows: Rows, grounding: Grounding | None, answer: str) -> Rows | None:
    """``rows`` with the grounded answer changed, or None when it cannot be found.

    A table grounding changes the grounded row's answer cell; a passage grounding removes the
    answer from the text of every chunk (a search tool may return any of them).
    """
    if grounding is None or normalise(answer) in normalise(TAMPERED):
        return None
    out = copy.deepcopy(rows)
    hit = False
    if grounding.is_passage:
        pattern = re.compile(re.escape(answer.strip()), re.IGNORECASE)
        for row in out:
            text = str(row.get("text", ""))
            if answer.strip() and pattern.search(text):
                row["text"] = pattern.sub(TAMPERED, text)
                hit = True
        return out if hit else None
    for row in out:
        if grounding.column in row and grounds(row, grounding):
            row[grounding.column] = TAMPERED
            hit = True
    return out if hit else None


async def sandbox_problem(
    qa: SubQA, spec: ToolSpec, code: str, invocation: str, rows: Rows, pool: Runner
) -> str | None:
    """Run the job; then run it on a tampered table, where the answer must disappear.

    Both programs run in one session, neither committed, so the second starts from the same fresh
    process the first did (as two one-off runs would), without opening a second session."""
    job = EnvJob(
        index=qa.index, question=qa.question, answer=qa.answer, tool=spec.name, invocation=invocation
    )
    session = await pool.open_session()
    try:
        outcome = judge(job, await session.run(program({spec.name: rows}, code, invocation), commit=False))
        if not outcome.passed:
            return f"{outcome.error}; output: {outcome.output[:200]!r}"
        changed = tampered(rows, qa.grounding, qa.answer)
        if changed is None:
            return None
        result = await session.run(program({spec.name: changed}, code, invocation), commit=False)
    finally:
        await session.close()
    if contains_answer(result, qa.answer):
        return (
            f"the output still contains {qa.answer!r} after the grounded {qa.grounding and qa.grounding.column} "
            f"was changed in the data: compute the answer from DATA[{spec.name!r}], never write it"
        )
    return None


def implementation_input(
    qa: SubQA,
    spec: ToolSpec,
    invocation: str,
    rows: Rows,
    columns: list[str],
    attempt: int,
    feedback: str | None,
    settings: ArenaSettings | EnvSettings,
) -> tuple[ToolImplementationInput, ContextCut | None]:
    """The implementation role's input with the rows that fit its budget (grounded first), and the cut."""
    full = ToolImplementationInput(
        question=qa.question,
        answer=qa.answer,
        spec=spec,
        invocation=invocation,
        data_key=spec.name,
        grounding=qa.grounding,
        columns=columns,
        rows=rows,
        attempt=attempt,
        feedback=feedback,
    )
    kept, cut = fit_rows(
        rows,
        lambda ks: TOOL_IMPLEMENTATION.messages(full.model_copy(update={"rows": [rows[k] for k in ks]})),
        role_budget(settings, TOOL_IMPLEMENTATION.name),
        TOOL_IMPLEMENTATION.name,
        lambda row: grounds(dict(row), qa.grounding),
    )
    if cut is None:
        return full, None
    return full.model_copy(update={"rows": [rows[k] for k in kept]}), cut


async def build(
    trace: QaTrace,
    qa: SubQA,
    spec: ToolSpec,
    gw: Gateway,
    pool: Runner,
    attempts: int,
    settings: ArenaSettings | EnvSettings | None = None,
) -> Built:
    """[invocation -> implementation -> sandbox] up to ``attempts`` times, each after the last failure."""
    rows, columns = grounded_rows(trace, qa.grounding)
    answers: list[Answer[Any]] = []
    cuts: list[ContextCut] = []
    feedback: str | None = None
    invalid: InvalidOutput | None = None
    checked = False  # whether any attempt got as far as a check (else it is an LLM-output failure)
    for attempt in range(1, attempts + 1):
        try:
            inv = await gw.call(
                TOOL_INVOCATION,
                ToolInvocationInput(
                    question=qa.question,
                    spec=spec,
                    grounding=qa.grounding,
                    attempt=attempt,
                    feedback=feedback,
                ),
            )
            answers.append(inv)
            impl_in, cut = implementation_input(
                qa,
                spec,
                inv.output.invocation,
                rows,
                columns,
                attempt,
                feedback,
                settings or EnvSettings.model_validate({}),
            )
            if cut is not None and not cuts:
                cuts.append(cut)  # the same rows are cut on every attempt: record it once
            impl = await gw.call(TOOL_IMPLEMENTATION, impl_in)
            answers.append(impl)
        except InvalidOutput as exc:
            invalid, feedback = exc, f"no valid {exc.role} output: {'; '.join(exc.errors[-1:])}"
            continue
        checked = True
        data = rows or [dict(r) for r in impl.output.rows]  # an ungrounded tool brings its own records
        code, invocation = impl.output.code, inv.output.invocation
        feedback = static_problem(spec, code, invocation) or await sandbox_problem(
            qa, spec, code, invocation, data, pool
        )
        if feedback is None:
            return Built(SubEnvironment(qa, spec, invocation, code, data, cuts), attempt, None, answers)
    if invalid is not None and not checked:
        raise invalid  # the model never produced usable output: dead-letter, not a sandbox rejection
    return Built(None, attempts, feedback, answers)


def assemble(trace: QaTrace, envs: list[SubEnvironment], answers: list[Answer[Any]]) -> EnvPackage:
    """One package: every tool function, its rows under DATA[name], one job per sub-environment."""
    package = EnvPackage(
        env_id="",
        qa_id=trace.qa_id,
        seed_id=trace.seed_id,
        domain=trace.domain,
        structure=trace.structure,
        question=trace.question,
        answer=trace.answer,
        sub_qas=list(trace.sub_qas),
        tools=[e.spec.openai() for e in envs],
        code="\n\n".join(e.code.strip() + "\n" for e in envs),
        data={e.spec.name: e.rows for e in envs},
        jobs=[
            EnvJob(
                index=e.sub_qa.index,
                question=e.sub_qa.question,
                answer=e.sub_qa.answer,
                tool=e.spec.name,
                invocation=e.invocation,
            )
            for e in envs
        ],
        version=1,
        tools_before_merge=len(envs),
        lineage=lineage(answers),
        context_cut=[c for e in envs for c in e.cuts],
    )
    return with_id(package)


async def synthesize_package(
    trace: QaTrace, gw: Gateway, pool: Runner, settings: ArenaSettings | EnvSettings
) -> SynthesisResult:
    """The verified package for ``trace``; raises ``InvalidOutput`` when a role never gave usable output."""
    cfg = env_settings(settings)
    steps = [qa for qa in trace.sub_qas if qa.needs_tool]
    if not steps:
        return SynthesisResult(None, reason="the trace has no tool-needing sub-question")
    designed = await gather_all(design(trace, qa, gw, cfg.extra_params) for qa in steps)
    answers = [a for _, got in designed for a in got]
    specs = unique_names([spec for spec, _ in designed])
    built = await gather_all(
        build(trace, qa, spec, gw, pool, cfg.synthesis_attempts, settings)
        for qa, spec in zip(steps, specs, strict=True)
    )
    answers += [a for b in built for a in b.answers]
    attempts = {qa.index: b.attempts for qa, b in zip(steps, built, strict=True)}
    for qa, b in zip(steps, built, strict=True):
        if b.env is None:
            reason = f"sub-question {qa.index} failed all {b.attempts} attempt(s); last: {b.failure}"
            return SynthesisResult(None, reason, qa.index, attempts, answers)
    package = assemble(trace, [b.env for b in built if b.env is not None], answers)
    failing = [o for o in await verify_package(package, pool) if not o.passed]
    if failing:
        first = failing[0]
        reason = f"assembled package: job {first.index} fails ({first.error}) though it passed alone"
        return SynthesisResult(None, reason, first.index, attempts, answers)
    return SynthesisResult(package, attempts=attempts, answers=answers)

"""Environment-track records (ASTRA §2.2) and the verified-sample schema.

Declared here so the topic registry is complete; the environment-track stages fill them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from arena.records.common import Record


class SubQA(Record):
    """One sub-question of a decomposed QA instance."""

    index: Annotated[int, Field(ge=1, description="Position in the trace (1-based).")]
    question: Annotated[str, Field(description="Sub-question q_i.")]
    answer: Annotated[str, Field(description="Sub-answer a_i.")]
    depends_on: list[int] = Field(default_factory=list, description="Indices of sub-questions d_i it needs.")
    needs_tool: Annotated[bool, Field(description="Whether answering needs a tool call.")] = True


class QaSeed(Record):
    """A main question or a knowledge source plus hop budget; value of ``qa.seeds``."""

    seed_id: Annotated[str, Field(description="Content hash of the seed.")]
    domain: Annotated[str, Field(description="Domain of the knowledge source.")]
    mode: Annotated[
        Literal["question", "unconditional"],
        Field(description="Question-conditional or knowledge-source mode."),
    ]
    question: Annotated[str | None, Field(description="Main question (question mode).")] = None
    knowledge: dict[str, Any] = Field(
        default_factory=dict, description="Knowledge source or a reference to it."
    )
    hop_budget: Annotated[int, Field(ge=1, le=16, description="Hop budget H.")] = 2


class QaTrace(Record):
    """A decomposed QA instance; value of ``qa.traces`` and ``qa.validated``."""

    qa_id: Annotated[str, Field(description="Content hash of the instance.")]
    seed_id: Annotated[str, Field(description="Seed it came from.")]
    domain: Annotated[str, Field(description="Domain.")]
    structure: Annotated[
        Literal["single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop"],
        Field(description="Dependency structure."),
    ]
    question: Annotated[str, Field(description="Main question q0.")]
    answer: Annotated[str, Field(description="Main answer a0.")]
    sub_qas: Annotated[list[SubQA], Field(min_length=1, description="Sub-QAs forming a DAG.")]
    scores: dict[str, float] = Field(default_factory=dict, description="DC, SA, SR, TC, QS once validated.")


class EnvPackage(Record):
    """An executable environment; value of ``envs.code`` and ``envs.verified``."""

    env_id: Annotated[str, Field(description="Content hash of the package.")]
    qa_id: Annotated[str, Field(description="QA instance it implements.")]
    domain: Annotated[str, Field(description="Domain.")]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tool specs.")]
    code: Annotated[str, Field(description="Python implementation of every tool.")]
    jobs: Annotated[
        list[dict[str, Any]], Field(description="Per sub-question: question, answer, invocation.")
    ]
    version: Annotated[int, Field(ge=1, description="Package version.")] = 1


class VerifiedSample(Record):
    """A sample the trainer can roll out and reward; value of ``samples.verified``."""

    sample_id: Annotated[str, Field(description="Content hash of the sample.")]
    kind: Annotated[
        Literal["qa", "interactive"],
        Field(description="QA environment (F1 reward) or interactive (verification function)."),
    ]
    prompt: Annotated[list[dict[str, Any]], Field(description="Initial OpenAI chat messages.")]
    tools: Annotated[list[dict[str, Any]], Field(description="OpenAI tools offered.")]
    env_ref: Annotated[str, Field(description="Package or instance id to load the environment from.")]
    reward_spec: Annotated[
        dict[str, Any], Field(description="Jobs (qa) or verification function reference (interactive).")
    ]
    domain: Annotated[str, Field(description="Domain.")]

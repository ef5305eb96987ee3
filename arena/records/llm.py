"""LLM accounting records: what each stage's calls cost, per role, per reporting window."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from arena.records.common import Record


class LlmUsage(Record):
    """One stage's LLM use for one role over one window of one worker process; value of ``llm.usage``.

    Counters are deltas for the window (sum them over windows and processes). Tokens are what
    the endpoint reported (the ``rules`` backend, which has no tokenizer, reports the estimate of
    ``arena.llm.budget``, about 3 characters a token); cache hits spend none.
    """

    stage: Annotated[str, Field(description="Stage whose records the calls were made for.")]
    role: Annotated[str, Field(description="LLM role, e.g. chain_synthesis.")]
    backend: Annotated[str, Field(description="Backend kind, e.g. openai.")]
    model: Annotated[str, Field(description="Model id as recorded in lineage.")]
    pid: Annotated[int, Field(description="Worker process id.")]
    window_start: Annotated[datetime, Field(description="Start of the window (UTC).")]
    window_end: Annotated[datetime, Field(description="End of the window (UTC).")]
    calls: Annotated[int, Field(ge=0, description="Gateway calls (cache hits included).")] = 0
    cache_hits: Annotated[int, Field(ge=0, description="Calls answered from the response cache.")] = 0
    shared: Annotated[int, Field(ge=0, description="Calls answered by an identical call in flight.")] = 0
    attempts: Annotated[int, Field(ge=0, description="Requests sent to the endpoint.")] = 0
    retries: Annotated[int, Field(ge=0, description="Requests beyond the first of a call.")] = 0
    transient_errors: Annotated[
        int, Field(ge=0, description="Requests that failed in transport or timed out.")
    ] = 0
    invalid_outputs: Annotated[int, Field(ge=0, description="Replies that were not valid for the role.")] = 0
    cut_off: Annotated[int, Field(ge=0, description="Replies cut at max_tokens (finish_reason=length).")] = 0
    refusals: Annotated[int, Field(ge=0, description="Replies that were empty or refused.")] = 0
    reasoning_stripped: Annotated[
        int, Field(ge=0, description="Valid replies with a think block in the text, set apart.")
    ] = 0
    json_unwrapped: Annotated[
        int, Field(ge=0, description="Valid replies whose JSON object came wrapped in prose or a fence.")
    ] = 0
    text_tool_calls: Annotated[
        int, Field(ge=0, description="Valid agent replies whose tool calls were written as text (Hermes).")
    ] = 0
    inputs_fitted: Annotated[
        int, Field(ge=0, description="Calls whose input was compacted to fit the context budget.")
    ] = 0
    failures: Annotated[int, Field(ge=0, description="Calls that ended in an error.")] = 0
    endpoint_waits: Annotated[int, Field(ge=0, description="Calls that waited out an endpoint outage.")] = 0
    prompt_tokens: Annotated[int, Field(ge=0, description="Prompt tokens spent.")] = 0
    completion_tokens: Annotated[int, Field(ge=0, description="Completion tokens spent.")] = 0

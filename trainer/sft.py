"""SFT on ``samples.sft``: the cold start before GRPO (ASTRA §3.1).

Loss is the token mean of the negative log-likelihood over the target side's
tokens only: assistant turns for ``role_target = agent``, user turns for
``role_target = user`` (user-simulator data: the same policy learns to speak
as the user when prompted with a user header). System prompts, tool outputs
and message headers never count. Micro-batches divide by the whole batch's
token count, so their summed gradient is the full batch's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Annotated

import torch
from pydantic import BaseModel, Field
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from arena.records.sft import SftSample
from environments.render import Tokenizer, render
from trainer.grpo import micro_batches
from trainer.policy import token_logprobs


class SftExample(BaseModel):
    """One rendered conversation, truncated to the sequence limit."""

    sample_id: Annotated[str, Field(description="Sample id in samples.sft.")]
    input_ids: Annotated[list[int], Field(description="Token ids of the whole conversation.")]
    loss_mask: Annotated[list[int], Field(description="1 on target-side tokens.")]


def sft_example(tokenizer: Tokenizer, sample: SftSample, max_len: int) -> SftExample:
    rendered = render(tokenizer, sample.messages, sample.tools, sample.role_target)
    return SftExample(
        sample_id=sample.sample_id,
        input_ids=rendered.input_ids[:max_len],
        loss_mask=rendered.loss_mask[:max_len],
    )


def cosine_schedule(optimizer: Optimizer, total_steps: int, warmup_ratio: float) -> LambdaLR:
    """Linear warmup over ``warmup_ratio`` of the steps, then cosine decay to 0 at ``total_steps``."""
    warmup = max(1, math.ceil(total_steps * warmup_ratio)) if warmup_ratio > 0 else 0

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return LambdaLR(optimizer, factor)


def pad(rows: Sequence[Sequence[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def sft_loss_backward(
    model: torch.nn.Module, examples: Sequence[SftExample], pad_id: int, micro: int
) -> tuple[float, int]:
    """Backward of the batch's token-mean NLL in micro-batches; returns (loss, target tokens)."""
    tokens = sum(sum(e.loss_mask) for e in examples)
    if tokens == 0:
        return 0.0, 0
    total = 0.0
    for part in micro_batches(len(examples), micro):
        chunk = examples[part]
        ids = pad([e.input_ids for e in chunk], pad_id)
        attention = pad([[1] * len(e.input_ids) for e in chunk], 0)
        mask = pad([e.loss_mask for e in chunk], 0).float()
        logprobs = token_logprobs(model, ids, attention)
        loss = -(logprobs * mask).sum() / tokens
        loss.backward()
        total += float(loss.detach())
    return total, tokens

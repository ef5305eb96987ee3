"""Log-probs of response tokens for the update, each distinct prompt run once.

The G rollouts of a prompt share it, and the prompt (system prompt, tool schemas, question) is
most of each sequence: run row by row, the update's forward and backward passes repeat it G
times. Here the distinct prompts run once (left-padded, with their keys/values kept, gradients
included), each response row continues from its prompt's keys/values, and the backward pass
sums the rows' gradients into the shared prompt pass: the same values and gradients as
``token_logprobs`` over every full row (up to float rounding), for about 1/G of the prompt work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from trainer.policy import _Layout, _logprob_of


def _right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    ids = torch.tensor([list(r) + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long)
    return ids, mask


def response_logprobs(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int
) -> torch.Tensor:
    """``[R, W]`` log-prob of each response token given its prompt and the response before it
    (0 in the right padding), differentiable; on CPU, whatever the model's device."""
    from transformers.cache_utils import DynamicCache

    if len(prompts) != len(responses) or not prompts or any(not p for p in prompts):
        raise ValueError("one non-empty prompt per response")
    device = next(model.parameters()).device
    index: dict[tuple[int, ...], int] = {}
    rows = [index.setdefault(tuple(p), len(index)) for p in prompts]
    prompt_ids, prompt_mask = _Layout([list(p) for p in index], [0] * len(index), pad_id).tensors(device)
    lm: Any = model
    cache = DynamicCache()
    position_ids = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    last = lm(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=position_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]  # predicts each response's first token (the prompts are right-aligned)
    pick = torch.tensor(rows, dtype=torch.long, device=device)
    layers: Any = cache.layers
    shared = [(layer.keys.index_select(0, pick), layer.values.index_select(0, pick)) for layer in layers]
    ids, mask = (t.to(device) for t in _right_padded(responses, pad_id))
    lengths = prompt_mask.sum(-1).index_select(0, pick)
    positions = lengths.unsqueeze(1) + torch.arange(ids.shape[1], device=device)
    logits = lm(
        input_ids=ids,
        attention_mask=torch.cat([prompt_mask.index_select(0, pick), mask], dim=1),
        position_ids=positions,
        past_key_values=DynamicCache(ddp_cache_data=shared),
        use_cache=True,
    ).logits
    first = _logprob_of(last.index_select(0, pick).float(), ids[:, 0]).unsqueeze(1)
    rest = _logprob_of(logits[:, :-1].float(), ids[:, 1:])
    return (torch.cat([first, rest], dim=1) * mask).cpu()

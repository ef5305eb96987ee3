"""Context budgets: what a prompt may hold so that prompt plus reply fit the endpoint's window.

An endpoint serves ``context_tokens`` (vLLM's ``max_model_len``); a request asking for
``max_tokens`` of reply may send at most ``context_tokens - max_tokens`` tokens of prompt, less a
margin for the chat template's own tokens. Arena has no tokenizer for a remote model, so prompts
are measured with a deliberately pessimistic estimate (``CHARS_PER_TOKEN``): BPE tokenizers
average 3.5 to 4.5 characters a token on English prose and JSON, so an estimate at 3 keeps a real
prompt under the budget rather than just over it.

Stages that embed a knowledge base or table rows fit them with ``fit_texts`` and record what they
cut. The gateway sends a longer prompt with its reply budget shrunk to the room left, and refuses
one that leaves less than ``MIN_REPLY_TOKENS`` (``PromptTooLong``) before sending it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arena.llm.core import Usage

CHARS_PER_TOKEN = 3
"""Characters per token of the estimate (pessimistic for English and JSON)."""
MESSAGE_OVERHEAD_TOKENS = 8
"""Template tokens around each chat message (role markers, separators)."""
TEMPLATE_MARGIN_TOKENS = 64
"""Kept free for the chat template's fixed tokens (generation prompt, tool preamble)."""
MIN_REPLY_TOKENS = 256
"""The least reply room a request is sent with: below it the prompt is too long to ask at all."""


def approx_tokens(text: str) -> int:
    """Estimated tokens of ``text`` (rounded up; 0 for the empty string)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def prompt_tokens(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
) -> int:
    """Estimated prompt tokens of chat ``messages`` (and the ``tools`` offered with them)."""
    total = 0
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        total += approx_tokens(text or "") + MESSAGE_OVERHEAD_TOKENS
        if message.get("tool_calls"):
            total += approx_tokens(json.dumps(message["tool_calls"], ensure_ascii=False))
    if tools:
        total += approx_tokens(json.dumps(list(tools), ensure_ascii=False))
    return total


def estimated_usage(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, reply: str
) -> Usage:
    """Estimated usage of one request and its ``reply`` text, for a backend without a tokenizer."""
    return Usage(
        prompt_tokens=prompt_tokens(messages, tools), completion_tokens=approx_tokens(reply), estimated=True
    )


@dataclass(frozen=True)
class ContextBudget:
    """The window of one endpoint and the reply budget of one role on it."""

    context_tokens: int
    """The endpoint's context window (``max_model_len``)."""
    reply_tokens: int
    """``max_tokens`` of the role's reply."""
    prompt_scale: float = 1.0
    """The endpoint's prompt tokens per estimated token (at least 1): what its own tokenizer counted
    over this module's estimate, learned by the gateway from the server's usage and refusals."""

    @property
    def prompt_tokens(self) -> int:
        """Most estimated prompt tokens a request should send: the window less the whole reply budget,
        or half the window when the reply budget alone would take more (the reply then shrinks)."""
        usable = self.context_tokens - TEMPLATE_MARGIN_TOKENS
        return int(max(usable - self.reply_tokens, usable // 2, 0) / self.prompt_scale)

    def fits(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> bool:
        """Whether the prompt leaves the whole reply budget free (what stages aim for)."""
        return prompt_tokens(messages, tools) <= self.prompt_tokens

    def reply_room(self, prompt: int) -> int:
        """Tokens a reply may take after a prompt of ``prompt`` estimated tokens (the reply budget at most)."""
        real = int(prompt * self.prompt_scale + 0.5)
        return max(0, min(self.reply_tokens, self.context_tokens - real - TEMPLATE_MARGIN_TOKENS))

    def too_long(self, prompt: int) -> bool:
        """Whether a prompt of ``prompt`` tokens leaves too little room to ask at all."""
        return self.reply_room(prompt) < min(self.reply_tokens, MIN_REPLY_TOKENS)


@dataclass(frozen=True)
class Fitted:
    """What ``fit_texts`` kept and what it cut."""

    kept: list[int]
    """Indices of the texts kept, in their input order."""
    cut: list[int]
    """Indices of the texts left out (they did not fit)."""
    tokens: int
    """Estimated tokens of the kept texts."""


def fit_texts(texts: Sequence[str], budget_tokens: int, order: Iterable[int] | None = None) -> Fitted:
    """Keep texts in ``order`` (most relevant first; default: as given) while they fit ``budget_tokens``.

    A text that does not fit is skipped, and a later, shorter one may still fit. Kept indices come
    back in input order so a table keeps its row order.
    """
    kept: list[int] = []
    used = 0
    for i in order if order is not None else range(len(texts)):
        cost = approx_tokens(texts[i]) + 1
        if used + cost <= budget_tokens:
            kept.append(i)
            used += cost
    chosen = set(kept)
    return Fitted(kept=sorted(kept), cut=[i for i in range(len(texts)) if i not in chosen], tokens=used)

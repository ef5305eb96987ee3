"""The trainer's user simulator: a causal LM speaking as the user (EigenData §5).

EigenData's accepted dialogues also train the user simulator (``samples.sft`` with
``role_target = user``). ``PolicyUserSimulator`` renders the user view of the dialogue so far
(``environments.user_view``), generates one user body after a *user* header and parses it back,
so a policy trained on user-view samples can play the user in interactive rollouts.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from environments.render import IM_END, IM_START, Tokenizer, encode_segment, render
from environments.user_view import STOP, ParsedUserTurn, UserContext, parse_user_turn, user_view_messages
from trainer.rollout import _generation_lock

if TYPE_CHECKING:
    from trainer.policy import RolloutBackend


def user_generation_header(tokenizer: Tokenizer) -> list[int]:
    """Ids of ``<|im_start|>user\\n``: the header a user body is generated after (tokenized alone,
    as ``render`` tokenizes every header, so the prompt matches what SFT trained on)."""
    return encode_segment(tokenizer, f"{IM_START}user\n")


def user_prompt_ids(tokenizer: Tokenizer, context: UserContext) -> list[int]:
    """The user-view conversation with the user tools as its tool list, then the user generation header.

    Rendered as the EigenData stage renders user-target SFT samples (``SftSample(messages=
    user_view_messages(...), tools=<the user tools>, role_target="user")``), so the prompt is
    token for token the prefix SFT trained the user's next body after.
    """
    messages = user_view_messages(
        context.instructions, context.requirements, context.user_tools, context.turns
    )
    return render(tokenizer, messages, context.user_tools).input_ids + user_generation_header(tokenizer)


def read_user_generation(tokenizer: Tokenizer, token_ids: Sequence[int]) -> ParsedUserTurn:
    """Parse a generated user body; an empty or message-less continuing turn is a stop.

    The body ends at the first ``<|im_end|>`` (or eos). Tool calls that parse are kept (they run
    even when the turn stops); a turn that would continue with nothing to say cannot go on, so it
    stops the dialogue instead of sending the agent an empty message.
    """
    text = str(
        tokenizer.decode(list(token_ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
    )
    text = text.split(IM_END, 1)[0]
    eos = getattr(tokenizer, "eos_token", None)
    if isinstance(eos, str) and eos:
        text = text.split(eos, 1)[0]
    parsed = parse_user_turn(text)
    if parsed.signal == "continue" and not parsed.message.strip():
        return parsed.model_copy(update={"signal": "stop"})
    return parsed


class PolicyUserSimulator:
    """A causal LM (the SFT-tuned policy, or a frozen copy of it) speaking as the user.

    Each reply renders ``user_view_messages`` of the dialogue so far, generates one user body
    after a *user* header and parses it with ``parse_user_turn``. The sampling seed derives from
    ``seed`` and the prompt ids, so a reply depends only on the dialogue (reproducible however
    concurrent rollouts interleave; rollouts with the same history get the same reply, their
    diversity comes from the agent). Generation takes the rollout's per-backend lock of
    ``lock_with`` (default: this backend): the HF backend seeds torch's global RNG, so a frozen
    user model must not sample while the agent's model does.
    """

    kind = "policy"

    def __init__(
        self,
        backend: RolloutBackend,
        tokenizer: Tokenizer,
        *,
        max_new_tokens: int = 256,
        max_seq_len: int = 4096,
        temperature: float = 1.0,
        seed: int = 0,
        lock_with: object | None = None,
    ) -> None:
        if max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        self.backend = backend
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.max_seq_len = max_seq_len
        self.temperature = temperature
        self.seed = seed
        self.lock_with = backend if lock_with is None else lock_with

    def reply_seed(self, prompt: Sequence[int]) -> int:
        """A 31-bit sampling seed from the simulator's seed and the prompt."""
        digest = hashlib.blake2b(json.dumps([self.seed, list(prompt)]).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") % (2**31 - 1)

    async def reply(self, context: UserContext) -> ParsedUserTurn:
        prompt = user_prompt_ids(self.tokenizer, context)
        budget = min(self.max_new_tokens, self.max_seq_len - len(prompt))
        if budget < 1:
            return STOP  # no room left to speak: the dialogue ends, the verifier decides
        async with _generation_lock(self.lock_with):
            generations = await asyncio.to_thread(
                self.backend.generate,
                [prompt],
                max_new_tokens=budget,
                temperature=self.temperature,
                seed=self.reply_seed(prompt),
            )
        return read_user_generation(self.tokenizer, generations[0].token_ids[:budget])

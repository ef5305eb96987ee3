"""The ``hf`` backend: a transformers causal LM from a local folder, in this process.

Loads lazily (on the first request, in a worker thread) with ``local_files_only=True``, so it
never downloads. Prompts go through the tokenizer's chat template; generation runs in a thread
under a lock (one generation at a time: the model is not re-entrant and the machine's cores are
better spent on one batch than on several fighting ones). There is no guided decoding here: the
gateway validates the text and retries, with a fresh seed per attempt.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arena.llm.backends import BackendError, LlmTarget
from arena.llm.core import Completion, CompletionRequest, Usage

if TYPE_CHECKING:
    from arena.config import ArenaSettings


class HfBackend:
    """transformers ``AutoModelForCausalLM`` + ``AutoTokenizer`` from ``path``."""

    name = "hf"

    def __init__(self, path: str | Path, device: str = "cpu") -> None:
        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise BackendError(
                f"hf backend: no model at {folder} (expected a local folder with config.json; "
                "nothing is downloaded)"
            )
        self.path = folder
        self.model = str(folder)
        self.device = device
        self._lock = threading.Lock()
        self._tokenizer: Any = None
        self._lm: Any = None

    def __repr__(self) -> str:
        return f"HfBackend({self.model!r}, device={self.device!r})"

    def _ensure_loaded(self) -> tuple[Any, Any]:
        """Tokenizer and model, loaded on first use (caller holds the lock)."""
        if self._lm is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
            if not getattr(tokenizer, "chat_template", None):
                raise BackendError(f"hf backend: the tokenizer at {self.path} has no chat template")
            lm: Any = AutoModelForCausalLM.from_pretrained(self.path, local_files_only=True)
            self._tokenizer, self._lm = tokenizer, lm.to(self.device).eval()
        return self._tokenizer, self._lm

    def _generate(self, request: CompletionRequest) -> Completion:
        import torch

        sampling = request.sampling
        with self._lock:
            tokenizer, lm = self._ensure_loaded()
            encoded = tokenizer.apply_chat_template(
                request.messages,
                tools=request.tools,
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
                return_tensors="pt",
            ).to(self.device)
            prompt_len = int(encoded["input_ids"].shape[1])
            kwargs: dict[str, Any] = {
                "max_new_tokens": sampling.max_tokens,
                "pad_token_id": tokenizer.pad_token_id
                if tokenizer.pad_token_id is not None
                else tokenizer.eos_token_id,
            }
            if sampling.temperature > 0:
                kwargs |= {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p}
            else:
                kwargs["do_sample"] = False
            # A private RNG stream per request: reproducible, and the process's global RNG untouched.
            with torch.random.fork_rng(devices=[]), torch.inference_mode():
                torch.manual_seed(sampling.seed + request.attempt)
                output = lm.generate(**encoded, **kwargs)
            new_tokens = output[0, prompt_len:]
            text = tokenizer.decode(new_tokens, skip_special_tokens=True)
            stopped = bool(new_tokens.shape[0]) and int(new_tokens[-1]) == tokenizer.eos_token_id
        cut = int(new_tokens.shape[0]) >= sampling.max_tokens and not stopped
        return Completion(
            text=text,
            usage=Usage(prompt_tokens=prompt_len, completion_tokens=int(new_tokens.shape[0])),
            finish_reason="length" if cut else "stop",
        )

    async def complete(self, request: CompletionRequest) -> Completion:
        return await asyncio.to_thread(self._generate, request)

    async def aclose(self) -> None:
        with self._lock:
            self._tokenizer = self._lm = None


def from_target(target: LlmTarget, settings: ArenaSettings) -> HfBackend:
    """The ``hf`` entry point: a local model folder."""
    assert target.path is not None
    return HfBackend(target.path)

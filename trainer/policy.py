"""The policy model and its rollout backends.

A rollout backend turns prompt token ids into sampled continuations with per-token log-probs. Two
backends share one Protocol: ``HfBackend`` (transformers ``generate``, CPU; the default and what
the tests run) and ``VllmBackend`` (the ``[gpu]`` extra). Log-probs are those of the untempered
(temperature-1) policy, the quantity ``token_logprobs`` gives the trainer, so the GRPO ratio of an
unchanged policy is exactly 1 for the hf backend.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Protocol

import torch
from pydantic import BaseModel, Field
from transformers import PreTrainedTokenizerBase

from environments.render import IM_END, encode_segment


class Generation(BaseModel):
    """One sampled continuation."""

    token_ids: Annotated[
        list[int], Field(description="Generated ids, ending with the stop id when finished.")
    ]
    logprobs: Annotated[
        list[float], Field(description="Log-prob of each generated id under the temperature-1 policy.")
    ]
    finished: Annotated[bool, Field(description="True when it ended with a stop id (<|im_end|>/eos).")]


class RolloutBackend(Protocol):
    """Samples continuations of token-id prompts; synced with the trained weights after each step."""

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]: ...

    def load_weights(self, model: torch.nn.Module) -> None: ...


# Log-probs -------------------------------------------------------------------
def _logprob_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] at every position (logits [..., V], targets [...])."""
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def token_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """``[B, T]`` log-prob of ``input_ids[:, t]`` given the tokens before it; 0 at t = 0 and padding.

    Differentiable. Position ids follow the attention mask, so left or right padding gives the
    same values as the unpadded sequence (up to float rounding).
    """
    mask = attention_mask.long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids).logits[:, :-1].float()
    picked = _logprob_of(logits, input_ids[:, 1:])
    # A token counts only when it and the one before are real: the first real token of a
    # left-padded row has no context, like position 0 of an unpadded one.
    valid = (mask[:, 1:] * mask[:, :-1]).to(picked.dtype)
    return torch.cat([picked.new_zeros(picked.shape[0], 1), picked * valid], dim=1)


def stop_ids_of(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """``<|im_end|>`` (must be one token) and the eos when it differs."""
    ids = encode_segment(tokenizer, IM_END)
    if len(ids) != 1:
        raise ValueError(f"tokenizer encodes {IM_END} as {ids}, not one token")
    eos = tokenizer.eos_token_id
    return ids if eos is None or eos in ids else [*ids, int(eos)]


@contextlib.contextmanager
def _seeded(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch for one generate call without disturbing the caller's RNG streams."""
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


# Backends --------------------------------------------------------------------
class HfBackend:
    """transformers ``generate`` on the policy module itself (CPU by default).

    Prompts are left-padded into one batch; sampling is plain (no top-k, top-p 1) at
    ``temperature`` (0 = greedy), seeded, so the same prompts, seed and weights give the same
    continuations. Log-probs are recomputed by one forward pass over prompt + continuation at
    temperature 1 (what ``token_logprobs`` gives the update), not taken from the sampler's scores.
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, stop_ids: list[int]
    ) -> None:
        if not stop_ids:
            raise ValueError("stop_ids must not be empty")
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = list(stop_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.stop_ids[0]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _sample(
        self, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int
    ) -> list[list[int]]:
        from transformers import GenerationConfig

        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        # Plain sampling from softmax(logits / temperature): no top-k, no nucleus.
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            **(sampling if temperature > 0 else {"do_sample": False}),
        )
        lm: Any = self.model  # a transformers model: nn.Module's typing does not know generate()
        with _seeded(seed, self.device), torch.no_grad():
            out = lm.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        return [row[width:] for row in out.tolist()]

    def _cut(self, row: list[int]) -> tuple[list[int], bool]:
        for i, tok in enumerate(row):
            if tok in self.stop_ids:
                return row[: i + 1], True
        return row, False

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        if not prompts:
            return []
        if any(not p for p in prompts):
            raise ValueError("empty prompt")
        cut = [self._cut(row) for row in self._sample(prompts, max_new_tokens, temperature, seed)]
        return [
            Generation(token_ids=toks, logprobs=self._continuation_logprobs(p, toks), finished=done)
            for p, (toks, done) in zip(prompts, cut, strict=True)
        ]

    def _continuation_logprobs(self, prompt: list[int], toks: list[int]) -> list[float]:
        """``token_logprobs`` of ``toks`` after ``prompt``, computing logits only where they are needed.

        One row at a time with ``logits_to_keep``: the output layer and log-softmax run over the
        continuation only, not the (long, tool-laden) prompt.
        """
        if not toks:
            return []
        ids = torch.tensor([prompt + toks], dtype=torch.long, device=self.device)
        lm: Any = self.model
        with torch.no_grad():
            logits = lm(input_ids=ids, logits_to_keep=len(toks) + 1).logits[0, :-1].float()
        return [float(v) for v in _logprob_of(logits, ids[0, -len(toks) :]).tolist()]

    def load_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do when sharing the trained module; otherwise copy its weights."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())


def _load_into_vllm(weights: list[tuple[str, torch.Tensor]], model: Any) -> None:
    """Runs inside each vLLM worker (module level so it pickles)."""
    model.load_weights(weights=weights)


class VllmBackend:
    """Rollouts on an in-process vLLM engine (``pip install arena[gpu]``; needs a GPU).

    Not exercised by the test suite (no GPU, no vllm in the default install). Each prompt gets
    its own sampling seed (``seed + i``), so results do not depend on batch composition. vLLM's
    returned log-probs are of the raw (untempered) model, matching ``token_logprobs`` up to kernel
    differences; the stop id is part of ``token_ids`` (vLLM appends the token, then checks stops).
    """

    def __init__(self, model_path: str, *, stop_ids: list[int] | None = None, **engine_kwargs: Any) -> None:
        # load_weights sends a function to the engine's worker processes (local, ours): newer vLLM
        # only pickles callables when this is set, and reads it when the engine starts.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        import vllm  # the [gpu] extra

        self._vllm = vllm
        self.llm = vllm.LLM(model=model_path, **engine_kwargs)
        if stop_ids is None:
            stop_ids = stop_ids_of(self.llm.get_tokenizer())
        self.stop_ids = list(stop_ids)

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        if not prompts:
            return []
        params = [
            self._vllm.SamplingParams(
                temperature=temperature,
                top_k=-1,  # disabled (newer vLLM also accepts 0)
                top_p=1.0,
                max_tokens=max_new_tokens,
                seed=seed + i,
                logprobs=0,  # the sampled token's log-prob only
                stop_token_ids=self.stop_ids,
                skip_special_tokens=False,
            )
            for i in range(len(prompts))
        ]
        inputs = [{"prompt_token_ids": p} for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        generations = []
        for output in outputs:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [
                float(step[tok].logprob) for tok, step in zip(ids, completion.logprobs or [], strict=True)
            ]
            finished = bool(ids) and ids[-1] in self.stop_ids
            generations.append(Generation(token_ids=ids, logprobs=logprobs, finished=finished))
        return generations

    def load_weights(self, model: torch.nn.Module) -> None:
        """Push the trained weights into every vLLM worker, then drop KV blocks cached under the old ones."""
        weights = [(name, t.detach().to("cpu")) for name, t in model.state_dict().items()]
        self.llm.apply_model(functools.partial(_load_into_vllm, weights))
        self.llm.reset_prefix_cache()


# Loading ---------------------------------------------------------------------
def load_policy(path: str | Path, device: str = "cpu") -> tuple[Any, PreTrainedTokenizerBase]:
    """The causal LM (float32) and tokenizer saved at ``path``; local files only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    return model.to(device), tokenizer

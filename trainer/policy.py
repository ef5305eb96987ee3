"""The policy model and its rollout backends.

A rollout backend turns prompt token ids into sampled continuations with per-token log-probs. Two
backends share one Protocol: ``HfBackend`` (transformers ``generate``, CPU; the default and what
the tests run) and ``VllmBackend`` (the ``[gpu]`` extra). Log-probs are those of the untempered
(temperature-1) policy, the quantity ``token_logprobs`` gives the trainer, so the GRPO ratio of an
unchanged policy is 1 up to float rounding (cached keys/values and incremental decoding round
differently from one full forward pass, as a vLLM engine's do).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol

import torch
from pydantic import BaseModel, Field
from transformers import PreTrainedTokenizerBase

from environments.render import IM_END, encode_segment
from trainer.prefix_cache import LayerKV, PrefixCache, batch_of, cacheable, rows_of, supported
from trainer.preflight import check_device, import_vllm

if TYPE_CHECKING:
    from arena.config import TrainSettings


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
    same values as the unpadded sequence (up to float rounding). Runs on the model's device; the
    result is on the inputs' device.
    """
    device = next(model.parameters()).device  # the inputs' device gets the result (the loss is cheap)
    ids = input_ids.to(device)
    mask = attention_mask.long().to(device)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits[:, :-1].float()
    picked = _logprob_of(logits, ids[:, 1:])
    # A token counts only when it and the one before are real: the first real token of a
    # left-padded row has no context, like position 0 of an unpadded one.
    valid = (mask[:, 1:] * mask[:, :-1]).to(picked.dtype)
    out = torch.cat([picked.new_zeros(picked.shape[0], 1), picked * valid], dim=1)
    return out.to(input_ids.device)


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


# Device and precision ------------------------------------------------------------
Precision = Literal["fp32", "bf16"]


def resolve_device(setting: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    check_device(setting)
    return setting


def resolve_precision(setting: str, device: str) -> Precision:
    """``auto`` -> bf16 on a GPU that supports it, fp32 otherwise."""
    if setting == "auto":
        return "bf16" if device == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if setting == "bf16" else "fp32"


def autocast(device: torch.device | str, precision: Precision) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast for forward passes (weights stay fp32), or nothing."""
    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


# Backends --------------------------------------------------------------------
LOGITS_BYTES = 512 * 2**20
"""Most bytes of sampling logits ``HfBackend`` keeps for log-probs (batch x new tokens x vocab x 4)."""
PREFIX_CACHE_BYTES = 1024 * 2**20
"""Default size of ``HfBackend``'s prefix KV cache (``trainer.prefix_cache``); 0 turns it off."""


class _Layout:
    """A generate batch: per row ``[pad][cached prefix][pad][new tokens]``, the prefixes ending at
    column ``cached`` and the new tokens at ``width`` (padding masked, positions from the mask)."""

    def __init__(self, prompts: list[list[int]], cached: list[int], pad_id: int) -> None:
        self.prompts, self.lengths, self.pad_id = prompts, cached, pad_id
        self.cached = max(cached, default=0)
        self.fresh = max(len(p) - c for p, c in zip(prompts, cached, strict=True))
        self.width = self.cached + self.fresh

    def _row(self, prompt: list[int], c: int) -> tuple[list[int], list[int]]:
        head, tail = self.cached - c, self.fresh - (len(prompt) - c)
        ids = [self.pad_id] * head + prompt[:c] + [self.pad_id] * tail + prompt[c:]
        return ids, [0] * head + [1] * c + [0] * tail + [1] * (len(prompt) - c)

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self._row(p, c) for p, c in zip(self.prompts, self.lengths, strict=True)]
        ids = torch.tensor([r[0] for r in rows], dtype=torch.long, device=device)
        return ids, torch.tensor([r[1] for r in rows], dtype=torch.long, device=device)

    def real_positions(self) -> list[list[int]]:
        """Per row, the columns holding its prompt's tokens, in order."""
        out = []
        for prompt, c in zip(self.prompts, self.lengths, strict=True):
            new = len(prompt) - c
            out.append([*range(self.cached - c, self.cached), *range(self.width - new, self.width)])
        return out


class HfBackend:
    """transformers ``generate`` on the policy module itself (CPU by default).

    Prompts are left-padded into one batch; sampling is plain (no top-k, top-p 1) at
    ``temperature`` (0 = greedy), seeded, so the same prompts, seed and weights give the same
    continuations. Log-probs are at temperature 1 (what ``token_logprobs`` gives the update), from
    the raw logits ``generate`` computed anyway: a second forward pass over prompt + continuation
    (a whole prefill again) would only repeat them, up to float rounding.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        stop_ids: list[int],
        *,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        precision: Precision = "fp32",
    ) -> None:
        if not stop_ids:
            raise ValueError("stop_ids must not be empty")
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = list(stop_ids)
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.stop_ids[0]
        self.precision: Precision = precision
        use_cache = prefix_cache_bytes > 0 and supported(model)
        self.prefix_cache = PrefixCache(model, prefix_cache_bytes) if use_cache else None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        embeddings: Any = self.model.get_output_embeddings()  # type: ignore[operator]
        return int(embeddings.weight.shape[0])

    def _sample(
        self, prompts: list[list[int]], max_new_tokens: int, temperature: float, seed: int
    ) -> tuple[list[list[int]], list[list[float]]]:
        """The sampled rows and each sampled token's log-prob at temperature 1.

        Row layout (``_Layout``): the row's cached prefix, right-aligned in the first ``C``
        columns (its keys/values come from the prefix cache), then its new tokens right-aligned
        in the last ``S``; padding in between is masked out, and positions follow the mask.
        """
        from transformers import GenerationConfig
        from transformers.cache_utils import DynamicCache

        keep_logits = len(prompts) * max_new_tokens * self.vocab_size * 4 <= LOGITS_BYTES
        prefixes = self._cached_prefixes(prompts)
        layout = _Layout(prompts, [len(ids) for ids, _kv in prefixes], self.pad_id)
        past = None
        if layout.cached:
            past = DynamicCache(ddp_cache_data=batch_of([kv for _ids, kv in prefixes], layout.cached))
        # Plain sampling from softmax(logits / temperature): no top-k, no nucleus.
        sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=keep_logits,  # raw logits, before temperature: no second pass needed
            **(sampling if temperature > 0 else {"do_sample": False}),
        )
        lm: Any = self.model  # a transformers model: nn.Module's typing does not know generate()
        ids, mask = layout.tensors(self.device)
        with _seeded(seed, self.device), torch.no_grad(), autocast(self.device, self.precision):
            out = lm.generate(
                input_ids=ids, attention_mask=mask, past_key_values=past, generation_config=config
            )
        new = out.sequences[:, layout.width :]
        rows: list[list[int]] = new.tolist()
        self._remember(prompts, layout, rows, out.past_key_values)
        if not keep_logits:  # too big to keep (large vocabulary x long batch): one row at a time
            return rows, [
                self._continuation_logprobs(p, r[: self._cut(r)]) for p, r in zip(prompts, rows, strict=True)
            ]
        if not rows[0]:
            return rows, [[] for _ in rows]
        # One step at a time: never a second [B, new, V] copy of the kept logits.
        picked = [_logprob_of(step.float(), new[:, t]) for t, step in enumerate(out.logits)]
        return rows, torch.stack(picked, dim=1).tolist()

    def _cached_prefixes(self, prompts: list[list[int]]) -> list[tuple[tuple[int, ...], list[LayerKV]]]:
        """Per prompt, its longest cached prefix (ids, keys/values); prompts with none are run first,
        each distinct one once (the G rollouts of a prompt share it)."""
        cache = self.prefix_cache
        if cache is None:
            return [((), []) for _ in prompts]
        cache.check_weights()
        missing = list(dict.fromkeys(tuple(p[:-1]) for p in prompts if len(p) > 1 and not cache.longest(p)))
        if missing:
            self._prefill([list(m) for m in missing])
        found = [cache.longest(p) for p in prompts]
        return [hit if hit is not None else ((), []) for hit in found]

    def _prefill(self, prefixes: list[list[int]]) -> None:
        """Run ``prefixes`` through the model (left-padded, one batch) and cache their keys/values."""
        from transformers.cache_utils import DynamicCache

        assert self.prefix_cache is not None
        layout = _Layout(prefixes, [0] * len(prefixes), self.pad_id)
        ids, mask = layout.tensors(self.device)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        lm: Any = self.model
        with torch.no_grad(), autocast(self.device, self.precision):
            lm(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                past_key_values=cache,
                logits_to_keep=1,
            )
        if not cacheable(cache):
            self.prefix_cache = None  # sliding windows or offloaded layers: run every context in full
            return
        for prefix, kv in zip(prefixes, rows_of(cache, layout.real_positions()), strict=True):
            self.prefix_cache.put(tuple(prefix), kv)

    def _remember(self, prompts: list[list[int]], layout: _Layout, rows: list[list[int]], past: Any) -> None:
        """Cache each row's prompt + generated tokens (what the model ran), replacing its prefix."""
        cache = self.prefix_cache
        if cache is None or past is None or not rows or not rows[0]:
            return
        if not cacheable(past):
            self.prefix_cache = None
            return
        ran = len(rows[0]) - 1  # the last sampled token was never fed back
        keeps = [min(self._cut(row), ran) for row in rows]
        positions = [
            [*real, *range(layout.width, layout.width + keep)]
            for real, keep in zip(layout.real_positions(), keeps, strict=True)
        ]
        for prompt, row, keep, kv in zip(prompts, rows, keeps, rows_of(past, positions), strict=True):
            ids = (*prompt, *row[:keep])
            cache.drop_prefixes_of(ids)
            cache.put(ids, kv)

    def _cut(self, row: list[int]) -> int:
        """Length of ``row`` up to and including its first stop token (all of it when none)."""
        for i, tok in enumerate(row):
            if tok in self.stop_ids:
                return i + 1
        return len(row)

    def generate(
        self, prompts: list[list[int]], *, max_new_tokens: int, temperature: float, seed: int
    ) -> list[Generation]:
        if not prompts:
            return []
        if any(not p for p in prompts):
            raise ValueError("empty prompt")
        rows, logprobs = self._sample(prompts, max_new_tokens, temperature, seed)
        out = []
        for row, row_logprobs in zip(rows, logprobs, strict=True):
            n = self._cut(row)
            finished = n > 0 and row[n - 1] in self.stop_ids
            out.append(Generation(token_ids=row[:n], logprobs=row_logprobs[:n], finished=finished))
        return out

    def _continuation_logprobs(self, prompt: list[int], toks: list[int]) -> list[float]:
        """``token_logprobs`` of ``toks`` after ``prompt``, computing logits only where they are needed.

        One row at a time with ``logits_to_keep``: the output layer and log-softmax run over the
        continuation only, not the (long, tool-laden) prompt.
        """
        if not toks:
            return []
        ids = torch.tensor([prompt + toks], dtype=torch.long, device=self.device)
        lm: Any = self.model
        with torch.no_grad(), autocast(self.device, self.precision):
            logits = lm(input_ids=ids, logits_to_keep=len(toks) + 1).logits[0, :-1].float()
        return [float(v) for v in _logprob_of(logits, ids[0, -len(toks) :]).tolist()]

    def load_weights(self, model: torch.nn.Module) -> None:
        """Nothing to do when sharing the trained module; otherwise copy its weights."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())


def vllm_engine_args(precision: Precision, gpu_memory: float, extra: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` for a rollout engine beside the trained policy on one GPU.

    The engine generates in the policy's forward precision (bf16, else fp32: vLLM's "auto" would take
    the checkpoint's dtype) and takes ``gpu_memory`` of the GPU (vLLM's own default, 0.9, leaves too
    little for training); ``extra`` (``train.vllm_engine_args``) wins over both.
    """
    return {
        "dtype": "bfloat16" if precision == "bf16" else "float32",
        "gpu_memory_utilization": gpu_memory,
        **extra,
    }


def _load_into_vllm(weights: list[tuple[str, torch.Tensor]], model: Any) -> None:
    """Runs inside each vLLM worker (module level so it pickles)."""
    model.load_weights(weights=weights)


class VllmBackend:
    """Rollouts on an in-process vLLM engine (``pip install arena[gpu]``; needs a GPU).

    The test suite checks only how ``Learner.load`` starts it (no GPU, no vllm in the default
    install); ``bench/vllm_rollouts.py`` runs GRPO steps on it on a GPU. Each prompt gets
    its own sampling seed (``seed + i``), so results do not depend on batch composition. vLLM's
    returned log-probs are of the raw (untempered) model, matching ``token_logprobs`` up to kernel
    differences; the stop id is part of ``token_ids`` (vLLM appends the token, then checks stops).
    """

    def __init__(self, model_path: str, *, stop_ids: list[int] | None = None, **engine_kwargs: Any) -> None:
        # load_weights sends a function to the engine's worker processes (local, ours): newer vLLM
        # only pickles callables when this is set, and reads it when the engine starts.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        vllm = import_vllm()
        self._vllm = vllm
        self.llm = vllm.LLM(model=model_path, **engine_kwargs)
        if stop_ids is None:
            stop_ids = stop_ids_of(self.llm.get_tokenizer())
        self.stop_ids = list(stop_ids)

    @classmethod
    def for_settings(
        cls, model_path: str, tokenizer: PreTrainedTokenizerBase, precision: Precision, cfg: TrainSettings
    ) -> VllmBackend:
        """The engine ``train`` settings ask for (``vllm_engine_args``), stopping at the tokenizer's stops."""
        engine = vllm_engine_args(precision, cfg.vllm_gpu_memory, cfg.vllm_engine_args)
        return cls(model_path, stop_ids=stop_ids_of(tokenizer), **engine)

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

    def logprobs_of(self, prompt: list[int], tokens: list[int]) -> list[float]:
        """The engine's log-prob of each of ``tokens`` after ``prompt`` and the tokens before it
        (its prompt log-probs, untempered): what a weight sync is checked against."""
        params = self._vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        output = self.llm.generate([{"prompt_token_ids": prompt + tokens}], params, use_tqdm=False)[0]
        rows = output.prompt_logprobs or []
        return [float(rows[len(prompt) + i][tok].logprob) for i, tok in enumerate(tokens)]

    def load_weights(self, model: torch.nn.Module) -> None:
        """Push the trained weights into every vLLM worker, then drop KV blocks cached under the old ones."""
        weights = [(name, t.detach().to("cpu")) for name, t in model.state_dict().items()]
        self.llm.apply_model(functools.partial(_load_into_vllm, weights))
        self.llm.reset_prefix_cache()


# Loading ---------------------------------------------------------------------
def load_policy(path: str | Path, device: str = "cpu") -> tuple[Any, PreTrainedTokenizerBase]:
    """The causal LM (float32, on ``device``) and tokenizer saved at ``path``; local files only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, local_files_only=True)
    return model.to(device), tokenizer

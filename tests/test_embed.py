"""arena.embed's numpy encoder gives sentence-transformers' all-MiniLM-L6-v2 vectors.

The reference runs in ``.venv-bfcl`` (tests/embed_reference.py; bfcl-eval depends on
sentence-transformers): the main virtualenv leaves sentence-transformers out, with the scikit-learn it
brings, which transformers would import in every process that loads a model.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np

from arena.embed import DIM, embed_texts

REFERENCE = Path(__file__).with_name("embed_reference.py")


def bfcl_python() -> Path:
    """As trainer.benchmarks.bfcl.bfcl_python (importing that module here would load transformers)."""
    return Path(
        os.environ.get("ARENA_BFCL_PYTHON") or REFERENCE.parent.parent / ".venv-bfcl" / "bin" / "python"
    )


TEXTS = [
    "hello world",
    "",
    "Book a flight from Paris to Tokyo on 2024-05-01 for two adults, economy class.",
    "ünïcödé 東京 🚀 tëst",
    "word " * 400,  # past the 256-token limit: truncated the same way
    "get_weather(city: str) -> Returns the current weather for a city.",
    *[f"tool number {i} does thing {i * 7}" for i in range(40)],  # more than one batch
]


def _reference_vectors(tmp_path: Path) -> np.ndarray:
    """sentence-transformers' own vectors of TEXTS, from the bfcl virtualenv's python (a failure, never
    a skip, when it is missing)."""
    from arena.embed import _model_dir

    python = bfcl_python()
    assert python.exists(), (
        f"no python at {python} for the sentence-transformers reference "
        "(fix: run scripts/install_bfcl.sh, or set ARENA_BFCL_PYTHON)"
    )
    texts, out = tmp_path / "texts.json", tmp_path / "vectors.npy"
    texts.write_text(json.dumps(TEXTS), encoding="utf-8")
    done = subprocess.run(
        [str(python), "-I", str(REFERENCE), str(_model_dir()), str(texts), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(out)


def test_vectors_match_sentence_transformers(tmp_path: Path) -> None:
    expected = _reference_vectors(tmp_path)
    got = embed_texts(TEXTS)
    assert got.shape == (len(TEXTS), DIM) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=2e-6)


def test_a_text_embeds_the_same_alone_and_in_a_batch_and_is_unit_length() -> None:
    batch = embed_texts(TEXTS[:6])
    for i, text in enumerate(TEXTS[:6]):
        np.testing.assert_allclose(embed_texts([text])[0], batch[i], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-6)
    assert embed_texts([]).shape == (0, DIM)


def test_similar_texts_are_closer_than_unrelated_ones() -> None:
    flight, trip, soup = embed_texts(
        ["book a flight to Tokyo", "reserve a plane ticket to Japan", "tomato soup recipe"]
    )
    assert float(flight @ trip) > float(flight @ soup) + 0.2

"""arena.embed's numpy encoder gives sentence-transformers' all-MiniLM-L6-v2 vectors."""

from __future__ import annotations

import numpy as np
import pytest

from arena.embed import DIM, embed_texts

TEXTS = [
    "hello world",
    "",
    "Book a flight from Paris to Tokyo on 2024-05-01 for two adults, economy class.",
    "ünïcödé 東京 🚀 tëst",
    "word " * 400,  # past the 256-token limit: truncated the same way
    "get_weather(city: str) -> Returns the current weather for a city.",
    *[f"tool number {i} does thing {i * 7}" for i in range(40)],  # more than one batch
]


def test_vectors_match_sentence_transformers() -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from arena.embed import _model_dir

    reference = sentence_transformers.SentenceTransformer(str(_model_dir()), device="cpu")
    expected = reference.encode(TEXTS, batch_size=32, normalize_embeddings=True, show_progress_bar=False)
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

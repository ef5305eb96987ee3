"""Domain taxonomy and classification (synthesis/sft/domains.py)."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import numpy as np
import pytest

from arena.embed import embed_texts
from producers.tool_docs import load_tool_docs
from synthesis.sft.domains import (
    DOMAINS,
    FALLBACK_DOMAIN,
    LABELS_FILE,
    MAX_TEXT_CHARS,
    DomainMatch,
    classify_domain,
    domain_names,
    label_embeddings,
    labels_key,
    saved_labels,
    server_text,
    write_labels_file,
)
from synthesis.tools.normalize import normalize_server, server_gate

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "tools"


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> None:
    import torch

    torch.set_num_threads(1)


def test_taxonomy_has_41_distinct_labels() -> None:
    assert len(DOMAINS) == 41
    assert len(set(domain_names())) == 41
    assert all(d.description and len(d.text) < 200 for d in DOMAINS)
    assert {"Finance", "E-commerce", "Real Estate", "Healthcare", "Weather", "Travel"} <= set(domain_names())


def test_label_embeddings_are_cached_unit_vectors() -> None:
    a = label_embeddings()
    assert a.shape == (41, 384) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-4)
    assert label_embeddings() is a


def test_the_saved_label_embeddings_are_the_encoders(tmp_path: Path) -> None:
    saved = saved_labels()
    assert saved is not None, (
        f"{LABELS_FILE} is missing or was made for other labels or another model (fix: python -c "
        "'from synthesis.sft.domains import write_labels_file; write_labels_file()')"
    )
    computed = embed_texts([d.text for d in DOMAINS])
    assert np.allclose(saved, computed, atol=1e-5)
    # A file made for another key is not used; one written anew is, and equals the encoder's.
    other = tmp_path / "labels.npz"
    np.savez(other, key=np.array("another key"), vectors=computed)
    assert saved_labels(other) is None and saved_labels(tmp_path / "missing.npz") is None
    torn = tmp_path / "torn.npz"
    torn.write_bytes(LABELS_FILE.read_bytes()[:100])  # a cut-off copy reads as no file
    assert saved_labels(torn) is None
    assert np.array_equal(saved_labels(write_labels_file(other)), computed)
    assert labels_key() == labels_key() and len(labels_key()) == 32


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (
            [
                "open-weather",
                "get_current_weather: Current temperature, wind and rain at a location",
                "get_forecast: 7-day forecast",
            ],
            "Weather",
        ),
        (
            [
                "estate-agent",
                "search_listings: Find houses and apartments for sale or rent",
                "get_mortgage_rate: Current mortgage rates",
            ],
            "Real Estate",
        ),
        (
            [
                "clinic",
                "book_appointment: Book an appointment with a doctor",
                "check_symptoms: Possible conditions for symptoms",
            ],
            "Healthcare",
        ),
        (
            [
                "github",
                "create_issue: Open an issue in a repository",
                "list_pull_requests: Pull requests of a repo",
            ],
            "Developer Tools",
        ),
    ],
)
def test_classification_sanity(texts: list[str], expected: str) -> None:
    match = classify_domain(texts)
    assert isinstance(match, DomainMatch)
    assert match.domain == expected
    assert 0.0 < match.score <= 1.0


def test_bundled_samples_get_sensible_domains() -> None:
    expected = {
        "weather_openai": "Weather",
        "Hotel Booking API": "Travel",
        "shop_catalog": "E-commerce",
        "finance_bfcl": "Finance",
        "restaurants": "Food & Dining",
        "filesystem": "File Management",
        "notes-server": "Productivity",
    }
    got = {}
    for raw in load_tool_docs([SAMPLES / "good"]).servers:
        tools = normalize_server(raw).tools
        assert server_gate(raw.server, tools) is None
        texts = [raw.server] + [f"{t.function.name}: {t.function.description}" for t in tools]
        got[raw.server] = classify_domain(texts).domain
    assert got == expected


def test_deterministic_and_fallback() -> None:
    texts = ["shop", "search_products: Search the product catalog", "checkout: Place an order"]
    assert classify_domain(texts) == classify_domain(list(texts))
    assert classify_domain([]) == DomainMatch(domain=FALLBACK_DOMAIN, score=0.0)
    assert classify_domain(["   ", ""]) == DomainMatch(domain=FALLBACK_DOMAIN, score=0.0)


def test_server_text_is_bounded_and_keeps_every_tool_visible() -> None:
    texts = ["srv"] + [f"tool_{i}: " + "long description " * 500 for i in range(30)]
    text = server_text(texts)
    assert len(text) <= MAX_TEXT_CHARS
    assert "tool_0" in text and "tool_5" in text  # one huge description cannot crowd out the rest
    assert server_text(["a  b", "c\n\n d"]) == "a b; c; d"
    # One newline-joined text (how the stage calls it) is split into the same parts.
    assert server_text(["\n".join(texts)]) == text

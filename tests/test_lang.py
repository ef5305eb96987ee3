"""Language identification of task texts (synthesis/sft/lang.py)."""

from __future__ import annotations

import time

import pytest

from synthesis.sft.lang import LANGUAGES, clean_text, detect_language, language_ranking


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("Find hotels in Lisbon for two guests and book the cheapest room.", "en"),
        ("Busca hoteles en Lisboa para dos personas y reserva la habitación más barata.", "es"),
        ("Trouve des hôtels à Lisbonne pour deux personnes et réserve la chambre la moins chère.", "fr"),
        ("Suche Hotels in Lissabon für zwei Personen und buche das günstigste Zimmer.", "de"),
        ("Cerca alberghi a Lisbona per due persone e prenota la camera più economica.", "it"),
        ("Procure hotéis em Lisboa para duas pessoas e reserve o quarto mais barato.", "pt"),
        ("Найди отели в Лиссабоне на двоих и забронируй самый дешёвый номер.", "ru"),
        ("リスボンで二人用のホテルを探して、一番安い部屋を予約してください。", "ja"),
        ("帮我在里斯本找两个人住的酒店，并预订最便宜的房间。", "zh"),
    ],
)
def test_detects_common_languages(text: str, code: str) -> None:
    assert detect_language(text) == code


def test_values_do_not_sway_the_language() -> None:
    text = (
        "Reserva una mesa el 2026-05-14 a las 19:30 para 4 personas, id RST-48213, "
        "correo ana.silva@example.com, fichero /workspace/notes/todo.txt."
    )
    assert "2026" not in clean_text(text) and "@" not in clean_text(text)
    assert detect_language(text) == "es"
    assert detect_language("リヨンの2026-05-14の天気予報を教えてください。") == "ja"


def test_texts_without_language_get_the_default() -> None:
    for text in ("", "   ", "12345", "2026-05-14 19:30", "BK-48213 /tmp/x.md"):
        assert detect_language(text) == "en"
        assert detect_language(text, default="xx") == "xx"
    assert language_ranking("") == []


def test_short_ambiguous_texts_prefer_the_default() -> None:
    assert detect_language("Book a table") == "en"
    assert detect_language("ok thanks") == "en"
    assert detect_language("Guten Tag, wie geht es dir heute?") == "de"  # short but clear


def test_codes_are_iso_639_1_and_detection_is_fast() -> None:
    assert all(len(code) == 2 for code in LANGUAGES)
    detect_language("warm up the cached model")
    start = time.perf_counter()
    for i in range(500):
        assert len(detect_language(f"Please find hotels in Lisbon for {i} guests.")) == 2
    assert time.perf_counter() - start < 2.0


def test_threads_asking_at_once_load_the_model_once() -> None:
    """A stage's handler threads all detect languages on their first records: one load between them."""
    from concurrent.futures import ThreadPoolExecutor

    from synthesis.sft import lang

    lang._load_identifier.cache_clear()
    with ThreadPoolExecutor(8) as pool:
        found = list(
            pool.map(lambda _: lang.detect_language("Where is the nearest train station?"), range(8))
        )
    assert found == ["en"] * 8
    assert lang._load_identifier.cache_info().misses == 1

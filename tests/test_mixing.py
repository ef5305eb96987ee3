"""Irrelevant-tool mixing (ASTRA eq. 24-28): bands, normalisation, union, exclusions, sampling, pool.

The pure functions are tested on hand matrices; the mixer end to end with a real LanceDB folder and
the real all-MiniLM-L6-v2 model (from its PyPI package, offline).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lancedb
import numpy as np
import pytest

from arena.embed import DIM, embed_texts
from arena.records.envs import EnvPackage
from lake.env_packages import EnvPackageStore
from trainer.mixing import (
    TABLE,
    PoolTool,
    ToolMixer,
    band_of,
    min_max,
    pool_from_packages,
    pool_from_store,
    select_bands,
    tool_doc,
    tool_name,
)


def _spec(name: str, description: str, **params: str) -> dict[str, Any]:
    properties = {arg: {"type": "string", "description": text} for arg, text in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)},
        },
    }


WEATHER = [
    _spec(
        "get_forecast",
        "Get the hourly weather forecast (temperature, rain, wind) for a city on a given day.",
        city="City name",
        day="Date in YYYY-MM-DD",
    ),
    _spec(
        "get_severe_alerts",
        "List active severe-weather warnings (storms, floods, heat waves) issued for a region.",
        region="Region or state",
    ),
    _spec("get_air_quality", "Current air quality index and pollutant levels for a city.", city="City name"),
    _spec(
        "get_sunrise_sunset", "Sunrise and sunset times for a location on a date.", city="City", day="Date"
    ),
]
FINANCE = [
    _spec("get_stock_quote", "Latest trading price and volume of a stock by ticker symbol.", ticker="Ticker"),
    _spec("list_dividends", "Dividend payments a company made in a year.", ticker="Ticker", year="Year"),
    _spec(
        "convert_currency",
        "Convert an amount of money between two currencies at today's exchange rate.",
        amount="Amount",
        source="Currency code to convert from",
        target="Currency code to convert to",
    ),
    _spec("get_company_profile", "Company sector, headquarters and number of employees.", ticker="Ticker"),
    _spec("get_earnings_report", "Quarterly revenue and earnings per share of a company.", ticker="Ticker"),
]
TRAVEL = [
    _spec(
        "search_flights",
        "Search flights between two airports on a date, with prices and durations.",
        origin="Departure airport",
        destination="Arrival airport",
        date="Travel date",
    ),
    _spec(
        "get_destination_climate",
        "Typical weather of a travel destination in a month: average temperature and rainfall.",
        city="Destination city",
        month="Month",
    ),
    _spec(
        "book_hotel", "Book a hotel room in a city.", city="City", check_in="Check-in date", nights="Nights"
    ),
    _spec(
        "get_travel_advisories", "Official safety advisories for travellers to a country.", country="Country"
    ),
    _spec("list_attractions", "Popular tourist attractions and museums in a city.", city="City"),
]
POOL = (
    [PoolTool(name=tool_name(s), domain="weather", env_id="env-w", spec=s) for s in WEATHER]
    + [PoolTool(name=tool_name(s), domain="finance", env_id="env-f", spec=s) for s in FINANCE]
    + [PoolTool(name=tool_name(s), domain="travel", env_id="env-t", spec=s) for s in TRAVEL]
)
DOMAIN = {tool.name: tool.domain for tool in POOL}
INSTANCE = WEATHER[:2]  # a weather task that needs the forecast and the alerts


@pytest.fixture(scope="module")
def db_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("mixdb") / "lancedb")


@pytest.fixture(scope="module")
def mixer(db_uri: str) -> ToolMixer:
    return ToolMixer(POOL, db_uri, k_per_band=2, seed=7)


# --- pure functions ------------------------------------------------------------------------


def test_band_boundaries() -> None:
    assert band_of(1.0) == "high"
    assert band_of(0.8501) == "high"
    assert band_of(0.85) == "medium"  # 0.4 <= medium <= 0.85: both ends inclusive
    assert band_of(0.6) == "medium"
    assert band_of(0.4) == "medium"
    assert band_of(0.3999) == "low"
    assert band_of(0.0) == "low"


def test_min_max_hand_case() -> None:
    # (s - min) / (max - min): min 0.2, max 0.8, span 0.6 -> 0.2->0, 0.5->0.3/0.6=0.5, 0.8->1, 0.35->0.25
    np.testing.assert_allclose(min_max([0.2, 0.5, 0.8, 0.35]), [0.0, 0.5, 1.0, 0.25])
    # per row (per instance tool): row 2 has min -0.1, max 0.3, span 0.4 -> 0.1 -> 0.2/0.4 = 0.5
    np.testing.assert_allclose(min_max([[0.2, 0.8, 0.5], [-0.1, 0.3, 0.1]]), [[0, 1, 0.5], [0, 1, 0.5]])
    # all equal (0/0): every score becomes 0, i.e. the low band; a single candidate too
    np.testing.assert_array_equal(min_max([[0.3, 0.3, 0.3], [0.1, 0.2, 0.3]])[0], [0, 0, 0])
    np.testing.assert_array_equal(min_max([0.7]), [0.0])


def test_select_bands_thresholds_after_normalisation() -> None:
    # min 0, max 1: normalisation leaves the row unchanged, so the band thresholds apply as written
    row = [0.0, 0.85, 0.4, 0.3999, 0.8501, 1.0]
    bands = select_bands([row], ["a", "b", "c", "d", "e", "f"])
    assert bands == {"high": ["e", "f"], "medium": ["b", "c"], "low": ["a", "d"]}
    # all-equal row: all low
    assert select_bands([[0.5, 0.5, 0.5]], ["a", "b", "c"]) == {
        "high": [],
        "medium": [],
        "low": ["a", "b", "c"],
    }


def test_select_bands_union_takes_highest_band() -> None:
    # two instance tools, five candidates A..E
    sim = [
        [0.9, 0.1, 0.5, 0.3, 0.1],  # min 0.1, max 0.9, span 0.8 -> [1, 0, 0.5, 0.25, 0]
        [0.1, 0.9, 0.5, 0.7, 0.1],  # same span                   -> [0, 1, 0.5, 0.75, 0]
    ]
    bands = select_bands(sim, ["A", "B", "C", "D", "E"])
    # A: high for tool 1, low for tool 2 -> high (its highest band); B the other way round -> high;
    # C: medium for both; D: low (0.25) for tool 1, medium (0.75) for tool 2 -> medium; E low for both.
    assert bands == {"high": ["A", "B"], "medium": ["C", "D"], "low": ["E"]}
    # the band sets are disjoint: a tool is never sampled twice
    names = [n for ns in bands.values() for n in ns]
    assert len(names) == len(set(names)) == 5


def test_select_bands_empty_and_shape() -> None:
    assert select_bands(np.zeros((0, 3)), ["a", "b", "c"]) == {"high": [], "medium": [], "low": []}
    assert select_bands(np.zeros((2, 0)), []) == {"high": [], "medium": [], "low": []}
    with pytest.raises(ValueError):
        select_bands([[0.1, 0.2]], ["a"])


def test_tool_doc_has_description_and_arguments() -> None:
    doc = tool_doc(WEATHER[0])
    assert doc.startswith("get_forecast: Get the hourly weather forecast")
    assert "city (string): City name" in doc and "day (string): Date in YYYY-MM-DD" in doc


# --- pool ----------------------------------------------------------------------------------


def _package(env_id: str, domain: str, tools: list[dict[str, Any]]) -> EnvPackage:
    return EnvPackage(
        env_id=env_id,
        qa_id=f"qa-{env_id}",
        seed_id="seed",
        domain=domain,
        structure="single_hop",
        question="q",
        answer="a",
        sub_qas=[],
        tools=tools,
        code="",
        jobs=[],
    )


def test_pool_dedup_by_name_keeps_first_env_id() -> None:
    clash = _spec("get_forecast", "Analyst earnings forecast for a ticker.", ticker="Ticker")
    packages = [
        _package("env-b", "finance", [clash, FINANCE[0]]),
        _package("env-a", "weather", [WEATHER[0], WEATHER[1]]),
        _package("env-c", "travel", [TRAVEL[0], WEATHER[1]]),
    ]
    pool = pool_from_packages(packages)
    # env_id order (a, b, c), spec order inside a package; duplicates dropped
    assert [(t.name, t.env_id) for t in pool] == [
        ("get_forecast", "env-a"),
        ("get_severe_alerts", "env-a"),
        ("get_stock_quote", "env-b"),
        ("search_flights", "env-c"),
    ]
    assert pool[0].domain == "weather" and pool[0].spec == WEATHER[0]
    assert pool_from_packages(reversed(packages)) == pool  # independent of the input order


def test_pool_from_store_train_split(tmp_path: Path) -> None:
    store = EnvPackageStore(f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        store.record(_package("env-2", "finance", FINANCE[:2]), "train")
        store.record(_package("env-1", "weather", [*WEATHER[:2], FINANCE[0]]), "train")
        store.record(_package("env-0", "travel", TRAVEL[:2]), "heldout")
        pool = pool_from_store(store)
        # held-out tools are not in the pool; get_stock_quote comes from env-1 (first by env_id)
        assert [(t.name, t.env_id, t.domain) for t in pool] == [
            ("get_forecast", "env-1", "weather"),
            ("get_severe_alerts", "env-1", "weather"),
            ("get_stock_quote", "env-1", "weather"),
            ("list_dividends", "env-2", "finance"),
        ]
        assert len(pool_from_store(store, split=None)) == 6
    finally:
        store.dispose()


def test_mixer_rejects_duplicate_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ToolMixer([POOL[0], POOL[0]], str(tmp_path / "db"))


# --- end to end: LanceDB + embedding model ---------------------------------------------------


def test_embeddings_live_in_lancedb(mixer: ToolMixer, db_uri: str) -> None:
    table = lancedb.connect(db_uri).open_table(TABLE)
    rows = table.to_arrow().to_pylist()
    assert sorted(r["name"] for r in rows) == sorted(t.name for t in POOL)
    by_name = {r["name"]: r for r in rows}
    assert by_name["book_hotel"]["env_id"] == "env-t" and by_name["book_hotel"]["domain"] == "travel"
    assert len(by_name["book_hotel"]["vector"]) == DIM
    # the stored vector is the model's embedding of the tool doc
    expected = embed_texts([tool_doc(TRAVEL[2])])[0]
    np.testing.assert_allclose(by_name["book_hotel"]["vector"], expected, atol=1e-5)
    # a second mixer on the same database re-embeds nothing: no new table version
    version = table.version
    ToolMixer(POOL, db_uri, k_per_band=5)
    assert lancedb.connect(db_uri).open_table(TABLE).version == version


def test_scores_are_cosine_similarities(mixer: ToolMixer) -> None:
    candidates = mixer.candidates(INSTANCE, "weather")
    sim = mixer.scores(INSTANCE, candidates)
    assert sim.shape == (2, len(candidates)) == (2, 10)
    queries = embed_texts([tool_doc(s) for s in INSTANCE])
    keys = embed_texts([tool_doc(t.spec) for t in candidates])
    np.testing.assert_allclose(sim, queries @ keys.T, atol=1e-5)


def test_mix_bands_end_to_end(mixer: ToolMixer) -> None:
    result = mixer.mix(INSTANCE, "weather", rng_key="sample-1")
    names = [tool_name(s) for s in result.tools]
    mixed = [t.name for t in result.mixed]
    # every instance tool is kept; the rest are exactly the mixed-in tools
    assert sorted(names) == sorted([tool_name(s) for s in INSTANCE] + mixed)
    assert len(names) == len(set(names))
    # same domain and own tools excluded; every mixed tool runs in the package that implements it
    assert all(DOMAIN[n] != "weather" for n in mixed)
    assert {t.env_id for t in result.mixed} <= {"env-f", "env-t"}
    # at most K per band, 3 bands, each mixed tool in exactly one band
    assert set(result.bands) == {"high", "medium", "low"}
    assert all(len(v) <= 2 for v in result.bands.values())
    assert sorted(n for v in result.bands.values() for n in v) == sorted(mixed)
    assert 1 <= len(mixed) <= 6


def test_nearest_cross_domain_tool_is_high(db_uri: str) -> None:
    # K larger than the pool: every candidate is mixed in, so the bands are the full P^b sets.
    mixer = ToolMixer(POOL, db_uri, k_per_band=100)
    result = mixer.mix(INSTANCE, "weather", rng_key="all")
    candidates = mixer.candidates(INSTANCE, "weather")
    sim = mixer.scores(INSTANCE, candidates)
    # each instance tool's nearest candidate normalises to 1 -> high; farthest to 0
    for row in sim:
        assert candidates[int(row.argmax())].name in result.bands["high"]
    # the model agrees with intuition: the destination-climate tool is a near-miss for the forecast
    assert candidates[int(sim[0].argmax())].name == "get_destination_climate"
    assert len(result.mixed) == len(candidates) == 10  # every candidate is in exactly one band


def test_same_domain_and_own_tools_excluded(db_uri: str) -> None:
    mixer = ToolMixer(POOL, db_uri, k_per_band=100)
    # a travel task whose package also defines get_forecast (same name as the weather tool)
    own = _spec("get_forecast", "Forecast of hotel prices in a city.", city="City")
    instance = [TRAVEL[0], own]
    result = mixer.mix(instance, "travel", rng_key="x")
    mixed = {t.name for t in result.mixed}
    assert not mixed & {tool_name(s) for s in TRAVEL}  # same domain
    assert "get_forecast" not in mixed  # own tool by name, though the pool's is from another domain
    assert mixed == {t.name for t in POOL if t.domain != "travel"} - {"get_forecast"}
    assert [tool_name(s) for s in result.tools].count("get_forecast") == 1
    assert own in result.tools  # the instance's own spec, not the pool's
    random_mode = mixer.mix(instance, "travel", mode="random", rng_key="x")
    assert "get_forecast" not in {t.name for t in random_mode.mixed}


def test_seeded_reproducibility(mixer: ToolMixer, db_uri: str) -> None:
    first = mixer.mix(INSTANCE, "weather", rng_key="sample-42")
    again = ToolMixer(POOL, db_uri, k_per_band=2, seed=7).mix(INSTANCE, "weather", rng_key="sample-42")
    assert first == again  # same tools, same order, same bands
    outcomes = {
        tuple(tool_name(s) for s in mixer.mix(INSTANCE, "weather", rng_key=f"k{i}").tools) for i in range(8)
    }
    assert len(outcomes) > 1  # different keys give different mixes


def test_random_mode(mixer: ToolMixer) -> None:
    counts = set()
    for i in range(20):
        result = mixer.mix(INSTANCE, "weather", mode="random", rng_key=f"r{i}")
        mixed = [t.name for t in result.mixed]
        assert 5 <= len(mixed) <= 9
        assert all(DOMAIN[n] != "weather" for n in mixed)
        assert result.bands == {"random": mixed}
        assert sorted(tool_name(s) for s in result.tools) == sorted(
            [*mixed, "get_forecast", "get_severe_alerts"]
        )
        counts.add(len(mixed))
    assert len(counts) > 1


def test_none_mode_unchanged(mixer: ToolMixer) -> None:
    result = mixer.mix(INSTANCE, "weather", mode="none", rng_key="anything")
    assert result.tools == INSTANCE and result.mixed == [] and result.bands == {}


def test_instance_tool_outside_pool_is_embedded(mixer: ToolMixer) -> None:
    new = _spec("get_pollen_count", "Pollen levels (grass, tree, weed) for a city today.", city="City")
    result = mixer.mix([new], "weather", rng_key="p")
    assert new in result.tools and result.mixed
    assert all(t.domain != "weather" for t in result.mixed)

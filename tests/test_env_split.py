"""The environment packages' split: held-out instances (package hash) and held-out tool families."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from arena.config import ArenaSettings, EnvSettings
from arena.records.envs import VARIANT_STEM, EnvPackage, VerifiedSample, tool_family, variant_name
from arena.topics import topic
from lake.env_packages import EnvPackageStore, held_out_family, package_split, split_of
from streams.envs import samples_verified
from streams.runtime import Context, run_handler

# The first 16 hex digits of sha256('"NAME"') (the canonical JSON of the name), as an integer, mod 20:
# get_agent_agency_id: ae6d4f1f58b4da60 -> 0, held out; get_listing_price: 3a283c36f09fd0f9 -> 13, trained.
HELD_AT_20 = "get_agent_agency_id"
TRAINED_AT_20 = "get_listing_price"


def _tool(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": {}}},
    }


def _package(env_id: str, *tools: str) -> EnvPackage:
    return EnvPackage(
        env_id=env_id,
        qa_id=f"qa-{env_id}",
        seed_id="seed",
        domain="real_estate",
        structure="single_hop",
        question="q",
        answer="a",
        sub_qas=[],
        tools=[_tool(t) for t in tools],
        code="",
        jobs=[],
    )


def _train_env_id(k: int) -> str:
    """An env id in a train bucket of ``split_of`` at ``k``."""
    return next(e for e in (f"env-{i}" for i in range(100)) if split_of(e, k) == "train")


def test_tool_family_drops_the_uniqueness_suffix_only() -> None:
    assert tool_family("get_city_state_2") == "get_city_state"
    assert tool_family("get_city_state_13") == "get_city_state"
    assert tool_family("get_city_state") == "get_city_state"
    assert tool_family("get_v2_rates") == "get_v2_rates"  # digits inside the name stay
    assert tool_family("_2") == "_2"  # never an empty family


def test_a_long_name_and_its_variants_share_one_family() -> None:
    long = "get_" + "x" * 53 + "_rate"  # 62 > VARIANT_STEM characters: variants cut the stem
    variants = [variant_name(long, n) for n in (2, 3, 12)]
    assert all(len(v) <= 64 for v in variants)
    assert {tool_family(v) for v in variants} == {tool_family(long)} == {long[:VARIANT_STEM]}
    assert tool_family(variant_name("get_rate", 2)) == "get_rate"


def test_held_out_family_hand_cases() -> None:
    assert held_out_family(HELD_AT_20, 20)
    assert not held_out_family(TRAINED_AT_20, 20)
    assert not held_out_family(HELD_AT_20, 0)  # 0: no family is held out


def test_without_families_the_split_is_the_package_hash() -> None:
    for i in range(40):
        pkg = _package(f"env-{i}", HELD_AT_20)
        assert package_split(pkg, 3) == split_of(pkg.env_id, 3)
        assert package_split(pkg, 3, 0) == split_of(pkg.env_id, 3)


def test_a_package_calling_a_held_out_family_is_held_out_whatever_its_hash() -> None:
    env_id = _train_env_id(3)
    assert package_split(_package(env_id, TRAINED_AT_20), 3, 20) == "train"
    # any tool of the package, and any variant of the family's name
    assert package_split(_package(env_id, TRAINED_AT_20, HELD_AT_20), 3, 20) == "heldout"
    assert package_split(_package(env_id, TRAINED_AT_20, f"{HELD_AT_20}_2"), 3, 20) == "heldout"


def test_families_named_in_the_settings_are_held_out_too() -> None:
    env_id = _train_env_id(3)
    named = [f"{TRAINED_AT_20}_3"]  # the suffix is ignored on this side as well
    assert package_split(_package(env_id, TRAINED_AT_20), 3, 0, named) == "heldout"
    assert package_split(_package(env_id, f"{TRAINED_AT_20}_2"), 3, 0, named) == "heldout"
    assert package_split(_package(env_id, "get_other"), 3, 0, named) == "train"
    assert package_split(_package(env_id, HELD_AT_20), 3, 20, ["get_other"]) == "heldout"  # both apply


def test_no_held_out_family_reaches_a_train_package() -> None:
    names = [f"get_thing_{w}" for w in ("price", "owner", "city", "rating", "stock", "name", "year")]
    names += [HELD_AT_20, TRAINED_AT_20]
    packages = [
        _package(f"env-{i}", names[i % len(names)], f"{names[(3 * i + 1) % len(names)]}_2")
        for i in range(200)
    ]
    splits = {p.env_id: package_split(p, 8, 20) for p in packages}
    held = {tool_family(t["function"]["name"]) for p in packages for t in p.tools}
    held = {f for f in held if held_out_family(f, 20)}
    assert HELD_AT_20 in held
    trained = {
        tool_family(t["function"]["name"]) for p in packages if splits[p.env_id] == "train" for t in p.tools
    }
    assert trained and not trained & held
    # packages of trained families only are still split by their hash (new instances of seen tools)
    seen_only = [p for p in packages if not {tool_family(t["function"]["name"]) for t in p.tools} & held]
    assert {splits[p.env_id] for p in seen_only} == {"train", "heldout"}


def test_settings_refuse_holding_out_every_family() -> None:
    assert EnvSettings().heldout_families_k == 0 and EnvSettings().heldout_families == []
    assert EnvSettings(heldout_families_k=20).heldout_families_k == 20
    with pytest.raises(ValidationError, match="every tool family"):
        EnvSettings(heldout_families_k=1)


def test_the_stage_catalogs_every_package_and_publishes_only_trained_families(tmp_path: Path) -> None:
    """``samples-verified`` on a real SQLite catalog, with a family held out by hash and one by name."""
    settings = ArenaSettings(
        home=tmp_path / "home",
        llm="rules",
        catalog_url=None,
        envs=EnvSettings(heldout_k=8, heldout_families_k=20, heldout_families=["get_named"]),
    )
    stage = samples_verified.STAGE
    env_id = _train_env_id(8)
    trained = _package(env_id, TRAINED_AT_20)
    held = _package(f"{env_id}-b", TRAINED_AT_20, f"{HELD_AT_20}_2")
    named = _package(f"{env_id}-c", "get_named")
    assert split_of(held.env_id, 8) == split_of(named.env_id, 8) == "train"  # held out for their families

    async def run(pkg: EnvPackage) -> list[Any]:
        raw = pkg.model_dump_json().encode()
        ctx = Context(stage.name, stage.version, topic(stage.input), pkg.env_id, settings, raw)
        return await run_handler(stage, pkg, ctx, raw)

    published = asyncio.run(run(trained))
    assert [(e.topic, VerifiedSample.model_validate(e.value.model_dump()).env_ref) for e in published] == [
        ("samples.verified", env_id)
    ]
    assert asyncio.run(run(held)) == [] and asyncio.run(run(named)) == []
    store = EnvPackageStore(settings.catalog)
    try:
        splits = {r.env_id: r.split for r in store.rows()}
        assert splits == {env_id: "train", held.env_id: "heldout", named.env_id: "heldout"}
    finally:
        store.dispose()

"""Rule-based chain and task roles (simulator/{chains,tasks}.py) on the sample servers."""

from __future__ import annotations

import random
import re
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from arena.llm.core import Role, Undecidable
from arena.records.sft import ServerRef
from arena.records.tools import NormalizedTool
from producers.tool_docs import load_tool_docs
from simulator import RULES
from simulator.chains import (
    chain_coherence,
    chain_synthesis,
    start_order,
    task_from_chain,
    unreflected_tools,
)
from simulator.tasks import anchor_tool, augment_task, score_task, task_from_server
from simulator.values import kind_of
from synthesis.sft.lang import detect_language
from synthesis.sft.roles.chains import (
    CHAIN_COHERENCE,
    CHAIN_SYNTHESIS,
    TASK_FROM_CHAIN,
    ChainSynthesisInput,
    ChainTaskInput,
    CoherenceInput,
    SynthesizedChain,
    TaskDraft,
)
from synthesis.sft.roles.tasks import (
    AUGMENT_TASK,
    SCORE_TASK,
    TASK_FROM_SERVER,
    AugmentInput,
    ServerTaskInput,
    TaskScoreInput,
    TaskScores,
)
from synthesis.sft.tool_links import arguments, failed, is_identifier, verify_dependencies
from synthesis.tools.normalize import normalize_server, server_id

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "tools" / "good"
THETA = 0.6  # default thresholds of eq. (1)


@pytest.fixture(scope="module")
def servers() -> dict[str, ServerRef]:
    out: dict[str, ServerRef] = {}
    for raw in load_tool_docs([SAMPLES]).servers:
        tools = normalize_server(raw).tools
        out[raw.server] = ServerRef(
            server_id=server_id(raw.server, tools), name=raw.server, domain="Travel", tools=tools
        )
    assert len(out) == 7
    return out


def chain_tools(server: ServerRef, names: list[str]) -> list[NormalizedTool]:
    tools = [server.tool(n) for n in names]
    assert all(t is not None for t in tools), names
    return [t for t in tools if t is not None]


def passes(scores: TaskScores) -> bool:
    return min(scores.question_quality, scores.scenario_realism, scores.tool_necessity) >= THETA


def score(text: str, server: ServerRef) -> TaskScores:
    return score_task(TaskScoreInput(task=text, tools=server.tools), random.Random(0))


# ------------------------------------------------------------------------------------- roles


@pytest.mark.parametrize(
    "role", [CHAIN_SYNTHESIS, TASK_FROM_CHAIN, CHAIN_COHERENCE, TASK_FROM_SERVER, AUGMENT_TASK, SCORE_TASK]
)
def test_roles_are_registered_documented_and_render(
    role: Role[Any, Any], servers: dict[str, ServerRef]
) -> None:
    assert role.name in RULES
    for model in (role.input, role.output):
        for name, info in model.model_fields.items():
            assert info.description, f"{model.__name__}.{name} has no description"
    assert "JSON" in role.system and "{input}" in role.template
    assert role.output_schema()["type"] == "object"
    server = servers["restaurants"]
    sample: dict[str, BaseModel] = {
        "chain_synthesis": ChainSynthesisInput(server=server, max_length=3, variant=0),
        "task_from_chain": ChainTaskInput(server=server, chain=["search_restaurants"], variant=0),
        "chain_coherence": CoherenceInput(task="Find sushi in Lyon.", chain=server.tools[:1]),
        "task_from_server": ServerTaskInput(server=server, variant=0),
        "augment_task": AugmentInput(
            task="Find sushi in Lyon.", language="en", axis="persona", tools=server.tools, variant=0
        ),
        "score_task": TaskScoreInput(task="Find sushi in Lyon.", tools=server.tools),
    }
    messages = role.messages(sample[role.name])
    assert messages[0]["role"] == "system" and "search_restaurants" in messages[1]["content"]


# -------------------------------------------------------------------------------- synthesis


def test_chain_synthesis_uses_only_server_tools_and_passes_verification(
    servers: dict[str, ServerRef],
) -> None:
    for server in servers.values():
        names = {t.function.name for t in server.tools}
        starts, chains = set(), set()
        for variant in range(6):
            out = chain_synthesis(
                ChainSynthesisInput(server=server, max_length=4, variant=variant), random.Random(variant)
            )
            assert isinstance(out, SynthesizedChain)
            assert set(out.chain) <= names and 1 <= len(out.chain) <= 4
            tools = chain_tools(server, out.chain)
            deps = verify_dependencies(tools, out.task, out.slots)
            assert failed(deps) == [], (server.name, out.chain, out.task)
            assert all(s.value in out.task and s.tool in out.chain for s in out.slots)
            verdict = chain_coherence(CoherenceInput(task=out.task, chain=tools), random.Random(0))
            assert verdict.coherent, (out.task, verdict.reason)
            starts.add(out.chain[0])
            chains.add(tuple(out.chain))
        assert len(chains) >= 2, server.name
        # Variants rotate through the tools a user can start with (the hotel API has one).
        assert len(starts) == min(6, len(start_order(server))), server.name


def test_most_synthesised_chains_link_several_tools(servers: dict[str, ServerRef]) -> None:
    lengths = [
        len(chain_synthesis(ChainSynthesisInput(server=s, max_length=4, variant=v), random.Random(v)).chain)
        for s in servers.values()
        for v in range(4)
    ]
    assert sum(n >= 2 for n in lengths) >= 0.9 * len(lengths)
    one = chain_synthesis(
        ChainSynthesisInput(server=servers["restaurants"], max_length=1, variant=0), random.Random(0)
    )
    assert len(one.chain) == 1


def test_later_identifiers_come_from_outputs_and_user_values_are_stated(
    servers: dict[str, ServerRef],
) -> None:
    hotel = servers["Hotel Booking API"]
    chain = ["searchHotels", "listRooms", "createBooking"]
    draft = task_from_chain(ChainTaskInput(server=hotel, chain=chain, variant=0), random.Random(5))
    assert isinstance(draft, TaskDraft)
    stated = {(s.tool, s.argument): s.value for s in draft.slots}
    for arg in ("city", "check_in", "check_out"):
        assert ("searchHotels", arg) in stated
    for arg in ("guest_name", "guest_email"):  # non-identifiers no output provides
        assert ("createBooking", arg) in stated
    for key in (("listRooms", "hotel_id"), ("createBooking", "hotel_id"), ("createBooking", "room_id")):
        assert key not in stated
    assert all(value in draft.text for value in stated.values())
    deps = verify_dependencies(chain_tools(hotel, chain), draft.text, draft.slots)
    assert {(d.tool, d.argument): d.source for d in deps if d.source == "output"} == {
        ("listRooms", "hotel_id"): "output",
        ("createBooking", "hotel_id"): "output",
        ("createBooking", "room_id"): "output",
    }
    assert not failed(deps)


def test_values_are_plausible_for_their_schemas(servers: dict[str, ServerRef]) -> None:
    hotel = servers["Hotel Booking API"]
    for seed in range(15):
        draft = task_from_chain(
            ChainTaskInput(server=hotel, chain=["searchHotels", "createBooking"], variant=seed),
            random.Random(seed),
        )
        values = {(s.tool, s.argument): s.value for s in draft.slots}
        check_in = date.fromisoformat(values[("searchHotels", "check_in")])
        assert date.fromisoformat(values[("searchHotels", "check_out")]) > check_in
        assert values[("createBooking", "check_in")] == values[("searchHotels", "check_in")]  # one scenario
        assert re.fullmatch(r"[\w.]+@example\.com", values[("createBooking", "guest_email")])
        # No earlier output has a room id, and the user cannot know one: it stays unstated.
        assert ("createBooking", "room_id") not in values
    for server in servers.values():
        for tool in server.tools:
            for seed in range(3):
                draft = task_from_chain(
                    ChainTaskInput(server=server, chain=[tool.function.name], variant=seed),
                    random.Random(seed),
                )
                for slot in draft.slots:
                    schema = next(a.schema for a in arguments(tool) if a.name == slot.argument)
                    if "enum" in schema:
                        assert slot.value in {str(v) for v in schema["enum"]}
                    if (
                        schema.get("type") in ("integer", "number")
                        and kind_of(next(a for a in arguments(tool) if a.name == slot.argument)) != "enum"
                    ):
                        value = float(slot.value)
                        assert schema.get("minimum", value) <= value <= schema.get("maximum", value)
                    assert "{" not in slot.value and slot.value in draft.text


def test_a_walk_needing_an_unknown_identifier_fails_verification(servers: dict[str, ServerRef]) -> None:
    hotel = servers["Hotel Booking API"]
    chain = ["searchHotels", "getBooking"]
    draft = task_from_chain(ChainTaskInput(server=hotel, chain=chain, variant=0), random.Random(0))
    assert not any(s.argument == "booking_id" for s in draft.slots)  # the user cannot know it
    missing = failed(verify_dependencies(chain_tools(hotel, chain), draft.text, draft.slots))
    assert [(d.tool, d.argument) for d in missing] == [("getBooking", "booking_id")]


def test_chain_rules_refuse_unknown_tools_and_empty_servers(servers: dict[str, ServerRef]) -> None:
    with pytest.raises(Undecidable):
        task_from_chain(
            ChainTaskInput(server=servers["restaurants"], chain=["searchHotels"], variant=0), random.Random(0)
        )
    empty = ServerRef(server_id="x", name="empty", domain="Other", tools=[])
    with pytest.raises(Undecidable):
        chain_synthesis(ChainSynthesisInput(server=empty, max_length=3, variant=0), random.Random(0))
    with pytest.raises(Undecidable):
        task_from_server(ServerTaskInput(server=empty, variant=0), random.Random(0))


def test_rules_are_deterministic_for_a_fixed_rng(servers: dict[str, ServerRef]) -> None:
    server = servers["shop_catalog"]
    calls: list[tuple[Any, BaseModel]] = [
        (chain_synthesis, ChainSynthesisInput(server=server, max_length=4, variant=2)),
        (task_from_chain, ChainTaskInput(server=server, chain=["search_products", "add_to_cart"], variant=1)),
        (task_from_server, ServerTaskInput(server=server, variant=3)),
        (
            augment_task,
            AugmentInput(
                task="Find running shoes under 80 EUR.",
                language="en",
                axis="complexity",
                tools=server.tools,
                variant=0,
            ),
        ),
        (score_task, TaskScoreInput(task="Find running shoes under 80 EUR.", tools=server.tools)),
        (chain_coherence, CoherenceInput(task="Find running shoes under 80 EUR.", chain=server.tools[:2])),
    ]
    for rule, inputs in calls:
        assert rule(inputs, random.Random(42)) == rule(inputs, random.Random(42))
    texts = {chain_synthesis(calls[0][1], random.Random(seed)).task for seed in range(5)}
    assert len(texts) > 1


# -------------------------------------------------------------------------------- coherence


def test_coherence_catches_repeats_missing_steps_nonsense_and_deleted_entities(
    servers: dict[str, ServerRef],
) -> None:
    notes, hotel = servers["notes-server"], servers["Hotel Booking API"]

    def verdict(task: str, server: ServerRef, names: list[str]) -> tuple[bool, str]:
        out = chain_coherence(CoherenceInput(task=task, chain=chain_tools(server, names)), random.Random(0))
        return out.coherent, out.reason

    good = (
        "Search hotels in Lisbon from 2026-05-14 to 2026-05-18, then get the details of the cheapest hotel."
    )
    assert verdict(good, hotel, ["searchHotels", "getHotel"])[0]
    ok, reason = verdict(
        "Search hotels in Lisbon from 2026-05-14 to 2026-05-18.", hotel, ["searchHotels", "getHotel"]
    )
    assert not ok and "getHotel" in reason
    ok, reason = verdict(good, hotel, ["searchHotels", "getHotel", "getHotel"])
    assert not ok and "twice in a row" in reason
    ok, reason = verdict("Search hotels in {city} for {dates} please.", hotel, ["searchHotels"])
    assert not ok and "placeholder" in reason
    assert not verdict("hotels hotels", hotel, ["searchHotels"])[0]
    ok, reason = verdict(
        "Delete my note NOTE-12345 and then update that note with 'hello world'.",
        notes,
        ["delete_note", "update_note"],
    )
    assert not ok and "deleted" in reason
    # A re-read after a write is not pointless; a new note after a delete may be used.
    assert verdict(
        "Read note NOTE-1, append 'done' to it, then read the note again.",
        notes,
        ["get_note", "update_note", "get_note"],
    )[0]
    assert verdict(
        "Delete note NOTE-1, create a new note titled 'x' with 'y', then append 'z' to it.",
        notes,
        ["delete_note", "create_note", "update_note"],
    )[0]
    with pytest.raises(Undecidable):
        chain_coherence(CoherenceInput(task="  ", chain=hotel.tools[:1]), random.Random(0))


# ----------------------------------------------------------------------------- server tasks


def test_server_tasks_cover_tools_and_weak_drafts_are_caught_by_the_scorer(
    servers: dict[str, ServerRef],
) -> None:
    kept = dropped = 0
    for server in servers.values():
        names = {t.function.name for t in server.tools}
        anchors = {anchor_tool(server, v).function.name for v in range(len(names))}
        assert anchors == names  # consecutive variants rotate through every tool
        for variant in range(8):
            draft = task_from_server(ServerTaskInput(server=server, variant=variant), random.Random(variant))
            assert all(s.tool in names and s.value in draft.text for s in draft.slots)
            scores = score(draft.text, server)
            if draft.slots:
                assert unreflected_tools(draft.text, [anchor_tool(server, variant)]) == []
                kept += passes(scores)
            else:  # a weak draft: vague or general knowledge, no concrete values
                assert not passes(scores), (draft.text, scores)
                dropped += 1
    assert dropped >= 4 and kept >= 30


# ---------------------------------------------------------------------------- augmentation

ORIGINALS = {
    "en": None,  # filled from task_from_chain in the test
    "es": "Busca hoteles en Lisboa del 2026-05-14 al 2026-05-18 para 2 personas y reserva la habitación más barata a nombre de Ana Silva (ana.silva@example.com).",
    "fr": "Trouve des hôtels à Lyon du 2026-06-02 au 2026-06-05 pour 3 personnes, puis réserve la chambre la moins chère au nom de Chloé Martin (chloe.martin@example.com).",
    "de": "Suche Hotels in Berlin vom 2026-07-10 bis 2026-07-12 für 2 Personen und buche das günstigste Zimmer auf den Namen Jonas Weber (jonas.weber@example.com).",
    "it": "Cerca alberghi a Milano dal 2026-09-01 al 2026-09-04 per 2 persone e prenota la camera più economica a nome di Marco Rossi (marco.rossi@example.com).",
}
VALUES = {
    "es": ["Lisboa", "2026-05-14", "2026-05-18", "2", "Ana Silva", "ana.silva@example.com"],
    "fr": ["Lyon", "2026-06-02", "2026-06-05", "3", "Chloé Martin", "chloe.martin@example.com"],
    "de": ["Berlin", "2026-07-10", "2026-07-12", "2", "Jonas Weber", "jonas.weber@example.com"],
    "it": ["Milano", "2026-09-01", "2026-09-04", "2", "Marco Rossi", "marco.rossi@example.com"],
}


def test_augmented_variants_keep_language_and_values(servers: dict[str, ServerRef]) -> None:
    hotel = servers["Hotel Booking API"]
    draft = task_from_chain(
        ChainTaskInput(server=hotel, chain=["searchHotels", "listRooms", "createBooking"], variant=0),
        random.Random(1),
    )
    originals = {**ORIGINALS, "en": draft.text}
    values = {**VALUES, "en": [s.value for s in draft.slots]}
    for lang, text in originals.items():
        assert text is not None and detect_language(text) == lang
        for axis in ("diversity", "complexity", "persona"):
            for variant in range(4):
                out = augment_task(
                    AugmentInput(task=text, language=lang, axis=axis, tools=hotel.tools, variant=variant),
                    random.Random(variant),
                )
                assert out.text != text
                assert detect_language(out.text) == lang, (lang, axis, out.text)
                missing = [v for v in values[lang] if v not in out.text]
                assert not missing, (lang, axis, missing, out.text)
                assert (out.persona is not None) == (axis == "persona")


def test_augmentation_paraphrases_outside_quotes_only(servers: dict[str, ServerRef]) -> None:
    notes = servers["notes-server"]
    text = 'Search my notes for "search and find list" and get the newest one.'
    for seed in range(10):
        out = augment_task(
            AugmentInput(task=text, language="en", axis="diversity", tools=notes.tools, variant=seed),
            random.Random(seed),
        )
        assert '"search and find list"' in out.text


def test_augmentation_keeps_the_persona_and_refuses_empty_tasks(servers: dict[str, ServerRef]) -> None:
    tools = servers["weather_openai"].tools
    personas = {
        augment_task(
            AugmentInput(
                task="Get the forecast for Lyon for the next 5 days.",
                language="en",
                axis="persona",
                tools=tools,
                variant=v,
            ),
            random.Random(v),
        ).persona
        for v in range(8)
    }
    assert len(personas) >= 3
    with pytest.raises(Undecidable):
        augment_task(
            AugmentInput(task=" ", language="en", axis="diversity", tools=tools, variant=0), random.Random(0)
        )


# ---------------------------------------------------------------------------------- scoring


def test_score_ranks_a_vague_task_below_a_concrete_one(servers: dict[str, ServerRef]) -> None:
    hotel = servers["Hotel Booking API"]
    concrete = score(
        "Please search hotels in Lisbon from 2026-05-14 to 2026-05-18 for 2 guests and book the cheapest room "
        "under the name Ana Silva (ana.silva@example.com).",
        hotel,
    )
    vague = score("Can you help me with hotels?", hotel)
    general = score("What is a hotel booking, in general?", hotel)
    assert passes(concrete)
    for weak in (vague, general):
        assert not passes(weak)
        assert weak.question_quality < concrete.question_quality
        assert weak.tool_necessity < concrete.tool_necessity
    assert general.tool_necessity <= 0.2
    for s in (concrete, vague, general):
        assert (
            all(0 <= x <= 1 for x in (s.question_quality, s.scenario_realism, s.tool_necessity))
            and s.rationale
        )


def test_score_penalises_artifacts_contradictions_and_out_of_range_values(
    servers: dict[str, ServerRef],
) -> None:
    hotel = servers["Hotel Booking API"]
    base = "Please search hotels in Lisbon from 2026-05-14 to 2026-05-18 for 2 guests."
    good = score(base, hotel)
    assert score(base.replace("Lisbon", "{city}"), hotel).question_quality < 0.4
    reversed_dates = score(base.replace("2026-05-14 to 2026-05-18", "2026-05-18 to 2026-05-14"), hotel)
    assert reversed_dates.scenario_realism < good.scenario_realism and not passes(reversed_dates)
    too_many = score(base.replace("2 guests", "40 guests"), hotel)  # guests: maximum 10
    assert too_many.scenario_realism < good.scenario_realism
    assert score(base.replace("Lisbon", "foo"), hotel).scenario_realism < good.scenario_realism
    impossible = score(base.replace("2026-05-18", "2026-02-30"), hotel)
    assert impossible.scenario_realism < good.scenario_realism
    with pytest.raises(Undecidable):
        score_task(TaskScoreInput(task="", tools=hotel.tools), random.Random(0))
    with pytest.raises(Undecidable):
        score_task(TaskScoreInput(task=base, tools=[]), random.Random(0))


def test_generated_chain_tasks_and_their_variants_mostly_pass_scoring(servers: dict[str, ServerRef]) -> None:
    total = kept = 0
    for server in servers.values():
        for variant in range(3):
            out = chain_synthesis(
                ChainSynthesisInput(server=server, max_length=4, variant=variant), random.Random(variant)
            )
            texts = [out.task]
            for axis in ("diversity", "complexity", "persona"):
                inputs = AugmentInput(
                    task=out.task, language="en", axis=axis, tools=server.tools, variant=variant
                )
                texts.append(augment_task(inputs, random.Random(variant)).text)
            for text in texts:
                total += 1
                kept += passes(score(text, server))
    assert kept >= 0.85 * total


def test_identifier_detection_agrees_with_the_writer(servers: dict[str, ServerRef]) -> None:
    # Every later-step identifier the writer leaves out is one verify_dependencies resolves from outputs.
    shop = servers["shop_catalog"]
    chain = ["search_products", "get_product", "add_to_cart", "checkout", "track_order"]
    draft = task_from_chain(ChainTaskInput(server=shop, chain=chain, variant=0), random.Random(0))
    tools = chain_tools(shop, chain)
    deps = verify_dependencies(tools, draft.text, draft.slots)
    assert not failed(deps)
    for dep in deps:
        arg = next(a for a in arguments(tools[dep.step]) if a.name == dep.argument)
        if dep.step and is_identifier(arg.name, arg.schema):
            assert dep.source == "output"


def odd_server() -> ServerRef:
    """Tools without output schemas, with unusual argument types and names."""

    def make(
        name: str, description: str, params: dict[str, Any], required: list[str], response: Any = None
    ) -> NormalizedTool:
        return NormalizedTool.model_validate(
            {
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": {"type": "object", "properties": params, "required": required},
                },
                "response_schema": response,
            }
        )

    tools = [
        make("ping.host", "Checks whether a host answers.", {"host": {"type": "string"}}, ["host"]),
        make(
            "set-flags",
            "Toggles feature flags of an account.",
            {
                "enabled": {"type": "boolean"},
                "levels": {"type": "array", "items": {"type": "integer", "enum": [1, 2, 3]}},
                "owner": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                },
                "mode": {"anyOf": [{"type": "string", "enum": ["fast", "safe"]}, {"type": "null"}]},
            },
            ["enabled", "levels", "owner", "mode"],
            {"type": "object", "properties": {"flag_id": {"type": "string"}}},
        ),
        make(
            "get_flag", "Details of a flag.", {"flag_id": {"type": "string"}}, ["flag_id"], {"type": "object"}
        ),
        make("noop", "Does nothing at all, really.", {}, []),
    ]
    return ServerRef(server_id="odd", name="odd", domain="Other", tools=tools)


def test_rules_cope_with_unusual_schemas() -> None:
    server = odd_server()
    for variant in range(6):
        rng = random.Random(variant)
        out = chain_synthesis(ChainSynthesisInput(server=server, max_length=3, variant=variant), rng)
        assert all(s.value in out.task for s in out.slots)
        assert not failed(verify_dependencies(chain_tools(server, out.chain), out.task, out.slots))
        draft = task_from_server(ServerTaskInput(server=server, variant=variant), rng)
        assert all(s.value in draft.text for s in draft.slots)
        for axis in ("diversity", "complexity", "persona"):
            augment_task(
                AugmentInput(task=draft.text, language="en", axis=axis, tools=server.tools, variant=variant),
                rng,
            )
        score_task(TaskScoreInput(task=draft.text, tools=server.tools), rng)
    draft = task_from_chain(
        ChainTaskInput(server=server, chain=["set-flags", "get_flag"], variant=0), random.Random(0)
    )
    values = {s.argument: s.value for s in draft.slots}
    assert values["mode"] in ("fast", "safe") and values["enabled"] in ("yes", "no")
    assert set(values["levels"].split(", ")) <= {"1", "2", "3"}
    assert not failed(
        verify_dependencies(chain_tools(server, ["set-flags", "get_flag"]), draft.text, draft.slots)
    )

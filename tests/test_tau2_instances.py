"""New tau2 task instances: the random pool's options and the policy's verdicts, the rules writer,
the instance's tau2 form and the novelty check. No sandbox here: the databases are tau2's shipped
files; ``tests/test_tau2.py`` makes instances end to end in the domains' own code."""

from __future__ import annotations

import functools
import json
import random
import re
from typing import Any

import pytest

from environments.tau2_env import Tau2Unavailable, tau2_data_dir, tau2_site_dirs

try:
    tau2_site_dirs()
except Tau2Unavailable as exc:
    pytest.skip(f"{exc} -- scripts/test.sh builds it", allow_module_level=True)

from environments.tau2_import import read_domain_files, split_of
from environments.tau2_tasks import (
    Tau2Task,
    mapped_task,
    user_requirements,
    verification_of,
)
from simulator.tau2_instances import write_instance
from synthesis.eigen.roles.tau2_instances import InstanceScenario, Tau2InstanceInput
from synthesis.eigen.tau2_instances import (
    FREE_BAGS,
    NoveltyIndex,
    _airline_reservation_options,
    _cancel_verdict,
    draw_instance,
    instance_task,
)


@functools.lru_cache(maxsize=2)
def _db(domain: str) -> dict[str, Any]:
    return json.loads(read_domain_files(domain)[0])


def _reservation(**changes: Any) -> dict[str, Any]:
    base = {
        "reservation_id": "ABC123",
        "user_id": "u_1",
        "origin": "JFK",
        "destination": "SEA",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": [
            {
                "origin": "JFK",
                "destination": "SEA",
                "flight_number": "HAT001",
                "date": "2024-05-20",
                "price": 100,
            }
        ],
        "passengers": [{"first_name": "Ann", "last_name": "Lee", "dob": "1980-01-01"}],
        "payment_history": [{"payment_id": "credit_card_1", "amount": 100}],
        "created_at": "2024-05-01T10:00:00",
        "total_baggages": 0,
        "nonfree_baggages": 0,
        "insurance": "no",
    }
    return base | changes


NO_FLIGHTS: dict[str, Any] = {"flights": {}}


@pytest.mark.parametrize(
    ("changes", "reason", "allowed"),
    [
        ({}, "change of plan", False),  # economy, booked two weeks ago, no insurance
        ({"created_at": "2024-05-14T16:00:00"}, "change of plan", True),  # within 24 h of 2024-05-15 15:00
        ({"created_at": "2024-05-14T14:59:59"}, "change of plan", False),  # just over 24 h
        ({"cabin": "business"}, "change of plan", True),
        ({"insurance": "yes"}, "health", True),
        ({"insurance": "yes"}, "weather", True),
        ({"insurance": "yes"}, "change of plan", False),  # insurance covers health and weather only
    ],
)
def test_airline_cancellation_follows_the_policy(changes: dict[str, Any], reason: str, allowed: bool) -> None:
    assert _cancel_verdict(NO_FLIGHTS, _reservation(**changes), reason)[0] is allowed


def test_a_flight_the_airline_cancelled_allows_cancelling_and_a_flown_one_offers_nothing() -> None:
    db = {"flights": {"HAT001": {"dates": {"2024-05-20": {"status": "cancelled"}}}}}
    assert _cancel_verdict(db, _reservation(), "change of plan") == (True, "the airline cancelled a flight")
    user = {"user_id": "u_1", "membership": "regular", "payment_methods": {}}
    flown = _reservation(flights=[{**_reservation()["flights"][0], "date": "2024-05-14"}])
    assert _airline_reservation_options(NO_FLIGHTS, user, flown, random.Random(0)) == []


@pytest.mark.parametrize(
    ("membership", "cabin", "passengers", "before", "expected_nonfree"),
    [
        ("regular", "basic_economy", 1, (0, 0), {1: 1, 2: 2}),  # no free bag: every added one is paid
        ("gold", "economy", 2, (2, 0), {1: 0, 2: 0}),  # 6 free, 3 or 4 in all
        ("silver", "economy", 1, (2, 0), {1: 1, 2: 2}),  # 2 free, already used
        ("regular", "economy", 1, (3, 2), {1: 3, 2: 4}),
    ],
)
def test_added_bags_are_paid_beyond_the_free_allowance(
    membership: str, cabin: str, passengers: int, before: tuple[int, int], expected_nonfree: dict[int, int]
) -> None:
    user = {
        "user_id": "u_1",
        "membership": membership,
        "payment_methods": {
            "credit_card_1": {
                "source": "credit_card",
                "id": "credit_card_1",
                "brand": "visa",
                "last_four": "1111",
            }
        },
    }
    people = [{"first_name": f"P{i}", "last_name": "Lee", "dob": "1980-01-01"} for i in range(passengers)]
    reservation = _reservation(
        cabin=cabin, passengers=people, total_baggages=before[0], nonfree_baggages=before[1]
    )
    seen: dict[int, int] = {}
    for seed in range(20):
        for option in _airline_reservation_options(NO_FLIGHTS, user, reservation, random.Random(seed)):
            if option.kind == "update_reservation_baggages":
                args = option.calls[-1].arguments
                seen[args["total_baggages"] - before[0]] = args["nonfree_baggages"]
    assert seen == expected_nonfree
    assert FREE_BAGS["gold"]["business"] == 4


@pytest.mark.parametrize("domain", ["retail", "airline"])
def test_every_option_of_a_draw_names_records_of_the_database(domain: str) -> None:
    db = _db(domain)
    owned = "orders" if domain == "retail" else "reservations"
    kinds: set[str] = set()
    for seed in range(30):
        draw = draw_instance(domain, db, random.Random(seed))
        user = db["users"][draw.user_id]
        assert draw.options
        for option in draw.options:
            kinds.add(option.kind)
            assert not re.search(r"\b(\w+) \1\b", option.request, re.IGNORECASE), (
                option.request
            )  # 'brand Brand A'
            ids = {
                v for c in option.calls for k, v in c.arguments.items() if k in ("order_id", "reservation_id")
            }
            assert ids <= set(user[owned]), option
            writes = [c for c in option.calls if not c.name.startswith(("get_", "find_"))]
            assert (option.verdict == "refuse") == (not writes), option
            if domain == "retail":  # items of that very order
                items = {it["item_id"] for o in ids for it in db["orders"][o]["items"]}
                assert all(set(c.arguments.get("item_ids", [])) <= items for c in writes)
    assert len(kinds) >= 4, kinds  # requests of several kinds, a refusal among them
    assert any("refused" in k or "non_pending" in k for k in kinds)


def _tasks(domain: str) -> list[Tau2Task]:
    _, _, raw, splits = read_domain_files(domain)
    return [mapped_task(t, split_of(str(t["id"]), splits)) for t in raw]


def test_the_rules_writer_keeps_the_request_and_the_task_is_tau2_shaped() -> None:
    db = _db("retail")
    draw = draw_instance("retail", db, random.Random(3))
    inputs = Tau2InstanceInput(domain="retail", policy="(policy)", draw=draw)
    scenario = write_instance(inputs, random.Random(0))
    option = draw.options[scenario.option]
    assert option.request in scenario.reason_for_call and scenario.known_info == draw.identity
    raw = instance_task(draw, scenario)
    assert raw["id"].startswith("new-") and raw["user_scenario"]["instructions"]["domain"] == "retail"
    verification = verification_of(raw)
    assert [a.name for a in verification.actions] == [c.name for c in option.calls]
    assert verification.reward_basis == ["DB"] and not verification.needs_judge
    assert instance_task(draw, scenario) == raw  # the id is the content's hash
    assert user_requirements(raw)[0].startswith(("I ", "My "))  # the user says it in the first person
    assert tau2_data_dir().exists()


def test_novelty_flags_a_copied_scenario_identical_writes_and_a_paraphrase() -> None:
    everything = _tasks("retail")
    tasks = [t for t in everything if t.split == "test"][:6] + [t for t in everything if t.split == "train"][
        :6
    ]
    writes = {
        "cancel_pending_order",
        "return_delivered_order_items",
        "modify_pending_order_items",
        "exchange_delivered_order_items",
        "modify_pending_order_payment",
        "modify_pending_order_address",
        "modify_user_address",
    }
    index = NoveltyIndex(tasks, writes)
    test = next(
        t for t in tasks if t.split == "test" and any(a.name in writes for a in t.verification.actions)
    )

    copied = json.loads(json.dumps(test.raw)) | {"id": "new-copy"}
    copied["evaluation_criteria"] = {"actions": []}
    found = index.check(copied)
    assert (found.duplicate_of, found.split, found.by) == (test.task_id, "test", "ngram")

    same_writes = {
        "id": "new-w",
        "user_scenario": {
            "instructions": {
                "domain": "retail",
                "reason_for_call": "Hello there.",
                "known_info": "",
                "task_instructions": "Be brief.",
            }
        },
        "evaluation_criteria": test.raw["evaluation_criteria"],
    }
    assert index.check(same_writes).by == "writes"

    def interrupted(text: str) -> str:  # every fifth word left out: no 5-gram survives, the meaning does
        return " ".join(w for i, w in enumerate(text.split()) if i % 5 != 4)

    scenario = test.raw["user_scenario"]["instructions"]
    reworded = {
        "id": "new-p",
        "user_scenario": {"instructions": {k: interrupted(str(v)) if v else v for k, v in scenario.items()}},
        "evaluation_criteria": {"actions": []},
    }
    paraphrase = index.check(reworded)  # too few 5-grams in common: the embedding sees it
    assert paraphrase.ngram < 0.5 and paraphrase.by == "embedding", paraphrase

    draw = draw_instance("retail", _db("retail"), random.Random(5))
    fresh = instance_task(
        draw, write_instance(Tau2InstanceInput(domain="retail", policy="", draw=draw), random.Random(1))
    )
    novel = index.check(fresh)
    assert novel.duplicate_of == "" and novel.cosine < 0.9 and novel.ngram < 0.5, novel
    assert index.admit(mapped_task(fresh, "new")) == novel  # admitted, with the same figures
    assert index.check(fresh | {"id": "new-again"}).duplicate_of == fresh["id"]  # nor an accepted instance
    assert InstanceScenario.model_json_schema()["properties"]["option"]["minimum"] == 0

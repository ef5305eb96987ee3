"""New task instances over an imported tau2 domain: the random pool, the task's tau2 form, novelty.

1. The random pool (``draw_instance``) picks a customer of the domain's database with a seeded
   generator and lists what they could ask for (``InstanceOption``): the gold calls come from the
   records (the customer's orders or reservations, a product's other variants, their payment
   methods) and the verdict from the policy's rules -- the rules the domain's code does not check
   itself are checked here (airline: a reservation may be cancelled only within 24 hours of
   booking, in business, with insurance for health or weather, or when the airline cancelled a
   flight; free bags by membership and cabin).
2. ``EIGEN_TAU2_INSTANCE`` writes the customer's side; ``instance_task`` makes the tau2 task: the
   scenario, and evaluation criteria of the option's calls with reward basis DB (plus COMMUNICATE
   when the option has facts to tell) -- Arena's ``Tau2Verification`` of it is the verification
   function.
3. ``NoveltyIndex``: an instance must not near-duplicate any task of the domain, train or test:
   not by its scenario's word 5-grams (``arena.overlap``), not by embedding similarity of the
   scenario (``arena.embed``), and not by doing the very writes an existing task does.

Telecom's tasks are device troubleshooting on a user database of lines and devices, not records a
request names; this pool covers airline and retail (``INSTANCE_DOMAINS``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, Field

from arena.embed import embed_texts
from arena.hashing import content_hash
from arena.overlap import NEAR_DUPLICATE, NEAR_DUPLICATE_COSINE, containment, ngrams
from arena.records.eigen import GoalCall
from environments.tau2_tasks import Tau2Task, user_instructions
from synthesis.eigen.roles.tau2_instances import InstanceDraw, InstanceOption, InstanceScenario

INSTANCE_DOMAINS = ("airline", "retail")
"""Domains whose database the random pool can draw requests from."""
COSINE_THRESHOLD = NEAR_DUPLICATE_COSINE
"""Embedding cosine at or above which a scenario near-duplicates a task."""
AIRLINE_NOW = "2024-05-15T15:00:00"
"""tau2 airline's current time (its policy: 'The current time is 2024-05-15 15:00:00 EST')."""

Db = dict[str, Any]


def _call(name: str, **arguments: Any) -> GoalCall:
    return GoalCall(name=name, arguments=arguments, actor="agent")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --------------------------------------------------------------------------- retail


def _option_text(key: str, value: Any) -> str:
    """One product option as a person says it: 'color red', but 'Brand A' (not 'brand Brand A') and
    'bagless' (not 'bagged/bagless bagless')."""
    text = str(value)
    if key.lower() in text.lower() or text.lower() in key.lower().split("/"):
        return text
    return f"{key} {text}"


def _options_text(options: dict[str, Any]) -> str:
    return ", ".join(_option_text(k, v) for k, v in options.items())


def _item_text(item: dict[str, Any]) -> str:
    return f"the {item['name']} ({_options_text(item['options'])})"


def _payment_text(method: dict[str, Any]) -> str:
    source = method.get("source")
    if source == "credit_card":
        return f"{method.get('brand', 'credit').title()} credit card ending in {method.get('last_four')}"
    if source == "paypal":
        return "PayPal account"
    return "gift card"


def _other_variant(db: Db, item: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    """An available variant of the item's product that differs from it in some option."""
    variants = db["products"][item["product_id"]]["variants"].values()
    others = [v for v in variants if v["available"] and v["item_id"] != item["item_id"]]
    return rng.choice(others) if others else None


def _changed(old: dict[str, Any], new: dict[str, Any]) -> str:
    return ", ".join(_option_text(k, v) for k, v in new.items() if old.get(k) != v)


def _retail_order_options(
    db: Db, user: dict[str, Any], order: dict[str, Any], rng: random.Random
) -> list[InstanceOption]:
    oid, status = order["order_id"], order["status"]
    items = order["items"]
    read = _call("get_order_details", order_id=oid)
    paid = order["payment_history"][0]["payment_method_id"] if order["payment_history"] else None
    if paid not in user["payment_methods"]:  # no payment, or by a method no longer in the profile
        paid = None
    methods = user["payment_methods"]
    listed = " and ".join(_item_text(i) for i in items[:3])
    options: list[InstanceOption] = []
    if status == "pending":
        reason = rng.choice(["no longer needed", "ordered by mistake"])
        said = "you no longer need it" if reason == "no longer needed" else "you ordered it by mistake"
        options.append(
            InstanceOption(
                kind="cancel_pending_order",
                verdict="allowed",
                why="a pending order can be cancelled for either listed reason",
                request=f"You want to cancel your pending order {oid} ({listed}) because {said}.",
                calls=[read, _call("cancel_pending_order", order_id=oid, reason=reason)],
            )
        )
        others = [m for m in methods.values() if m["id"] != paid and m["source"] != "gift_card"]
        if paid is not None and others and len(order["payment_history"]) == 1:
            new = rng.choice(others)
            options.append(
                InstanceOption(
                    kind="modify_pending_order_payment",
                    verdict="allowed",
                    why="a pending order's payment can change to another method in the profile",
                    request=f"You want to pay for your pending order {oid} with your {_payment_text(new)} "
                    f"instead of your {_payment_text(methods[paid])}.",
                    calls=[
                        read,
                        _call("get_user_details", user_id=user["user_id"]),
                        _call("modify_pending_order_payment", order_id=oid, payment_method_id=new["id"]),
                    ],
                )
            )
    if status in ("pending", "delivered") and paid is not None:
        item = rng.choice(items)
        variant = _other_variant(db, item, rng)
        if variant is not None:
            tool = "modify_pending_order_items" if status == "pending" else "exchange_delivered_order_items"
            verb = "change" if status == "pending" else "exchange"
            options.append(
                InstanceOption(
                    kind=tool,
                    verdict="allowed",
                    why=f"a {status} order's item can become another available variant of its product",
                    request=f"You want to {verb} {_item_text(item)} in your order {oid} for the same "
                    f"product with {_changed(item['options'], variant['options'])}; any price difference "
                    f"goes to your {_payment_text(methods[paid])}.",
                    calls=[
                        read,
                        _call("get_product_details", product_id=item["product_id"]),
                        _call(
                            tool,
                            order_id=oid,
                            item_ids=[item["item_id"]],
                            new_item_ids=[variant["item_id"]],
                            payment_method_id=paid,
                        ),
                    ],
                )
            )
    if status == "delivered" and paid is not None:
        chosen = rng.sample(items, k=min(len(items), rng.choice([1, 1, 2])))
        options.append(
            InstanceOption(
                kind="return_delivered_order_items",
                verdict="allowed",
                why="delivered items can be returned, refunded to the original payment method",
                request=f"You want to return {' and '.join(_item_text(i) for i in chosen)} from your "
                f"order {oid}, refunded to your {_payment_text(methods[paid])}.",
                calls=[
                    read,
                    _call(
                        "return_delivered_order_items",
                        order_id=oid,
                        item_ids=[i["item_id"] for i in chosen],
                        payment_method_id=paid,
                    ),
                ],
            )
        )
    if status in ("delivered", "processed"):
        options.append(
            InstanceOption(
                kind="cancel_non_pending_order",
                verdict="refuse",
                why="only pending orders can be cancelled",
                request=f"You want to cancel your order {oid} ({listed}) because you no longer need it.",
                calls=[read],
            )
        )
    return options


def _customer(db: Db, owned: str, rng: random.Random) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A customer drawn from ``db`` and the records of collection ``owned`` they hold."""
    user = db["users"][rng.choice(sorted(db["users"]))]
    return user, [db[owned][key] for key in user[owned] if key in db[owned]]


def _retail_draw(db: Db, rng: random.Random) -> InstanceDraw | None:
    user, orders = _customer(db, "orders", rng)
    options = [opt for order in orders for opt in _retail_order_options(db, user, order, rng)]
    if not options:
        return None
    name, address = user["name"], user["address"]
    if rng.random() < 0.5:
        lookup = _call(
            "find_user_id_by_name_zip",
            first_name=name["first_name"],
            last_name=name["last_name"],
            zip=address["zip"],
        )
        identity = f"You are {name['first_name']} {name['last_name']} in zipcode {address['zip']}."
        unknown = "You do not remember your email address."
    else:
        lookup = _call("find_user_id_by_email", email=user["email"])
        identity = f"You are {name['first_name']} {name['last_name']}; your email is {user['email']}."
        unknown = ""
    for option in options:  # every request starts with the customer's identification
        option.calls.insert(0, lookup)
    return InstanceDraw(
        domain="retail", user_id=user["user_id"], identity=identity, unknown=unknown, options=options
    )


# --------------------------------------------------------------------------- airline

FREE_BAGS = {
    "regular": {"basic_economy": 0, "economy": 1, "business": 2},
    "silver": {"basic_economy": 1, "economy": 2, "business": 3},
    "gold": {"basic_economy": 2, "economy": 3, "business": 4},
}
"""The airline policy's free checked bags per passenger, by membership and cabin."""
CANCEL_REASONS = {
    "change of plan": "your plans changed",
    "health": "you are ill and cannot travel",
    "weather": "a storm is forecast on the day of travel",
}
NEW_PASSENGERS = (
    ("Maya", "Okafor"),
    ("Daniel", "Reyes"),
    ("Hannah", "Lindqvist"),
    ("Omar", "Haddad"),
    ("Priya", "Raman"),
    ("Lucas", "Moreau"),
    ("Grace", "Tanaka"),
    ("Tomas", "Novak"),
)


def _not_flown(reservation: dict[str, Any]) -> bool:
    """Every flight is after today (a flight today may have left already)."""
    return all(f["date"] > AIRLINE_NOW[:10] for f in reservation["flights"])


def _airline_cancelled(db: Db, reservation: dict[str, Any]) -> bool:
    for f in reservation["flights"]:
        status = (db["flights"].get(f["flight_number"], {}).get("dates", {}).get(f["date"]) or {}).get(
            "status"
        )
        if status == "cancelled":
            return True
    return False


def _cancel_verdict(db: Db, reservation: dict[str, Any], reason: str) -> tuple[bool, str]:
    """Whether the policy lets the agent cancel, and the rule that decides."""
    day_before = datetime.fromisoformat(AIRLINE_NOW) - timedelta(hours=24)
    if datetime.fromisoformat(reservation["created_at"]) >= day_before:
        return True, "booked within the last 24 hours"
    if _airline_cancelled(db, reservation):
        return True, "the airline cancelled a flight"
    if reservation["cabin"] == "business":
        return True, "business reservations can be cancelled"
    if reservation["insurance"] == "yes" and reason in ("health", "weather"):
        return True, "travel insurance covers the reason"
    return False, "none of the cancellation conditions holds"


def _route(reservation: dict[str, Any]) -> str:
    return (
        f"from {reservation['origin']} to {reservation['destination']} on {reservation['flights'][0]['date']}"
    )


def _airline_reservation_options(
    db: Db, user: dict[str, Any], reservation: dict[str, Any], rng: random.Random
) -> list[InstanceOption]:
    if not _not_flown(reservation):
        return []
    rid, uid = reservation["reservation_id"], user["user_id"]
    reads = [_call("get_user_details", user_id=uid), _call("get_reservation_details", reservation_id=rid)]
    where = f"reservation {rid} ({_route(reservation)})"
    options: list[InstanceOption] = []
    reason = rng.choice(sorted(CANCEL_REASONS))
    allowed, why = _cancel_verdict(db, reservation, reason)
    options.append(
        InstanceOption(
            kind="cancel_reservation" if allowed else "cancel_reservation_refused",
            verdict="allowed" if allowed else "refuse",
            why=why,
            request=f"You want to cancel your {where} because {CANCEL_REASONS[reason]}.",
            calls=[*reads, _call("cancel_reservation", reservation_id=rid)] if allowed else list(reads),
        )
    )
    payers = [
        m
        for m in user["payment_methods"].values()
        if m["source"] == "credit_card" or (m["source"] == "gift_card" and m.get("amount", 0) >= 100)
    ]
    if payers:
        added = rng.choice([1, 2])
        free = FREE_BAGS[user["membership"]][reservation["cabin"]] * len(reservation["passengers"])
        total = reservation["total_baggages"] + added
        nonfree = max(reservation["nonfree_baggages"], total - free)
        payer = rng.choice(payers)
        options.append(
            InstanceOption(
                kind="update_reservation_baggages",
                verdict="allowed",
                why="checked bags can be added; the free allowance follows membership and cabin",
                request=f"You want to add {_plural(added, 'checked bag')} to your {where}, and to pay any "
                f"fee with your {_payment_text(payer)}.",
                calls=[
                    *reads,
                    _call(
                        "update_reservation_baggages",
                        reservation_id=rid,
                        total_baggages=total,
                        nonfree_baggages=nonfree,
                        payment_id=payer["id"],
                    ),
                ],
            )
        )
    passengers = [dict(p) for p in reservation["passengers"]]
    index = rng.randrange(len(passengers))
    first, last = rng.choice(NEW_PASSENGERS)
    dob = f"{rng.randint(1955, 2004)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    old = passengers[index]
    passengers[index] = {"first_name": first, "last_name": last, "dob": dob}
    options.append(
        InstanceOption(
            kind="update_reservation_passengers",
            verdict="allowed",
            why="passengers can change as long as their number stays the same",
            request=f"On your {where}, you want to replace the passenger {old['first_name']} {old['last_name']} "
            f"with {first} {last}, born {dob}.",
            calls=[*reads, _call("update_reservation_passengers", reservation_id=rid, passengers=passengers)],
        )
    )
    return options


def _airline_draw(db: Db, rng: random.Random) -> InstanceDraw | None:
    user, reservations = _customer(db, "reservations", rng)
    options = [opt for r in reservations for opt in _airline_reservation_options(db, user, r, rng)]
    if not options:
        return None
    name = user["name"]
    identity = f"You are {name['first_name']} {name['last_name']}. Your user id is {user['user_id']}."
    return InstanceDraw(domain="airline", user_id=user["user_id"], identity=identity, options=options)


DRAWS: dict[str, Callable[[Db, random.Random], InstanceDraw | None]] = {
    "airline": _airline_draw,
    "retail": _retail_draw,
}


def draw_instance(domain: str, db: Db, rng: random.Random, tries: int = 20) -> InstanceDraw:
    """The random pool: a customer of ``db`` with at least one request (redrawn up to ``tries`` times)."""
    if domain not in DRAWS:
        raise ValueError(f"new instances cover {', '.join(INSTANCE_DOMAINS)}, not {domain!r}")
    for _ in range(tries):
        drawn = DRAWS[domain](db, rng)
        if drawn is not None:
            return drawn
    raise ValueError(f"no customer of the {domain} database with a request in {tries} draws")


# --------------------------------------------------------------------------- the tau2 task


def instance_task(draw: InstanceDraw, scenario: InstanceScenario) -> dict[str, Any]:
    """The tau2 task of a written scenario: its id is the content hash of what it asks and checks."""
    option = draw.options[scenario.option]
    instructions = {
        "domain": draw.domain,
        "reason_for_call": scenario.reason_for_call.strip(),
        "known_info": scenario.known_info.strip() or draw.identity,
        "unknown_info": scenario.unknown_info.strip() or None,
        "task_instructions": scenario.task_instructions.strip(),
    }
    calls = [{"name": c.name, "arguments": c.arguments} for c in option.calls]
    task_id = content_hash({"instructions": instructions, "calls": calls}, prefix="new-", length=16)
    basis = ["DB", "COMMUNICATE"] if option.communicate_info else ["DB"]
    return {
        "id": task_id,
        "description": {
            "purpose": f"{option.kind}: {option.why}",
            "relevant_policies": None,
            "notes": "arena new instance",
        },
        "user_scenario": {"persona": None, "instructions": instructions},
        "initial_state": None,
        "evaluation_criteria": {
            "actions": [
                {"action_id": f"{task_id}_{i}", "name": c["name"], "arguments": c["arguments"], "info": None}
                for i, c in enumerate(calls)
            ],
            "communicate_info": list(option.communicate_info),
            "nl_assertions": None,
            "reward_basis": basis,
        },
    }


def write_signature(task: dict[str, Any], writes: set[str]) -> str:
    """What a task changes: its gold writes (name and arguments); '' when it changes nothing."""
    actions = (task.get("evaluation_criteria") or {}).get("actions") or []
    done = [
        {"name": a["name"], "arguments": a.get("arguments") or {}} for a in actions if a["name"] in writes
    ]
    return content_hash(done, length=16) if done else ""


# --------------------------------------------------------------------------- novelty


class Novelty(BaseModel):
    """How close a new instance comes to the domain's existing tasks."""

    duplicate_of: Annotated[str, Field(description="The task it near-duplicates ('' when novel).")] = ""
    split: Annotated[str, Field(description="That task's split (train or test).")] = ""
    by: Annotated[str, Field(description="ngram, embedding or writes ('' when novel).")] = ""
    ngram: Annotated[float, Field(description="Largest 5-gram containment with any task's scenario.")]
    cosine: Annotated[float, Field(description="Largest embedding cosine with any task's scenario.")]
    nearest_test_cosine: Annotated[float, Field(description="Largest cosine with a test-split scenario.")]


class NoveltyIndex:
    """The domain's tasks (both splits) and the instances accepted so far, to test a new one against."""

    def __init__(self, tasks: Sequence[Tau2Task], writes: set[str]) -> None:
        self.writes = writes
        self.ids = [t.task_id for t in tasks]
        self.splits = [t.split for t in tasks]
        texts = [user_instructions(t.raw) for t in tasks]
        self.grams = [ngrams(text) for text in texts]
        self.vectors = embed_texts(texts)
        self.signatures = {s: i for i, t in enumerate(tasks) if (s := write_signature(t.raw, writes))}
        """Write signature -> index of the first task that makes those writes."""

    def _measure(self, task: dict[str, Any]) -> tuple[frozenset[str], np.ndarray, Novelty]:
        """The scenario's n-grams and embedding, and how close it comes to the tasks held."""
        text = user_instructions(task)
        grams = ngrams(text)
        overlaps = [containment(grams, other) for other in self.grams]
        vector = embed_texts([text])[0]
        cosines = self.vectors @ vector if len(self.ids) else np.zeros(0, dtype=np.float32)
        tests = [float(c) for c, split in zip(cosines, self.splits, strict=True) if split == "test"]
        novelty = Novelty(
            ngram=round(max(overlaps, default=0.0), 4),
            cosine=round(float(cosines.max()) if len(cosines) else 0.0, 4),
            nearest_test_cosine=round(max(tests, default=0.0), 4),
        )
        signature = write_signature(task, self.writes)
        found: tuple[int, str] | None = None
        if signature and signature in self.signatures:
            found = (self.signatures[signature], "writes")
        elif novelty.ngram >= NEAR_DUPLICATE:
            found = (overlaps.index(max(overlaps)), "ngram")
        elif novelty.cosine >= COSINE_THRESHOLD:
            found = (int(np.argmax(cosines)), "embedding")
        if found is not None:
            novelty.duplicate_of, novelty.split, novelty.by = (
                self.ids[found[0]],
                self.splits[found[0]],
                found[1],
            )
        return grams, vector, novelty

    def check(self, task: dict[str, Any]) -> Novelty:
        """Near-duplicate or not, with the closest figures (the index is left as it is)."""
        return self._measure(task)[2]

    def admit(self, task: Tau2Task) -> Novelty:
        """``check``, and a novel instance joins the index: a later one must not repeat it either."""
        grams, vector, novelty = self._measure(task.raw)
        if not novelty.duplicate_of:
            signature = write_signature(task.raw, self.writes)
            if signature:
                self.signatures.setdefault(signature, len(self.ids))
            self.ids.append(task.task_id)
            self.splits.append(task.split)
            self.grams.append(grams)
            self.vectors = np.vstack([self.vectors, vector[None, :]])
        return novelty

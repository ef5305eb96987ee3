"""Seeded database generator for the Northwind Outfitters order desk (standard library only).

``generate(seed, size)`` returns the JSON database the tools work on; the same seed and size give
the same database. ``reference_task(state, seed)`` picks the demo task on such a database: the
user instructions and the reference trajectory's calls.
"""

import datetime
import random
from typing import Any

SIZES = {"small": (8, 10), "medium": (40, 16), "large": (200, 16)}
"""size -> (customers, products)."""

FIRST = ["Ana", "Ben", "Chloe", "Dmitri", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luca"]
LAST = ["Silva", "Okafor", "Martin", "Ivanova", "Yilmaz", "Haddad", "Chen", "Tanaka", "Moreau", "Berg"]
STREETS = ["Harbor Road", "Maple Avenue", "Cedar Lane", "Mill Street", "Lakeview Drive", "Orchard Way"]
CITIES = [("Portland", "972"), ("Denver", "802"), ("Austin", "787"), ("Madison", "537"), ("Boise", "837")]
CATALOGUE = [
    ("Alpine Rain Jacket", "outerwear", 129.0, ["S", "M", "L", "XL"], ["red", "navy"]),
    ("Summit Down Parka", "outerwear", 249.0, ["S", "M", "L"], ["black", "olive"]),
    ("Trail Runner Shoes", "footwear", 119.0, ["40", "41", "42", "43", "44"], ["grey", "blue"]),
    ("Ridge Hiking Boots", "footwear", 179.0, ["40", "42", "44"], ["brown"]),
    ("Ultralight Tent 2P", "camping", 329.0, ["2P"], ["green", "orange"]),
    ("Camp Stove Mini", "camping", 59.0, ["one size"], ["steel"]),
    ("Merino Base Layer", "apparel", 79.0, ["S", "M", "L"], ["charcoal", "sand"]),
    ("Trekking Poles", "accessories", 89.0, ["one size"], ["black", "blue"]),
    ("Insulated Bottle 1L", "accessories", 34.0, ["one size"], ["white", "teal", "black"]),
    ("Daypack 24L", "bags", 99.0, ["one size"], ["red", "grey"]),
    ("Sleeping Bag -5C", "camping", 199.0, ["regular", "long"], ["blue"]),
    ("Headlamp 400", "accessories", 45.0, ["one size"], ["black"]),
    ("Softshell Pants", "apparel", 109.0, ["S", "M", "L", "XL"], ["black", "khaki"]),
    ("Wool Hiking Socks", "apparel", 24.0, ["S", "M", "L"], ["grey"]),
    ("Packable Windbreaker", "outerwear", 69.0, ["S", "M", "L"], ["yellow", "blue"]),
    ("Camp Chair", "camping", 64.0, ["one size"], ["green"]),
]
STATUSES = ["pending", "processing", "shipped", "delivered", "delivered", "cancelled"]


def _address(rng: random.Random) -> dict[str, Any]:
    city, prefix = rng.choice(CITIES)
    return {
        "line1": f"{rng.randint(2, 980)} {rng.choice(STREETS)}",
        "line2": rng.choice(["", "", f"Apt {rng.randint(1, 40)}"]),
        "city": city,
        "zip_code": f"{prefix}{rng.randint(10, 99)}",
        "country": "US",
    }


def _products(rng: random.Random, count: int) -> dict[str, Any]:
    products: dict[str, Any] = {}
    for n, (name, category, price, sizes, colours) in enumerate(CATALOGUE[:count]):
        product_id = f"P-{101 + n}"
        variants = []
        for size in sizes:
            for colour in colours:
                variants.append(
                    {
                        "item_id": f"I-{rng.randint(10000, 99999)}",
                        "options": {"size": size, "color": colour},
                        "price": round(price + rng.choice([0.0, 0.0, 5.0, 10.0]), 2),
                        "available": rng.random() < 0.8,
                    }
                )
        products[product_id] = {
            "product_id": product_id,
            "name": name,
            "category": category,
            "variants": variants,
        }
    return products


def _order(
    rng: random.Random,
    order_id: str,
    user: dict[str, Any],
    products: dict[str, Any],
    today: datetime.date,
    status: str,
) -> dict[str, Any]:
    placed = today - datetime.timedelta(
        days=rng.randint(1, 70) if status in ("delivered", "cancelled") else rng.randint(0, 6)
    )
    delivered = None
    if status == "delivered":
        delivered = min(today, placed + datetime.timedelta(days=rng.randint(2, 6))).isoformat()
    items = []
    for product in rng.sample(sorted(products.values(), key=lambda p: p["product_id"]), rng.randint(1, 3)):
        variant = rng.choice(product["variants"])
        items.append(
            {
                "item_id": variant["item_id"],
                "product_id": product["product_id"],
                "name": product["name"],
                "options": dict(variant["options"]),
                "price": variant["price"],
                "status": "ordered",
            }
        )
    return {
        "order_id": order_id,
        "user_id": user["user_id"],
        "status": status,
        "items": items,
        "total": round(sum(i["price"] for i in items), 2),
        "placed_on": placed.isoformat(),
        "delivered_on": delivered,
        "shipping_address": dict(user["address"]),
        "address_change_count": 0,
        "payment_method": user["payment_method"],
        "notes": [],
    }


def _eligible(state: dict[str, Any], user_id: str) -> bool:
    today = datetime.date.fromisoformat(state["today"])
    orders = [o for o in state["orders"].values() if o["user_id"] == user_id]
    recent = any(
        o["status"] == "delivered" and (today - datetime.date.fromisoformat(o["delivered_on"])).days <= 30
        for o in orders
    )
    return recent and any(o["status"] in ("pending", "processing") for o in orders)


def generate(seed: int, size: str = "small") -> dict[str, Any]:
    """The shop's database for ``seed``: customers, catalogue, orders, an empty session."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    rng = random.Random(f"customer_service:{seed}:{size}")
    n_users, n_products = SIZES[size]
    today = datetime.date(2025, 3, 1) + datetime.timedelta(days=rng.randint(0, 90))
    products = _products(rng, n_products)
    users: dict[str, Any] = {}
    orders: dict[str, Any] = {}
    credits: list[dict[str, Any]] = []
    user_numbers = rng.sample(range(1000, 9999), n_users)
    order_numbers = iter(rng.sample(range(10000, 99999), n_users * 4))
    for n in user_numbers:
        first, last = rng.choice(FIRST), rng.choice(LAST)
        user: dict[str, Any] = {
            "user_id": f"U-{n}",
            "name": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}{n % 100}@example.com",
            "phone": f"+1-555-{rng.randint(100, 999)}-{rng.randint(1000, 9999)}",
            "tier": rng.choice(["standard", "standard", "plus"]),
            "address": _address(rng),
            "payment_method": rng.choice(["card_visa_", "card_amex_", "paypal_"])
            + str(rng.randint(1000, 9999)),
            "sms_code": f"{rng.randint(0, 999999):06d}",
            "store_credit_balance": 0.0,
        }
        if rng.random() < 0.3:  # goodwill credit earlier this month
            amount = float(rng.choice([10, 20, 30]))
            credits.append(
                {
                    "credit_id": f"CR-{len(credits) + 1:04d}",
                    "user_id": user["user_id"],
                    "amount": amount,
                    "reason": "late delivery goodwill",
                    "month": today.isoformat()[:7],
                    "created_at": f"{today.isoformat()[:8]}01T09:00:00+00:00",
                }
            )
            user["store_credit_balance"] = amount
        users[user["user_id"]] = user
        for status in rng.sample(STATUSES, rng.randint(2, 4)):
            order_id = f"O-{next(order_numbers)}"
            orders[order_id] = _order(rng, order_id, user, products, today, status)
    state = {
        "today": today.isoformat(),
        "session": {"code_sent_to": None, "verified_user_id": None},
        "users": users,
        "products": products,
        "orders": orders,
        "refunds": [],
        "credits": credits,
        "charges": {},
        "damage_reports": [],
        "tickets": [],
    }
    if not any(_eligible(state, u) for u in users):  # the demo task needs one such customer
        first_user = next(iter(users.values()))
        mine = [o for o in orders.values() if o["user_id"] == first_user["user_id"]]
        mine[0].update(
            status="delivered",
            placed_on=(today - datetime.timedelta(days=8)).isoformat(),
            delivered_on=(today - datetime.timedelta(days=4)).isoformat(),
        )
        mine[1].update(
            status="processing", placed_on=(today - datetime.timedelta(days=1)).isoformat(), delivered_on=None
        )
    return state


DAMAGE = {
    "outerwear": "the main zipper is torn out of the seam",
    "footwear": "the sole of one shoe is coming off",
    "camping": "it arrived with a cracked frame and bent parts",
    "apparel": "there is a large hole along the side seam",
    "accessories": "it arrived cracked and does not work",
    "bags": "one shoulder strap ripped off on first use",
}


def reference_task(state: dict[str, Any], seed: int) -> dict[str, Any]:
    """The demo task: refund a damaged item of a recent delivery, and re-route a pending order.

    Returns ``{"user_instructions", "requirements", "calls"}``; ``calls`` is the reference
    trajectory (``name``, ``arguments``, ``actor``) an ideal agent and user perform.
    """
    rng = random.Random(f"task:{seed}")
    users = sorted(u for u in state["users"] if _eligible(state, u))
    if not users:
        raise ValueError("no customer has both a recent delivery and an order not yet shipped")
    user = state["users"][rng.choice(users)]
    today = datetime.date.fromisoformat(state["today"])
    mine = sorted(
        (o for o in state["orders"].values() if o["user_id"] == user["user_id"]), key=lambda o: o["order_id"]
    )
    delivered = next(
        o
        for o in mine
        if o["status"] == "delivered" and (today - datetime.date.fromisoformat(o["delivered_on"])).days <= 30
    )
    pending = next(o for o in mine if o["status"] in ("pending", "processing"))
    item = max(delivered["items"], key=lambda i: (i["price"], i["item_id"]))
    category = state["products"][item["product_id"]]["category"]
    damage = DAMAGE.get(category, "it arrived broken")
    new = {"line1": f"{rng.randint(2, 980)} {rng.choice(STREETS)}", "city": rng.choice(CITIES)[0]}
    new["zip_code"] = f"{dict(CITIES)[new['city']]}{rng.randint(10, 99)}"
    instructions = (
        f"You are {user['name']} (email {user['email']}). Your order {delivered['order_id']} arrived, but the "
        f"{item['name']} is damaged: {damage}. You want a refund of its price ({item['price']:.2f} USD) to your "
        f"original payment method, not store credit. You will upload photos of the damage in the app when asked. "
        f"You also want your order {pending['order_id']}, which has not shipped yet, sent to your new address: "
        f"{new['line1']}, {new['city']} {new['zip_code']}. If you are sent a verification code, the code on your "
        f"phone is {user['sms_code']}."
    )
    requirements = [
        f"Hi, my {item['name']} from order {delivered['order_id']} arrived damaged: {damage}.",
        f"I'd like a refund of {item['price']:.2f} USD to my original payment method.",
        f"Also, please ship my order {pending['order_id']} to {new['line1']}, {new['city']} {new['zip_code']}.",
    ]
    uid = user["user_id"]
    calls = [
        {"actor": "agent", "name": "find_user_by_email", "arguments": {"email": user["email"]}},
        {"actor": "agent", "name": "send_verification_code", "arguments": {"user_id": uid}},
        {
            "actor": "user",
            "name": "confirm_identity_code",
            "arguments": {"user_id": uid, "code": user["sms_code"]},
        },
        {"actor": "agent", "name": "get_order_details", "arguments": {"order_id": delivered["order_id"]}},
        {
            "actor": "user",
            "name": "report_damage",
            "arguments": {
                "order_id": delivered["order_id"],
                "item_id": item["item_id"],
                "description": damage,
            },
        },
        {
            "actor": "agent",
            "name": "issue_refund",
            "arguments": {
                "order_id": delivered["order_id"],
                "amount": item["price"],
                "reason": f"damaged item {item['name']}: {damage}",
            },
        },
        {"actor": "agent", "name": "get_order_details", "arguments": {"order_id": pending["order_id"]}},
        {
            "actor": "agent",
            "name": "update_order_address",
            "arguments": {"order_id": pending["order_id"], **new},
        },
    ]
    return {"user_instructions": instructions, "requirements": requirements, "calls": calls}

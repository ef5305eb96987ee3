"""Seeded database generator for the Brightwave Mobile support desk (standard library only).

``generate(seed, size)`` returns customers, plans, lines and each line's phone (``devices``,
keyed by phone number) with seeded faults: airplane mode left on, mobile data off, a trip abroad
without roaming, data used up, a suspended line (some with an overdue balance).
"""

import datetime
import random
from typing import Any

SIZES = {"small": 8, "medium": 40, "large": 200}
"""size -> customers."""

FIRST = ["Ana", "Ben", "Chloe", "Dmitri", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luca"]
LAST = ["Silva", "Okafor", "Martin", "Ivanova", "Yilmaz", "Haddad", "Chen", "Tanaka", "Moreau", "Berg"]
PLANS: dict[str, dict[str, Any]] = {
    "PL-10": {"plan_id": "PL-10", "name": "Basic 5", "data_gb": 5, "roaming_included": False, "price": 15.0},
    "PL-20": {"plan_id": "PL-20", "name": "Plus 20", "data_gb": 20, "roaming_included": True, "price": 30.0},
    "PL-30": {"plan_id": "PL-30", "name": "Max 50", "data_gb": 50, "roaming_included": True, "price": 45.0},
}


def _line(rng: random.Random, line_id: str, customer_id: str, phone: str) -> dict[str, Any]:
    plan = rng.choice(sorted(PLANS))
    limit = int(PLANS[plan]["data_gb"])
    used_up = rng.random() < 0.35
    suspended = rng.random() < 0.2
    return {
        "line_id": line_id,
        "customer_id": customer_id,
        "phone_number": phone,
        "plan_id": plan,
        "status": "suspended" if suspended else "active",
        "roaming_enabled": False,
        "data_limit_gb": limit,
        "data_used_gb": float(limit) if used_up else round(rng.uniform(0.2, limit * 0.8), 1),
        "data_refills_this_month": rng.choice([0, 0, 1, 2]) if used_up else 0,
        "overdue_balance": rng.choice([0.0, 0.0, 23.5, 41.0]) if suspended else 0.0,
    }


def _device(rng: random.Random, line: dict[str, Any]) -> dict[str, Any]:
    abroad = rng.random() < 0.3
    return {
        "phone_number": line["phone_number"],
        "customer_id": line["customer_id"],
        "line_id": line["line_id"],
        "model": rng.choice(["Pixel 8", "iPhone 14", "Galaxy S23", "Moto G"]),
        "airplane_mode": rng.random() < 0.25,
        "mobile_data": rng.random() > 0.25,
        "data_roaming": False,
        "location": "abroad" if abroad else "home",
    }


def generate(seed: int, size: str = "small") -> dict[str, Any]:
    """The desk's database for ``seed``: customers, plans, lines, the customers' phones."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    rng = random.Random(f"phone_support:{seed}:{size}")
    today = datetime.date(2025, 5, 1) + datetime.timedelta(days=rng.randint(0, 60))
    customers: dict[str, Any] = {}
    lines: dict[str, Any] = {}
    devices: dict[str, Any] = {}
    numbers = iter(rng.sample(range(1000, 9999), SIZES[size] * 4))  # two lines at most, two numbers each
    for n in rng.sample(range(1000, 9999), SIZES[size]):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        customer_id = f"C-{n}"
        mine = []
        for _ in range(rng.choice([1, 1, 2])):
            line_id = f"L-{next(numbers)}"
            phone = f"+1-555-{rng.randint(200, 999)}-{next(numbers)}"
            line = _line(rng, line_id, customer_id, phone)
            lines[line_id] = line
            devices[phone] = _device(rng, line)
            mine.append(line_id)
        customers[customer_id] = {
            "customer_id": customer_id,
            "name": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}{n % 100}@example.net",
            "line_ids": mine,
        }
    return {
        "today": today.isoformat(),
        "customers": customers,
        "plans": {k: dict(v) for k, v in PLANS.items()},
        "lines": lines,
        "devices": devices,
        "notes": [],
    }

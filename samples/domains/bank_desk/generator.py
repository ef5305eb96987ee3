"""Seeded database generator for the Harbor Community Bank service desk (standard library only).

``generate(seed, size)`` returns customers, their accounts (some empty), fees (some above the
waivable amount or too old, some on accounts that already had this year's waiver) and credit
cards (some too new or with late payments): a bank where many requests are refused by policy.
"""

import datetime
import random
from typing import Any

SIZES = {"small": 8, "medium": 40, "large": 200}
"""size -> customers."""

FIRST = ["Ana", "Ben", "Chloe", "Dmitri", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Luca"]
LAST = ["Silva", "Okafor", "Martin", "Ivanova", "Yilmaz", "Haddad", "Chen", "Tanaka", "Moreau", "Berg"]
FEES = [("overdraft", 35.0), ("overdraft", 29.0), ("monthly", 12.0), ("wire", 45.0), ("paper statement", 5.0)]


def _day(today: datetime.date, days_ago: int) -> str:
    return (today - datetime.timedelta(days=days_ago)).isoformat()


def generate(seed: int, size: str = "small") -> dict[str, Any]:
    """The bank's database for ``seed``: customers, accounts, fees, cards, an empty session."""
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    rng = random.Random(f"bank_desk:{seed}:{size}")
    today = datetime.date(2025, 6, 1) + datetime.timedelta(days=rng.randint(0, 120))
    customers: dict[str, Any] = {}
    accounts: dict[str, Any] = {}
    fees: dict[str, Any] = {}
    cards: dict[str, Any] = {}
    ids = iter(rng.sample(range(10000, 99999), SIZES[size] * 12))
    for n in rng.sample(range(1000, 9999), SIZES[size]):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        customer_id = f"C-{n}"
        customers[customer_id] = {
            "customer_id": customer_id,
            "name": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}{n % 100}@example.org",
            "phone": f"+1-555-{rng.randint(200, 999)}-{rng.randint(1000, 9999)}",
            "customer_since": _day(today, rng.randint(100, 3000)),
            "security_code": f"{rng.randint(0, 999999):06d}",
        }
        for kind in rng.sample(["checking", "savings", "savings"], rng.randint(1, 2)):
            account_id = f"A-{next(ids)}"
            accounts[account_id] = {
                "account_id": account_id,
                "customer_id": customer_id,
                "type": kind,
                "status": "open",
                "balance": 0.0 if rng.random() < 0.35 else round(rng.uniform(20, 4000), 2),
                "opened_on": _day(today, rng.randint(60, 2000)),
                "fee_waivers_this_year": rng.choice([0, 0, 1]),
            }
            if kind == "checking" or rng.random() < 0.5:
                for _ in range(rng.randint(1, 2)):
                    fee_kind, amount = rng.choice(FEES)
                    fee_id = f"F-{next(ids)}"
                    fees[fee_id] = {
                        "fee_id": fee_id,
                        "account_id": account_id,
                        "customer_id": customer_id,
                        "kind": fee_kind,
                        "amount": amount,
                        "charged_on": _day(today, rng.choice([3, 12, 25, 40, 90])),
                        "status": "charged",
                    }
        if rng.random() < 0.8:
            card_id = f"K-{next(ids)}"
            cards[card_id] = {
                "card_id": card_id,
                "customer_id": customer_id,
                "status": "active",
                "credit_limit": float(rng.choice([1000, 1500, 2500, 4000])),
                "opened_on": _day(today, rng.choice([45, 120, 400, 900])),
                "late_payments": rng.choice([0, 0, 0, 1, 2]),
            }
    return {
        "today": today.isoformat(),
        "session": {"code_sent_to": None, "verified_customer_id": None},
        "customers": customers,
        "accounts": accounts,
        "fees": fees,
        "cards": cards,
        "transfers": [],
    }

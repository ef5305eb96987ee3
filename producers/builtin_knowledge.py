"""The built-in knowledge bases: seeded relational tables for real estate, e-commerce and healthcare.

Each is a few small tables linked by foreign keys (a listing's agent, that agent's agency, the
agency's city), so multi-hop questions exist; ``arena demo`` and ``arena publish qa --builtin``
publish them. ``PROSE_DOMAINS`` are sample knowledge bases of prose only (Markdown under
``samples/knowledge``), for the passage path: ``arena publish qa --builtin world_facts``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import samples
from arena.records.envs import Cell, KbTable, KnowledgeBase
from producers.knowledge import KnowledgeError, load_knowledge

BUILTIN_DOMAINS: tuple[str, ...] = ("real_estate", "e_commerce", "healthcare")
PROSE_DOMAINS: tuple[str, ...] = ("world_facts",)
"""Sample knowledge bases of prose (passages, no tables); not part of ``arena demo``."""
PROSE_DIR = Path(samples.__file__).parent / "knowledge"


_FIRST = [
    "Ava", "Liam", "Maya", "Noah", "Zoe", "Ethan", "Iris", "Owen", "Lena", "Caleb", "Nora", "Felix",
    "Ruby", "Hugo", "Clara", "Jonah", "Mila", "Silas", "Hazel", "Theo", "Elena", "Marcus", "Priya",
    "Diego", "Amara", "Tobias", "Yara", "Quinn",
]  # fmt: skip
_LAST = [
    "Whitfield", "Navarro", "Okafor", "Lindqvist", "Brennan", "Castellano", "Haddad", "Moreau",
    "Kowalski", "Tanaka", "Delgado", "Abernathy", "Sorensen", "Fairbanks", "Iqbal", "Rourke",
    "Valdez", "Hartmann", "Oyelaran", "Pemberton", "Quist", "Ramanathan", "Szabo", "Thornbury",
]  # fmt: skip
_CITIES = [
    ("Austin", "Texas"), ("Denver", "Colorado"), ("Portland", "Oregon"), ("Raleigh", "North Carolina"),
    ("Tucson", "Arizona"), ("Madison", "Wisconsin"), ("Boise", "Idaho"), ("Omaha", "Nebraska"),
    ("Tampa", "Florida"), ("Spokane", "Washington"), ("Fresno", "California"), ("Reno", "Nevada"),
    ("Savannah", "Georgia"), ("Eugene", "Oregon"), ("Lubbock", "Texas"), ("Pueblo", "Colorado"),
    ("Duluth", "Minnesota"), ("Asheville", "North Carolina"),
]  # fmt: skip
_BRANDS = [
    "Maple", "Summit", "Harbor", "Cedar", "Granite", "Willow", "Beacon", "Silverline", "Northgate",
    "Bluebird", "Keystone", "Redwood", "Lakeside", "Ironwood", "Meadowbrook", "Crescent", "Juniper",
    "Tidewater", "Copperfield", "Larkspur",
]  # fmt: skip
_STREETS = [
    "Oak", "Elm", "Birch", "Magnolia", "Sycamore", "Poplar", "Chestnut", "Hawthorn", "Alder", "Linden",
    "Walnut", "Aspen", "Cypress", "Hickory", "Laurel", "Sequoia", "Dogwood", "Spruce", "Mulberry",
    "Buckeye",
]  # fmt: skip


def _names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct full names."""
    pairs = [(f, last) for f in _FIRST for last in _LAST]
    return [f"{f} {last}" for f, last in rng.sample(pairs, n)]


def _ids(prefix: str, start: int, n: int) -> list[str]:
    return [f"{prefix}-{start + i}" for i in range(n)]


def _distinct_ints(rng: random.Random, low: int, high: int, step: int, n: int) -> list[int]:
    return rng.sample(range(low, high + 1, step), n)


def _table(
    name: str, entity: str, columns: list[str], rows: list[list[Cell]], links: dict[str, str] | None = None
) -> KbTable:
    return KbTable(
        name=name,
        entity=entity,
        key=columns[0],
        columns=columns,
        rows=[dict(zip(columns, row, strict=True)) for row in rows],
        links=links or {},
    )


def _real_estate(rng: random.Random) -> list[KbTable]:
    cities = rng.sample(_CITIES, 12)
    city_rows: list[list[Cell]] = [
        [city, state, pop, price]
        for (city, state), pop, price in zip(
            cities,
            _distinct_ints(rng, 80_000, 990_000, 1_000, 12),
            _distinct_ints(rng, 240_000, 780_000, 1_000, 12),
            strict=True,
        )
    ]
    agency_ids = _ids("AG", 101, 14)
    agency_names = [
        f"{b} {rng.choice(['Realty', 'Properties', 'Homes', 'Estates'])}" for b in rng.sample(_BRANDS, 14)
    ]
    agency_rows: list[list[Cell]] = [
        [aid, name, rng.choice(cities)[0], rng.randint(1962, 2021), rng.randint(2, 6)]
        for aid, name in zip(agency_ids, agency_names, strict=True)
    ]
    agent_ids = _ids("AGT", 201, 16)
    agent_rows: list[list[Cell]] = [
        [
            aid,
            name,
            rng.choice(agency_ids),
            rng.randint(1, 32),
            rng.choice(["residential", "commercial", "luxury", "rentals"]),
        ]
        for aid, name in zip(agent_ids, _names(rng, 16), strict=True)
    ]
    streets = [
        f"{rng.randint(10, 989)} {s} {rng.choice(['Street', 'Avenue', 'Lane', 'Road'])}"
        for s in rng.sample(_STREETS, 18)
    ]
    listing_rows: list[list[Cell]] = [
        [
            lid,
            street,
            price,
            rng.randint(1, 6),
            rng.choice(["condo", "townhouse", "single-family", "duplex"]),
            rng.choice(["active", "pending", "sold"]),
            rng.choice(agent_ids),
        ]
        for lid, street, price in zip(
            _ids("L", 1001, 18), streets, _distinct_ints(rng, 185_000, 1_450_000, 5_000, 18), strict=True
        )
    ]
    return [
        _table("cities", "city", ["city", "state", "population", "median_home_price"], city_rows),
        _table(
            "agencies",
            "agency",
            ["agency_id", "name", "city", "founded_year", "commission_pct"],
            agency_rows,
            {"city": "cities"},
        ),
        _table(
            "agents",
            "agent",
            ["agent_id", "name", "agency_id", "years_experience", "specialty"],
            agent_rows,
            {"agency_id": "agencies"},
        ),
        _table(
            "listings",
            "listing",
            ["listing_id", "address", "price", "bedrooms", "property_type", "status", "agent_id"],
            listing_rows,
            {"agent_id": "agents"},
        ),
    ]


_CATEGORIES = [
    ("Electronics", "Tech"), ("Kitchenware", "Home"), ("Gardening", "Home"), ("Toys", "Leisure"),
    ("Books", "Leisure"), ("Sporting Goods", "Leisure"), ("Beauty", "Personal"), ("Office Supplies", "Tech"),
    ("Pet Supplies", "Home"), ("Musical Instruments", "Leisure"), ("Camping Gear", "Leisure"),
    ("Automotive", "Tech"), ("Home Decor", "Home"), ("Baby Care", "Personal"), ("Wearables", "Tech"),
]  # fmt: skip
_PRODUCT_NOUNS = [
    "Kettle", "Headphones", "Trowel", "Puzzle", "Lantern", "Blender", "Backpack", "Desk Lamp", "Yoga Mat",
    "Tent", "Ukulele", "Dash Camera", "Throw Pillow", "Stroller", "Smartwatch", "Notebook", "Leash",
    "Skillet", "Hammock", "Speaker",
]  # fmt: skip
_PRODUCT_ADJ = ["Aero", "Nimbus", "Vertex", "Orchid", "Pioneer", "Zephyr", "Atlas", "Echo", "Solace", "Nova"]


def _e_commerce(rng: random.Random) -> list[KbTable]:
    categories = rng.sample(_CATEGORIES, 12)
    category_rows: list[list[Cell]] = [
        [name, dept, rng.randint(0, 12), rng.choice([14, 30, 60, 90])] for name, dept in categories
    ]
    supplier_ids = _ids("SUP", 301, 14)
    supplier_rows: list[list[Cell]] = [
        [
            sid,
            f"{brand} {rng.choice(['Trading', 'Supply', 'Goods', 'Imports'])}",
            rng.choice(["Germany", "Japan", "Mexico", "Canada", "Vietnam", "Poland", "Brazil"]),
            rng.randint(1, 5),
            rng.randint(2, 40),
        ]
        for sid, brand in zip(supplier_ids, rng.sample(_BRANDS, 14), strict=True)
    ]
    skus = _ids("SKU", 4001, 18)
    names = [f"{a} {n}" for a, n in rng.sample([(a, n) for a in _PRODUCT_ADJ for n in _PRODUCT_NOUNS], 18)]
    product_rows: list[list[Cell]] = [
        [sku, name, rng.choice(categories)[0], rng.choice(supplier_ids), price, rng.randint(0, 480)]
        for sku, name, price in zip(skus, names, _distinct_ints(rng, 6, 940, 1, 18), strict=True)
    ]
    order_rows: list[list[Cell]] = [
        [
            oid,
            rng.choice(skus),
            customer,
            rng.randint(1, 12),
            rng.choice(["processing", "shipped", "delivered", "cancelled"]),
        ]
        for oid, customer in zip(_ids("ORD", 7001, 20), _names(rng, 20), strict=True)
    ]
    return [
        _table(
            "categories",
            "category",
            ["category", "department", "tax_rate_pct", "return_window_days"],
            category_rows,
        ),
        _table(
            "suppliers",
            "supplier",
            ["supplier_id", "name", "country", "rating", "lead_time_days"],
            supplier_rows,
        ),
        _table(
            "products",
            "product",
            ["sku", "name", "category", "supplier_id", "price", "stock"],
            product_rows,
            {"category": "categories", "supplier_id": "suppliers"},
        ),
        _table(
            "orders",
            "order",
            ["order_id", "sku", "customer", "quantity", "status"],
            order_rows,
            {"sku": "products"},
        ),
    ]


_HOSPITAL_KINDS = ["General Hospital", "Medical Center", "Memorial Hospital", "Regional Clinic"]
_DEPARTMENTS = [
    "Cardiology", "Oncology", "Neurology", "Pediatrics", "Orthopedics", "Dermatology", "Radiology",
    "Emergency Medicine", "Gastroenterology", "Nephrology", "Ophthalmology", "Psychiatry", "Urology",
    "Endocrinology",
]  # fmt: skip


def _healthcare(rng: random.Random) -> list[KbTable]:
    hospital_ids = _ids("HSP", 110, 12)
    hospital_rows: list[list[Cell]] = [
        [
            hid,
            f"{brand} {rng.choice(_HOSPITAL_KINDS)}",
            city,
            beds,
            rng.choice(["public", "private", "nonprofit"]),
        ]
        for hid, brand, (city, _), beds in zip(
            hospital_ids,
            rng.sample(_BRANDS, 12),
            rng.sample(_CITIES, 12),
            _distinct_ints(rng, 80, 960, 1, 12),
            strict=True,
        )
    ]
    department_ids = _ids("DEP", 120, 14)
    department_rows: list[list[Cell]] = [
        [did, name, rng.choice(hospital_ids), rng.randint(1, 12), budget]
        for did, name, budget in zip(
            department_ids, rng.sample(_DEPARTMENTS, 14), _distinct_ints(rng, 400, 9_800, 50, 14), strict=True
        )
    ]
    doctor_ids = _ids("DR", 501, 16)
    doctor_rows: list[list[Cell]] = [
        [
            did,
            f"Dr. {name}",
            rng.choice(department_ids),
            rng.randint(1, 35),
            rng.choice(["attending", "resident", "fellow"]),
        ]
        for did, name in zip(doctor_ids, _names(rng, 16), strict=True)
    ]
    appointment_rows: list[list[Cell]] = [
        [
            aid,
            patient,
            rng.choice(doctor_ids),
            f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
            rng.choice(["scheduled", "completed", "cancelled"]),
            fee,
        ]
        for aid, patient, fee in zip(
            _ids("APT", 9001, 18), _names(rng, 18), _distinct_ints(rng, 80, 640, 5, 18), strict=True
        )
    ]
    return [
        _table("hospitals", "hospital", ["hospital_id", "name", "city", "beds", "ownership"], hospital_rows),
        _table(
            "departments",
            "department",
            ["department_id", "name", "hospital_id", "floor", "annual_budget_k"],
            department_rows,
            {"hospital_id": "hospitals"},
        ),
        _table(
            "doctors",
            "doctor",
            ["doctor_id", "name", "department_id", "years_experience", "seniority"],
            doctor_rows,
            {"department_id": "departments"},
        ),
        _table(
            "appointments",
            "appointment",
            ["appointment_id", "patient", "doctor_id", "date", "status", "fee"],
            appointment_rows,
            {"doctor_id": "doctors"},
        ),
    ]


_BUILDERS: dict[str, Callable[[random.Random], list[KbTable]]] = {
    "real_estate": _real_estate,
    "e_commerce": _e_commerce,
    "healthcare": _healthcare,
}


def builtin_knowledge(domain: str, seed: int = 0) -> KnowledgeBase:
    """The seeded built-in knowledge base of ``domain`` (``BUILTIN_DOMAINS``, or prose: ``PROSE_DOMAINS``)."""
    if domain in PROSE_DOMAINS:
        return load_knowledge(PROSE_DIR / f"{domain}.md")[0]
    builder = _BUILDERS.get(domain)
    if builder is None:
        known = ", ".join((*BUILTIN_DOMAINS, *PROSE_DOMAINS))
        raise KnowledgeError(f"builtin:{domain}", "no such built-in knowledge base", f"use one of {known}")
    return KnowledgeBase(domain=domain, tables=builder(random.Random(f"{domain}:{seed}")))

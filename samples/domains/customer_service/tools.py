"""Northwind Outfitters order desk: agent and user tools over the global STATE dict.

Every function reads and changes ``STATE`` (the shop's database, see generator.py) and returns
JSON-able values; a function raises to refuse (unknown ids, inconsistent requests). The tools
check data integrity only: the *policy* (identity checks, windows, limits) is the agent's job and
is checked by the rules in policy.py. Only the standard library is imported: this file runs as is
in the sandbox, after ``STATE`` has been set.
"""

import copy
import datetime
import uuid
from typing import Any, Literal

STATE: dict[str, Any] = globals().setdefault("STATE", {})

CancelReason = Literal["no_longer_needed", "ordered_by_mistake", "found_cheaper", "other"]
ReturnReason = Literal["damaged", "wrong_item", "not_as_described", "no_longer_needed"]
OrderStatus = Literal["pending", "processing", "shipped", "delivered", "cancelled"]


# --------------------------------------------------------------------------- helpers


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _user(user_id: str) -> dict[str, Any]:
    user = STATE["users"].get(user_id)
    if user is None:
        raise KeyError(f"no user {user_id!r}")
    return user


def _order(order_id: str) -> dict[str, Any]:
    order = STATE["orders"].get(order_id)
    if order is None:
        raise KeyError(f"no order {order_id!r}")
    return order


def _line(order: dict[str, Any], item_id: str) -> dict[str, Any]:
    for line in order["items"]:
        if line["item_id"] == item_id:
            return line
    raise KeyError(f"order {order['order_id']} has no item {item_id!r}")


def _variant(item_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    for product in STATE["products"].values():
        for variant in product["variants"]:
            if variant["item_id"] == item_id:
                return product, variant
    raise KeyError(f"no catalogue item {item_id!r}")


def _next_id(prefix: str, existing: int) -> str:
    return f"{prefix}-{existing + 1:04d}"


def _refunded(order_id: str) -> float:
    return round(sum(r["amount"] for r in STATE["refunds"] if r["order_id"] == order_id), 2)


def _add_refund(order: dict[str, Any], amount: float, reason: str) -> dict[str, Any]:
    refund = {
        "refund_id": _next_id("RF", len(STATE["refunds"])),
        "order_id": order["order_id"],
        "user_id": order["user_id"],
        "amount": round(amount, 2),
        "reason": reason,
        "method": order["payment_method"],
        "created_at": _now(),
        "uuid": str(uuid.uuid4()),
    }
    STATE["refunds"].append(refund)
    return refund


def _public_user(user: dict[str, Any]) -> dict[str, Any]:
    shown = copy.deepcopy(user)
    shown.pop("sms_code", None)  # the one-time code reaches only the customer's phone
    return shown


# --------------------------------------------------------------------------- agent tools: reads


def find_user_by_email(email: str) -> dict[str, Any]:
    """Find a customer account by its email address.

    Args:
        email: The customer's email address, e.g. "ana.silva@example.com".
    """
    wanted = email.strip().casefold()
    for user in STATE["users"].values():
        if user["email"].casefold() == wanted:
            return {"user_id": user["user_id"], "name": user["name"]}
    raise KeyError(f"no account with email {email!r}")


def get_user_details(user_id: str) -> dict[str, Any]:
    """Profile of a customer: name, contact, default address, tier, store credit balance.

    Args:
        user_id: The customer's id, e.g. "U-1042".
    """
    return _public_user(_user(user_id))


def list_user_orders(user_id: str, status: OrderStatus | None = None) -> list[dict[str, Any]]:
    """A customer's orders (id, status, total, dates), newest first, optionally of one status.

    Args:
        user_id: The customer's id.
        status: Only orders in this status; all orders when omitted.
    """
    _user(user_id)
    orders = [o for o in STATE["orders"].values() if o["user_id"] == user_id]
    if status is not None:
        orders = [o for o in orders if o["status"] == status]
    orders.sort(key=lambda o: o["placed_on"], reverse=True)
    keys = ("order_id", "status", "total", "placed_on", "delivered_on")
    return [{k: o.get(k) for k in keys} for o in orders]


def get_order_details(order_id: str) -> dict[str, Any]:
    """Everything about one order: items, status, shipping address, payment method, refunds.

    Args:
        order_id: The order's id, e.g. "O-20417".
    """
    order = copy.deepcopy(_order(order_id))
    order["refunded_total"] = _refunded(order_id)
    return order


def get_product_details(product_id: str) -> dict[str, Any]:
    """A catalogue product with its variants (item ids, options, prices, availability).

    Args:
        product_id: The product's id, e.g. "P-104".
    """
    product = STATE["products"].get(product_id)
    if product is None:
        raise KeyError(f"no product {product_id!r}")
    return copy.deepcopy(product)


def search_products(query: str, category: str | None = None, max_results: int = 5) -> list[dict[str, Any]]:
    """Search the catalogue by words of the product name.

    Args:
        query: Words to look for in product names, e.g. "rain jacket".
        category: Only products of this category (e.g. "outerwear", "footwear", "camping").
        max_results: The most products returned.
    """
    words = [w for w in query.casefold().split() if w]
    hits = []
    for product in STATE["products"].values():
        if category is not None and product["category"] != category.casefold():
            continue
        if all(w in product["name"].casefold() for w in words):
            hits.append({k: product[k] for k in ("product_id", "name", "category")})
    return hits[: max(1, int(max_results))]


def get_refund_status(order_id: str) -> list[dict[str, Any]]:
    """Refunds issued for an order so far.

    Args:
        order_id: The order's id.
    """
    _order(order_id)
    return [copy.deepcopy(r) for r in STATE["refunds"] if r["order_id"] == order_id]


# --------------------------------------------------------------------------- agent tools: writes


def send_verification_code(user_id: str) -> dict[str, Any]:
    """Text a one-time code to the customer's phone on file; the customer then confirms it in the app.

    Args:
        user_id: The customer's id.
    """
    user = _user(user_id)
    STATE["session"]["code_sent_to"] = user_id
    return {"sent_to": user["phone"][:-4].replace("0", "*") + user["phone"][-4:]}


def cancel_order(order_id: str, reason: CancelReason) -> dict[str, Any]:
    """Cancel an order; the amount paid is refunded to the original payment method.

    Args:
        order_id: The order's id.
        reason: Why the customer cancels.
    """
    order = _order(order_id)
    if reason not in ("no_longer_needed", "ordered_by_mistake", "found_cheaper", "other"):
        raise ValueError(f"unknown cancellation reason {reason!r}")
    if order["status"] == "cancelled":
        raise ValueError(f"order {order_id} is already cancelled")
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    refund = _add_refund(order, order["total"] - _refunded(order_id), f"order cancelled: {reason}")
    return {
        "order_id": order_id,
        "status": "cancelled",
        "refund_id": refund["refund_id"],
        "refund": refund["amount"],
    }


def return_items(order_id: str, item_ids: list[str], reason: ReturnReason) -> dict[str, Any]:
    """Return items of a delivered order; their price is refunded to the original payment method.

    Args:
        order_id: The order's id.
        item_ids: Item ids of the order's lines to return.
        reason: Why the items are returned.
    """
    order = _order(order_id)
    if reason not in ("damaged", "wrong_item", "not_as_described", "no_longer_needed"):
        raise ValueError(f"unknown return reason {reason!r}")
    if order["status"] != "delivered":
        raise ValueError(f"order {order_id} is {order['status']}; only delivered items can be returned")
    if not item_ids:
        raise ValueError("name at least one item id")
    lines = [_line(order, i) for i in item_ids]
    for line in lines:
        if line["status"] != "ordered":
            raise ValueError(f"item {line['item_id']} is already {line['status']}")
    for line in lines:
        line["status"] = "returned"
    amount = sum(line["price"] for line in lines)
    refund = _add_refund(order, amount, f"return: {reason}")
    return {
        "order_id": order_id,
        "returned": list(item_ids),
        "refund_id": refund["refund_id"],
        "refund": refund["amount"],
    }


def exchange_item(order_id: str, item_id: str, new_item_id: str) -> dict[str, Any]:
    """Exchange an item of a delivered order for another variant (size, colour) of the same product.

    A dearer variant creates a charge the customer must approve in the app; a cheaper one is refunded.

    Args:
        order_id: The order's id.
        item_id: The item id being exchanged (a line of the order).
        new_item_id: The item id of the wanted variant of the same product.
    """
    order = _order(order_id)
    if order["status"] != "delivered":
        raise ValueError(f"order {order_id} is {order['status']}; only delivered items can be exchanged")
    line = _line(order, item_id)
    if line["status"] != "ordered":
        raise ValueError(f"item {item_id} is already {line['status']}")
    product, variant = _variant(new_item_id)
    if product["product_id"] != line["product_id"]:
        raise ValueError(f"{new_item_id} is not a variant of product {line['product_id']}")
    if not variant["available"]:
        raise ValueError(f"variant {new_item_id} is out of stock")
    if new_item_id == item_id:
        raise ValueError("the new variant is the same item")
    difference = round(variant["price"] - line["price"], 2)
    line["status"] = "exchanged"
    order["items"].append(
        {
            "item_id": new_item_id,
            "product_id": product["product_id"],
            "name": product["name"],
            "options": copy.deepcopy(variant["options"]),
            "price": variant["price"],
            "status": "ordered",
            "exchanged_from": item_id,
        }
    )
    result: dict[str, Any] = {
        "order_id": order_id,
        "new_item_id": new_item_id,
        "price_difference": difference,
    }
    if difference > 0:
        charge_id = _next_id("CH", len(STATE["charges"]))
        STATE["charges"][charge_id] = {
            "charge_id": charge_id,
            "user_id": order["user_id"],
            "order_id": order_id,
            "amount": difference,
            "status": "pending_approval",
        }
        result["charge_id"] = charge_id
    elif difference < 0:
        result["refund_id"] = _add_refund(order, -difference, "exchange price difference")["refund_id"]
    return result


def update_order_address(
    order_id: str, line1: str, city: str, zip_code: str, line2: str = "", country: str = "US"
) -> dict[str, Any]:
    """Change the shipping address of an order.

    Args:
        order_id: The order's id.
        line1: Street and number, e.g. "12 Harbor Road".
        city: City.
        zip_code: Postal code.
        line2: Apartment, suite, floor (optional).
        country: Two-letter country code.
    """
    order = _order(order_id)
    if order["status"] == "cancelled":
        raise ValueError(f"order {order_id} is cancelled")
    order["shipping_address"] = {
        "line1": line1.strip(),
        "line2": line2.strip(),
        "city": city.strip(),
        "zip_code": zip_code.strip(),
        "country": country.strip().upper(),
    }
    order["address_change_count"] += 1
    return {"order_id": order_id, "shipping_address": copy.deepcopy(order["shipping_address"])}


def issue_refund(order_id: str, amount: float, reason: str) -> dict[str, Any]:
    """Refund part of an order to its original payment method (e.g. for a damaged item).

    Args:
        order_id: The order's id.
        amount: Amount in USD, at most what is left unrefunded on the order.
        reason: Why the refund is issued, in a sentence.
    """
    order = _order(order_id)
    amount = float(amount)
    if amount <= 0:
        raise ValueError("the amount must be positive")
    left = round(order["total"] - _refunded(order_id), 2)
    if amount > left + 1e-9:
        raise ValueError(f"only {left:.2f} USD of order {order_id} is left to refund")
    refund = _add_refund(order, amount, reason)
    return {"refund_id": refund["refund_id"], "amount": refund["amount"], "method": refund["method"]}


def issue_store_credit(user_id: str, amount: float, reason: str) -> dict[str, Any]:
    """Add goodwill store credit to a customer's account.

    Args:
        user_id: The customer's id.
        amount: Amount in USD.
        reason: Why the credit is given, in a sentence.
    """
    user = _user(user_id)
    amount = float(amount)
    if amount <= 0:
        raise ValueError("the amount must be positive")
    credit = {
        "credit_id": _next_id("CR", len(STATE["credits"])),
        "user_id": user_id,
        "amount": round(amount, 2),
        "reason": reason,
        "month": STATE["today"][:7],
        "created_at": _now(),
    }
    STATE["credits"].append(credit)
    user["store_credit_balance"] = round(user["store_credit_balance"] + credit["amount"], 2)
    return {"credit_id": credit["credit_id"], "balance": user["store_credit_balance"]}


def add_order_note(order_id: str, note: str) -> dict[str, Any]:
    """Attach an internal note to an order (what was agreed with the customer).

    Args:
        order_id: The order's id.
        note: The note's text.
    """
    order = _order(order_id)
    order["notes"].append({"note": note, "created_at": _now()})
    return {"order_id": order_id, "notes": len(order["notes"])}


def transfer_to_human(user_id: str, summary: str) -> dict[str, Any]:
    """Hand the conversation to a human agent, with a summary of the issue.

    Args:
        user_id: The customer's id.
        summary: What the customer needs and what was done so far.
    """
    _user(user_id)
    ticket = {
        "ticket_id": _next_id("T", len(STATE["tickets"])),
        "user_id": user_id,
        "summary": summary,
        "status": "open",
        "created_at": _now(),
    }
    STATE["tickets"].append(ticket)
    return {"ticket_id": ticket["ticket_id"], "status": "open"}


# --------------------------------------------------------------------------- user tools (dual control)


def confirm_identity_code(user_id: str, code: str) -> dict[str, Any]:
    """The customer types the one-time code texted to their phone into the app.

    Args:
        user_id: The customer's own id.
        code: The six-digit code from the text message.
    """
    user = _user(user_id)
    if STATE["session"].get("code_sent_to") != user_id:
        raise ValueError("no code was sent to this account; ask the agent to send one")
    if str(code).strip() != user["sms_code"]:
        raise ValueError("the code does not match")
    STATE["session"]["verified_user_id"] = user_id
    return {"verified": True}


def report_damage(order_id: str, item_id: str, description: str) -> dict[str, Any]:
    """The customer uploads photos of a damaged item in the app, with a short description.

    Args:
        order_id: The order's id.
        item_id: The damaged item's id.
        description: What is wrong with the item.
    """
    order = _order(order_id)
    _line(order, item_id)
    report = {
        "report_id": _next_id("DR", len(STATE["damage_reports"])),
        "order_id": order_id,
        "item_id": item_id,
        "user_id": order["user_id"],
        "description": description,
        "reported_at": _now(),
    }
    STATE["damage_reports"].append(report)
    return {"report_id": report["report_id"]}


def approve_charge(charge_id: str) -> dict[str, Any]:
    """The customer approves a pending charge (e.g. an exchange's price difference) in the app.

    Args:
        charge_id: The charge's id, e.g. "CH-0001".
    """
    charge = STATE["charges"].get(charge_id)
    if charge is None:
        raise KeyError(f"no charge {charge_id!r}")
    if charge["status"] != "pending_approval":
        raise ValueError(f"charge {charge_id} is {charge['status']}")
    charge["status"] = "approved"
    charge["approved_at"] = _now()
    return {"charge_id": charge_id, "status": "approved"}

"""Harbor Community Bank service desk: agent and user tools over the global STATE dict.

The tools check data integrity only (unknown ids, a fee already waived, a card already blocked);
the bank's eligibility rules -- fee-waiver limits, credit-limit history, closing only empty
accounts, identity checks -- are the agent's job and are checked by policy.py. Standard library
only: this file runs as is in the sandbox.
"""

import copy
from typing import Any

STATE: dict[str, Any] = globals().setdefault("STATE", {})


def _get(table: str, key: str, noun: str) -> dict[str, Any]:
    row = STATE[table].get(key)
    if row is None:
        raise KeyError(f"no {noun} {key!r}")
    return row


# --------------------------------------------------------------------------- agent tools: reads


def find_customer_by_email(email: str) -> dict[str, Any]:
    """Find a customer by the email address on file.

    Args:
        email: The customer's email address.
    """
    wanted = email.strip().casefold()
    for customer in STATE["customers"].values():
        if customer["email"].casefold() == wanted:
            return {"customer_id": customer["customer_id"], "name": customer["name"]}
    raise KeyError(f"no customer with email {email!r}")


def get_customer_details(customer_id: str) -> dict[str, Any]:
    """A customer's profile: name, email, customer since.

    Args:
        customer_id: The customer's id, e.g. "C-1042".
    """
    customer = copy.deepcopy(_get("customers", customer_id, "customer"))
    customer.pop("security_code", None)  # the code reaches only the customer's phone
    return customer


def list_customer_accounts(customer_id: str) -> list[dict[str, Any]]:
    """The customer's bank accounts (id, type, status).

    Args:
        customer_id: The customer's id.
    """
    _get("customers", customer_id, "customer")
    rows = [a for a in STATE["accounts"].values() if a["customer_id"] == customer_id]
    return [{k: a[k] for k in ("account_id", "type", "status")} for a in rows]


def list_customer_cards(customer_id: str) -> list[dict[str, Any]]:
    """The customer's credit cards (id, status).

    Args:
        customer_id: The customer's id.
    """
    _get("customers", customer_id, "customer")
    rows = [c for c in STATE["cards"].values() if c["customer_id"] == customer_id]
    return [{k: c[k] for k in ("card_id", "status")} for c in rows]


def get_account_details(account_id: str) -> dict[str, Any]:
    """One account: type, status, balance, opening date, fee waivers granted this year.

    Args:
        account_id: The account's id, e.g. "A-20417".
    """
    return copy.deepcopy(_get("accounts", account_id, "account"))


def get_fee_details(fee_id: str) -> dict[str, Any]:
    """One fee charged to an account: kind, amount, date charged, status.

    Args:
        fee_id: The fee's id, e.g. "F-3301".
    """
    return copy.deepcopy(_get("fees", fee_id, "fee"))


def get_card_details(card_id: str) -> dict[str, Any]:
    """One credit card: status, credit limit, opening date, late payments.

    Args:
        card_id: The card's id, e.g. "K-5120".
    """
    return copy.deepcopy(_get("cards", card_id, "card"))


# --------------------------------------------------------------------------- agent tools: writes


def send_security_code(customer_id: str) -> dict[str, Any]:
    """Text a one-time security code to the customer's phone; they enter it in the banking app.

    Args:
        customer_id: The customer's id.
    """
    customer = _get("customers", customer_id, "customer")
    STATE["session"]["code_sent_to"] = customer_id
    return {"sent_to": "phone ending " + customer["phone"][-4:]}


def waive_fee(fee_id: str, reason: str) -> dict[str, Any]:
    """Waive (refund) a fee charged to an account.

    Args:
        fee_id: The fee's id.
        reason: Why it is waived, in a sentence.
    """
    fee = _get("fees", fee_id, "fee")
    if fee["status"] != "charged":
        raise ValueError(f"fee {fee_id} is already {fee['status']}")
    account = _get("accounts", fee["account_id"], "account")
    fee["status"] = "waived"
    fee["waive_reason"] = reason
    account["balance"] = round(account["balance"] + fee["amount"], 2)
    account["fee_waivers_this_year"] += 1
    return {"fee_id": fee_id, "status": "waived", "refunded": fee["amount"]}


def raise_credit_limit(card_id: str, new_limit: float) -> dict[str, Any]:
    """Raise a credit card's limit.

    Args:
        card_id: The card's id.
        new_limit: The new limit in USD, above the current one.
    """
    card = _get("cards", card_id, "card")
    new_limit = float(new_limit)
    if card["status"] != "active":
        raise ValueError(f"card {card_id} is {card['status']}")
    if new_limit <= card["credit_limit"]:
        raise ValueError(f"the new limit must exceed the current {card['credit_limit']:.2f} USD")
    card["credit_limit"] = new_limit
    return {"card_id": card_id, "credit_limit": new_limit}


def close_account(account_id: str) -> dict[str, Any]:
    """Close a bank account.

    Args:
        account_id: The account's id.
    """
    account = _get("accounts", account_id, "account")
    if account["status"] == "closed":
        raise ValueError(f"account {account_id} is already closed")
    account["status"] = "closed"
    return {"account_id": account_id, "status": "closed"}


def block_card(card_id: str, reason: str) -> dict[str, Any]:
    """Block a credit card at once (lost or stolen); a replacement is mailed.

    Args:
        card_id: The card's id.
        reason: Why it is blocked, e.g. "lost".
    """
    card = _get("cards", card_id, "card")
    if card["status"] == "blocked":
        raise ValueError(f"card {card_id} is already blocked")
    card["status"] = "blocked"
    card["block_reason"] = reason
    return {"card_id": card_id, "status": "blocked", "replacement": "mailed"}


def transfer_to_specialist(customer_id: str, summary: str) -> dict[str, Any]:
    """Hand the conversation to a specialist, with a summary.

    Args:
        customer_id: The customer's id.
        summary: What the customer needs and what was done.
    """
    _get("customers", customer_id, "customer")
    STATE["transfers"].append({"customer_id": customer_id, "summary": summary})
    return {"customer_id": customer_id, "queue_position": len(STATE["transfers"])}


# --------------------------------------------------------------------------- user tools


def enter_security_code(customer_id: str, code: str) -> dict[str, Any]:
    """The customer types the security code texted to their phone into the banking app.

    Args:
        customer_id: The customer's own id.
        code: The six-digit code from the text message.
    """
    customer = _get("customers", customer_id, "customer")
    if STATE["session"].get("code_sent_to") != customer_id:
        raise ValueError("no code was sent to this customer; ask the agent to send one")
    if str(code).strip() != customer["security_code"]:
        raise ValueError("the code does not match")
    STATE["session"]["verified_customer_id"] = customer_id
    return {"verified": True}

"""Harbor Community Bank eligibility rules, as code.

Each ``rule_<name>(state_before, call, state_after)`` looks at one executed call (``name``,
``arguments``, ``actor``, ``ok``, ``changed_state``) and the database around it, and returns a
violation message or None; the first docstring line is the rule's description. Standard library
only: the verification function embeds this file and runs it in the sandbox.
"""

import datetime
from typing import Any

WRITES = ("waive_fee", "raise_credit_limit", "close_account", "block_card")
MAX_WAIVED_FEE = 35.0
WAIVER_WINDOW_DAYS = 60
MIN_CARD_AGE_DAYS = 180


def _owner(state: dict[str, Any], arguments: dict[str, Any]) -> str:
    for table, key in (("fees", "fee_id"), ("accounts", "account_id"), ("cards", "card_id")):
        if key in arguments:
            return str(state[table][arguments[key]]["customer_id"])
    return str(arguments.get("customer_id"))


def _age_days(state: dict[str, Any], date: str) -> int:
    return (datetime.date.fromisoformat(state["today"]) - datetime.date.fromisoformat(date)).days


def rule_verified_identity(
    state_before: dict[str, Any], call: dict[str, Any], state_after: dict[str, Any]
) -> str | None:
    """Changes to a customer's accounts or cards need that customer's identity confirmed first (security code)."""
    if call["actor"] != "agent" or call["name"] not in WRITES:
        return None
    owner = _owner(state_before, call["arguments"])
    if state_before["session"].get("verified_customer_id") != owner:
        return f"{call['name']} for {owner} before their identity was confirmed"
    return None


def rule_fee_waiver_amount(
    state_before: dict[str, Any], call: dict[str, Any], state_after: dict[str, Any]
) -> str | None:
    """Only fees of at most 35 USD, charged within the last 60 days, may be waived."""
    if call["name"] != "waive_fee":
        return None
    fee = state_before["fees"][call["arguments"]["fee_id"]]
    if float(fee["amount"]) > MAX_WAIVED_FEE:
        return f"waived fee {fee['fee_id']} of {float(fee['amount']):.2f} USD"
    if _age_days(state_before, fee["charged_on"]) > WAIVER_WINDOW_DAYS:
        return f"waived fee {fee['fee_id']} charged more than {WAIVER_WINDOW_DAYS} days ago"
    return None


def rule_one_waiver_per_year(
    state_before: dict[str, Any], call: dict[str, Any], state_after: dict[str, Any]
) -> str | None:
    """Each account gets at most one fee waiver per calendar year."""
    if call["name"] != "waive_fee":
        return None
    fee = state_before["fees"][call["arguments"]["fee_id"]]
    account = state_before["accounts"][fee["account_id"]]
    if int(account["fee_waivers_this_year"]) >= 1:
        return f"second fee waiver this year on account {account['account_id']}"
    return None


def rule_credit_limit_eligibility(
    state_before: dict[str, Any], call: dict[str, Any], state_after: dict[str, Any]
) -> str | None:
    """A credit limit may only be raised on a card open at least 180 days with no late payments, to at most twice the current limit."""
    if call["name"] != "raise_credit_limit":
        return None
    card = state_before["cards"][call["arguments"]["card_id"]]
    if int(card["late_payments"]) > 0:
        return f"raised the limit of card {card['card_id']} with {card['late_payments']} late payments"
    if _age_days(state_before, card["opened_on"]) < MIN_CARD_AGE_DAYS:
        return f"raised the limit of card {card['card_id']} opened less than {MIN_CARD_AGE_DAYS} days ago"
    if float(call["arguments"]["new_limit"]) > 2 * float(card["credit_limit"]):
        return (
            f"raised the limit of card {card['card_id']} to more than twice {float(card['credit_limit']):.2f}"
        )
    return None


def rule_close_only_empty_accounts(
    state_before: dict[str, Any], call: dict[str, Any], state_after: dict[str, Any]
) -> str | None:
    """An account may only be closed when its balance is exactly 0 USD."""
    if call["name"] != "close_account":
        return None
    account = state_before["accounts"][call["arguments"]["account_id"]]
    if abs(float(account["balance"])) > 1e-9:
        return f"closed account {account['account_id']} holding {float(account['balance']):.2f} USD"
    return None

"""Brightwave Mobile support desk: agent tools (accounts, lines, plans) and the customer's phone.

Dual control: the agent sees the customer's account and lines, but not the phone. Only the
customer can read their phone's status and change its settings (airplane mode, mobile data,
data roaming) -- the user tools below act on the ``devices`` records, keyed by phone number. The
agent diagnoses and instructs. Tools check data integrity only (unknown ids, a setting already
in the asked state); the policy (roaming plans, refill limits, overdue balances) is the agent's
job and is checked by policy.py. Standard library only: this file runs as is in the sandbox.
"""

import copy
from typing import Any

STATE: dict[str, Any] = globals().setdefault("STATE", {})


def _customer(customer_id: str) -> dict[str, Any]:
    customer = STATE["customers"].get(customer_id)
    if customer is None:
        raise KeyError(f"no customer {customer_id!r}")
    return customer


def _line(line_id: str) -> dict[str, Any]:
    line = STATE["lines"].get(line_id)
    if line is None:
        raise KeyError(f"no line {line_id!r}")
    return line


def _device(phone_number: str) -> dict[str, Any]:
    device = STATE["devices"].get(phone_number.strip())
    if device is None:
        raise KeyError(f"no phone {phone_number!r}")
    return device


def _line_of(device: dict[str, Any]) -> dict[str, Any]:
    return _line(device["line_id"])


# --------------------------------------------------------------------------- agent tools: reads


def find_customer_by_email(email: str) -> dict[str, Any]:
    """Find a customer account by its email address.

    Args:
        email: The customer's email address.
    """
    wanted = email.strip().casefold()
    for customer in STATE["customers"].values():
        if customer["email"].casefold() == wanted:
            return {"customer_id": customer["customer_id"], "name": customer["name"]}
    raise KeyError(f"no account with email {email!r}")


def get_customer_details(customer_id: str) -> dict[str, Any]:
    """A customer's profile: name, contact email and their line ids.

    Args:
        customer_id: The customer's id, e.g. "C-1042".
    """
    return copy.deepcopy(_customer(customer_id))


def list_customer_lines(customer_id: str) -> list[dict[str, Any]]:
    """The customer's mobile lines (id, phone number, status).

    Args:
        customer_id: The customer's id.
    """
    _customer(customer_id)
    rows = [line for line in STATE["lines"].values() if line["customer_id"] == customer_id]
    return [{k: line[k] for k in ("line_id", "phone_number", "status")} for line in rows]


def get_line_details(line_id: str) -> dict[str, Any]:
    """Everything about one line: plan, status, roaming, data used, refills this month, overdue balance.

    Args:
        line_id: The line's id, e.g. "L-2041".
    """
    return copy.deepcopy(_line(line_id))


def get_plan_details(plan_id: str) -> dict[str, Any]:
    """A price plan: monthly data allowance, whether roaming is included, price.

    Args:
        plan_id: The plan's id, e.g. "PL-20".
    """
    plan = STATE["plans"].get(plan_id)
    if plan is None:
        raise KeyError(f"no plan {plan_id!r}")
    return copy.deepcopy(plan)


# --------------------------------------------------------------------------- agent tools: writes


def enable_roaming(line_id: str) -> dict[str, Any]:
    """Switch on international roaming for a line (the network side; the phone needs data roaming on too).

    Args:
        line_id: The line's id.
    """
    line = _line(line_id)
    if line["roaming_enabled"]:
        raise ValueError(f"roaming is already enabled on line {line_id}")
    line["roaming_enabled"] = True
    return {"line_id": line_id, "roaming_enabled": True}


def add_data_refill(line_id: str, gigabytes: int) -> dict[str, Any]:
    """Add extra mobile data to a line for the rest of the month.

    Args:
        line_id: The line's id.
        gigabytes: How many GB to add (1 to 10).
    """
    line = _line(line_id)
    gigabytes = int(gigabytes)
    if not 1 <= gigabytes <= 10:
        raise ValueError("a refill is 1 to 10 GB")
    line["data_limit_gb"] = line["data_limit_gb"] + gigabytes
    line["data_refills_this_month"] += 1
    return {"line_id": line_id, "data_limit_gb": line["data_limit_gb"], "added_gb": gigabytes}


def resume_line(line_id: str) -> dict[str, Any]:
    """Reactivate a suspended line.

    Args:
        line_id: The line's id.
    """
    line = _line(line_id)
    if line["status"] != "suspended":
        raise ValueError(f"line {line_id} is {line['status']}, not suspended")
    line["status"] = "active"
    return {"line_id": line_id, "status": "active"}


def log_support_note(customer_id: str, note: str) -> dict[str, Any]:
    """Write a note on the customer's account (what was diagnosed and agreed).

    Args:
        customer_id: The customer's id.
        note: The note's text.
    """
    _customer(customer_id)
    STATE["notes"].append({"customer_id": customer_id, "note": note})
    return {"customer_id": customer_id, "notes": len(STATE["notes"])}


# --------------------------------------------------------------------------- user tools: the customer's phone


def check_phone_status(phone_number: str) -> dict[str, Any]:
    """The customer reads their phone's status screen: signal, airplane mode, mobile data, data roaming.

    Args:
        phone_number: The phone's own number, e.g. "+1-555-201-3344".
    """
    device = _device(phone_number)
    line = _line_of(device)
    abroad = device["location"] == "abroad"
    signal = not device["airplane_mode"] and line["status"] == "active"
    data = (
        signal
        and device["mobile_data"]
        and line["data_used_gb"] < line["data_limit_gb"]
        and (not abroad or (device["data_roaming"] and line["roaming_enabled"]))
    )
    return {
        "phone_number": device["phone_number"],
        "signal": "no service" if not signal else "connected",
        "airplane_mode": device["airplane_mode"],
        "mobile_data": device["mobile_data"],
        "data_roaming": device["data_roaming"],
        "abroad": abroad,
        "data_working": data,
    }


def toggle_airplane_mode(phone_number: str, enabled: bool) -> dict[str, Any]:
    """The customer switches airplane mode on or off in the phone's quick settings.

    Args:
        phone_number: The phone's own number.
        enabled: True to switch airplane mode on, False to switch it off.
    """
    device = _device(phone_number)
    if device["airplane_mode"] == bool(enabled):
        raise ValueError(f"airplane mode is already {'on' if enabled else 'off'}")
    device["airplane_mode"] = bool(enabled)
    return {"airplane_mode": device["airplane_mode"]}


def toggle_mobile_data(phone_number: str, enabled: bool) -> dict[str, Any]:
    """The customer switches mobile data on or off in the phone's settings.

    Args:
        phone_number: The phone's own number.
        enabled: True to switch mobile data on, False to switch it off.
    """
    device = _device(phone_number)
    if device["mobile_data"] == bool(enabled):
        raise ValueError(f"mobile data is already {'on' if enabled else 'off'}")
    device["mobile_data"] = bool(enabled)
    return {"mobile_data": device["mobile_data"]}


def toggle_data_roaming(phone_number: str, enabled: bool) -> dict[str, Any]:
    """The customer switches data roaming on or off in the phone's network settings.

    Args:
        phone_number: The phone's own number.
        enabled: True to allow data while abroad, False to block it.
    """
    device = _device(phone_number)
    if device["data_roaming"] == bool(enabled):
        raise ValueError(f"data roaming is already {'on' if enabled else 'off'}")
    device["data_roaming"] = bool(enabled)
    return {"data_roaming": device["data_roaming"]}

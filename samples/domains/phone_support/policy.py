"""Brightwave Mobile policy rules, as code.

Each ``rule_<name>(state_before, call, state_after)`` looks at one executed call (``name``,
``arguments``, ``actor``, ``ok``, ``changed_state``) and the database around it, and returns a
violation message or None; the first docstring line is the rule's description. Standard library
only: the verification function embeds this file and runs it in the sandbox.
"""

from typing import Any

MAX_REFILLS_PER_MONTH = 2


def _line(state: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    line: dict[str, Any] = state["lines"][call["arguments"]["line_id"]]
    return line


def rule_roaming_needs_plan(
    state_before: dict[str, Any], call: dict[str, Any], state_after: dict[str, Any]
) -> str | None:
    """Roaming may only be enabled on an active line whose plan includes roaming."""
    if call["name"] != "enable_roaming":
        return None
    line = _line(state_before, call)
    plan = state_before["plans"][line["plan_id"]]
    if line["status"] != "active":
        return f"enabled roaming on line {line['line_id']} while it was {line['status']}"
    if not plan["roaming_included"]:
        return f"enabled roaming on line {line['line_id']} whose plan {plan['plan_id']} has no roaming"
    return None


def rule_refill_limit(
    state_before: dict[str, Any], call: dict[str, Any], state_after: dict[str, Any]
) -> str | None:
    """A line gets at most 2 data refills per calendar month, and only while it is active."""
    if call["name"] != "add_data_refill":
        return None
    line = _line(state_before, call)
    if line["status"] != "active":
        return f"data refill on line {line['line_id']} while it was {line['status']}"
    if line["data_refills_this_month"] >= MAX_REFILLS_PER_MONTH:
        return f"third data refill this month on line {line['line_id']}"
    return None


def rule_resume_needs_paid_balance(
    state_before: dict[str, Any], call: dict[str, Any], state_after: dict[str, Any]
) -> str | None:
    """A suspended line may only be resumed once its overdue balance is paid (0 USD)."""
    if call["name"] != "resume_line":
        return None
    line = _line(state_before, call)
    if float(line["overdue_balance"]) > 0:
        return f"resumed line {line['line_id']} with {float(line['overdue_balance']):.2f} USD overdue"
    return None

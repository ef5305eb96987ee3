"""Rules TrajectoryAgent and TrajectoryValidation (EigenData §4.2 DialogSynthesis / validation).

``eigen_trajectory_agent`` is a deliberate, policy-following order-desk agent for domains with the
customer-service tools (``find_user_by_email``, ``get_order_details``, ...; others get
``Undecidable``). It re-derives everything from its input each step -- the requests in the user
messages, the facts in its tool results, the customer's in-app actions -- and does the first thing
still missing, in this order:

1. identify: ``find_user_by_email`` with the email the user gave, then ``get_user_details``;
2. read before write: ``get_order_details`` for every order a request names (an order named by a
   product is found with ``list_user_orders`` + ``get_order_details``);
3. decide each request from what it read and the policy: allowed, refused (with the rule's
   reason: status, return window, address-change limit, credit cap, wrong account) or transfer
   (a refund above 500 USD: ``transfer_to_human``);
4. for allowed requests: ``send_verification_code``, ask the user to confirm the code (and to
   upload damage photos before a refund) in the app, propose the writes ("Shall I proceed with:
   ...?") and run each one only once the user's last message said yes to that very proposal and
   the identity (and damage report) is confirmed;
5. report what the writes returned (ids and amounts from their outputs), refusals once, and ask
   whether there is anything else.

Every fact it states comes from a tool output, a user message or the input's date.
``eigen_trajectory_validation`` turns the checks' findings into the appendix verdict with the
paper's rule (critical issue or 2+ Poor dimensions: FAIL).
"""

from __future__ import annotations

import datetime
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from arena.llm.core import Undecidable
from arena.llm.roles.eigen_dialogs import (
    DIMENSIONS,
    EIGEN_TRAJECTORY_AGENT,
    EIGEN_TRAJECTORY_VALIDATION,
    AgentStep,
    AgentToolCall,
    TrajectoryAgentInput,
    TrajectoryValidationInput,
    TrajectoryVerdict,
)

REQUIRED_TOOLS = ("find_user_by_email", "get_user_details", "get_order_details", "send_verification_code")
BEFORE_SHIPMENT = ("pending", "processing")
RETURN_WINDOW_DAYS = 30
MAX_REFUND = 500.0
MONTHLY_CREDIT_CAP = 50.0
EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
ORDER_RE = re.compile(r"\bO-\d+\b")
ITEM_RE = re.compile(r"\((I-\d+)\)")
AMOUNT_RE = re.compile(r"(\d+(?:\.\d+)?)\s*USD")
YES_RE = re.compile(r"^\W*(?:yes|yeah|yep|sure|ok(?:ay)?|please (?:go ahead|do)|go ahead|confirmed?)\b", re.I)
SENTENCE_RE = re.compile(r"(?<=[.!?])\s+")
ADDRESS_RE = re.compile(r"\bto (?P<line1>\d+ [^,]+), (?P<city>[A-Za-z .'-]+?) (?P<zip>\d{5})\b")
BY_ITEM_RE = re.compile(r"my order with the (?P<item>.+?)(?= to \d|;|,|\.\s|\.$| arrived)")


@dataclass
class Request:
    kind: str
    sentence: str
    order_id: str | None = None
    item_name: str | None = None
    item_id: str | None = None
    amount: float | None = None
    address: dict[str, str] = field(default_factory=dict)
    reason: str = "no_longer_needed"


@dataclass
class Decision:
    request: Request
    verdict: str  # "allow" | "refuse" | "transfer"
    note: str = ""
    call: AgentToolCall | None = None
    describe: str = ""
    order: dict[str, Any] | None = None
    line: dict[str, Any] | None = None


def parse_requests(text: str) -> list[Request]:
    """Requests stated in one user message, one per sentence at most."""
    found: list[Request] = []
    for sentence in SENTENCE_RE.split(text):
        low = sentence.casefold()
        orders = ORDER_RE.findall(sentence)
        by_item = BY_ITEM_RE.search(sentence)
        items = ITEM_RE.findall(sentence)
        amounts = AMOUNT_RE.findall(sentence)
        base: dict[str, Any] = {
            "sentence": sentence.strip(),
            "order_id": orders[0] if orders else None,
            "item_name": by_item.group("item").strip() if by_item and not orders else None,
            "item_id": items[0] if items else None,
            "amount": float(amounts[0]) if amounts else None,
        }
        if "store credit" in low and "instead" not in low:
            found.append(Request(kind="issue_store_credit", **base))
        elif "damaged" in low and "refund" in low:
            found.append(Request(kind="issue_refund", **base))
        elif re.search(r"\breturn\b", low):
            found.append(Request(kind="return_items", **base))
        elif re.search(r"\bship\b", low) and (match := ADDRESS_RE.search(sentence)):
            address = {"line1": match["line1"], "city": match["city"], "zip_code": match["zip"]}
            found.append(Request(kind="update_order_address", address=address, **base))
        elif re.search(r"\bcancel\b", low):
            reason = "no_longer_needed"
            if "mistake" in low:
                reason = "ordered_by_mistake"
            elif "cheaper" in low:
                reason = "found_cheaper"
            found.append(Request(kind="cancel_order", reason=reason, **base))
    return found


class _View:
    """What the agent knows: its calls and their outputs, user messages, app events."""

    def __init__(self, inputs: TrajectoryAgentInput) -> None:
        self.inputs = inputs
        self.results: list[tuple[str, dict[str, Any], bool, Any]] = []
        pending: dict[str, tuple[str, dict[str, Any]]] = {}
        self.user_texts: list[str] = []
        self.last_user = ""
        self.last_assistant = ""
        for message in inputs.messages:
            role = message.get("role")
            if role == "user":
                self.user_texts.append(str(message.get("content") or ""))
                self.last_user = self.user_texts[-1]
            elif role == "assistant":
                for call in message.get("tool_calls") or []:
                    fn = call.get("function", {})
                    args = fn.get("arguments")
                    parsed = json.loads(args) if isinstance(args, str) else dict(args or {})
                    pending[str(call.get("id"))] = (str(fn.get("name")), parsed)
                if message.get("content") and not message.get("tool_calls"):
                    self.last_assistant = str(message["content"])
            elif role == "tool":
                name, args = pending.get(str(message.get("tool_call_id")), (str(message.get("name")), {}))
                content = str(message.get("content") or "")
                ok = not content.startswith("error:")
                value: Any = content
                if ok:
                    try:
                        value = json.loads(content)
                    except ValueError:
                        value = content
                self.results.append((name, args, ok, value))
        self.tools = {t["function"]["name"] for t in inputs.tools}

    def result(self, name: str, **match: Any) -> tuple[bool, Any] | None:
        """The latest result of ``name`` called with arguments containing ``match``."""
        for called, args, ok, value in reversed(self.results):
            if called == name and all(args.get(k) == v for k, v in match.items()):
                return ok, value
        return None

    def ok_value(self, name: str, **match: Any) -> Any:
        got = self.result(name, **match)
        return got[1] if got is not None and got[0] else None

    def app_ok(self, name: str, **match: Any) -> bool:
        return any(
            e.name == name and e.ok and all(e.arguments.get(k) == v for k, v in match.items())
            for e in self.inputs.app_events
        )


def _call(name: str, **arguments: Any) -> AgentStep:
    return AgentStep(think=f"I need {name} now.", tool_calls=[AgentToolCall(name=name, arguments=arguments)])


def _money(value: Any) -> str:
    return f"{float(value):.2f} USD"


def _decide(view: _View, request: Request, user_id: str, profile: dict[str, Any]) -> Decision | AgentStep:
    """Read what the request needs (an AgentStep to run first) and decide it under the policy."""
    if request.kind == "issue_store_credit":
        amount = float(request.amount or 0.0)
        balance = float(profile.get("store_credit_balance") or 0.0)
        left = round(MONTHLY_CREDIT_CAP - balance, 2)
        if amount <= 0 or amount > left + 1e-9:
            note = (
                f"I cannot add {_money(amount)} of store credit: goodwill credit is capped at "
                f"{_money(MONTHLY_CREDIT_CAP)} per customer per month, and your account already shows "
                f"{_money(balance)}."
            )
            return Decision(request, "refuse", note=note)
        call = AgentToolCall(
            name="issue_store_credit",
            arguments={
                "user_id": user_id,
                "amount": amount,
                "reason": "goodwill for the trouble with my orders",
            },
        )
        return Decision(
            request, "allow", call=call, describe=f"add {_money(amount)} of store credit to your account"
        )
    order_id = request.order_id
    if order_id is None and request.item_name:
        listing = view.ok_value("list_user_orders", user_id=user_id)
        if listing is None:
            if "list_user_orders" not in view.tools:
                return Decision(request, "refuse", note="Could you tell me the order id?")
            return _call("list_user_orders", user_id=user_id)
        for row in listing if isinstance(listing, list) else []:
            oid = row.get("order_id")
            got = view.result("get_order_details", order_id=oid)
            if got is None:
                return _call("get_order_details", order_id=oid)
            if got[0] and any(request.item_name == i.get("name") for i in got[1].get("items", [])):
                order_id = oid
                break
        if order_id is None:
            note = f"I could not find an order with the {request.item_name} on your account."
            return Decision(request, "refuse", note=note)
    assert order_id is not None
    got = view.result("get_order_details", order_id=order_id)
    if got is None:
        return _call("get_order_details", order_id=order_id)
    ok, order = got
    if not ok or not isinstance(order, dict):
        return Decision(request, "refuse", note=f"I could not find an order {order_id}.")
    if order.get("user_id") != user_id:
        return Decision(
            request, "refuse", note=f"Order {order_id} is not on your account, so I cannot change it."
        )
    status = str(order.get("status"))
    today = view.inputs.today
    age = None
    if order.get("delivered_on") and today:
        age = (datetime.date.fromisoformat(today) - datetime.date.fromisoformat(order["delivered_on"])).days
    open_items = [i for i in order.get("items", []) if i.get("status", "ordered") == "ordered"]
    line = None
    if request.item_id or request.item_name:
        line = next(
            (
                i
                for i in open_items
                if i.get("item_id") == request.item_id or i.get("name") == request.item_name
            ),
            None,
        )
    if request.kind == "cancel_order":
        if status not in BEFORE_SHIPMENT:
            note = f"Order {order_id} is {status}, so I cannot cancel it: only pending or processing orders can be cancelled."
            return Decision(request, "refuse", note=note, order=order)
        call = AgentToolCall(name="cancel_order", arguments={"order_id": order_id, "reason": request.reason})
        what = (
            f"cancel order {order_id} (total {_money(order['total'])}, refunded to {order['payment_method']})"
        )
        return Decision(request, "allow", call=call, describe=what, order=order)
    if request.kind == "update_order_address":
        if status not in BEFORE_SHIPMENT:
            note = f"Order {order_id} is {status}, so its shipping address can no longer change."
            return Decision(request, "refuse", note=note, order=order)
        if int(order.get("address_change_count") or 0) >= 1:
            note = f"The address of order {order_id} was already changed once, the most our policy allows."
            return Decision(request, "refuse", note=note, order=order)
        address = request.address
        call = AgentToolCall(name="update_order_address", arguments={"order_id": order_id, **address})
        what = f"ship order {order_id} to {address['line1']}, {address['city']} {address['zip_code']}"
        return Decision(request, "allow", call=call, describe=what, order=order)
    if request.kind == "return_items":
        if status != "delivered" or age is None or age > RETURN_WINDOW_DAYS:
            when = f"delivered {age} days ago" if age is not None else status
            note = f"Order {order_id} is {when}; returns are only possible within {RETURN_WINDOW_DAYS} days of delivery."
            return Decision(request, "refuse", note=note, order=order)
        if line is None:
            return Decision(
                request,
                "refuse",
                note=f"I could not find that item among the open items of order {order_id}.",
            )
        call = AgentToolCall(
            name="return_items",
            arguments={"order_id": order_id, "item_ids": [line["item_id"]], "reason": "no_longer_needed"},
        )
        what = (
            f"return the {line['name']} ({line['item_id']}) of order {order_id} for {_money(line['price'])}"
        )
        return Decision(request, "allow", call=call, describe=what, order=order, line=line)
    if request.kind == "issue_refund":
        if line is None:
            return Decision(
                request,
                "refuse",
                note=f"I could not find that item among the open items of order {order_id}.",
            )
        amount = float(request.amount if request.amount is not None else line["price"])
        left = float(order["total"]) - float(order.get("refunded_total") or 0.0)
        if amount > float(line["price"]) + 1e-9 or amount > left + 1e-9:
            note = f"I can refund at most the item's price, {_money(line['price'])}, for the {line['name']}."
            return Decision(request, "refuse", note=note, order=order)
        if amount > MAX_REFUND:
            return Decision(
                request,
                "transfer",
                note=f"A refund of {_money(amount)} is above the {_money(MAX_REFUND)} I may issue.",
                order=order,
            )
        call = AgentToolCall(
            name="issue_refund",
            arguments={"order_id": order_id, "amount": amount, "reason": f"damaged item {line['name']}"},
        )
        what = f"refund {_money(amount)} for the damaged {line['name']} of order {order_id} to {order['payment_method']}"
        return Decision(request, "allow", call=call, describe=what, order=order, line=line)
    raise Undecidable(f"no handling for {request.kind!r}")


def _report(name: str, args: dict[str, Any], value: Any) -> str:
    if not isinstance(value, dict):
        return f"The {name.replace('_', ' ')} did not go through: {value}."
    if name == "cancel_order":
        return f"Order {value['order_id']} is now cancelled; refund {value['refund_id']} of {_money(value['refund'])} goes back to your original payment method."
    if name == "update_order_address":
        a = value["shipping_address"]
        return f"Order {value['order_id']} will now ship to {a['line1']}, {a['city']} {a['zip_code']}."
    if name == "return_items":
        return f"The return of {', '.join(value['returned'])} from order {value['order_id']} is registered; refund {value['refund_id']} of {_money(value['refund'])} goes to your original payment method."
    if name == "issue_refund":
        return f"Refund {value['refund_id']} of {_money(value['amount'])} on order {args.get('order_id')} goes to {value['method']}."
    if name == "issue_store_credit":
        return f"I added the store credit ({value['credit_id']}); your balance is now {_money(value['balance'])}."
    if name == "transfer_to_human":
        return f"I am transferring you to a human agent (ticket {value['ticket_id']}); they will take it from here."
    return f"The {name.replace('_', ' ')} went through."


def trajectory_agent(inputs: BaseModel, rng: random.Random) -> AgentStep:
    assert isinstance(inputs, TrajectoryAgentInput)
    view = _View(inputs)
    missing = [t for t in REQUIRED_TOOLS if t not in view.tools]
    if missing:
        raise Undecidable(f"the rules trajectory agent needs the tools {missing}")
    if not view.user_texts:
        raise Undecidable("the agent speaks after the user")
    emails = [m for text in view.user_texts for m in EMAIL_RE.findall(text)]
    if not emails:
        return AgentStep(
            think="I must identify the customer first.",
            message="I can help with that. What is the email address on your account?",
        )
    email = emails[-1]
    found = view.result("find_user_by_email", email=email)
    if found is None:
        return _call("find_user_by_email", email=email)
    if not found[0] or not isinstance(found[1], dict):
        return AgentStep(
            think="No such account.",
            message=f"I could not find an account with the email {email}. Could you check it?",
        )
    user_id = str(found[1]["user_id"])
    profile = view.ok_value("get_user_details", user_id=user_id)
    if profile is None:
        return _call("get_user_details", user_id=user_id)

    requests = [r for text in view.user_texts for r in parse_requests(text)]
    decisions: list[Decision] = []
    for request in requests:
        decided = _decide(view, request, user_id, profile)
        if isinstance(decided, AgentStep):
            return decided
        decisions.append(decided)

    def executed(call: AgentToolCall) -> bool:
        key = {k: v for k, v in call.arguments.items() if k in ("order_id", "user_id")}
        return view.result(call.name, **key) is not None

    earlier = " ".join(str(m.get("content") or "") for m in inputs.messages if m.get("role") == "assistant")
    notes = [d.note for d in decisions if d.verdict != "allow" and d.note and d.note not in earlier]
    transfer = next((d for d in decisions if d.verdict == "transfer"), None)
    if (
        transfer is not None
        and "transfer_to_human" in view.tools
        and view.result("transfer_to_human", user_id=user_id) is None
    ):
        return _call(
            "transfer_to_human", user_id=user_id, summary=f"{transfer.request.sentence} {transfer.note}"
        )
    pending = [d for d in decisions if d.verdict == "allow" and d.call is not None and not executed(d.call)]
    verified = view.app_ok("confirm_identity_code", user_id=user_id)
    if pending:
        sent = view.ok_value("send_verification_code", user_id=user_id)
        if sent is None and not verified:
            return _call("send_verification_code", user_id=user_id)
        said_yes = bool(YES_RE.search(view.last_user))
        for decision in pending:
            assert decision.call is not None
            ready = verified and said_yes and decision.describe in view.last_assistant
            if decision.call.name == "issue_refund":
                ready = ready and view.app_ok("report_damage", order_id=decision.call.arguments["order_id"])
            if ready:
                return AgentStep(
                    think=f"Identity verified and the customer agreed to: {decision.describe}.",
                    tool_calls=[decision.call],
                )
        parts = list(notes)
        asks: list[AgentToolCall] = []
        if not verified:
            parts.append(
                f"To verify your identity I sent a one-time code to your phone ({sent.get('sent_to') if isinstance(sent, dict) else 'on file'}); please enter it in the app."
            )
            asks.append(AgentToolCall(name="confirm_identity_code", arguments={"user_id": user_id}))
        for decision in pending:
            assert decision.call is not None
            oid = decision.call.arguments.get("order_id")
            if decision.call.name == "issue_refund" and not view.app_ok("report_damage", order_id=oid):
                line = decision.line or {}
                parts.append(f"Please upload photos of the damaged {line.get('name')} in the app first.")
                asks.append(
                    AgentToolCall(
                        name="report_damage", arguments={"order_id": oid, "item_id": line.get("item_id")}
                    )
                )
        parts.append("Shall I proceed with: " + "; and ".join(d.describe for d in pending) + "?")
        return AgentStep(
            think="Every request was checked against the policy; I confirm the writes before making them.",
            message=" ".join(parts),
            user_action_requests=asks,
        )
    # Nothing left to do: report the writes made since the last message, and refusals.
    reports: list[str] = []
    seen_text = False
    for message in reversed(inputs.messages):
        if message.get("role") == "assistant" and message.get("content") and not message.get("tool_calls"):
            seen_text = True
            break
    last_text = (
        max(
            (
                n
                for n, m in enumerate(inputs.messages)
                if m.get("role") == "assistant" and m.get("content") and not m.get("tool_calls")
            ),
            default=-1,
        )
        if seen_text
        else -1
    )
    ids: dict[str, tuple[str, dict[str, Any]]] = {}
    for n, message in enumerate(inputs.messages):
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                fn = call.get("function", {})
                ids[str(call.get("id"))] = (str(fn.get("name")), json.loads(fn.get("arguments") or "{}"))
        if n > last_text and message.get("role") == "tool":
            name, args = ids.get(str(message.get("tool_call_id")), ("", {}))
            if name in (
                "cancel_order",
                "update_order_address",
                "return_items",
                "issue_refund",
                "issue_store_credit",
                "transfer_to_human",
            ):
                content = str(message.get("content") or "")
                value = json.loads(content) if not content.startswith("error:") else content
                reports.append(_report(name, args, value))
    text = " ".join(reports + notes)
    if transfer is not None and view.result("transfer_to_human", user_id=user_id) is not None:
        return AgentStep(think="Transferred.", message=text or "A human agent will take it from here.")
    closing = "Is there anything else I can help you with?"
    return AgentStep(think="All requests are handled.", message=f"{text} {closing}".strip())


def trajectory_validation(inputs: BaseModel, rng: random.Random) -> TrajectoryVerdict:
    assert isinstance(inputs, TrajectoryValidationInput)
    summary = {DIMENSIONS.get(k, k): v for k, v in inputs.ratings.items()}
    critical = [i for i in inputs.issues if i.critical]
    observations = [f"{i.criterion}: {i.description}" for i in inputs.issues if not i.critical]
    poor = [k for k, v in summary.items() if v.rating == "Poor"]
    failed = bool(critical) or len(poor) >= 2
    reason = None
    if critical:
        reason = f"{critical[0].criterion}: {critical[0].description}"
    elif failed:
        reason = f"dimensions rated Poor: {', '.join(poor)}"
    return TrajectoryVerdict(
        validation_summary=summary,
        critical_issues=critical,
        non_critical_observations=observations,
        validation_result="FAIL" if failed else "PASS",
        failure_reason=reason,
    )


RULES: dict[str, Callable[[BaseModel, random.Random], BaseModel]] = {
    EIGEN_TRAJECTORY_AGENT.name: trajectory_agent,
    EIGEN_TRAJECTORY_VALIDATION.name: trajectory_validation,
}

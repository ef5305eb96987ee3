"""The realism check of synthesised customer-service dialogues: a fixture per habit a person would
not accept (each seen in dialogues the guided agent and the rules user made on tau2's domains), and
a careful dialogue that shows none."""

from __future__ import annotations

import json
from typing import Any

import pytest

from synthesis.eigen.realism import realism_findings

SYSTEM = {"role": "system", "content": "policy"}
WRITES = {"cancel_pending_order", "suspend_line", "enable_roaming", "update_reservation_passengers"}


def agent(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": name, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        ],
    }


def result(value: Any) -> dict[str, Any]:
    return {"role": "tool", "content": json.dumps(value)}


CAREFUL = [
    SYSTEM,
    agent("Hi! How can I help you today?"),
    user("Hi, I'd like to cancel an order I placed last week."),
    agent("I can help with that. Could you give me your email address so I can find your account?"),
    user("Sure, it is emma.kim@example.com."),
    call("find_user_id_by_email", email="emma.kim@example.com"),
    result("emma_kim_9957"),
    call("get_user_details", user_id="emma_kim_9957"),
    result({"orders": ["#W1001", "#W1002"]}),
    agent("I see two orders on your account, #W1001 and #W1002. Which one would you like to cancel?"),
    user("The first one, #W1001, please. I ordered it by mistake."),
    agent("To confirm: cancel order #W1001 because it was ordered by mistake. Shall I proceed?"),
    user("Yes, please go ahead."),
    call("cancel_pending_order", order_id="#W1001", reason="ordered by mistake"),
    result({"status": "cancelled"}),
    agent("Done: order #W1001 is cancelled. Is there anything else I can help you with?"),
    user("No, that is all. Thanks!"),
]


def reasons(chat: list[dict[str, Any]], instructions: str = "") -> list[str]:
    return [f.reason for f in realism_findings(chat, instructions=instructions, writes=WRITES)]


def test_a_careful_dialogue_has_no_finding() -> None:
    assert reasons(CAREFUL) == []


BAD: dict[str, list[dict[str, Any]]] = {
    # looks up an order and a user id before the customer said who they are
    "lookup_before_identification": [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user("I want to cancel order #W1001."),
        call("get_order_details", order_id="#W1001"),
        result({"order_id": "#W1001", "user_id": "emma_kim_9957"}),
        call("get_user_details", user_id="emma_kim_9957"),
    ],
    # the same proposal word for word after the customer changed the subject
    "repeated_agent_message": [
        *CAREFUL[:11],
        agent('I can now cancel pending order (order id "#W1001"). Shall I proceed?'),
        user("Actually, can you also tell me when my other order ships?"),
        agent('I can now cancel pending order (order id "#W1001"). Shall I proceed?'),
    ],
    # "I'm sorry, but I cannot do that under our policy." twice
    "repeated_refusal": [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user("My user id is emma_kim_9957 and I want a refund for a delivered flight."),
        agent("I'm sorry, but I cannot do that under our policy."),
        user("Are you sure? It was a long delay."),
        agent("I'm sorry, but I cannot do that under our policy."),
    ],
    # one of three lines picked because the reference says so, without asking which is the user's
    "choice_without_asking": [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user("My phone number is 555-123-2002 and my mobile data is not working properly."),
        call("get_customer_by_phone", phone_number="555-123-2002"),
        result({"customer_id": "C1001", "line_ids": ["L1001", "L1002", "L1003"]}),
        call("enable_roaming", customer_id="C1001", line_id="L1002"),
    ],
    # the customer answers a refusal with its name and id
    "identity_after_refusal": [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user("I want to upgrade my reservation to business for free."),
        agent("I'm sorry, but I cannot do that under our policy."),
        user("My name is Emma Kim and my user id is emma_kim_9957."),
    ],
    # the opening reads as a template: "You mobile data ..." made first person
    "opening_slip": [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user("I mobile data is not working properly."),
    ],
    "opening_not_first_person": [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user("Cancel order #W1001 because of a mistake."),
    ],
    # the customer recites its scenario (second person: the simulator's instructions)
    "goal_revealed": [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user(
            "Hi. You want to cancel your order #W1001 because you ordered it by mistake and you do not want a refund."
        ),
    ],
    "repeated_user_message": [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user("I want to cancel my order, my email is emma.kim@example.com."),
        agent("Which order would you like to cancel?"),
        user("I want to cancel my order, my email is emma.kim@example.com."),
    ],
}
EXPECTED = {"repeated_refusal": "repeated_agent_message"}
INSTRUCTIONS = (
    "You are Emma Kim. You want to cancel your order #W1001 because you ordered it by mistake and you "
    "do not want a refund. Your email is emma.kim@example.com."
)


@pytest.mark.parametrize("pattern", sorted(BAD))
def test_each_bad_habit_is_found_by_name(pattern: str) -> None:
    found = realism_findings(BAD[pattern], instructions=INSTRUCTIONS, writes=WRITES)
    assert EXPECTED.get(pattern, pattern) in [f.reason for f in found], found
    assert all(f.description and 0 < f.turn < len(BAD[pattern]) for f in found)


def test_asking_which_item_or_the_customer_naming_it_is_no_finding() -> None:
    listed = BAD["choice_without_asking"][:5]
    asked = [
        *listed,
        agent("I see three lines on your account: L1001, L1002 and L1003. Which one has the problem?"),
        user("It is the one ending in 2002."),
        call("enable_roaming", customer_id="C1001", line_id="L1002"),
    ]
    assert "choice_without_asking" not in reasons(asked)
    described = [
        *listed[:4],
        result(
            {
                "customer_id": "C1001",
                "lines": [
                    {"line_id": "L1001", "phone": "555-123-2001"},
                    {"line_id": "L1002", "phone": "555-123-2002"},
                ],
            }
        ),
        call("enable_roaming", customer_id="C1001", line_id="L1002"),
    ]
    assert "choice_without_asking" not in reasons(described)  # the customer's own number names it


def test_a_write_that_restates_every_listed_item_picks_none() -> None:
    """Replacing one passenger sends the whole list (the other passengers unchanged): no choice made,
    though the kept passenger's date of birth is one of two listed that the customer never named."""
    people = [
        {"first_name": "Ann", "last_name": "Lee", "dob": "1980-01-01"},
        {"first_name": "Lei", "last_name": "Rossi", "dob": "1990-02-02"},
    ]
    chat = [
        SYSTEM,
        agent("Hi! How can I help you today?"),
        user("On my reservation ABC123 I want to replace Lei Rossi with Dan Reyes, born 1999-01-06."),
        agent("Could you tell me your user id?"),
        user("My user id is ann_lee_1."),
        call("get_reservation_details", reservation_id="ABC123"),
        result({"reservation_id": "ABC123", "passengers": people}),
        call(
            "update_reservation_passengers",
            reservation_id="ABC123",
            passengers=[people[0], {"first_name": "Dan", "last_name": "Reyes", "dob": "1999-01-06"}],
        ),
    ]
    assert "choice_without_asking" not in reasons(chat)
    one_of_two = [
        *chat[:-1],
        call("update_reservation_passengers", reservation_id="ABC123", passengers=[people[0]]),
    ]
    assert "choice_without_asking" in reasons(
        one_of_two
    )  # picking one of them still needs the customer's word


def test_a_person_may_say_i_think_it_is() -> None:
    chat = [SYSTEM, agent("Hi!"), user("I think it is broken: my phone has no signal since yesterday.")]
    assert reasons(chat) == []


def test_the_rules_user_says_yes_in_other_words_each_time() -> None:
    """A customer asked to confirm twice does not answer with the same sentence twice."""
    import random

    from arena.llm.roles.user_sim import DialogueMessage, UserSimInput
    from simulator.user_sim import CONFIRMATION, user_turn
    from synthesis.eigen.roles.dialogs import YES_RE

    said: list[DialogueMessage] = [
        DialogueMessage(role="user", content="My user id is jo_li_1234. I want to cancel two orders."),
    ]
    replies = []
    for order in ("#W1", "#W2", "#W3"):
        said.append(
            DialogueMessage(role="assistant", content=f"I can cancel order {order}. Shall I proceed?")
        )
        inputs = UserSimInput(
            instructions="You want to cancel your orders.",
            requirements=["My user id is jo_li_1234. I want to cancel two orders."],
            goal_actions=["cancel"],
            dialogue=said,
            turn=len(replies) + 1,
            max_turns=10,
        )
        reply = user_turn(inputs, random.Random(0))
        replies.append(reply.message)
        said.append(DialogueMessage(role="user", content=reply.message))
    assert replies[0] == CONFIRMATION and len(set(replies)) == 3
    assert all(YES_RE.search(r) for r in replies)  # each still a yes the agent acts on

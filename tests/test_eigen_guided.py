"""The rules TrajectoryAgent with a reference solution (``simulator.eigen_guided``), which tau2
synthesis uses (``producers.tau2_synthesis``), and how a tau2 scenario becomes the user's words.

No sandbox or tau2 install needed: the inputs are built here; tests/test_tau2.py runs the agent
against the real domains.
"""

from __future__ import annotations

import json


def test_guided_agent_grounds_values_confirms_writes_and_asks_the_user_to_act() -> None:
    """The rules TrajectoryAgent with a reference solution: it asks for a value it has not seen,
    proposes a write and runs it only after a yes, and asks the user to run a user tool."""
    from simulator.eigen_guided import PROPOSALS, guided_step
    from synthesis.eigen.roles.dialogs import (
        EIGEN_AGENT_NATIVE,
        AgentStep,
        AppEvent,
        ReferenceStep,
        TrajectoryAgentInput,
    )

    tools = [
        {"type": "function", "function": {"name": "cancel_order", "parameters": {"required": ["order_id"]}}},
    ]
    user_tools = [{"type": "function", "function": {"name": "toggle_airplane_mode", "parameters": {}}}]
    reference = [
        ReferenceStep(name="cancel_order", arguments={"order_id": "#W1234"}, writes=True),
        ReferenceStep(name="toggle_airplane_mode", actor="user"),
    ]

    def step(messages: list[dict[str, object]], events: tuple[AppEvent, ...] = ()) -> AgentStep:
        inputs = TrajectoryAgentInput(
            app_events=list(events),
            policy="Be nice.",
            tools=tools,
            user_tools=user_tools,
            messages=[{"role": "system", "content": "Be nice."}, *messages],
            reference=reference,
            reference_info=["refund of 12.50"],
        )
        # what a served model sees and what the simulator reads back: the reference survives the trip
        chat = EIGEN_AGENT_NATIVE.conversation(inputs)
        assert "<reference_solution>" in chat[0]["content"]
        restored = EIGEN_AGENT_NATIVE.inputs_from(chat, EIGEN_AGENT_NATIVE.tools(inputs))
        assert restored.reference == reference and restored.reference_info == ["refund of 12.50"]
        return guided_step(restored)

    first = step([{"role": "user", "content": "Please cancel my order."}])
    assert first.message and "who you are" in first.message and not first.tool_calls  # identify first
    opened = [
        {"role": "user", "content": "Please cancel my order."},
        {"role": "assistant", "content": first.message},
    ]
    nameless = step([*opened, {"role": "user", "content": "It is order #W1234."}])
    assert (
        nameless.message and nameless.message != first.message and not nameless.tool_calls
    )  # asked again, not verbatim
    said = [*opened, {"role": "user", "content": "My user id is jo_li_1234, and it is order #W1234."}]
    proposal = step(said)
    assert proposal.message and proposal.message.endswith("Shall I proceed?") and "#W1234" in proposal.message
    no = step(
        [*said, {"role": "assistant", "content": proposal.message}, {"role": "user", "content": "Wait."}]
    )
    forms = [p.split("{")[0] for p in PROPOSALS]
    assert no.message and no.message != proposal.message and any(no.message.startswith(f) for f in forms)
    assert not no.tool_calls  # no yes, no write; the proposal again, in other words
    yes = [
        *said,
        {"role": "assistant", "content": proposal.message},
        {"role": "user", "content": "Yes, go ahead."},
    ]
    call = step(yes)
    assert [c.name for c in call.tool_calls] == ["cancel_order"]
    ran = [
        *yes,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "cancel_order", "arguments": '{"order_id": "#W1234"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "cancelled"},
    ]
    ask = step(ran)
    assert [r.name for r in ask.user_action_requests] == ["toggle_airplane_mode"] and ask.message
    asked = [*ran, {"role": "assistant", "content": ask.message}]
    assert step(asked).user_action_requests  # not done yet: still asking
    done = step(
        [*asked, {"role": "user", "content": "Done, it is off."}],
        (AppEvent(name="toggle_airplane_mode", ok=True, output="off", after_message=len(asked)),),
    )
    assert done.message and "refund of 12.50" in done.message and not done.user_action_requests


def test_first_person_turns_a_scenario_into_what_the_user_says() -> None:
    from environments.tau2_tasks import first_person

    assert (
        first_person("You are Emma Kim.\nYour user id is emma_kim_9957.")
        == "I am Emma Kim.\nMy user id is emma_kim_9957."
    )
    assert (
        first_person(
            "It is ok because you were out of town. The agent told you that you can (you don't mind)."
        )
        == "It is ok because I was out of town. The agent told me that I can (I don't mind)."
    )
    # tau2's telecom scenarios say "You mobile data is not working": a lost "r", not "I mobile data"
    assert (
        first_person("You mobile data is not working properly.") == "My mobile data is not working properly."
    )
    assert first_person("You think it is broken.") == "I think it is broken."


def test_lookups_use_what_the_customer_said_and_what_tools_returned() -> None:
    """A value the agent was not told is found by a look-up whose arguments the dialogue showed:
    the customer's words first ("I am Ivan Khan ... zip code 28243"), then earlier results."""
    from simulator.eigen_guided import guided_step, said_value
    from synthesis.eigen.roles.dialogs import ReferenceStep, TrajectoryAgentInput

    said = ["Hi, I am Ivan Khan and my zip code is 28243.", "My phone number is 555-123-2002."]
    assert [said_value(p, said) for p in ("first_name", "last_name", "zip", "phone_number")] == [
        "Ivan",
        "Khan",
        "28243",
        "555-123-2002",
    ]
    assert said_value("order_id", said) is None  # never said: not guessed

    def spec(name: str, *required: str) -> dict[str, object]:
        props = {r: {"type": "string"} for r in required}
        return {
            "type": "function",
            "function": {"name": name, "parameters": {"properties": props, "required": list(required)}},
        }

    tools = [
        spec("find_user_id_by_name_zip", "first_name", "last_name", "zip"),
        spec("get_user_details", "user_id"),
        spec("cancel_pending_order", "order_id", "reason"),
    ]
    reference = [
        ReferenceStep(
            name="cancel_pending_order",
            arguments={"order_id": "#W77", "reason": "no longer needed"},
            writes=True,
        )
    ]

    def step(messages: list[dict[str, object]]) -> object:
        inputs = TrajectoryAgentInput(
            policy="p",
            tools=tools,
            messages=[{"role": "system", "content": "p"}, *messages],
            reference=reference,
        )
        return guided_step(inputs)

    opening = [
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": said[0] + " Cancel my order."},
    ]
    first = step(opening)
    assert [(c.name, c.arguments) for c in first.tool_calls] == [
        ("find_user_id_by_name_zip", {"first_name": "Ivan", "last_name": "Khan", "zip": "28243"})
    ]

    def ran(name: str, arguments: dict[str, str], output: str, n: int) -> list[dict[str, object]]:
        call = {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": output},
        ]

    found = [*opening, *ran("find_user_id_by_name_zip", first.tool_calls[0].arguments, "ivan_khan_7475", 0)]
    second = step(found)  # the bare id a find_user_id_* tool returned is the user_id
    assert [(c.name, c.arguments) for c in second.tool_calls] == [
        ("get_user_details", {"user_id": "ivan_khan_7475"})
    ]
    profile = json.dumps({"user_id": "ivan_khan_7475", "orders": ["#W11", "#W77"]})
    shown = [*found, *ran("get_user_details", {"user_id": "ivan_khan_7475"}, profile, 1)]
    third = step(shown)  # two orders, and the customer named neither: ask which
    assert third.message and "#W11" in third.message and "#W77" in third.message and "?" in third.message
    named = [
        *shown,
        {"role": "assistant", "content": third.message},
        {"role": "user", "content": "The #W77 one."},
    ]
    fourth = step(named)  # named: propose the write
    assert (
        fourth.message and "#W77" in fourth.message and "proceed" in fourth.message and not fourth.tool_calls
    )


def test_dialogue_checks_flag_fabricated_ids_and_unconfirmed_writes() -> None:
    """tau2 synthesis's TrajectoryValidation evidence: an id the dialogue never showed is
    fabrication, a write without the customer's yes breaks the confirmation rule."""
    from producers.tau2_synthesis import dialogue_checks

    tools = [
        {
            "type": "function",
            "function": {
                "name": "cancel",
                "parameters": {"properties": {"order_id": {}}, "required": ["order_id"]},
            },
        }
    ]

    def chat(user: str, order: str) -> list[dict[str, object]]:
        call = {
            "id": "c0",
            "type": "function",
            "function": {"name": "cancel", "arguments": json.dumps({"order_id": order})},
        }
        return [
            {"role": "system", "content": "policy"},
            {"role": "user", "content": user},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": "cancelled"},
        ]

    ratings, issues = dialogue_checks(
        chat("Yes, my user id is jo_li_1234: cancel #W12 please.", "#W12"), tools, {"cancel"}
    )
    assert not issues and {r.rating for r in ratings.values()} == {"Good"}
    ratings, issues = dialogue_checks(chat("Cancel my order.", "#W99"), tools, {"cancel"})
    assert ratings["grounding"].rating == ratings["policy"].rating == "Poor"
    critical = {i.criterion for i in issues if i.critical}
    assert critical == {"grounding", "policy"}  # and the look-up before identification, as realism
    assert [i.description.split(":")[0] for i in issues if not i.critical] == ["lookup_before_identification"]

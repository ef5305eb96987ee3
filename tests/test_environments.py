"""Rollout environments in the real sandbox: QA packages (F1 reward) and interactive instances.

The QA package is written by hand in the shape the environment track emits (lookup functions
over per-tool data tables, one job per sub-question); its sample comes from the real
``samples.verified`` stage function. The interactive instance is a small order-cancellation
desk with a policy (only pending orders, only the listed reasons), a verification function that
compares the final state with the expected one and checks the key call, and the rules user
simulator through the real gateway.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from arena.config import SandboxSettings
from arena.llm.gateway import Gateway
from arena.llm.roles.user_sim import DialogueMessage, UserAction, UserSimInput, UserTurn
from arena.records.envs import EnvJob, EnvPackage, SubQA, VerifiedSample
from environments.environment import InteractiveEnvironment, InteractiveSpec, QaEnvironment
from environments.factory import environment_for
from environments.render import ToolCall
from environments.rewards import ToolResult
from environments.user_view import ParsedUserTurn, UserContext
from sandbox import SandboxPool
from sandbox.env_runtime import EnvSession, Runner, verify_package
from sandbox.pool import SandboxResult
from simulator.backend import RulesBackend
from simulator.user_sim import CONFIRMATION, NO_INFO, NUDGE, THANKS, user_turn
from streams.envs.samples_verified import sample_of
from trainer.rollout import Trajectory

pytestmark = pytest.mark.timeout(120)

T = TypeVar("T")
POOL = SandboxSettings.model_validate({"pool_size": 2, "timeout_s": 5.0})


def sandboxed(scenario: Callable[[SandboxPool], Awaitable[T]]) -> T:
    async def main() -> T:
        async with SandboxPool(POOL) as pool:
            return await scenario(pool)

    return asyncio.run(main())


class CountingPool:
    """A real pool (the ``Runner``) that keeps the sessions opened through it."""

    def __init__(self, pool: SandboxPool) -> None:
        self.pool = pool
        self.sessions: list[EnvSession] = []

    async def run(
        self, code: str, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> SandboxResult:
        return await self.pool.run(code, timeout_s=timeout_s, memory_mb=memory_mb)

    async def open_session(
        self, *, timeout_s: float | None = None, memory_mb: int | None = None
    ) -> EnvSession:
        session = await self.pool.open_session(timeout_s=timeout_s, memory_mb=memory_mb)
        self.sessions.append(session)
        return session

    @property
    def open(self) -> int:
        """Sessions opened here and not closed (nor dead)."""
        return sum(s.alive for s in self.sessions)


# --------------------------------------------------------------------------- a QA package

LIBRARY_CODE = """
def _find(table, column, value):
    for row in DATA[table]:
        if str(row[column]).casefold() == str(value).strip().casefold():
            return row
    return None


def get_book_author(book_id):
    row = _find("get_book_author", "book_id", book_id)
    return {"author_id": row["author_id"]} if row else {"error": "no such book"}


def get_author_country(author_id):
    row = _find("get_author_country", "author_id", author_id.upper())  # a str, or it raises
    return {"country": row["country"]} if row else {"error": "no such author"}


def slow_count(n=1):
    while True:
        n += 1
"""


def _tool(name: str, description: str, params: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": params, "required": required},
        },
    }


LIBRARY_TOOLS = [
    _tool("get_book_author", "Author id of a book.", {"book_id": {"type": "string"}}, ["book_id"]),
    _tool("get_author_country", "Country of an author.", {"author_id": {"type": "string"}}, ["author_id"]),
    _tool("slow_count", "Counts (forever).", {"n": {"type": "integer"}}, []),
]
LIBRARY_DATA: dict[str, list[dict[str, str | int | float]]] = {
    "get_book_author": [
        {"book_id": "B-7", "author_id": "AU-3"},
        {"book_id": "B-9", "author_id": "AU-1"},
    ],
    "get_author_country": [
        {"author_id": "AU-1", "country": "Chile"},
        {"author_id": "AU-3", "country": "Portugal"},
    ],
}


def library_package(data: dict[str, Any] | None = None, code: str = LIBRARY_CODE) -> EnvPackage:
    return EnvPackage(
        env_id="env-library-test",
        qa_id="qa-library",
        seed_id="seed-library",
        domain="library",
        structure="multi_hop",
        question="In which country was the author of book B-7 born?",
        answer="Portugal",
        sub_qas=[
            SubQA(index=1, question="Who wrote book B-7?", answer="AU-3"),
            SubQA(index=2, question="Which country is author AU-3 from?", answer="Portugal", depends_on=[1]),
        ],
        tools=LIBRARY_TOOLS,
        code=code,
        data=copy.deepcopy(LIBRARY_DATA) if data is None else data,
        jobs=[
            EnvJob(
                index=1,
                question="Who wrote book B-7?",
                answer="AU-3",
                tool="get_book_author",
                invocation="get_book_author(book_id='B-7')",
            ),
            EnvJob(
                index=2,
                question="Which country is author AU-3 from?",
                answer="Portugal",
                tool="get_author_country",
                invocation="get_author_country(author_id='AU-3')",
            ),
        ],
    )


WEATHER = EnvPackage(
    env_id="env-weather-test",
    qa_id="qa-weather",
    seed_id="seed-weather",
    domain="weather",
    structure="single_hop",
    question="How warm is it in Oslo?",
    answer="-3",
    sub_qas=[SubQA(index=1, question="How warm is it in Oslo?", answer="-3")],
    tools=[_tool("get_city_temperature", "Temperature of a city.", {"city": {"type": "string"}}, ["city"])],
    code="def get_city_temperature(city):\n    return {'celsius': DATA['get_city_temperature'][0]['celsius']}\n",
    data={"get_city_temperature": [{"city": "Oslo", "celsius": -3}]},
    jobs=[
        EnvJob(
            index=1,
            question="How warm is it in Oslo?",
            answer="-3",
            tool="get_city_temperature",
            invocation="get_city_temperature(city='Oslo')",
        )
    ],
)

REFERENCE_CALLS = [("get_book_author", {"book_id": "B-7"}), ("get_author_country", {"author_id": "AU-3"})]


def trajectory(sample: VerifiedSample, outputs: list[str], emitted: int) -> Trajectory:
    """A hand-made trajectory: only what the rewards read is filled in."""
    return Trajectory(
        sample_id=sample.sample_id,
        seed=0,
        messages=list(sample.prompt),
        tools=sample.tools,
        prompt_ids=[1],
        response_ids=[],
        response_mask=[],
        logprobs=[],
        turns=1,
        tool_calls=emitted,
        invalid_calls=0,
        failed_calls=0,
        user_turns=0,
        tool_outputs=outputs,
        tool_results=[ToolResult(name="tool", content=text) for text in outputs],
        stop="no_tool_call",
    )


def test_qa_calls_run_in_the_sandbox_and_failures_are_observations() -> None:
    package = library_package()
    sample = sample_of(package)

    async def scenario(pool: SandboxPool) -> None:
        assert all(o.passed for o in await verify_package(package, pool))  # a genuinely valid package
        env = QaEnvironment(sample, package, pool, {"get_city_temperature": WEATHER}, timeout_s=1.0)
        assert [t["function"]["name"] for t in env.tools] == [
            "get_book_author",
            "get_author_country",
            "slow_count",
            "get_city_temperature",
        ]
        right = await env.call("get_book_author", {"book_id": "b-7"})
        assert (
            right.ok and json.loads(right.text) == {"author_id": "AU-3"} and right.tool == "get_book_author"
        )
        mixed = await env.call("get_city_temperature", {"city": "Oslo"})  # runs against its own package
        assert mixed.ok and json.loads(mixed.text) == {"celsius": -3}

        unknown = await env.call("get_book_price", {"book_id": "B-7"})
        assert not unknown.ok and "unknown tool 'get_book_price'" in unknown.text
        missing = await env.call("get_book_author", {})
        assert not missing.ok and "missing required argument(s) 'book_id'" in missing.text
        extra = await env.call("get_book_author", {"book_id": "B-7", "isbn": "1"})
        assert not extra.ok and "unknown argument(s) 'isbn'" in extra.text
        raised = await env.call("get_author_country", {"author_id": 3})  # int has no .upper()
        assert not raised.ok and raised.text.startswith("error: exception: AttributeError")
        slow = await env.call("slow_count", {})
        assert not slow.ok and "timeout" in slow.text
        hostile = await env.call("get_book_author", {"book_id": "x') or __import__('os').getpid() #"})
        assert hostile.ok and "no such book" in hostile.text  # arguments are data, never code
        await env.close()

        # A tool offered by no package of this instance is unknown, even if another package has it.
        plain = QaEnvironment(sample, package, pool)
        assert not (await plain.call("get_city_temperature", {"city": "Oslo"})).ok
        await plain.close()

    sandboxed(scenario)

    async def closed_pool() -> None:
        pool = SandboxPool(POOL)
        await pool.start()
        await pool.close()
        env = QaEnvironment(sample, package, pool)
        down = await env.call("get_book_author", {"book_id": "B-7"})
        assert not down.ok and down.text.startswith("error: sandbox_error")
        await env.close()

    asyncio.run(closed_pool())


def test_f1_reward_of_a_hand_trajectory() -> None:
    package = library_package()
    sample = sample_of(package)

    async def scenario(pool: SandboxPool) -> list[tuple[float, dict[str, float]]]:
        outputs = []
        for name, args in REFERENCE_CALLS:
            env = QaEnvironment(sample, package, pool)
            obs = await env.call(name, args)
            await env.close()
            assert obs.ok, obs
            outputs.append(obs.text)
        # Three emitted calls (one of them invalid, so no output) solving both sub-tasks:
        # n = 2, n_hat = 2, c = 3 -> r = 1, p = 2/3, F1 = 2 * (2/3) * 1 / (2/3 + 1) = 0.8.
        hand = trajectory(sample, outputs, emitted=3)
        results = []
        for mode in ("f1", "recall", "precision"):
            env = QaEnvironment(sample, package, pool, mode=mode)  # type: ignore[arg-type]
            results.append(await env.reward(hand))
        # Only the first sub-task solved, one call: r = 1/2, p = 1/1, F1 = 2 * 1 * 0.5 / 1.5 = 2/3.
        results.append(await QaEnvironment(sample, package, pool).reward(trajectory(sample, outputs[:1], 1)))
        # Nothing solved: 0 whatever c is.
        results.append(await QaEnvironment(sample, package, pool).reward(trajectory(sample, [], 4)))
        return results

    (f1, parts), (recall, _), (precision, _), (half, _), (none, none_parts) = sandboxed(scenario)
    assert f1 == pytest.approx(0.8)
    assert parts == {
        "n": 2.0,
        "n_hat": 2.0,
        "c": 3.0,
        "recall": 1.0,
        "precision": pytest.approx(2 / 3),
        "f1": f1,
    }
    assert recall == 1.0 and precision == pytest.approx(2 / 3)
    assert half == pytest.approx(2 / 3)
    assert none == 0.0 and none_parts["c"] == 4.0


BROKEN_CODE = LIBRARY_CODE.replace('return {"country": row["country"]}', 'return {"country": "unknown"}')


@pytest.mark.parametrize("broken", ["tampered_table", "wrong_code"])
def test_reward_against_a_broken_environment_is_zero(broken: str) -> None:
    """The reference calls solve the real package; against a broken one they earn nothing."""
    good = library_package()
    data = copy.deepcopy(LIBRARY_DATA)
    if broken == "tampered_table":
        data["get_book_author"][0]["author_id"] = "AU-8"
        data["get_author_country"][1]["country"] = "Spain"
        bad = library_package(data)
    else:  # lookups that ignore the table for the second hop, and a first-hop table without AU-3
        data["get_book_author"][0]["author_id"] = "AU-1"
        bad = library_package(data, BROKEN_CODE)
    sample = sample_of(good)  # the jobs (answers) come from the verified package

    async def scenario(pool: SandboxPool) -> tuple[float, float]:
        rewards = []
        for package in (good, bad):
            env = QaEnvironment(sample, package, pool)
            observations = [await env.call(name, args) for name, args in REFERENCE_CALLS]
            assert all(o.ok for o in observations)
            outputs = [o.text for o in observations]
            rewards.append((await env.reward(trajectory(sample, outputs, len(outputs))))[0])
            await env.close()
        return rewards[0], rewards[1]

    good_reward, bad_reward = sandboxed(scenario)
    assert good_reward == pytest.approx(1.0)  # n = c = n_hat = 2
    assert bad_reward == 0.0


# --------------------------------------------------------------------------- an interactive instance

ORDERS_STATE: dict[str, Any] = {
    "orders": {
        "O-1001": {"user_id": "U-1", "status": "pending", "total": 40.0},
        "O-1002": {"user_id": "U-1", "status": "delivered", "total": 15.5},
        "O-1003": {"user_id": "U-2", "status": "pending", "total": 99.0},
    },
    "refunds": [],
}

ORDERS_CODE = """
REASONS = ("no longer needed", "ordered by mistake")


def get_order(order_id):
    order = STATE["orders"].get(order_id)
    if order is None:
        raise KeyError(f"no order {order_id}")
    return {"order_id": order_id, **order}


def cancel_order(order_id, reason):
    order = STATE["orders"].get(order_id)
    if order is None:
        raise KeyError(f"no order {order_id}")
    if order["status"] != "pending":  # policy: only pending orders can be cancelled
        raise ValueError(f"order {order_id} is {order['status']}; only pending orders can be cancelled")
    if reason not in REASONS:  # policy: a listed reason
        raise ValueError(f"reason must be one of {REASONS}")
    order["status"] = "cancelled"
    STATE["refunds"].append({"order_id": order_id, "amount": order["total"]})
    return {"order_id": order_id, "status": "cancelled", "refund": order["total"]}
"""

ORDERS_VERIFY = """
import copy


def verify(initial_state, final_state, calls):
    expected = copy.deepcopy(initial_state)
    expected["orders"]["O-1001"]["status"] = "cancelled"
    expected["refunds"].append({"order_id": "O-1001", "amount": 40.0})
    state = final_state == expected  # EXACT: ids, statuses, amounts
    key_call = any(
        c["name"] == "cancel_order" and c["ok"] and c["arguments"].get("order_id") == "O-1001" for c in calls
    )
    untouched = all(
        final_state["orders"][o] == initial_state["orders"][o] for o in initial_state["orders"] if o != "O-1001"
    )
    components = {"state": float(state), "key_call": float(key_call), "policy": float(untouched)}
    return {"pass": state and key_call and untouched, "reward": sum(components.values()) / 3, "components": components}
"""

ORDERS_SPEC = InteractiveSpec(
    initial_state=ORDERS_STATE,
    code=ORDERS_CODE,
    verify=ORDERS_VERIFY,
    user_instructions="You are Ana (user U-1). Cancel order O-1001 because you no longer need it.",
    requirements=["I want to cancel my order O-1001.", "The reason is: no longer needed."],
    goal_actions=["cancel_order"],
)

ORDER_SAMPLE = VerifiedSample(
    sample_id="vs-orders-test",
    kind="interactive",
    prompt=[
        {
            "role": "system",
            "content": "You are a store's support agent. Only pending orders can be cancelled.",
        },
        {"role": "user", "content": "Hi! I want to cancel my order O-1001."},
    ],
    tools=[
        _tool("get_order", "Look up an order.", {"order_id": {"type": "string"}}, ["order_id"]),
        _tool(
            "cancel_order",
            "Cancel a pending order.",
            {"order_id": {"type": "string"}, "reason": {"type": "string"}},
            ["order_id", "reason"],
        ),
    ],
    env_ref="inst-orders-test",
    reward_spec=ORDERS_SPEC.model_dump(),
    domain="retail",
)


def orders_env(pool: Runner) -> InteractiveEnvironment:
    return InteractiveEnvironment(ORDER_SAMPLE, pool, Gateway(RulesBackend(seed=0)))


def test_interactive_reference_calls_pass_and_a_wrong_key_argument_fails() -> None:
    async def scenario(pool: SandboxPool) -> None:
        env = orders_env(pool)
        looked = await env.call("get_order", {"order_id": "O-1001"})
        assert looked.ok and json.loads(looked.text)["status"] == "pending"
        refused = await env.call("cancel_order", {"order_id": "O-1002", "reason": "no longer needed"})
        assert not refused.ok and "only pending orders" in refused.text
        assert await env.read_state() == ORDERS_STATE  # a refused call leaves the state as it was
        assert not (await env.call("refund_all", {})).ok
        assert not (await env.call("cancel_order", {"order_id": "O-1001"})).ok  # reason missing
        done = await env.call("cancel_order", {"order_id": "O-1001", "reason": "no longer needed"})
        assert done.ok and json.loads(done.text) == {
            "order_id": "O-1001",
            "status": "cancelled",
            "refund": 40.0,
        }
        assert (await env.read_state())["orders"]["O-1001"]["status"] == "cancelled"
        assert ORDERS_STATE["orders"]["O-1001"]["status"] == "pending"  # the spec's state is never mutated
        assert env.completed_actions == ["cancel_order"]
        reward, parts = await env.reward(trajectory(ORDER_SAMPLE, [], 0))
        assert reward == 1.0
        assert parts == {"pass": 1.0, "verify_reward": 1.0, "state": 1.0, "key_call": 1.0, "policy": 1.0}
        await env.close()

        wrong = orders_env(pool)  # a fresh instance: nothing of the first one is shared
        assert wrong.state == ORDERS_STATE
        other = await wrong.call("cancel_order", {"order_id": "O-1003", "reason": "no longer needed"})
        assert other.ok  # the wrong order is pending too, so the call itself succeeds
        reward, parts = await wrong.reward(trajectory(ORDER_SAMPLE, [], 0))
        assert reward == 0.0 and parts["key_call"] == 0.0 and parts["policy"] == 0.0
        await wrong.close()

        nothing = orders_env(pool)
        assert (await nothing.reward(trajectory(ORDER_SAMPLE, [], 0)))[0] == 0.0
        await nothing.close()

        # A verification function that crashes scores 0 instead of raising.
        spec = ORDERS_SPEC.model_copy(update={"verify": "def verify(a, b, c):\n    return 1 / 0\n"})
        crashing = ORDER_SAMPLE.model_copy(update={"reward_spec": spec.model_dump()})
        broken = InteractiveEnvironment(crashing, pool, Gateway(RulesBackend(seed=0)))
        assert await broken.reward(trajectory(crashing, [], 0)) == (0.0, {"pass": 0.0, "verify_error": 1.0})
        await broken.close()

    sandboxed(scenario)


FLAKY_CODE = (
    ORDERS_CODE
    + """

def add_note_then_fail(order_id, note):
    STATE["orders"][order_id]["note"] = note  # changed, then refused: nothing of it may stay
    STATE["refunds"].append({"order_id": order_id, "amount": 0.0})
    raise RuntimeError("notes are closed today")


def wipe_state():
    global STATE
    STATE = ["not", "an", "object"]


def spin(order_id):
    while True:
        pass
"""
)
FLAKY_SAMPLE = ORDER_SAMPLE.model_copy(
    update={
        "tools": [
            *ORDER_SAMPLE.tools,
            _tool("add_note_then_fail", "Note.", {"order_id": {}, "note": {}}, ["order_id", "note"]),
            _tool("wipe_state", "Wipe.", {}, []),
            _tool("spin", "Spin.", {"order_id": {}}, ["order_id"]),
        ],
        "reward_spec": ORDERS_SPEC.model_copy(update={"code": FLAKY_CODE}).model_dump(),
    }
)
CANCEL = ("cancel_order", {"order_id": "O-1001", "reason": "no longer needed"})


def test_failed_interactive_calls_leave_the_state_and_later_calls_work() -> None:
    async def scenario(pool: SandboxPool) -> None:
        counting = CountingPool(pool)
        env = InteractiveEnvironment(FLAKY_SAMPLE, counting, Gateway(RulesBackend(seed=0)), timeout_s=1.0)
        failed = await env.call("add_note_then_fail", {"order_id": "O-1001", "note": "urgent"})
        assert not failed.ok and failed.text == "error: exception: RuntimeError: notes are closed today"
        wiped = await env.call("wipe_state", {})
        assert not wiped.ok and wiped.text == "error: the tool left STATE not a JSON object"
        looked = await env.call("get_order", {"order_id": "O-1001"})
        assert looked.ok and json.loads(looked.text) == {
            "order_id": "O-1001",
            **ORDERS_STATE["orders"]["O-1001"],
        }
        assert await env.read_state() == ORDERS_STATE
        # A timeout ends the session; nothing had changed, so a fresh one goes on from the same state.
        slow = await env.call("spin", {"order_id": "O-1001"})
        assert not slow.ok and "timeout" in slow.text
        assert (await env.call(*CANCEL)).ok
        assert [(c.name, c.ok, c.changed_state) for c in env.calls] == [
            ("add_note_then_fail", False, False),
            ("wipe_state", False, False),
            ("get_order", True, False),
            ("spin", False, False),
            ("cancel_order", True, True),
        ]
        assert (await env.reward(trajectory(FLAKY_SAMPLE, [], 0)))[0] == 1.0
        assert len(counting.sessions) == 2  # the one the timeout ended, and its replacement
        await env.close()
        assert counting.open == 0 and env.state["orders"]["O-1001"]["status"] == "cancelled"

        # A session that ends after calls changed the state (not read back yet) is rebuilt: the state
        # as last read, and the state-changing calls since replayed.
        rebuilt = InteractiveEnvironment(FLAKY_SAMPLE, counting, Gateway(RulesBackend(seed=0)), timeout_s=1.0)
        assert (await rebuilt.call(*CANCEL)).ok
        assert not (await rebuilt.call("spin", {"order_id": "O-1002"})).ok
        after = await rebuilt.call("get_order", {"order_id": "O-1001"})
        assert after.ok and json.loads(after.text)["status"] == "cancelled"
        again = await rebuilt.call(*CANCEL)  # the replayed cancellation counts: it is not pending now
        assert not again.ok and "only pending orders" in again.text
        assert (await rebuilt.reward(trajectory(FLAKY_SAMPLE, [], 0)))[0] == 1.0
        await rebuilt.close()
        assert len(counting.sessions) == 4 and counting.open == 0
        assert rebuilt.state == (await env.read_state())  # the same final state as the first instance

    sandboxed(scenario)


def test_state_changed_by_loading_the_code_is_read_back() -> None:
    """Code that changes STATE as it loads (it used to run before every call) is no call's change."""
    spec = ORDERS_SPEC.model_copy(update={"code": ORDERS_CODE + "\nSTATE.setdefault('audit', [])\n"})
    sample = ORDER_SAMPLE.model_copy(update={"reward_spec": spec.model_dump()})

    async def scenario(pool: SandboxPool) -> InteractiveEnvironment:
        env = InteractiveEnvironment(sample, pool, Gateway(RulesBackend(seed=0)))
        assert (await env.call("get_order", {"order_id": "O-1001"})).ok
        await env.close()
        return env

    env = sandboxed(scenario)
    assert env.state == {**ORDERS_STATE, "audit": []} and not env.calls[0].changed_state


def test_close_frees_the_pool_slot() -> None:
    """One slot: environments one after another each get it back; an idle instance holds none."""
    package = library_package()
    sample = sample_of(package)

    async def main() -> list[EnvSession]:
        async with SandboxPool(POOL.model_copy(update={"pool_size": 1})) as pool:
            counting = CountingPool(pool)
            idle = QaEnvironment(sample, package, counting)
            for _ in range(2):
                qa = QaEnvironment(sample, package, counting, {"get_city_temperature": WEATHER})
                assert (await qa.call("get_book_author", {"book_id": "B-7"})).ok
                assert (await qa.call("get_city_temperature", {"city": "Oslo"})).ok
                await qa.close()
                await qa.close()  # idempotent
                orders = orders_env(counting)
                assert (await orders.call(*CANCEL)).ok
                # Verification runs in the instance's own session: it needs no second slot.
                assert (await orders.reward(trajectory(ORDER_SAMPLE, [], 0)))[0] == 1.0
                await orders.close()
            await idle.close()
            assert counting.open == 0
            return counting.sessions

    assert len(asyncio.run(asyncio.wait_for(main(), 60))) == 4  # one per instance that called


def test_rules_user_simulator_reveals_requirements_then_stops() -> None:
    async def scenario(pool: SandboxPool) -> None:
        env = orders_env(pool)
        # The opening message stated the first requirement; the second comes next, once.
        reply = await env.user_turn("Sure. Why do you want to cancel it?")
        assert reply is not None and reply.casefold().endswith("the reason is: no longer needed.")
        confirm = await env.user_turn("Shall I go ahead and cancel order O-1001?")
        assert confirm == CONFIRMATION
        await env.call("cancel_order", {"order_id": "O-1001", "reason": "no longer needed"})
        assert await env.user_turn("Your order O-1001 has been cancelled.") is None
        assert env.signal == "stop" and env.user_replies == 2
        assert [m.role for m in env.dialogue] == [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        await env.close()

        transfer = orders_env(pool)
        assert await transfer.user_turn("I will transfer you to a human agent now.") is None
        assert transfer.signal == "transfer"

    sandboxed(scenario)


def _sim(dialogue: list[tuple[str, str]], **fields: Any) -> UserSimInput:
    fields.setdefault("turn", sum(1 for r, _ in dialogue if r == "user") - 1)
    return UserSimInput(
        instructions="Cancel order O-1001. The reason is: no longer needed.",
        dialogue=[DialogueMessage(role=r, content=c) for r, c in dialogue],  # type: ignore[arg-type]
        **fields,
    )


def test_rules_user_simulator_rules_in_order() -> None:
    rng = random.Random(0)
    opening = ("user", "Cancel order O-1001.")
    # Requirements from the instructions' sentences: the second is still to say.
    turn = user_turn(_sim([opening, ("assistant", "Which order?")]), rng)
    assert turn.signal == "continue" and turn.message.casefold().endswith("the reason is: no longer needed.")
    said = [opening, ("assistant", "Why?"), ("user", "The reason is: no longer needed.")]
    # Everything said, the agent asks for something the scenario does not have.
    assert user_turn(_sim([*said, ("assistant", "What is your phone number?")]), rng).signal == "out_of_scope"
    assert user_turn(_sim([*said, ("assistant", "What is your phone number?")]), rng).message == NO_INFO
    # The agent says nothing useful: one nudge, then the user stops.
    assert user_turn(_sim([*said, ("assistant", "Let me think.")]), rng).message == NUDGE
    nudged = [*said, ("assistant", "Let me think."), ("user", NUDGE), ("assistant", "Hmm.")]
    assert user_turn(_sim(nudged), rng).signal == "stop"
    # Done: by the agent's word once nothing is pending, or by the goal actions.
    assert user_turn(_sim([*said, ("assistant", "All done.")]), rng).message == THANKS
    goal = _sim(
        [opening, ("assistant", "OK.")], goal_actions=["cancel_order"], completed_actions=["cancel_order"]
    )
    assert user_turn(goal, rng).signal == "stop"
    # No goal actions named: some state change plus nothing pending stops too.
    assert (
        user_turn(_sim([*said, ("assistant", "OK.")], completed_actions=["cancel_order"]), rng).signal
        == "stop"
    )
    # Out of turns.
    assert user_turn(_sim([opening, ("assistant", "Why?")], max_turns=1, turn=1), rng).signal == "stop"


def _with_confirm_in_app(**spec_updates: Any) -> tuple[dict[str, Any], VerifiedSample]:
    """The order sample plus a user-only tool, ``confirm_in_app`` (dual control)."""
    confirm = _tool(
        "confirm_in_app", "The customer confirms in the app.", {"order_id": {"type": "string"}}, ["order_id"]
    )
    code = ORDERS_CODE + (
        "\n\ndef confirm_in_app(order_id):\n"
        "    STATE.setdefault('confirmed', []).append(order_id)\n"
        "    return {'confirmed': order_id}\n"
    )
    spec = ORDERS_SPEC.model_copy(update={"code": code, "user_tools": [confirm], **spec_updates})
    return confirm, ORDER_SAMPLE.model_copy(update={"reward_spec": spec.model_dump()})


def test_user_tool_calls_run_against_the_same_state() -> None:
    """Dual control: a user-only tool, called by the simulated user (a scripted user rule here)."""
    confirm, sample = _with_confirm_in_app()

    def scripted_user(inputs: BaseModel, rng: random.Random) -> BaseModel:
        assert isinstance(inputs, UserSimInput) and inputs.user_tools == [confirm]
        action = UserAction(name="confirm_in_app", arguments={"order_id": "O-1001"})
        return UserTurn(message="Confirmed in the app.", tool_calls=[action])

    async def scenario(pool: SandboxPool) -> None:
        gateway = Gateway(RulesBackend(rules={"user_simulator": scripted_user}))
        env = InteractiveEnvironment(sample, pool, gateway)
        assert not (await env.call("confirm_in_app", {"order_id": "O-1001"})).ok  # not the agent's tool
        assert await env.user_turn("Please confirm the cancellation in your app.") == "Confirmed in the app."
        await env.close()
        assert env.state["confirmed"] == ["O-1001"]  # read back on close
        assert [(c.name, c.actor, c.ok, c.changed_state) for c in env.calls] == [
            ("confirm_in_app", "user", True, True)
        ]
        assert env.completed_actions == []  # only the agent's state changes count for the user's goal

    sandboxed(scenario)


class RecordingUser:
    """A UserSimulator replaying fixed moves and keeping the contexts it was asked with."""

    kind = "scripted"

    def __init__(self, moves: list[ParsedUserTurn]) -> None:
        self.moves = list(moves)
        self.contexts: list[UserContext] = []

    async def reply(self, context: UserContext) -> ParsedUserTurn:
        self.contexts.append(context)
        return self.moves.pop(0)


def test_a_pluggable_user_runs_its_tools_even_on_the_stopping_turn() -> None:
    """Any UserSimulator plays the user: its calls run before its signal ends the dialogue."""
    _, sample = _with_confirm_in_app(max_user_turns=2)
    action = ToolCall(name="confirm_in_app", arguments={"order_id": "O-1001"})
    user = RecordingUser(
        [
            ParsedUserTurn(message="The reason is: no longer needed.", actions=[], signal="continue"),
            ParsedUserTurn(message="Confirmed, thanks.", actions=[action], signal="stop"),
        ]
    )

    async def scenario(pool: SandboxPool) -> None:
        env = environment_for(sample, pool, user=user)
        assert isinstance(env, InteractiveEnvironment) and env.user is user
        assert await env.user_turn("Why do you want to cancel it?") == "The reason is: no longer needed."
        assert await env.user_turn("Please confirm in your app.") is None
        assert env.signal == "stop" and (await env.read_state())["confirmed"] == ["O-1001"]
        await env.close()
        assert [(c.name, c.actor, c.ok) for c in env.calls] == [("confirm_in_app", "user", True)]
        # The second context saw the whole visible dialogue, the user's own first reply included.
        texts = [(t.role, t.text) for t in user.contexts[1].turns]
        assert texts == [
            ("user", "Hi! I want to cancel my order O-1001."),
            ("assistant", "Why do you want to cancel it?"),
            ("user", "The reason is: no longer needed."),
            ("assistant", "Please confirm in your app."),
        ]
        assert (user.contexts[1].turn, user.contexts[1].max_turns) == (1, 2)
        assert user.contexts[1].sim_input().dialogue == env.dialogue

        # Out of replies (max_user_turns): the user stops without being asked.
        chatty = RecordingUser(
            [ParsedUserTurn(message=f"more {i}", actions=[], signal="continue") for i in range(3)]
        )
        talk = InteractiveEnvironment(sample, pool, chatty)
        assert [await talk.user_turn("Go on?") for _ in range(3)] == ["more 0", "more 1", None]
        assert len(chatty.contexts) == 2 and talk.signal == "stop"

        with pytest.raises(ValueError, match="needs a user simulator"):
            environment_for(sample, pool)

    sandboxed(scenario)


ECHO_CODE = LIBRARY_CODE.replace(
    '{"error": "no such author"}', '{"error": "no record with author_id " + repr(author_id)}'
).replace('{"error": "no such book"}', '{"error": "no record with book_id " + repr(book_id)}')


def test_guessing_through_error_echoes_and_mixed_in_tools_earns_nothing() -> None:
    """Real sandboxed calls: a lookup that echoes the guessed argument in its error, and a mixed-in
    tool whose output holds the answers, solve nothing; the honest calls do."""
    package = library_package(code=ECHO_CODE)
    sample = sample_of(package)
    leak = WEATHER.model_copy(
        update={
            "tools": [_tool("city_facts", "Facts about a city.", {"city": {"type": "string"}}, ["city"])],
            "code": "def city_facts(city):\n    return {'author': 'AU-3', 'country': 'Portugal'}\n",
        }
    )
    Calls = list[tuple[str, dict[str, Any]]]

    async def scenario(pool: SandboxPool) -> list[float]:
        async def score(calls: Calls, extras: dict[str, EnvPackage]) -> float:
            env = QaEnvironment(sample, package, pool, extras=extras)
            try:
                results = []
                for name, args in calls:
                    obs = await env.call(name, args)
                    results.append(ToolResult(name=name, content=obs.text, ok=obs.ok))
                hand = trajectory(sample, [], len(calls)).model_copy(update={"tool_results": results})
                return (await env.reward(hand))[0]
            finally:
                await env.close()

        echo: Calls = [
            ("get_author_country", {"author_id": "Portugal"}),
            ("get_book_author", {"book_id": "AU-3"}),
        ]
        return [
            await score(REFERENCE_CALLS, {}),
            await score(echo, {}),
            await score(
                [("city_facts", {"city": "Oslo"}), ("city_facts", {"city": "Lima"})], {"city_facts": leak}
            ),
        ]

    honest, echo, mixed = sandboxed(scenario)
    assert honest == 1.0
    assert echo == 0.0 and mixed == 0.0

"""The openai backend through the gateway, against a real scripted OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from arena.llm.admission import LocalAdmission
from arena.llm.backends import BackendError
from arena.llm.backends.openai import OpenAIBackend
from arena.llm.core import CompletionRequest, InvalidOutput, Sampling, TransientError, decodable
from arena.llm.gateway import Gateway
from tests.fixtures import free_ports
from tests.fixtures.openai_server import (
    ASK,
    FailSpec,
    OpenAIServer,
    Question,
    Reply,
    ServerScript,
    start_openai_server,
)

pytestmark = pytest.mark.integration

API_KEY = "sk-test-0123456789-secret"


@pytest.fixture(scope="module")
def server() -> Iterator[OpenAIServer]:
    with start_openai_server() as running:
        yield running


def _gateway(
    server: OpenAIServer, concurrency: int = 8, timeout_s: float = 10.0, max_attempts: int = 3
) -> Gateway:
    backend = OpenAIBackend(
        server.base_url, "test-model", api_key=API_KEY, concurrency=concurrency, timeout_s=timeout_s
    )
    return Gateway(backend, max_attempts=max_attempts, backoff_s=0.05, max_backoff_s=0.2)


def test_transient_failures_are_retried_with_backoff(
    server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.configure(ServerScript(failures=[FailSpec(status=500), FailSpec(status=429, retry_after_s=0.3)]))

    async def run() -> float:
        gateway = _gateway(server)
        started = time.monotonic()
        answer = await gateway.call(ASK, Question(text="ok?"))
        elapsed = time.monotonic() - started
        assert answer.output == Reply(answer="ok", score=0.5) and not answer.cached
        usage = gateway.usage.roles[ASK.name]
        assert (usage.attempts, usage.retries, usage.transient_errors, usage.failures) == (3, 2, 2, 0)
        await gateway.aclose()
        return elapsed

    with caplog.at_level(logging.DEBUG):
        elapsed = asyncio.run(run())
    stats = server.stats()
    assert stats.statuses == [500, 429, 200]
    assert elapsed >= 0.3  # the 429's Retry-After was honoured
    assert API_KEY not in caplog.text  # retries are logged, the key never
    assert "HTTP 500" in caplog.text


def test_other_4xx_fail_at_once(server: OpenAIServer) -> None:
    server.configure(ServerScript(failures=[FailSpec(status=422)]))

    async def run() -> None:
        gateway = _gateway(server)
        with pytest.raises(BackendError, match="HTTP 422") as info:
            await gateway.call(ASK, Question(text="bad request?"))
        assert API_KEY not in str(info.value)
        assert gateway.usage.roles[ASK.name].failures == 1
        assert gateway.health.up  # a bad request is the request's fault, not the endpoint's
        await gateway.aclose()

    asyncio.run(run())
    assert server.stats().statuses == [422]


def _fast_probe(gateway: Gateway) -> Gateway:
    gateway.health.first_probe_s = gateway.health.max_probe_s = 0.1
    return gateway


def test_a_rejected_key_pauses_the_call_until_the_endpoint_serves(
    server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """HTTP 401 is the endpoint's refusal, not the record's fault: the call waits, it is not failed."""
    server.configure(ServerScript(failures=[FailSpec(status=401)], models_status=401))

    async def run() -> None:
        gateway = _fast_probe(_gateway(server))
        call = asyncio.create_task(gateway.call(ASK, Question(text="key?")))
        await asyncio.sleep(1.0)
        assert not call.done(), "a 401 must not fail the call"
        state = gateway.health.state
        assert state.state == "waiting" and state.rejected and state.status == 401
        assert "ARENA_LLM_API_KEY" in state.reason and API_KEY not in state.reason
        await server.aconfigure(ServerScript())  # the key is accepted again
        answer = await asyncio.wait_for(call, 10)
        assert answer.output.answer == "ok"
        usage = gateway.usage.roles[ASK.name]
        assert (usage.failures, usage.endpoint_waits) == (0, 1)  # it waited once, inside the call
        assert gateway.health.up and gateway.health.outages == 1
        await gateway.aclose()

    with caplog.at_level(logging.ERROR):
        asyncio.run(run())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "HTTP 401" in errors[0].getMessage()  # one clear error, not one per probe


def test_timeouts_that_outlast_the_retries_wait_for_the_endpoint(server: OpenAIServer) -> None:
    server.configure(ServerScript(latency_s=3.0))

    async def run() -> None:
        gateway = _fast_probe(_gateway(server, timeout_s=0.3, max_attempts=2))
        call = asyncio.create_task(gateway.call(ASK, Question(text="slow?")))
        for _ in range(50):
            await asyncio.sleep(0.1)
            if not gateway.health.up:
                break
        assert not gateway.health.up and "timed out after 0.3s" in gateway.health.state.reason
        assert gateway.usage.roles[ASK.name].transient_errors >= 2
        await server.aconfigure(ServerScript())  # the server is fast again
        answer = await asyncio.wait_for(call, 10)
        assert answer.output.answer == "ok"
        assert gateway.usage.roles[ASK.name].failures == 0
        await gateway.aclose()

    asyncio.run(run())


def test_a_request_that_fails_while_others_are_served_is_the_records_fault(server: OpenAIServer) -> None:
    """A poison request cannot stall a stage: after max_attempts rounds it ends as InvalidOutput."""
    server.configure(ServerScript(poison="poison"))

    async def run() -> None:
        gateway = _fast_probe(_gateway(server, max_attempts=2))

        async def others() -> None:
            for i in range(60):
                await gateway.call(ASK, Question(text=f"fine {i}"))
                await asyncio.sleep(0.05)

        background = asyncio.create_task(others())
        with pytest.raises(InvalidOutput) as info:
            await asyncio.wait_for(gateway.call(ASK, Question(text="poison")), 30)
        assert "while serving others" in info.value.errors[-1]
        await background
        await gateway.aclose()

    asyncio.run(run())


def test_the_same_500_after_every_recovery_is_the_requests_fault_not_an_outage(server: OpenAIServer) -> None:
    """Nothing else is served, the probe finds the endpoint up each time, and this request gets the
    same HTTP 500 each time: the call ends as InvalidOutput instead of pausing the stage forever."""
    server.configure(ServerScript(poison="poison"))

    async def run() -> None:
        gateway = _fast_probe(_gateway(server, max_attempts=2))
        with pytest.raises(InvalidOutput) as info:
            await asyncio.wait_for(gateway.call(ASK, Question(text="poison")), 30)
        assert (
            "answered its health probe 2 times, then failed this request the same way"
            in info.value.errors[-1]
        )
        assert "HTTP 500" in info.value.errors[-1]
        assert gateway.usage.roles[ASK.name].endpoint_waits == 2
        await gateway.aclose()

    asyncio.run(run())


def test_a_busy_server_is_waited_for_however_often_it_says_so(server: OpenAIServer) -> None:
    """503 (busy) repeats identically too, but waiting is what fixes it: never the record's fault."""
    server.configure(ServerScript(failures=[FailSpec(status=503)] * 10))

    async def run() -> None:
        gateway = _fast_probe(_gateway(server, max_attempts=2))
        answer = await asyncio.wait_for(gateway.call(ASK, Question(text="busy?")), 60)
        assert answer.output.answer == "ok"
        assert gateway.usage.roles[ASK.name].endpoint_waits >= 4
        await gateway.aclose()

    asyncio.run(run())


def test_probe_names_a_model_the_server_does_not_serve(server: OpenAIServer) -> None:
    server.configure(ServerScript(models=["other-model"]))

    async def run() -> None:
        backend = OpenAIBackend(server.base_url, "test-model", api_key=API_KEY, timeout_s=5)
        from arena.llm.core import EndpointRejected

        with pytest.raises(EndpointRejected, match=r"does not serve model 'test-model'.*other-model"):
            await backend.probe()
        await backend.aclose()

    asyncio.run(run())


def test_concurrency_never_exceeds_the_limit(server: OpenAIServer) -> None:
    server.configure(ServerScript(latency_s=0.25))

    async def run() -> None:
        gateway = _gateway(server, concurrency=4)
        answers = await asyncio.gather(*(gateway.call(ASK, Question(text=f"q{i}")) for i in range(20)))
        assert all(a.output.answer == "ok" for a in answers)
        await gateway.aclose()

    asyncio.run(run())
    stats = server.stats()
    assert stats.requests == 20
    assert stats.max_in_flight == 4  # the limit, reached and never exceeded


def test_request_carries_messages_sampling_and_json_schema(server: OpenAIServer) -> None:
    server.configure()
    inputs = Question(text="what is in the body?")
    sampling = Sampling(temperature=0.3, top_p=0.9, max_tokens=77, seed=11)

    async def run() -> None:
        gateway = _gateway(server)
        await gateway.call(ASK, inputs, sampling)
        await gateway.aclose()

    asyncio.run(run())
    stats = server.stats()
    (body,) = stats.bodies
    assert body["model"] == "test-model"
    assert body["messages"] == ASK.messages(inputs)
    assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.3, 0.9, 77, 11)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "test_ask", "schema": decodable(Reply.model_json_schema()), "strict": True},
    }
    assert stats.authorization == [f"Bearer {API_KEY}"]


def test_token_accounting_sums_server_usage(server: OpenAIServer) -> None:
    server.configure(
        ServerScript(
            replies=[
                '{"answer": "first", "score": 0.1}',
                'Sure. {"answer": "a longer second one", "score": 1}',
            ]
        )
    )

    async def run() -> tuple[int, int, list[int]]:
        gateway = _gateway(server)
        answers = [await gateway.call(ASK, Question(text=f"count {i} tokens")) for i in range(5)]
        total = gateway.usage.total
        await gateway.aclose()
        return total.prompt_tokens, total.completion_tokens, [a.usage.completion_tokens for a in answers]

    prompt, completion, per_answer = asyncio.run(run())
    stats = server.stats()
    assert (prompt, completion) == (stats.prompt_tokens, stats.completion_tokens)
    assert prompt > 0 and per_answer == [4, 8, 4, 8, 4]


def test_invalid_replies_end_as_invalid_output_with_raw_text(server: OpenAIServer) -> None:
    server.configure(ServerScript(replies=["I cannot answer that.", '{"answer": "x", "score": 7}']))

    async def run() -> None:
        gateway = _gateway(server, max_attempts=2)
        with pytest.raises(InvalidOutput) as info:
            await gateway.call(ASK, Question(text="bad?"))
        assert info.value.raw == '{"answer": "x", "score": 7}'
        assert "refused" in info.value.errors[0] and "score" in info.value.errors[1]
        bodies = server.stats().bodies
        assert [b["seed"] for b in bodies] == [0, 1]  # each attempt samples afresh
        await gateway.aclose()

    asyncio.run(run())


def test_server_rejecting_response_format_gets_unguided_requests(
    server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.configure(ServerScript(reject_response_format=True))

    async def run() -> None:
        gateway = _gateway(server)
        first = await gateway.call(ASK, Question(text="one"))
        second = await gateway.call(ASK, Question(text="two"))
        assert first.output.answer == second.output.answer == "ok"
        await gateway.aclose()

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    stats = server.stats()
    # json_schema refused, then json_object refused, then none: served, and kept for the role
    assert stats.statuses == [400, 400, 200, 200]
    assert [(b.get("response_format") or {}).get("type") for b in stats.bodies] == [
        "json_schema",
        "json_object",
        None,
        None,
    ]
    assert "sending no response_format (unguided) from now on" in caplog.text


def test_a_500_naming_the_response_format_is_a_shape_not_an_outage(
    server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """llama.cpp's server answers a json_schema response_format with HTTP 500 (its request model takes
    'text' or 'json_object'): the role switches to json_object with the schema, once, and nothing
    waits for the endpoint."""
    server.configure(ServerScript(response_format_types=["text", "json_object"], reject_status=500))

    async def run() -> None:
        gateway = _gateway(server)
        answers = [await gateway.call(ASK, Question(text=f"q{i}")) for i in range(3)]
        assert all(a.output.answer == "ok" for a in answers)
        assert gateway.health.state.state == "up"
        usage = gateway.usage.roles[ASK.name]
        assert (usage.transient_errors, usage.endpoint_waits, usage.failures) == (0, 0, 0)
        await gateway.aclose()

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    stats = server.stats()
    assert stats.statuses == [500, 200, 200, 200]
    formats = [b["response_format"] for b in stats.bodies]
    assert [f["type"] for f in formats] == ["json_schema", "json_object", "json_object", "json_object"]
    assert formats[1]["schema"] == decodable(ASK.output_schema())  # the schema still constrains decoding
    assert caplog.text.count("refused response_format json_schema") == 1
    assert "HTTP 500" in caplog.text and "'text' or 'json_object'" in caplog.text


def test_a_refused_json_schema_envelope_is_learned_once_for_every_role(
    server: OpenAIServer, caplog: pytest.LogCaptureFixture
) -> None:
    """json_object took the very schema json_schema carried: the server refuses the envelope, not
    a schema, so a role that never asked before starts at json_object (one 500 per process, not per
    role)."""
    server.configure(ServerScript(response_format_types=["text", "json_object"], reject_status=500))
    again = dataclasses.replace(ASK, name="test_ask_again")

    async def run() -> None:
        gateway = _gateway(server)
        await gateway.call(ASK, Question(text="first role"))
        await gateway.call(again, Question(text="second role"))
        assert isinstance(gateway.backend, OpenAIBackend)
        assert gateway.backend.response_format(again.name) == "json_object"
        await gateway.aclose()

    with caplog.at_level(logging.WARNING):
        asyncio.run(run())
    stats = server.stats()
    assert stats.statuses == [500, 200, 200]
    assert [b["response_format"]["type"] for b in stats.bodies] == [
        "json_schema",
        "json_object",
        "json_object",
    ]
    assert caplog.text.count("refused response_format json_schema") == 1
    assert "for every role" in caplog.text


def test_a_schema_refused_in_both_envelopes_stays_the_roles_own(server: OpenAIServer) -> None:
    """Refused as json_schema and as json_object, served unguided: that may be the schema's fault,
    so another role still starts with json_schema."""
    server.configure(ServerScript(reject_response_format=True))
    again = dataclasses.replace(ASK, name="test_ask_again")

    async def run() -> None:
        gateway = _gateway(server)
        await gateway.call(ASK, Question(text="first role"))
        await gateway.call(again, Question(text="second role"))
        await gateway.aclose()

    asyncio.run(run())
    types = [(b.get("response_format") or {}).get("type") for b in server.stats().bodies]
    assert types == ["json_schema", "json_object", None, "json_schema", "json_object", None]


def test_a_json_schema_refusal_after_one_was_served_stays_the_roles_own(server: OpenAIServer) -> None:
    """The server took one role's json_schema: another role's refused json_schema is that schema's
    fault, so the first role keeps json_schema."""
    server.configure(ServerScript())
    again = dataclasses.replace(ASK, name="test_ask_again")

    async def run() -> None:
        gateway = _gateway(server)
        await gateway.call(ASK, Question(text="served as json_schema"))
        await server.aconfigure(
            ServerScript(response_format_types=["text", "json_object"], reject_status=500)
        )
        await gateway.call(again, Question(text="refused as json_schema"))
        assert isinstance(gateway.backend, OpenAIBackend)
        assert gateway.backend.response_format(again.name) == "json_object"
        assert gateway.backend.response_format(ASK.name) == "json_schema"
        await gateway.aclose()

    asyncio.run(run())


def test_a_bare_500_is_retried_in_the_same_shape(server: OpenAIServer) -> None:
    """A 500 that names nothing of the request is a transient failure: the same request again."""
    server.configure(ServerScript(failures=[FailSpec(status=500)], response_format_types=["json_schema"]))

    async def run() -> None:
        gateway = _gateway(server)
        await gateway.call(ASK, Question(text="ok?"))
        assert gateway.usage.roles[ASK.name].transient_errors == 1
        await gateway.aclose()

    asyncio.run(run())
    stats = server.stats()
    assert stats.statuses == [500, 200]
    assert [b["response_format"]["type"] for b in stats.bodies] == ["json_schema", "json_schema"]


def test_once_served_a_shape_is_not_dropped_for_a_later_refusal(server: OpenAIServer) -> None:
    """After the server took a role's json_schema, a 400 naming it later is that request's failure."""
    server.configure(ServerScript())

    async def run() -> None:
        gateway = _gateway(server, max_attempts=1)
        await gateway.call(ASK, Question(text="first"))
        await server.aconfigure(ServerScript(reject_response_format=True))
        with pytest.raises(BackendError, match="HTTP 400"):
            await gateway.call(ASK, Question(text="second"))
        await gateway.aclose()

    asyncio.run(run())
    stats = server.stats()
    assert stats.statuses == [400]
    assert stats.bodies[0]["response_format"]["type"] == "json_schema"


def test_connection_refused_waits_for_the_endpoint() -> None:
    """Nobody listening is an outage: the call retries, then waits; it is never failed for it."""
    (port,) = free_ports(1)  # nothing listens there

    async def run() -> None:
        backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", "m", timeout_s=2)
        gateway = _fast_probe(Gateway(backend, max_attempts=2, backoff_s=0.01))
        call = asyncio.create_task(gateway.call(ASK, Question(text="anyone?")))
        await asyncio.sleep(1.0)
        assert not call.done()
        state = gateway.health.state
        assert state.state == "waiting" and not state.rejected and "ConnectError" in state.reason
        assert gateway.usage.roles[ASK.name].transient_errors == 2
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await gateway.aclose()

    asyncio.run(run())


def _burst(
    server: OpenAIServer, admission: LocalAdmission, count: int, timeout_s: float = 1.5
) -> list[object]:
    """``count`` requests sent at once through a backend with ``admission``; answers or errors."""

    async def run() -> list[object]:
        backend = OpenAIBackend(
            server.base_url,
            "test-model",
            api_key=API_KEY,
            concurrency=32,
            timeout_s=timeout_s,
            admission=admission,
        )
        requests = [
            CompletionRequest(
                role=ASK,
                inputs=Question(text=f"q{i}"),
                messages=[{"role": "user", "content": f"question {i}"}],
                json_schema=Reply.model_json_schema(),
                sampling=Sampling(),
            )
            for i in range(count)
        ]
        try:
            return await asyncio.gather(*(backend.complete(r) for r in requests), return_exceptions=True)
        finally:
            await backend.aclose()

    return asyncio.run(run())


def test_a_one_slot_server_is_learned_and_never_queued_into_timeouts(server: OpenAIServer) -> None:
    # A llama.cpp-like server: one request at a time, 0.2 s each, the rest queued inside it.
    # 24 requests under a ceiling of 32 and a 1.5 s timeout: sent at once, the tail would wait
    # 4.8 s there and time out through no fault of its own (shown first, without learning).
    server.configure(ServerScript(latency_s=0.2, slots=1))
    fixed = _burst(server, LocalAdmission(32), 24)
    assert any(isinstance(r, TransientError) and "timed out" in str(r) for r in fixed)
    assert server.stats().max_in_flight == 24

    server.configure(ServerScript(latency_s=0.2, slots=1))
    learning = LocalAdmission(32, learn_slow_s=0.15)
    answers = _burst(server, learning, 24)
    assert [type(a).__name__ for a in answers] == ["Completion"] * 24  # no request's fault
    stats = server.stats()
    assert stats.requests == 24 and stats.max_in_flight <= 6
    endpoint = next(iter(learning.stats().endpoints.values()))
    # Learned: one slot plus a short queue (3 on a quiet machine; a loaded one reads replies as
    # slower and keeps a little more queued), far under the ceiling of 32.
    assert endpoint.learning and 1 <= endpoint.limit <= 6, endpoint


def test_a_wide_server_is_learned_up_to_the_ceiling(server: OpenAIServer) -> None:
    # Replies of 1 s: a loaded machine's delays (a fraction of that) keep each reply's pace within
    # the tolerance of the fastest, so the limit grows as it would on a quiet one.
    server.configure(ServerScript(latency_s=1.0))
    learning = LocalAdmission(16, learn_slow_s=2.0)
    answers = _burst(server, learning, 64, timeout_s=30.0)  # about learning, not timeouts
    assert all(type(a).__name__ == "Completion" for a in answers), [
        a for a in answers if type(a).__name__ != "Completion"
    ][:3]
    assert server.stats().max_in_flight == 16  # slow start reached the ceiling
    assert next(iter(learning.stats().endpoints.values())).limit == 16


def test_a_reply_budget_over_the_servers_window_is_shrunk_to_fit(server: OpenAIServer) -> None:
    # The server's tokenizer counts more than Arena's estimate; vLLM answers 400 with its counts.
    server.configure(ServerScript(context_window=300))

    async def run() -> None:
        gateway = _gateway(server)
        answer = await gateway.call(ASK, Question(text="fits?"))
        assert answer.output.answer == "ok"
        await gateway.aclose()

    asyncio.run(run())
    stats = server.stats()
    budgets = [body["max_tokens"] for body in stats.bodies]
    prompt = stats.prompt_tokens  # what the server counted for the one prompt it served
    assert budgets == [1024, 300 - prompt - 16] and stats.statuses == [400, 200]


def test_a_window_refusal_is_not_taken_for_the_shape(server: OpenAIServer) -> None:
    # json_schema refused with a 500 (llama.cpp), then json_object over the window with a 400.
    server.configure(
        ServerScript(response_format_types=["json_object"], reject_status=500, context_window=300)
    )

    async def run() -> OpenAIBackend:
        backend = OpenAIBackend(server.base_url, "test-model", timeout_s=10)
        gateway = Gateway(backend, max_attempts=2, backoff_s=0.01)
        answer = await gateway.call(ASK, Question(text="fits?"))
        assert answer.output.answer == "ok"
        await gateway.aclose()
        return backend

    backend = asyncio.run(run())
    stats = server.stats()
    shapes = [(b.get("response_format") or {}).get("type") for b in stats.bodies]
    assert shapes == ["json_schema", "json_object", "json_object"] and stats.statuses == [500, 400, 200]
    assert backend.response_format(ASK.name) == "json_object"


def test_a_server_that_counts_more_teaches_the_budget(server: OpenAIServer) -> None:
    """llama-cpp-python refuses a prompt longer than its window by its own count (SmolLM2's tokenizer
    counts JSON-heavy prompts well over Arena's estimate). The refusal's count teaches the endpoint's
    scale, and the call fits its input again at that scale and is served."""
    from arena.config import ArenaSettings
    from arena.llm.routing import route_of

    server.configure(ServerScript(context_window=1200, window_policy="llama.cpp", tokens_per_word=6.0))
    settings = ArenaSettings(llm="rules", llm_context_tokens=1200)

    async def run() -> tuple[Any, float]:
        backend = OpenAIBackend(server.base_url, "test-model", timeout_s=10)
        gateway = Gateway(
            backend, max_attempts=2, backoff_s=0.01, routes=lambda role: route_of(settings, role)
        )
        try:
            answer = await gateway.call(ASK, Question(text="word " * 250))  # the server counts ~1600
            return answer, gateway._default.prompt_scale
        finally:
            await gateway.aclose()

    answer, scale = asyncio.run(run())
    assert answer.output.answer == "ok" and answer.cut  # served, with its input fitted again
    assert scale == 3.0  # learned from the refusal's count (at most 3)
    stats = server.stats()
    assert stats.statuses == [400, 200]
    assert stats.prompt_tokens + stats.bodies[1]["max_tokens"] <= 1200  # the refit fits by its count


def test_a_prompt_that_leaves_no_room_fails_with_the_servers_reason(server: OpenAIServer) -> None:
    server.configure(ServerScript(context_window=40))

    async def run() -> str:
        gateway = _gateway(server, max_attempts=1)
        try:
            await gateway.call(ASK, Question(text="a long question " * 20))
        except (BackendError, InvalidOutput) as exc:
            return str(exc)
        finally:
            await gateway.aclose()
        return "answered"

    assert "maximum context length is 40 tokens" in asyncio.run(run())
    assert [b["max_tokens"] for b in server.stats().bodies] == [1024]  # no room to shrink into


def test_a_prompt_too_long_in_the_shape_the_server_takes_is_reported_as_too_long(
    server: OpenAIServer,
) -> None:
    # llama.cpp: json_schema refused (500), json_object taken but the prompt alone is over the window.
    server.configure(
        ServerScript(
            response_format_types=["json_object"],
            reject_status=500,
            context_window=20,
            window_policy="llama.cpp",
        )
    )

    async def run() -> tuple[Any, OpenAIBackend]:
        backend = OpenAIBackend(server.base_url, "test-model", timeout_s=10)
        gateway = Gateway(backend, max_attempts=2, backoff_s=0.01)
        try:
            await gateway.call(ASK, Question(text="a question far longer than twenty words " * 5))
        except InvalidOutput as exc:
            return exc, backend
        finally:
            await gateway.aclose()
        return "answered", backend

    failed, backend = asyncio.run(run())
    assert isinstance(failed, InvalidOutput) and "20-token window" in " ".join(failed.errors), failed
    assert backend.response_format(ASK.name) == "json_object"  # the shape it takes, kept
    assert server.stats().statuses == [500, 400]  # not retried as if the server were failing

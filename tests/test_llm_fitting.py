"""Fitting role inputs into a context budget (``arena.llm.fitting``), on the sample tool docs."""

from __future__ import annotations

import asyncio

import pytest

from app.demo import sample_tools_dir
from arena.config import ArenaSettings
from arena.llm.budget import ContextBudget, prompt_tokens
from arena.llm.fitting import fit_inputs
from arena.llm.gateway import Gateway
from arena.llm.routing import route_of
from arena.records.sft import ServerRef
from producers.tool_docs import load_tool_docs
from simulator.backend import RulesBackend
from synthesis.sft.roles.chains import CHAIN_COHERENCE, CHAIN_SYNTHESIS, ChainSynthesisInput, CoherenceInput
from synthesis.tools.normalize import normalize_server
from tests.fixtures.openai_server import ASK, Question


def _servers() -> list[ServerRef]:
    raws = load_tool_docs([sample_tools_dir() / "good"]).servers
    servers = []
    for raw in raws:
        outcome = normalize_server(raw)
        if outcome.tools:
            servers.append(
                ServerRef(
                    server_id=outcome.server, name=outcome.server, domain="general", tools=outcome.tools
                )
            )
    return servers


def _size(role, inputs) -> int:  # type: ignore[no-untyped-def]
    return prompt_tokens(role.messages(inputs), role.tools(inputs))


@pytest.mark.parametrize("context", [4096, 8192])
def test_every_sample_server_fits_chain_synthesis(context: int) -> None:
    budget = route_of(ArenaSettings(llm_context_tokens=context), CHAIN_SYNTHESIS.name).budget
    for server in _servers():
        inputs = ChainSynthesisInput(server=server, max_length=4, variant=0)
        fit = fit_inputs(CHAIN_SYNTHESIS, inputs, budget)
        assert _size(CHAIN_SYNTHESIS, fit.inputs) <= budget.prompt_tokens, server.name
        if _size(CHAIN_SYNTHESIS, inputs) > budget.prompt_tokens:
            assert fit.cut and "estimated" in fit.cut[-1]
        else:
            assert fit.inputs == inputs and fit.cut == []


def test_a_chain_keeps_its_tools_and_their_response_fields() -> None:
    server = max(
        _servers(),
        key=lambda s: _size(CHAIN_SYNTHESIS, ChainSynthesisInput(server=s, max_length=4, variant=0)),
    )
    chain = server.tools[:3]
    inputs = CoherenceInput(task="Do the thing.", chain=[*chain, *chain])
    budget = ContextBudget(context_tokens=1800, reply_tokens=512)
    fit = fit_inputs(CHAIN_COHERENCE, inputs, budget)
    assert isinstance(fit.inputs, CoherenceInput)
    assert [t.function.name for t in fit.inputs.chain] == [t.function.name for t in inputs.chain]
    for before, after in zip(inputs.chain, fit.inputs.chain, strict=True):
        if before.response_schema:
            assert set(after.response_schema.get("properties", {})) == set(
                before.response_schema.get("properties", {})
            )


def test_nothing_changes_when_the_input_fits() -> None:
    server = _servers()[0]
    inputs = ChainSynthesisInput(server=server, max_length=4, variant=0)
    fit = fit_inputs(CHAIN_SYNTHESIS, inputs, ContextBudget(context_tokens=32768, reply_tokens=2048))
    assert fit.inputs is inputs and fit.cut == []


def test_long_texts_are_shortened_as_the_last_resort() -> None:
    inputs = Question(text="word " * 3000)
    budget = ContextBudget(context_tokens=2048, reply_tokens=512)
    fit = fit_inputs(ASK, inputs, budget)
    assert _size(ASK, fit.inputs) <= budget.prompt_tokens
    assert isinstance(fit.inputs, Question) and "characters cut]" in fit.inputs.text
    assert fit.inputs.text.startswith("word word") and "text" in fit.cut[0]


def test_the_gateway_fits_before_it_asks_and_says_so() -> None:
    settings = ArenaSettings(llm="rules", llm_context_tokens=4096)
    server = max(_servers(), key=lambda s: len(s.tools))

    async def run() -> None:
        gateway = Gateway(RulesBackend(), routes=lambda role: route_of(settings, role))
        try:
            answer = await gateway.call(
                CHAIN_SYNTHESIS, ChainSynthesisInput(server=server, max_length=4, variant=0)
            )
        finally:
            await gateway.aclose()
        assert answer.cut and gateway.usage.roles[CHAIN_SYNTHESIS.name].inputs_fitted == 1
        assert set(answer.output.chain) <= {t.function.name for t in server.tools}

    asyncio.run(run())


def test_long_lists_are_thinned_keeping_their_variety() -> None:
    from pydantic import BaseModel

    from arena.llm.core import Role

    class Rows(BaseModel):
        rows: list[dict[str, str]]

    role = Role(name="test_rows", input=Rows, output=Question, system="Read.", template="{input}")
    inputs = Rows(rows=[{"id": f"r{i}", "kind": "ab"[i % 2]} for i in range(400)])
    budget = ContextBudget(context_tokens=1024, reply_tokens=256)
    fit = fit_inputs(role, inputs, budget)
    assert isinstance(fit.inputs, Rows) and _size(role, fit.inputs) <= budget.prompt_tokens
    kept = fit.inputs.rows
    assert len(kept) < 400 and {r["kind"] for r in kept} == {"a", "b"}
    ids = [int(r["id"][1:]) for r in kept]
    assert ids == sorted(ids)  # the order stays
    assert any("of 400 items kept" in note for note in fit.cut)


def test_database_entities_are_retrieved_in_coherent_neighbourhoods() -> None:
    from synthesis.eigen.agents import entities_within, neighbourhoods
    from synthesis.eigen.roles.tasks import EntityRef

    users = [EntityRef(kind="users", id=f"U-{u}", attributes={"user_id": f"U-{u}"}) for u in range(6)]
    products = [EntityRef(kind="products", id=f"P-{p}", attributes={}) for p in range(4)]
    orders = [
        EntityRef(
            kind="orders",
            id=f"O-{o}",
            attributes={"user_id": f"U-{o % 6}", "product_ids": f"P-{o % 4},P-{(o + 1) % 4}"},
        )
        for o in range(12)
    ]
    refs = [*users, *products, *orders]
    hoods = neighbourhoods(refs)
    user_hood = next(h for h in hoods if "U-0" in h)
    assert user_hood == {"U-0", "O-0", "O-6", "P-0", "P-1", "P-2", "P-3"}
    kept, cut = entities_within(refs, lambda chosen: len(chosen) <= 12, seed=3)
    assert 0 < len(kept) <= 12 and cut == len(refs) - len(kept)
    kept_ids = {r.id for r in kept}
    for order in (r for r in kept if r.kind == "orders"):  # an order comes with its customer and products
        assert order.attributes["user_id"] in kept_ids
        assert set(str(order.attributes["product_ids"]).split(",")) <= kept_ids
    assert entities_within(refs, lambda chosen: True, seed=3) == (refs, 0)
    assert entities_within(refs, lambda chosen: len(chosen) <= 12, seed=3) == (kept, cut)  # seeded

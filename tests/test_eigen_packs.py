"""Pack-driven EigenData synthesis (issue 17 item 1): every shipped pack, through every stage.

Real sandbox, real gateway on the rules backend. Each bundled pack (a retail order desk, a
dual-control phone desk, a bank desk full of refusals) declares its entities, lookups, user
actions and task templates in domain.yaml; the generic workers and the rules agent synthesise
dialogues from those declarations alone, and the verification function generated from each
dialogue accepts the dialogue's own outcome and rejects a do-nothing agent. Declarations that do
not fit the pack fail to load with the file, the field and the fix.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from arena.llm.core import InvalidOutput
from arena.llm.gateway import Gateway
from arena.records.eigen import Dialog
from environments.environment import verify_program
from sandbox import SandboxPool
from synthesis.eigen.agents import random_pool, user_intent, user_intent_input, validate_with_repair
from synthesis.eigen.dialog_loop import synthesize_dialog
from synthesis.eigen.dialog_synthesis import validate_dialog
from synthesis.eigen.packs import DomainPack, DomainPackError, builtin_pack_path, builtin_packs, load_pack
from synthesis.eigen.roles.tasks import PoolParams
from synthesis.eigen.verification import verification_source
from tests.fixtures.domain import sandboxed_with_gateway

pytestmark = pytest.mark.timeout(120)

SHIPPED = ("bank_desk", "customer_service", "phone_support")
WANTED = 3
MAX_SEEDS = 8


def test_every_shipped_pack_declares_its_synthesis() -> None:
    assert set(SHIPPED) <= set(builtin_packs())
    for name in SHIPPED:
        pack = load_pack(builtin_pack_path(name))
        spec = pack.declarations()
        assert spec.templates and spec.customer.lookup_tool in pack.agent_tool_names
        for template in spec.templates:
            for call in template.calls:
                side = pack.agent_tool_names if call.actor == "agent" else pack.user_tool_names
                assert call.name in side


@pytest.mark.parametrize("name", SHIPPED)
def test_generators_are_seeded_for_every_size(name: str) -> None:
    pack = load_pack(builtin_pack_path(name))
    spec = pack.declarations()
    for size in ("small", "medium", "large"):
        for seed in range(12):
            state = pack.generate(seed, size)
            assert state == pack.generate(seed, size)
            assert state[spec.customer.collection]
            assert all(state[e.collection] for e in spec.entities)


def test_goal_options_are_judged_by_the_policy() -> None:
    """The bank's templates filled on a customer's records: some allowed, some refused by a named rule."""
    pack = load_pack(builtin_pack_path("bank_desk"))
    state = pack.generate(3)
    statuses: dict[str, set[str]] = {}

    async def scenario(pool: SandboxPool, gateway: Gateway) -> None:
        for seed in range(6):
            draw = await random_pool(gateway, pack, state, seed)
            for option in user_intent_input(pack, state, draw).options:
                statuses.setdefault(option.status, set()).add(option.violation.split(":")[0])

    sandboxed_with_gateway(scenario)
    assert "allowed" in statuses and "forbidden" in statuses
    assert statuses["forbidden"] & {"fee_waiver_amount", "one_waiver_per_year", "close_only_empty_accounts"}


async def _verified(
    pack: DomainPack,
    state: dict[str, Any],
    pool: SandboxPool,
    gateway: Gateway,
    params: PoolParams | None = None,
) -> list[tuple[Dialog, dict[str, Any], dict[str, Any], list[str]]]:
    """Dialogues that pass validation, with the verifier's verdict on them and on a do-nothing agent."""
    out = []
    for seed in range(MAX_SEEDS):
        draw = await random_pool(gateway, pack, state, seed, params)
        try:
            intent = await user_intent(gateway, pack, state, draw)
        except InvalidOutput:  # no template applies to the drawn customer: the stage drops such seeds
            continue
        outcome = await validate_with_repair(intent, gateway=gateway, runner=pool, pack=pack, state=state)
        if not outcome.accepted:
            continue
        intent = outcome.final_intent
        dialog = await synthesize_dialog(pack, intent, state, gateway, pool)
        verdict = validate_dialog(pack, intent, dialog)
        if not verdict.passed:
            continue
        source = verification_source(pack, dialog.initial_state, dialog.records(), dialog.final_state)
        perfect = await pool.run(
            verify_program(source, dialog.initial_state, dialog.final_state, dialog.records())
        )
        idle = await pool.run(verify_program(source, dialog.initial_state, dialog.initial_state, []))
        assert perfect.ok and idle.ok, (perfect.error, idle.error)
        out.append((dialog, perfect.return_value, idle.return_value, [g.kind for g in intent.refused]))
        if len(out) >= WANTED:
            break
    return out


@pytest.mark.parametrize("name", SHIPPED)
def test_each_shipped_pack_yields_verified_dialogues(name: str) -> None:
    pack = load_pack(builtin_pack_path(name))
    state = pack.generate(3)

    async def scenario(
        pool: SandboxPool, gateway: Gateway
    ) -> list[tuple[Dialog, dict[str, Any], dict[str, Any], list[str]]]:
        return await _verified(pack, state, pool, gateway)

    found = sandboxed_with_gateway(scenario)
    assert len(found) >= WANTED, f"{name}: only {len(found)} verified dialogues in {MAX_SEEDS} seeds"
    spec = pack.declarations()
    for dialog, perfect, idle, _refused in found:
        assert perfect["pass"] is True and perfect["reward"] == 1.0, perfect
        assert idle["pass"] is False and idle["reward"] == 0.0, idle
        assert dialog.end_signal == "stop"
        first = next(c for c in dialog.calls if c.actor == "agent")
        assert first.name == spec.customer.lookup_tool  # identify first
    if name == "phone_support":  # dual control: the customer acted on their own phone
        user_calls = [c for d, *_ in found for c in d.calls if c.actor == "user" and c.ok]
        assert user_calls and {c.name for c in user_calls} <= set(pack.user_tool_names)
    if name == "bank_desk":  # refusals: a request the policy forbids was declined, not carried out
        assert any(refused for *_, refused in found)


def test_a_phone_fix_is_the_customers_own_action() -> None:
    """Tasks whose fix only the customer can make: the agent diagnoses and instructs, the customer
    reads their phone and changes its settings, and the verifier checks the phone's new state."""
    pack = load_pack(builtin_pack_path("phone_support"))
    state = pack.generate(3)
    params = PoolParams(task_kinds=["airplane_mode_fix", "mobile_data_fix"])

    async def scenario(
        pool: SandboxPool, gateway: Gateway
    ) -> list[tuple[Dialog, dict[str, Any], dict[str, Any], list[str]]]:
        return await _verified(pack, state, pool, gateway, params)

    found = sandboxed_with_gateway(scenario)
    assert found
    for dialog, perfect, idle, _refused in found:
        assert perfect["pass"] is True and idle["pass"] is False
        assert not any(c.actor == "agent" and c.changed_state for c in dialog.calls)
        names = [c.name for c in dialog.calls if c.actor == "user" and c.ok]
        assert names[0] == "check_phone_status" and names[-1] in (
            "toggle_airplane_mode",
            "toggle_mobile_data",
        )
        assert dialog.final_state["devices"] != state["devices"]


def _broken_copy(tmp_path: Path, edit: Any) -> Path:
    folder = tmp_path / "pack"
    shutil.copytree(builtin_pack_path("phone_support"), folder)
    data = yaml.safe_load((folder / "domain.yaml").read_text())
    edit(data["synthesis"])
    (folder / "domain.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return folder


@pytest.mark.parametrize(
    ("edit", "field", "words"),
    [
        (
            lambda s: s["customer"].update(lookup_tool="find_by_phone"),
            "synthesis.customer.lookup_tool",
            "find_by_phone",
        ),
        (
            lambda s: s["entities"][0].update(collection="phones"),
            "synthesis.entities[0].collection",
            "phones",
        ),
        (
            lambda s: s["user_actions"].pop("toggle_mobile_data"),
            "synthesis.user_actions",
            "toggle_mobile_data",
        ),
        (
            lambda s: s["templates"][0].update(requirement="My phone {phone_number}"),
            "synthesis.templates[0].requirement",
            "placeholder",
        ),
        (
            lambda s: s["templates"][1].update(requirement="My {colour} phone {phone_number} is broken."),
            "synthesis.templates[1]",
            "applies to no entity",
        ),
        (lambda s: s["customer"].update(colour="red"), "synthesis.customer.colour", "Extra inputs"),
    ],
)
def test_bad_declarations_name_file_field_and_fix(tmp_path: Path, edit: Any, field: str, words: str) -> None:
    with pytest.raises(DomainPackError) as caught:
        load_pack(_broken_copy(tmp_path, edit))
    error = caught.value
    assert error.file == "domain.yaml" and error.field == field and error.fix
    assert words in str(error)

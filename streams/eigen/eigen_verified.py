"""Stage ``eigen.dialogs.validated -> eigen.verified``: the VerificationFunction (EigenData §4.2, §5).

From an accepted dialogue: the reference calls (every agent and user call that ran, replayed from
the seeded database with the pack's tools) and the reference final state give the generated
``verify(initial_state, final_state, calls)`` (``synthesis.eigen.verification``). It is run in the
sandbox on the dialogue's own final state and call log, which it must pass, then through the
mutation gate (``synthesis.eigen.mutation``: correct variants pass, every perturbation of the reference
fails, the pack's policy embedded unchanged), which rejects a weakened verifier; the instance is then
catalogued with its split (content hash mod ``envs.heldout_k``, bucket 0 held out for
``arena eval``). Training-split instances go out as

- ``samples.verified`` (``kind = interactive``): initial state, tools code, verifier, user
  instructions, requirements and user tools, for GRPO with the user simulator in the loop;
- ``samples.sft``: the dialogue for the agent (``role_target = agent``) and its user-view for the
  user simulator (``role_target = user``, ``trainer.user_sim.user_view_messages``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from arena.hashing import content_hash
from arena.records.eigen import Dialog, EigenValidated, EigenVerified, ValidatedPayload, VerifiedPayload
from arena.records.envs import VerifiedSample
from arena.records.sft import SftSample, Side, dialogue_samples
from environments.environment import read_verdict, verify_program
from environments.render import ToolCall
from environments.user_view import MARKERS, Signal, ViewTurn, user_view_messages
from lake.env_packages import split_of
from sandbox.env_runtime import Runner, run_settled
from streams.resources import eigen_store_for, sandbox_pool_for
from streams.runtime import Context, Emit, StageDef
from synthesis.eigen.dialog_loop import user_instructions
from synthesis.eigen.items import load_pack, make_item
from synthesis.eigen.mutation import GateReport, gate_cases, gate_program, judge, policy_integrity
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.verification import build_instance, interactive_sample, replay_reference

STAGE_VERSION = "2"
GATE = "verification"
GATE_CHUNK = 8
"""Mutation-gate cases per sandbox run (each run gets the sandbox's usual timeout)."""
SOURCE = "eigen"


def user_view(body: ValidatedPayload, pack: DomainPack) -> list[dict[str, Any]]:
    """The dialogue as the simulated user saw it (its texts, its app actions, its end signal)."""
    dialog = body.dialog
    turns: list[ViewTurn] = []
    for n, message in enumerate(dialog.messages[1:], start=1):
        text = message.get("content") or ""
        if message["role"] == "user":
            actions = [
                ToolCall(name=c.name, arguments=c.arguments)
                for c in dialog.calls
                if c.actor == "user" and c.message_index == n
            ]
            turns.append(ViewTurn(role="user", text=text, actions=actions))
        elif message["role"] == "assistant" and text.strip():
            turns.append(ViewTurn(role="assistant", text=text))
    signal: Signal = dialog.end_signal if dialog.end_signal in MARKERS else "continue"  # type: ignore[assignment]
    if signal != "continue" and turns and turns[-1].role == "assistant":
        turns.append(ViewTurn(role="user", text=""))  # the user ended with the marker alone
    return user_view_messages(
        user_instructions(body.intent), body.intent.requirements, pack.user_tools, turns, signal
    )


def sft_samples(body: ValidatedPayload, pack: DomainPack, origin: str) -> list[SftSample]:
    """The agent-side and the user-side training conversations of an accepted dialogue."""
    sides: list[Side] = [
        ("agent", body.dialog.messages, pack.agent_tools),
        ("user", user_view(body, pack), pack.user_tools),
    ]
    return dialogue_samples(sides, source=SOURCE, origin=origin)


async def handle(record: EigenValidated, ctx: Context) -> Sequence[Emit]:
    body = record.payload
    pack = await load_pack(ctx.settings, body.scenario.pack_id)
    dialog = body.dialog
    task = {
        # Only calls that ran are the reference: a call the tools refused changed nothing, and
        # replaying it would fail again (the verifier still sees every attempt of a rollout).
        "calls": [c for c in dialog.records() if c["ok"]],
        "user_instructions": user_instructions(body.intent),
        "requirements": body.intent.requirements,
    }
    try:
        instance = await asyncio.to_thread(
            build_instance,
            pack,
            body.scenario.state_seed,
            size=body.scenario.size,
            task=task,
            must_have=body.intent.must_have_functions,
            max_user_turns=ctx.settings.eigen.max_turns,
        )
    except ValueError as exc:  # a reference call failed on replay, or the verifier rejects its reference
        return [ctx.reject(GATE, record.item_id, str(exc), record=record.model_dump(mode="json"))]
    if instance["initial_state"] != dialog.initial_state:
        reason = "the dialogue did not start from the seeded database it names"
        return [ctx.reject(GATE, record.item_id, reason, record=record.model_dump(mode="json"))]
    pool = await sandbox_pool_for(ctx.settings)
    program = verify_program(instance["verify"], dialog.initial_state, dialog.final_state, dialog.records())
    verdict = read_verdict(await run_settled(pool, program, timeout_s=ctx.settings.sandbox.timeout_s))
    if isinstance(verdict, str) or not verdict.passed:
        reason = (
            verdict
            if isinstance(verdict, str)
            else f"the verifier fails its own dialogue: {verdict.components}"
        )
        return [ctx.reject(GATE, record.item_id, reason, record=record.model_dump(mode="json"))]
    report = await mutation_gate(pack, instance, pool, ctx.settings.sandbox.timeout_s)
    if not report.passed:
        reason = f"the mutation gate rejects the verification function: {report.reason}"
        details = {"mutation_gate": report.model_dump(mode="json")}
        return [
            ctx.reject(GATE, record.item_id, reason, details=details, record=record.model_dump(mode="json"))
        ]
    instance.update({"prompt_set": record.prompt_set, "item_id": record.item_id})
    split = split_of(instance["instance_id"], ctx.settings.envs.heldout_k)
    sample = _sample(pack, instance, dialog, split, record.item_id)
    store = eigen_store_for(ctx.settings)
    await asyncio.to_thread(
        store.record_instance,
        instance["instance_id"],
        pack.name,
        split,
        sample.sample_id,
        sample.model_dump_json(),
    )
    verified = VerifiedPayload(
        scenario=body.scenario,
        instance=instance,
        sample_id=sample.sample_id,
        split=split,
        verdict={**verdict.model_dump(mode="json"), "mutation_gate": report.model_dump(mode="json")},
    )
    item = make_item(EigenVerified, record, verified, domain=pack.name, prompt_set=record.prompt_set)
    emits = [Emit("eigen.verified", item.item_id, item, (ctx.source_key,))]
    if split == "heldout":
        return emits  # held out: catalogued for `arena eval`, never trained on
    emits.append(Emit("samples.verified", sample.sample_id, sample, (item.item_id,)))
    emits += [
        Emit("samples.sft", s.sample_id, s, (item.item_id,)) for s in sft_samples(body, pack, item.item_id)
    ]
    return emits


async def mutation_gate(
    pack: DomainPack, instance: dict[str, Any], pool: Runner, timeout_s: float
) -> GateReport:
    """The mutation gate (``synthesis.eigen.mutation``) on an instance's verifier, its cases run in the sandbox.

    The cases come from the reference trajectory alone (replayed with the pack's tools here); the
    verifier must pass the correct ones and fail every perturbation, and embed the pack's policy
    unchanged. A verifier whose checks were weakened is rejected before anything is published.
    """
    problem = policy_integrity(instance["verify"], pack)
    if problem:
        return GateReport(
            passed=False, cases=0, perturbations=0, wrong=[], reason=f"policy integrity: {problem}"
        )
    initial = instance["initial_state"]
    records, final = await asyncio.to_thread(replay_reference, pack, initial, instance["reference_calls"])
    cases = await asyncio.to_thread(gate_cases, pack, initial, records, final)
    outcomes: list[bool] = []
    for start in range(0, len(cases), GATE_CHUNK):  # each sandbox run a verify's timeout's worth
        chunk = cases[start : start + GATE_CHUNK]
        result = await run_settled(
            pool, gate_program(instance["verify"], initial, final, records, chunk), timeout_s=timeout_s
        )
        if not result.ok or not isinstance(result.return_value, list):
            error = (result.error or "no outcomes")[:300]
            reason = f"the gate run failed on cases {start}-{start + len(chunk) - 1}: {error}"
            return GateReport(passed=False, cases=len(cases), perturbations=0, wrong=[], reason=reason)
        outcomes += [bool(v) for v in result.return_value]
    return judge(cases, outcomes)


def _sample(
    pack: DomainPack, instance: dict[str, Any], dialog: Dialog, split: str, origin: str
) -> VerifiedSample:
    """The ``interactive`` sample, opening the way the accepted dialogue did (system policy + date, first user turn).

    Keyed by the validated item it came from: its verifier embeds replayed timestamps, so a content
    hash would give a replayed item a second sample.
    """
    sample = interactive_sample(pack, instance, split=split)
    return sample.model_copy(
        update={
            "sample_id": content_hash({"kind": "interactive", "origin": origin}, prefix="vs-", length=24),
            "prompt": [dict(m) for m in dialog.messages[:2]],
        }
    )


STAGE = StageDef(
    name="eigen-verified",
    input="eigen.dialogs.validated",
    input_model=EigenValidated,
    version=STAGE_VERSION,
    handler=handle,
    outputs=("eigen.verified", "samples.verified", "samples.sft"),
    description="EigenData VerificationFunction (run in the sandbox); verified instances to samples.verified/sft",
    dedupe=True,
)

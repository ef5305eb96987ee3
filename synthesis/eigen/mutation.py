"""The mutation gate of generated verification functions (issue 17 item 3, EigenData §4.2).

A verification function is only worth publishing if its checks bite. The gate judges a candidate
``verify(initial_state, final_state, calls)`` source against cases derived from the accepted
dialogue alone -- never from the candidate -- with the pack's tools and the rules generator of
``synthesis.eigen.verification`` as the oracle:

- **must pass**: the reference trajectory, and reorderings of its calls that the oracle still
  accepts (a correct agent that did independent things in another order);
- **must fail** (``perturbations``): the reference final state with one write wrong (another value
  of the same type), missing (the field back to its initial value, a created record removed),
  doubled (a created record twice) or an extra write to a record the task does not concern; the
  reference calls with a key call dropped or one of its arguments changed; and reorderings that
  break one policy rule while state and key calls stay right (one per rule the search can break).

A weakened candidate -- a check removed, an expected value replaced by another of the same type, a
comparison negated (``mutants``) -- either rejects the reference or lets some perturbation through,
so the gate rejects it. ``mutation_score`` measures that on a generated verifier's mutants.
Cases are JSON (edits against the reference final state) so that ``gate_program`` runs them in
the sandbox as one program; ``run_cases`` runs the same code in this process for trusted sources.
"""

from __future__ import annotations

import copy
import inspect
import json
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena import pyast
from synthesis.eigen.packs import DomainPack
from synthesis.eigen.verification import (
    _replay_states,
    field_class,
    locate,
    state_checks_of,
    verification_source,
    without_skipped,
)

MAX_POLICY_PROBES = 400
"""Reorderings tried when looking for a policy-breaking (or an order-free correct) variant."""
MAX_REORDERED_PASSES = 3
"""Correct reorderings kept as must-pass cases."""
_REFERENCE_RE = re.compile(r"^REFERENCE = json\.loads\((.*)\)$", re.MULTILINE)


class GateCase(BaseModel):
    """One trajectory the candidate verifier is run on."""

    name: Annotated[str, Field(description="What the case is, e.g. 'wrong orders.O-1.status'.")]
    expect_pass: Annotated[bool, Field(description="True: a correct trajectory; False: a wrong one.")]
    edits: Annotated[
        list[list[Any]],
        Field(
            description="['set'|'del'|'append', concrete path, value?] applied to the reference final state."
        ),
    ] = []
    final_state: Annotated[
        dict[str, Any] | None, Field(description="A whole final state instead of edits (replayed variants).")
    ] = None
    calls: Annotated[
        list[dict[str, Any]] | None, Field(description="The call records; None: the reference's.")
    ] = None


class GateReport(BaseModel):
    """The gate's verdict on one candidate verifier."""

    passed: Annotated[bool, Field(description="Every must-pass case passed and every perturbation failed.")]
    cases: Annotated[int, Field(description="Cases run (must-pass and must-fail).")]
    perturbations: Annotated[int, Field(description="Must-fail cases among them.")]
    wrong: Annotated[list[str], Field(description="Cases the candidate got wrong (first ones).")]
    reason: Annotated[str, Field(description="Why it was rejected; empty when it passed.")] = ""


class Mutant(BaseModel):
    """A weakened copy of a generated verifier's reference data."""

    operator: Annotated[Literal["remove", "replace", "negate"], Field(description="Mutation operator.")]
    target: Annotated[str, Field(description="The check it weakens, e.g. 'state_checks[3].expected'.")]
    reference: Annotated[dict[str, Any], Field(description="The verifier's REFERENCE with the mutation.")]


class MutationScore(BaseModel):
    """How many mutants of a verifier the gate rejects."""

    mutants: Annotated[int, Field(description="Mutants derived from the verifier.")]
    rejected: Annotated[int, Field(description="Mutants the gate rejects.")]
    rejected_by_cases: Annotated[
        int, Field(description="Mutants the cases alone reject (without the policy-integrity check).")
    ]
    survivors: Annotated[list[str], Field(description="'operator target' of the mutants that got through.")]

    @property
    def share(self) -> float:
        return self.rejected / self.mutants if self.mutants else 1.0


# --------------------------------------------------------------------------- reference data


def reference_of(source: str) -> dict[str, Any]:
    """The ``REFERENCE`` data embedded in a generated verifier."""
    match = _REFERENCE_RE.search(source)
    if match is None:
        raise ValueError("not a generated verifier: no 'REFERENCE = json.loads(...)' line")
    data: dict[str, Any] = json.loads(pyast.literal_eval(match.group(1)))
    return data


def with_reference(source: str, reference: Mapping[str, Any]) -> str:
    """``source`` with its ``REFERENCE`` data replaced."""
    literal = repr(json.dumps(dict(reference), ensure_ascii=False, sort_keys=True))
    line = f"REFERENCE = json.loads({literal})"
    return _REFERENCE_RE.sub(lambda _: line, source, count=1)


def other_value(value: Any, cls: str = "EXACT") -> Any:
    """Another value of the same type (None when there is none): what a wrong write leaves."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return round(value + 1.25, 2)
    if isinstance(value, str):
        return "qqq zzz unrelated" if cls == "SEMANTIC" else value + "X"
    if isinstance(value, list):
        return [] if value else ["X"]
    if isinstance(value, dict):
        return {} if value else {"x": "X"}
    return None


# --------------------------------------------------------------------------- mutants


def mutants(reference: Mapping[str, Any]) -> list[Mutant]:
    """Every mutant of a verifier: each check removed, each expected value replaced, each comparison negated.

    Checks are the state checks (a created record's fields each count as one), the key calls (their
    arguments each count as an expected value) and the policy rules. Not derived: removing the
    field of a made-up id that nothing else refers to (an equivalent mutant: the id is free by
    design, its only assertion is that references to it agree).
    """
    out: list[Mutant] = []
    text = json.dumps(
        [
            [c.get("expected") for c in reference["state_checks"]],
            [c["arguments"] for c in reference["key_calls"]],
        ],
        sort_keys=True,
    )
    minted = {json.dumps(v, sort_keys=True) for v in reference.get("minted", [])}

    def vacuous(value: Any) -> bool:
        """A made-up id nothing else refers to: any value is right, so its check cannot be weakened."""
        key = json.dumps(value, sort_keys=True)
        return key in minted and text.count(key) == 1

    def add(operator: Literal["remove", "replace", "negate"], target: str, change: Any) -> None:
        mutated = copy.deepcopy(dict(reference))
        change(mutated)
        out.append(Mutant(operator=operator, target=target, reference=mutated))

    for n, check in enumerate(reference["state_checks"]):
        where = f"state_checks[{n}] {check['kind']}"
        add("remove", where, lambda r, n=n: r["state_checks"].pop(n))
        add("negate", where, lambda r, n=n: r["state_checks"][n].update(op="ne"))
        if check["kind"] == "set" and other_value(check["expected"], check["class"]) is not None:
            new = other_value(check["expected"], check["class"])
            add("replace", f"{where}.expected", lambda r, n=n, v=new: r["state_checks"][n].update(expected=v))
        if check["kind"] == "created" and isinstance(check["expected"], dict):
            if "fields" in check:
                add("remove", f"{where}.fields", lambda r, n=n: r["state_checks"][n].pop("fields"))
            for key, value in check["expected"].items():
                new = other_value(value, field_class(key))
                if not vacuous(value):
                    add(
                        "remove",
                        f"{where}.{key}",
                        lambda r, n=n, k=key: r["state_checks"][n]["expected"].pop(k),
                    )
                if new is not None:
                    add(
                        "replace",
                        f"{where}.{key}",
                        lambda r, n=n, k=key, v=new: r["state_checks"][n]["expected"].update({k: v}),
                    )
    for n, call in enumerate(reference["key_calls"]):
        where = f"key_calls[{n}] {call['name']}"
        add("remove", where, lambda r, n=n: r["key_calls"].pop(n))
        add("negate", where, lambda r, n=n: r["key_calls"][n].update(op="ne"))
        for key, value in call["arguments"].items():
            new = other_value(value, field_class(key))
            if new is not None and field_class(key) != "SKIP":
                add(
                    "replace",
                    f"{where}.{key}",
                    lambda r, n=n, k=key, v=new: r["key_calls"][n]["arguments"].update({k: v}),
                )
    for n, rule in enumerate(reference["rules"]):
        name = rule if isinstance(rule, str) else rule["function"]
        add("remove", f"rules[{n}] {name}", lambda r, n=n: r["rules"].pop(n))
        add(
            "negate",
            f"rules[{n}] {name}",
            lambda r, n=n, f=name: r["rules"].__setitem__(n, {"function": f, "op": "ne"}),
        )
    return out


# --------------------------------------------------------------------------- cases


def _concrete(state: Any, path: Sequence[Any]) -> list[Any] | None:
    """``path`` (with ``["@", field, value]`` / ``["#", n]`` steps) as plain keys and indices in ``state``."""
    out: list[Any] = []
    node = state
    for step in path:
        where = locate(node, step)
        if where is None:
            return None
        out.append(where)
        node = node[where]
    return out


def _first_leaf(value: Any, path: list[Any]) -> tuple[list[Any], Any, str] | None:
    """The first compared scalar under ``value``: (path, value, field class)."""
    if isinstance(value, dict):
        for key in sorted(value):
            cls = field_class(key)
            if cls == "SKIP":
                continue
            if not isinstance(value[key], dict | list) and value[key] is not None:
                return [*path, key], value[key], cls
            found = _first_leaf(value[key], [*path, key])
            if found:
                return found
    if isinstance(value, list):
        for n, item in enumerate(value):
            found = _first_leaf(item, [*path, n])
            if found:
                return found
    return None


def _get(state: Any, path: Sequence[Any]) -> Any:
    for step in path:
        state = state[step]
    return state


def state_perturbations(
    initial: Mapping[str, Any], final: Mapping[str, Any], minted: set[str]
) -> list[GateCase]:
    """Wrong final states next to the reference one: a write wrong, missing, doubled, or one too many."""
    cases: list[GateCase] = []

    def add(name: str, *edits: list[Any]) -> None:
        cases.append(GateCase(name=name, expect_pass=False, edits=list(edits)))

    for check in state_checks_of(initial, final):
        kind, path = check["kind"], check["path"]
        where = json.dumps(path)
        if kind == "set":
            concrete = _concrete(final, path)
            if concrete is None:
                continue
            value = _get(final, concrete)
            wrong = other_value(value, check["class"])
            if wrong is not None:
                add(f"wrong {where}", ["set", concrete, wrong])
            before = _concrete(initial, path)
            if before is None:
                add(f"missing {where}", ["del", concrete])
            else:
                add(f"missing {where}", ["set", concrete, copy.deepcopy(_get(initial, before))])
        elif kind == "absent":
            before = _concrete(initial, path)
            parent = _concrete(final, path[:-1])
            if before is not None and parent is not None and not isinstance(path[-1], list):
                add(
                    f"not removed {where}", ["set", [*parent, path[-1]], copy.deepcopy(_get(initial, before))]
                )
        elif kind == "created":
            container = _concrete(final, path)
            if container is None:
                continue
            elements = _get(final, container)
            if isinstance(elements, dict):
                spots = [k for k in elements if k == check.get("key")]
            else:
                spots = [n for n, e in enumerate(elements) if without_skipped(e) == check["expected"]][:1]
            for spot in spots:
                record = elements[spot]
                add(f"missing record in {where}", ["del", [*container, spot]])
                if isinstance(elements, list):
                    add(f"doubled record in {where}", ["append", container, copy.deepcopy(record)])
                else:
                    add(
                        f"doubled record in {where}",
                        ["set", [*container, f"{spot}-2"], copy.deepcopy(record)],
                    )
                if isinstance(record, dict):
                    add(
                        f"extra field in a new record of {where}",
                        ["set", [*container, spot, "zz_extra_field"], "X"],
                    )
                for key in sorted(record) if isinstance(record, dict) else []:
                    cls = field_class(key)
                    value = record[key]
                    if cls == "SKIP" or json.dumps(value, sort_keys=True) in minted:
                        continue  # a made-up id may differ in a correct run
                    wrong = other_value(value, cls)
                    if wrong is not None:
                        add(f"wrong {where}.{key} of a new record", ["set", [*container, spot, key], wrong])
        else:  # frame: one write to something the task does not concern
            container = _concrete(final, path)
            if container is None:
                continue
            node = _get(final, container)
            if isinstance(node, dict):
                free = [k for k in sorted(node) if k not in check["covered"] and field_class(k) != "SKIP"]
                leaf = next((f for f in (_first_leaf(node[k], [k]) for k in free) if f), None)
                if leaf is not None:
                    sub, value, cls = leaf
                    add(f"extra write {where}.{sub}", ["set", [*container, *sub], other_value(value, cls)])
                add(f"extra field in {where}", ["set", [*container, "zz_extra_field"], "X"])
            elif isinstance(node, list) and node:
                add(f"extra record in {where}", ["append", container, copy.deepcopy(node[-1])])
                leaf = _first_leaf(node[0], [0])
                if leaf is not None:
                    sub, value, cls = leaf
                    add(f"extra write {where}[0]", ["set", [*container, *sub], other_value(value, cls)])
    return cases


def call_perturbations(records: Sequence[Mapping[str, Any]]) -> list[GateCase]:
    """The reference calls with one key call (agent, ran, changed the state) dropped or an argument changed."""
    cases: list[GateCase] = []
    for n, call in enumerate(records):
        if not (call.get("actor", "agent") == "agent" and call.get("ok") and call.get("changed_state")):
            continue
        dropped = [dict(c) for m, c in enumerate(records) if m != n]
        cases.append(GateCase(name=f"dropped call {n} {call['name']}", expect_pass=False, calls=dropped))
        for key, value in sorted(dict(call.get("arguments") or {}).items()):
            cls = field_class(key)
            wrong = other_value(value, cls)
            if cls == "SKIP" or wrong is None:
                continue
            changed = [copy.deepcopy(dict(c)) for c in records]
            changed[n]["arguments"][key] = wrong
            cases.append(GateCase(name=f"changed {call['name']}.{key}", expect_pass=False, calls=changed))
    return cases


def reorderings(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The calls with one state-changing call moved earlier or later (to every other position)."""
    calls = [{k: c[k] for k in ("name", "arguments", "actor")} for c in records]
    out: list[tuple[str, list[dict[str, Any]]]] = []
    for j in range(len(calls)):
        if not records[j].get("changed_state"):
            continue  # moving a read changes nothing a rule or a check looks at
        for i in range(len(calls)):
            if i == j:
                continue
            moved = calls[:j] + calls[j + 1 :]
            moved.insert(i, calls[j])
            out.append((f"call {j} {calls[j]['name']} moved to {i}", moved))
    return out[:MAX_POLICY_PROBES]


def edits_between(base: Any, target: Any, path: list[Any] | None = None) -> list[list[Any]]:
    """``apply_edits`` edits that turn ``base`` into ``target`` (so a case carries a diff, not a database)."""
    path = path or []
    if isinstance(base, dict) and isinstance(target, dict):
        out: list[list[Any]] = [["del", [*path, k]] for k in base if k not in target]
        for key, value in target.items():
            if key not in base:
                out.append(["set", [*path, key], value])
            elif base[key] != value or type(base[key]) is not type(value):
                out += edits_between(base[key], value, [*path, key])
        return out
    if isinstance(base, list) and isinstance(target, list) and len(base) == len(target) and path:
        out = []
        for n, (old, new) in enumerate(zip(base, target, strict=True)):
            if old != new or type(old) is not type(new):
                out += edits_between(old, new, [*path, n])
        return out
    if not path:
        raise ValueError("the root of a state must be a dict")
    return [["set", path, target]]


def policy_cases(
    pack: DomainPack,
    initial: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    reference_final: Mapping[str, Any],
    oracle: str,
) -> list[GateCase]:
    """Reordered reference calls, replayed: those the oracle accepts (must pass, a few) and, per rule,
    one whose state and key calls are right but which breaks that rule (must fail)."""
    cases: list[GateCase] = []
    broken: set[str] = set()
    passes = 0
    namespace: dict[str, Any] = {"__name__": "verify_oracle", **_SHARED}
    exec(compile(oracle, "verify.py", "exec"), namespace)
    for name, calls in reorderings(records):
        steps = _replay_states(pack, initial, calls)
        if not all(record["ok"] for record, _ in steps):
            continue
        replayed = [record for record, _ in steps]
        final = steps[-1][1] if steps else dict(initial)
        verdict = namespace["verify"](dict(initial), final, replayed)
        parts = verdict["components"]
        if verdict["pass"] and passes < MAX_REORDERED_PASSES:
            passes += 1
            edits = edits_between(dict(reference_final), final)
            cases.append(GateCase(name=f"correct: {name}", expect_pass=True, edits=edits, calls=replayed))
        elif parts["state"] == 1.0 and parts["key_calls"] == 1.0 and not verdict["pass"]:
            rules = {v.split(" ")[0] for v in verdict["details"].get("violations", [])}
            if rules - broken:
                broken |= rules
                cases.append(
                    GateCase(
                        name=f"breaks {sorted(rules)}: {name}",
                        expect_pass=False,
                        edits=edits_between(dict(reference_final), final),
                        calls=replayed,
                    )
                )
    return cases


def gate_cases(
    pack: DomainPack,
    initial: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    final: Mapping[str, Any],
) -> list[GateCase]:
    """All cases of an accepted trajectory, each checked against the oracle (the rules generator's
    verifier): a must-fail case it accepts is a correct variant after all and is dropped."""
    oracle = verification_source(pack, initial, records, final)
    minted = {json.dumps(v, sort_keys=True) for v in reference_of(oracle)["minted"]}
    cases = [GateCase(name="reference", expect_pass=True)]
    cases += policy_cases(pack, initial, records, final, oracle)
    candidates = state_perturbations(initial, final, minted) + call_perturbations(records)
    outcomes = run_cases(oracle, initial, final, records, candidates)
    cases += [c for c, passed in zip(candidates, outcomes, strict=True) if not passed]
    return cases


# --------------------------------------------------------------------------- running

_SHARED: dict[str, dict[str, Any]] = {"VERIFY_CODE_CACHE": {}, "VERIFY_POLICY_MEMO": {}}


def apply_edits(state: Any, edits: list[list[Any]]) -> Any:
    """``state`` with ``['set', path, value]`` / ``['del', path]`` / ``['append', path, value]`` applied."""
    for edit in edits:
        op, path = edit[0], edit[1]
        node = state
        for step in path[:-1] if op != "append" else path:
            node = node[step]
        if op == "set":
            node[path[-1]] = edit[2]
        elif op == "del":
            del node[path[-1]]
        else:
            node.append(edit[2])
    return state


def case_outcomes(
    verify: Any, initial: Any, final: Any, calls: Any, cases: list[dict[str, Any]], stop: bool
) -> list[bool]:
    """Whether ``verify`` passed each case (stopping at the first wrong outcome when ``stop``)."""
    out = []
    final_text, initial_text = json.dumps(final), json.dumps(initial)
    for case in cases:
        edits = case.get("edits") or []
        state = (
            case["final_state"]
            if case.get("final_state") is not None
            else apply_edits(json.loads(final_text), edits)
        )
        given = case["calls"] if case.get("calls") is not None else calls
        try:  # fresh copies each time: a verifier that changes its inputs cannot sway the next case
            passed = bool(verify(json.loads(initial_text), state, json.loads(json.dumps(given)))["pass"])
        except Exception:
            passed = False
        out.append(passed)
        if stop and passed != case["expect_pass"]:
            break
    return out


def run_cases(
    source: str,
    initial: Mapping[str, Any],
    final: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    cases: Sequence[GateCase],
    *,
    stop: bool = False,
) -> list[bool]:
    """Run a trusted verifier source on the cases in this process (see ``gate_program`` for the sandbox)."""
    # The verifier's compile cache and policy memo are shared between runs (pure functions of their keys).
    namespace: dict[str, Any] = {"__name__": "verify_gate", **_SHARED}
    exec(compile(source, "verify.py", "exec"), namespace)
    dumped = [c.model_dump(mode="json") for c in cases]
    return case_outcomes(namespace["verify"], dict(initial), dict(final), list(records), dumped, stop)


def gate_program(
    source: str,
    initial: Mapping[str, Any],
    final: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    cases: Sequence[GateCase],
) -> str:
    """The sandbox program that runs a candidate verifier on every case; it returns the outcomes."""
    data = json.dumps(
        {
            "initial": dict(initial),
            "final": dict(final),
            "calls": list(records),
            "cases": [c.model_dump(mode="json") for c in cases],
        },
        ensure_ascii=False,
    )
    runtime = "\n\n".join(inspect.getsource(f) for f in (apply_edits, case_outcomes))
    return (
        f"import json\n{source.rstrip()}\n\n{runtime}\n\nGATE = json.loads({data!r})\n"
        "case_outcomes(verify, GATE['initial'], GATE['final'], GATE['calls'], GATE['cases'], False)\n"
    )


def judge(cases: Sequence[GateCase], outcomes: Sequence[bool]) -> GateReport:
    """The gate's verdict from the outcomes of ``cases``, in order; a run that stopped at its first
    wrong outcome has fewer outcomes than cases, and missing outcomes with none wrong are a failure."""
    wrong = [
        f"{'rejects' if c.expect_pass else 'accepts'} {c.name}"
        for c, outcome in zip(cases, outcomes, strict=False)
        if outcome != c.expect_pass
    ]
    if not wrong and len(outcomes) < len(cases):
        wrong = [f"no outcome for {len(cases) - len(outcomes)} of {len(cases)} cases"]
    perturbations = sum(1 for c in cases if not c.expect_pass)
    reason = ""
    if wrong:
        reason = f"the verification function gets {len(wrong)} of {len(cases)} gate cases wrong: {wrong[:3]}"
    return GateReport(
        passed=not wrong, cases=len(cases), perturbations=perturbations, wrong=wrong[:20], reason=reason
    )


def policy_integrity(source: str, pack: DomainPack) -> str:
    """Why the verifier's policy part is not the pack's, verbatim (empty when it is).

    The policy is the pack's, not the task's: every rule, as written, over the pack's tools. On one
    task most rules cannot be broken without also breaking the state (a second address change
    shows in the order), so dropping or inverting one is not always visible in behaviour; it is in
    the verifier's data, which must then embed the pack's tools, policy and every rule unchanged.
    A source without generated ``REFERENCE`` data is judged on behaviour alone.
    """
    try:
        reference = reference_of(source)
    except (ValueError, SyntaxError):
        return ""
    rules = [r if isinstance(r, dict) else {"function": r, "op": "eq"} for r in reference.get("rules", [])]
    wanted = [{"function": r.function, "op": "eq"} for r in pack.rules]
    problems = []
    if reference.get("tools_source") != pack.tools_source:
        problems.append("its tools are not the pack's tools.py")
    if reference.get("policy_source") != pack.policy_source:
        problems.append("its policy is not the pack's policy.py")
    if rules != wanted:
        missing = sorted(
            {w["function"] for w in wanted} - {r["function"] for r in rules if r.get("op") == "eq"}
        )
        problems.append(f"its rules differ from the pack's (missing or inverted: {missing})")
    return "; ".join(problems)


def gate(
    source: str,
    pack: DomainPack,
    initial: Mapping[str, Any],
    final: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    cases: Sequence[GateCase],
) -> GateReport:
    """Judge a trusted verifier source in this process: policy integrity, then the cases."""
    problem = policy_integrity(source, pack)
    if problem:
        return GateReport(
            passed=False, cases=0, perturbations=0, wrong=[], reason=f"policy integrity: {problem}"
        )
    outcomes = run_cases(source, initial, final, records, cases, stop=True)
    return judge(cases, outcomes)


def mutation_score(
    source: str,
    pack: DomainPack,
    initial: Mapping[str, Any],
    final: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    cases: Sequence[GateCase],
) -> MutationScore:
    """How many of a generated verifier's mutants the gate rejects, given its trajectory's cases.

    A mutant differs from ``source`` only in its ``REFERENCE`` data, so the source is compiled once
    and each mutant's data swapped in -- the same verdicts as ``gate(with_reference(source, ...))``
    without compiling ~100 copies.
    """
    namespace: dict[str, Any] = {"__name__": "verify_gate", **_SHARED}
    exec(compile(source, "verify.py", "exec"), namespace)
    dumped = [c.model_dump(mode="json") for c in cases]
    survivors = []
    by_cases = 0
    found = mutants(reference_of(source))
    for mutant in found:
        namespace["REFERENCE"] = mutant.reference
        outcomes = case_outcomes(namespace["verify"], dict(initial), dict(final), list(records), dumped, True)
        caught = not judge(cases, outcomes).passed
        by_cases += int(caught)
        if not caught and not policy_integrity(with_reference(source, mutant.reference), pack):
            survivors.append(f"{mutant.operator} {mutant.target}")
    return MutationScore(
        mutants=len(found),
        rejected=len(found) - len(survivors),
        rejected_by_cases=by_cases,
        survivors=survivors,
    )


__all__ = [
    "GateCase",
    "GateReport",
    "Mutant",
    "MutationScore",
    "gate",
    "gate_cases",
    "gate_program",
    "judge",
    "mutants",
    "mutation_score",
    "other_value",
    "policy_integrity",
    "reference_of",
    "run_cases",
    "with_reference",
]

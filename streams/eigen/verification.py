"""VerificationFunction worker, rules backend (EigenData §4.2 and the appendix's prompt).

From an accepted dialogue's calls and the resulting (reference) final state, generate the Python
source of ``verify(initial_state, final_state, calls) -> {"pass", "reward", "components"}``, the
binary state-based reward of ``InteractiveSpec.verify`` (environments/environment.py). It judges
observable outcomes -- state and calls -- never the dialogue text, so paraphrases do not matter.
Three parts, all must pass:

1. **state**: the final state deep-compared with the reference final state embedded in the
   source. Every leaf is classified by its key (the innermost dict key above it):
   - SKIP: ``*_at``, ``*_time``, ``*_timestamp``, ``*_uuid``, ``*_token``, ``timestamp``, ``uuid``,
     ``token``, ``time`` -- differ between runs, never compared (a key missing on one side too);
   - SEMANTIC: free text -- ``description``, ``message``, ``note(s)``, ``content``, ``reason``,
     ``comment(s)``, ``summary``, ``text``, ``body``, ``details``, ``explanation``, ``feedback``
     and ``*_description``/``*_message``/``*_note``/``*_reason``/``*_comment``/``*_summary``/``*_text``
     -- two strings match when their word-overlap similarity (Dice over content-word stems) is at
     least the threshold (0.5);
   - EXACT: everything else -- ids, ``*_count``, status, amounts and other numbers (1e-6
     tolerance), booleans, names, and addresses (a wrong house number is a wrong outcome).
   Lists compare in order, or else as multisets (two refunds issued in the other order match).
   Score = matching leaves / leaves.
2. **key_calls**: every key call of the reference -- an agent call that ran and changed the state
   (optionally only the ``must_have`` functions) -- must appear among the evaluated calls (same
   name, ran, by the agent, each evaluated call used once) with the same arguments: critical
   parameters (ids, amounts, counts, enums, addresses) exactly, SEMANTIC ones (reason, note,
   description...) fuzzily, SKIP ones ignored; omitted parameters take the tool's defaults.
   Score = matched / key calls.
3. **policy**: the pack's tool code and ``rule_*`` functions are embedded; the evaluated calls
   that ran are replayed from the initial state to recover the state before and after each one,
   and every rule is checked on every such call. Score = 1 - calls with a violation / calls.

``reward`` is 1.0 when all three pass, else 0.0; ``components`` holds the three scores; a
``details`` entry (mismatched paths, missing calls, violations) is extra, for people reading it.
The generated module needs only the standard library: the runtime below is embedded verbatim
(``inspect.getsource``), so what the tests call in-process is what runs in the sandbox.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from arena.hashing import content_hash
from arena.records.envs import VerifiedSample
from environments.environment import InteractiveSpec
from streams.eigen.packs import DomainPack

SEMANTIC_THRESHOLD = 0.5
"""Word-overlap similarity (Dice over content-word stems) at which two free texts match."""


# --------------------------------------------------------------------------- runtime (embedded)


def field_class(key: str) -> str:
    """EXACT, SEMANTIC or SKIP for a state field or call parameter named ``key``."""
    name = str(key).lower()
    if name in ("timestamp", "uuid", "token", "time") or name.endswith(
        ("_at", "_time", "_timestamp", "_uuid", "_token")
    ):
        return "SKIP"
    semantic = (
        "description", "message", "note", "notes", "content", "reason", "comment", "comments",
        "summary", "text", "body", "details", "explanation", "feedback",
    )  # fmt: skip
    if name in semantic or name.endswith(
        ("_description", "_message", "_note", "_reason", "_comment", "_summary", "_text")
    ):
        return "SEMANTIC"
    return "EXACT"


def text_stems(text: str) -> set[str]:
    """Content-word stems of ``text``: lower-case alphanumeric words, stop words out, cut to 6 letters."""
    stop = {
        "a", "an", "the", "and", "or", "but", "of", "to", "in", "on", "at", "for", "with", "by", "from",
        "is", "are", "was", "were", "be", "been", "it", "its", "this", "that", "my", "your", "their",
        "i", "we", "you", "they", "he", "she", "as", "so", "has", "have", "had", "one", "some", "very",
    }  # fmt: skip
    return {w[:6] for w in re.findall(r"[a-z0-9]+", str(text).lower()) if w not in stop}


def text_similarity(a: str, b: str) -> float:
    """Dice coefficient of the content-word stems of ``a`` and ``b`` (1.0 when both have none)."""
    x, y = text_stems(a), text_stems(b)
    if not x and not y:
        return 1.0
    return 2 * len(x & y) / (len(x) + len(y))


def values_equal(ref: Any, got: Any) -> bool:
    """EXACT equality: numbers within 1e-6 (a numeric string counts as its number), else ==."""
    if isinstance(ref, bool) or isinstance(got, bool):
        return ref is got or (isinstance(ref, bool) and isinstance(got, bool) and ref == got)
    numbers = []
    for value in (ref, got):
        if isinstance(value, int | float):
            numbers.append(float(value))
        elif isinstance(value, str) and isinstance(ref if value is got else got, int | float):
            try:
                numbers.append(float(value))
            except ValueError:
                return False
    if len(numbers) == 2:
        return math.isclose(numbers[0], numbers[1], rel_tol=1e-9, abs_tol=1e-6)
    return bool(ref == got)


def deep_compare(ref: Any, got: Any, path: str, cls: str, checks: list[list[Any]], threshold: float) -> None:
    """Append ``[path, class, ok]`` for every leaf of ``ref`` / ``got`` (see the module docstring)."""
    if cls == "SKIP":
        return
    if isinstance(ref, dict) and isinstance(got, dict):
        for key in list(ref) + [k for k in got if k not in ref]:
            sub = field_class(key)
            if sub == "SKIP":
                continue
            where = f"{path}.{key}" if path else str(key)
            if key not in ref or key not in got:
                checks.append([where + (" (missing)" if key in ref else " (unexpected)"), sub, False])
            else:
                deep_compare(ref[key], got[key], where, sub, checks, threshold)
        return
    if isinstance(ref, list) and isinstance(got, list):
        ordered: list[list[Any]] = []
        for n, (r, g) in enumerate(zip(ref, got, strict=False)):
            deep_compare(r, g, f"{path}[{n}]", cls, ordered, threshold)
        if len(ref) != len(got):
            ordered.append([f"{path} (length {len(got)}, expected {len(ref)})", cls, False])
        if all(c[2] for c in ordered) or len(ref) != len(got):
            checks.extend(ordered)
            return
        unordered: list[list[Any]] = []
        unused = list(range(len(got)))
        for n, r in enumerate(ref):
            for m in unused:
                trial: list[list[Any]] = []
                deep_compare(r, got[m], f"{path}[{n}]", cls, trial, threshold)
                if all(c[2] for c in trial):
                    unused.remove(m)
                    unordered.extend(trial)
                    break
            else:
                checks.extend(ordered)  # some element has no match anywhere: report the in-order diff
                return
        checks.extend(unordered)
        return
    if cls == "SEMANTIC" and isinstance(ref, str) and isinstance(got, str):
        checks.append([path, cls, text_similarity(ref, got) >= threshold])
        return
    if isinstance(ref, dict | list) or isinstance(got, dict | list):
        checks.append([path, cls, False])
        return
    checks.append([path, cls, values_equal(ref, got)])


def arguments_match(
    ref_args: dict[str, Any], got_args: dict[str, Any], defaults: dict[str, Any], threshold: float
) -> bool:
    """Critical parameters equal, semantic ones similar, SKIP ones ignored; defaults fill omissions."""
    ref_full = {**defaults, **ref_args}
    got_full = {**defaults, **got_args}
    for key in set(ref_full) | set(got_full):
        cls = field_class(key)
        if cls == "SKIP":
            continue
        if key not in ref_full or key not in got_full:
            return False
        checks: list[list[Any]] = []
        deep_compare(ref_full[key], got_full[key], key, cls, checks, threshold)
        if not all(c[2] for c in checks):
            return False
    return True


def key_calls_check(reference: dict[str, Any], calls: list[dict[str, Any]]) -> tuple[int, int, list[str]]:
    """(matched, key calls, descriptions of the missing ones)."""
    used: set[int] = set()
    matched = 0
    missing: list[str] = []
    for ref in reference["key_calls"]:
        defaults = reference["defaults"].get(ref["name"], {})
        for n, call in enumerate(calls):
            if (
                n not in used
                and call.get("name") == ref["name"]
                and call.get("ok")
                and call.get("actor", "agent") == "agent"
                and isinstance(call.get("arguments"), dict)
                and arguments_match(ref["arguments"], call["arguments"], defaults, reference["threshold"])
            ):
                used.add(n)
                matched += 1
                break
        else:
            missing.append(f"{ref['name']}({json.dumps(ref['arguments'], sort_keys=True)})")
    return matched, len(reference["key_calls"]), missing


def policy_check(
    reference: dict[str, Any], initial_state: dict[str, Any], calls: list[dict[str, Any]]
) -> tuple[int, int, list[str], list[str]]:
    """Replay the calls that ran with the embedded tools; check every rule on each.

    Returns (calls checked, calls with a violation, violations, replay errors).
    """
    tools: dict[str, Any] = {"__name__": "verify_tools", "STATE": {}}
    exec(reference["tools_source"], tools)
    rules: dict[str, Any] = {"__name__": "verify_policy"}
    exec(reference["policy_source"], rules)
    state = copy.deepcopy(initial_state)
    checked = 0
    violating = 0
    violations: list[str] = []
    errors: list[str] = []
    for n, call in enumerate(calls):
        if not call.get("ok"):
            continue
        name = str(call.get("name"))
        given = call.get("arguments")
        arguments: dict[str, Any] = given if isinstance(given, dict) else {}
        before = state
        function = tools.get(name)
        tools["STATE"] = copy.deepcopy(before)
        try:
            if not callable(function) or name.startswith("_"):
                raise NameError(f"no tool {name}")
            function(**arguments)
            after = tools["STATE"]
        except Exception as exc:
            errors.append(f"call {n} {name}: {type(exc).__name__}: {exc}")
            after = before
        checked += 1
        record = {**call, "arguments": arguments}
        hit = False
        for rule in reference["rules"]:
            try:
                message = rules[rule](before, record, after)
            except Exception as exc:
                message = f"the rule raised {type(exc).__name__}: {exc}"
            if message:
                hit = True
                violations.append(f"{rule} (call {n} {name}): {message}")
        violating += int(hit)
        state = after
    return checked, violating, violations, errors


def evaluate(reference: dict[str, Any], initial_state: Any, final_state: Any, calls: Any) -> dict[str, Any]:
    """The verdict of the three parts (see the module docstring); never raises."""
    details: dict[str, Any] = {}
    calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    try:
        checks: list[list[Any]] = []
        deep_compare(reference["final_state"], final_state, "", "EXACT", checks, reference["threshold"])
        state_score = sum(1 for c in checks if c[2]) / len(checks) if checks else 1.0
        state_ok = all(c[2] for c in checks)
        details["state_mismatches"] = [f"{c[0]} [{c[1]}]" for c in checks if not c[2]][:20]
    except Exception as exc:
        state_score, state_ok = 0.0, False
        details["state_error"] = f"{type(exc).__name__}: {exc}"
    try:
        matched, total, missing = key_calls_check(reference, calls)
        key_score = matched / total if total else 1.0
        key_ok = matched == total
        details["missing_key_calls"] = missing
    except Exception as exc:
        key_score, key_ok = 0.0, False
        details["key_calls_error"] = f"{type(exc).__name__}: {exc}"
    try:
        checked, violating, violations, errors = policy_check(reference, initial_state, calls)
        policy_score = 1.0 - violating / checked if checked else 1.0
        policy_ok = not violations
        details["violations"] = violations[:20]
        details["replay_errors"] = errors[:20]
    except Exception as exc:
        policy_score, policy_ok = 0.0, False
        details["policy_error"] = f"{type(exc).__name__}: {exc}"
    try:
        digest = json.dumps(initial_state, sort_keys=True, ensure_ascii=False)
        details["initial_state_matches"] = (
            hashlib.sha256(digest.encode()).hexdigest() == reference["initial_digest"]
        )
    except Exception:
        details["initial_state_matches"] = False
    passed = bool(state_ok and key_ok and policy_ok)
    return {
        "pass": passed,
        "reward": 1.0 if passed else 0.0,
        "components": {"state": state_score, "key_calls": key_score, "policy": policy_score},
        "details": details,
    }


RUNTIME = (
    field_class,
    text_stems,
    text_similarity,
    values_equal,
    deep_compare,
    arguments_match,
    key_calls_check,
    policy_check,
    evaluate,
)
"""The functions embedded in every generated verifier, in this order."""

_HEADER = '''"""Verification function{about} (EigenData §4.2, arena rules backend; generated, do not edit)."""

import copy
import hashlib
import json
import math
import re
from typing import Any

REFERENCE = json.loads({reference})
'''

_FOOTER = '''

def verify(initial_state, final_state, calls):
    """{{"pass", "reward", "components"}} of a trajectory: state, key calls, policy."""
    return evaluate(REFERENCE, initial_state, final_state, calls)
'''


# --------------------------------------------------------------------------- generation


def _digest(state: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(state), sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def without_skipped(value: Any) -> Any:
    """``value`` without its SKIP fields (they are never compared; dropping them keeps verifiers deterministic)."""
    if isinstance(value, dict):
        return {k: without_skipped(v) for k, v in value.items() if field_class(k) != "SKIP"}
    if isinstance(value, list):
        return [without_skipped(v) for v in value]
    return value


def _defaults(pack: DomainPack) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for spec in pack.agent_tools + pack.user_tools:
        function = spec["function"]
        props = function["parameters"]["properties"]
        out[function["name"]] = {k: v["default"] for k, v in props.items() if "default" in v}
    return out


def key_calls_of(
    calls: Sequence[Mapping[str, Any]], must_have: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """The reference's key calls: agent calls that ran and changed the state (of ``must_have`` names)."""
    return [
        {"name": str(c["name"]), "arguments": dict(c.get("arguments") or {})}
        for c in calls
        if c.get("actor", "agent") == "agent"
        and c.get("ok")
        and c.get("changed_state")
        and (must_have is None or c["name"] in must_have)
    ]


def verification_source(
    pack: DomainPack,
    initial_state: Mapping[str, Any],
    reference_calls: Sequence[Mapping[str, Any]],
    reference_final_state: Mapping[str, Any],
    *,
    must_have: Sequence[str] | None = None,
    threshold: float = SEMANTIC_THRESHOLD,
    instance_id: str = "",
) -> str:
    """Python source of ``verify(initial_state, final_state, calls)`` for one accepted instance.

    ``reference_calls`` are ``CallRecord``-shaped dicts (name, arguments, actor, ok,
    changed_state) of the accepted dialogue; ``reference_final_state`` is the state they left.
    """
    reference = {
        "domain": pack.name,
        "threshold": threshold,
        "final_state": without_skipped(dict(reference_final_state)),
        "initial_digest": _digest(initial_state),
        "key_calls": key_calls_of(reference_calls, must_have),
        "defaults": _defaults(pack),
        "tools_source": pack.tools_source,
        "policy_source": pack.policy_source,
        "rules": [r.function for r in pack.rules],
    }
    literal = repr(json.dumps(reference, ensure_ascii=False, sort_keys=True))
    about = f" for {instance_id}" if instance_id else f" of a {pack.name} instance"
    runtime = "\n\n".join(inspect.getsource(f) for f in RUNTIME)
    return _HEADER.format(about=about, reference=literal) + "\n\n" + runtime + _FOOTER.format()


def run_verify(source: str, initial: Any, final: Any, calls: Any) -> dict[str, Any]:
    """Run a generated verifier in this process (trusted, generated here: for checks, not rollouts)."""
    namespace: dict[str, Any] = {"__name__": "verify_local"}
    exec(compile(source, "verify.py", "exec"), namespace)
    result: dict[str, Any] = namespace["verify"](
        copy.deepcopy(initial), copy.deepcopy(final), copy.deepcopy(calls)
    )
    return result


def replay_reference(
    pack: DomainPack, initial_state: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run reference calls with the pack's tools in this process (trusted pack code).

    Returns the ``CallRecord`` dicts and the final state; like the environment, a call that raises
    leaves the state as it was and is recorded with ``ok=False``.
    """
    namespace: dict[str, Any] = {"__name__": "reference_tools", "STATE": {}}
    exec(compile(pack.tools_source, "tools.py", "exec"), namespace)
    state = json.loads(json.dumps(dict(initial_state)))
    records: list[dict[str, Any]] = []
    user_tools = set(pack.user_tool_names)
    for call in calls:
        name = str(call["name"])
        actor = str(call.get("actor") or ("user" if name in user_tools else "agent"))
        arguments = dict(call.get("arguments") or {})
        offered = pack.user_tool_names if actor == "user" else pack.agent_tool_names
        namespace["STATE"] = copy.deepcopy(state)
        ok = name in offered
        if ok:
            try:
                namespace[name](**copy.deepcopy(arguments))
            except Exception:
                ok = False
        after = json.loads(json.dumps(namespace["STATE"])) if ok else state
        records.append(
            {
                "name": name,
                "arguments": arguments,
                "actor": actor,
                "ok": ok,
                "changed_state": ok and after != state,
            }
        )
        state = after
    return records, state


def build_instance(
    pack: DomainPack,
    seed: int,
    *,
    size: str = "small",
    task: Mapping[str, Any] | None = None,
    must_have: Sequence[str] | None = None,
    max_user_turns: int = 16,
) -> dict[str, Any]:
    """One interactive instance of ``pack``: an ``InteractiveSpec``-shaped dict (plus provenance).

    The database comes from the pack's generator (``seed``, ``size``); the task (user
    instructions, requirements, reference calls) from ``task`` or the pack's ``reference_task``.
    The reference calls are replayed to get the reference final state, the verifier is generated
    from them and checked to pass the reference before the instance is returned.
    """
    initial = pack.generate(seed, size)
    chosen = dict(task) if task is not None else pack.reference_task(copy.deepcopy(initial), seed)
    records, final = replay_reference(pack, initial, chosen["calls"])
    failed = [f"{r['name']}({r['arguments']})" for r in records if not r["ok"]]
    if failed:
        raise ValueError(f"reference calls failed on the seed-{seed} database: {failed}")
    instance_id = content_hash(
        {"domain": pack.name, "seed": seed, "size": size, "calls": records}, prefix="inst-", length=20
    )
    verify = verification_source(pack, initial, records, final, must_have=must_have, instance_id=instance_id)
    verdict = run_verify(verify, initial, final, records)
    if not verdict["pass"]:
        raise ValueError(f"the generated verifier rejects its own reference: {verdict}")
    goal_actions: list[str] = []
    for record in key_calls_of(records, must_have):
        if record["name"] not in goal_actions:
            goal_actions.append(record["name"])
    spec = InteractiveSpec(
        initial_state=initial,
        code=pack.tools_source,
        verify=verify,
        user_instructions=str(chosen["user_instructions"]),
        requirements=[str(r) for r in chosen.get("requirements") or []],
        goal_actions=goal_actions,
        user_tools=pack.user_tools,
        max_user_turns=max_user_turns,
    )
    return {
        **spec.model_dump(),
        "instance_id": instance_id,
        "domain": pack.name,
        "seed": seed,
        "size": size,
        "reference_calls": records,
    }


def interactive_sample(
    pack: DomainPack, instance: Mapping[str, Any], *, split: str = "train"
) -> VerifiedSample:
    """The ``samples.verified`` record (``kind="interactive"``) of an instance from ``build_instance``."""
    spec = InteractiveSpec.model_validate(dict(instance))
    opening = spec.requirements[0] if spec.requirements else spec.user_instructions
    return VerifiedSample(
        sample_id=content_hash(
            {"kind": "interactive", "instance": instance.get("instance_id"), "verify": spec.verify},
            prefix="vs-",
            length=24,
        ),
        kind="interactive",
        prompt=[{"role": "system", "content": pack.policy_text}, {"role": "user", "content": opening}],
        tools=pack.agent_tools,
        env_ref=str(instance.get("instance_id") or ""),
        reward_spec=dict(instance),
        domain=pack.name,
        split=split,
    )

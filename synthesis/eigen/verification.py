"""VerificationFunction worker, rules backend (EigenData §4.2 and the appendix's prompt).

From an accepted dialogue's calls and the resulting (reference) final state, generate the Python
source of ``verify(initial_state, final_state, calls) -> {"pass", "reward", "components"}``, the
binary state-based reward of ``InteractiveSpec.verify`` (environments/environment.py). It judges
observable outcomes -- state and calls -- never the dialogue text, so paraphrases do not matter.
Three parts, all must pass:

1. **state**: assertions on what the task concerns, not a whole-database diff. Generation diffs
   the initial state against the reference final state into checks (``state_checks``):
   - ``set``: a field of an existing record has the reference's new value (path through dict
     keys, list records by their id field ``["@", field, value]`` or position ``["#", n]``);
   - ``absent``: a key / list record the reference removed is gone;
   - ``created``: a new record -- a new key of a dict of records, a new element of a list of
     records -- exists, matched by CONTENT (one-to-one over the new elements), never by id. Ids
     the tools made up (``minted``: a new record's key or ``id`` / ``*_id`` field found nowhere
     in the initial state nor in the calls' arguments up to the call that created it) are bound
     while matching, so records created in another order (other counter ids) match, and the
     same mapping translates every other reference to them (fields, key-call arguments); ids the
     calls named are compared exactly. Its ``fields`` must be the element's field names;
   - ``frame``: everything else in a container the reference changed is as it was in the
     initial state (a must-stay-unchanged check per changed container: an extra write to an
     unrelated record fails it), lists of records as multisets (order-free).
   A task that changes nothing gets one root frame check. Every compared leaf is classified by
   its key (the innermost dict key above it):
   - SKIP: ``*_at``, ``*_time``, ``*_timestamp``, ``*_uuid``, ``*_token``, ``timestamp``, ``uuid``,
     ``token``, ``time`` -- differ between runs, never compared (a key missing on one side too);
   - SEMANTIC: free text -- ``description``, ``message``, ``note(s)``, ``content``, ``reason``,
     ``comment(s)``, ``summary``, ``text``, ``body``, ``details``, ``explanation``, ``feedback``
     and ``*_description``/``*_message``/``*_note``/``*_reason``/``*_comment``/``*_summary``/``*_text``
     -- two strings match when their word-overlap similarity (Dice over content-word stems,
     light suffix stripping) is at least the threshold (0.5);
   - EXACT: everything else -- ids, ``*_count``, status, amounts and other numbers (1e-6
     tolerance), booleans, names, and addresses (a wrong house number is a wrong outcome).
   Every check has an ``op`` (``"eq"``; ``"ne"`` inverts it -- how the mutation gate's negated
   mutants are written). Score = checks that hold / checks.
2. **key_calls**: every key call of the reference -- an agent call that ran and changed the state
   (optionally only the ``must_have`` functions) -- must appear among the evaluated calls (same
   name, ran, by the agent, each evaluated call used once) with the same arguments: critical
   parameters (ids, amounts, counts, enums, addresses) exactly, SEMANTIC ones (reason, note,
   description...) fuzzily, SKIP ones ignored; omitted parameters take the tool's defaults.
   Minted ids among the arguments go through the state part's mapping. Score = matched / key calls.
3. **policy**: the pack's tool code and ``rule_*`` functions are embedded; the evaluated calls
   that ran are replayed from the initial state to recover the state before and after each one,
   and every rule is checked on every such call. Score = 1 - calls with a violation / calls.

``reward`` is 1.0 when all three pass, else 0.0; ``components`` holds the three scores; a
``details`` entry (mismatched paths, missing calls, violations) is extra, for people reading it.
The generated module needs only the standard library: the runtime below is embedded verbatim
(``inspect.getsource``), so what the tests call in-process is what runs in the sandbox. The
reference final state is not embedded (the checks hold only what changed); the mutation gate of
``synthesis.eigen.mutation`` judges a generated verifier before it is published.
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
from synthesis.eigen.packs import DomainPack

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
    """Content-word stems of ``text``: lower-case words, "n't" as "not", stop words out, common
    suffixes (-ing, -ed, -es, -s, -al, -ly, -ation) off, cut to 5 letters -- so "arrived cracked"
    and "cracked on arrival" share their stems."""
    stop = {
        "a", "an", "the", "and", "or", "but", "of", "to", "in", "on", "at", "for", "with", "by", "from",
        "is", "are", "was", "were", "be", "been", "it", "its", "this", "that", "my", "your", "their",
        "i", "we", "you", "they", "he", "she", "as", "so", "has", "have", "had", "one", "some", "very",
        "do", "does", "did", "s", "t", "our", "us", "her", "his", "them", "me",
    }  # fmt: skip
    words = re.findall(r"[a-z0-9]+", str(text).lower().replace("n't", " not"))
    stems = set()
    for word in words:
        if word in stop:
            continue
        for suffix in ("ation", "ing", "ed", "es", "al", "ly", "s"):
            if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.isdigit():
                word = word[: -len(suffix)]
                break
        stems.add(word[:5])
    return stems


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


def minted_key(value: Any) -> str:
    """The key of a value in a minted-id mapping (ids may be strings or numbers)."""
    return json.dumps(value, sort_keys=True)


def compare_leaf(ref: Any, got: Any, cls: str, threshold: float, mapping: dict[str, Any] | None) -> bool:
    """One leaf: a minted id through the mapping (binding it while records are matched), else by class."""
    if mapping is not None and not isinstance(ref, bool) and minted_key(ref) in mapping["minted"]:
        bound = mapping["to"].get(minted_key(ref))
        if bound is not None:
            return bool(bound == minted_key(got))
        if mapping["bind"] and minted_key(got) not in mapping["taken"] and isinstance(got, str | int):
            mapping["to"][minted_key(ref)] = minted_key(got)
            mapping["taken"].add(minted_key(got))
            return True
        return False
    if cls == "SEMANTIC" and isinstance(ref, str) and isinstance(got, str):
        return text_similarity(ref, got) >= threshold
    return values_equal(ref, got)


def snapshot(mapping: dict[str, Any] | None) -> Any:
    return None if mapping is None else (dict(mapping["to"]), set(mapping["taken"]))


def restore(mapping: dict[str, Any] | None, saved: Any) -> None:
    if mapping is not None:
        mapping["to"], mapping["taken"] = dict(saved[0]), set(saved[1])


def deep_compare(
    ref: Any,
    got: Any,
    path: str,
    cls: str,
    checks: list[list[Any]],
    threshold: float,
    mapping: dict[str, Any] | None = None,
) -> None:
    """Append ``[path, class, ok]`` for every leaf of ``ref`` / ``got`` (see the module docstring).

    ``mapping`` maps the reference's minted ids (record ids a tool made up) to the evaluated run's.
    """
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
                deep_compare(ref[key], got[key], where, sub, checks, threshold, mapping)
        return
    if isinstance(ref, list) and isinstance(got, list):
        saved = snapshot(mapping)
        ordered: list[list[Any]] = []
        for n, (r, g) in enumerate(zip(ref, got, strict=False)):
            deep_compare(r, g, f"{path}[{n}]", cls, ordered, threshold, mapping)
        if len(ref) != len(got):
            ordered.append([f"{path} (length {len(got)}, expected {len(ref)})", cls, False])
        if all(c[2] for c in ordered) or len(ref) != len(got):
            checks.extend(ordered)
            return
        after_ordered = snapshot(mapping)
        restore(mapping, saved)
        unordered: list[list[Any]] = []
        unused = list(range(len(got)))
        for n, r in enumerate(ref):
            for m in unused:
                trial: list[list[Any]] = []
                before = snapshot(mapping)
                deep_compare(r, got[m], f"{path}[{n}]", cls, trial, threshold, mapping)
                if all(c[2] for c in trial):
                    unused.remove(m)
                    unordered.extend(trial)
                    break
                restore(mapping, before)
            else:
                restore(mapping, after_ordered)
                checks.extend(ordered)  # some element has no match anywhere: report the in-order diff
                return
        checks.extend(unordered)
        return
    if isinstance(ref, dict | list) or isinstance(got, dict | list):
        checks.append([path, cls, False])
        return
    checks.append([path, cls, compare_leaf(ref, got, cls, threshold, mapping)])


def same(ref: Any, got: Any, cls: str, threshold: float, mapping: dict[str, Any] | None = None) -> bool:
    """Whether ``got`` matches ``ref`` on every compared leaf."""
    if mapping is None and ref == got and json.dumps(ref, sort_keys=True) == json.dumps(got, sort_keys=True):
        return True  # identical, True and 1 told apart (the frame's usual case): no leaf walk
    checks: list[list[Any]] = []
    deep_compare(ref, got, "", cls, checks, threshold, mapping)
    return all(c[2] for c in checks)


def locate(container: Any, step: Any) -> Any:
    """The key / index ``step`` selects in ``container``, or None: a dict key, ``["#", index]`` or
    ``["@", field, value]`` (the one list element whose ``field`` is ``value``)."""
    if isinstance(step, list):
        if not isinstance(container, list):
            return None
        if step[0] == "#":
            return step[1] if 0 <= step[1] < len(container) else None
        hits = [
            n
            for n, e in enumerate(container)
            if isinstance(e, dict) and step[1] in e and minted_key(e[step[1]]) == minted_key(step[2])
        ]
        return hits[0] if len(hits) == 1 else None
    if isinstance(container, dict) and step in container:
        return step
    return None


def resolve(state: Any, path: list[Any]) -> tuple[bool, Any]:
    """(found, value) at ``path`` in ``state``."""
    node = state
    for step in path:
        where = locate(node, step)
        if where is None:
            return False, None
        node = node[where]
    return True, node


def path_text(path: list[Any]) -> str:
    parts = []
    for step in path:
        if isinstance(step, list):
            parts.append(f"[{step[1]}]" if step[0] == "#" else f"[{step[1]}={step[2]}]")
        else:
            parts.append(("." if parts else "") + str(step))
    return "".join(parts) or "(root)"


def path_class(path: list[Any]) -> str:
    """The field class of a container at ``path``: its innermost key's."""
    keys = [s for s in path if not isinstance(s, list)]
    return field_class(keys[-1]) if keys else "EXACT"


def created_candidates(check: dict[str, Any], initial: Any, final: Any, mapping: dict[str, Any]) -> list[Any]:
    """Keys / indices of the final container's elements a ``created`` check may be matched to."""
    found, container = resolve(final, check["path"])
    _, before = resolve(initial, check["path"])
    if not found:
        return []
    if isinstance(container, dict):
        new = [k for k in container if not (isinstance(before, dict) and k in before)]
        if "key" in check and minted_key(check["key"]) not in mapping["minted"]:
            return [k for k in new if k == check["key"]]  # a key the calls chose: exactly that one
        return new
    if isinstance(container, list):
        return list(range(len(container)))
    return []


def record_matches(
    check: dict[str, Any], where: Any, container: Any, mapping: dict[str, Any], threshold: float
) -> bool:
    """Whether the element at ``where`` has the check's content (binding minted ids in ``mapping``).

    A record's ``fields`` (its compared field names) must be exactly the element's; each field in
    ``expected`` is one assertion on its value (a field left out of ``expected`` is not checked).
    """
    saved = snapshot(mapping)
    if "key" in check and not compare_leaf(check["key"], where, "EXACT", threshold, mapping):
        restore(mapping, saved)
        return False
    element = container[where]
    if isinstance(element, dict) and isinstance(check["expected"], dict):
        if "fields" in check and sorted(k for k in element if field_class(k) != "SKIP") != sorted(
            check["fields"]
        ):
            return False
        element = {k: element[k] for k in check["expected"] if k in element}
    if same(check["expected"], element, path_class(check["path"]), threshold, mapping):
        return True
    restore(mapping, saved)
    return False


def match_created(
    checks: list[dict[str, Any]], initial: Any, final: Any, mapping: dict[str, Any], threshold: float
) -> dict[int, Any]:
    """One-to-one matching of the created records to the final state's new elements, by content.

    A depth-first search for an assignment that matches every record (ids minted in the other
    order are bound consistently); when there is none, the greedy partial one, for the score.
    """
    todo = [n for n, c in enumerate(checks) if c["kind"] == "created" and c.get("op", "eq") == "eq"]
    containers = {n: resolve(final, checks[n]["path"])[1] for n in todo}
    budget = [20000]

    def search(i: int, claims: dict[int, Any], greedy: bool) -> dict[int, Any] | None:
        if i == len(todo):
            return claims
        n = todo[i]
        taken = {(json.dumps(checks[m]["path"]), w) for m, w in claims.items()}
        for where in created_candidates(checks[n], initial, final, mapping):
            budget[0] -= 1
            if budget[0] < 0:
                return None
            if (json.dumps(checks[n]["path"]), where) in taken:
                continue
            saved = snapshot(mapping)
            if record_matches(checks[n], where, containers[n], mapping, threshold):
                done = search(i + 1, {**claims, n: where}, greedy)
                if done is not None:
                    return done
                restore(mapping, saved)
                if greedy:
                    return None
        return search(i + 1, claims, greedy) if greedy else None

    full = search(0, {}, False)
    if full is not None:
        return full
    restore(mapping, ({}, set()))
    budget[0] = 20000
    return search(0, {}, True) or {}


def frame_holds(
    check: dict[str, Any],
    checks: list[dict[str, Any]],
    claims: dict[int, Any],
    initial: Any,
    final: Any,
    threshold: float,
) -> bool:
    """Everything in the container at the check's path that no other check covers is as it was."""
    found_i, before = resolve(initial, check["path"])
    found_f, after = resolve(final, check["path"])
    if not (found_i and found_f):
        return False
    cls = path_class(check["path"])
    covered = check["covered"]
    mine = [w for n, w in claims.items() if checks[n]["path"] == check["path"]]
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in before.items():
            if key in covered or field_class(key) == "SKIP":
                continue
            if key not in after or not same(value, after[key], field_class(key), threshold):
                return False
        return all(k in before or k in covered or k in mine or field_class(k) == "SKIP" for k in after)
    if isinstance(before, list) and isinstance(after, list):
        gone = {locate(before, s) for s in covered}
        moved = {locate(after, s) for s in covered if s[0] == "@"} | {s[1] for s in covered if s[0] == "#"}
        kept = [e for n, e in enumerate(before) if n not in gone]
        rest = [e for n, e in enumerate(after) if n not in moved and n not in mine]
        return same(kept, rest, cls, threshold)
    return False


def state_check(
    reference: dict[str, Any], initial: Any, final: Any
) -> tuple[list[list[Any]], dict[str, Any]]:
    """``[description, ok]`` of every state check, and the minted-id mapping the matching found."""
    threshold = reference["threshold"]
    checks = reference["state_checks"]
    mapping: dict[str, Any] = {
        "minted": {minted_key(v) for v in reference["minted"]},
        "to": {},
        "taken": set(),
        "bind": True,
    }
    claims = match_created(checks, initial, final, mapping, threshold)
    mapping["bind"] = False
    out: list[list[Any]] = []
    for n, check in enumerate(checks):
        kind = check["kind"]
        where = path_text(check["path"])
        if kind == "set":
            found, got = resolve(final, check["path"])
            ok = found and same(check["expected"], got, check["class"], threshold, mapping)
            text = f"{where} == {json.dumps(check['expected'], sort_keys=True)[:80]}"
        elif kind == "absent":
            ok = not resolve(final, check["path"])[0]
            text = f"{where} removed"
        elif kind == "created":
            if check.get("op", "eq") == "eq":
                ok = n in claims
            else:
                trial = {**mapping, "to": dict(mapping["to"]), "taken": set(mapping["taken"]), "bind": True}
                container = resolve(final, check["path"])[1]
                ok = any(
                    record_matches(check, w, container, trial, threshold)
                    for w in created_candidates(check, initial, final, trial)
                )
            text = f"{where} has a new {json.dumps(check['expected'], sort_keys=True)[:80]}"
        else:
            ok = frame_holds(check, checks, claims, initial, final, threshold)
            text = f"{where}: nothing else changed"
        if check.get("op", "eq") == "ne":
            ok, text = not ok, f"not ({text})"
        out.append([text, bool(ok)])
    return out, mapping


def arguments_match(
    ref_args: dict[str, Any],
    got_args: dict[str, Any],
    defaults: dict[str, Any],
    threshold: float,
    mapping: dict[str, Any] | None = None,
) -> bool:
    """Critical parameters equal, semantic ones similar, SKIP ones ignored; defaults fill omissions;
    ids the reference's tools minted are compared through ``mapping``."""
    ref_full = {**defaults, **ref_args}
    got_full = {**defaults, **got_args}
    for key in set(ref_full) | set(got_full):
        cls = field_class(key)
        if cls == "SKIP":
            continue
        if key not in ref_full or key not in got_full:
            return False
        if not same(ref_full[key], got_full[key], cls, threshold, mapping):
            return False
    return True


def key_calls_check(
    reference: dict[str, Any], calls: list[dict[str, Any]], mapping: dict[str, Any] | None = None
) -> tuple[int, int, list[str]]:
    """(satisfied, key calls, descriptions of the unsatisfied ones)."""
    used: set[int] = set()
    matched = 0
    missing: list[str] = []
    for ref in reference["key_calls"]:
        defaults = reference["defaults"].get(ref["name"], {})
        hit = False
        for n, call in enumerate(calls):
            if (
                n not in used
                and call.get("name") == ref["name"]
                and call.get("ok")
                and call.get("actor", "agent") == "agent"
                and isinstance(call.get("arguments"), dict)
                and arguments_match(
                    ref["arguments"], call["arguments"], defaults, reference["threshold"], mapping
                )
            ):
                used.add(n)
                hit = True
                break
        if hit == (ref.get("op", "eq") == "eq"):
            matched += 1
        else:
            missing.append(
                ("" if ref.get("op", "eq") == "eq" else "not ")
                + f"{ref['name']}({json.dumps(ref['arguments'], sort_keys=True)})"
            )
    return matched, len(reference["key_calls"]), missing


def policy_check(
    reference: dict[str, Any],
    initial_state: dict[str, Any],
    calls: list[dict[str, Any]],
    initial_text: str | None = None,
) -> tuple[int, int, list[str], list[str]]:
    """Replay the calls that ran with the embedded tools; check every rule on each.

    ``reference["rules"]`` holds rule function names, or ``{"function", "op"}`` entries (``op``
    ``"ne"`` inverts a rule: a weakened verifier the mutation gate must catch).
    ``initial_text``: ``initial_state`` as sorted JSON, when the caller has it already.
    Returns (calls checked, calls with a violation, violations, replay errors).
    """
    memo = globals().setdefault("VERIFY_POLICY_MEMO", {})  # a pure function of these: gates rerun it often
    if initial_text is None:
        initial_text = json.dumps(initial_state, sort_keys=True, ensure_ascii=False)
    rules_and_calls = json.dumps([reference["rules"], calls], sort_keys=True, default=str)
    key = hashlib.sha256(
        (rules_and_calls + initial_text + reference["tools_source"] + reference["policy_source"]).encode()
    ).hexdigest()
    if key in memo:
        return copy.deepcopy(memo[key])
    cache = globals().setdefault("VERIFY_CODE_CACHE", {})  # compiling the tools dominates a replay
    if len(cache) > 32:
        cache.clear()
    for source in (reference["tools_source"], reference["policy_source"]):
        if source not in cache:
            cache[source] = compile(source, "verify_embedded", "exec")
    tools: dict[str, Any] = {"__name__": "verify_tools", "STATE": {}}
    exec(cache[reference["tools_source"]], tools)
    rules: dict[str, Any] = {"__name__": "verify_policy"}
    exec(cache[reference["policy_source"]], rules)
    entries = [r if isinstance(r, dict) else {"function": r, "op": "eq"} for r in reference["rules"]]
    state = json.loads(json.dumps(initial_state))
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
        tools["STATE"] = json.loads(json.dumps(before))  # much faster than deepcopy on a database
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
        for entry in entries:
            rule = entry["function"]
            try:
                message = rules[rule](before, record, after)
            except Exception as exc:
                message = f"the rule raised {type(exc).__name__}: {exc}"
            if entry.get("op", "eq") == "ne":
                message = None if message else "the rule holds (inverted)"
            if message:
                hit = True
                violations.append(f"{rule} (call {n} {name}): {message}")
        violating += int(hit)
        state = after
    if len(memo) > 256:
        memo.clear()
    memo[key] = (checked, violating, violations, errors)
    return checked, violating, violations, errors


def evaluate(reference: dict[str, Any], initial_state: Any, final_state: Any, calls: Any) -> dict[str, Any]:
    """The verdict of the three parts (see the module docstring); never raises."""
    details: dict[str, Any] = {}
    calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    mapping: dict[str, Any] | None = None
    try:
        checks, mapping = state_check(reference, initial_state, final_state)
        state_score = sum(1 for c in checks if c[1]) / len(checks) if checks else 1.0
        state_ok = all(c[1] for c in checks)
        details["state_mismatches"] = [c[0] for c in checks if not c[1]][:20]
    except Exception as exc:
        state_score, state_ok = 0.0, False
        details["state_error"] = f"{type(exc).__name__}: {exc}"
    try:
        matched, total, missing = key_calls_check(reference, calls, mapping)
        key_score = matched / total if total else 1.0
        key_ok = matched == total
        details["missing_key_calls"] = missing
    except Exception as exc:
        key_score, key_ok = 0.0, False
        details["key_calls_error"] = f"{type(exc).__name__}: {exc}"
    try:
        initial_text = json.dumps(initial_state, sort_keys=True, ensure_ascii=False)
    except Exception:
        initial_text = ""
    try:
        checked, violating, violations, errors = policy_check(reference, initial_state, calls, initial_text)
        policy_score = 1.0 - violating / checked if checked else 1.0
        policy_ok = not violations
        details["violations"] = violations[:20]
        details["replay_errors"] = errors[:20]
    except Exception as exc:
        policy_score, policy_ok = 0.0, False
        details["policy_error"] = f"{type(exc).__name__}: {exc}"
    details["initial_state_matches"] = (
        hashlib.sha256(initial_text.encode()).hexdigest() == reference["initial_digest"]
    )
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
    minted_key,
    compare_leaf,
    snapshot,
    restore,
    deep_compare,
    same,
    locate,
    resolve,
    path_text,
    path_class,
    created_candidates,
    record_matches,
    match_created,
    frame_holds,
    state_check,
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


def is_id_key(key: Any) -> bool:
    """Whether a field holds a record id (``id`` or ``*_id``)."""
    name = str(key).lower()
    return name == "id" or name.endswith("_id")


def scalars_of(value: Any, out: set[str] | None = None) -> set[str]:
    """``minted_key`` of every scalar and dict key in ``value``."""
    out = set() if out is None else out
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(minted_key(key))
            scalars_of(item, out)
    elif isinstance(value, list):
        for item in value:
            scalars_of(item, out)
    elif not isinstance(value, bool) and isinstance(value, str | int):
        out.add(minted_key(value))
    return out


def _records(values: Sequence[Any]) -> bool:
    return bool(values) and all(isinstance(v, dict) for v in values)


def _identity_field(elements: Sequence[Mapping[str, Any]]) -> str | None:
    """The id-like field whose value tells the list's records apart (present and unique in each)."""
    if not elements:
        return None
    for key in sorted(elements[0]):
        values = [e.get(key) for e in elements]
        if (
            is_id_key(key)
            and all(isinstance(v, str | int) and not isinstance(v, bool) for v in values)
            and len({minted_key(v) for v in values}) == len(values)
        ):
            return str(key)
    return None


def _set_check(path: list[Any], value: Any, cls: str) -> dict[str, Any]:
    return {"kind": "set", "path": path, "expected": without_skipped(value), "class": cls, "op": "eq"}


def _created_check(path: list[Any], record: Any) -> dict[str, Any]:
    """A new record in the container at ``path``: its fields (names and values), matched by content."""
    expected = without_skipped(record)
    check: dict[str, Any] = {"kind": "created", "path": path, "expected": expected, "op": "eq"}
    if isinstance(expected, dict):
        check["fields"] = sorted(expected)
    return check


def _dict_diff(
    before: Mapping[str, Any], after: Mapping[str, Any], path: list[Any], out: list[dict[str, Any]]
) -> None:
    """Checks for what changed in a dict: changed fields, new records, removed keys, then its frame."""
    covered: list[Any] = []
    collection = _records(list(after.values()))
    for key in list(before) + [k for k in after if k not in before]:
        cls = field_class(key)
        if cls == "SKIP":
            continue
        if key not in after:
            out.append({"kind": "absent", "path": [*path, key], "op": "eq"})
        elif key not in before:
            if collection:
                out.append({**_created_check(path, after[key]), "key": key})
            else:
                out.append(_set_check([*path, key], after[key], cls))
        elif without_skipped(before[key]) == without_skipped(after[key]):
            continue
        elif isinstance(before[key], dict) and isinstance(after[key], dict):
            _dict_diff(before[key], after[key], [*path, key], out)
        elif (
            isinstance(before[key], list)
            and isinstance(after[key], list)
            and _records(before[key] + after[key])
        ):
            _list_diff(before[key], after[key], [*path, key], out)
        else:
            out.append(_set_check([*path, key], after[key], cls))
        covered.append(key)
    if covered:
        out.append({"kind": "frame", "path": path, "covered": covered, "op": "eq"})


def _list_diff(before: list[Any], after: list[Any], path: list[Any], out: list[dict[str, Any]]) -> None:
    """Checks for a list of records: kept ones by multiset, changed ones by id (or position), new ones by content."""
    plain_after = [without_skipped(e) for e in after]
    kept: set[int] = set()
    changed: list[int] = []
    for n, element in enumerate(before):
        plain = without_skipped(element)
        match = next((m for m, e in enumerate(plain_after) if m not in kept and e == plain), None)
        if match is None:
            changed.append(n)
        else:
            kept.add(match)
    ident = _identity_field(before)
    covered: list[Any] = []
    paired: set[int] = set()
    for n in changed:
        element = before[n]
        step: list[Any] = ["@", ident, element[ident]] if ident else ["#", n]
        partner = locate(after, step)
        if partner is None or partner in kept or partner in paired:
            out.append({"kind": "absent", "path": [*path, step], "op": "eq"})
        else:
            paired.add(partner)
            _dict_diff(element, after[partner], [*path, step], out)
        covered.append(step)
    new = [m for m in range(len(after)) if m not in kept and m not in paired]
    for m in new:
        out.append(_created_check(path, plain_after[m]))
    if covered or new:
        out.append({"kind": "frame", "path": path, "covered": covered, "op": "eq"})


def state_checks_of(initial_state: Mapping[str, Any], final_state: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The state checks of a reference run: what it changed or created, and that nothing else changed."""
    checks: list[dict[str, Any]] = []
    _dict_diff(dict(initial_state), dict(final_state), [], checks)
    if not checks:  # the task changes nothing: the whole state must stay as it was
        checks.append({"kind": "frame", "path": [], "covered": [], "op": "eq"})
    return checks


def _id_candidates(check: Mapping[str, Any]) -> list[Any]:
    """Values of a created record that may be ids its tool made up: its key, its id-like fields."""
    found: list[Any] = [check["key"]] if "key" in check else []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if is_id_key(key) and isinstance(item, str | int) and not isinstance(item, bool):
                    found.append(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(check["expected"])
    return found


def minted_ids(
    pack: DomainPack,
    initial_state: Mapping[str, Any],
    calls: Sequence[Mapping[str, Any]],
    checks: Sequence[Mapping[str, Any]],
) -> list[Any]:
    """Ids of created records that the tools made up (counters, uuids), not taken from the calls.

    A candidate (a created record's key or id-like field) is minted when it is nowhere in the
    initial state and no call's arguments named it up to the call after which it first appears
    in the replayed state: such ids depend on the order of creation, so records are matched by
    content and these ids mapped; ids the agent chose are compared exactly.
    """
    known = scalars_of(dict(initial_state))
    pending = {minted_key(v): v for c in checks if c["kind"] == "created" for v in _id_candidates(c)}
    pending = {k: v for k, v in pending.items() if k not in known}
    minted: list[Any] = []
    named: set[str] = set()
    for call, state in _replay_states(pack, initial_state, calls):
        named |= scalars_of(dict(call.get("arguments") or {}))
        present = scalars_of(state)
        for key in [k for k in pending if k in present]:
            value = pending.pop(key)
            if key not in named:
                minted.append(value)
    return minted


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
    checks = state_checks_of(initial_state, reference_final_state)
    reference = {
        "domain": pack.name,
        "threshold": threshold,
        "state_checks": checks,
        "minted": minted_ids(pack, initial_state, reference_calls, checks),
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


_TOOLS_CODE: dict[str, Any] = {}
"""The compiled tools.py of the last pack replayed."""


def _replay_states(
    pack: DomainPack, initial_state: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Run calls with the pack's tools in this process (trusted pack code): (CallRecord, state after) each.

    Like the environment, a call that raises (or that its actor may not make) leaves the state as
    it was and is recorded with ``ok=False``.
    """
    if pack.tools_source not in _TOOLS_CODE:
        _TOOLS_CODE.clear()  # one pack at a time, usually: keep the last one compiled
        _TOOLS_CODE[pack.tools_source] = compile(pack.tools_source, "tools.py", "exec")
    namespace: dict[str, Any] = {"__name__": "reference_tools", "STATE": {}}
    exec(_TOOLS_CODE[pack.tools_source], namespace)
    state = json.loads(json.dumps(dict(initial_state)))
    out: list[tuple[dict[str, Any], dict[str, Any]]] = []
    user_tools = set(pack.user_tool_names)
    for call in calls:
        name = str(call["name"])
        actor = str(call.get("actor") or ("user" if name in user_tools else "agent"))
        arguments = dict(call.get("arguments") or {})
        offered = pack.user_tool_names if actor == "user" else pack.agent_tool_names
        namespace["STATE"] = json.loads(json.dumps(state))
        ok = name in offered
        if ok:
            try:
                namespace[name](**copy.deepcopy(arguments))
            except Exception:
                ok = False
        after = json.loads(json.dumps(namespace["STATE"])) if ok else state
        record = {
            "name": name,
            "arguments": arguments,
            "actor": actor,
            "ok": ok,
            "changed_state": ok and after != state,
        }
        out.append((record, after))
        state = after
    return out


def replay_reference(
    pack: DomainPack, initial_state: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run reference calls with the pack's tools in this process (trusted pack code).

    Returns the ``CallRecord`` dicts and the final state; like the environment, a call that raises
    leaves the state as it was and is recorded with ``ok=False``.
    """
    steps = _replay_states(pack, initial_state, calls)
    final = steps[-1][1] if steps else json.loads(json.dumps(dict(initial_state)))
    return [record for record, _ in steps], final


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

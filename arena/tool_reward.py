"""The one F1 reward of a tool-use trajectory (ASTRA §3 eq. 29-31), hardened against reward hacking.

Every place that asks "did this tool output answer that sub-task?" uses this module: the trainer's
rollout reward, ``arena env verify`` and the sandbox's environment runtime, the evaluation of final
answers, ``arena reward score`` and the exported verl reward. It imports nothing but the standard
library, so ``arena export verl`` ships this very file next to the verl reward.

Rules:

- **Failed calls never solve.** A call solves nothing when the environment marked it failed (an
  exception, a timeout, an unknown tool, bad arguments: ``ok=False``), when it called a mixed-in
  irrelevant tool, or when its result is an error payload: a JSON object (or Python dict literal)
  with a non-empty ``error`` key, or an ``error: ...`` text. So guessing an argument and reading it
  back from ``{"error": "no record with <guess>"}`` earns nothing.
- **Answers match on token boundaries.** Both texts are normalised (Unicode NFKD, case folded,
  accents dropped, punctuation and whitespace ignored) into word and number tokens; CJK characters
  are one token each. The answer's tokens must occur as a contiguous run of the output's tokens.
  Numbers compare as numbers: ``3.0`` = ``3`` and ``1,860,000`` = ``1860000``, but ``3`` != ``13``;
  integers below ``EXACT_BELOW`` (counts, years, ids) must be equal, others match within
  ``REL_TOLERANCE``. A one-number answer also matches a number written with a scale word or unit
  (``$4.5 million`` = ``4500000``). An empty answer never matches.
- **One call solves at most one sub-task, and a sub-task is solved once.** Successful calls are
  matched to the sub-tasks their outputs answer by a maximum bipartite matching M. Then
  ``solved = |M|``, ``recall = solved / n``, ``precision = solved / calls`` (every emitted call
  counts, invalid and failed ones too), ``F1 = 2pr / (p + r)`` (0 when nothing is solved). So
  F1 <= 1; repeating a solved call, spamming calls or answering several sub-tasks from one dump all
  score strictly below the honest trajectory that solves each sub-task with its own call. A sub-task
  listed twice in a job (same question, same answer, as when merged packages share a hop) is one.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from arena import pyast

REL_TOLERANCE = 0.005
"""Largest relative difference at which two numbers match (0.5 %: rounding of a reported figure)."""
EXACT_BELOW = 10_000
"""Integers smaller than this (in magnitude) must be equal: years, counts, ranks, ids."""

_SCALES = {"thousand": 1e3, "k": 1e3, "million": 1e6, "m": 1e6, "billion": 1e9, "bn": 1e9, "trillion": 1e12}
_TOKEN = re.compile(r"\d+(?:\.\d+)?|[^\W\d_]+")
_NUMERIC = re.compile(r"\d+(?:\.\d+)?")
_WHOLE_NUMBER = re.compile(
    r"^[^\w\d+-]*(?P<num>[-+]?(?:\d{1,3}(?:[, \u202f\u00a0]\d{3})+|\d+)(?:\.\d+)?)\s*(?P<rest>.*)$"
)
_SCALED = re.compile(
    r"(?<![\w.])(?P<num>\d+(?:\.\d+)?)\s*(?P<scale>thousand|million|billion|trillion|bn|k|m)(?![\w])"
)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]")
_ERROR_PREFIX = re.compile(r"^\s*error\s*:", re.IGNORECASE)


# --------------------------------------------------------------------------- normalisation


def fold(text: str) -> str:
    """Lower case without accents (``Hôtel`` -> ``hotel``), for cross-language term matching."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def tokens(text: object) -> list[str]:
    """Folded word and number tokens of ``text`` (``1,860,000`` -> ``1860000``; punctuation dropped)."""
    folded = fold(str(text))
    folded = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}\b)", "", folded)
    return _TOKEN.findall(folded)


def match_tokens(text: object) -> list[str]:
    """``tokens`` with every CJK character a token of its own (those scripts put no spaces between words)."""
    out: list[str] = []
    for token in tokens(text):
        if _CJK.search(token):
            out.extend(_split_cjk(token))
        else:
            out.append(token)
    return out


def _split_cjk(token: str) -> list[str]:
    parts: list[str] = []
    run = ""
    for ch in token:
        if _CJK.match(ch):
            if run:
                parts.append(run)
                run = ""
            parts.append(ch)
        else:
            run += ch
    if run:
        parts.append(run)
    return parts


def parse_number(text: object) -> float | None:
    """``text`` as one number if it is one (units, currency, separators, scale words allowed), else None.

    ``'1,860,000'`` -> 1860000; ``'330 metres'`` -> 330; ``'$4.5 million'`` -> 4500000; ``'L-1003'``,
    ``'12 Elm St'`` -> None (a number followed by more than one word is an address, not a quantity).
    """
    if isinstance(text, bool):
        return None
    if isinstance(text, int | float):
        return float(text) if math.isfinite(text) else None
    m = _WHOLE_NUMBER.match(fold(str(text)).strip())
    if m is None:
        return None
    value = float(re.sub(r"[, \u202f\u00a0]", "", m["num"]))
    rest = m["rest"].strip(" .")
    words = rest.split()
    if len(words) > 1 or (words and not re.fullmatch(r"[^\W\d_]+|%|[^\W\d_]+/[^\W\d_]+|°[a-z]?", words[0])):
        return None
    if words and words[0] in _SCALES:
        value *= _SCALES[words[0]]
    return value


def numbers_match(a: float, b: float) -> bool:
    """Equal small integers, or within ``REL_TOLERANCE`` of each other."""
    if a == b:
        return True
    a, b = float(a), float(b)
    if a.is_integer() and b.is_integer() and max(abs(a), abs(b)) < EXACT_BELOW:
        return False
    return abs(a - b) <= REL_TOLERANCE * max(abs(a), abs(b))


# --------------------------------------------------------------------------- matching


def _same_token(want: str, have: str) -> bool:
    if want == have:
        return True
    if _NUMERIC.fullmatch(want) and _NUMERIC.fullmatch(have):
        return numbers_match(float(want), float(have))
    return False


def _contains_run(haystack: Sequence[str], wanted: Sequence[str]) -> bool:
    width = len(wanted)
    first = wanted[0]
    for start in range(len(haystack) - width + 1):
        if _same_token(first, haystack[start]) and all(
            _same_token(w, h) for w, h in zip(wanted[1:], haystack[start + 1 : start + width], strict=True)
        ):
            return True
    return False


def _numbers_in(text: str) -> list[float]:
    """Every number of ``text``, those written with a scale word (``4.5 million``) scaled."""
    folded = fold(text)
    folded = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}\b)", "", folded)
    found = [float(m["num"]) * _SCALES[m["scale"]] for m in _SCALED.finditer(folded)]
    found.extend(float(t) for t in _NUMERIC.findall(folded))
    return found


def answer_in(answer: object, text: object) -> bool:
    """Whether ``text`` states ``answer`` on token boundaries (see the module rules); never an empty answer."""
    wanted = match_tokens(answer)
    if not wanted:
        return False
    haystack = match_tokens(text)
    if _contains_run(haystack, wanted):
        return True
    number = parse_number(answer)
    if number is None:
        return False
    return any(numbers_match(found, number) for found in _numbers_in(str(text)))


def error_payload(text: str) -> bool:
    """Whether a tool result reports a failure: ``error: ...`` text, or an object with a non-empty ``error``.

    The object may be the whole result or its last line (a tool that printed before returning), as JSON
    or as a Python dict literal.
    """
    if _ERROR_PREFIX.match(text):
        return True
    stripped = text.strip()
    candidates = [stripped]
    last = stripped.rsplit("\n", 1)[-1].strip()
    if last != stripped:
        candidates.append(last)
    return any(_has_error_key(_as_object(c)) for c in candidates)


def _as_object(text: str) -> object:
    if not (text.startswith("{") and text.endswith("}")):
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return pyast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _has_error_key(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    return any(str(key).casefold() == "error" and bool(value[key]) for key in value)


# --------------------------------------------------------------------------- the reward


def distinct_jobs(jobs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The job with repeated sub-tasks (same question, same answer: e.g. two merged packages that share a
    hop) kept once, first occurrence first: one call answers a repeated sub-task, and it counts once."""
    seen: set[tuple[str, str]] = set()
    out: list[Mapping[str, Any]] = []
    for job in jobs:
        key = (" ".join(str(job.get("question", "")).casefold().split()), _answer(job).casefold().strip())
        if key not in seen:
            seen.add(key)
            out.append(job)
    return out


def _answer(job: Mapping[str, Any]) -> str:
    answer = job.get("answer")
    return "" if answer is None else str(answer)


def job_answers(jobs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The answers of a job's distinct sub-tasks, in order ('' for a missing one: it never matches)."""
    return [_answer(job) for job in distinct_jobs(jobs)]


@dataclass(frozen=True)
class CallResult:
    """What one executed tool call returned."""

    name: str
    """The tool called, as the model wrote it."""
    content: str
    """The observation text (output, or the error text of a failed call)."""
    ok: bool = True
    """False when the environment marked the call failed (exception, timeout, unknown tool...)."""


@dataclass(frozen=True)
class RewardParts:
    """The F1 reward of one trajectory and its parts."""

    n: int
    """Sub-tasks in the job."""
    solved: int
    """Sub-tasks solved: the size of the maximum matching of successful calls to the sub-tasks they answer."""
    calls: int
    """Tool calls the policy emitted (invalid, failed and mixed-in ones included)."""
    recall: float
    """solved / n (0 for an empty job)."""
    precision: float
    """solved / calls (0 without calls): at most 1."""
    f1: float
    """2pr / (p + r); 0 when nothing is solved."""
    solved_indices: tuple[int, ...] = ()
    """Positions (in the job) of the solved sub-tasks."""


def successful(result: CallResult, irrelevant: Collection[str] = ()) -> bool:
    """A call that may solve a sub-task: marked ok, not a mixed-in tool, not an error payload."""
    return result.ok and result.name not in irrelevant and not error_payload(result.content)


def answers_matrix(
    answers: Sequence[str], results: Sequence[CallResult], irrelevant: Collection[str] = ()
) -> list[list[int]]:
    """For each call, the positions of the sub-tasks its result answers (none for a failed call)."""
    out: list[list[int]] = []
    for result in results:
        if not successful(result, irrelevant):
            out.append([])
            continue
        out.append([j for j, answer in enumerate(answers) if answer_in(answer, result.content)])
    return out


def max_matching(edges: Sequence[Sequence[int]]) -> dict[int, int]:
    """Maximum bipartite matching (Kuhn's augmenting paths): sub-task position -> call position."""
    owner: dict[int, int] = {}

    def augment(call: int, seen: set[int]) -> bool:
        for task in edges[call]:
            if task in seen:
                continue
            seen.add(task)
            if task not in owner or augment(owner[task], seen):
                owner[task] = call
                return True
        return False

    for call in range(len(edges)):
        if edges[call]:
            augment(call, set())
    return owner


def f1_score(
    answers: Sequence[str],
    results: Sequence[CallResult],
    emitted_calls: int | None = None,
    *,
    irrelevant: Collection[str] = (),
) -> RewardParts:
    """ASTRA eq. 30-31 over one trajectory's executed calls, with the rules of this module.

    ``emitted_calls`` (default: one per result) counts every call the policy emitted, those that never
    ran (an unparseable call block, a call cut off by the length budget) included; it cannot be fewer
    than the results.
    """
    calls = len(results) if emitted_calls is None else emitted_calls
    if calls < len(results):
        raise ValueError(f"{len(results)} tool results but only {calls} emitted calls")
    n = len(answers)
    matching = max_matching(answers_matrix(answers, results, irrelevant))
    solved = len(matching)
    if solved == 0:
        return RewardParts(n=n, solved=0, calls=calls, recall=0.0, precision=0.0, f1=0.0)
    recall = solved / n
    precision = solved / calls
    f1 = 2 * precision * recall / (precision + recall)
    return RewardParts(
        n=n,
        solved=solved,
        calls=calls,
        recall=recall,
        precision=precision,
        f1=f1,
        solved_indices=tuple(sorted(matching)),
    )

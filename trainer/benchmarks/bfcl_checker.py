"""bfcl-eval's own loaders and checkers, run under the bfcl virtualenv (never imported by Arena).

bfcl-eval pins numpy, networkx and filelock below Arena's, so it lives in ``.venv-bfcl``
(``scripts/install_bfcl.sh``) and ``trainer.benchmarks.bfcl`` runs this file there as a
subprocess, isolated (``python -I``), speaking JSON on stdin/stdout. It imports only the standard
library and ``bfcl_eval``:

    items CATEGORY[,CATEGORY...] [LIMIT]
        -> {"items": [{id, category, messages, functions, tools, ground_truth}]}  (LIMIT per category;
           multi-turn items also carry turns, missed, initial_config, involved_classes)
    check < {"items": [{id, category, functions, ground_truth, calls}]}
        -> {"model_name": ..., "results": [{id, valid, errors}]}  (in the order sent)
    serve   JSON lines on stdin, one answer line each on stdout, for multi-turn episodes:
        {"op": "execute", "namespace": NS, "item": {...}, "calls": [CALL, ...]} -> {"results": [...]}
        {"op": "check", "item": {..., "calls": [[[CALL, ...], ...], ...]}} -> {id, valid, errors}
        {"op": "forget", "namespace": NS} -> {"forgot": N}

Anything bfcl-eval prints goes to stderr; stdout carries the one JSON answer.

``items`` loads the category with bfcl-eval's ``load_dataset_entry`` (with its Python-syntax hint on
every function doc, as its own generation does) and its ``possible_answer`` file, and writes the
tools as its OpenAI function-calling handler sends them (``convert_to_tool``, ``GORILLA_TO_OPENAPI``:
'.' in a name becomes '_'). ``check`` scores ``calls`` (``[{name: {arg: value}}]``) as its
``eval_runner`` does: AST categories with ``ast_checker`` after ``is_function_calling_format_output``,
relevance categories by whether any call was made. The model name handed to the checker is an
OpenAI function-calling entry of its ``MODEL_CONFIG_MAPPING`` (names with '.' were sent with '_').

Multi-turn categories run bfcl-eval's simulated APIs (file system, trading, travel...): ``execute``
runs one step's calls with its ``execute_multi_turn_func_call``, whose class instances live in that
module's globals under the given namespace (a trial), so state carries from call to call as in its
own inference loop; ``check`` scores a trial's calls -- per turn, per step, each a call string
``name(arg=value, ...)`` -- as its ``eval_runner`` does (a trial cut short fails as force-terminated;
then ``multi_turn_checker``, which executes the calls and the ground truth afresh and compares
states and responses turn by turn). Each check uses its own namespace: the checker's instances are
globals too, and a second trial of one item must not find the first one's.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

# bfcl-eval creates result/score folders beside its package at import unless told where: a
# temporary folder, removed when this process ends.
if "BFCL_PROJECT_ROOT" not in os.environ:
    _ROOT = tempfile.TemporaryDirectory(prefix="arena-bfcl-")
    os.environ["BFCL_PROJECT_ROOT"] = _ROOT.name

RELEVANCE = ("irrelevance", "live_irrelevance", "live_relevance")
MULTI_TURN = ("multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context")
_CHECKS = iter(range(1 << 62))
"""Fresh namespaces for the checker's instances (one per check)."""


def _model_name() -> str:
    """An OpenAI function-calling model of bfcl-eval's config (its '.' -> '_' convention applies)."""
    from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING

    fc = sorted(
        name
        for name, cfg in MODEL_CONFIG_MAPPING.items()
        if cfg.is_fc_model and cfg.underscore_to_dot and "/" not in name and "_" not in name
    )
    preferred = [n for n in fc if n.startswith("gpt-")]
    return (preferred or fc)[0]


def items(categories: list[str], limit: int | None) -> dict[str, Any]:
    return {"items": [item for category in categories for item in _category_items(category, limit)]}


def _category_items(category: str, limit: int | None) -> list[dict[str, Any]]:
    from bfcl_eval.constants.enums import ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.model_handler.utils import convert_to_tool
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    entries = load_dataset_entry(category)[:limit]
    truth = (
        {}
        if category in RELEVANCE
        else {e["id"]: e["ground_truth"] for e in load_ground_truth_entry(category)}
    )

    def tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return list(convert_to_tool(functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS))

    out = []
    for e in entries:
        item = {
            "id": e["id"],
            "category": category,
            "messages": e["question"][0],
            "functions": e["function"],
            "tools": tools(e["function"]),
            "ground_truth": truth.get(e["id"]),
        }
        if category in MULTI_TURN:
            item |= {
                "turns": e["question"],
                "missed": {turn: tools(docs) for turn, docs in (e.get("missed_function") or {}).items()},
                "initial_config": e["initial_config"],
                "involved_classes": e["involved_classes"],
            }
        out.append(item)
    return out


def _entry(item: dict[str, Any]) -> dict[str, Any]:
    """The fields of a multi-turn test entry bfcl-eval's executor and checker read."""
    return {
        "id": item["id"],
        "initial_config": item["initial_config"],
        "involved_classes": item["involved_classes"],
    }


def execute(namespace: str, item: dict[str, Any], calls: list[str]) -> dict[str, Any]:
    """One step's calls in the namespace's instances (made from the item's initial config at first use)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    results, _ = execute_multi_turn_func_call(
        calls,
        item["initial_config"],
        item["involved_classes"],
        namespace,
        item["id"],
        long_context="long_context" in item["category"],
    )
    return {"results": [str(r) for r in results]}


def forget(namespace: str) -> dict[str, Any]:
    """Drop the namespace's instances (a finished trial)."""
    import re

    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    prefix = re.sub(r"[-./:]", "_", f"{namespace}_")
    names = [n for n in vars(multi_turn_utils) if n.startswith(prefix) and n.endswith("_instance")]
    for name in names:
        delattr(multi_turn_utils, name)
    return {"forgot": len(names)}


def _check_multi_turn(item: dict[str, Any]) -> dict[str, Any]:
    """A trial's calls (per turn, per step) as ``eval_runner`` scores a multi-turn entry."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    calls, truth = item["calls"], item["ground_truth"]
    if len(calls) != len(truth):
        return {
            "id": item["id"],
            "valid": False,
            "errors": [f"force-terminated: {len(calls)} of {len(truth)} turns answered"],
        }
    decoded = [[step for step in turn if step] for turn in calls]
    namespace = f"arena_check_{next(_CHECKS)}"
    try:
        result = multi_turn_checker(decoded, truth, _entry(item), item["category"], namespace)
    finally:
        forget(f"{namespace}_eval")
    valid = bool(result.get("valid"))
    why = f"{result.get('error_type', '')}: {result.get('error_message', '')}".strip(": ")
    return {"id": item["id"], "valid": valid, "errors": [] if valid else [why]}


def _check_one(item: dict[str, Any], model_name: str) -> dict[str, Any]:
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    calls, category = item["calls"], item["category"]
    if category in MULTI_TURN:
        return _check_multi_turn(item)
    if category in RELEVANCE:
        called = not is_empty_output(calls)
        valid = not called if "irrelevance" in category else called
        return {
            "id": item["id"],
            "valid": valid,
            "errors": [] if valid else ["function call" if called else "no call"],
        }
    if not is_function_calling_format_output(calls):
        return {"id": item["id"], "valid": False, "errors": ["Did not output in the specified format."]}
    result = ast_checker(
        item["functions"], calls, item["ground_truth"], Language.PYTHON, category, model_name
    )
    return {
        "id": item["id"],
        "valid": bool(result["valid"]),
        "errors": [str(e) for e in result.get("error", [])],
    }


def check(payload: dict[str, Any]) -> dict[str, Any]:
    model_name = _model_name()
    return {"model_name": model_name, "results": [_check_one(i, model_name) for i in payload["items"]]}


def serve(out: Any) -> None:
    """Answer one JSON request per stdin line with one JSON line, until stdin closes."""
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        op = request.get("op")
        try:
            if op == "execute":
                answer = execute(request["namespace"], request["item"], request["calls"])
            elif op == "check":
                answer = _check_multi_turn(request["item"])
            elif op == "forget":
                answer = forget(request["namespace"])
            else:
                answer = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # one bad request must not end the server: the caller reads why
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def main(argv: list[str]) -> int:
    out, sys.stdout = sys.stdout, sys.stderr  # keep stdout for the answer alone
    if argv == ["serve"]:
        serve(out)
        return 0
    if argv[:1] == ["items"] and len(argv) in (2, 3):
        answer = items(argv[1].split(","), int(argv[2]) if len(argv) == 3 else None)
    elif argv == ["check"]:
        answer = check(json.load(sys.stdin))
    else:
        print(
            "usage: bfcl_checker.py items CATEGORY[,CATEGORY] [LIMIT] | check < items.json | serve",
            file=sys.stderr,
        )
        return 2
    json.dump(answer, out)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

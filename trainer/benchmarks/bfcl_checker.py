"""bfcl-eval's own loaders and checkers, run under the bfcl virtualenv (never imported by Arena).

bfcl-eval pins numpy, networkx and filelock below Arena's, so it lives in ``.venv-bfcl``
(``scripts/install_bfcl.sh``) and ``trainer.benchmarks.bfcl`` runs this file there as a
subprocess, isolated (``python -I``), speaking JSON on stdin/stdout. It imports only the standard
library and ``bfcl_eval``:

    items CATEGORY[,CATEGORY...] [LIMIT]
        -> {"items": [{id, category, messages, functions, tools, ground_truth}]}  (LIMIT per category)
    check < {"items": [{id, category, functions, ground_truth, calls}]}
        -> {"model_name": ..., "results": [{id, valid, errors}]}  (in the order sent)

Anything bfcl-eval prints goes to stderr; stdout carries the one JSON answer.

``items`` loads the category with bfcl-eval's ``load_dataset_entry`` (with its Python-syntax hint on
every function doc, as its own generation does) and its ``possible_answer`` file, and writes the
tools as its OpenAI function-calling handler sends them (``convert_to_tool``, ``GORILLA_TO_OPENAPI``:
'.' in a name becomes '_'). ``check`` scores ``calls`` (``[{name: {arg: value}}]``) as its
``eval_runner`` does: AST categories with ``ast_checker`` after ``is_function_calling_format_output``,
relevance categories by whether any call was made. The model name handed to the checker is an
OpenAI function-calling entry of its ``MODEL_CONFIG_MAPPING`` (names with '.' were sent with '_').
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

# bfcl-eval creates result/score folders beside its package at import unless told where.
os.environ.setdefault("BFCL_PROJECT_ROOT", tempfile.mkdtemp(prefix="arena-bfcl-"))

RELEVANCE = ("irrelevance", "live_irrelevance", "live_relevance")


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
    out = []
    for e in entries:
        out.append(
            {
                "id": e["id"],
                "category": category,
                "messages": e["question"][0],
                "functions": e["function"],
                "tools": convert_to_tool(e["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS),
                "ground_truth": truth.get(e["id"]),
            }
        )
    return out


def _check_one(item: dict[str, Any], model_name: str) -> dict[str, Any]:
    from bfcl_eval.constants.enums import Language
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output

    calls, category = item["calls"], item["category"]
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


def main(argv: list[str]) -> int:
    out, sys.stdout = sys.stdout, sys.stderr  # keep stdout for the answer alone
    if argv[:1] == ["items"] and len(argv) in (2, 3):
        answer = items(argv[1].split(","), int(argv[2]) if len(argv) == 3 else None)
    elif argv == ["check"]:
        answer = check(json.load(sys.stdin))
    else:
        print(
            "usage: bfcl_checker.py items CATEGORY[,CATEGORY] [LIMIT] | check < items.json", file=sys.stderr
        )
        return 2
    json.dump(answer, out)
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

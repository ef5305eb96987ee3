"""Domain packs: interactive domains for the EigenData track (issue 6, EigenData §4).

A domain pack is a folder::

    domain.yaml    name, description, policy (the policy document, Markdown text),
                   agent_tools / user_tools (names of functions in tools.py; user tools are the
                   dual-control actions only the customer can take)
    tools.py       the tools: typed functions over a global ``STATE`` dict (the database); a
                   tool refuses by raising. Standard library only, no ``from __future__``: the
                   file runs as is in the sandbox after ``STATE = json.loads(...)`` (it is
                   ``InteractiveSpec.code``). Bind the global with the idiom
                   ``STATE: dict[str, Any] = globals().setdefault("STATE", {})``, never rebind it.
    policy.py      policy rules as code: ``rule_<name>(state_before, call, state_after)``
                   returning a violation message or None, checked for every executed call (the
                   rule's description is its docstring's first line). Standard library only.
    generator.py   ``generate(seed: int, size: str) -> dict``: the seeded, JSON-able database;
                   optionally ``reference_task(state, seed) -> {"user_instructions",
                   "requirements", "calls"}``, a hand-picked task with its reference calls.

``domain.yaml`` may add a ``synthesis:`` section (``synthesis.eigen.spec.SynthesisSpec``):
what the generic EigenData workers need to synthesise tasks and dialogues for the pack, as data --

    customer:     collection, id_field, lookup_tool / lookup_argument / lookup_field (how the
                  agent finds the customer from what the user says; lookup_pattern, a regex, finds
                  the value in a message), details_tool, known_fields (known_info key -> customer
                  field: what the simulated user knows), verify_tool + confirm_tool +
                  confirm_arguments (an identity check: the agent starts it, the user completes it
                  in the app), ask (how the agent asks for the lookup value)
    entities:     collection, id_field, noun, owner_field, read_tool, list_tool, references
                  (field -> collection the agent also reads before deciding)
    read_tools:   tools that only read; helper_tools: state-changing agent tools never counted
                  as an unasked-for action (notes, transfers)
    user_actions: user tool -> what the agent asks the user to do in the app (dual control)
    templates:    kind, entity (collection; none: the customer's account), summary, requirement
                  (what the user says), confirm (how the agent proposes it), calls (name, actor,
                  arguments), picks (named sub-records: field, where, highest), choices (seeded
                  values), must_not; ``{placeholders}`` name the entity's fields, customer.<field>,
                  a pick's or choice's fields, or today
    refusal_rate: chance a task also carries a request the policy refuses

Whether a goal is allowed is never declared: the policy rules decide (the workers dry-run each
template instance and check the rules). ``load_pack`` checks that every tool named exists on the
right side, every collection exists in ``generate(0, "small")``, and every template applies to
some entity of that database.

OpenAI tool schemas are derived from each function's signature, type hints and docstring
(``schema_of``), never written by hand. ``load_pack`` checks all of it and raises a
``DomainPackError`` naming the file, the field and the fix.
"""

from __future__ import annotations

import ast
import inspect
import json
import random
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import samples
from arena import pyast
from synthesis.eigen.spec import SynthesisSpec, instantiate

PACK_FILES = ("domain.yaml", "tools.py", "policy.py", "generator.py")
SIZES = ("small", "medium", "large")
BUILTIN_DIR = Path(samples.__file__).resolve().parent / "domains"
STATE_IDIOM = 'STATE: dict[str, Any] = globals().setdefault("STATE", {})'


class DomainPackError(ValueError):
    """A pack that cannot be loaded: which file, which field, what is wrong, how to fix it."""

    def __init__(self, file: str | None, problem: str, *, field: str | None = None, fix: str = "") -> None:
        self.file = file
        self.field = field
        self.problem = problem
        self.fix = fix
        where = ": ".join(p for p in (file, f"field {field!r}" if field else None) if p)
        super().__init__(f"{where + ': ' if where else ''}{problem}" + (f". Fix: {fix}" if fix else ""))

    def in_file(self, file: str) -> DomainPackError:
        """The same error, attributed to ``file`` (when it names none yet)."""
        return self if self.file else DomainPackError(file, self.problem, field=self.field, fix=self.fix)


class RuleInfo(BaseModel):
    """One policy rule of a pack."""

    name: Annotated[str, Field(description="Rule name: the function's name without 'rule_'.")]
    function: Annotated[str, Field(description="The function in policy.py, 'rule_<name>'.")]
    description: Annotated[str, Field(description="What the rule demands (docstring's first line).")]


class DomainManifest(BaseModel):
    """The fields of ``domain.yaml``."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", description="Domain name (snake_case).")]
    description: Annotated[str, Field(min_length=1, description="One paragraph on the setting.")]
    policy: Annotated[str, Field(min_length=1, description="The policy document the agent follows.")]
    agent_tools: Annotated[
        list[str], Field(min_length=1, description="Functions of tools.py the agent may call.")
    ]
    user_tools: list[str] = Field(default_factory=list, description="Functions only the user can call.")
    synthesis: SynthesisSpec | None = Field(
        default=None, description="Declarations for EigenData synthesis (see the module docstring)."
    )
    source: str | None = Field(
        default=None,
        description="An imported domain this pack stands for, e.g. 'tau2:airline@<db sha256 prefix>' "
        "(`arena domain import tau2`): its tools are that domain's own code, run in the sandbox, its "
        "database the lake object of that hash (tau2_import.json beside domain.yaml names it).",
    )


class DomainPack(BaseModel):
    """A loaded domain pack."""

    name: str
    description: str
    policy_text: Annotated[str, Field(description="The policy document (system prompt material).")]
    agent_tools: Annotated[list[dict[str, Any]], Field(description="OpenAI specs of the agent tools.")]
    user_tools: Annotated[list[dict[str, Any]], Field(description="OpenAI specs of the user tools.")]
    tools_source: Annotated[str, Field(description="tools.py text: InteractiveSpec.code.")]
    policy_source: Annotated[str, Field(description="policy.py text: the rules, embedded in verifiers.")]
    generator_source: Annotated[str, Field(description="generator.py text.")]
    rules: Annotated[list[RuleInfo], Field(description="Policy rules in definition order.")]
    path: Annotated[str, Field(description="Folder the pack was loaded from.")] = ""
    synthesis: SynthesisSpec | None = Field(
        default=None, description="domain.yaml's synthesis declarations (None: the pack declares none)."
    )

    def declarations(self) -> SynthesisSpec:
        """The synthesis declarations; ``DomainPackError`` when the pack has none."""
        if self.synthesis is None:
            raise DomainPackError(
                "domain.yaml",
                f"pack {self.name!r} declares no synthesis section",
                field="synthesis",
                fix="add 'synthesis:' (customer, entities, templates; see synthesis/eigen/packs.py)",
            )
        return self.synthesis

    @property
    def agent_tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.agent_tools]

    @property
    def user_tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.user_tools]

    def generate(self, seed: int, size: str = "small") -> dict[str, Any]:
        """The pack's database for ``seed`` (runs generator.py in this process: trusted pack code)."""
        state = _namespace(self.generator_source, "generator.py")["generate"](seed, size)
        return json.loads(json.dumps(state))

    def reference_task(self, state: dict[str, Any], seed: int) -> dict[str, Any]:
        """The pack's hand-picked task on ``state`` (generator.py's ``reference_task``)."""
        namespace = _namespace(self.generator_source, "generator.py")
        if "reference_task" not in namespace:
            raise DomainPackError(
                "generator.py",
                f"pack {self.name!r} defines no reference_task(state, seed)",
                fix="define it, or pass the task's calls explicitly",
            )
        return dict(namespace["reference_task"](state, seed))


# --------------------------------------------------------------------------- schemas

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(tp: Any, where: str) -> dict[str, Any]:
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        kinds = {_JSON_TYPES.get(type(a)) for a in args}
        if None in kinds or len(kinds) != 1:
            raise DomainPackError(None, f"{where}: Literal values must all be str, int, float or bool")
        return {"type": kinds.pop(), "enum": list(args)}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _type_schema(rest[0], where)
        raise DomainPackError(None, f"{where}: unions other than Optional[X] / X | None are not supported")
    if tp is list or origin is list:
        return {"type": "array", "items": _type_schema(args[0], where) if args else {}}
    if tp is dict or origin is dict:
        return {"type": "object"}
    raise DomainPackError(
        None,
        f"{where}: unsupported type {tp!r}",
        fix="use str, int, float, bool, list[X], Literal[...] or X | None",
    )


_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$"
)
_ARG = re.compile(r"^(\s*)(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {arg: description}) of a Google-style docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent = -1
    for line in lines:
        header = _SECTION.match(line)
        if header and not line.startswith((" ", "\t")):
            section, current, arg_indent = header.group(1).lower(), None, -1
            continue
        if section is None:
            description.append(line)
        elif section in ("args", "arguments", "parameters") and line.strip():
            match = _ARG.match(line)
            indent = len(line) - len(line.lstrip())
            if match and (arg_indent < 0 or indent <= arg_indent):
                arg_indent = indent
                current = match.group(2).lstrip("*")
                args[current] = match.group(3).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line.strip()}".strip()
    text = " ".join(" ".join(description).split())
    return text, args


def schema_of(function: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI tool spec of ``function``: name, docstring description, parameters from type hints.

    Every parameter needs a type hint and a line in the docstring's ``Args:`` section; a parameter
    with a default is optional (its default is stated unless None). Supported types: str, int,
    float, bool, list[X], dict, Literal[...] (an enum) and Optional[X] / X | None.
    """
    name = getattr(function, "__name__", repr(function))
    doc = inspect.getdoc(function)
    if not doc:
        raise DomainPackError(
            None,
            f"function {name} has no docstring",
            field=name,
            fix="add a docstring with a description and Args:",
        )
    description, arg_docs = _parse_docstring(doc)
    if not description:
        raise DomainPackError(None, f"function {name}'s docstring has no description", field=name)
    try:
        hints = get_type_hints(function)
    except Exception as exc:
        raise DomainPackError(
            None,
            f"function {name}: type hints do not resolve ({exc})",
            field=name,
            fix="import the names used",
        ) from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(function).parameters.values():
        where = f"{name}({param.name})"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise DomainPackError(
                None,
                f"{where}: *args, **kwargs and positional-only parameters cannot be tool arguments",
                field=name,
                fix="use plain named parameters",
            )
        if param.name not in hints:
            raise DomainPackError(
                None,
                f"parameter {param.name!r} of {name} has no type hint",
                field=name,
                fix=f"annotate it, e.g. '{param.name}: str'",
            )
        try:
            prop = _type_schema(hints[param.name], where)
        except DomainPackError as exc:
            raise DomainPackError(None, exc.problem, field=name, fix=exc.fix) from exc
        if param.name not in arg_docs or not arg_docs[param.name]:
            raise DomainPackError(
                None,
                f"parameter {param.name!r} of {name} is not described",
                field=name,
                fix=f"add '{param.name}: <what it is>' under 'Args:' in the docstring",
            )
        prop["description"] = arg_docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
        elif param.default is not None:
            try:
                json.dumps(param.default)
            except TypeError:
                pass
            else:
                prop["default"] = param.default
        properties[param.name] = prop
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


# --------------------------------------------------------------------------- loading


def _check_source(source: str, file: str) -> ast.Module:
    """Parse ``source``; only standard-library imports and no ``from __future__``."""
    try:
        tree = pyast.parse(source, filename=file)
    except SyntaxError as exc:
        raise DomainPackError(
            file, f"syntax error at line {exc.lineno}: {exc.msg}", fix="correct the Python"
        ) from exc
    for node in ast.walk(tree):
        modules: list[str] = []
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                modules = ["." * node.level + (node.module or "")]
            else:
                modules = [node.module or ""]
        for module in modules:
            top = module.split(".")[0]
            if module == "__future__":
                raise DomainPackError(
                    file,
                    f"line {line}: 'from __future__' cannot be used",
                    fix="remove it: the file runs after other statements in the sandbox (Python 3.11 accepts X | None)",
                )
            if not top or top not in sys.stdlib_module_names:
                raise DomainPackError(
                    file,
                    f"line {line}: import of {module!r}, not in the standard library",
                    fix="use the standard library only: the code runs in the sandbox",
                )
    return tree


def _namespace(source: str, file: str, state: dict[str, Any] | None = None) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"arena_domain_{file.removesuffix('.py')}"}
    if state is not None:
        namespace["STATE"] = state
    try:
        exec(compile(source, file, "exec"), namespace)
    except Exception as exc:
        raise DomainPackError(file, f"running the file failed: {type(exc).__name__}: {exc}") from exc
    return namespace


def _read(folder: Path, file: str) -> str:
    path = folder / file
    if not path.is_file():
        present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        raise DomainPackError(
            file,
            f"missing from {folder} (found: {present})",
            fix=f"a domain pack folder holds {', '.join(PACK_FILES)}",
        )
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DomainPackError(file, f"cannot be read: {exc}", fix="save it as UTF-8 text") from exc


def _manifest(text: str) -> DomainManifest:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise DomainPackError(
            "domain.yaml", f"invalid YAML{at}: {problem}", fix="correct the YAML syntax"
        ) from exc
    if not isinstance(data, dict):
        raise DomainPackError(
            "domain.yaml",
            f"must be a mapping, got {type(data).__name__}",
            fix="write 'name:', 'description:', 'policy:', 'agent_tools:', 'user_tools:' keys",
        )
    try:
        return DomainManifest.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        fixes = {
            "missing": "add it",
            "extra_forbidden": f"remove it; allowed fields: {sorted(DomainManifest.model_fields)}",
            "string_pattern_mismatch": "use snake_case letters, digits and underscores",
        }
        description = DomainManifest.model_fields.get(str(first["loc"][0])) if first["loc"] else None
        hint = f" ({description.description})" if description is not None and description.description else ""
        raise DomainPackError(
            "domain.yaml",
            f"{first['msg']}{hint}",
            field=field,
            fix=fixes.get(first["type"], "correct the value"),
        ) from exc


def _tools(source: str, manifest: DomainManifest) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    _check_source(source, "tools.py")
    sentinel: dict[str, Any] = {}
    namespace = _namespace(source, "tools.py", sentinel)
    if namespace.get("STATE") is not sentinel:
        raise DomainPackError(
            "tools.py",
            "rebinds the global STATE at module level (it would wipe the database)",
            field="STATE",
            fix=f"bind it with `{STATE_IDIOM}` or not at all",
        )
    overlap = sorted(set(manifest.agent_tools) & set(manifest.user_tools))
    if overlap:
        raise DomainPackError(
            "domain.yaml",
            f"{overlap} listed as both agent and user tools",
            field="user_tools",
            fix="each tool belongs to one side",
        )
    specs: dict[str, list[dict[str, Any]]] = {"agent_tools": [], "user_tools": []}
    for field in ("agent_tools", "user_tools"):
        for name in getattr(manifest, field):
            function = namespace.get(name)
            if not name.isidentifier() or not inspect.isfunction(function) or name.startswith("_"):
                raise DomainPackError(
                    "tools.py",
                    f"domain.yaml {field} names {name!r}, but tools.py defines no public function {name}",
                    field=field,
                    fix=f"define def {name}(...) in tools.py or remove it from {field}",
                )
            try:
                specs[field].append(schema_of(function))
            except DomainPackError as exc:
                raise exc.in_file("tools.py") from exc
    return specs["agent_tools"], specs["user_tools"]


def _rules(source: str) -> list[RuleInfo]:
    tree = _check_source(source, "policy.py")
    namespace = _namespace(source, "policy.py")
    rules: list[RuleInfo] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("rule_"):
            continue
        function = namespace[node.name]
        params = list(inspect.signature(function).parameters)
        if len(params) != 3:
            raise DomainPackError(
                "policy.py",
                f"{node.name} takes {params}",
                field=node.name,
                fix="rules take (state_before, call, state_after) and return a message or None",
            )
        doc = inspect.getdoc(function)
        if not doc:
            raise DomainPackError(
                "policy.py",
                f"{node.name} has no docstring",
                field=node.name,
                fix="add a docstring whose first line states the rule",
            )
        rules.append(
            RuleInfo(
                name=node.name.removeprefix("rule_"), function=node.name, description=doc.splitlines()[0]
            )
        )
    return rules


def _check_generator(source: str) -> dict[str, Any]:
    _check_source(source, "generator.py")
    namespace = _namespace(source, "generator.py")
    generate = namespace.get("generate")
    if not inspect.isfunction(generate):
        raise DomainPackError(
            "generator.py",
            "defines no generate function",
            field="generate",
            fix="define generate(seed: int, size: str) -> dict returning the JSON database",
        )
    try:
        state = generate(0, "small")
        json.dumps(state)
    except Exception as exc:
        raise DomainPackError(
            "generator.py",
            f"generate(0, 'small') failed: {type(exc).__name__}: {exc}",
            field="generate",
            fix="return a JSON-able dict (str keys; str, numbers, bools, None, lists, dicts)",
        ) from exc
    if not isinstance(state, dict):
        raise DomainPackError(
            "generator.py",
            f"generate(0, 'small') returned {type(state).__name__}",
            field="generate",
            fix="return a dict (the STATE the tools work on)",
        )
    return state


def _synthesis_error(problem: str, field: str, fix: str) -> DomainPackError:
    return DomainPackError("domain.yaml", problem, field=f"synthesis.{field}", fix=fix)


def _check_synthesis(manifest: DomainManifest, state: dict[str, Any]) -> None:
    """Every tool the declarations name exists on its side; collections exist; templates apply."""
    spec = manifest.synthesis
    if spec is None:
        return
    agent, user = set(manifest.agent_tools), set(manifest.user_tools)

    def tool(name: str | None, field: str, side: set[str], label: str) -> None:
        if name is not None and name not in side:
            raise _synthesis_error(
                f"names {name!r}, not one of the {label} tools {sorted(side)}",
                field,
                f"list {name} under {label}_tools or name another tool",
            )

    customer = spec.customer
    tool(customer.lookup_tool, "customer.lookup_tool", agent, "agent")
    tool(customer.details_tool, "customer.details_tool", agent, "agent")
    tool(customer.verify_tool, "customer.verify_tool", agent, "agent")
    tool(customer.confirm_tool, "customer.confirm_tool", user, "user")
    for n, entity in enumerate(spec.entities):
        tool(entity.read_tool, f"entities[{n}].read_tool", agent, "agent")
        tool(entity.list_tool, f"entities[{n}].list_tool", agent, "agent")
    for name in spec.read_tools:
        tool(name, "read_tools", agent | user, "agent or user")
    for name in spec.helper_tools:
        tool(name, "helper_tools", agent, "agent")
    for name in spec.user_actions:
        tool(name, "user_actions", user, "user")
    for n, collection in enumerate([customer.collection, *(e.collection for e in spec.entities)]):
        rows = state.get(collection)
        where = "customer.collection" if n == 0 else f"entities[{n - 1}].collection"
        if not isinstance(rows, dict) or not all(isinstance(r, dict) for r in rows.values()):
            raise _synthesis_error(
                f"{collection!r} is not a collection {{id: record}} of generate(0, 'small')",
                where,
                f"name a key of the database: {sorted(state)}",
            )
    collections = {e.collection for e in spec.entities}
    customers = state[customer.collection]
    for n, template in enumerate(spec.templates):
        field = f"templates[{n}]"
        if template.entity is not None and template.entity not in collections:
            raise _synthesis_error(
                f"entity {template.entity!r} is not declared under entities",
                f"{field}.entity",
                f"declare it or use one of {sorted(collections)}",
            )
        if template.requirement.rstrip().endswith("}"):
            raise _synthesis_error(
                "the requirement ends with a placeholder (it cannot be read back from a message)",
                f"{field}.requirement",
                "end it with literal text, e.g. a full stop",
            )
        for k, call in enumerate(template.calls):
            tool(call.name, f"{field}.calls[{k}].name", agent if call.actor == "agent" else user, call.actor)
            if call.actor == "user" and call.name not in spec.user_actions:
                raise _synthesis_error(
                    f"user tool {call.name!r} has no entry in user_actions (what the agent asks the user to do)",
                    "user_actions",
                    f"add '{call.name}: <instruction>'",
                )
        if not _applies(template, state, spec):
            raise _synthesis_error(
                f"template {template.kind!r} applies to no entity of generate(0, 'small') "
                "(a placeholder names a missing field, or a pick finds nothing)",
                field,
                "check its placeholders against the records' fields",
            )
    if not customers:
        raise _synthesis_error(
            "generate(0, 'small') has no customers", "customer.collection", "generate some"
        )


def _applies(template: Any, state: dict[str, Any], spec: SynthesisSpec) -> bool:
    customers = state[spec.customer.collection]
    entity = spec.entity(template.entity)
    for customer_id, customer in customers.items():
        if entity is None:
            records: list[tuple[str | None, dict[str, Any] | None]] = [(None, None)]
        else:
            records = [
                (key, row)
                for key, row in state[entity.collection].items()
                if entity.owner_field is None or row.get(entity.owner_field) == customer_id
            ]
        for key, row in records:
            if instantiate(template, row, customer, str(state.get("today", "")), random.Random(0), key):
                return True
    return False


def load_pack(path: str | Path) -> DomainPack:
    """Load and check the domain pack in folder ``path``; ``DomainPackError`` says what to fix."""
    folder = Path(path)
    if not folder.is_dir():
        raise DomainPackError(
            None, f"{folder} is not a folder", fix=f"pass a folder holding {', '.join(PACK_FILES)}"
        )
    texts = {file: _read(folder, file) for file in PACK_FILES}
    manifest = _manifest(texts["domain.yaml"])
    agent_tools, user_tools = _tools(texts["tools.py"], manifest)
    rules = _rules(texts["policy.py"])
    _check_synthesis(manifest, _check_generator(texts["generator.py"]))
    return DomainPack(
        name=manifest.name,
        description=manifest.description.strip(),
        policy_text=manifest.policy.strip(),
        agent_tools=agent_tools,
        user_tools=user_tools,
        tools_source=texts["tools.py"],
        policy_source=texts["policy.py"],
        generator_source=texts["generator.py"],
        rules=rules,
        path=str(folder.resolve()),
        synthesis=manifest.synthesis,
    )


def builtin_packs() -> list[str]:
    """Names of the bundled domain packs."""
    if not BUILTIN_DIR.is_dir():
        return []
    return sorted(p.name for p in BUILTIN_DIR.iterdir() if (p / "domain.yaml").is_file())


def builtin_pack_path(name: str = "customer_service") -> Path:
    """Folder of the bundled pack ``name`` (``samples/domains/<name>``)."""
    path = BUILTIN_DIR / name
    if not (path / "domain.yaml").is_file():
        raise DomainPackError(None, f"no built-in domain pack {name!r}", fix=f"use one of {builtin_packs()}")
    return path

"""What a domain pack declares for EigenData synthesis (``domain.yaml``'s ``synthesis:`` section).

The generic workers, checks and the rules simulator read these declarations instead of naming a
pack's tools: how a customer is identified (lookup tool and argument, the identity check), the
entities the tasks are about (STATE collections, id and owner fields, the tools that read them),
which tools only read, what the agent asks the user to do in the app for each user tool (dual
control) and the task templates. A template is a goal on one entity: the requirement the user
states, and the calls (agent and user, in order) that achieve it, with ``{placeholders}`` filled
from the entity's fields (``{order_id}``, ``{item.price:.2f}``), the customer's
(``{customer.user_id}``), a named sub-record picked from a list field (``picks``), a seeded
choice (``choices``) or ``{today}``. Whether a goal is allowed is never declared: the pack's
policy rules decide it.

Pure helpers: ``fill`` (a template value with its placeholders filled, typed when a string is one
placeholder), ``instantiate`` (a template on an entity: requirement, calls, description),
``requirement_pattern`` (the regex a rules agent reads a stated requirement back with) and
``builtin_declarations`` (the declarations and policy code of a bundled pack, found by its tools).
"""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

import samples

EMAIL_PATTERN = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
PLACEHOLDER = re.compile(r"\{(?P<path>[A-Za-z_][\w.]*)(?::(?P<format>[^{}]*))?\}")
BUILTIN_DIR = Path(samples.__file__).resolve().parent / "domains"


class MissingValue(KeyError):
    """A placeholder names a field the context does not have."""


class CustomerSpec(BaseModel):
    """How the customer of a dialogue is found and, optionally, verified."""

    model_config = ConfigDict(extra="forbid")

    collection: Annotated[str, Field(description="STATE collection of customers, e.g. 'users'.")]
    id_field: Annotated[str, Field(description="The customer id field (and tool argument), e.g. 'user_id'.")]
    lookup_tool: Annotated[
        str, Field(description="Agent tool finding the customer; returns a dict with id_field.")
    ]
    lookup_argument: Annotated[str, Field(description="The lookup tool's argument, e.g. 'email'.")]
    lookup_field: Annotated[
        str, Field(description="The customer field the user states for it, e.g. 'email'.")
    ]
    lookup_pattern: str = Field(
        default=EMAIL_PATTERN, description="Regex finding the lookup value in a user message."
    )
    ask: str = Field(
        default="the email address on your account", description="How the agent asks for the lookup value."
    )
    details_tool: str | None = Field(
        default=None, description="Agent tool reading the profile (takes id_field)."
    )
    known_fields: dict[str, str] = Field(
        default_factory=dict,
        description="What the user knows: known_info key -> customer field (name, email, the code on their phone).",
    )
    verify_tool: str | None = Field(
        default=None,
        description="Agent tool starting the identity check (takes id_field), e.g. sending a code.",
    )
    confirm_tool: str | None = Field(default=None, description="User tool completing the identity check.")
    confirm_arguments: dict[str, Any] = Field(
        default_factory=dict, description="The confirm tool's arguments, placeholders over customer.<field>."
    )

    @model_validator(mode="after")
    def _pairs(self) -> CustomerSpec:
        if bool(self.verify_tool) != bool(self.confirm_tool):
            raise ValueError("verify_tool and confirm_tool go together (or neither)")
        if self.lookup_field not in self.known_fields.values():
            raise ValueError(f"known_fields must give the user the lookup field {self.lookup_field!r}")
        return self


class EntitySpec(BaseModel):
    """A STATE collection tasks are about."""

    model_config = ConfigDict(extra="forbid")

    collection: Annotated[str, Field(description="STATE key holding {id: record}.")]
    id_field: Annotated[str, Field(description="Record id field (and tool argument), e.g. 'order_id'.")]
    noun: Annotated[str, Field(description="What one record is called in a dialogue, e.g. 'order'.")]
    owner_field: str | None = Field(default=None, description="Field holding the owning customer's id.")
    read_tool: str | None = Field(default=None, description="Agent tool reading one record (takes id_field).")
    list_tool: str | None = Field(
        default=None, description="Agent tool listing a customer's records (takes the customer id field)."
    )
    references: dict[str, str] = Field(
        default_factory=dict,
        description="field -> collection it names: records the agent reads too before deciding.",
    )


class PickSpec(BaseModel):
    """A named sub-record of the entity, picked from one of its list fields."""

    model_config = ConfigDict(extra="forbid")

    field: Annotated[str, Field(description="The entity's list field, e.g. 'items'.")]
    where: dict[str, Any] = Field(default_factory=dict, description="Field values the element must have.")
    highest: str | None = Field(
        default=None, description="Take the element with the highest value here (else the first)."
    )


class CallTemplate(BaseModel):
    """One call of a goal."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(description="Tool name.")]
    actor: Literal["agent", "user"] = Field(default="agent", description="Who makes the call.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments, with placeholders.")


class TaskTemplate(BaseModel):
    """A goal on one entity (or on the customer's own account)."""

    model_config = ConfigDict(extra="forbid")

    kind: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$", description="Template name (goal kind).")]
    entity: str | None = Field(default=None, description="Collection of the entity; None: the customer.")
    summary: Annotated[str, Field(min_length=1, description="'wants to <summary>' in the objective.")]
    requirement: Annotated[
        str,
        Field(min_length=1, description="What the user says; must end with literal text, not a placeholder."),
    ]
    confirm: str = Field(default="", description="How the agent describes the action it proposes.")
    calls: Annotated[list[CallTemplate], Field(min_length=1, description="The goal's calls, in order.")]
    picks: dict[str, PickSpec] = Field(default_factory=dict, description="Named sub-records of the entity.")
    choices: dict[str, list[Any]] = Field(default_factory=dict, description="Seeded choices, name -> values.")
    must_not: str = Field(default="", description="A must-not requirement that comes with the goal.")

    @property
    def agent_writes(self) -> bool:
        return any(c.actor == "agent" for c in self.calls)


class SynthesisSpec(BaseModel):
    """Everything the generic EigenData workers need to know about a pack."""

    model_config = ConfigDict(extra="forbid")

    customer: CustomerSpec
    entities: list[EntitySpec] = Field(default_factory=list, description="Collections tasks are about.")
    read_tools: list[str] = Field(default_factory=list, description="Tools (agent or user) that only read.")
    helper_tools: list[str] = Field(
        default_factory=list,
        description="State-changing agent tools that are never an unasked-for action (notes, transfers).",
    )
    user_actions: dict[str, str] = Field(
        default_factory=dict,
        description="User tool -> what the agent asks the user to do ('turn airplane mode off').",
    )
    templates: Annotated[list[TaskTemplate], Field(min_length=1, description="The task templates.")]
    refusal_rate: Annotated[
        float, Field(ge=0.0, le=1.0, description="Chance a task also carries a request the policy refuses.")
    ] = 0.0

    def entity(self, collection: str | None) -> EntitySpec | None:
        return next((e for e in self.entities if e.collection == collection), None)

    def template(self, kind: str) -> TaskTemplate | None:
        return next((t for t in self.templates if t.kind == kind), None)

    def id_fields(self) -> set[str]:
        return {self.customer.id_field, *(e.id_field for e in self.entities)}


# --------------------------------------------------------------------------- placeholders


def lookup(context: Any, path: str) -> Any:
    value = context
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise MissingValue(path)
    return value


def _format(value: Any, spec: str | None) -> str:
    if isinstance(value, bool) and spec and "/" in spec:  # {enabled:on/off}
        yes, _, no = spec.partition("/")
        return yes if value else no
    if spec:
        try:
            return format(float(value) if spec.endswith("f") else value, spec)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def fill(value: Any, context: dict[str, Any]) -> Any:
    """``value`` with placeholders filled from ``context`` (recursively; ``MissingValue`` if one
    names nothing). A string that is exactly one unformatted placeholder keeps the value's type."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole and not whole["format"]:
            return lookup(context, whole["path"])
        return PLACEHOLDER.sub(lambda m: _format(lookup(context, m["path"]), m["format"]), value)
    if isinstance(value, list):
        return [fill(v, context) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, context) for k, v in value.items()}
    return value


def pick(record: dict[str, Any], spec: PickSpec) -> dict[str, Any] | None:
    rows = [
        r
        for r in record.get(spec.field) or []
        if isinstance(r, dict) and all(r.get(k) == v for k, v in spec.where.items())
    ]
    if not rows:
        return None
    if spec.highest:
        return max(rows, key=lambda r: (float(r.get(spec.highest) or 0), str(r)))
    return rows[0]


def context_of(
    template: TaskTemplate,
    record: dict[str, Any] | None,
    customer: dict[str, Any],
    today: str,
    chosen: dict[str, Any],
) -> dict[str, Any] | None:
    """The placeholder context of ``template`` on ``record``; None when a pick finds nothing."""
    context: dict[str, Any] = {**(record or {}), "customer": customer, "today": today, **chosen}
    for name, spec in template.picks.items():
        picked = pick(record or {}, spec)
        if picked is None:
            return None
        context[name] = picked
    return context


class Instance(BaseModel):
    """A template filled on one entity."""

    kind: str
    entity_id: str | None = None
    requirement: str
    describe: str
    calls: list[CallTemplate]


def instantiate(
    template: TaskTemplate,
    record: dict[str, Any] | None,
    customer: dict[str, Any],
    today: str,
    rng: random.Random,
    entity_id: str | None = None,
) -> Instance | None:
    """``template`` on ``record`` (choices drawn with ``rng``); None when it does not apply."""
    chosen = {name: rng.choice(values) for name, values in template.choices.items() if values}
    context = context_of(template, record, customer, today, chosen)
    if context is None:
        return None
    try:
        calls = [c.model_copy(update={"arguments": fill(c.arguments, context)}) for c in template.calls]
        requirement = str(fill(template.requirement, context))
        describe = str(fill(template.confirm, context)) if template.confirm else template.summary
    except MissingValue:
        return None
    return Instance(
        kind=template.kind, entity_id=entity_id, requirement=requirement, describe=describe, calls=calls
    )


def requirement_pattern(requirement: str) -> tuple[re.Pattern[str], dict[str, str]]:
    """A regex reading ``requirement`` back from a user message, and group name -> placeholder path."""
    parts: list[str] = []
    groups: dict[str, str] = {}
    seen: dict[str, str] = {}
    last = 0
    for match in PLACEHOLDER.finditer(requirement):
        parts.append(re.escape(requirement[last : match.start()]))
        path = match["path"]
        if path in seen:
            parts.append(f"(?P={seen[path]})")
        else:
            group = f"g{len(groups)}"
            seen[path] = group
            groups[group] = path
            parts.append(f"(?P<{group}>.+?)")
        last = match.end()
    parts.append(re.escape(requirement[last:]))
    return re.compile("".join(parts), re.IGNORECASE), groups


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{'item.name': 'x'} -> {'item': {'name': 'x'}}."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *heads, leaf = path.split(".")
        for head in heads:
            node = node.setdefault(head, {})
            if not isinstance(node, dict):
                break
        else:
            node[leaf] = value
    return out


# --------------------------------------------------------------------------- bundled packs


@functools.lru_cache(maxsize=32)
def _bundled(folder: str) -> tuple[frozenset[str], SynthesisSpec | None, str]:
    path = Path(folder)
    data = yaml.safe_load((path / "domain.yaml").read_text(encoding="utf-8")) or {}
    tools = frozenset(str(t) for t in data.get("agent_tools") or [])
    spec = SynthesisSpec.model_validate(data["synthesis"]) if data.get("synthesis") else None
    return tools, spec, (path / "policy.py").read_text(encoding="utf-8")


def builtin_declarations(agent_tools: set[str]) -> tuple[SynthesisSpec, str] | None:
    """(declarations, policy.py source) of the bundled pack whose agent tools are ``agent_tools``."""
    if not BUILTIN_DIR.is_dir():
        return None
    for folder in sorted(BUILTIN_DIR.iterdir()):
        if not (folder / "domain.yaml").is_file():
            continue
        tools, spec, policy = _bundled(str(folder))
        if spec is not None and tools == agent_tools:
            return spec, policy
    return None

"""The tool-emulation role (ASTRA §2.1.4): answers calls to doc-only tools, statefully.

The emulator (``synthesis.sft.emulator``) keeps a session's world as *entities*:
objects keyed by an id-like field (``note_id``, ``booking_id``, ``id``) or a
natural key (``path``, ``symbol``, ``sku``). Each call reaches the role with
the tool's schema, the arguments, the entity the call is about (already
updated when the call writes), the known entities a listing should include,
and the session's recent calls. The role returns the tool's JSON result.

This module also holds the naming conventions both the emulator and the
rules synthesiser use to read a generic tool: its operation (create, update,
delete, read) from the verb of its name, its noun, and which fields are keys.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from arena.llm.core import Role
from arena.records.tools import NormalizedTool

Operation = Literal["create", "update", "delete", "read"]

_CREATE = frozenset(
    "create add new insert register post make open submit schedule book reserve order place upload "
    "write save generate issue start send invite enroll subscribe compose draft checkout purchase buy".split()
)
_UPDATE = frozenset(
    "update edit set modify patch rename tag untag move change assign unassign mark toggle enable disable "
    "cancel close archive complete confirm approve reject activate deactivate pause resume restore "
    "attach detach link unlink rate reschedule upsert replace append increment decrement transfer".split()
)
_DELETE = frozenset("delete remove destroy drop unregister clear purge erase unsubscribe revoke".split())
_LISTING = frozenset("list search find query browse filter lookup discover scan explore".split())
STATUS_AFTER = {
    "cancel": "cancelled",
    "close": "closed",
    "archive": "archived",
    "complete": "completed",
    "confirm": "confirmed",
    "approve": "approved",
    "reject": "rejected",
    "activate": "active",
    "deactivate": "inactive",
    "enable": "enabled",
    "disable": "disabled",
    "pause": "paused",
    "resume": "active",
    "restore": "active",
    "open": "open",
}
"""Status an entity has after a status-changing verb."""
NATURAL_KEYS = frozenset("path file_path filepath symbol ticker sku isbn slug username".split())
"""Fields that identify an entity although they are not called ``*_id``."""
PAGING_ARGS = frozenset(
    "limit max_results top_k page page_size per_page offset cursor count n num_results size sort sort_by "
    "order order_by include_hidden fields".split()
)
"""Arguments that shape a listing rather than filter it."""
QUERY_ARGS = frozenset("query q search keyword keywords term terms text pattern".split())
"""Arguments holding free-text search words."""
_STOP = frozenset("by for from to all the a an of in on with details detail info my new current".split())


def name_tokens(name: str) -> list[str]:
    """Lower-case words of a tool or field name (snake, kebab, dotted or camel case)."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [t for t in re.split(r"[^a-zA-Z0-9]+", spaced.lower()) if t]


def singular(word: str) -> str:
    """Naive English singular (``notes`` -> ``note``, ``entries`` -> ``entry``, ``addresses`` -> ``address``)."""
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    return word


def verb_of(tool_name: str) -> str:
    tokens = name_tokens(tool_name)
    return tokens[0] if tokens else ""


def noun_of(tool_name: str) -> str:
    """The thing a tool acts on: ``create_note`` -> ``note``, ``getHotel`` -> ``hotel``, ``add_to_cart`` -> ``cart``."""
    tokens = name_tokens(tool_name)
    rest = [t for t in tokens[1:] if t not in _STOP and t not in ("id", "ids")]
    if rest:
        return singular(rest[0])
    return singular(tokens[0]) if tokens else "item"


def operation_of(tool_name: str) -> Operation:
    """What a call does to the session's world, read from the verb of the tool's name."""
    verb = verb_of(tool_name)
    if verb in _DELETE:
        return "delete"
    if verb in _UPDATE:
        return "update"
    if verb in _CREATE:
        return "create"
    return "read"


def is_listing(tool_name: str) -> bool:
    """A read that enumerates entities (list/search/find ...), as opposed to fetching one."""
    return verb_of(tool_name) in _LISTING


def is_key_field(name: str) -> bool:
    """``id``, ``*_id``, ``*Id``, ``*_uuid``, ``*_ref`` or a natural key such as ``path``."""
    lowered = name.lower()
    if lowered in ("id", "uuid") or lowered in NATURAL_KEYS:
        return True
    return lowered.endswith(("_id", "_uuid", "_ref")) or (name.endswith("Id") and len(name) > 2)


def kind_of_key(field: str, fallback: str) -> str:
    """The entity kind a key field names: ``note_id`` -> ``note``, ``hotelId`` -> ``hotel``, ``id`` -> fallback."""
    lowered = field.lower()
    if lowered in ("id", "uuid"):
        return fallback
    if lowered in NATURAL_KEYS:
        return "path" if "path" in lowered else lowered
    tokens = name_tokens(field)
    base = [t for t in tokens if t not in ("id", "uuid", "ref")]
    return "_".join(base) if base else fallback


STATUS_VERB_NOTE = ", ".join(f"{verb} -> {status!r}" for verb, status in STATUS_AFTER.items())


class EntityView(BaseModel):
    """One entity of the session's world as the emulator knows it."""

    kind: Annotated[str, Field(description="Entity kind, e.g. 'note' or 'booking'.")]
    key_field: Annotated[str, Field(description="Field holding its key, e.g. 'note_id' or 'path'.")]
    key: Annotated[str, Field(description="The key's value, e.g. 'note_3f9a1c2b'.")]
    fields: dict[str, Any] = Field(
        default_factory=dict, description="Known field values (from earlier results and writes)."
    )
    deleted: Annotated[bool, Field(description="True once a delete call removed it.")] = False


class PastCall(BaseModel):
    """An earlier successful call of the session."""

    tool: Annotated[str, Field(description="Tool that was called.")]
    arguments: dict[str, Any] = Field(default_factory=dict, description="Its arguments.")
    result: Annotated[Any, Field(description="The JSON result it returned (large results are shortened).")]


class EmulationInput(BaseModel):
    """Everything the emulated tool knows when answering one call."""

    tool: Annotated[
        NormalizedTool,
        Field(
            description="The tool: name, description, parameter schema and (when documented) response_schema."
        ),
    ]
    arguments: dict[str, Any] = Field(
        default_factory=dict, description="Arguments of this call (already valid)."
    )
    operation: Annotated[
        Operation, Field(description="What the call does to the session's world, read from the tool's verb.")
    ]
    subject: Annotated[
        EntityView | None,
        Field(
            description="The entity the call is about (named by a key argument), with its current state; for an "
            "update it is shown as it is after this call."
        ),
    ] = None
    related: list[EntityView] = Field(
        default_factory=list,
        description="Known entities of the kind a listing returns that match the call's filters; a listing "
        "includes them first.",
    )
    history: list[PastCall] = Field(
        default_factory=list, description="The session's latest successful calls, oldest first."
    )
    variant: Annotated[
        int, Field(ge=0, description="Session-specific seed: other sessions may invent different data.")
    ] = 0


class EmulatedResult(BaseModel):
    """The emulated tool's answer."""

    result: Annotated[
        Any,
        Field(
            description="The tool's JSON result; follows tool.response_schema when the tool documents one."
        ),
    ]


TOOL_EMULATION: Role[EmulationInput, EmulatedResult] = Role(
    name="tool_emulation",
    input=EmulationInput,
    output=EmulatedResult,
    system=(
        "You emulate a real tool server. You receive one tool call: the tool's documentation (name, "
        "description, JSON Schema of its parameters and, when documented, `response_schema`, the JSON "
        "Schema of its output), the call's arguments, and the session's state. Answer with exactly the "
        "result the real service would return for this call.\n"
        "\n"
        "Consistency with the session (most important):\n"
        "- `subject` is the entity the call is about, keyed by `key_field` = `key`. Every field of the "
        "result that `subject.fields` also has must carry the subject's value. For an update the subject "
        "is already shown as it is after this call.\n"
        "- `related` lists known entities a listing or search must return: put them first, with their "
        "known field values, then add other plausible items only if the listing would naturally have them.\n"
        "- `history` holds earlier results of this session: never contradict them (same ids, names, "
        "prices, dates for the same things).\n"
        f"- After a status verb the entity's status follows it ({STATUS_VERB_NOTE}).\n"
        "\n"
        "Shape and content:\n"
        "- With a `response_schema`, the result must validate against it: every required field, the "
        "declared types, enum values only, arrays as arrays; add no field the schema forbids.\n"
        "- Without one, return a JSON object that confirms the call: echo the arguments, add the id of "
        "anything created, and for reads the data asked for (a listing as an array of objects with ids).\n"
        "- Output fields named like an argument take the argument's value. Invent new identifiers in the "
        "style of real ones (e.g. 'note_7f3a9c21'); text relates to the arguments (a search for 'Lyon' "
        "returns places in Lyon); numbers fall in plausible ranges; dates are ISO 8601.\n"
        "- Return a successful result: failures are injected elsewhere. The variant number only makes "
        "different sessions invent different data.\n"
        "\n"
        'Output: one JSON object {"result": <the tool\'s JSON result>} and nothing else.'
    ),
    template='Tool call and session state:\n{input}\n\nReturn {"result": ...} with the tool\'s result.',
)

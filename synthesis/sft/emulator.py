"""Stateful tool emulation for doc-only servers (ASTRA §2.1.4), with injected transient failures.

One ``Emulator`` serves one rollout (session). Its world is a set of
*entities*: objects keyed by an id-like field (``note_id``, ``booking_id``,
``id``) or a natural key (``path``, ``symbol``), found by key value alone so a
tool may name the same thing differently. The tool's verb decides what a call
does to the world (``synthesis.sft.roles.emulation.operation_of``):

- create: the result's new key becomes an entity holding the arguments and the
  result's fields; a "create" that names an existing key instead (``add_tag``,
  ``write_file``) updates/upserts that entity;
- update: the arguments merge into the named entity (a scalar argument joins a
  list field named like its plural: ``tag`` -> ``tags``), status verbs set
  ``status`` (cancel -> ``cancelled``); the role sees the entity as it is after
  the call;
- delete: the entity is marked deleted; reading, changing or deleting it again
  answers a 404 tool error;
- read: the named entity overlays its known fields on the result; a listing
  puts the known entities matching its filters first.

Every result's key-bearing objects are also *harvested* (fields added, never
overwritten), so an id a search invented reads back with the same title later.

Determinism: a call is answered by the role ``tool_emulation`` through the
gateway; its rules synthesiser draws from (seed, session, tool, arguments).
Results are cached per session: a write by (tool, arguments), a read by
(tool, arguments, world revision), so the same call gives the same result
until a write changes the world. Calls of one session run one at a time in
call order (a parallel round too), so replays are reproducible.

Failures: after the arguments pass the tool's input schema, call number ``i``
of the session fails when ``Random(seed:session:i) < failure_rate``, as a
timeout or unreachable server with realistic error text. Failures are not
cached and do not touch the world: retrying may succeed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self

from arena.hashing import canonical_json, content_hash
from arena.llm.core import InvalidOutput
from arena.records.tools import NormalizedTool
from synthesis.sft.emulated_results import effective_schema, finish
from synthesis.sft.roles.emulation import (
    PAGING_ARGS,
    QUERY_ARGS,
    STATUS_AFTER,
    TOOL_EMULATION,
    EmulationInput,
    EntityView,
    Operation,
    PastCall,
    is_key_field,
    is_listing,
    kind_of_key,
    name_tokens,
    noun_of,
    operation_of,
    singular,
    verb_of,
)
from synthesis.tools.tool_results import ErrorKind, ToolResult, schema_errors

if TYPE_CHECKING:
    from arena.llm.gateway import Gateway

log = logging.getLogger(__name__)

HISTORY_CALLS = 8
"""Latest successful calls the role sees."""
HISTORY_CHARS = 2000
"""A longer past result is shown cut to this many characters of JSON."""
RELATED_LIMIT = 20
"""Most known entities handed to one listing."""
_REMOVING = frozenset("remove untag detach unassign unlink delete clear revoke".split())

_TIMEOUTS = (
    "504 Gateway Timeout: upstream service '{server}' did not answer {tool} within 30 s",
    "Error: request to {tool} timed out after 30000 ms (ETIMEDOUT)",
    "TimeoutError: {server} did not respond to {tool} before the 30 s deadline; it may not have completed",
)
_UNREACHABLE = (
    "Error: connect ECONNREFUSED 10.0.{a}.{b}:443 ({server} is not accepting connections)",
    "503 Service Unavailable: {server} is temporarily unreachable, retry later",
    "Error: getaddrinfo ENOTFOUND api.{host}.internal while calling {tool}",
    "ConnectionResetError: connection to {server} reset by peer during {tool}",
)


@dataclass
class Entity:
    """A thing in the session's world."""

    kind: str
    key_field: str
    key: str
    fields: dict[str, Any] = field(default_factory=dict)
    deleted: bool = False

    def view(self) -> EntityView:
        return EntityView(
            kind=self.kind, key_field=self.key_field, key=self.key, fields=self.fields, deleted=self.deleted
        )


class World:
    """The entities of one session, by key value; ``revision`` counts the writes."""

    def __init__(self) -> None:
        self.entities: dict[str, Entity] = {}
        self.revision = 0

    def find(self, key: Any) -> Entity | None:
        return self.entities.get(str(key))

    def put(self, entity: Entity) -> None:
        self.entities[entity.key] = entity

    def harvest(self, value: Any, kind: str, top_key: str | None = None, depth: int = 0) -> None:
        """Remember every key-bearing object of a result; known field values are never overwritten.

        ``top_key`` names the key of the top-level object when the call knows it
        (the created entity's key, the subject's key field).
        """
        if depth > 4:
            return
        if isinstance(value, list):
            for item in value:
                self.harvest(item, kind, None, depth + 1)
            return
        if not isinstance(value, dict):
            return
        key_field = (
            top_key if top_key is not None and _plain_key(value.get(top_key)) else own_key(value, kind)
        )
        if key_field is not None:
            key = str(value[key_field])
            entity = self.find(key) or Entity(kind_of_key(key_field, kind), key_field, key)
            for name, item in value.items():
                if name != key_field and _plain(item):
                    entity.fields.setdefault(name, item)
            self.put(entity)
        for name, item in value.items():
            if isinstance(item, list | dict):
                inner = kind if name in ("results", "items", "data") else singular(name)
                self.harvest(item, inner, None, depth + 1)


def own_key(obj: dict[str, Any], kind: str) -> str | None:
    """The field that identifies ``obj``: ``id`` or the key of its own kind, else its first key field."""
    keys = [k for k, v in obj.items() if is_key_field(k) and _plain_key(v)]
    ids = [
        k
        for k in keys
        if not k.lower().endswith(("path", "symbol", "ticker", "sku", "isbn", "slug", "username"))
    ]
    candidates = ids or keys
    for k in candidates:
        if k.lower() == "id" or kind_of_key(k, kind) == kind:
            return k
    return candidates[0] if candidates else None


def _plain_key(value: Any) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def _plain(value: Any) -> bool:
    """Scalars and lists of scalars are remembered; nested objects are entities of their own."""
    if isinstance(value, list):
        return all(not isinstance(v, dict | list) for v in value)
    return not isinstance(value, dict)


@dataclass
class _Plan:
    """How one call relates to the world, decided before it is answered."""

    tool: NormalizedTool
    arguments: dict[str, Any]
    operation: Operation
    subject: Entity | None = None
    related: list[Entity] = field(default_factory=list)


class Emulator:
    """A stateful emulated tool session for one doc-only server."""

    def __init__(
        self,
        tools: list[NormalizedTool],
        gateway: Gateway,
        session_id: str,
        failure_rate: float = 0.2,
        seed: int = 0,
        *,
        server: str = "tool-server",
    ) -> None:
        if not 0 <= failure_rate <= 1:
            raise ValueError(f"failure_rate must lie in [0, 1], got {failure_rate}")
        self.tools = {t.function.name: t for t in tools}
        self.gateway = gateway
        self.session_id = session_id
        self.failure_rate = failure_rate
        self.seed = seed
        self.server = server
        self.variant = int(content_hash({"seed": seed, "session": session_id}, length=8), 16)
        self.world = World()
        self.history: list[PastCall] = []
        self.injected = 0
        """Calls that failed by injection so far."""
        self.calls = 0
        """Calls that passed validation so far (the failure draw's index)."""
        self._cache: dict[str, Any] = {}
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Nothing to release: the world lives and dies with the object."""

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Answer one call; never raises for unknown tools, bad arguments or injected failures."""
        start = time.perf_counter()
        async with self._lock:  # FIFO: concurrent calls of a round apply in the order they were made
            result = await self._call(name, arguments)
        return result.model_copy(update={"latency_ms": (time.perf_counter() - start) * 1000})

    async def _call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        tool = self.tools.get(name)
        if tool is None:
            known = ", ".join(sorted(self.tools))
            return _error("unknown_tool", f"Error: unknown tool {name!r}. Available tools: {known}.", "none")
        if not isinstance(arguments, dict):
            return _error("bad_arguments", f"Error: arguments of {name!r} must be a JSON object.", "none")
        problems = schema_errors(arguments, tool.function.parameters)
        if problems:
            return _error(
                "bad_arguments", f"Error: invalid arguments for {name!r}: " + "; ".join(problems), "none"
            )
        failure = self._injected_failure(name)
        if failure is not None:
            return failure
        plan = self._plan(tool, arguments)
        key = self._cache_key(plan)
        if key in self._cache:
            cached = self._cache[key]
            if plan.operation == "update":
                self._apply(plan, cached)  # e.g. set status again after someone else changed it
            return self._ok(cached)
        subject = plan.subject
        if subject is not None and subject.deleted:
            text = f"404 Not Found: {subject.kind} {subject.key!r} does not exist (it was deleted)"
            return _error("tool_error", f"Error: {text}", "emulator")
        inputs = self._inputs(plan)
        try:
            answer = await self.gateway.call(TOOL_EMULATION, inputs)
        except InvalidOutput as exc:
            log.warning("emulation of %s failed: %s", name, exc)
            text = f"Error: 500 Internal Server Error: {self.server} returned an unreadable response"
            return _error("tool_error", text, "emulator")
        result = finish(answer.output.result, inputs)
        self._apply(plan, result)
        self._cache[key] = result
        self._remember(plan, result)
        return self._ok(result)

    # -- failures ------------------------------------------------------------------------------

    def _injected_failure(self, tool: str) -> ToolResult | None:
        index, self.calls = self.calls, self.calls + 1
        draw = random.Random(f"{self.seed}:{self.session_id}:{index}")
        if draw.random() >= self.failure_rate:
            return None
        self.injected += 1
        kind: ErrorKind = "timeout" if draw.random() < 0.5 else "unreachable"
        template = draw.choice(_TIMEOUTS if kind == "timeout" else _UNREACHABLE)
        host = "-".join(name_tokens(self.server)) or "api"
        text = template.format(
            server=self.server, tool=tool, host=host, a=draw.randint(0, 255), b=draw.randint(1, 254)
        )
        return _error(kind, text if text.startswith("Error") else f"Error: {text}", "emulator")

    # -- planning ------------------------------------------------------------------------------

    def _plan(self, tool: NormalizedTool, arguments: dict[str, Any]) -> _Plan:
        name = tool.function.name
        noun = noun_of(name)
        keys = [
            (k, v) for k, v in arguments.items() if is_key_field(k) and _plain(v) and not isinstance(v, list)
        ]
        primary = next(((k, v) for k, v in keys if kind_of_key(k, noun) == noun), keys[0] if keys else None)
        op = _refine(operation_of(name), tool, arguments, noun, primary, keys)
        plan = _Plan(tool=tool, arguments=arguments, operation=op)
        if primary is not None and op != "create":
            field_name, value = primary
            found = self.world.find(value)
            plan.subject = found or Entity(kind_of_key(field_name, noun), field_name, str(value))
            if op == "update" and not plan.subject.deleted:
                plan.subject = _updated(plan.subject, arguments, verb_of(name))
        if op == "read" and (is_listing(name) or primary is None):
            plan.related = self._related(tool, arguments)
        return plan

    def _related(self, tool: NormalizedTool, arguments: dict[str, Any]) -> list[Entity]:
        """Known entities a listing returns: of a kind its items hold, matching the call's filters."""
        item_keys = _listing_keys(effective_schema(self._bare_inputs(tool, arguments)))
        if not item_keys:
            return []
        found = [
            e
            for e in self.world.entities.values()
            if not e.deleted and e.key_field in item_keys and _matches(e, arguments)
        ]
        return found[:RELATED_LIMIT]

    def _cache_key(self, plan: _Plan) -> str:
        revision = None if plan.operation != "read" else self.world.revision
        return content_hash({"tool": plan.tool.function.name, "args": plan.arguments, "revision": revision})

    def _bare_inputs(self, tool: NormalizedTool, arguments: dict[str, Any]) -> EmulationInput:
        return EmulationInput(tool=tool, arguments=arguments, operation=operation_of(tool.function.name))

    def _inputs(self, plan: _Plan) -> EmulationInput:
        return EmulationInput(
            tool=plan.tool,
            arguments=plan.arguments,
            operation=plan.operation,
            subject=plan.subject.view() if plan.subject is not None else None,
            related=[e.view() for e in plan.related],
            history=self.history[-HISTORY_CALLS:],
            variant=self.variant,
        )

    # -- effects -------------------------------------------------------------------------------

    def _apply(self, plan: _Plan, result: Any) -> None:
        """Change the world as the call did, then remember what the result showed."""
        noun = noun_of(plan.tool.function.name)
        top_key = plan.subject.key_field if plan.subject is not None else None
        if plan.operation == "create":
            top_key = self._create(plan, result, noun)
        elif plan.operation in ("update", "delete") and plan.subject is not None:
            entity = plan.subject
            entity.deleted = plan.operation == "delete"
            self.world.put(entity)
        if plan.operation != "read":
            self.world.revision += 1
        holder = result.get(noun) if isinstance(result, dict) and isinstance(result.get(noun), dict) else None
        if holder is not None:
            self.world.harvest(holder, noun, top_key)
        self.world.harvest(result, noun, top_key if holder is None else None)

    def _create(self, plan: _Plan, result: Any, noun: str) -> str | None:
        """Add the created entity (key: the result's new key field); returns that field's name."""
        holder = (
            result.get(noun) if isinstance(result, dict) and isinstance(result.get(noun), dict) else result
        )
        if not isinstance(holder, dict):
            return None
        fresh = {k: v for k, v in holder.items() if k not in plan.arguments}
        key_field = own_key(fresh, noun)
        if key_field is None:
            return None
        fields = {k: v for k, v in plan.arguments.items() if v is not None}
        fields.update({k: v for k, v in holder.items() if k != key_field and _plain(v)})
        self.world.put(Entity(kind_of_key(key_field, noun), key_field, str(holder[key_field]), fields))
        return key_field

    def _remember(self, plan: _Plan, result: Any) -> None:
        text = json.dumps(result, ensure_ascii=False)
        shown = result if len(text) <= HISTORY_CHARS else text[:HISTORY_CHARS] + "…"
        self.history.append(PastCall(tool=plan.tool.function.name, arguments=plan.arguments, result=shown))

    def _ok(self, result: Any) -> ToolResult:
        return ToolResult(ok=True, content=json.dumps(result, ensure_ascii=False), source="emulator")


def _refine(
    op: Operation,
    tool: NormalizedTool,
    arguments: dict[str, Any],
    noun: str,
    primary: tuple[str, Any] | None,
    keys: list[tuple[str, Any]],
) -> Operation:
    """Correct the verb's guess with the arguments and the response schema."""
    if op == "create" and primary is not None:
        props = _properties(tool.response_schema)
        nested = _properties(props.get(noun))
        new_keys = [k for k in {**props, **nested} if is_key_field(k) and k not in arguments]
        if tool.response_schema is not None and not new_keys:
            return "update"  # add_tag(note_id, tag), write_file(path): nothing new gets a key
    if op == "delete" and primary is not None:
        kinds = {kind_of_key(k, noun) for k, _ in keys}
        if noun not in kinds and noun in arguments:
            return "update"  # remove_tag(note_id, tag) removes a tag from the note
    return op


def _updated(entity: Entity, arguments: dict[str, Any], verb: str) -> Entity:
    """The entity as it is after an update call with ``arguments``."""
    # A change makes "last modified" times stale: drop them so the answer states the time of this call.
    fields = {k: v for k, v in entity.fields.items() if not set(name_tokens(k)) & {"updated", "modified"}}
    removing = verb in _REMOVING
    for name, value in arguments.items():
        if name == entity.key_field or value is None:
            continue
        plural = name if isinstance(fields.get(name), list) else f"{name}s"
        if isinstance(fields.get(plural), list) or (removing and not isinstance(value, list)):
            items = list(fields.get(plural, []))
            values = value if isinstance(value, list) else [value]
            if removing:
                items = [i for i in items if i not in values]
            else:
                items += [v for v in values if v not in items]
            fields[plural] = items
        else:
            fields[name] = value
    if verb in STATUS_AFTER:
        fields["status"] = STATUS_AFTER[verb]
    return Entity(entity.kind, entity.key_field, entity.key, fields, entity.deleted)


def _listing_keys(schema: dict[str, Any]) -> set[str]:
    """Key fields of the objects in the listings (arrays of objects) of a response schema."""
    keys: set[str] = set()
    for sub in _properties(schema).values():
        if not isinstance(sub, dict):
            continue
        items = sub.get("items")
        if isinstance(items, dict) and isinstance(items.get("properties"), dict):
            keys |= {k for k in items["properties"] if is_key_field(k)}
        elif isinstance(sub.get("properties"), dict):
            keys |= _listing_keys(sub)
    return keys


def _properties(schema: Any) -> dict[str, Any]:
    props = schema.get("properties") if isinstance(schema, dict) else None
    return props if isinstance(props, dict) else {}


def _matches(entity: Entity, arguments: dict[str, Any]) -> bool:
    """Whether a known entity passes a listing's filters (paging arguments are not filters)."""
    for name, value in arguments.items():
        if name in PAGING_ARGS or value is None or value == "":
            continue
        if not _passes(entity, name, value):
            return False
    return True


def _passes(entity: Entity, name: str, value: Any) -> bool:
    fields = entity.fields
    if entity.key_field == "path" and isinstance(value, str) and _is_folder_arg(name):
        return entity.key.startswith(value)  # a folder lists what lies under it
    if name == entity.key_field:
        return str(value) == entity.key
    if name in QUERY_ARGS and isinstance(value, str):
        text = " ".join(_text(v) for v in (*fields.values(), entity.key)).lower()
        return all(word in text for word in value.lower().split())
    for candidate in (name, f"{name}s"):
        if candidate in fields:
            return _same(fields[candidate], value)
    for prefix, better in (("max_", lambda a, b: a <= b), ("min_", lambda a, b: a >= b)):
        base = fields.get(name.removeprefix(prefix)) if name.startswith(prefix) else None
        if isinstance(base, int | float) and isinstance(value, int | float):
            return bool(better(base, value))
    return False  # the entity does not show the filtered field: it is not known to match


def _is_folder_arg(name: str) -> bool:
    return "path" in name or name in ("root", "directory", "dir", "folder")


def _same(have: Any, want: Any) -> bool:
    if isinstance(have, list):
        wanted = want if isinstance(want, list) else [want]
        return all(any(_same(h, w) for h in have) for w in wanted)
    if isinstance(have, str) and isinstance(want, str):
        return have.casefold() == want.casefold()
    return bool(canonical_json(have) == canonical_json(want))


def _text(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(_text(v) for v in value)
    return str(value)


def _error(kind: ErrorKind, text: str, source: Literal["emulator", "none"]) -> ToolResult:
    return ToolResult(ok=False, content=text, error_kind=kind, source=source)

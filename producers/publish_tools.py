"""`arena publish tools PATH...`: tool docs from files to ``tools.raw``.

Every candidate server becomes one ``tools.raw`` record keyed by the hash of
its content (so re-publishing the same docs is idempotent downstream). The
loader bounds servers (``LoadOptions.max_server_tools``), so records stay small. A file
or entry that cannot be read goes to ``tools.raw.dlq`` with the exact bytes
and a reason naming the file and entry, so nothing is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from arena.hashing import content_hash
from arena.records.common import DeadLetterKind
from arena.records.tools import RawToolServer
from arena.topics import topic
from producers.publish import publish
from producers.tool_docs import LoadError, LoadNotice, LoadOptions, LoadStats, load_tool_docs
from streams.runtime import Emit, dead_letter, dead_letter_key


def raw_key(server: RawToolServer) -> str:
    """Content hash of what was published, excluding the publish time."""
    return content_hash(server.model_dump(mode="json", exclude={"published_at"}))


@dataclass
class PublishReport:
    """What was published, what was rejected (to the dead-letter topic) and the loader's counts."""

    servers: list[RawToolServer] = field(default_factory=list)
    errors: list[LoadError] = field(default_factory=list)
    notices: list[LoadNotice] = field(default_factory=list)
    stats: LoadStats = field(default_factory=LoadStats)
    sent: int = 0


def outgoing(servers: list[RawToolServer], errors: list[LoadError]) -> list[Emit]:
    spec = topic("tools.raw")
    records = [Emit(spec.name, raw_key(s), s) for s in servers]
    for err in errors:
        where = f"{err.file}" + (f" [{err.entry}]" if err.entry else "")
        letter = dead_letter(
            spec,
            err.raw,
            DeadLetterKind.parse_error,
            f"{where}: {err.problem}. Fix: {err.fix}",
            stage="publish",
            source_key=None,
        )
        records.append(Emit(spec.dlq, dead_letter_key(letter), letter))
    return records


async def publish_tool_docs(
    bootstrap: str,
    paths: list[Path],
    options: LoadOptions | None = None,
    *,
    progress: Callable[[int], None] | None = None,
) -> PublishReport:
    """Load ``paths`` (never raises on bad input; in a worker thread, big files take seconds) and
    publish servers and dead letters."""
    loaded = await asyncio.to_thread(load_tool_docs, paths, options, progress=progress)
    report = PublishReport(
        servers=loaded.servers, errors=loaded.errors, notices=loaded.notices, stats=loaded.stats
    )
    report.sent = await publish(bootstrap, outgoing(loaded.servers, loaded.errors))
    return report

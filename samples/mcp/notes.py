"""A notes service as a real MCP server: ``python -m samples.mcp.notes --transport stdio|http``.

State lives in the server process (one store per process: a stdio session gets
its own, an HTTP server shares one across clients). A fresh store holds three
notes so that read tools have something to find before anything is written.
Chains: ``search_notes``/``list_notes``/``create_note`` return ``note_id``s
that ``get_note``, ``tag_note``, ``update_note`` and ``delete_note`` require.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from arena.hashing import content_hash
from samples.mcp import CLOCK, serve

NoteId = Annotated[
    str,
    Field(min_length=1, description="Identifier of a note, e.g. 'note_3f9a1c2b' (from create/list/search)."),
]
Tag = Annotated[str, Field(min_length=1, max_length=40, description="A tag, e.g. 'work'.")]
Limit = Annotated[int, Field(ge=1, le=100, description="Maximum number of notes to return.")]


class Note(BaseModel):
    """A full note."""

    note_id: str = Field(description="Identifier of the note.")
    title: str = Field(description="Title of the note.")
    content: str = Field(description="Body of the note in Markdown.")
    tags: list[str] = Field(description="Tags attached to the note, sorted.")
    created_at: str = Field(description="Creation time, ISO 8601 (UTC).")
    updated_at: str = Field(description="Last modification time, ISO 8601 (UTC).")


class NoteSummary(BaseModel):
    """A note in a listing (no body)."""

    note_id: str = Field(description="Identifier of the note.")
    title: str = Field(description="Title of the note.")
    tags: list[str] = Field(description="Tags attached to the note.")
    updated_at: str = Field(description="Last modification time, ISO 8601 (UTC).")


class NoteList(BaseModel):
    """A page of notes, most recently updated first."""

    notes: list[NoteSummary] = Field(description="The notes on this page.")
    total: int = Field(description="Number of notes matching the filter (before the limit).")


class NoteMatch(BaseModel):
    """A search hit."""

    note_id: str = Field(description="Identifier of the matching note.")
    title: str = Field(description="Title of the matching note.")
    snippet: str = Field(description="Excerpt around the first match.")
    score: float = Field(description="Relevance: fraction of query words found (0-1).")


class SearchResult(BaseModel):
    """Search hits, best first."""

    query: str = Field(description="The query that was run.")
    matches: list[NoteMatch] = Field(description="Matching notes, best first.")
    total: int = Field(description="Number of matching notes (before the limit).")


class Deleted(BaseModel):
    """Outcome of a deletion."""

    note_id: str = Field(description="Identifier of the deleted note.")
    deleted: bool = Field(description="True: the note existed and is gone.")
    remaining: int = Field(description="Notes left in the store.")


def _now() -> str:
    return CLOCK.now()


class NoteStore:
    """In-process notes, keyed by id; ids are content hashes of a sequence number and the title."""

    def __init__(self) -> None:
        self.notes: dict[str, Note] = {}
        self._seq = 0

    def create(self, title: str, content: str, tags: list[str]) -> Note:
        self._seq += 1
        note_id = content_hash({"seq": self._seq, "title": title}, prefix="note_", length=8)
        now = _now()
        note = Note(
            note_id=note_id,
            title=title,
            content=content,
            tags=sorted(set(tags)),
            created_at=now,
            updated_at=now,
        )
        self.notes[note_id] = note
        return note

    def get(self, note_id: str) -> Note:
        note = self.notes.get(note_id)
        if note is None:
            raise ToolError(f"note {note_id!r} not found; use list_notes or search_notes to find note ids")
        return note

    def ordered(self, tag: str | None) -> list[Note]:
        notes = [n for n in self.notes.values() if tag is None or tag in n.tags]
        return sorted(notes, key=lambda n: (n.updated_at, n.note_id), reverse=True)


def _summary(note: Note) -> NoteSummary:
    return NoteSummary(note_id=note.note_id, title=note.title, tags=note.tags, updated_at=note.updated_at)


def _snippet(text: str, word: str, width: int = 60) -> str:
    at = max(text.lower().find(word.lower()), 0)
    start = max(at - width // 2, 0)
    return ("…" if start else "") + text[start : start + width].replace("\n", " ")


def _seed(store: NoteStore) -> None:
    store.create("Weekly groceries", "- oat milk\n- lentils\n- basil\n- coffee beans", ["home", "shopping"])
    store.create(
        "Q3 planning meeting",
        "Agenda: roadmap review, hiring plan, budget. Owner: Dana. Follow up with finance on Friday.",
        ["work", "meetings"],
    )
    store.create(
        "Books to read", "The Left Hand of Darkness; Middlemarch; The Dispossessed", ["personal", "reading"]
    )


def build_server() -> MCPServer:
    """A notes server with a fresh, seeded store."""
    store = NoteStore()
    _seed(store)
    server = MCPServer(
        "arena-notes",
        version="1.0.0",
        instructions="A personal notes service: create, find, read, tag, edit and delete Markdown notes.",
        log_level="WARNING",
    )

    @server.tool()
    def create_note(
        title: Annotated[str, Field(min_length=1, max_length=200, description="Title of the new note.")],
        content: Annotated[str, Field(description="Body of the note in Markdown.")],
        tags: Annotated[list[Tag], Field(description="Tags to attach, e.g. ['work', 'ideas'].")] = [],  # noqa: B006
    ) -> Note:
        """Create a note with a title, Markdown content and optional tags; returns the new note with its note_id."""
        return store.create(title, content, tags)

    @server.tool()
    def get_note(note_id: NoteId) -> Note:
        """Read one note in full (title, content, tags, timestamps) by its note_id."""
        return store.get(note_id)

    @server.tool()
    def list_notes(
        tag: Annotated[str | None, Field(description="Only list notes carrying this tag.")] = None,
        limit: Limit = 20,
    ) -> NoteList:
        """List notes, most recently updated first, optionally only those with a given tag."""
        notes = store.ordered(tag)
        return NoteList(notes=[_summary(n) for n in notes[:limit]], total=len(notes))

    @server.tool()
    def search_notes(
        query: Annotated[str, Field(min_length=1, description="Words to look for in titles and contents.")],
        tag: Annotated[str | None, Field(description="Only search notes carrying this tag.")] = None,
        limit: Limit = 10,
    ) -> SearchResult:
        """Full-text search over note titles and contents; hits are ranked by the share of query words found."""
        words = [w for w in query.lower().split() if w]
        hits: list[NoteMatch] = []
        for note in store.ordered(tag):
            text = f"{note.title}\n{note.content}"
            found = [w for w in words if w in text.lower()]
            if found:
                score = round(len(found) / len(words), 3)
                hits.append(
                    NoteMatch(
                        note_id=note.note_id, title=note.title, snippet=_snippet(text, found[0]), score=score
                    )
                )
        hits.sort(key=lambda h: -h.score)
        return SearchResult(query=query, matches=hits[:limit], total=len(hits))

    @server.tool()
    def tag_note(
        note_id: NoteId,
        add: Annotated[list[Tag], Field(description="Tags to attach.")] = [],  # noqa: B006
        remove: Annotated[list[Tag], Field(description="Tags to detach.")] = [],  # noqa: B006
    ) -> Note:
        """Attach and/or detach tags of a note; returns the note with its updated tags."""
        if not add and not remove:
            raise ToolError("nothing to do: give at least one tag in 'add' or 'remove'")
        note = store.get(note_id)
        tags = (set(note.tags) | set(add)) - set(remove)
        updated = note.model_copy(update={"tags": sorted(tags), "updated_at": _now()})
        store.notes[note_id] = updated
        return updated

    @server.tool()
    def update_note(
        note_id: NoteId,
        title: Annotated[
            str | None, Field(max_length=200, description="New title (unchanged if omitted).")
        ] = None,
        content: Annotated[str | None, Field(description="New Markdown body (unchanged if omitted).")] = None,
        append: Annotated[
            bool, Field(description="Append content to the body instead of replacing it.")
        ] = False,
    ) -> Note:
        """Change the title and/or the body of a note (replace or append); returns the updated note."""
        note = store.get(note_id)
        if title is None and content is None:
            raise ToolError("nothing to do: give a new 'title' and/or 'content'")
        body = note.content
        if content is not None:
            body = f"{body}\n{content}" if append else content
        updated = note.model_copy(
            update={"title": title or note.title, "content": body, "updated_at": _now()}
        )
        store.notes[note_id] = updated
        return updated

    @server.tool()
    def delete_note(note_id: NoteId) -> Deleted:
        """Delete a note permanently by its note_id."""
        store.get(note_id)
        del store.notes[note_id]
        return Deleted(note_id=note_id, deleted=True, remaining=len(store.notes))

    return server


def main() -> None:
    serve(build_server, "python -m samples.mcp.notes")


if __name__ == "__main__":
    main()

"""A lending-library catalogue as a real MCP server: ``python -m samples.mcp.library``.

Twelve public-domain books spread over three branches. Reservations hold a
copy at a branch until cancelled, so availability changes as the session goes.
Chains: ``search_books`` returns ``book_id``s that ``get_book``,
``check_availability`` and ``reserve_book`` require; ``reserve_book`` returns a
``reservation_id`` that ``cancel_reservation`` requires.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Annotated, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from arena.hashing import content_hash
from samples.mcp import serve

Branch = Literal["central", "riverside", "northgate"]
BRANCHES: tuple[Branch, ...] = ("central", "riverside", "northgate")
HOLD_DAYS = 7
OPENED = date(2025, 3, 3)
"""Reservation dates count from this fixed day so answers are reproducible."""

BookId = Annotated[
    str, Field(min_length=1, description="Catalogue identifier of a book, e.g. 'bk_1a2b3c4d'.")
]
PatronId = Annotated[
    str, Field(pattern=r"^P\d{4,8}$", description="Library card number of the patron, e.g. 'P10023'.")
]


class BookSummary(BaseModel):
    """A book in search results."""

    book_id: str = Field(description="Catalogue identifier.")
    title: str = Field(description="Title.")
    author: str = Field(description="Author's name.")
    year: int = Field(description="Year of first publication.")


class BookSearch(BaseModel):
    """Books matching a search, in catalogue order."""

    books: list[BookSummary] = Field(description="Matching books.")
    total: int = Field(description="Number of matching books (before the limit).")


class Book(BaseModel):
    """Full catalogue record of a book."""

    book_id: str = Field(description="Catalogue identifier.")
    title: str = Field(description="Title.")
    author: str = Field(description="Author's name.")
    year: int = Field(description="Year of first publication.")
    genres: list[str] = Field(description="Genres.")
    pages: int = Field(description="Page count of the library's edition.")
    summary: str = Field(description="One-sentence summary.")


class BranchStock(BaseModel):
    """Copies of a book at one branch."""

    branch: Branch = Field(description="Branch name.")
    copies_total: int = Field(description="Copies the branch owns.")
    copies_available: int = Field(description="Copies on the shelf and not reserved.")


class Availability(BaseModel):
    """Where a book can be picked up."""

    book_id: str = Field(description="Catalogue identifier.")
    title: str = Field(description="Title.")
    available: bool = Field(description="True when at least one listed branch has a free copy.")
    branches: list[BranchStock] = Field(
        description="Stock per branch (only the asked branch if one was given)."
    )


class Reservation(BaseModel):
    """A hold on a copy at a branch."""

    reservation_id: str = Field(description="Identifier of the reservation.")
    book_id: str = Field(description="Reserved book.")
    title: str = Field(description="Title of the reserved book.")
    patron_id: str = Field(description="Library card number of the patron.")
    branch: Branch = Field(description="Branch holding the copy.")
    status: Literal["active", "cancelled"] = Field(description="Current state of the reservation.")
    pickup_by: str = Field(description="Last day to pick the copy up, YYYY-MM-DD.")


class ReservationList(BaseModel):
    """A patron's reservations, newest first."""

    patron_id: str = Field(description="Library card number.")
    reservations: list[Reservation] = Field(description="Reservations, newest first.")


_CATALOGUE: tuple[tuple[str, str, int, tuple[str, ...], int, str], ...] = (
    (
        "Pride and Prejudice",
        "Jane Austen",
        1813,
        ("romance", "classic"),
        432,
        "Elizabeth Bennet spars with the proud Mr Darcy.",
    ),
    (
        "Moby-Dick",
        "Herman Melville",
        1851,
        ("adventure", "classic"),
        635,
        "Captain Ahab hunts the white whale.",
    ),
    (
        "Frankenstein",
        "Mary Shelley",
        1818,
        ("horror", "science fiction"),
        280,
        "A scientist creates a living being and abandons it.",
    ),
    ("Dracula", "Bram Stoker", 1897, ("horror", "gothic"), 418, "A Transylvanian count moves to England."),
    (
        "The Time Machine",
        "H. G. Wells",
        1895,
        ("science fiction",),
        118,
        "A Victorian inventor travels to the year 802,701.",
    ),
    (
        "Middlemarch",
        "George Eliot",
        1871,
        ("classic", "realism"),
        880,
        "Lives and marriages in a provincial English town.",
    ),
    (
        "Great Expectations",
        "Charles Dickens",
        1861,
        ("classic", "coming of age"),
        544,
        "The orphan Pip rises in the world.",
    ),
    (
        "Jane Eyre",
        "Charlotte Brontë",
        1847,
        ("romance", "gothic"),
        532,
        "A governess falls in love with her employer.",
    ),
    (
        "Wuthering Heights",
        "Emily Brontë",
        1847,
        ("gothic", "romance"),
        416,
        "Heathcliff and Catherine on the Yorkshire moors.",
    ),
    (
        "War and Peace",
        "Leo Tolstoy",
        1869,
        ("historical", "classic"),
        1225,
        "Russian families through the Napoleonic wars.",
    ),
    (
        "The Adventures of Sherlock Holmes",
        "Arthur Conan Doyle",
        1892,
        ("mystery",),
        307,
        "Twelve cases of the London detective.",
    ),
    (
        "Little Women",
        "Louisa May Alcott",
        1868,
        ("coming of age", "classic"),
        449,
        "Four March sisters grow up during the Civil War.",
    ),
)


class Library:
    """Catalogue, per-branch stock and reservations of one server process."""

    def __init__(self) -> None:
        self.books: dict[str, Book] = {}
        self.stock: dict[tuple[str, Branch], int] = {}
        for i, (title, author, year, genres, pages, summary) in enumerate(_CATALOGUE):
            book_id = content_hash({"title": title, "author": author}, prefix="bk_", length=8)
            self.books[book_id] = Book(
                book_id=book_id,
                title=title,
                author=author,
                year=year,
                genres=list(genres),
                pages=pages,
                summary=summary,
            )
            for j, branch in enumerate(BRANCHES):
                self.stock[(book_id, branch)] = (i + 2 * j) % 3  # some branches own none
        self.reservations: dict[str, Reservation] = {}

    def book(self, book_id: str) -> Book:
        book = self.books.get(book_id)
        if book is None:
            raise ToolError(f"book {book_id!r} is not in the catalogue; use search_books to find book ids")
        return book

    def free(self, book_id: str, branch: Branch) -> int:
        held = sum(
            1
            for r in self.reservations.values()
            if r.book_id == book_id and r.branch == branch and r.status == "active"
        )
        return self.stock[(book_id, branch)] - held

    def reservation(self, reservation_id: str) -> Reservation:
        found = self.reservations.get(reservation_id)
        if found is None:
            raise ToolError(f"reservation {reservation_id!r} not found; use list_reservations to find it")
        return found


def _matches(book: Book, words: list[str], author: str | None) -> bool:
    text = f"{book.title} {book.author} {' '.join(book.genres)}".lower()
    if author is not None and author.lower() not in book.author.lower():
        return False
    return all(w in text for w in words)


def build_server() -> MCPServer:
    """A library server with a fresh catalogue and no reservations."""
    lib = Library()
    server = MCPServer(
        "arena-library",
        version="1.0.0",
        instructions="A lending library: find books, check which branch has copies, reserve and cancel holds.",
        log_level="WARNING",
    )

    @server.tool()
    def search_books(
        query: Annotated[
            str, Field(description="Words from the title, author or genre; empty lists every book.")
        ],
        author: Annotated[
            str | None, Field(description="Only books whose author's name contains this.")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=50, description="Maximum number of books to return.")] = 10,
    ) -> BookSearch:
        """Search the catalogue by title, author or genre words; returns book ids with title, author and year."""
        words = query.lower().split()
        found = [b for b in lib.books.values() if _matches(b, words, author)]
        books = [BookSummary(book_id=b.book_id, title=b.title, author=b.author, year=b.year) for b in found]
        return BookSearch(books=books[:limit], total=len(books))

    @server.tool()
    def get_book(book_id: BookId) -> Book:
        """Full catalogue record of a book: author, year, genres, page count and summary."""
        return lib.book(book_id)

    @server.tool()
    def check_availability(
        book_id: BookId,
        branch: Annotated[Branch | None, Field(description="Only check this branch.")] = None,
    ) -> Availability:
        """How many copies of a book are free to reserve at each branch (or at one branch)."""
        book = lib.book(book_id)
        branches = [branch] if branch is not None else list(BRANCHES)
        stock = [
            BranchStock(branch=b, copies_total=lib.stock[(book_id, b)], copies_available=lib.free(book_id, b))
            for b in branches
        ]
        return Availability(
            book_id=book_id,
            title=book.title,
            available=any(s.copies_available > 0 for s in stock),
            branches=stock,
        )

    @server.tool()
    def reserve_book(
        book_id: BookId,
        patron_id: PatronId,
        branch: Annotated[Branch, Field(description="Branch where the patron will pick the copy up.")],
    ) -> Reservation:
        """Reserve a free copy of a book at a branch for a patron; fails when the branch has no free copy."""
        book = lib.book(book_id)
        if lib.free(book_id, branch) <= 0:
            raise ToolError(
                f"no free copy of {book.title!r} at {branch}; call check_availability for other branches"
            )
        seq = len(lib.reservations) + 1
        reservation_id = content_hash(
            {"seq": seq, "book": book_id, "patron": patron_id}, prefix="rsv_", length=8
        )
        reservation = Reservation(
            reservation_id=reservation_id,
            book_id=book_id,
            title=book.title,
            patron_id=patron_id,
            branch=branch,
            status="active",
            pickup_by=(OPENED + timedelta(days=HOLD_DAYS + seq)).isoformat(),
        )
        lib.reservations[reservation_id] = reservation
        return reservation

    @server.tool()
    def cancel_reservation(
        reservation_id: Annotated[
            str, Field(min_length=1, description="Identifier returned by reserve_book.")
        ],
    ) -> Reservation:
        """Cancel an active reservation; the copy goes back on the shelf."""
        reservation = lib.reservation(reservation_id)
        if reservation.status == "cancelled":
            raise ToolError(f"reservation {reservation_id!r} is already cancelled")
        cancelled = reservation.model_copy(update={"status": "cancelled"})
        lib.reservations[reservation_id] = cancelled
        return cancelled

    @server.tool()
    def list_reservations(patron_id: PatronId) -> ReservationList:
        """All reservations of a patron, newest first, active and cancelled."""
        mine = [r for r in lib.reservations.values() if r.patron_id == patron_id]
        return ReservationList(patron_id=patron_id, reservations=mine[::-1])

    return server


def main() -> None:
    serve(build_server, "python -m samples.mcp.library")


if __name__ == "__main__":
    main()

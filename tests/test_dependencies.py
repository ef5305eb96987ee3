"""Dependency verification of tool chains and the output->input link rule (synthesis/sft/tool_links.py)."""

from __future__ import annotations

from typing import Any

from arena.records.sft import Slot
from arena.records.tools import NormalizedTool, ToolFunction
from synthesis.sft.tool_links import (
    Argument,
    feeding_fields,
    is_identifier,
    output_fields,
    snake,
    verify_dependencies,
)
from synthesis.sft.tool_links import failed as failed_deps


def tool(
    name: str, params: dict[str, Any], required: list[str], response: dict[str, Any] | None = None
) -> NormalizedTool:
    return NormalizedTool(
        function=ToolFunction(
            name=name,
            description=f"The {name} tool of the test library.",
            parameters={"type": "object", "properties": params, "required": required},
        ),
        response_schema=response,
    )


STR = {"type": "string"}
INT = {"type": "integer"}

SEARCH_BOOKS = tool(
    "search_books",
    {"query": STR},
    ["query"],
    {
        "type": "object",
        "properties": {
            "results": {
                "type": "array",
                "items": {"type": "object", "properties": {"id": STR, "title": STR, "year": INT}},
            }
        },
    },
)
GET_BOOK = tool(
    "get_book",
    {"book_id": STR},
    ["book_id"],
    {"type": "object", "properties": {"book_id": STR, "author_id": STR, "title": STR}},
)
BORROW = tool(
    "borrow_book",
    {"book_id": STR, "member_name": STR, "loan_days": INT},
    ["book_id", "member_name"],
    {"type": "object", "properties": {"loan_id": STR, "due": {"type": "string", "format": "date"}}},
)
GET_LOAN = tool("get_loan", {"loan_id": STR}, ["loan_id"], {"type": "object", "properties": {"status": STR}})
SEARCH_AUTHORS = tool(
    "search_authors",
    {"name": STR},
    ["name"],
    {"type": "object", "properties": {"authors": {"type": "array", "items": {"properties": {"id": STR}}}}},
)


def by_arg(deps: list[Any]) -> dict[tuple[int, str], tuple[str, str | None]]:
    return {(d.step, d.argument): (d.source, d.provider) for d in deps}


def test_task_and_output_support_a_well_formed_chain() -> None:
    text = "Find 'Dune' and borrow it for Ana Silva."
    slots = [
        Slot(tool="search_books", argument="query", value="Dune"),
        Slot(tool="borrow_book", argument="member_name", value="ana silva"),  # case-insensitive
    ]
    deps = verify_dependencies([SEARCH_BOOKS, BORROW], text, slots)
    assert by_arg(deps) == {
        (0, "query"): ("task", "Dune"),
        (1, "book_id"): ("output", "0:search_books.results[].id"),  # `id` of array items -> book_id
        (1, "member_name"): ("task", "ana silva"),
    }
    assert failed_deps(deps) == []


def test_an_unsupported_argument_fails_verification() -> None:
    deps = verify_dependencies(
        [SEARCH_BOOKS, GET_LOAN],
        "Find Dune, then show my loan.",
        [Slot(tool="search_books", argument="query", value="Dune")],
    )
    missing = failed_deps(deps)
    assert [(d.step, d.tool, d.argument, d.source) for d in missing] == [
        (1, "get_loan", "loan_id", "unsupported")
    ]


def test_a_slot_whose_value_is_not_in_the_text_does_not_count() -> None:
    slots = [Slot(tool="search_books", argument="query", value="Dune")]
    deps = verify_dependencies([SEARCH_BOOKS], "Find me a good science fiction novel.", slots)
    assert by_arg(deps) == {(0, "query"): ("unsupported", None)}
    # A slot for another tool's argument of the same name does not count either.
    other = [Slot(tool="search_authors", argument="query", value="Dune")]
    assert failed_deps(verify_dependencies([SEARCH_BOOKS], "Find Dune.", other))
    empty = [Slot(tool="search_books", argument="query", value="  ")]
    assert failed_deps(verify_dependencies([SEARCH_BOOKS], "Find Dune.", empty))


def test_output_fields_nested_in_arrays_and_objects() -> None:
    nested = tool(
        "list_orders",
        {},
        [],
        {
            "type": "object",
            "properties": {
                "data": {
                    "type": "object",
                    "properties": {
                        "orders": {
                            "type": "array",
                            "items": {
                                "anyOf": [
                                    {"type": "object", "properties": {"orderId": STR}},
                                    {"type": "null"},
                                ]
                            },
                        }
                    },
                }
            },
        },
    )
    assert [f.path for f in output_fields(nested)] == ["data", "data.orders", "data.orders[].orderId"]
    track = tool("track_order", {"order_id": STR}, ["order_id"])
    deps = verify_dependencies([nested, track], "Track my latest order.", [])
    assert by_arg(deps) == {(1, "order_id"): ("output", "0:list_orders.data.orders[].orderId")}


def test_id_feeds_an_entity_id_only_when_the_entity_matches() -> None:
    # `id` of search_authors results is an author id, not a book id.
    deps = verify_dependencies([SEARCH_AUTHORS, GET_BOOK], "Find Le Guin and open her book.", [])
    assert failed_deps(deps)
    author = tool("get_author", {"author_id": STR}, ["author_id"])
    deps = verify_dependencies([SEARCH_AUTHORS, author], "Find Le Guin.", [])
    assert by_arg(deps)[(1, "author_id")] == ("output", "0:search_authors.authors[].id")
    # An exact name match also works from a non-array field.
    deps = verify_dependencies(
        [GET_BOOK, author], "x", [Slot(tool="get_book", argument="book_id", value="x")]
    )
    assert by_arg(deps)[(1, "author_id")] == ("output", "0:get_book.author_id")


def test_types_must_be_compatible() -> None:
    counter = tool("count_words", {"text": STR}, ["text"], {"type": "object", "properties": {"words": STR}})
    pager = tool("page", {"words": INT}, ["words"])
    assert failed_deps(
        verify_dependencies(
            [counter, pager], "'hello'", [Slot(tool="count_words", argument="text", value="hello")]
        )
    )
    number_arg = Argument("year", {"type": "number"}, True)
    assert feeding_fields(SEARCH_BOOKS, number_arg)  # an integer field feeds a number argument
    untyped = Argument("title", {}, True)
    assert [f.path for f in feeding_fields(SEARCH_BOOKS, untyped)] == ["results[].title"]


def test_qualified_arguments_take_specific_fields_only() -> None:
    quote = tool(
        "get_quote",
        {"symbol": STR},
        ["symbol"],
        {"type": "object", "properties": {"currency": STR, "name": STR}},
    )
    assert [f.name for f in feeding_fields(quote, Argument("from_currency", STR, True))] == ["currency"]
    assert feeding_fields(quote, Argument("guest_name", STR, True)) == []  # a name is too generic
    assert feeding_fields(quote, Argument("new_name", STR, True)) == []


def test_earliest_provider_and_camel_case_names() -> None:
    hotels = tool(
        "searchHotels",
        {"city": STR},
        ["city"],
        {
            "type": "object",
            "properties": {"hotels": {"type": "array", "items": {"properties": {"hotel_id": STR}}}},
        },
    )
    details = tool(
        "getHotel", {"hotelId": STR}, ["hotelId"], {"type": "object", "properties": {"hotel_id": STR}}
    )
    rooms = tool("listRooms", {"hotel_id": STR}, ["hotel_id"])
    deps = verify_dependencies(
        [hotels, details, rooms],
        "Hotels in Lisbon.",
        [Slot(tool="searchHotels", argument="city", value="Lisbon")],
    )
    assert by_arg(deps)[(1, "hotelId")] == ("output", "0:searchHotels.hotels[].hotel_id")
    assert by_arg(deps)[(2, "hotel_id")] == ("output", "0:searchHotels.hotels[].hotel_id")


def test_first_step_has_no_earlier_output_and_repeats_are_steps() -> None:
    deps = verify_dependencies([GET_BOOK, GET_BOOK], "Open it twice.", [])
    assert by_arg(deps) == {
        (0, "book_id"): ("unsupported", None),
        (1, "book_id"): ("output", "0:get_book.book_id"),
    }


def test_required_argument_without_a_property_schema_is_still_checked() -> None:
    bare = NormalizedTool(
        function=ToolFunction(
            name="ping",
            description="Ping a host by name.",
            parameters={"type": "object", "required": ["host"]},
        )
    )
    assert [d.argument for d in failed_deps(verify_dependencies([bare], "Ping it.", []))] == ["host"]
    deps = verify_dependencies(
        [bare], "Ping example.org.", [Slot(tool="ping", argument="host", value="example.org")]
    )
    assert not failed_deps(deps)


def test_identifier_and_name_helpers() -> None:
    assert snake("hotelId") == "hotel_id" and snake("Idempotency-Key") == "idempotency_key"
    assert all(is_identifier(n) for n in ("id", "book_id", "hotelId", "page_token", "uuid", "user_uuid"))
    assert is_identifier("Idempotency-Key", {"type": "string", "format": "uuid"})
    assert not any(is_identifier(n) for n in ("guest_name", "city", "idea", "paid"))

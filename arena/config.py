"""Arena's one configuration model.

Values come from, in order of precedence: keyword arguments, ``ARENA_*``
environment variables, an optional TOML file (``ARENA_CONFIG`` or
``./arena.toml``), then the defaults below. Secrets are ``SecretStr`` so they
never show up in ``repr``, logs or ``arena status``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


def _default_home() -> Path:
    return Path.home() / ".arena"


def _toml_path() -> Path:
    return Path(os.environ.get("ARENA_CONFIG", "arena.toml"))


class ArenaSettings(BaseSettings):
    """Everything a worker, the CLI or a test needs to find the stack."""

    model_config = SettingsConfigDict(env_prefix="ARENA_", extra="ignore", validate_default=True)

    home: Annotated[
        Path,
        Field(
            default_factory=_default_home,
            description="State folder of the embedded stack: broker data, lake, LanceDB, catalog, logs.",
        ),
    ]
    broker: Annotated[
        str | None,
        Field(
            default=None,
            description="Kafka bootstrap servers (host:port[,host:port]). Unset: use the embedded broker.",
        ),
    ]
    lake_url: Annotated[
        str | None,
        Field(
            default=None,
            description="Artifact lake: file:///path or s3://bucket/prefix. Unset: file://$ARENA_HOME/lake.",
        ),
    ]
    s3_endpoint: Annotated[
        str | None,
        Field(
            default=None,
            description="S3/MinIO endpoint URL, e.g. http://127.0.0.1:9000 (used by s3:// lake and LanceDB URIs).",
        ),
    ]
    s3_access_key: Annotated[SecretStr | None, Field(default=None, description="S3 access key id.")]
    s3_secret_key: Annotated[SecretStr | None, Field(default=None, description="S3 secret access key.")]
    s3_region: Annotated[str, Field(default="us-east-1", description="S3 region name.")]
    lancedb_uri: Annotated[
        str | None,
        Field(
            default=None,
            description="LanceDB URI: a folder or s3://bucket/prefix. Unset: $ARENA_HOME/lancedb.",
        ),
    ]
    catalog_url: Annotated[
        SecretStr | None,
        Field(
            default=None,
            description="SQLAlchemy URL of the catalog (sqlite:///... or postgresql://...). "
            "Secret because Postgres URLs carry passwords. Unset: sqlite:///$ARENA_HOME/catalog.db.",
        ),
    ]
    llm: Annotated[
        str,
        Field(
            default="rules",
            description="LLM backend: rules | openai://host:port/v1?model=M | hf:///path | vllm:///path.",
        ),
    ]
    seed: Annotated[int, Field(default=0, ge=0, description="Global seed for every random choice.")]
    commit_interval_s: Annotated[
        float,
        Field(
            default=0.5,
            gt=0,
            le=60,
            description="How often stage workers commit transactions (offsets + outputs).",
        ),
    ]
    sink_batch_size: Annotated[
        int,
        Field(
            default=500,
            ge=1,
            le=100_000,
            description="Records per Parquet file the lake sink writes at most.",
        ),
    ]
    sink_flush_s: Annotated[
        float,
        Field(
            default=1.0,
            gt=0,
            le=600,
            description="Longest time the lake sink holds a partial batch before writing it.",
        ),
    ]
    max_description_bytes: Annotated[
        int,
        Field(
            default=8192,
            ge=64,
            description="Tool descriptions longer than this (UTF-8 bytes) are capped.",
        ),
    ]

    @field_validator("home", mode="after")
    @classmethod
    def _absolute_home(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("lake_url")
    @classmethod
    def _check_lake_url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        scheme = urlparse(v).scheme
        if scheme not in ("file", "s3"):
            raise ValueError(f"ARENA_LAKE_URL must start with file:// or s3://, got {v!r}")
        if scheme == "s3" and not urlparse(v).netloc:
            raise ValueError("ARENA_LAKE_URL s3:// needs a bucket: s3://bucket/prefix")
        return v

    @model_validator(mode="after")
    def _s3_needs_endpoint(self) -> ArenaSettings:
        uses_s3 = any((u or "").startswith("s3://") for u in (self.lake_url, self.lancedb_uri))
        if uses_s3 and not self.s3_endpoint:
            raise ValueError(
                "an s3:// lake or LanceDB URI needs ARENA_S3_ENDPOINT (e.g. http://127.0.0.1:9000)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml = TomlConfigSettingsSource(settings_cls, toml_file=_toml_path())
        return (init_settings, env_settings, toml, file_secret_settings)

    # Derived locations -------------------------------------------------
    @property
    def lake(self) -> str:
        return self.lake_url or f"file://{self.home / 'lake'}"

    @property
    def lancedb(self) -> str:
        return self.lancedb_uri or str(self.home / "lancedb")

    @property
    def catalog(self) -> str:
        if self.catalog_url is not None:
            return self.catalog_url.get_secret_value()
        return f"sqlite:///{self.home / 'catalog.db'}"

    def s3_credentials(self) -> dict[str, str]:
        """Plain-text S3 credentials for clients; never log the result."""
        return {
            "endpoint": self.s3_endpoint or "",
            "access_key": self.s3_access_key.get_secret_value() if self.s3_access_key else "",
            "secret_key": self.s3_secret_key.get_secret_value() if self.s3_secret_key else "",
            "region": self.s3_region,
        }

    def public_view(self) -> dict[str, Any]:
        """What `arena status` may print: secrets masked, URLs without passwords."""
        return {
            "home": str(self.home),
            "broker": self.broker or "(embedded)",
            "lake": self.lake,
            "s3_endpoint": self.s3_endpoint,
            "s3_access_key": "***" if self.s3_access_key else None,
            "lancedb": self.lancedb,
            "catalog": redact_url(self.catalog),
            "llm": self.llm,
        }


def redact_url(url: str) -> str:
    """Replace the password part of a URL with ***."""
    parsed = urlparse(url)
    if parsed.password:
        netloc = parsed.netloc.replace(f":{parsed.password}@", ":***@")
        return parsed._replace(netloc=netloc).geturl()
    return url


def load_settings(**overrides: Any) -> ArenaSettings:
    return ArenaSettings(**overrides)

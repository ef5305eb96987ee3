"""LLM backends and the ``ARENA_LLM`` URL that picks one.

Accepted values of ``ARENA_LLM`` (``ArenaSettings.llm``):

``rules``
    The offline, deterministic rule-based synthesiser (default).
``openai://host:port/v1?model=M`` (``openais://`` for https)
    Any OpenAI-compatible server (vLLM, SGLang, ``transformers serve``, ...).
``hf:///abs/path/to/model``
    transformers in this process, from a local folder (never downloads).
``vllm:///abs/path/to/model``
    An in-process vLLM engine (GPU extra: ``pip install 'arena[gpu]'``).
``NAME://anything``
    The backend another package registers as entry point ``NAME`` in group ``arena.llm_backends``:
    Arena does not parse its URL; the factory gets it whole as ``LlmTarget.url``.

Backends are found by kind through the ``arena.llm_backends`` entry points (pyproject.toml), so the
kernel imports none of them: each backend module, and its heavy dependencies (httpx, transformers,
vllm), is loaded only when it is used, and the ``rules`` simulator lives in its own package. A
package adds a backend without editing Arena: it declares, in its own pyproject.toml::

    [project.entry-points."arena.llm_backends"]
    mybackend = "mypackage.backend:from_target"   # (LlmTarget, ArenaSettings) -> Backend

and ``ARENA_LLM=mybackend://...`` selects it once the package is installed.
"""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Annotated, Final, Literal, Protocol
from urllib.parse import parse_qs, urlparse

from pydantic import BaseModel, Field

from arena.llm.core import TransientError

if TYPE_CHECKING:
    from arena.config import ArenaSettings
    from arena.llm.core import Backend

ACCEPTED_FORMS = (
    "rules | openai://host:port/v1?model=M | openais://host/v1?model=M | hf:///path/to/model | "
    "vllm:///path/to/model | NAME://... (an installed arena.llm_backends entry point)"
)

BACKEND_GROUP: Final = "arena.llm_backends"
"""Entry-point group of backend factories, by ``LlmTarget.kind`` (declared in pyproject.toml)."""

BUILTIN_KINDS: Final = ("rules", "openai", "hf", "vllm")
"""Kinds whose ``ARENA_LLM`` form Arena parses itself; any other kind is an entry point's scheme."""

_KIND_PATTERN: Final = r"^[a-z][a-z0-9_.+-]*$"
"""A kind, hence a third-party entry point's name: a lower-case URL scheme (``_`` allowed)."""


class BackendError(RuntimeError):
    """A backend failure that retrying cannot fix (HTTP 4xx, a missing model, a bad setting)."""


class RetryAfter(TransientError):
    """A retryable failure where the server said how long to wait (HTTP 429/503 ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float | None, *, status: int | None = None) -> None:
        super().__init__(message, status=status)
        self.retry_after_s = retry_after_s
        """Seconds the server asked for; ``None`` when absent or too long to honour."""


class LlmTarget(BaseModel):
    """A parsed ``ARENA_LLM`` value."""

    kind: Annotated[
        str,
        Field(
            pattern=_KIND_PATTERN,
            description="Which backend serves the roles: a built-in kind (``BUILTIN_KINDS``) or the "
            "name of an installed ``arena.llm_backends`` entry point (the URL's scheme).",
        ),
    ]
    base_url: Annotated[str | None, Field(description="OpenAI API root, e.g. http://127.0.0.1:8000/v1.")] = (
        None
    )
    model: Annotated[str | None, Field(description="Model id sent to the server (``openai`` only).")] = None
    path: Annotated[str | None, Field(description="Local model folder (``hf`` and ``vllm``).")] = None
    url: Annotated[
        str | None,
        Field(
            description="The whole ``ARENA_LLM`` value of a backend Arena does not parse (another "
            "package's scheme): its factory parses it. ``None`` for the built-in kinds."
        ),
    ] = None


def _bad(url: str, why: str) -> ValueError:
    return ValueError(f"ARENA_LLM={url!r} is not a valid LLM backend ({why}); accepted: {ACCEPTED_FORMS}")


def _parse_openai(url: str, secure: bool) -> LlmTarget:
    parsed = urlparse(url)
    if not parsed.hostname:
        raise _bad(url, "no host")
    if parsed.username or parsed.password:
        raise _bad(url, "put the API key in ARENA_LLM_API_KEY, not in the URL")
    try:
        port = parsed.port
    except ValueError as exc:
        raise _bad(url, "bad port") from exc
    query = parse_qs(parsed.query, keep_blank_values=True)
    unknown = sorted(set(query) - {"model"})
    if unknown:
        raise _bad(url, f"unknown query parameter(s) {', '.join(unknown)}")
    models = [m for m in query.get("model", []) if m.strip()]
    if len(models) != 1:
        raise _bad(url, "needs exactly one ?model=NAME")
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    netloc = host if port is None else f"{host}:{port}"
    path = parsed.path.rstrip("/") or "/v1"
    scheme = "https" if secure else "http"
    return LlmTarget(kind="openai", base_url=f"{scheme}://{netloc}{path}", model=models[0])


def _parse_local(url: str, kind: Literal["hf", "vllm"]) -> LlmTarget:
    parsed = urlparse(url)
    if parsed.netloc:
        raise _bad(url, f"use an absolute path with three slashes: {kind}:///path/to/model")
    if parsed.query or parsed.params or parsed.fragment:
        raise _bad(url, f"{kind}:// takes only a path")
    if not parsed.path or parsed.path == "/":
        raise _bad(url, "no model path")
    return LlmTarget(kind=kind, path=parsed.path)


def installed_backends() -> list[str]:
    """Names of the installed ``arena.llm_backends`` entry points, sorted (the usable kinds)."""
    return sorted({ep.name for ep in entry_points(group=BACKEND_GROUP)})


def _scheme(value: str) -> str:
    """The scheme of ``value`` (``NAME`` of ``NAME://...``), lower-cased; ``""`` without ``://``."""
    head, sep, _ = value.partition("://")
    return head.lower() if sep else ""


def _unknown(url: str, scheme: str) -> ValueError:
    installed = ", ".join(installed_backends()) or "none"
    what = f"no installed backend serves scheme {scheme!r}" if scheme else "not a known backend"
    fix = (
        f"install a package that registers {scheme!r} in entry point group {BACKEND_GROUP!r}, or use an "
        "installed backend"
        if scheme
        else "use one of the accepted forms"
    )
    return _bad(url, f"{what}; installed backends: {installed}; fix: {fix}")


def parse_llm_url(url: str) -> LlmTarget:
    """Parse an ``ARENA_LLM`` value; raise ``ValueError`` naming the accepted forms.

    ``rules``, ``openai(s)://``, ``hf://`` and ``vllm://`` have their own forms, parsed here; any other
    ``NAME://...`` is accepted when an ``arena.llm_backends`` entry point ``NAME`` is installed, and its
    target keeps the whole value (``LlmTarget.url``) for that backend's factory to parse.
    """
    value = url.strip()
    if value == "rules":
        return LlmTarget(kind="rules")
    scheme = _scheme(value)
    if scheme == "openai":
        return _parse_openai(value, secure=False)
    if scheme == "openais":
        return _parse_openai(value, secure=True)
    if scheme in ("hf", "vllm"):
        return _parse_local(value, "hf" if scheme == "hf" else "vllm")
    if scheme == "rules":
        raise _bad(url, "rules takes no URL: ARENA_LLM=rules")
    if scheme and re.fullmatch(_KIND_PATTERN, scheme) and scheme in installed_backends():
        return LlmTarget(kind=scheme, url=value)
    raise _unknown(url, scheme)


class BackendFactory(Protocol):
    """What a backend entry point names: the backend for a parsed target and the settings."""

    def __call__(self, target: LlmTarget, settings: ArenaSettings) -> Backend: ...


def backend_factory(kind: str) -> BackendFactory:
    """The installed factory for backends of ``kind``; a clear error when none is installed."""
    found = [ep for ep in entry_points(group=BACKEND_GROUP) if ep.name == kind]
    if not found:
        installed = ", ".join(installed_backends()) or "none"
        raise ValueError(
            f"no LLM backend {kind!r} is installed (entry point group {BACKEND_GROUP!r}; installed: "
            f"{installed}); fix: reinstall Arena (`bash scripts/install.sh`) or install the package "
            "that provides it"
        )
    factory: BackendFactory = found[0].load()
    return factory


def make_backend(settings: ArenaSettings) -> Backend:
    """The backend ``settings.llm`` names, configured from the other ``llm_*`` settings."""
    target = parse_llm_url(settings.llm)
    return backend_factory(target.kind)(target, settings)

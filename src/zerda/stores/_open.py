"""open_store: a store from a path or a URL, as a command line or a config file gives it."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from zerda.errors import ConfigurationError
from zerda.stores._base import Store

__all__ = ["ACCEPTED_TARGETS", "StoreTarget", "open_store", "parse_target", "redact_target"]

ACCEPTED_TARGETS = (
    "a file path (SQLite; a path ending in .json is a JSON file), sqlite:///absolute/path, "
    "sqlite:relative/path, json:PATH, memory:, redis://[:password@]host:port/db[?prefix=NAME], "
    "postgresql://user[:password]@host:port/db[?schema=NAME]"
)

# ``scheme:`` at the start of a target. One letter is a Windows drive (``C:\chats.db``), not a
# scheme, so a scheme has two characters or more.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):(.*)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class StoreTarget:
    """Where a target points: the backend and, for file backends, the file; for server
    backends, the URL."""

    backend: str
    path: Path | None = None
    url: str | None = None


def parse_target(target: str | os.PathLike[str]) -> StoreTarget:
    """The backend and file of ``target``, without opening anything.

    Raises :class:`ConfigurationError` for a target no backend here accepts, saying which forms
    are accepted (or which extra brings the backend, for Redis and Postgres URLs).
    """
    if isinstance(target, os.PathLike):
        return _file_target(os.fspath(target))
    if not isinstance(target, str):
        raise ConfigurationError(
            f"a store target is a path or a URL string, got {type(target).__name__}"
        )
    if not target.strip():
        raise ConfigurationError(f"the store target is empty; accepted: {ACCEPTED_TARGETS}")
    match = _SCHEME.fullmatch(target)
    if match is None:
        return _file_target(target)
    scheme, rest = match.group(1).lower(), match.group(2)
    parse = _SCHEMES.get(scheme)
    if parse is None:
        # A relative file name with a colon in it reads as a scheme; say how to write it.
        hint = "" if rest.startswith("//") else f" (for a file of that name: ./{target})"
        raise ConfigurationError(
            f"cannot open a store at {redact_target(target)!r}: unknown scheme {scheme!r}; "
            f"accepted: {ACCEPTED_TARGETS}{hint}"
        )
    return parse(target, rest)


def open_store(target: str | os.PathLike[str], **options: Any) -> Store:
    """Open the store ``target`` points to; ``options`` go to the store's constructor.

    - ``sqlite:///absolute/path``, ``sqlite:relative/path`` or a plain path (any suffix but
      ``.json``): :class:`~zerda.stores.SQLiteStore`;
    - a path ending in ``.json``, or ``json:PATH``: :class:`~zerda.stores.JSONFileStore`;
    - ``memory:``: a new, empty :class:`~zerda.stores.InMemoryStore`;
    - ``redis://`` or ``rediss://`` URLs: :class:`~zerda.stores.RedisStore` (``?prefix=NAME``
      sets its key prefix);
    - ``postgresql://`` or ``postgres://`` URLs: :class:`~zerda.stores.PostgresStore`
      (``?schema=NAME`` sets its schema; other parameters go to libpq).

    A ``~`` at the start of a path is the user's home folder. Any other target raises
    :class:`ConfigurationError` listing the accepted forms.
    """
    parsed = parse_target(target)
    return _OPENERS[parsed.backend](parsed, options)


# -- parsing, one function per scheme ------------------------------------------------------


def _file_target(path: str) -> StoreTarget:
    if not path:
        raise ConfigurationError(f"the store target has no path; accepted: {ACCEPTED_TARGETS}")
    resolved = Path(path).expanduser()
    return StoreTarget("json" if resolved.suffix.lower() == ".json" else "sqlite", resolved)


def _file_url(backend: str) -> Callable[[str, str], StoreTarget]:
    """``backend:relative/path`` or ``backend:///absolute/path``."""

    def parse(target: str, rest: str) -> StoreTarget:
        if rest.startswith("//"):
            rest = rest[2:]  # keep the root slash: sqlite:///srv/a.db is /srv/a.db
            if rest and not rest.startswith("/"):
                raise ConfigurationError(
                    f"{target!r}: a {backend} URL names a file, not a host; use "
                    f"{backend}:///absolute/path or {backend}:relative/path"
                )
        if not rest:
            raise ConfigurationError(
                f"{target!r} has no path; use {backend}:///absolute/path or {backend}:relative/path"
            )
        return StoreTarget(backend, Path(rest).expanduser())

    return parse


def _memory(target: str, rest: str) -> StoreTarget:
    if rest:
        raise ConfigurationError(
            f"{target!r}: an in-memory store has no location; use memory: alone"
        )
    return StoreTarget("memory")


def _server(backend: str) -> Callable[[str, str], StoreTarget]:
    """A server URL, given as it is to the backend (which checks it when opening)."""

    def parse(target: str, rest: str) -> StoreTarget:
        return StoreTarget(backend, url=target)

    return parse


def _coming(name: str, extra: str) -> Callable[[str, str], StoreTarget]:
    """A backend this version does not have yet: say which extra brings it."""

    def parse(target: str, rest: str) -> StoreTarget:
        raise ConfigurationError(
            f"cannot open {redact_target(target)!r}: the {name} store is not in this version of "
            f"Zerda; it arrives with the {extra!r} extra (pip install 'zerda-memory[{extra}]'). "
            f"Accepted now: {ACCEPTED_TARGETS}"
        )

    return parse


# A new backend is one entry here (how its targets parse) and one in _OPENERS (how it opens).
_SCHEMES: dict[str, Callable[[str, str], StoreTarget]] = {
    "sqlite": _file_url("sqlite"),
    "json": _file_url("json"),
    "memory": _memory,
    "redis": _server("redis"),
    "rediss": _server("redis"),
    "postgresql": _server("postgres"),
    "postgres": _server("postgres"),
}


def _open_sqlite(target: StoreTarget, options: dict[str, Any]) -> Store:
    from zerda.stores._sqlite import SQLiteStore

    assert target.path is not None  # parse_target gives every file backend a path
    store: Store = SQLiteStore(target.path, **options)
    return store


def _open_json(target: StoreTarget, options: dict[str, Any]) -> Store:
    from zerda.stores._json import JSONFileStore

    assert target.path is not None
    store: Store = JSONFileStore(target.path, **options)
    return store


def _open_memory(target: StoreTarget, options: dict[str, Any]) -> Store:
    from zerda.stores._memory import InMemoryStore

    return InMemoryStore(**options)


def _open_redis(target: StoreTarget, options: dict[str, Any]) -> Store:
    from zerda.stores._redis import open_redis_url

    assert target.url is not None
    return open_redis_url(target.url, **options)


def _open_postgres(target: StoreTarget, options: dict[str, Any]) -> Store:
    try:
        from zerda.stores._postgres import open_postgres_url
    except ImportError as exc:
        raise ConfigurationError(f"cannot open {redact_target(target.url or '')!r}: {exc}") from exc

    assert target.url is not None
    return open_postgres_url(target.url, **options)


_OPENERS: dict[str, Callable[[StoreTarget, dict[str, Any]], Store]] = {
    "sqlite": _open_sqlite,
    "json": _open_json,
    "memory": _open_memory,
    "redis": _open_redis,
    "postgres": _open_postgres,
}


def redact_target(target: str) -> str:
    """``target`` with any password in it replaced, for error messages."""
    try:
        parts = urlsplit(target)
    except ValueError:
        return target
    if parts.password is None:
        return target
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit(parts._replace(netloc=netloc))

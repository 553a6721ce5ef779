"""open_store: a store from a path or a URL, as a command line or a config file gives it."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerda.errors import ConfigurationError
from zerda.stores._base import AsyncStore, Store, redact

__all__ = ["ACCEPTED_TARGETS", "StoreTarget", "open_native_async", "open_store", "parse_target"]

ACCEPTED_TARGETS = (
    "a file path (SQLite; a path ending in .json is a JSON file), sqlite:///absolute/path, "
    "sqlite:relative/path, json:PATH, memory:, redis://[:password@]host:port/db[?prefix=NAME], "
    "redis+cluster://host:port[?prefix=NAME], "
    "postgresql://user[:password]@host:port/db[?schema=NAME], "
    "a libpq key/value string ('host=... dbname=...'), "
    "or zerda+http://[KEY@]host:port (zerda+https://) for a zerda serve"
)

# ``scheme:`` at the start of a target. One letter is a Windows drive (``C:\chats.db``), not a
# scheme, so a scheme has two characters or more.
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]+):(.*)", re.DOTALL)
# A libpq key/value connection string: ``keyword = value`` pairs separated by spaces.
_KEYWORD_PAIR = re.compile(r"\s*[A-Za-z_]+\s*=")
# Keywords that say "libpq" even alone, with no space in the target (``dbname=test``).
_LIBPQ_START = re.compile(
    r"\s*(host|hostaddr|port|dbname|user|password|passfile|service|sslmode|connect_timeout|"
    r"options|application_name)\s*=",
    re.IGNORECASE,
)


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
        if "=" in target and (_LIBPQ_START.match(target) or any(c.isspace() for c in target)):
            return _keyword_target(target)
        return _file_target(target)
    scheme, rest = match.group(1).lower(), match.group(2)
    parse = _SCHEMES.get(scheme)
    if parse is None:
        if scheme.startswith("zerda+"):  # its user part would be an API key: not echoed
            raise ConfigurationError(
                f"cannot open a store at a {scheme}:// URL (not shown: it may hold a key): "
                "unknown scheme; a zerda serve is zerda+http://KEY@host:port or zerda+https://"
            )
        # A relative file name with a colon in it reads as a scheme; say how to write it.
        hint = "" if rest.startswith("//") else f" (for a file of that name: ./{redact(target)})"
        raise ConfigurationError(
            f"cannot open a store at {redact(target)!r}: unknown scheme {scheme!r}; "
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
    - ``redis+cluster://host:port`` (``rediss+cluster://`` for TLS): a
      :class:`~zerda.stores.RedisStore` over a Redis Cluster, that node its seed;
    - ``postgresql://`` or ``postgres://`` URLs, and libpq key/value strings
      (``host=db user=app dbname=chat``): :class:`~zerda.stores.PostgresStore`
      (``?schema=NAME`` sets its schema; other parameters go to libpq);
    - ``zerda+http://KEY@host:port`` or ``zerda+https://KEY@host``, with a path if the
      service is served under one: :class:`~zerda.stores.HTTPStore` over a ``zerda serve``,
      the URL's user part its API key (``zerda+http://host:port``: no key).

    A ``~`` at the start of a path is the user's home folder. A target with ``=`` and a space
    is never a file name (for a file called that, write ``./`` before it). Any other target
    raises :class:`ConfigurationError` listing the accepted forms; no error or repr shows a
    password.
    """
    parsed = parse_target(target)
    return _OPENERS[parsed.backend](parsed, options)


# -- parsing, one function per scheme ------------------------------------------------------


def _keyword_target(target: str) -> StoreTarget:
    """A target with ``=`` and a space (or a libpq keyword first) and no scheme: a libpq
    key/value string (``host=h dbname=d``), for Postgres. Never a file name: a file named
    after a password helps nobody."""
    if _KEYWORD_PAIR.match(target):
        return StoreTarget("postgres", url=target)
    raise ConfigurationError(
        f"cannot open a store at {redact(target)!r}: it holds '=' like a Postgres key/value "
        f"string ('host=... dbname=...') but does not start with one; accepted: "
        f"{ACCEPTED_TARGETS} (for a file of that name: ./{redact(target)})"
    )


def _expanded(path: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded."""
    if "\x00" in path:
        raise ConfigurationError(f"cannot open a store at {path!r}: a file path has no NUL")
    try:
        return Path(path).expanduser()
    except RuntimeError as exc:  # ~user for a user this system does not know
        raise ConfigurationError(f"cannot open a store at {path!r}: {exc}") from None


def _file_target(path: str) -> StoreTarget:
    if not path:
        raise ConfigurationError(f"the store target has no path; accepted: {ACCEPTED_TARGETS}")
    resolved = _expanded(path)
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
        return StoreTarget(backend, _expanded(rest))

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


# A new backend is one entry here (how its targets parse) and one in _OPENERS (how it opens).
_SCHEMES: dict[str, Callable[[str, str], StoreTarget]] = {
    "sqlite": _file_url("sqlite"),
    "json": _file_url("json"),
    "memory": _memory,
    "redis": _server("redis"),
    "rediss": _server("redis"),
    "redis+cluster": _server("redis"),
    "rediss+cluster": _server("redis"),
    "postgresql": _server("postgres"),
    "postgres": _server("postgres"),
    "zerda+http": _server("http"),
    "zerda+https": _server("http"),
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
        raise ConfigurationError(f"cannot open {redact(target.url or '')!r}: {exc}") from exc

    assert target.url is not None
    return open_postgres_url(target.url, **options)


def _open_http(target: StoreTarget, options: dict[str, Any]) -> Store:
    from zerda.stores._http import open_http_url

    assert target.url is not None
    return open_http_url(target.url, **options)


_OPENERS: dict[str, Callable[[StoreTarget, dict[str, Any]], Store]] = {
    "sqlite": _open_sqlite,
    "json": _open_json,
    "memory": _open_memory,
    "redis": _open_redis,
    "postgres": _open_postgres,
    "http": _open_http,
}


def open_native_async(target: str | os.PathLike[str]) -> AsyncStore | None:
    """For a Redis or Postgres ``target``, its native async store (:class:`AsyncRedisStore`,
    :class:`AsyncPostgresStore`), which connects on its first ``await``, in the event loop
    that awaits; ``None`` for the other backends, whose sync store async code runs over
    (``AsyncOverThread``: a SQLite store's short calls at once, the rest in threads).

    ``zerda serve`` answers its requests through it: a query awaited on the loop costs less
    than one sent from a worker thread and waited for there."""
    parsed = parse_target(target)
    if parsed.backend == "redis":
        from zerda.stores._redis import open_async_redis_url

        assert parsed.url is not None
        return open_async_redis_url(parsed.url)
    if parsed.backend == "postgres":
        from zerda.stores._postgres import open_async_postgres_url

        assert parsed.url is not None
        return open_async_postgres_url(parsed.url)
    return None

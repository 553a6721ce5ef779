"""Where messages live: the store contract and its backends.

Every memory takes ``store=`` and ``session_id=``; the default is a fresh
:class:`InMemoryStore`. A backend implements :class:`Store` (sync), :class:`AsyncStore`
(async) or both, and passes the shared contract suite in ``tests/stores/``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from zerda.stores._base import (
    MAX_SESSION_ID_LENGTH,
    RESERVED_PREFIX,
    AsyncStore,
    SessionInfo,
    Since,
    Store,
    Tail,
    TokenCounts,
    check_session_id,
)
from zerda.stores._http import AsyncHTTPStore, HTTPStore
from zerda.stores._json import JSONFileStore
from zerda.stores._memory import InMemoryStore
from zerda.stores._open import open_store
from zerda.stores._redis import AsyncRedisStore, RedisStore
from zerda.stores._sqlite import AsyncSQLiteStore, SQLiteStore

if TYPE_CHECKING:
    from zerda.stores._postgres import AsyncPostgresStore, PostgresStore

__all__ = [
    "MAX_SESSION_ID_LENGTH",
    "RESERVED_PREFIX",
    "AsyncHTTPStore",
    "AsyncPostgresStore",
    "AsyncRedisStore",
    "AsyncSQLiteStore",
    "AsyncStore",
    "HTTPStore",
    "InMemoryStore",
    "JSONFileStore",
    "PostgresStore",
    "RedisStore",
    "SQLiteStore",
    "SessionInfo",
    "Since",
    "Store",
    "Tail",
    "TokenCounts",
    "check_session_id",
    "open_store",
]

# Imported on first use: psycopg takes longer to import than the rest of Zerda.
_LAZY = {
    "AsyncPostgresStore": "zerda.stores._postgres",
    "PostgresStore": "zerda.stores._postgres",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value

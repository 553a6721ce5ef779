"""Where messages live: the store contract and its backends.

Every memory takes ``store=`` and ``session_id=``; the default is a fresh
:class:`InMemoryStore`. A backend implements :class:`Store` (sync), :class:`AsyncStore`
(async) or both, and passes the shared contract suite in ``tests/stores/``.
"""

from __future__ import annotations

from zerda.stores._base import (
    MAX_SESSION_ID_LENGTH,
    AsyncStore,
    SessionInfo,
    Store,
    Tail,
    TokenCounts,
    check_session_id,
)
from zerda.stores._json import JSONFileStore
from zerda.stores._memory import InMemoryStore
from zerda.stores._open import open_store
from zerda.stores._sqlite import AsyncSQLiteStore, SQLiteStore

__all__ = [
    "MAX_SESSION_ID_LENGTH",
    "AsyncSQLiteStore",
    "AsyncStore",
    "InMemoryStore",
    "JSONFileStore",
    "SQLiteStore",
    "SessionInfo",
    "Store",
    "Tail",
    "TokenCounts",
    "check_session_id",
    "open_store",
]

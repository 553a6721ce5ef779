"""API keys and tenants: who a request is, and which sessions it may reach.

A key is ``zk_<key id>_<secret>``: the key id is public (it names the key in ``zerda keys
list`` and ``revoke``), the secret is 32 random bytes. The store keeps only the SHA-256 of the
whole key, as the metadata of a reserved session named by that hash, so finding the key of a
request is one metadata read, whatever the number of keys. A fast hash is enough: the key is
random, not a password, so there is nothing to guess a dictionary for (a slow hash such as
bcrypt would only make every request slow).

Each tenant's sessions live in the store under ``<tenant>:<session id>``. Tenant names have no
``:``, so the first ``:`` of a stored id says whose it is and no session id a client sends can
reach another tenant's. The reserved sessions start with ``zerda.key:``: tenant names have no
``.``, so no tenant's prefix is ever that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zerda.errors import ConfigurationError, InvalidSessionIdError
from zerda.stores._base import (
    KEY_SESSION_PREFIX,
    MAX_SESSION_ID_LENGTH,
    AsyncStore,
    SessionInfo,
    Store,
    check_session_id,
)

__all__ = ["ApiKey", "KeyRing", "Tenant", "check_tenant"]

_TENANT = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
_KEY = re.compile(r"zk_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")
# What the key record's metadata holds (one reserved key: the record is Zerda's own state).
_RECORD = "zerda.api_key"


def check_tenant(name: object) -> str:
    """``name`` if it is a valid tenant name: 1 to 40 of ``a-z 0-9 _ -``, starting with a
    letter or digit."""
    if not isinstance(name, str) or not _TENANT.fullmatch(name):
        raise ConfigurationError(
            f"a tenant name is 1 to 40 characters among a-z, 0-9, _ and -, starting with a "
            f"letter or digit; got {name!r}"
        )
    return name


@dataclass(frozen=True, slots=True)
class ApiKey:
    """What the store knows of a key: never the key itself."""

    key_id: str
    tenant: str
    created_at: float


@dataclass(frozen=True, slots=True)
class Tenant:
    """Whose request this is, and how its session ids map to the store's.

    ``name`` is ``None`` for a server started with ``--no-auth``: session ids are then the
    store's own (the sessions ``zerda show`` sees), the reserved ones excepted.
    """

    name: str | None

    @property
    def prefix(self) -> str:
        return "" if self.name is None else f"{self.name}:"

    @property
    def max_id_length(self) -> int:
        return MAX_SESSION_ID_LENGTH - len(self.prefix)

    def stored_id(self, session_id: str) -> str:
        """The store's id for this tenant's ``session_id``; refuses what is not a valid
        session id, or (without auth) a reserved one."""
        check_session_id(session_id)
        if len(session_id) > self.max_id_length:
            raise InvalidSessionIdError(
                f"a session id here is 1 to {self.max_id_length} characters long, "
                f"got {len(session_id)}"
            )
        if session_id.startswith(KEY_SESSION_PREFIX):
            raise InvalidSessionIdError(
                f"session ids starting with {KEY_SESSION_PREFIX!r} are reserved for API keys"
            )
        return self.prefix + session_id

    def owns(self, stored_id: str) -> bool:
        if stored_id.startswith(KEY_SESSION_PREFIX):
            return False
        return stored_id.startswith(self.prefix)

    def visible(self, sessions: Sequence[SessionInfo]) -> list[SessionInfo]:
        """This tenant's sessions among ``sessions``, with the ids it knows them by."""
        cut = len(self.prefix)
        return [
            dataclasses.replace(s, session_id=s.session_id[cut:])
            for s in sessions
            if self.owns(s.session_id)
        ]


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _record_of(metadata: dict[str, Any]) -> ApiKey | None:
    record = metadata.get(_RECORD)
    if not isinstance(record, dict):
        return None
    try:
        return ApiKey(str(record["key_id"]), str(record["tenant"]), float(record["created_at"]))
    except (KeyError, TypeError, ValueError):
        return None


class KeyRing:
    """API keys kept in a store: create, look up, list and revoke."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def create(self, tenant: str) -> tuple[str, ApiKey]:
        """A new key for ``tenant``: the key (shown once, kept nowhere) and its record."""
        check_tenant(tenant)
        key_id = secrets.token_hex(6)
        key = f"zk_{key_id}_{secrets.token_urlsafe(32)}"
        record = ApiKey(key_id, tenant, time.time())
        self.store.compare_and_set(
            KEY_SESSION_PREFIX + _digest(key),
            _RECORD,
            None,
            {"key_id": key_id, "tenant": tenant, "created_at": record.created_at},
        )
        return key, record

    def lookup(self, key: str) -> ApiKey | None:
        """The record of ``key``, or ``None`` for a key that is malformed, unknown or revoked."""
        if not _KEY.fullmatch(key):
            return None
        return _record_of(self.store.get_metadata(KEY_SESSION_PREFIX + _digest(key)))

    async def alookup(self, store: AsyncStore, key: str) -> ApiKey | None:
        """:meth:`lookup` through ``store``'s async twin of this ring's store."""
        if not _KEY.fullmatch(key):
            return None
        return _record_of(await store.aget_metadata(KEY_SESSION_PREFIX + _digest(key)))

    def _records(self) -> list[tuple[str, ApiKey]]:
        """Every key's reserved session and record (reads each: for operators, not requests)."""
        found = []
        for info in self.store.list_sessions():
            if info.session_id.startswith(KEY_SESSION_PREFIX):
                record = _record_of(self.store.get_metadata(info.session_id))
                if record is not None:
                    found.append((info.session_id, record))
        return found

    def list(self) -> list[ApiKey]:
        """Every key's record, oldest first."""
        return sorted((r for _, r in self._records()), key=lambda r: (r.created_at, r.key_id))

    def revoke(self, key_id: str) -> ApiKey | None:
        """Delete the key named ``key_id``; its record, or ``None`` when there is no such key.
        The next request with it is refused."""
        for session_id, record in self._records():
            if record.key_id == key_id:
                self.store.delete_session(session_id)
                return record
        return None

"""The store contract: what every backend does, as a sync and an async protocol."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidMessageError,
    InvalidSessionIdError,
)
from zerda.messages import Message

__all__ = [
    "MAX_SESSION_ID_LENGTH",
    "AsyncStore",
    "SessionInfo",
    "Store",
    "Tail",
    "TokenCounts",
    "check_batch",
    "check_retention",
    "check_session_id",
    "metadata_copy",
]

MAX_SESSION_ID_LENGTH = 200
_SESSION_ID = re.compile(r"[A-Za-z0-9_.:@+=\-]+")

TokenCounts = Mapping[str, Sequence[int]]
"""Token counts of a batch, by counter name: ``{"tiktoken:o200k_base": [12, 40, ...]}``, one
count per message of the batch, in order."""


def check_session_id(session_id: object) -> str:
    """``session_id`` if it is valid, else :class:`InvalidSessionIdError` saying why.

    A session id is 1 to 200 characters among ASCII letters, digits and ``_ . : @ + = -``:
    enough for user ids, UUIDs, e-mail addresses and ``tenant:user`` schemes, and inert in
    every backend (no quotes, spaces, slashes, braces or wildcards).
    """
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(
            f"a session id must be a string, got {type(session_id).__name__}"
        )
    if not session_id or len(session_id) > MAX_SESSION_ID_LENGTH:
        raise InvalidSessionIdError(
            f"a session id must be 1 to {MAX_SESSION_ID_LENGTH} characters long, "
            f"got {len(session_id)}"
        )
    if not _SESSION_ID.fullmatch(session_id):
        bad = sorted({c for c in session_id if not _SESSION_ID.fullmatch(c)})
        raise InvalidSessionIdError(
            f"session id {session_id[:60]!r} has characters that are not accepted "
            f"({''.join(bad)!r}); use ASCII letters, digits and _ . : @ + = -"
        )
    return session_id


def check_retention(ttl: float | None, max_messages: int | None) -> None:
    """Validate the retention options every store takes."""
    if ttl is not None and (
        isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < math.inf
    ):
        raise ConfigurationError(f"ttl must be None or a number of seconds > 0, got {ttl!r}")
    if max_messages is not None and (
        isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages <= 0
    ):
        raise ConfigurationError(
            f"max_messages must be None or a positive integer, got {max_messages!r}"
        )


def check_batch(messages: Sequence[Message], tokens: TokenCounts | None) -> None:
    """Refuse a batch that is not Messages, or whose counts do not match it, before any write."""
    for m in messages:
        if not isinstance(m, Message):
            raise ConfigurationError(f"a store appends Message objects, got {type(m).__name__}")
    for name, counts in (tokens or {}).items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a counter name must be a non-empty string, got {name!r}")
        if len(counts) != len(messages):
            raise ConfigurationError(
                f"{len(counts)} token counts by {name!r} for {len(messages)} messages"
            )
        for n in counts:
            if type(n) is not int or n < 0:
                raise ConfigurationError(f"token counts must be integers >= 0, got {n!r}")


def metadata_copy(values: Mapping[str, Any]) -> dict[str, Any]:
    """A deep, JSON-checked copy of session metadata (what every backend can store)."""
    if not isinstance(values, Mapping) or not all(isinstance(k, str) for k in values):
        raise ConfigurationError("session metadata must be a dict with string keys")
    try:
        copied: dict[str, Any] = json.loads(json.dumps(dict(values), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"session metadata must be JSON-serializable: {exc}") from exc
    return copied


@dataclass(slots=True)  # not frozen: built on every read, and frozen init is slow
class Tail:
    """The end of a session as a memory needs it.

    ``messages`` holds the non-system messages of the newest turns asked for, oldest first,
    starting on a turn boundary; ``turn_starts`` gives the offset in ``messages`` where each of
    those turns starts. ``system`` holds every system message of the session (they are pinned).
    ``tokens`` and ``system_tokens`` hold, for the counter asked for, each message's stored
    count, or ``None`` where no count by that counter was stored; both are empty when no
    counter was asked for. ``total_turns`` and ``total_messages`` count what the store holds
    for the session.
    """

    system: tuple[Message, ...]
    messages: Sequence[Message]
    turn_starts: Sequence[int]
    total_turns: int
    total_messages: int
    tokens: Sequence[int | None] = ()
    system_tokens: Sequence[int | None] = ()

    @property
    def complete(self) -> bool:
        """Whether the tail holds every turn of the session."""
        return len(self.turn_starts) == self.total_turns


EMPTY_TAIL = Tail((), (), (), 0, 0)


class DecodedMessages:
    """Recently decoded messages, by their stored JSON text, for stores that keep text.

    Tails overlap from one read to the next, and decoding (parsing and validating) costs more
    than the query. Messages are immutable, so sharing them is safe. Dropping everything when
    full keeps every step a single dict operation, safe between threads without a lock.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._items: dict[str, Message] = {}

    def decode(self, body: str, where: str, session_id: str, remember: bool = True) -> Message:
        """The message stored as ``body``; ``where`` names the store in a decoding error."""
        message = self._items.get(body)
        if message is not None:
            return message
        try:
            message = Message.from_json(body)
        except (InvalidMessageError, TypeError) as exc:
            raise CorruptDataError(
                f"{where}: session {session_id!r} holds a message that cannot be decoded: {exc}"
            ) from exc
        if remember:
            if len(self._items) >= self.size:
                self._items.clear()
            self._items[body] = message
        return message

    def add(self, bodies: Sequence[str], messages: Sequence[Message]) -> None:
        """Remember messages just written, so that the next tail finds them decoded."""
        n = min(len(bodies), self.size)
        if len(self._items) + n > self.size:
            self._items.clear()
        self._items.update(
            zip(bodies[len(bodies) - n :], messages[len(messages) - n :], strict=True)
        )

    def clear(self) -> None:
        self._items.clear()


_Closing = TypeVar("_Closing", bound="ClosingStore")


class ClosingStore:
    """``with store: ...`` closes the store at the end of the block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Closing) -> _Closing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


_AsyncClosing = TypeVar("_AsyncClosing", bound="AsyncClosingStore")


class AsyncClosingStore:
    """``async with store: ...`` closes the store (``await store.aclose()``) at the end."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: _AsyncClosing) -> _AsyncClosing:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One stored session, as ``list_sessions`` reports it (times in epoch seconds)."""

    session_id: str
    message_count: int
    turn_count: int
    created_at: float
    updated_at: float
    expires_at: float | None = None


@runtime_checkable
class Store(Protocol):
    """A synchronous store. Every backend passes ``tests/stores/contract.py``.

    Writes are atomic per call; a session that does not exist reads as empty. Stores take
    ``ttl`` (seconds of inactivity after which a session expires) and ``max_messages`` (keep
    at least the last N messages of a session, dropping whole turns, system messages kept).
    """

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> None:
        """Append a batch atomically and in order, with its token counts if given."""
        ...

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        """The newest ``turns`` turns (all for ``None``), reading no more than that."""
        ...

    def history(self, session_id: str) -> list[Message]:
        """Every stored message of the session, in order."""
        ...

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        """The session's metadata (``{}`` when there is none)."""
        ...

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into the session's metadata; a ``None`` value removes its key."""
        ...

    def list_sessions(self) -> list[SessionInfo]:
        """Every live session, by id."""
        ...

    def delete_session(self, session_id: str) -> bool:
        """Forget a session and its metadata; whether it existed."""
        ...

    def clear(self) -> None:
        """Forget every session."""
        ...

    def purge_expired(self) -> int:
        """Delete the sessions whose TTL has run out; how many."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncStore(Protocol):
    """The asynchronous twin of :class:`Store`: the same methods, ``a``-prefixed."""

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> None: ...

    async def atail(
        self, session_id: str, turns: int | None, counter: str | None = None
    ) -> Tail: ...

    async def ahistory(self, session_id: str) -> list[Message]: ...

    async def aget_metadata(self, session_id: str) -> dict[str, Any]: ...

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None: ...

    async def alist_sessions(self) -> list[SessionInfo]: ...

    async def adelete_session(self, session_id: str) -> bool: ...

    async def aclear(self) -> None: ...

    async def apurge_expired(self) -> int: ...

    async def aclose(self) -> None: ...

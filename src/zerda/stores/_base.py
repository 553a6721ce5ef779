"""The store contract: what every backend does, as a sync and an async protocol."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from zerda._checks import check_json_value
from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidMessageError,
    InvalidSessionIdError,
    MessageNotFoundError,
    SessionExistsError,
    warn,
)
from zerda.messages import PINNED, Message, Role
from zerda.parts import Part

__all__ = [
    "DECODED_CHARACTERS",
    "MAX_SESSION_ID_LENGTH",
    "RESERVED_PREFIX",
    "AsyncOverThread",
    "AsyncStore",
    "BoundedCache",
    "SessionInfo",
    "Since",
    "Store",
    "Tail",
    "ThreadedAsync",
    "TokenCounts",
    "WouldWait",
    "canonical_json",
    "check_batch",
    "check_ids",
    "check_retention",
    "check_session_id",
    "check_timeout",
    "edited",
    "message_not_found",
    "metadata_copy",
    "new_ids",
    "newest_turn_start",
    "redact",
    "same_json",
    "session_exists",
    "weight_of_text",
]

_K = TypeVar("_K")
_V = TypeVar("_V")
_T = TypeVar("_T")

RESERVED_PREFIX = "zerda."
# Sessions named so hold the API keys of zerda serve (one per key, by its hash), not messages.
KEY_SESSION_PREFIX = "zerda.key:"
"""Session metadata keys starting with this are Zerda's own (``zerda.summary``):
``update_metadata`` refuses them; ``compare_and_set`` is the way to change them."""

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


def check_timeout(timeout: object, *, zero: bool = False) -> float:
    """``timeout`` as float seconds: a finite number > 0 (or >= 0 with ``zero``), else
    :class:`ConfigurationError`."""
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        low = timeout >= 0 if zero else timeout > 0
        if low and timeout < math.inf:
            return float(timeout)
    bound = ">= 0" if zero else "> 0"
    raise ConfigurationError(f"timeout must be a number of seconds {bound}, got {timeout!r}")


def check_batch(messages: Sequence[Message], tokens: TokenCounts | None) -> None:
    """Refuse a batch that is not Messages, that holds one id twice, or whose counts do not
    match it, before any write."""
    for m in messages:
        if not isinstance(m, Message):
            raise ConfigurationError(f"a store appends Message objects, got {type(m).__name__}")
    if len({m.id for m in messages}) < len(messages):  # a repeated id, or several None
        ids = [m.id for m in messages if m.id is not None]
        if len(set(ids)) < len(ids):
            twice = next(i for n, i in enumerate(ids) if i in ids[:n])
            raise ConfigurationError(
                f"the batch holds message id {twice!r} twice; ids identify messages, "
                "so a batch names each once"
            )
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


def metadata_copy(values: Mapping[str, Any], *, reserved: bool = False) -> dict[str, Any]:
    """A deep, JSON-checked copy of session metadata (what every backend can store).

    Keys under :data:`RESERVED_PREFIX` are refused unless ``reserved`` (Zerda's own writes).
    """
    if not isinstance(values, Mapping) or not all(isinstance(k, str) for k in values):
        raise ConfigurationError("session metadata must be a dict with string keys")
    if not reserved:
        for key in values:
            if key.startswith(RESERVED_PREFIX):
                raise ConfigurationError(
                    f"metadata key {key!r} is reserved: keys starting with "
                    f"{RESERVED_PREFIX!r} hold Zerda's own state (the summary); pick another "
                    "name, or use compare_and_set to change it on purpose"
                )
    check_json_value(values, "session metadata", ConfigurationError)
    try:
        copied: dict[str, Any] = json.loads(json.dumps(dict(values), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"session metadata must be JSON-serializable: {exc}") from exc
    return copied


def canonical_json(value: Any) -> str:
    """``value`` as compact JSON with sorted keys: one text per JSON value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def same_json(a: Any, b: Any) -> bool:
    """Whether two decoded JSON values are equal, as ``compare_and_set`` compares them:
    objects whatever their key order, numbers by value (``1 == 1.0``), ``true`` never a number.
    """
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_json, a, b))
    return type(a) is type(b) and a == b


def new_ids(messages: Sequence[Message], held: Callable[[str], bool]) -> list[int]:
    """The positions in ``messages`` to store: every message without an id, and those whose
    id ``held`` says the session does not hold yet."""
    return [i for i, m in enumerate(messages) if m.id is None or not held(m.id)]


# -- redaction ----------------------------------------------------------------------------------

# ``scheme://user:password@``: the password runs to the last @ of the authority.
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@]*:)[^\s/?#]*(@)")
# The API key of a zerda serve URL is its user part (zerda+http://KEY@host).
_URL_API_KEY = re.compile(r"(zerda\+https?://)[^\s/?#@]+(@)", re.IGNORECASE)
# ``password=...`` in a query (?password= / &password=) or a libpq key/value string, the
# value maybe quoted ('it''s' or 'a\'b').
_KEY_PASSWORD = re.compile(
    r"((?:^|[?&;\s])password\s*=\s*)('(?:[^'\\]|\\.|'')*'?|[^\s&;]*)", re.IGNORECASE
)


def redact(text: str) -> str:
    """``text`` with every password in it replaced by ``***``: in URLs (``user:pw@host``,
    ``?password=`` and ``&password=``, any case) and in libpq key/value strings
    (``password=pw``, quoted or not), and the API key of a ``zerda+http(s)://KEY@host`` URL.
    The one redactor every store, error, log line and the CLI use, so that no form of a
    store's address shows its password."""
    text = _URL_PASSWORD.sub(r"\1***\2", text)
    text = _URL_API_KEY.sub(r"\1***\2", text)
    return _KEY_PASSWORD.sub(r"\1***", text)


# -- a cache that never grows past its size -------------------------------------------------------


class BoundedCache(Generic[_K, _V]):
    """Recently used values, in two generations of at most ``size`` each.

    A generation's size is its number of values, or, given ``weigh``, the sum of
    ``weigh(key)`` over them (for messages cached by their stored text: characters, so that
    a few huge messages cannot hold much memory). When the current generation is full it
    becomes the old one (the one before is dropped) and a new one starts. ``get`` looks in
    the current generation only: one C call, as readers make many per tail. After it misses,
    ``recall`` looks in the old one and brings back what it finds. So a working set of up to
    ``size`` stays cached however much passes through once (appended messages, other
    sessions' one-off reads), where forgetting everything at once would drop it and decode it
    all again at every turnover.

    Every step is a dict operation or two, safe between threads without a lock: at worst a
    race loses a value, which is decoded again, or miscounts a generation's size. The values
    cached here are immutable or never changed, so sharing them is safe. For what readers
    decode again and again: stored messages, token counts, log elements.
    """

    __slots__ = ("_items", "_old", "_used", "get", "size", "weigh")

    def __init__(self, size: int, weigh: Callable[[_K], int] | None = None) -> None:
        self.size = size
        self.weigh = weigh
        self._items: dict[_K, _V] = {}
        self._old: dict[_K, _V] = {}
        self._used = 0  # the current generation's size
        # The dict's own method: a lookup is one C call, as readers make many per tail.
        self.get: Callable[[_K], _V | None] = self._items.get

    def recall(self, key: _K) -> _V | None:
        """After ``get`` missed: ``key``'s value from the old generation, kept again."""
        value = self._old.get(key)
        if value is not None:
            self.put(key, value)
        return value

    def lookup(self, key: _K) -> _V | None:
        """``get``, then ``recall``: for callers that are not on a hot path."""
        value = self.get(key)
        return self.recall(key) if value is None else value

    def put(self, key: _K, value: _V) -> None:
        weight = 1 if self.weigh is None else self.weigh(key)
        if self._used + weight > self.size:
            self._turn_over()
        self._items[key] = value
        self._used += weight

    def put_many(self, pairs: Sequence[tuple[_K, _V]]) -> None:
        """Remember the last of ``pairs`` that fit in a generation, turning over first if
        they would not fit in this one."""
        weigh = self.weigh
        if weigh is None:
            pairs = pairs[len(pairs) - min(len(pairs), self.size) :]
            weight = len(pairs)
        else:
            weight = kept = 0
            for key, _ in reversed(pairs):
                w = weigh(key)
                if weight + w > self.size:
                    break
                weight += w
                kept += 1
            pairs = pairs[len(pairs) - kept :]
        if self._used + weight > self.size:
            self._turn_over()
        self._items.update(pairs)
        self._used += weight

    def _turn_over(self) -> None:
        self._old = self._items
        self._items = {}
        self._used = 0
        self.get = self._items.get

    def clear(self) -> None:
        self._items.clear()
        self._old = {}
        self._used = 0

    def __len__(self) -> int:
        return len(self._items) + len(self._old)


@dataclass(slots=True)  # not frozen: built on every read, and frozen init is slow
class Tail:
    """The end of a session as a memory needs it.

    ``messages`` holds the non-system messages of the newest turns asked for, oldest first,
    starting on a turn boundary; ``turn_starts`` gives the offset in ``messages`` where each of
    those turns starts. ``system`` holds every system message of the session (they are pinned).
    ``tokens`` and ``system_tokens`` hold, for the counter asked for, each message's stored
    count, or ``None`` where no count by that counter was stored; both are empty when no
    counter was asked for. ``total_turns`` and ``total_messages`` count what the store holds
    for the session. ``metadata`` is the session's metadata, read in the same snapshot (a
    summary and the messages it covers always agree). Treat a tail as read-only.

    ``cursor`` marks where the tail ends, for a store that can tell what was appended after
    it (``tail_since``, see :class:`Since`); ``None`` from a store that cannot. It takes no
    part in comparing tails.
    """

    system: tuple[Message, ...]
    messages: Sequence[Message]
    turn_starts: Sequence[int]
    total_turns: int
    total_messages: int
    tokens: Sequence[int | None] = ()
    system_tokens: Sequence[int | None] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)
    # Where in one store's log the tail ends: two tails with the same content are equal.
    cursor: object = field(default=None, compare=False, repr=False)

    @property
    def complete(self) -> bool:
        """Whether the tail holds every turn of the session."""
        return len(self.turn_starts) == self.total_turns


def empty_tail() -> Tail:
    """The tail of a session that does not exist."""
    return Tail((), (), (), 0, 0)


@dataclass(slots=True)
class Since:
    """What a session gained after a cursor: the answer of ``tail_since``.

    A store that can say cheaply what was appended to a session after a :attr:`Tail.cursor`
    (or a ``Since.cursor``) offers ``tail_since(session_id, cursor, counter) -> Since | None``
    and its async twin ``atail_since``; the token memory then reads only that, not the whole
    tail again (``InMemoryStore``, ``JSONFileStore`` and the SQLite stores do). The methods
    are optional: a store without them is read whole every time.

    ``messages`` are the messages appended after the cursor, none of them pinned, oldest
    first; ``tokens`` their counts by ``counter`` (``None`` where none was stored);
    ``turn_starts`` the offsets in ``messages`` where a turn starts; ``total_turns`` and
    ``total_messages`` the session's totals, as in a :class:`Tail`; ``cursor`` where this
    answer ends. ``tail_since`` answers ``None`` when the messages up to the cursor are not
    exactly those stored now (the session was edited, trimmed, deleted or expired since)
    or when a pinned message was appended: the caller reads the tail again.
    """

    messages: Sequence[Message]
    tokens: Sequence[int | None]
    turn_starts: Sequence[int]
    total_turns: int
    total_messages: int
    cursor: object


TailSince = Callable[[str, object, str | None], Since | None]
"""A store's ``tail_since(session_id, cursor, counter)``, looked up where it is optional."""

# The text of the decoded messages a store keeps, per generation (see BoundedCache): a few
# thousand to tens of thousands of messages, some 50 MB of memory at most.
DECODED_CHARACTERS = 8 * 1024 * 1024


def weight_of_text(text: bytes | str) -> int:
    return len(text) + 256


class DecodedMessages:
    """Recently decoded messages, by their stored JSON text, for stores that keep text.

    Tails overlap from one read to the next, and decoding (parsing and validating) costs more
    than the query. Messages are immutable, so sharing them is safe.
    """

    def __init__(self, characters: int = DECODED_CHARACTERS) -> None:
        # A message costs about its text twice (the key, and the decoded content) and a few
        # hundred bytes of objects: counted as its text and 256 more.
        self._cache: BoundedCache[str, Message] = BoundedCache(characters, weight_of_text)

    def decode(self, body: str, where: str, session_id: str, remember: bool = True) -> Message:
        """The message stored as ``body``; ``where`` names the store in a decoding error."""
        message = self._cache.get(body)
        if message is None:
            message = self._cache.recall(body)
        if message is not None:
            return message
        try:
            message = Message.from_json(body)
        except (InvalidMessageError, TypeError) as exc:
            raise CorruptDataError(
                f"{where}: session {session_id!r} holds a message that cannot be decoded: {exc}"
            ) from exc
        if remember:
            self._cache.put(body, message)
        return message

    def add(self, bodies: Sequence[str], messages: Sequence[Message]) -> None:
        """Remember messages just written, so that the next tail finds them decoded."""
        self._cache.put_many(list(zip(bodies, messages, strict=True)))

    def clear(self) -> None:
        self._cache.clear()


def decode_metadata(text: str, where: str, session_id: str) -> dict[str, Any]:
    """A session's metadata from its JSON text; ``CorruptDataError`` naming ``where`` if it is
    not a JSON object."""
    try:
        metadata = json.loads(text)
        if not isinstance(metadata, dict):
            raise TypeError(f"expected a JSON object, got {text[:60]!r}")
    except (ValueError, TypeError, RecursionError) as exc:
        raise CorruptDataError(
            f"{where}: the metadata of session {session_id!r} cannot be decoded: {exc}"
        ) from exc
    return metadata


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


def check_ids(ids: object) -> list[str]:
    """The message ids of a ``delete_messages`` call, checked: a collection of strings (one
    string alone is refused: it is almost always a missing list)."""
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Collection):
        raise ConfigurationError(
            f"ids must be a list of message ids, got {type(ids).__name__}; "
            "for one message write [message_id]"
        )
    out = list(ids)
    for i in out:
        if not isinstance(i, str) or not i:
            raise ConfigurationError(f"a message id is a non-empty string, got {i!r:.80}")
    return out


def edited(message: Message, content: str | tuple[Part, ...] | None, now: float) -> Message:
    """``message`` with ``content`` (validated as a new message is) and ``edited_at`` in its
    metadata: what every store's ``edit_message`` stores."""
    try:
        return dataclasses.replace(
            message, content=content, metadata={**message.metadata, "edited_at": now}
        )
    except TypeError as exc:  # a content of a type Message's checks do not expect
        raise InvalidMessageError(f"cannot edit message {message.id!r}: {exc}") from None


def newest_turn_start(messages: Sequence[Message]) -> int | None:
    """Where the newest turn of a log (system messages included) starts: its last user
    message, or its first message that is not pinned when no user message is there."""
    first = None
    for i in range(len(messages) - 1, -1, -1):
        role = messages[i].role
        if role is Role.USER:
            return i
        if role not in PINNED:
            first = i
    return first


def message_not_found(session_id: str, message_id: str) -> MessageNotFoundError:
    return MessageNotFoundError(f"session {session_id!r} holds no message {message_id!r}")


def session_exists(new_session_id: str) -> SessionExistsError:
    return SessionExistsError(
        f"cannot fork into {new_session_id!r}: that session already holds messages or "
        "metadata (delete it first, or fork into a new id)"
    )


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One stored session, as ``list_sessions`` reports it: how many ``messages`` it holds
    (system messages included) and how many ``turns`` (times in epoch seconds)."""

    session_id: str
    messages: int
    turns: int
    created_at: float
    updated_at: float
    expires_at: float | None = None

    @property
    def message_count(self) -> int:
        """Deprecated name of :attr:`messages`."""
        warn("SessionInfo.message_count is deprecated: use SessionInfo.messages")
        return self.messages

    @property
    def turn_count(self) -> int:
        """Deprecated name of :attr:`turns`."""
        warn("SessionInfo.turn_count is deprecated: use SessionInfo.turns")
        return self.turns


@runtime_checkable
class Store(Protocol):
    """A synchronous store. Every backend passes ``tests/stores/contract.py``.

    Writes are atomic per call; a session that does not exist reads as empty. Stores take
    ``ttl`` (seconds of inactivity after which a session expires) and ``max_messages`` (keep
    at least the last N messages of a session, dropping whole turns, system messages kept).

    A message's ``id`` identifies it in its session: appending a message whose id the session
    already holds stores nothing for it, in the same atomic step, so a retry after an unknown
    outcome never stores a message twice (messages without an id are always stored).
    """

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        """Append a batch atomically and in order, with its token counts if given; how many
        messages were stored (those whose id the session held are skipped)."""
        ...

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        """:meth:`append`, then :meth:`tail` as it is right after, in one round trip."""
        ...

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        """The newest ``turns`` turns (all for ``None``) and the session's metadata, in one
        snapshot, reading no more than that."""
        ...

    def history(self, session_id: str) -> list[Message]:
        """Every stored message of the session, in order."""
        ...

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        """The session's metadata (``{}`` when there is none)."""
        ...

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        """Merge ``values`` into the session's metadata; a ``None`` value removes its key.
        Keys starting with ``zerda.`` are reserved (:data:`RESERVED_PREFIX`) and refused."""
        ...

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        """Set metadata ``key`` to ``value`` (``None`` removes it) if it now holds
        ``expected`` (``None``: absent), as one atomic step; whether it did.

        Values compare as JSON values (:func:`same_json`: key order aside, numbers by
        value). Any key may be set this way, reserved ones included: it is how summaries are
        written, so that two workers folding one session never both succeed.
        """
        ...

    def list_sessions(self) -> list[SessionInfo]:
        """Every live session, by id."""
        ...

    def delete_session(self, session_id: str) -> bool:
        """Forget a session and its metadata; whether it existed."""
        ...

    # Editing the log (issue #16): each call is one atomic step, like an append.

    def delete_messages(self, session_id: str, ids: Collection[str]) -> int:
        """Delete the session's messages with these ids (system messages too), with their
        token counts; ids the session does not hold are ignored. How many were deleted. The
        turns are those of what is left (a deleted user message joins what answered it to
        the turn before)."""
        ...

    def pop_turn(self, session_id: str) -> list[Message]:
        """Remove the newest turn (its messages from its first on; system messages stay, they
        belong to no turn) and return its messages in order; ``[]`` for no turn."""
        ...

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        """Copy the session's log, up to and including the message ``at`` (``None``: all of
        it), with its token counts and metadata, into ``new_session_id``; how many messages
        were copied. The source is unchanged. :class:`~zerda.SessionExistsError` when the new
        session holds anything, :class:`~zerda.MessageNotFoundError` when no message is
        ``at``; forking a session that holds nothing, with ``at=None``, copies nothing and
        creates nothing."""
        ...

    def edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        """Replace one message's content; its id, role, position, ``created_at`` and the rest
        stay, and its metadata gains ``edited_at`` (the store's clock). Its token counts are
        dropped (a memory counts it again). Returns the message as stored;
        :class:`~zerda.MessageNotFoundError` when the session holds no such message,
        :class:`~zerda.InvalidMessageError` (nothing changed) when the content is not valid
        for the message."""
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
    ) -> int: ...

    async def aappend_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]: ...

    async def atail(
        self, session_id: str, turns: int | None, counter: str | None = None
    ) -> Tail: ...

    async def ahistory(self, session_id: str) -> list[Message]: ...

    async def aget_metadata(self, session_id: str) -> dict[str, Any]: ...

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None: ...

    async def acompare_and_set(
        self, session_id: str, key: str, expected: Any, value: Any
    ) -> bool: ...

    async def alist_sessions(self) -> list[SessionInfo]: ...

    async def adelete_session(self, session_id: str) -> bool: ...

    async def adelete_messages(self, session_id: str, ids: Collection[str]) -> int: ...

    async def apop_turn(self, session_id: str) -> list[Message]: ...

    async def afork(self, session_id: str, new_session_id: str, at: str | None = None) -> int: ...

    async def aedit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message: ...

    async def aclear(self) -> None: ...

    async def apurge_expired(self) -> int: ...

    async def aclose(self) -> None: ...


class WouldWait(Exception):
    """Raised by a store's ``run_now(call)`` when ``call`` would have to wait (for a lock
    another thread or process holds) and so has done nothing: run it in a thread instead."""


class ThreadedAsync:
    """The :class:`AsyncStore` methods of a store whose I/O blocks: each runs the sync method
    in a worker thread, so the event loop never waits on it.

    A class mixes this in and says where the sync methods are (``_threaded``: by default the
    object itself) and, if it must, how to reach its thread (``_in_thread``: by default
    ``asyncio.to_thread``; a store whose connection lives in one thread overrides it).
    """

    def _threaded(self) -> Store:
        return self  # type: ignore[return-value]  # mixed into a class that is a Store

    async def _in_thread(self, call: Callable[[Store], _T]) -> _T:
        store = self._threaded()
        return await asyncio.to_thread(call, store)

    async def _short(self, call: Callable[[Store], _T]) -> _T:
        """A call that is one short transaction (an append, a bounded tail, metadata): in a
        thread like the others, unless the class knows a faster way (``AsyncOverThread``)."""
        return await self._in_thread(call)

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        return await self._short(lambda s: s.append(session_id, messages, tokens))

    async def aappend_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        run = self._in_thread if turns is None else self._short  # a whole log: see atail
        return await run(lambda s: s.append_then_tail(session_id, messages, tokens, turns, counter))

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        # A whole log (turns=None) may be long to read: always in a thread.
        run = self._in_thread if turns is None else self._short
        return await run(lambda s: s.tail(session_id, turns, counter))

    async def atail_since(
        self, session_id: str, cursor: object, counter: str | None = None
    ) -> Since | None:
        """The sync store's ``tail_since`` (see :class:`Since`); ``None`` when it has none."""
        since: TailSince | None = getattr(self._threaded(), "tail_since", None)
        if since is None:
            return None
        return await self._short(lambda s: since(session_id, cursor, counter))

    async def ahistory(self, session_id: str) -> list[Message]:
        return await self._in_thread(lambda s: s.history(session_id))

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        return await self._short(lambda s: s.get_metadata(session_id))

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        await self._short(lambda s: s.update_metadata(session_id, values))

    async def acompare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return await self._short(lambda s: s.compare_and_set(session_id, key, expected, value))

    async def alist_sessions(self) -> list[SessionInfo]:
        return await self._in_thread(lambda s: s.list_sessions())

    async def adelete_session(self, session_id: str) -> bool:
        return await self._in_thread(lambda s: s.delete_session(session_id))

    async def adelete_messages(self, session_id: str, ids: Collection[str]) -> int:
        return await self._in_thread(lambda s: s.delete_messages(session_id, ids))

    async def apop_turn(self, session_id: str) -> list[Message]:
        return await self._in_thread(lambda s: s.pop_turn(session_id))

    async def afork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        return await self._in_thread(lambda s: s.fork(session_id, new_session_id, at))

    async def aedit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        return await self._in_thread(lambda s: s.edit_message(session_id, message_id, content))

    async def aclear(self) -> None:
        await self._in_thread(lambda s: s.clear())

    async def apurge_expired(self) -> int:
        return await self._in_thread(lambda s: s.purge_expired())

    async def aclose(self) -> None:
        await self._in_thread(lambda s: s.close())


class AsyncOverThread(ThreadedAsync):
    """An :class:`AsyncStore` over a sync :class:`Store`: what an async memory method uses
    when its store has no async methods of its own."""

    def __init__(self, store: Store) -> None:
        self.store = store
        # A store that can tell, without waiting, whether a call would wait (SQLiteStore).
        # Looked up on the class: a wrapper that delegates by __getattr__ must not hand its
        # calls to the store it wraps.
        self._now: Callable[[Store, Callable[[Store], Any]], Any] | None = getattr(
            type(store), "run_now", None
        )

    def _threaded(self) -> Store:
        return self.store

    async def _short(self, call: Callable[[Store], _T]) -> _T:
        """``call`` at once on this thread when the store says it needn't wait, else in a
        worker thread: a hop to a thread and back costs more than a short SQLite transaction,
        and under load the hops queue behind each other."""
        if self._now is not None:
            try:
                result: _T = self._now(self.store, call)
            except WouldWait:
                pass
            else:
                return result
        return await asyncio.to_thread(call, self.store)

    def __repr__(self) -> str:
        return f"AsyncOverThread({self.store!r})"


def as_async(store: Store | AsyncStore) -> AsyncStore:
    """``store`` itself when it has async methods of its own, else an
    :class:`AsyncOverThread` over it: the async view every async caller of a store uses."""
    return store if isinstance(store, AsyncStore) else AsyncOverThread(store)

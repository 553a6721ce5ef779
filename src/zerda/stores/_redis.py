"""The Redis store: one hash tag per session; a write is one Lua call, a tail one MULTI/EXEC."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidSessionIdError,
    StoreUnavailableError,
    ZerdaError,
)
from zerda.messages import Message, Role
from zerda.stores._base import (
    EMPTY_TAIL,
    AsyncClosingStore,
    ClosingStore,
    SessionInfo,
    Tail,
    TokenCounts,
    check_batch,
    check_retention,
    check_session_id,
    metadata_copy,
)
from zerda.stores._open import redact_target

if TYPE_CHECKING:
    import redis
    import redis.asyncio

__all__ = ["EXPIRE_MARGIN", "AsyncRedisStore", "RedisStore", "open_redis_url"]

_T = TypeVar("_T")
_USER, _SYSTEM = Role.USER, Role.SYSTEM
_NUL = b"\0"

EXPIRE_MARGIN = 60.0
"""Seconds Redis keeps a session's keys past its TTL. The TTL itself is logical (on the
writers' clock, as in every store); the keys' own expiry, set at each write, only frees the
memory of sessions nobody purges, so it must never come first, even with clocks a little apart."""

# Decoded entries and log elements kept per store, by stored bytes: tails overlap from one read
# to the next, and decoding costs more than the read.
_CACHE_SIZE = 4096
_ELEMENT_CACHE_SIZE = 1024
# Sessions per pipeline when listing or purging.
_PIPELINE_SIZE = 500
_PREFIX = re.compile(r"[A-Za-z0-9_.:@+=\-]{1,100}")
_INSTALL_HINT = "pip install 'zerda-memory[redis]'"

# -- key layout -----------------------------------------------------------------------------
#
# One session is three keys sharing the hash tag ``{session_id}``, so that one script or one
# MULTI/EXEC can touch them all on Redis Cluster too (session ids cannot hold braces):
#
#   {prefix}:{id}:meta    hash: created, updated (epoch seconds as Python wrote them), count
#                         (messages in the log), strim (system messages retention dropped from
#                         the log), prelude (1 when the log opens with system messages that
#                         came before any turn), and metadata as "m:<JSON key>" fields
#   {prefix}:{id}:log     list: one element per turn (after the prelude, if any), holding the
#                         turn's messages in order, system messages among them included
#   {prefix}:{id}:system  list: every system message's entry (pinned; retention keeps them)
#
# An entry is "<token counts as a JSON object, or nothing>\n<Message.to_json()>"; an element of
# the log is "<messages>,<system messages>" and then each entry, joined by NUL. JSON never holds
# a raw newline or NUL, so both split cleanly.
#
# Why a turn per element: the newest k turns are then LRANGE log -k -1, a read whose position
# needs nothing read first, so a tail is a plain MULTI/EXEC. Redis serves a tail of 10 turns in
# about 9 µs that way; through a script, which copies every byte into Lua and out again, it took
# about 60 µs of the server everyone shares. The price is on writes that add to an open turn:
# the turn's element is rewritten (LSET), O(the turn).
_SUFFIXES = ("meta", "log", "system")
_META_FIELD = "m:"

# -- Lua: each write is one script (atomic, one round trip) --------------------------------------

_PRELUDE = """
local meta, log, system = KEYS[1], KEYS[2], KEYS[3]
local now, ttl = ARGV[1], ARGV[2]

local function corrupt(what, value)
  error({err = 'ZERDA-CORRUPT ' .. meta .. ': ' .. what .. ' is ' .. tostring(value)})
end

local function number(value, what)
  local n = tonumber(value)
  if n == nil then corrupt(what, value) end
  return n
end

-- Whether a session last written at `updated` has expired at `now` (logical time).
local function expired(updated)
  return ttl ~= '' and number(updated, 'updated') + tonumber(ttl) <= tonumber(now)
end
"""

_WRITE_PRELUDE = (
    _PRELUDE
    + """
-- The session's count, strim and prelude, for a write at `now`. A missing or expired session
-- starts afresh, and so do the remains of one whose meta key is gone (evicted).
local function writable()
  local m = redis.call('HMGET', meta, 'updated', 'count', 'strim', 'prelude')
  if m[1] and not expired(m[1]) then
    return number(m[2], 'count'), number(m[3], 'strim'), number(m[4], 'prelude')
  end
  redis.call('DEL', meta, log, system)
  redis.call('HSET', meta, 'created', now)
  return 0, 0, 0
end

-- Writes the counters, and pushes Redis's own expiry back ('0': none).
local function written(count, strim, prelude, expire_ms)
  redis.call('HSET', meta, 'updated', now, 'count', count, 'strim', strim, 'prelude', prelude)
  if expire_ms ~= '0' then
    for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], expire_ms) end
  end
end
"""
)

# ARGV[3]: expiry in ms ('0': none); ARGV[4]: max messages ('0': keep all); ARGV[5]: messages in
# the batch; ARGV[6]: new turns in it; ARGV[7]: its leading system messages and ARGV[8] what
# follows them up to its first user message (both elements, '' for none); ARGV[9...]: one
# element per new turn, then the entry of each system message of the batch.
_APPEND = (
    _WRITE_PRELUDE
    + """
local function push(key, items, from, to)
  -- in slices: unpack() has a stack limit
  while from <= to do
    local last = math.min(from + 999, to)
    redis.call('RPUSH', key, unpack(items, from, last))
    from = last + 1
  end
end

-- An element's message and system message counts, and where its first entry begins.
local function header(element)
  local m, s, at = string.match(element, '^(%d+),(%d+)()%z')
  if not m then corrupt('a log element', string.sub(element, 1, 40)) end
  return tonumber(m), tonumber(s), at + 1
end

-- `element` with the messages of `piece` (an element too) added at its end.
local function merged(element, piece)
  if piece == '' then return element end
  if element == '' then return piece end
  local m1, s1, at1 = header(element)
  local m2, s2, at2 = header(piece)
  return (m1 + m2) .. ',' .. (s1 + s2) .. '\\0' .. string.sub(element, at1) .. '\\0'
    .. string.sub(piece, at2)
end

local keep, added, groups = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local count, strim, prelude = writable()
local turns = redis.call('LLEN', log) - prelude
if turns > 0 then
  -- Up to its first user message, the batch continues the open turn.
  local more = merged(ARGV[7], ARGV[8])
  if more ~= '' then redis.call('LSET', log, -1, merged(redis.call('LINDEX', log, -1), more)) end
else
  -- No turn yet: system messages join the prelude; the first other message starts a turn.
  if ARGV[7] ~= '' then
    if prelude == 1 then
      redis.call('LSET', log, 0, merged(redis.call('LINDEX', log, 0), ARGV[7]))
    else
      redis.call('RPUSH', log, ARGV[7])
      prelude = 1
    end
  end
  if ARGV[8] ~= '' then redis.call('RPUSH', log, ARGV[8]) end
end
push(log, ARGV, 9, 8 + groups)
push(system, ARGV, 9 + groups, #ARGV)
count = count + added

-- Retention: keep at least `keep` messages, dropping the prelude and whole turns from the
-- front; reads the elements it drops, and one more.
if keep > 0 and count > keep then
  turns = redis.call('LLEN', log) - prelude
  local gone, gone_system = 0, 0
  if prelude == 1 then gone, gone_system = header(redis.call('LINDEX', log, 0)) end
  local dropped = 0
  while dropped + 1 < turns do
    local m, s = header(redis.call('LINDEX', log, prelude + dropped))
    if count - (gone + m) < keep then break end
    gone, gone_system, dropped = gone + m, gone_system + s, dropped + 1
  end
  if dropped > 0 then
    redis.call('LTRIM', log, prelude + dropped, -1)
    count, strim, prelude = count - gone, strim + gone_system, 0
  end
end
written(count, strim, prelude, ARGV[3])
return count
"""
)

# ARGV[3]: expiry in ms; ARGV[4...]: field, value pairs (an empty value deletes the field).
_UPDATE_METADATA = (
    _WRITE_PRELUDE
    + """
local count, strim, prelude = writable()
for i = 4, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', meta, ARGV[i])
  else
    redis.call('HSET', meta, ARGV[i], ARGV[i + 1])
  end
end
written(count, strim, prelude, ARGV[3])
return 1
"""
)

# Deletes the session, even a damaged one; 1 if it was live.
_DELETE = (
    _PRELUDE
    + """
local updated = redis.call('HGET', meta, 'updated')
local live = updated and tonumber(updated) and not expired(updated)
redis.call('DEL', meta, log, system)
if live then return 1 end
return 0
"""
)

# Deletes the session if it has expired (checked here, atomically: a writer may have just
# refreshed it); 1 if it did.
_PURGE = (
    _PRELUDE
    + """
local updated = redis.call('HGET', meta, 'updated')
if updated and tonumber(updated) and expired(updated) then
  redis.call('DEL', meta, log, system)
  return 1
end
return 0
"""
)

# Returns false for no live session, else {created, updated, messages, turns}.
_INFO = (
    _PRELUDE
    + """
local m = redis.call('HMGET', meta, 'created', 'updated', 'count', 'strim', 'prelude')
if not m[2] or expired(m[2]) then return false end
local messages = number(m[3], 'count') + number(m[4], 'strim')
return {m[1], m[2], messages, redis.call('LLEN', log) - number(m[5], 'prelude')}
"""
)

SCRIPTS: dict[str, str] = {
    "append": _APPEND,
    "update_metadata": _UPDATE_METADATA,
    "delete": _DELETE,
    "purge": _PURGE,
    "info": _INFO,
}

# -- what the shared code asks the I/O drivers to do -------------------------------------------

Arg = str | bytes | int


@dataclass(frozen=True, slots=True)
class _Call:
    """Run one script: one round trip."""

    script: str
    keys: tuple[str, ...]
    args: tuple[Arg, ...]


@dataclass(frozen=True, slots=True)
class _Calls:
    """Run scripts in one pipeline (not a transaction); the replies, in order."""

    calls: tuple[_Call, ...]


@dataclass(frozen=True, slots=True)
class _Read:
    """Run read commands in one MULTI/EXEC (one command alone is sent as it is): one round
    trip, one snapshot; the replies, in order."""

    commands: tuple[tuple[Arg, ...], ...]


@dataclass(frozen=True, slots=True)
class _Scan:
    """Every key matching ``match`` (SCAN: several round trips, O(keys in the database))."""

    match: str


_Request = _Call | _Calls | _Read | _Scan
_Flow = Generator[_Request, Any, _T]
"""An operation written once: it yields requests, the sync or async driver sends the replies."""


@dataclass(frozen=True, slots=True)
class _Turn:
    """A decoded log element: every message in order, and those a tail shows (not system
    messages) with their counts."""

    every: tuple[Message, ...]
    shown: tuple[Message, ...]
    counts: tuple[dict[str, Any] | None, ...]


def _redis_module() -> Any:
    try:
        import redis
        import redis.asyncio
    except ImportError as exc:  # pragma: no cover - the extra is installed in development
        raise ConfigurationError(
            f"the Redis store needs redis-py: {_INSTALL_HINT} ({exc})"
        ) from exc
    return redis


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _parts(element: bytes | str) -> list[bytes] | list[str]:
    """A log element cut at its NULs: its header, then its entries."""
    if isinstance(element, bytes):
        return element.split(_NUL)
    return element.split("\0")


class _RedisBase:
    """Everything but the I/O: keys, arguments, the flows of each operation, decoding."""

    def __init__(
        self,
        url: str | None,
        client: Any,
        client_class: str,
        prefix: str,
        ttl: float | None,
        max_messages: int | None,
        clock: Callable[[], float],
    ) -> None:
        module = _redis_module()
        expected = module.asyncio.Redis if client_class == "asyncio.Redis" else module.Redis
        name = type(self).__name__
        if (url is None) == (client is None):
            raise ConfigurationError(
                f"{name} takes a url or a client, exactly one; got "
                f"{'neither' if url is None else 'both'}"
            )
        if url is not None and not isinstance(url, str):
            raise ConfigurationError(f"url must be a redis:// URL string, got {type(url).__name__}")
        if client is not None and not isinstance(client, expected):
            raise ConfigurationError(
                f"{name} takes a redis.{client_class} client, got "
                f"{type(client).__module__}.{type(client).__qualname__}"
            )
        check_retention(ttl, max_messages)
        if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
            raise ConfigurationError(
                f"prefix must be 1 to 100 ASCII letters, digits or _ . : @ + = -, got {prefix!r}"
            )
        if url is not None:
            self.url = redact_target(url)
            try:
                client = expected.from_url(url, **_client_options())
            except ValueError as exc:
                raise ConfigurationError(f"not a Redis URL: {self.url!r}: {exc}") from exc
        else:
            self.url = _describe(getattr(client, "connection_pool", None))
        self._client = client
        self._owns_client = url is not None
        self._decodes_responses = bool(client.get_encoder().decode_responses)
        self._scripts = {key: client.register_script(src) for key, src in SCRIPTS.items()}
        self._errors: tuple[type[Exception], ...] = (module.RedisError,)
        self._response_error: type[Exception] = module.ResponseError
        self.prefix = prefix
        self.ttl = ttl
        self.max_messages = max_messages
        self._clock = clock
        self._ttl_arg = "" if ttl is None else repr(float(ttl))
        self._expire_arg = "0" if ttl is None else str(math.ceil((ttl + EXPIRE_MARGIN) * 1000))
        self._keep_arg = str(max_messages or 0)
        self._head = f"{prefix}:{{"
        self._decoded: dict[bytes | str, tuple[Message, dict[str, Any] | None]] = {}
        self._elements: dict[bytes | str, _Turn] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}, prefix={self.prefix!r})"

    # -- keys and arguments -------------------------------------------------------------------

    def _keys(self, session_id: str) -> tuple[str, ...]:
        check_session_id(session_id)
        head = f"{self._head}{session_id}}}:"
        return tuple(head + suffix for suffix in _SUFFIXES)

    def _clocked(self) -> tuple[str, str]:
        return repr(float(self._clock())), self._ttl_arg

    def _session_of(self, key: bytes | str) -> str | None:
        """The session id in one of this store's keys (``None`` for another key)."""
        text = _text(key)
        if not text.startswith(self._head):
            return None
        session_id, sep, suffix = text[len(self._head) :].rpartition("}:")
        if not sep or suffix not in _SUFFIXES:
            return None
        try:
            return check_session_id(session_id)
        except InvalidSessionIdError:
            return None  # not a key this store wrote

    def _error(self, exc: Exception, doing: str) -> ZerdaError:
        """The Zerda error for a redis-py error (the caller chains it)."""
        text = str(exc)
        where = f"Redis store {self.url}: cannot {doing}"
        # A pipeline's error reads "Command # 2 (...) of pipeline caused error: WRONGTYPE ...".
        corrupt = "WRONGTYPE" in text or "ZERDA-CORRUPT" in text
        if corrupt and isinstance(exc, self._response_error):
            return CorruptDataError(f"{where}: the stored data is not what Zerda writes: {text}")
        return StoreUnavailableError(f"{where}: {type(exc).__name__}: {text}")

    def _closed_error(self) -> StoreUnavailableError:
        return StoreUnavailableError(f"Redis store {self.url} is closed")

    # -- encoding and decoding ----------------------------------------------------------------

    def _entries(
        self, messages: Sequence[Message], given: TokenCounts
    ) -> tuple[list[bytes], list[dict[str, Any] | None]]:
        """Each message's stored entry, and its counts (as a tail decodes them)."""
        n = len(messages)
        counts: list[dict[str, Any] | None]
        if not given:
            heads, counts = [""] * n, [None] * n
        elif len(given) == 1:
            # The common case, one counter: format the objects directly (check_batch made sure
            # the counts are ints).
            ((name, column),) = given.items()
            key = json.dumps(name)
            heads = [f"{{{key}:{c}}}" for c in column]
            counts = [{name: c} for c in column]
        else:
            counts = [{name: c[i] for name, c in given.items()} for i in range(n)]
            heads = [json.dumps(c, separators=(",", ":")) for c in counts]
        entries = []
        for m, head in zip(messages, heads, strict=True):
            try:
                entries.append(f"{head}\n{m.to_json()}".encode())
            except UnicodeEncodeError:
                # A lone surrogate has no UTF-8 form; escaped JSON keeps it exactly.
                body = json.dumps(m.to_dict(), separators=(",", ":"))
                entries.append(f"{head}\n{body}".encode())
        return entries, counts

    @staticmethod
    def _pieces(messages: Sequence[Message], entries: list[bytes]) -> tuple[Arg, ...]:
        """The append script's arguments from ARGV[5] on: the batch cut where turns start."""
        n = len(messages)
        system = [m.role is _SYSTEM for m in messages]
        users = [i for i, m in enumerate(messages) if m.role is _USER]
        first_user = users[0] if users else n
        first_other = next((i for i in range(first_user) if not system[i]), first_user)

        def element(begin: int, end: int) -> bytes:
            if begin == end:
                return b""
            head = f"{end - begin},{sum(system[begin:end])}".encode()
            return _NUL.join([head, *entries[begin:end]])

        turns = [element(a, b) for a, b in itertools.pairwise([*users, n])]
        return (
            str(n),
            str(len(turns)),
            element(0, first_other),
            element(first_other, first_user),
            *turns,
            *(entries[i] for i in range(n) if system[i]),
        )

    def _remember(
        self, entries: list[bytes], messages: Sequence[Message], counts: list[Any]
    ) -> None:
        """Let the next tail find a batch just written already decoded."""
        decoded, n = self._decoded, min(len(entries), _CACHE_SIZE)
        if len(decoded) + n > _CACHE_SIZE:
            decoded.clear()
        for i in range(len(entries) - n, len(entries)):
            key: bytes | str = entries[i].decode() if self._decodes_responses else entries[i]
            decoded[key] = (messages[i], counts[i])

    def _entry(
        self, raw: bytes | str, session_id: str, remember: bool = True
    ) -> tuple[Message, dict[str, Any] | None]:
        # Dropping a whole cache when full keeps every step one dict operation, safe between
        # threads without a lock; messages are immutable, so sharing them is safe.
        hit = self._decoded.get(raw)
        if hit is not None:
            return hit
        try:
            text = _text(raw)
            head, sep, body = text.partition("\n")
            if not sep:
                raise ValueError(f"no newline in {text[:60]!r}")
            message = Message.from_json(body)
            counts = json.loads(head) if head else None
            if counts is not None and not isinstance(counts, dict):
                raise ValueError(f"token counts are not a JSON object: {head[:60]!r}")
        except (ValueError, TypeError) as exc:  # InvalidMessageError is a ValueError
            raise self._corrupt(session_id, f"an entry cannot be decoded: {exc}") from exc
        hit = (message, counts)
        if remember:
            if len(self._decoded) >= _CACHE_SIZE:
                self._decoded.clear()
            self._decoded[raw] = hit
        return hit

    def _element(self, raw: bytes | str, session_id: str, remember: bool = True) -> _Turn:
        """A log element, decoded."""
        hit = self._elements.get(raw)
        if hit is not None:
            return hit
        parts = _parts(raw)
        head = _text(parts[0])
        sizes = head.split(",")
        if (
            len(sizes) != 2
            or not all(x.isdigit() for x in sizes)
            or not 0 < int(sizes[0]) == len(parts) - 1
        ):
            raise self._corrupt(session_id, f"a log element starts {head[:40]!r}")
        decoded = [self._entry(entry, session_id, remember) for entry in parts[1:]]
        shown = [(m, c) for m, c in decoded if m.role is not _SYSTEM]
        hit = _Turn(
            tuple(m for m, _ in decoded),
            tuple(m for m, _ in shown),
            tuple(c for _, c in shown),
        )
        if remember:
            if len(self._elements) >= _ELEMENT_CACHE_SIZE:
                self._elements.clear()
            self._elements[raw] = hit
        return hit

    def _corrupt(self, session_id: str, what: str) -> CorruptDataError:
        return CorruptDataError(f"Redis store {self.url}: session {session_id!r}: {what}")

    def _meta(self, session_id: str, fields: Sequence[Any]) -> list[int] | None:
        """``updated`` checked (``None``: no live session), then the integer fields after it."""
        if not fields or fields[0] is None:
            return None
        try:
            if self.ttl is not None and float(fields[0]) + self.ttl <= self._clock():
                return None
            return [int(x) for x in fields[1:]]
        except (TypeError, ValueError) as exc:
            raise self._corrupt(session_id, f"its meta key reads {list(fields)!r:.200}") from exc

    # -- the operations, written once ----------------------------------------------------------

    def _append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None
    ) -> _Flow[None]:
        check_batch(messages, tokens)
        keys = self._keys(session_id)
        entries, counts = self._entries(messages, tokens or {})
        now, ttl = self._clocked()
        args = (now, ttl, self._expire_arg, self._keep_arg, *self._pieces(messages, entries))
        yield _Call("append", keys, args)
        self._remember(entries, messages, counts)

    def _tail(self, session_id: str, turns: int | None, counter: str | None) -> _Flow[Tail]:
        meta, log, system = self._keys(session_id)
        wanted = None if turns is None else max(0, turns)
        commands: list[tuple[Arg, ...]] = [
            ("HMGET", meta, "updated", "count", "strim", "prelude"),
            ("LLEN", log),
            ("LRANGE", system, 0, -1),
        ]
        if wanted != 0:
            commands.append(("LRANGE", log, 0 if wanted is None else -wanted, -1))
        replies = yield _Read(tuple(commands))
        fields = self._meta(session_id, replies[0])
        if fields is None:
            return EMPTY_TAIL
        count, strim, prelude = fields
        total_turns = int(replies[1]) - prelude
        n = total_turns if wanted is None else min(wanted, total_turns)
        elements = replies[3][len(replies[3]) - n :] if n > 0 else []
        messages: list[Message] = []
        offsets: list[int] = []
        tokens: list[int | None] = []
        element = self._element
        for raw in elements:
            turn = element(raw, session_id)
            if turn.every[0].role is _SYSTEM:
                raise self._corrupt(session_id, "an element of its log does not start a turn")
            offsets.append(len(messages))
            messages.extend(turn.shown)
            if counter is not None:
                tokens.extend([c.get(counter) if c else None for c in turn.counts])
        pinned = [self._entry(raw, session_id) for raw in replies[2]]
        system_tokens: list[int | None] = []
        if counter is not None:
            system_tokens = [counts.get(counter) if counts else None for _, counts in pinned]
        return Tail(
            tuple(m for m, _ in pinned),
            messages,
            offsets,
            total_turns,
            strim + count,
            tokens if counter is not None else (),
            system_tokens if counter is not None else (),
        )

    def _history(self, session_id: str) -> _Flow[list[Message]]:
        meta, log, system = self._keys(session_id)
        replies = yield _Read(
            (("HMGET", meta, "updated", "strim"), ("LRANGE", system, 0, -1), ("LRANGE", log, 0, -1))
        )
        fields = self._meta(session_id, replies[0])
        if fields is None:
            return []
        # A whole session would flush the caches of the tails that memories read again.
        out = [self._entry(raw, session_id, remember=False)[0] for raw in replies[1][: fields[0]]]
        for raw in replies[2]:
            out.extend(self._element(raw, session_id, remember=False).every)
        return out

    def _get_metadata(self, session_id: str) -> _Flow[dict[str, Any]]:
        (reply,) = yield _Read((("HGETALL", self._keys(session_id)[0]),))
        # redis-py gives a dict (its callback), or the flat list a bare RESP2 reply is.
        pairs = (
            dict(zip(reply[::2], reply[1::2], strict=True)) if isinstance(reply, list) else reply
        )
        fields = {_text(k): v for k, v in (pairs or {}).items()}
        if self._meta(session_id, [fields.get("updated")]) is None:
            return {}
        metadata: dict[str, Any] = {}
        for name, value in fields.items():
            if name.startswith(_META_FIELD):
                try:
                    metadata[json.loads(name[len(_META_FIELD) :])] = json.loads(value)
                except ValueError as exc:
                    raise self._corrupt(
                        session_id, f"its metadata field {name!r} cannot be decoded: {exc}"
                    ) from exc
        return metadata

    def _update_metadata(self, session_id: str, values: Mapping[str, Any]) -> _Flow[None]:
        copied = metadata_copy(values)
        keys = self._keys(session_id)
        pairs: list[str] = []
        for key, value in copied.items():
            # ASCII JSON for both: any key and value round-trips, and "" (deletes) is never JSON.
            pairs.append(_META_FIELD + json.dumps(key))
            pairs.append("" if value is None else json.dumps(value, separators=(",", ":")))
        yield _Call("update_metadata", keys, (*self._clocked(), self._expire_arg, *pairs))

    def _list_sessions(self) -> _Flow[list[SessionInfo]]:
        found = yield _Scan(f"{self._head}*}}:meta")
        ids = sorted({s for s in map(self._session_of, found) if s is not None})
        clocked = self._clocked()
        out: list[SessionInfo] = []
        for chunk in _chunks(ids, _PIPELINE_SIZE):
            replies = yield _Calls(tuple(_Call("info", self._keys(s), clocked) for s in chunk))
            for session_id, reply in zip(chunk, replies, strict=True):
                if not reply:
                    continue  # expired, or deleted since the scan
                try:
                    created, updated = float(reply[0]), float(reply[1])
                    messages, turns = int(reply[2]), int(reply[3])
                except (TypeError, ValueError) as exc:
                    raise self._corrupt(session_id, f"its meta key reads {reply!r:.200}") from exc
                expires = None if self.ttl is None else updated + self.ttl
                out.append(SessionInfo(session_id, messages, turns, created, updated, expires))
        return out

    def _delete_session(self, session_id: str) -> _Flow[bool]:
        reply = yield _Call("delete", self._keys(session_id), self._clocked())
        return bool(reply)

    def _clear(self) -> _Flow[None]:
        # Every key of the prefix, meta or not: remains of evicted sessions go too.
        found = yield _Scan(f"{self._head}*}}:*")
        ids = sorted({s for s in map(self._session_of, found) if s is not None})
        clocked = self._clocked()
        for chunk in _chunks(ids, _PIPELINE_SIZE):
            yield _Calls(tuple(_Call("delete", self._keys(s), clocked) for s in chunk))

    def _purge_expired(self) -> _Flow[int]:
        if self.ttl is None:
            return 0
        found = yield _Scan(f"{self._head}*}}:meta")
        ids = sorted({s for s in map(self._session_of, found) if s is not None})
        clocked = self._clocked()
        purged = 0
        for chunk in _chunks(ids, _PIPELINE_SIZE):
            replies = yield _Calls(tuple(_Call("purge", self._keys(s), clocked) for s in chunk))
            purged += sum(int(r) for r in replies)
        return purged


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    return (items[i : i + size] for i in range(0, len(items), size))


def _client_options() -> dict[str, Any]:
    """Options of the clients a store makes from a URL (the URL's own query overrides them).

    redis-py retries a command whose connection failed; an append whose reply was lost would
    then be stored twice. So no retries: a failure is one clean StoreUnavailableError, and the
    next call reconnects (the pool replaces connections the server closed).
    """
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {
        "retry": Retry(NoBackoff(), 0),
        "socket_connect_timeout": 5.0,
        "socket_timeout": 30.0,
    }


def open_redis_url(url: str, **options: Any) -> RedisStore:
    """A :class:`RedisStore` for ``url``, which may name its key prefix: ``?prefix=NAME``
    (what ``open_store`` and ``zerda --db`` accept; every other part goes to redis-py)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    prefixes = [value for name, value in query if name == "prefix"]
    if prefixes:
        options.setdefault("prefix", prefixes[-1])
        rest = urlencode([(name, value) for name, value in query if name != "prefix"])
        url = urlunsplit(parts._replace(query=rest))
    return RedisStore(url, **options)


def _describe(pool: Any) -> str:
    """``redis://host:port/db`` for a client's pool (never its password)."""
    kwargs = getattr(pool, "connection_kwargs", {})
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


class RedisStore(_RedisBase, ClosingStore):
    """Sessions in Redis, shared by any number of workers.

    Give a ``url`` (``redis://[:password@]host:port/db``, ``rediss://`` for TLS,
    ``unix:///path.sock``) or a ``client`` (a ``redis.Redis``, which the store uses as it is
    and never closes). Each ``append`` is one Lua script call: the batch, its token counts,
    the turn index, retention and expiry in one atomic step, so concurrent writers never
    interleave and a call that fails stores nothing. Each ``tail`` is one MULTI/EXEC reading
    the newest turns and the pinned system messages, whatever the session's length. Keys are
    ``{prefix}:{session_id}:meta|log|system``; the braces make a session one hash slot, for
    Redis Cluster.

    ``ttl`` and ``max_messages`` behave as in :class:`~zerda.stores.InMemoryStore`; with a
    ``ttl``, each write also sets Redis's own expiry on the session's keys (ttl +
    :data:`EXPIRE_MARGIN`), so abandoned sessions free their memory unpurged. Listing,
    clearing and purging SCAN the prefix's keys: O(keys in the database), for admin work;
    ``clear`` is not atomic against concurrent writers.

    A server that cannot be reached raises :class:`~zerda.StoreUnavailableError` (the URL
    without its password, redis-py's error chained); once it is back, the same store works
    again. A store made from a URL does not retry: a write whose reply was lost may have been
    stored, and a retry would store it twice (give a ``client`` to choose otherwise). Stored
    data that is not Zerda's raises :class:`~zerda.CorruptDataError`.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.Redis | None = None,
        prefix: str = "zerda",
        ttl: float | None = None,
        max_messages: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, client, "Redis", prefix, ttl, max_messages, clock)
        self.client: redis.Redis = self._client

    def _drive(self, flow: _Flow[_T], doing: str) -> _T:
        if self._closed:
            raise self._closed_error()
        reply: Any = None
        while True:
            try:
                request = flow.send(reply)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            try:
                reply = self._execute(request)
            except self._errors as exc:
                raise self._error(exc, doing) from exc

    def _execute(self, request: _Request) -> Any:
        if isinstance(request, _Call):
            return self._scripts[request.script](request.keys, request.args)
        if isinstance(request, _Read):
            client: Any = self.client  # redis-py leaves execute_command untyped
            if len(request.commands) == 1:
                return [client.execute_command(*request.commands[0])]
            pipe = client.pipeline(transaction=True)
            for command in request.commands:
                pipe.execute_command(*command)
            return pipe.execute()
        if isinstance(request, _Calls):
            pipe = self.client.pipeline(transaction=False)
            for call in request.calls:
                self._scripts[call.script](call.keys, call.args, client=pipe)
            return pipe.execute()
        return list(self.client.scan_iter(match=request.match, count=1000))

    # -- the contract ----------------------------------------------------------------------------

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> None:
        self._drive(self._append(session_id, messages, tokens), f"append to {session_id!r}")

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self._drive(self._tail(session_id, turns, counter), f"read {session_id!r}")

    def history(self, session_id: str) -> list[Message]:
        return self._drive(self._history(session_id), f"read {session_id!r}")

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        return self._drive(self._get_metadata(session_id), f"read {session_id!r}")

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self._drive(self._update_metadata(session_id, values), f"write {session_id!r}")

    def list_sessions(self) -> list[SessionInfo]:
        return self._drive(self._list_sessions(), "list sessions")

    def delete_session(self, session_id: str) -> bool:
        return self._drive(self._delete_session(session_id), f"delete {session_id!r}")

    def clear(self) -> None:
        self._drive(self._clear(), "clear")

    def purge_expired(self) -> int:
        return self._drive(self._purge_expired(), "purge expired sessions")

    def close(self) -> None:
        """Close the client the store made (not one it was given); later calls raise."""
        if self._closed:
            return
        self._closed = True
        if self._owns_client:
            self.client.close()


class AsyncRedisStore(_RedisBase, AsyncClosingStore):
    """The async protocol over ``redis.asyncio``: :class:`RedisStore`'s keys, scripts and
    behaviour, each call awaited on the event loop (never a blocking call in ``async def``).

    Give a ``url`` or a ``client`` (a ``redis.asyncio.Redis``, never closed by the store).
    Like redis.asyncio's clients, a store belongs to the event loop that first uses it; on
    another loop it raises :class:`~zerda.ZerdaError` before sending anything. It has no sync
    methods on purpose: a memory over it uses its async methods natively. Close with ``await
    store.aclose()`` or ``async with``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        client: redis.asyncio.Redis | None = None,
        prefix: str = "zerda",
        ttl: float | None = None,
        max_messages: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(url, client, "asyncio.Redis", prefix, ttl, max_messages, clock)
        self.client: redis.asyncio.Redis = self._client
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _drive(self, flow: _Flow[_T], doing: str) -> _T:
        if self._closed:
            raise self._closed_error()
        # redis.asyncio's connections belong to the loop that opened them: on another loop
        # they fail in the middle of a command, after it may have been sent. Refuse up front.
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise ZerdaError(
                f"{self!r} was first used on another event loop, and redis.asyncio clients "
                "belong to one loop: make the store (and its client) in the loop that uses it"
            )
        reply: Any = None
        while True:
            try:
                request = flow.send(reply)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            try:
                reply = await self._execute(request)
            except self._errors as exc:
                raise self._error(exc, doing) from exc

    async def _execute(self, request: _Request) -> Any:
        if isinstance(request, _Call):
            return await self._scripts[request.script](request.keys, request.args)
        if isinstance(request, _Read):
            client: Any = self.client  # redis-py leaves execute_command untyped
            if len(request.commands) == 1:
                return [await client.execute_command(*request.commands[0])]
            async with client.pipeline(transaction=True) as pipe:
                for command in request.commands:
                    pipe.execute_command(*command)
                return await pipe.execute()
        if isinstance(request, _Calls):
            async with self.client.pipeline(transaction=False) as pipe:
                for call in request.calls:
                    await self._scripts[call.script](call.keys, call.args, client=pipe)
                return await pipe.execute()
        return [key async for key in self.client.scan_iter(match=request.match, count=1000)]

    # -- the contract ----------------------------------------------------------------------------

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> None:
        await self._drive(self._append(session_id, messages, tokens), f"append to {session_id!r}")

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return await self._drive(self._tail(session_id, turns, counter), f"read {session_id!r}")

    async def ahistory(self, session_id: str) -> list[Message]:
        return await self._drive(self._history(session_id), f"read {session_id!r}")

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        return await self._drive(self._get_metadata(session_id), f"read {session_id!r}")

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        await self._drive(self._update_metadata(session_id, values), f"write {session_id!r}")

    async def alist_sessions(self) -> list[SessionInfo]:
        return await self._drive(self._list_sessions(), "list sessions")

    async def adelete_session(self, session_id: str) -> bool:
        return await self._drive(self._delete_session(session_id), f"delete {session_id!r}")

    async def aclear(self) -> None:
        await self._drive(self._clear(), "clear")

    async def apurge_expired(self) -> int:
        return await self._drive(self._purge_expired(), "purge expired sessions")

    async def aclose(self) -> None:
        """Close the client the store made (not one it was given); later calls raise."""
        if self._closed:
            return
        self._closed = True
        # A client opened on a loop that has ended has nothing left to close from here.
        if self._owns_client and self._loop in (None, asyncio.get_running_loop()):
            await self.client.aclose()

"""The in-memory store: a process-local log per session, safe to share between threads."""

from __future__ import annotations

import bisect
import itertools
import json
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from zerda.messages import PINNED, Message, Role
from zerda.parts import Part
from zerda.stores._base import (
    SessionInfo,
    Since,
    Tail,
    TokenCounts,
    check_batch,
    check_ids,
    check_retention,
    check_session_id,
    edited,
    empty_tail,
    message_not_found,
    metadata_copy,
    new_ids,
    newest_turn_start,
    same_json,
    session_exists,
)

__all__ = ["InMemoryStore"]

_USER = Role.USER
_ID = attrgetter("id")
# Numbers the states of a session's log that appends alone lead to (see _Session.generation).
_GENERATIONS = itertools.count()


@dataclass(slots=True)
class _Session:
    created_at: float
    updated_at: float
    # The log, from absolute position ``base`` on (retention drops its front).
    messages: list[Message] = field(default_factory=list)
    base: int = 0
    # Absolute position where each turn starts: every user message, and the first non-system
    # message when the conversation opens without one.
    turn_starts: list[int] = field(default_factory=list)
    # Every system message (pinned; retention keeps them), their absolute positions, and how
    # many of them are no longer in ``messages``.
    system: list[Message] = field(default_factory=list)
    system_at: list[int] = field(default_factory=list)
    system_trimmed: int = 0
    # Counter name -> one count per message of ``messages`` / of ``system`` (None: not counted).
    tokens: dict[str, list[int | None]] = field(default_factory=dict)
    system_tokens: dict[str, list[int | None]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    # The ids of the messages ``history`` holds.
    ids: set[str] = field(default_factory=set)
    # Changes whenever the log changes other than by an append (an edit rebuilds the session,
    # a trim renumbers it): a cursor of another generation is stale (see tail_since).
    generation: int = field(default_factory=_GENERATIONS.__next__)

    @property
    def message_count(self) -> int:
        return self.system_trimmed + len(self.messages)


class InMemoryStore:
    """Keeps sessions in this process: the default store, and the reference for the contract.

    Appends are atomic per batch; reads return copies. It does no I/O, so its async methods
    run inline and never block the event loop. ``ttl`` expires a session that many seconds
    after its last write; ``max_messages`` keeps at least the last N messages of a session,
    dropping whole turns (system messages are kept).
    """

    def __init__(
        self,
        *,
        ttl: float | None = None,
        max_messages: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        check_retention(ttl, max_messages)
        self.ttl = ttl
        self.max_messages = max_messages
        self._clock = clock
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"InMemoryStore(sessions={len(self._sessions)})"

    # -- helpers (call with the lock held) ----------------------------------------------------

    def _live(self, session_id: str) -> _Session | None:
        try:
            session = self._sessions.get(session_id)
        except TypeError:  # an unhashable id (a list, a dict): invalid, say so below
            session = None
        if session is None:
            check_session_id(session_id)  # a stored id was checked when it was created
            return None
        if self.ttl is not None and self._expired(session, self._clock()):
            return None  # reads have no side effects: purge_expired() deletes it
        return session

    def _expired(self, session: _Session, now: float) -> bool:
        return self.ttl is not None and session.updated_at + self.ttl <= now

    def _writable(self, session_id: str) -> _Session:
        session = self._live(session_id)
        now = self._clock()
        if session is None:
            session = self._sessions[session_id] = _Session(created_at=now, updated_at=now)
        session.updated_at = now
        return session

    # -- the contract ---------------------------------------------------------------------------

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        check_batch(messages, tokens)
        with self._lock:
            return self._append(session_id, messages, tokens)

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        check_batch(messages, tokens)
        with self._lock:
            stored = self._append(session_id, messages, tokens)
            return stored, self._tail(session_id, turns, counter)

    def _append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None
    ) -> int:
        session = self._writable(session_id)
        given: Mapping[str, Sequence[int | None]] = tokens or {}
        held = session.ids
        if held and not held.isdisjoint(map(_ID, messages)):  # a retry, in part or whole
            keep = new_ids(messages, held.__contains__)
            messages = [messages[i] for i in keep]
            given = {name: [counts[i] for i in keep] for name, counts in given.items()}
        _add_batch(session, messages, given)
        if self.max_messages is not None and len(session.messages) > self.max_messages:
            _trim(session, self.max_messages)
        return len(messages)

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        with self._lock:
            return self._tail(session_id, turns, counter)

    def _tail(self, session_id: str, turns: int | None, counter: str | None) -> Tail:
        """The tail, with the lock held."""
        session = self._live(session_id)
        if session is None:
            return empty_tail()
        starts, log, base = session.turn_starts, session.messages, session.base
        n = len(starts) if turns is None else max(0, min(turns, len(starts)))
        begin = (starts[-n] if n else base + len(log)) - base
        column = session.tokens.get(counter) if counter is not None else None
        system_at = session.system_at
        if not system_at or system_at[-1] < begin + base:
            # The common case: no system message among the picked turns; plain slices.
            messages: Sequence[Message] = log[begin:]
            first = begin + base
            offsets: Sequence[int] = [s - first for s in starts[len(starts) - n :]]
            tokens: Sequence[int | None] = column[begin:] if column is not None else ()
        else:
            picked = [s - base for s in starts[len(starts) - n :]]
            messages, offsets, tokens = _without_system(log, column, begin, picked)
        if counter is None:
            system_tokens: Sequence[int | None] = ()
        else:
            system_column = session.system_tokens.get(counter)
            system_tokens = list(system_column) if system_column else [None] * len(session.system)
            if column is None:
                tokens = [None] * len(messages)
        return Tail(
            tuple(session.system),
            messages,
            offsets,
            len(starts),
            session.system_trimmed + len(log),  # session.message_count
            tokens,
            system_tokens,
            _copy(session.metadata) if session.metadata else {},
            (session.generation, base + len(log)),
        )

    def tail_since(
        self, session_id: str, cursor: object, counter: str | None = None
    ) -> Since | None:
        """What the session gained after ``cursor`` (a :attr:`Tail.cursor` or
        :attr:`Since.cursor` of this store): see :class:`~zerda.stores._base.Since`.

        Costs what was appended since, not what the session holds."""
        if (
            type(cursor) is not tuple
            or len(cursor) != 2
            or not all(type(part) is int for part in cursor)
        ):
            return None  # not a cursor of this store
        generation, end = cursor
        with self._lock:
            session = self._live(session_id)
            if session is None or generation != session.generation:
                return None
            log, base = session.messages, session.base
            now = base + len(log)
            if not base <= end <= now:
                return None
            starts = session.turn_starts
            total = session.system_trimmed + len(log)
            if end == now:
                return Since((), (), (), len(starts), total, cursor)
            system_at = session.system_at
            if system_at and system_at[-1] >= end:
                return None  # a pinned message came: the caller reads the tail again
            column = session.tokens.get(counter) if counter is not None else None
            new = log[end - base :]
            first = bisect.bisect_left(starts, end)
            return Since(
                new,
                column[end - base :] if column is not None else [None] * len(new),
                [s - end for s in starts[first:]],
                len(starts),
                total,
                (generation, now),
            )

    def history(self, session_id: str) -> list[Message]:
        with self._lock:
            session = self._live(session_id)
            if session is None:
                return []
            return session.system[: session.system_trimmed] + session.messages

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        with self._lock:
            session = self._live(session_id)
            return _copy(session.metadata) if session else {}

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        copied = metadata_copy(values)
        with self._lock:
            _merge(self._writable(session_id).metadata, copied)

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        copied = metadata_copy({key: value}, reserved=True)
        wanted = metadata_copy({key: expected}, reserved=True)[key]
        with self._lock:
            session = self._live(session_id)
            current = session.metadata.get(key) if session is not None else None
            if not same_json(current, wanted):
                return False
            _merge(self._writable(session_id).metadata, copied)
            return True

    def list_sessions(self) -> list[SessionInfo]:
        with self._lock:
            now = self._clock()
            return [
                SessionInfo(
                    session_id,
                    s.message_count,
                    len(s.turn_starts),
                    s.created_at,
                    s.updated_at,
                    None if self.ttl is None else s.updated_at + self.ttl,
                )
                for session_id, s in sorted(self._sessions.items())
                if not self._expired(s, now)
            ]

    def delete_session(self, session_id: str) -> bool:
        with self._lock:
            existed = self._live(session_id) is not None
            self._sessions.pop(session_id, None)
            return existed

    # -- editing the log: each rebuilds the session from its edited history -----------------

    def delete_messages(self, session_id: str, ids: Collection[str]) -> int:
        wanted = set(check_ids(ids))
        with self._lock:
            session = self._live(session_id)
            if session is None:
                return 0
            history, columns = _session_state(session)
            keep = [i for i, m in enumerate(history) if m.id not in wanted]
            if len(keep) < len(history):
                self._rebuild(session_id, session, history, columns, keep)
            return len(history) - len(keep)

    def pop_turn(self, session_id: str) -> list[Message]:
        with self._lock:
            session = self._live(session_id)
            if session is None:
                return []
            history, columns = _session_state(session)
            start = newest_turn_start(history)
            if start is None:
                return []
            popped = [m for m in history[start:] if m.role not in PINNED]
            keep = [i for i, m in enumerate(history) if i < start or m.role in PINNED]
            self._rebuild(session_id, session, history, columns, keep)
            return popped

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        check_session_id(new_session_id)
        with self._lock:
            source = self._live(session_id)
            history, columns = _session_state(source) if source else ([], {})
            end = len(history)
            if at is not None:
                found = next((i for i, m in enumerate(history) if m.id == at), None)
                if found is None:
                    raise message_not_found(session_id, at)
                end = found + 1
            target = self._live(new_session_id)
            if target is not None and (target.message_count or target.metadata):
                raise session_exists(new_session_id)
            if source is None:
                return 0
            now = self._clock()
            self._sessions[new_session_id] = _restore_session(
                now,
                now,
                _copy(source.metadata),
                history[:end],
                {name: counts[:end] for name, counts in columns.items()},
            )
            return end

    def edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        with self._lock:
            session = self._live(session_id)
            history, columns = _session_state(session) if session else ([], {})
            where = next((i for i, m in enumerate(history) if m.id == message_id), None)
            if session is None or where is None:
                raise message_not_found(session_id, message_id)
            new = edited(history[where], content, self._clock())
            history[where] = new
            for counts in columns.values():
                counts[where] = None
            self._rebuild(session_id, session, history, columns, range(len(history)))
            return new

    def _rebuild(
        self,
        session_id: str,
        session: _Session,
        history: list[Message],
        columns: dict[str, list[int | None]],
        keep: Sequence[int],
    ) -> None:
        """Replace ``session`` by one holding the messages of ``history`` at ``keep``: a write
        (it refreshes the session's time)."""
        self._sessions[session_id] = _restore_session(
            session.created_at,
            self._clock(),
            session.metadata,
            [history[i] for i in keep],
            {name: [counts[i] for i in keep] for name, counts in columns.items()},
        )

    def clear(self) -> None:
        with self._lock:
            self._sessions.clear()

    def purge_expired(self) -> int:
        with self._lock:
            now = self._clock()
            expired = [sid for sid, s in self._sessions.items() if self._expired(s, now)]
            for sid in expired:
                del self._sessions[sid]
            return len(expired)

    def close(self) -> None:
        """Nothing to release; the sessions stay readable."""

    # -- async twins: inline, there is no I/O to wait for ------------------------------------

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        return self.append(session_id, messages, tokens)

    async def aappend_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        return self.append_then_tail(session_id, messages, tokens, turns, counter)

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self.tail(session_id, turns, counter)

    async def atail_since(
        self, session_id: str, cursor: object, counter: str | None = None
    ) -> Since | None:
        return self.tail_since(session_id, cursor, counter)

    async def ahistory(self, session_id: str) -> list[Message]:
        return self.history(session_id)

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        return self.get_metadata(session_id)

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self.update_metadata(session_id, values)

    async def acompare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return self.compare_and_set(session_id, key, expected, value)

    async def alist_sessions(self) -> list[SessionInfo]:
        return self.list_sessions()

    async def adelete_session(self, session_id: str) -> bool:
        return self.delete_session(session_id)

    async def adelete_messages(self, session_id: str, ids: Collection[str]) -> int:
        return self.delete_messages(session_id, ids)

    async def apop_turn(self, session_id: str) -> list[Message]:
        return self.pop_turn(session_id)

    async def afork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        return self.fork(session_id, new_session_id, at)

    async def aedit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        return self.edit_message(session_id, message_id, content)

    async def aclear(self) -> None:
        self.clear()

    async def apurge_expired(self) -> int:
        return self.purge_expired()

    async def aclose(self) -> None:
        self.close()


def _copy(metadata: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of stored metadata (JSON values), for a caller to keep."""
    return json.loads(json.dumps(metadata)) if metadata else {}


def _merge(metadata: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value


def _add_batch(
    session: _Session, messages: Sequence[Message], given: Mapping[str, Sequence[int | None]]
) -> None:
    """Append a checked batch and its counts to the log, indexing turns, system messages and
    ids (whose messages the session must not hold already)."""
    log, starts = session.messages, session.turn_starts
    end = session.base + len(log)
    system_from = len(session.system)
    ids = session.ids
    for i, m in enumerate(messages, end):
        if m.id is not None:
            ids.add(m.id)
        role = m.role
        if role is _USER or (not starts and role not in PINNED):
            starts.append(i)
        elif role in PINNED:
            session.system_at.append(i)
            session.system.append(m)
    log.extend(messages)
    _extend_columns(session.tokens, given, len(messages), end - session.base)
    if len(session.system) > system_from:
        system_counts = {
            name: [c for c, m in zip(counts, messages, strict=True) if m.role in PINNED]
            for name, counts in given.items()
        }
        _extend_columns(
            session.system_tokens,
            system_counts,
            len(session.system) - system_from,
            system_from,
        )


def _extend_columns(
    columns: dict[str, list[int | None]],
    given: Mapping[str, Sequence[int | None]],
    added: int,
    before: int,
) -> None:
    """Append ``added`` counts to every column, ``None`` where a counter gave none."""
    if given.keys() == columns.keys():  # the common case: the counters that counted before
        for name, column in columns.items():
            column.extend(given[name])
        return
    for name in given.keys() - columns.keys():
        columns[name] = [None] * before
    for name, column in columns.items():
        counts = given.get(name)
        column.extend(counts if counts is not None else [None] * added)


def _session_state(session: _Session) -> tuple[list[Message], dict[str, list[int | None]]]:
    """What :func:`_restore_session` needs to rebuild ``session`` (besides its times and
    metadata): its ``history`` and each counter's counts over it (``None``: not counted)."""
    pinned = session.system_trimmed
    columns: dict[str, list[int | None]] = {}
    for name in session.tokens.keys() | session.system_tokens.keys():
        system_column = session.system_tokens.get(name)
        column = session.tokens.get(name)
        counts: list[int | None] = (
            [None] * pinned if system_column is None else system_column[:pinned]
        )
        counts.extend([None] * len(session.messages) if column is None else column)
        columns[name] = counts
    return session.system[:pinned] + session.messages, columns


def _restore_session(
    created_at: float,
    updated_at: float,
    metadata: dict[str, Any],
    history: Sequence[Message],
    tokens: Mapping[str, Sequence[int | None]],
) -> _Session:
    """Rebuild a session from :func:`_session_state`'s parts, replaying its history as one
    batch. The system messages that retention kept lead the history, before any turn, so in
    the log they read, count and get trimmed exactly as when they were kept apart from it."""
    session = _Session(created_at, updated_at, metadata=metadata)
    _add_batch(session, history, tokens)
    return session


def _trim(session: _Session, keep: int) -> None:
    """Drop the oldest whole turns while at least ``keep`` messages stay."""
    end = session.base + len(session.messages)
    starts = session.turn_starts
    j = bisect.bisect_right(starts, end - keep) - 1  # the newest turn start keeping >= keep
    if j <= 0:
        return
    cut = starts[j] - session.base
    session.system_trimmed = bisect.bisect_left(session.system_at, starts[j])
    # The dropped messages leave history; the system messages among them stay (pinned).
    session.ids.difference_update(
        m.id for m in session.messages[:cut] if m.id is not None and m.role not in PINNED
    )
    del session.messages[:cut]
    for column in session.tokens.values():
        del column[:cut]
    del starts[:j]
    session.base += cut
    session.generation = next(_GENERATIONS)


def _without_system(
    log: list[Message], column: list[int | None] | None, begin: int, picked: Sequence[int]
) -> tuple[list[Message], list[int], list[int | None]]:
    """The slice ``log[begin:]`` less its system messages, with turn offsets and counts."""
    messages: list[Message] = []
    tokens: list[int | None] = []
    offsets: list[int] = []
    starts = iter(picked)
    next_start = next(starts, -1)
    for i in range(begin, len(log)):
        m = log[i]
        if m.role in PINNED:
            continue
        if i == next_start:
            offsets.append(len(messages))
            next_start = next(starts, -1)
        messages.append(m)
        if column is not None:
            tokens.append(column[i])
    return messages, offsets, tokens

"""The in-memory store: a process-local log per session, safe to share between threads."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from zerda.messages import Message, Role

__all__ = ["InMemoryStore", "Tail", "TokenCounts"]

_USER, _SYSTEM = Role.USER, Role.SYSTEM

TokenCounts = Mapping[str, Sequence[int]]
"""Token counts of a batch, by counter name: ``{"tiktoken:o200k_base": [12, 40, ...]}``, one
count per message of the batch, in order."""


@dataclass(slots=True)  # not frozen: built on every read, and frozen init is slow
class Tail:
    """The end of a session as a memory needs it.

    ``messages`` holds the non-system messages of the newest turns asked for, oldest first,
    starting on a turn boundary; ``turn_starts`` gives the offset in ``messages`` where each of
    those turns starts. ``system`` holds every system message of the session (they are pinned).
    ``tokens`` and ``system_tokens`` hold, for the counter asked for, each message's stored
    count, or ``None`` where no count by that counter was stored; both are empty when no
    counter was asked for.
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


_EMPTY = Tail((), (), (), 0, 0)


@dataclass(slots=True)
class _Session:
    messages: list[Message] = field(default_factory=list)
    # Index in ``messages`` where each turn starts: every user message, and the first
    # non-system message when the conversation opens without one.
    turn_starts: list[int] = field(default_factory=list)
    system_at: list[int] = field(default_factory=list)
    system: list[Message] = field(default_factory=list)
    # Counter name -> one count per message of ``messages`` (None where not counted).
    tokens: dict[str, list[int | None]] = field(default_factory=dict)


class InMemoryStore:
    """Keeps sessions in this process. Appends are atomic per batch; reads return copies.

    It does no I/O, so its async methods run inline: they never block the event loop.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> None:
        """Append a batch atomically, with its token counts if given (one per message)."""
        if tokens:
            for name, counts in tokens.items():
                if len(counts) != len(messages):
                    raise ValueError(
                        f"{len(counts)} token counts by {name!r} for {len(messages)} messages"
                    )
        with self._lock:
            session = self._sessions.setdefault(session_id, _Session())
            log, starts = session.messages, session.turn_starts
            before = len(log)
            for i, m in enumerate(messages, before):
                role = m.role
                if role is _USER or (not starts and role is not _SYSTEM):
                    starts.append(i)
                elif role is _SYSTEM:
                    session.system_at.append(i)
                    session.system.append(m)
            log.extend(messages)
            given = tokens or {}
            for name in given.keys() - session.tokens.keys():
                session.tokens[name] = [None] * before
            for name, column in session.tokens.items():
                column.extend(given.get(name) or [None] * len(messages))

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        """The newest ``turns`` turns (all for ``None``), the pinned system messages and, when
        ``counter`` names a counter, the stored counts by it."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return _EMPTY
            starts, log = session.turn_starts, session.messages
            n = len(starts) if turns is None else max(0, min(turns, len(starts)))
            begin = starts[-n] if n else len(log)
            picked = starts[len(starts) - n :]
            column = session.tokens.get(counter) if counter is not None else None
            system_at = session.system_at
            if not system_at or system_at[-1] < begin:
                # The common case: no system message among the picked turns; plain slices.
                messages: Sequence[Message] = log[begin:]
                offsets: Sequence[int] = [s - begin for s in picked]
                tokens: Sequence[int | None] = column[begin:] if column is not None else ()
            else:
                messages, offsets, tokens = _without_system(log, column, begin, picked)
            system = tuple(session.system)
            if counter is None:
                system_tokens: Sequence[int | None] = ()
            elif column is None:
                system_tokens = [None] * len(system_at)
                tokens = [None] * len(messages)
            else:
                system_tokens = [column[i] for i in system_at]
            return Tail(system, messages, offsets, len(starts), len(log), tokens, system_tokens)

    def history(self, session_id: str) -> list[Message]:
        with self._lock:
            session = self._sessions.get(session_id)
            return list(session.messages) if session else []

    def clear(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> None:
        self.append(session_id, messages, tokens)

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self.tail(session_id, turns, counter)

    async def ahistory(self, session_id: str) -> list[Message]:
        return self.history(session_id)

    async def aclear(self, session_id: str) -> None:
        self.clear(session_id)


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
        if m.role is Role.SYSTEM:
            continue
        if i == next_start:
            offsets.append(len(messages))
            next_start = next(starts, -1)
        messages.append(m)
        if column is not None:
            tokens.append(column[i])
    return messages, offsets, tokens

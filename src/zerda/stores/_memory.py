"""The in-memory store: a process-local log per session, safe to share between threads."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from zerda.messages import Message, Role

__all__ = ["InMemoryStore", "Tail"]


@dataclass(frozen=True, slots=True)
class Tail:
    """The end of a session as a memory needs it.

    ``messages`` holds the non-system messages of the last turns asked for, starting on a turn
    boundary; ``system`` holds every system message of the session (they are pinned).
    """

    system: tuple[Message, ...]
    messages: tuple[Message, ...]
    total_turns: int
    total_messages: int


@dataclass(slots=True)
class _Session:
    messages: list[Message] = field(default_factory=list)
    # Index in ``messages`` where each turn starts: every user message, and the first
    # non-system message when the conversation opens without one.
    turn_starts: list[int] = field(default_factory=list)
    system: list[Message] = field(default_factory=list)


class InMemoryStore:
    """Keeps sessions in this process. Appends are atomic per batch; reads return copies.

    It does no I/O, so its async methods run inline: they never block the event loop.
    """

    def __init__(self) -> None:
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def append(self, session_id: str, messages: Sequence[Message]) -> None:
        with self._lock:
            session = self._sessions.setdefault(session_id, _Session())
            log, starts = session.messages, session.turn_starts
            for m in messages:
                if m.role is Role.SYSTEM:
                    session.system.append(m)
                elif m.role is Role.USER or not starts:
                    starts.append(len(log))
                log.append(m)

    def tail(self, session_id: str, turns: int | None) -> Tail:
        """The last ``turns`` turns (all of them for ``None``) and the pinned system messages."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return Tail((), (), 0, 0)
            starts, log = session.turn_starts, session.messages
            if not starts:
                begin = len(log)
            elif turns is None or turns >= len(starts):
                begin = starts[0]
            else:
                begin = starts[-turns] if turns > 0 else len(log)
            picked = tuple(m for m in log[begin:] if m.role is not Role.SYSTEM)
            return Tail(tuple(session.system), picked, len(starts), len(log))

    def history(self, session_id: str) -> list[Message]:
        with self._lock:
            session = self._sessions.get(session_id)
            return list(session.messages) if session else []

    def clear(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    async def aappend(self, session_id: str, messages: Sequence[Message]) -> None:
        self.append(session_id, messages)

    async def atail(self, session_id: str, turns: int | None) -> Tail:
        return self.tail(session_id, turns)

    async def ahistory(self, session_id: str) -> list[Message]:
        return self.history(session_id)

    async def aclear(self, session_id: str) -> None:
        self.clear(session_id)

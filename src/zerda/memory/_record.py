"""The summary record in a session's metadata, and how an edit of the log forgets it.

The record lives under :data:`SUMMARY_KEY`; summary memories write it (folds, by
compare-and-set), and every memory's edits forget it (:func:`forget_summary`): a summary made
of a message that was deleted or edited would keep the removed text.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zerda.memory._flow import CompareAndSet, Flow, History, ReadTail
from zerda.messages import PINNED, Message, Role
from zerda.stores._base import Tail

Locate = Callable[[Sequence[Message]], "int | None"]
"""Where, in a session's history, the first turn an edit changed is (``None``: in none)."""

__all__ = [
    "SUMMARY_KEY",
    "Stored",
    "changed_turn",
    "drop_summary_past",
    "dropped",
    "forget_summary",
]

SUMMARY_KEY = "zerda.summary"
"""The session metadata key holding ``{"text", "turns", "updated_at"}``: the summary and how
many turns, counted from the session's first, it covers (its watermark)."""


@dataclass(frozen=True, slots=True)
class Stored:
    """The summary state a tail carried: ``raw`` as stored (what a fold compares and sets),
    and what it says."""

    raw: Any = None
    text: str = ""
    turns: int = 0
    updated_at: float | None = None

    @classmethod
    def of(cls, metadata: Mapping[str, Any]) -> Stored:
        raw = metadata.get(SUMMARY_KEY)
        if not isinstance(raw, dict):
            return cls(raw)
        text, turns = raw.get("text"), raw.get("turns")
        if not isinstance(text, str) or not isinstance(turns, int) or turns < 0:
            return cls(raw)
        at = raw.get("updated_at")
        return cls(raw, text, turns, float(at) if isinstance(at, (int, float)) else None)


def dropped() -> dict[str, Any]:
    """What replaces a summary an edit made wrong: no text, no turn (folds start over)."""
    return {"text": "", "turns": 0, "updated_at": time.time()}


def forget_summary(
    session_id: str, first_turn: int | Locate, *, mark_absent: bool
) -> Flow[int | None]:
    """After an edit of turns ``first_turn`` on (counted from the session's first): drop the
    session's summary if it covers any of them, else mark it, so that a fold another worker
    made from the log before the edit fails its compare-and-set and reads again. The first
    turn changed if the summary was dropped, else ``None``.

    ``first_turn`` may be a function that finds it in the session's history (``None``: in no
    turn): the history is then read only if there is a summary to compare it with.

    A session with no summary is left as it is, unless ``mark_absent`` (a summary memory's
    edit): then an empty record is written, which a fold that started before the edit, from
    no summary, cannot overwrite.
    """
    while True:
        tail: Tail = yield ReadTail(session_id, 0, None)
        stored = Stored.of(tail.metadata)
        if stored.raw is None and not mark_absent:
            return None
        if stored.turns and not isinstance(first_turn, int):
            history: list[Message] = yield History(session_id)
            found = first_turn(history)
            first_turn = stored.turns if found is None else found  # None: nothing covered
        first = first_turn if isinstance(first_turn, int) else stored.turns
        # A summary covers its turns even when its text is empty (a greeting folded alone).
        covered = stored.turns > first
        replacement: dict[str, Any]
        if covered or not isinstance(stored.raw, dict):
            replacement = dropped()
        else:
            edits = stored.raw.get("edits")
            count = edits if isinstance(edits, int) and not isinstance(edits, bool) else 0
            replacement = {**stored.raw, "edits": count + 1}
        if (yield CompareAndSet(session_id, SUMMARY_KEY, stored.raw, replacement)):
            return first if covered else None


def changed_turn(history: Sequence[Message], ids: Collection[str]) -> int | None:
    """The first turn (counted from the session's first) that removing or editing the
    messages ``ids`` of ``history`` changes, as a summary sees turns: the repair rules put a
    tool result in its call's turn, wherever it was stored, and a removed user message leaves
    what followed it in its turn to the turn before. ``None``: no message of ``ids`` is in a
    turn (pinned messages belong to none)."""
    first: int | None = None
    call_turn: dict[str, int] = {}
    opened: set[int] = set()  # turns whose user message is one of ids
    kept: set[int] = set()  # turns with a message not in ids
    for turn, m in _numbered(history):
        at = call_turn.get(m.tool_call_id or "", turn) if m.role is Role.TOOL else turn
        for call in m.tool_calls:
            call_turn[call.id] = turn
        if m.id in ids:
            first = at if first is None else min(first, at)
            if m.role is Role.USER and turn > 0:
                opened.add(turn)
        else:
            kept.add(turn)
    for t in opened & kept:
        first = t - 1 if first is None else min(first, t - 1)
    return first


def drop_summary_past(session_id: str) -> Flow[None]:
    """Drop the summary of a session forked at a message if it reaches a turn the fork may
    have cut short: its last, or one with a call whose results were left behind (the
    repair rules fold a result into its call's turn). A conservative test: the summary is
    made again."""
    while True:
        tail: Tail = yield ReadTail(session_id, 0, None)
        stored = Stored.of(tail.metadata)
        if stored.raw is None or not stored.turns:
            return
        cut = tail.total_turns - 1
        if stored.turns <= cut:
            history: list[Message] = yield History(session_id)
            cut = min(cut, _unanswered_turn(history, cut))
        if stored.turns <= cut:
            return
        if (yield CompareAndSet(session_id, SUMMARY_KEY, stored.raw, dropped())):
            return


def _unanswered_turn(history: Sequence[Message], default: int) -> int:
    """The first turn of ``history`` with a tool call that has no result in it (``default``
    when there is none)."""
    waiting: dict[str, int] = {}
    for turn, m in _numbered(history):
        if m.role is Role.TOOL:
            waiting.pop(m.tool_call_id or "", None)
        for call in m.tool_calls:
            waiting[call.id] = turn
    return min(waiting.values(), default=default)


def _numbered(history: Sequence[Message]) -> Iterator[tuple[int, Message]]:
    """Each message of ``history`` in a turn, with its turn's number (counted from the
    session's first): a new one at each user message; pinned messages are in none."""
    turn = -1
    for m in history:
        if m.role in PINNED:
            continue
        if m.role is Role.USER or turn < 0:
            turn += 1
        yield turn, m

"""``memory.inspect()``: the one account of a context that every front door renders.

A frozen :class:`Inspection` says what the context holds (its messages, the tokens by part),
where every stored turn went (:data:`Fate`: in the context, in the summary, pending its fold,
evicted) and what the repair rules did to each message. It is built here, purely, from the
tail the memory read and the view it fitted from it: the CLI, the service, MCP and the
inspector show it and compute nothing of their own.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from zerda.errors import ZerdaError
from zerda.memory._stats import MemoryStats
from zerda.messages import Message
from zerda.policies import (
    BEFORE_USER,
    DUPLICATE,
    MOVED,
    ORPHAN,
    RENAMED,
    REPAIRS,
    UNANSWERED,
    RepairEvent,
    repair,
)
from zerda.stores._base import Tail
from zerda.tokens import TokenCounter, message_counts

__all__ = [
    "FATES",
    "Fate",
    "Inspection",
    "MessageAccount",
    "PartTokens",
    "Repair",
    "TurnAccount",
]

Fate = Literal["context", "summary", "pending", "evicted"]
"""Where a stored turn is: verbatim in the context, covered by the summary the context
carries, waiting out of the context for its fold (while the summarizer fails), or evicted by
the policy (always the oldest; and a greeting the repair rules do not send)."""

FATES: tuple[Fate, ...] = ("context", "summary", "pending", "evicted")

TRUNCATED = "truncated"
"""The :attr:`Repair.kind` of a text cut to fit the budget (the newest turn alone over it)."""


@dataclass(frozen=True, slots=True)
class Repair:
    """One thing the context did to a stored message: a repair rule (``kind`` is a key of
    :data:`zerda.policies.REPAIRS`, as ``stats["repairs"]`` counts them) or ``"truncated"``.

    ``call_id``: the call it is about (a result's, a removed or renamed call's); ``new_id``:
    the id a renamed call is sent with; ``after``: the id of the message a moved result is
    sent after (its call's); ``tokens``: how many tokens a cut removed."""

    kind: str
    call_id: str | None = None
    new_id: str | None = None
    after: str | None = None
    tokens: int = 0

    def describe(self) -> str:
        """The repair in a few words, for a person."""
        call = f" {self.call_id}" if self.call_id else ""
        return {
            "moved_results": f"moved to follow its call{call}",
            "dropped_orphan_results": f"not sent: its call{call} is not in the context",
            "dropped_duplicate_results": f"not sent: its call{call} already has a result",
            "dropped_unanswered_calls": f"call{call} not sent: it has no result",
            "dropped_before_user": "not sent: the context opens on a user message",
            "renamed_call_ids": f"call{call} sent as {self.new_id}: the context used the id",
            TRUNCATED: f"{self.tokens:,} tokens cut from its text",
        }.get(self.kind, self.kind)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        for key in ("call_id", "new_id", "after"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.kind == TRUNCATED:
            out["tokens"] = self.tokens
        return out


@dataclass(frozen=True, slots=True)
class MessageAccount:
    """A stored message: as stored and its tokens, and what the context sends of it
    (``sent`` is ``None`` when it is not in the context)."""

    message: Message
    tokens: int
    sent: Message | None = None
    sent_tokens: int = 0
    repairs: tuple[Repair, ...] = ()

    @property
    def in_context(self) -> bool:
        return self.sent is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "message": self.message.to_dict(),
            "tokens": self.tokens,
            "in_context": self.in_context,
            "sent": None if self.sent is None else self.sent.to_dict(),
            "sent_tokens": self.sent_tokens,
            "repairs": [r.as_dict() for r in self.repairs],
        }


@dataclass(frozen=True, slots=True)
class TurnAccount:
    """A stored turn: its number (1 for the session's first), its fate, its messages as
    stored and their tokens; ``sent``: the messages the context sends as this turn, in the
    order it sends them (a result stored after an interjection comes right after its call,
    in its call's turn), and ``sent_tokens`` what they cost, as the budget counts them."""

    number: int
    fate: Fate
    messages: tuple[MessageAccount, ...]
    tokens: int
    sent: tuple[MessageAccount, ...]
    sent_tokens: int

    @property
    def started_at(self) -> float | None:
        return self.messages[0].message.created_at if self.messages else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "fate": self.fate,
            "tokens": self.tokens,
            "sent_tokens": self.sent_tokens,
            "started_at": self.started_at,
            "messages": [m.as_dict() for m in self.messages],
            # The ids of the messages sent as this turn, in order (a moved result after its
            # call): each is in "messages" of the turn that stored it.
            "sent": [m.message.id for m in self.sent],
        }


@dataclass(frozen=True, slots=True)
class PartTokens:
    """Where the context's tokens go; ``total`` is what the context costs, ``budget`` what a
    token memory may spend (``None`` for the memories without a budget)."""

    system: int
    summary: int
    tools: int
    turns: int
    reply_priming: int
    budget: int | None

    @property
    def total(self) -> int:
        return self.system + self.summary + self.tools + self.turns + self.reply_priming

    def as_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "summary": self.summary,
            "tools": self.tools,
            "turns": self.turns,
            "reply_priming": self.reply_priming,
            "total": self.total,
            "budget": self.budget,
        }


@dataclass(frozen=True, slots=True)
class Inspection:
    """One account of a context: what ``get_context()`` returns (``context``), where every
    stored turn went, what was repaired, the tokens by part and the stats, all from one
    read. ``turns`` holds the newest stored turns that were asked for (all by default),
    oldest first; the stats count every turn of the session. ``error``: what
    ``get_context()`` raises when no context fits (:class:`~zerda.ContextOverflowError`,
    or a strict memory's :class:`~zerda.InvalidMessageError`); ``context`` is then empty
    and every turn evicted, pending or summarized."""

    session_id: str
    memory: str
    counter: str
    context: tuple[Message, ...]
    system: tuple[MessageAccount, ...]
    summary: Message | None
    turns: tuple[TurnAccount, ...]
    tokens: PartTokens
    stats: MemoryStats
    error: ZerdaError | None = field(default=None, compare=False)

    def fates(self) -> dict[Fate, int]:
        """How many of the session's stored turns have each fate (they add up to
        ``stats["stored_turns"]``)."""
        stats: Mapping[str, Any] = self.stats
        return {
            "context": stats.get("turns_in_context", 0),
            "summary": stats.get("turns_summarized", 0),
            "pending": stats.get("turns_pending", 0),
            "evicted": stats.get("turns_evicted", 0),
        }

    def as_dict(self) -> dict[str, Any]:
        """The whole account as JSON types (messages in Zerda's lossless form)."""
        return {
            "session_id": self.session_id,
            "memory": self.memory,
            "counter": self.counter,
            "error": None
            if self.error is None
            else {"type": type(self.error).__name__, "message": str(self.error)},
            "context": [m.to_dict() for m in self.context],
            "fates": self.fates(),
            "tokens": self.tokens.as_dict(),
            "system": [m.as_dict() for m in self.system],
            "summary": None if self.summary is None else self.summary.to_dict(),
            "turns": [t.as_dict() for t in self.turns],
            "stats": dict(self.stats),
        }


def build(
    *,
    session_id: str,
    memory: str,
    counter: TokenCounter,
    raw: Tail,
    tail: Tail,
    start: int,
    turns_in_context: int,
    summary: Sequence[Message],
    context: Sequence[Message] | None,
    cuts: Sequence[int],
    accounting: Mapping[str, int],
    tokens: PartTokens | None,
    stats: MemoryStats,
    error: ZerdaError | None,
    keep: int | None = None,
) -> Inspection:
    """The inspection of a view: ``raw`` is the tail as read, ``tail`` the view's (repaired,
    maybe without the oldest turns that a summary covers, maybe with the newest cut) and the
    context its messages from ``start`` on (``context`` is ``None`` when none fits); ``cuts``
    the tokens cut from each context message; ``accounting`` the memory's own count of each
    fate, which the turns' fates follow; ``tokens`` the parts as the memory counted them
    (``None``: a memory that counts nothing, whose parts the account counts by ``counter``);
    ``keep``: how many of the newest turns to account for (``None``: every turn read)."""
    fixed = repair(raw.messages, raw.tokens, raw.turn_starts)
    events: Sequence[RepairEvent]
    sources: Sequence[int]
    if fixed is None or not fixed.events:
        repaired_count, sources, events = len(raw.messages), range(len(raw.messages)), ()
    else:
        repaired_count, sources, events = len(fixed.messages), fixed.sources, fixed.events
    offset = repaired_count - len(tail.messages)  # the turns the view's tail left out
    first_number = raw.total_turns - len(raw.turn_starts)  # of the raw tail's first turn

    sent: dict[int, tuple[Message, int, int]] = {}  # raw index -> (as sent, tokens, cut)
    turn_sent: dict[int, list[int]] = {}  # session turn number -> what it sends, in order
    if context is not None:
        counts = message_counts(counter, tail.messages, tail.tokens)
        view_first = raw.total_turns - len(tail.turn_starts)
        for k, p in enumerate(range(start, len(tail.messages))):
            j = sources[offset + p]
            sent[j] = (tail.messages[p], counts[p], cuts[k] if k < len(cuts) else 0)
            turn = view_first + bisect.bisect_right(tail.turn_starts, p) - 1
            turn_sent.setdefault(turn, []).append(j)
    # The session's turns the context range spans (a repair note matters only there).
    first_in_context = raw.total_turns - (turns_in_context if context is not None else 0)

    notes: dict[int, list[Repair]] = {}

    def note(j: int, repair_note: Repair) -> None:
        notes.setdefault(j, []).append(repair_note)

    messages = raw.messages
    for event in events:
        j = event.message
        if first_number + event.stored_turn < first_in_context:
            continue
        m = messages[j]
        if event.kind in (MOVED, DUPLICATE, ORPHAN):
            kind = event.kind
            if kind != ORPHAN and first_number + event.turn < first_in_context:
                kind = ORPHAN  # its call is not in the context, as count_repairs counts it
            after = messages[event.other].id if kind == MOVED else None
            note(j, Repair(REPAIRS[kind], call_id=m.tool_call_id, after=after))
        elif event.kind == UNANSWERED:
            note(j, Repair(REPAIRS[UNANSWERED], call_id=m.tool_calls[event.call].id))
        elif event.kind == BEFORE_USER:
            note(j, Repair(REPAIRS[BEFORE_USER]))
    for j, (as_sent, _, cut) in sent.items():
        stored = messages[j]
        if as_sent.tool_calls and as_sent.tool_calls != stored.tool_calls:
            unanswered = {
                e.call for e in events if e.kind == UNANSWERED and e.message == j and e.call >= 0
            }
            kept = [c for i, c in enumerate(stored.tool_calls) if i not in unanswered]
            for old, new in zip(kept, as_sent.tool_calls, strict=False):
                if old.id != new.id:
                    note(j, Repair(REPAIRS[RENAMED], call_id=old.id, new_id=new.id))
        if cut:
            note(j, Repair(TRUNCATED, tokens=cut))

    stored_counts = message_counts(counter, messages, raw.tokens)

    def account(j: int) -> MessageAccount:
        as_sent = sent.get(j)
        return MessageAccount(
            messages[j],
            stored_counts[j],
            None if as_sent is None else as_sent[0],
            0 if as_sent is None else as_sent[1],
            tuple(notes.get(j, ())),
        )

    summarized = accounting.get("turns_summarized", 0)
    pending = accounting.get("turns_pending", 0)
    turn_accounts = []
    bounds = [*raw.turn_starts, len(messages)]
    for t, (begin, end) in enumerate(itertools.pairwise(bounds)):
        number = first_number + t
        accounts = tuple(account(j) for j in range(begin, end))
        fate: Fate
        if number < summarized:
            fate = "summary"
        elif number < summarized + pending:
            fate = "pending"
        elif number >= first_in_context and any(a.in_context for a in accounts):
            fate = "context"
        else:
            fate = "evicted"
        sends = tuple(account(j) for j in turn_sent.get(number, ()))
        turn_accounts.append(
            TurnAccount(
                number + 1,
                fate,
                accounts,
                sum(a.tokens for a in accounts),
                sends,
                sum(a.sent_tokens for a in sends),
            )
        )
    if keep is not None:
        turn_accounts = turn_accounts[max(len(turn_accounts) - keep, 0) :]
    system_counts = message_counts(counter, raw.system, raw.system_tokens)
    if tokens is None:
        sent_total = sum(n for _, n, _ in sent.values())
        tokens = PartTokens(sum(system_counts), 0, 0, sent_total, counter.count_messages([]), None)
    system = tuple(
        MessageAccount(m, n, m if context is not None else None, n if context is not None else 0)
        for m, n in zip(raw.system, system_counts, strict=True)
    )
    return Inspection(
        session_id=session_id,
        memory=memory,
        counter=counter.name,
        context=tuple(context or ()),
        system=system,
        summary=summary[0] if summary else None,
        turns=tuple(turn_accounts),
        tokens=tokens,
        stats=stats,
        error=error,
    )

"""Pure selection policies: which of the newest turns go into the context. No I/O here.

Policies work on a conversation's tail as a flat list of non-system messages, the offsets
where its turns start, and (for budgets) each message's cached token count. They return where
the context starts in that list, so a memory can slice the context out without building a
``Turn`` per turn and without counting a token again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal, NamedTuple, TypeVar

from zerda.errors import ContextOverflowError
from zerda.messages import Message, Role

__all__ = ["Fit", "Overflow", "fit_budget", "last_turns", "window_start"]

T = TypeVar("T")

Overflow = Literal["truncate", "raise"]


def last_turns(turns: Sequence[T], k: int | None) -> Sequence[T]:
    """The newest ``k`` turns, oldest first (all of them when ``k`` is ``None``)."""
    if k is None or k >= len(turns):
        return turns
    return turns[len(turns) - k :] if k > 0 else turns[:0]


def window_start(turn_starts: Sequence[int], length: int, k: int | None) -> int:
    """Where the last ``k`` turns start in a tail of ``length`` messages."""
    kept = last_turns(turn_starts, k)
    return kept[0] if kept else length


class Fit(NamedTuple):
    """The result of fitting a tail into a token budget.

    ``start`` is the offset of the context's first message in the tail; ``turns`` counts the
    turns in the context (a truncated turn counts); ``tokens`` is the sum of the counts of the
    messages from ``start`` on. ``exhausted`` means every turn of the tail fitted, so an
    older turn, if the store has one, might fit too.
    """

    start: int
    turns: int
    tokens: int
    truncated: bool
    exhausted: bool


def fit_budget(
    messages: Sequence[Message],
    tokens: Sequence[int],
    turn_starts: Sequence[int],
    budget: int,
    overflow: Overflow = "truncate",
) -> Fit:
    """Keep the newest whole turns whose tokens add up to at most ``budget``.

    Walks turns from the newest and stops at the first that does not fit, so the cost is that
    of the context, not of the conversation. When the newest turn alone is over budget,
    ``overflow="raise"`` raises :class:`ContextOverflowError`; ``"truncate"`` keeps the longest
    run of that turn's newest messages that fits, never starting on a tool result (a tool call
    and its results are kept or dropped together). If not even the newest message (with the
    results that answer it) fits, both raise.
    """
    end = len(messages)
    used = 0
    kept = 0
    start = end
    for begin in reversed(turn_starts):
        cost = sum(tokens[begin:start])
        if used + cost > budget:
            break
        used += cost
        kept += 1
        start = begin
    else:
        return Fit(start, kept, used, truncated=False, exhausted=True)
    if kept:
        return Fit(start, kept, used, truncated=False, exhausted=False)
    # The newest turn alone does not fit.
    newest = turn_starts[-1]
    needed = sum(tokens[newest:end])
    if overflow == "raise":
        raise ContextOverflowError(
            f"the newest turn alone needs {needed} tokens, over the budget of {budget}; "
            'use overflow="truncate" to keep its newest messages, or raise the budget',
            needed=needed,
            limit=budget,
        )
    return _truncate(messages, tokens, newest, budget, needed)


def _truncate(
    messages: Sequence[Message], tokens: Sequence[int], newest: int, budget: int, needed: int
) -> Fit:
    """The longest run of the newest turn's last messages that fits and may open a context."""
    fit: tuple[int, int] | None = None
    for start, total in _openings(messages, tokens, newest):
        if total > budget:
            break
        fit = (start, total)
    if fit is None:
        first = next(_openings(messages, tokens, newest), (newest, needed))
        raise ContextOverflowError(
            f"the newest message needs {first[1]} tokens (with the tool results that answer "
            f"it), over the budget of {budget}; the newest turn needs {needed}",
            needed=first[1],
            limit=budget,
        )
    return Fit(fit[0], 1, fit[1], truncated=True, exhausted=False)


def _openings(
    messages: Sequence[Message], tokens: Sequence[int], newest: int
) -> Iterator[tuple[int, int]]:
    """Where a context may open inside the newest turn, newest first, with the tokens from there.

    A run may open at a message only if every tool result in it answers a call made in it, so a
    call and its results are kept or dropped together, whatever their order.
    """
    total = 0
    unanswered: set[str] = set()  # results in the run whose call is not in it (yet)
    for i in range(len(messages) - 1, newest - 1, -1):
        m = messages[i]
        total += tokens[i]
        if m.role is Role.TOOL:
            unanswered.add(m.tool_call_id or "")
            continue
        unanswered.difference_update(c.id for c in m.tool_calls)
        if not unanswered:
            yield i, total

"""ConversationTokenBufferMemory: as many of the newest whole turns as fit a token budget."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from zerda.errors import ConfigurationError, ContextOverflowError
from zerda.memory._base import _DEFAULT_SESSION, BaseMemory, Tools, _View, legacy_positional
from zerda.memory._stats import TokenMemoryStats
from zerda.messages import Message
from zerda.policies import (
    Overflow,
    RepairEvent,
    call_ids,
    extends_valid,
    fit_budget,
    shorten_turn,
    spoken_list,
)
from zerda.stores._base import AsyncStore, Since, Store, Tail, TokenCounts
from zerda.tokens import (
    TokenCounter,
    TokenCounterLike,
    as_token_counter,
    count_tools,
    message_counts,
)

__all__ = ["ConversationTokenBufferMemory"]

_OVERFLOWS = ("truncate", "raise")
# Turns to read on the first call; afterwards, what the last context held plus a margin.
_FIRST_READ = 16
_MARGIN = 2
# Messages of dropped turns a kept window may hold before it lets them go (see _advance).
_MARGIN_MESSAGES = 64


def _non_negative_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{what} must be an integer >= 0, got {value!r}")
    return value


class ConversationTokenBufferMemory(BaseMemory[TokenMemoryStats]):
    """Keeps the newest whole turns that fit ``max_token_limit - reserve_tokens`` tokens.

    Everything the model is sent counts: pinned system messages, every message's content,
    name, tool-call names and arguments, the counter's per-message overhead and the reply
    priming. ``get_context()`` counted by the same counter never exceeds the budget.

    Each message is counted once, when it is added, and its count is stored with it; choosing
    the context walks turns from the newest and stops when the budget is full, so a turn costs
    the same at message 500 and at message 32,000.

    The turns are those of the repaired log (:func:`zerda.policies.repair`). When the newest
    turn alone is over budget, ``overflow="truncate"`` keeps every message of it and cuts the
    middle of its longest texts, with a marker (:func:`zerda.policies.shorten_turn`), and
    flags ``truncated`` and ``truncated_tokens`` in the stats; ``overflow="raise"`` raises
    :class:`~zerda.ContextOverflowError`. When what cannot be cut (tool-call arguments, media,
    overheads) is over the budget, both raise. These errors come from reads; adding a message
    always succeeds, so nothing is lost.

    ``tools``: the tool definitions the application sends with each request (OpenAI function
    definitions); their tokens (:func:`zerda.tokens.count_tools`) come out of the budget, and
    ``get_context(tools=...)`` counts another set for one call.
    """

    _type_name: ClassVar[str] = "ConversationTokenBufferMemory"

    @legacy_positional("token_counter", "reserve_tokens", "overflow")
    def __init__(
        self,
        max_token_limit: int = 2000,
        *,
        token_counter: TokenCounterLike | None = None,
        reserve_tokens: int = 0,
        overflow: Overflow = "truncate",
        tools: Tools | None = None,
        return_messages: bool = False,
        input_key: str = "input",
        output_key: str = "output",
        memory_key: str = "history",
        human_prefix: str = "user",
        ai_prefix: str = "assistant",
        store: Store | AsyncStore | None = None,
        session_id: str = _DEFAULT_SESSION,
        strict: bool = False,
    ) -> None:
        limit = max_token_limit
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ConfigurationError(f"max_token_limit must be a positive integer, got {limit!r}")
        reserve = _non_negative_int(reserve_tokens, "reserve_tokens")
        if reserve >= limit:
            raise ConfigurationError(
                f"reserve_tokens ({reserve}) must be less than max_token_limit ({limit})"
            )
        if overflow not in _OVERFLOWS:
            raise ConfigurationError(f"overflow must be 'truncate' or 'raise', got {overflow!r}")
        super().__init__(
            return_messages=return_messages,
            input_key=input_key,
            output_key=output_key,
            memory_key=memory_key,
            human_prefix=human_prefix,
            ai_prefix=ai_prefix,
            store=store,
            session_id=session_id,
            strict=strict,
        )
        self.max_token_limit = limit
        self.reserve_tokens = reserve
        self.overflow: Overflow = overflow
        self.token_counter = as_token_counter(token_counter)
        self._priming = self.token_counter.count_messages([])
        self.tools: tuple[Any, ...] = ()
        self._tools_tokens = 0
        if tools is not None:
            self._tools_tokens = count_tools(tools, self.token_counter)  # checks them too
            self.tools = tuple(tools)
        self._turns_hint = _FIRST_READ

    def _tools_cost(self, tools: Tools | None) -> int:
        """Tokens of ``tools`` (a call's own), else of the memory's ``tools``."""
        return self._tools_tokens if tools is None else count_tools(tools, self.token_counter)

    @property
    def budget(self) -> int:
        """Tokens the context may use: ``max_token_limit - reserve_tokens``."""
        return self.max_token_limit - self.reserve_tokens

    # -- hooks ------------------------------------------------------------------------------

    def _counter_name(self) -> str:
        return self.token_counter.name

    def _inspection_counter(self, given: TokenCounterLike | None) -> TokenCounter:
        return self.token_counter

    def _budget(self) -> int:
        return self.budget

    def _count(self, batch: Sequence[Message]) -> TokenCounts:
        return {self.token_counter.name: [self.token_counter.count_message(m) for m in batch]}

    def _fit(self, tail: Tail, tools: Tools | None = None) -> _View | None:
        return self._fit_budget(tail, (), 0, 0, self._tools_cost(tools), remember=True)

    def _fit_budget(
        self,
        tail: Tail,
        summary: Sequence[Message],
        summary_tokens: int,
        first_turn: int,
        tools_tokens: int,
        *,
        remember: bool = False,
    ) -> _View | None:
        """Fit ``tail`` into the budget, with the ``summary`` messages (``summary_tokens``)
        and the tool definitions (``tools_tokens``) counted in it and no turn older than
        ``first_turn`` (counted from the session's first turn) in the context. Pure: the view
        says how many turns the next read should ask for (``hint``) and, with ``remember``,
        what to keep to advance it by the next read's new messages (``window``)."""
        tail, repairs = self._repaired(tail)
        skipped = first_turn - (tail.total_turns - len(tail.turn_starts))
        if skipped > 0:  # the tail reaches back past first_turn: those turns are summarized
            tail = _from_turn(tail, skipped)
            repairs = [
                e._replace(turn=e.turn - skipped, stored_turn=e.stored_turn - skipped)
                for e in repairs
                if e.stored_turn >= skipped
            ]
        budget = self.budget
        priming = self._priming
        system_counts = self._counts(tail.system, tail.system_tokens)
        system_tokens = sum(system_counts)
        fixed = system_tokens + summary_tokens + tools_tokens + priming
        parts = _PartTokens(system_tokens, summary_tokens, tools_tokens)
        if fixed > budget:
            error = self._overflow(f"{parts.describe()} alone need {fixed} tokens", fixed, parts)
            return self._no_fit(tail, error, summary, parts, repairs)
        messages = tail.messages
        tokens = self._counts(messages, tail.tokens)
        room = budget - fixed
        cut = 0
        cuts: Sequence[int] = ()
        try:
            fit = fit_budget(messages, tokens, tail.turn_starts, room, self.overflow)
            if fit.truncated:  # the newest turn alone, over the budget: cut its longest texts
                counter = self.token_counter
                short = shorten_turn(
                    messages[fit.start :],
                    tokens[fit.start :],
                    room,
                    counter.count_text,
                    counter.count_message,
                )
                tail = _with_newest(tail, fit.start, short.messages, short.tokens)
                fit = fit._replace(tokens=sum(short.tokens))
                cut, cuts = short.cut, short.cuts
        except ContextOverflowError as exc:
            error = self._overflow(str(exc), exc.needed + fixed, parts)
            return self._no_fit(tail, error, summary, parts, repairs)
        if fit.exhausted and skipped < 0 and not tail.complete:
            return None  # every turn read fitted: an older, unsummarized one may fit too
        view = _View(
            tail,
            fit.start,
            fit.turns,
            summary=summary,
            truncated=fit.truncated,
            truncated_tokens=cut,
            system_tokens=system_tokens,
            summary_tokens=summary_tokens,
            tools_tokens=tools_tokens,
            turn_tokens=fit.tokens,
            overhead_tokens=priming,
            hint=fit.turns + _MARGIN,
            repairs=repairs,
            cuts=cuts,
        )
        view = self._checked(view)
        if (
            remember
            and view.error is None
            and not view.repairs
            and not fit.truncated
            and tail.cursor is not None
        ):
            # A context valid as stored, whole: what the next read needs to advance it.
            turn_starts = tail.turn_starts
            first = bisect.bisect_left(turn_starts, fit.start)
            context = list(messages[fit.start :])
            view.window = _Window(
                self._window_key(tools_tokens),
                tail.cursor,
                tail.system,
                system_counts,
                system_tokens,
                tools_tokens,
                context,
                tokens[fit.start :],
                [s - fit.start for s in turn_starts[first:]],
                0,
                fit.tokens,
                call_ids(context),
                tail.total_turns,
                tail.total_messages,
            )
        return view

    # -- advancing the last context by what came since (stores with tail_since) -----------

    def _window_key(self, tools_tokens: int) -> tuple[object, ...]:
        """What a kept window was fitted under: a change of any of it fits the tail again."""
        return (
            self.session_id,
            self.max_token_limit,
            self.reserve_tokens,
            tools_tokens,
            self.token_counter,
        )

    def _usable_window(self) -> _Window | None:
        window: _Window | None = self._window
        if window is None or window.key != self._window_key(self._tools_tokens):
            return None
        return window

    def _advance(self, window: _Window, since: Since) -> _View | None:
        """The context of ``window`` with ``since``'s messages added and the oldest turns
        dropped while over budget: what fitting the tail gives, since a valid context only
        grows by appends (an older turn that did not fit before fits no better now). ``None``
        when the new messages need repair or the newest turn alone is over the budget:
        fitting the tail says what to do then."""
        new = since.messages
        if not new:
            if (since.total_turns, since.total_messages) != (
                window.total_turns,
                window.total_messages,
            ):
                return None
            return self._window_view(window)
        if not extends_valid(new, () if window.messages else since.turn_starts):
            return None
        stored = since.tokens
        counts: Sequence[int] = (
            self._counts(new, stored) if None in stored else stored  # type: ignore[assignment]
        )
        offset = len(window.messages)
        messages = [*window.messages, *new]
        tokens = [*window.tokens, *counts]
        starts = [*window.turn_starts, *[offset + s for s in since.turn_starts]]
        used = window.used + sum(counts)
        room = self.budget - window.system_tokens - window.tools_tokens - self._priming
        first = window.first
        newest = len(starts) - 1
        while used > room and first < newest:
            used -= sum(tokens[starts[first] : starts[first + 1]])
            first += 1
        if used > room or not starts:
            return None
        begin = starts[first]
        ids = window.call_ids
        added = [c.id for m in new if m.tool_calls for c in m.tool_calls]
        if added:
            # A call whose id an earlier call of the context uses is renamed: fitting does it.
            # ``ids`` holds every id of the context and perhaps some of turns dropped since.
            fresh = set(added)
            if len(fresh) < len(added):
                return None
            if not ids.isdisjoint(fresh) and not call_ids(messages[begin:offset]).isdisjoint(fresh):
                return None
            ids |= fresh  # only ever grows: a window shared by threads stays right
            if len(ids) > 2 * (len(messages) - begin) + 16:
                ids = call_ids(messages[begin:])  # forget the ids dropped with their turns
        if begin > _MARGIN_MESSAGES and 2 * begin > len(messages):
            # The turns dropped outgrew the context: let them go (once in a context's length
            # of messages, so each read costs what it adds, not what the context holds).
            messages, tokens = messages[begin:], tokens[begin:]
            starts = [s - begin for s in starts[first:]]
            first = 0
        advanced = _Window(
            window.key,
            since.cursor,
            window.system,
            window.system_counts,
            window.system_tokens,
            window.tools_tokens,
            messages,
            tokens,
            starts,
            first,
            used,
            ids,
            since.total_turns,
            since.total_messages,
        )
        return self._window_view(advanced)

    def _window_view(self, window: _Window) -> _View:
        """The view of a window: the same as the one fitting its tail gave."""
        tail = Tail(
            window.system,
            window.messages,
            window.turn_starts,
            window.total_turns,
            window.total_messages,
            window.tokens,
            window.system_counts,
            {},
            window.cursor,
        )
        turns = len(window.turn_starts) - window.first
        view = _View(
            tail,
            window.turn_starts[window.first] if turns else len(window.messages),
            turns,
            system_tokens=window.system_tokens,
            tools_tokens=window.tools_tokens,
            turn_tokens=window.used,
            overhead_tokens=self._priming,
            hint=turns + _MARGIN,
        )
        view.window = window
        return view

    def _no_fit(
        self,
        tail: Tail,
        error: ContextOverflowError,
        summary: Sequence[Message],
        parts: _PartTokens,
        repairs: Sequence[RepairEvent],
    ) -> _View:
        """The view of a tail whose context does not fit: reading it raises ``error``."""
        return _View(
            tail,
            len(tail.messages),
            0,
            summary=summary,
            error=error,
            system_tokens=parts.system,
            summary_tokens=parts.summary,
            tools_tokens=parts.tools,
            overhead_tokens=self._priming,
            repairs=repairs,
        )

    def _overflow(self, what: str, needed: int, parts: _PartTokens) -> ContextOverflowError:
        fixed = parts.system + parts.summary + parts.tools + self._priming
        return ContextOverflowError(
            f"{what}; the context budget is {self.budget} (max_token_limit "
            f"{self.max_token_limit} - reserve_tokens {self.reserve_tokens}), {fixed} of it "
            f"taken by {parts.describe()} ({self._priming} tokens by this counter)",
            needed=needed,
            limit=self.budget,
        )

    def _counts(self, messages: Sequence[Message], stored: Sequence[int | None]) -> list[int]:
        """Stored counts, counting only messages stored without one by this counter."""
        return message_counts(self.token_counter, messages, stored)

    def _extra_stats(self, view: _View) -> dict[str, Any]:
        return {
            "token_limit": self.max_token_limit,
            "reserve_tokens": self.reserve_tokens,
            "context_tokens": view.context_tokens if view.error is None else 0,
            "tokens_by_part": view.tokens_by_part(),
            "budget_used": (view.context_tokens / self.budget) if view.error is None else 0.0,
            "truncated": view.truncated,
            "truncated_tokens": view.truncated_tokens,
            "overflow": str(view.error) if view.error is not None else None,
        }


@dataclasses.dataclass(slots=True)
class _Window:
    """A valid context as last read, whole, with what advancing it needs: it is never
    changed once made (but for ``call_ids``, which only grows and may be shared), so a
    memory shared between threads may advance it from any of them."""

    key: tuple[object, ...]
    cursor: object
    system: tuple[Message, ...]
    system_counts: Sequence[int]
    system_tokens: int
    tools_tokens: int
    # The context is messages[turn_starts[first]:]: the turns before ``first`` were dropped
    # from it since, and stay until they outgrow it (see _advance).
    messages: list[Message]
    tokens: list[int]
    turn_starts: list[int]
    first: int
    used: int
    # The ids of the calls of the context, and perhaps of some in turns it dropped since: a
    # new call with one of them may need renaming.
    call_ids: set[str]
    total_turns: int
    total_messages: int


@dataclasses.dataclass(frozen=True)
class _PartTokens:
    """The tokens of what comes before the turns: pinned system messages, summary, tools."""

    system: int
    summary: int
    tools: int

    def describe(self) -> str:
        """What takes the room, only the parts there are: "the system messages and the reply
        priming"."""
        named = [
            what
            for what, n in (
                ("the system messages", self.system),
                ("the summary", self.summary),
                ("the tool definitions", self.tools),
            )
            if n
        ]
        named.append("the reply priming")
        return spoken_list(named)


def _from_turn(tail: Tail, skip: int) -> Tail:
    """``tail`` without its ``skip`` oldest turns (they are in the summary)."""
    if skip >= len(tail.turn_starts):
        return Tail(
            tail.system, [], [], tail.total_turns, tail.total_messages, [], tail.system_tokens
        )
    start = tail.turn_starts[skip]
    return Tail(
        tail.system,
        tail.messages[start:],
        [s - start for s in tail.turn_starts[skip:]],
        tail.total_turns,
        tail.total_messages,
        tail.tokens[start:] if tail.tokens else tail.tokens,
        tail.system_tokens,
    )


def _with_newest(
    tail: Tail, start: int, messages: Sequence[Message], tokens: Sequence[int]
) -> Tail:
    """``tail`` with its messages from ``start`` on (the newest turn) replaced."""
    return dataclasses.replace(
        tail,
        messages=[*tail.messages[:start], *messages],
        tokens=[*tail.tokens[:start], *tokens] if tail.tokens else tail.tokens,
    )

"""Summary memories: turns that leave the context are folded into a running, persisted summary."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from zerda.errors import ConfigurationError, SummarizerError
from zerda.memory._base import _View
from zerda.memory._token import ConversationTokenBufferMemory
from zerda.messages import Message, Role, group_turns
from zerda.stores._base import Tail
from zerda.summarize import (
    ExtractiveSummarizer,
    Summarizer,
    SummaryResult,
    arun_summarizer,
    run_summarizer,
)
from zerda.tokens import TokenCounter

__all__ = ["ConversationSummaryBufferMemory", "ConversationSummaryMemory"]

SUMMARY_KEY = "zerda.summary"
"""The session metadata key holding ``{"text", "turns", "updated_at"}``: the summary and how
many turns, counted from the session's first, it covers (its watermark)."""

DEFAULT_PREFIX = "Summary of the earlier conversation:\n"
# The default summary's token target: a quarter of the budget, and never more than this.
_DEFAULT_SUMMARY_CAP = 1024
# Folding can push more turns out of the budget (the summary grows); fold again, a few times.
_MAX_FOLDS = 3


@dataclass(frozen=True, slots=True)
class _Stored:
    text: str = ""
    turns: int = 0
    updated_at: float | None = None

    @classmethod
    def of(cls, metadata: dict[str, Any]) -> _Stored:
        value = metadata.get(SUMMARY_KEY)
        if not isinstance(value, dict):
            return cls()
        text, turns = value.get("text"), value.get("turns")
        if not isinstance(text, str) or not isinstance(turns, int) or turns < 0:
            return cls()
        at = value.get("updated_at")
        return cls(text, turns, float(at) if isinstance(at, (int, float)) else None)


class ConversationSummaryBufferMemory(ConversationTokenBufferMemory):
    """The newest whole turns verbatim within a token budget; older turns in a running summary.

    When a write pushes turns out of the budget, they are folded into the summary by the
    ``summarizer`` (default: :class:`~zerda.summarize.ExtractiveSummarizer`, offline, kept to
    a quarter of the budget, at most 1,024 tokens). The
    summary and its watermark live in the store's session metadata, so a restart neither
    re-summarizes nor loses anything. The summary is sent as a system message after the pinned
    ones and counts inside the budget.

    A summarizer failure loses nothing: the turns stay in the store, are left out of the
    context (which still respects the budget) and are folded on a later write; the failure
    shows in the stats, and raises :class:`~zerda.SummarizerError` (after the write is stored)
    only with ``strict=True``. Summaries happen on writes, never on reads.

    With ``background=True`` the async writes return before the summarizer answers; the fold
    runs as a task (one at a time per memory) and ``await memory.aflush()`` waits for it. The
    context stays consistent either way: until the new summary is stored, the turns it will
    cover are left out and the budget holds.
    """

    _type_name: ClassVar[str] = "ConversationSummaryBufferMemory"

    def __init__(
        self,
        max_token_limit: int = 2000,
        summarizer: Summarizer | None = None,
        *,
        strict: bool = False,
        background: bool = False,
        summary_prefix: str = DEFAULT_PREFIX,
        token_counter: TokenCounter | Callable[[str], int] | None = None,
        **kwargs: Any,
    ) -> None:
        if summarizer is not None and not isinstance(summarizer, Summarizer):
            raise ConfigurationError(
                f"summarizer must implement zerda.summarize.Summarizer, got {summarizer!r}"
            )
        if not isinstance(strict, bool) or not isinstance(background, bool):
            raise ConfigurationError("strict and background must be bools")
        if not isinstance(summary_prefix, str):
            raise ConfigurationError(f"summary_prefix must be a string, got {summary_prefix!r}")
        super().__init__(max_token_limit, token_counter, **kwargs)
        if getattr(self.store, "max_messages", None) is not None:
            # The watermark counts turns from the session's first; retention would drop turns
            # the summary has not covered yet. The summary is what bounds the context here.
            raise ConfigurationError(
                "summary memories need the store's full log: use a store without max_messages "
                "(the summary keeps the context bounded; ttl= still expires idle sessions)"
            )
        # The default keeps the summary to a quarter of the budget, by the memory's counter,
        # so that recent turns keep most of the room.
        self.summarizer: Summarizer = summarizer or ExtractiveSummarizer(
            max(16, min(self.budget // 4, _DEFAULT_SUMMARY_CAP)), self.token_counter
        )
        self.strict = strict
        self.background = background
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock: asyncio.Lock | None = None
        self.summary_prefix = summary_prefix
        self.last_error: str | None = None
        self.failures = 0
        self.last_result: SummaryResult | None = None

    # -- reading: the stored summary in the slot, no turn it covers in the context ----------

    def _slot(self, stored: _Stored) -> tuple[list[Message], int]:
        if not stored.text:
            return [], 0
        message = Message(Role.SYSTEM, self.summary_prefix + stored.text)
        return [message], self.token_counter.count_message(message)

    def _fit_stored(self, stored: _Stored) -> Callable[[Tail], _View | None]:
        slot = self._slot(stored)
        return lambda tail: self._fit(tail, slot, stored.turns)

    def _read(self, fit: Callable[[Tail], _View | None] | None = None) -> _View:
        stored = _Stored.of(self._io.get_metadata(self.session_id))
        view = super()._read(fit or self._fit_stored(stored))
        view.summary_turns, view.summary_at = stored.turns, stored.updated_at
        return view

    async def _aread(self, fit: Callable[[Tail], _View | None] | None = None) -> _View:
        stored = _Stored.of(await self._ametadata())
        view = await super()._aread(fit or self._fit_stored(stored))
        view.summary_turns, view.summary_at = stored.turns, stored.updated_at
        return view

    # -- writing: fold what the context no longer holds -----------------------------------

    def _pending(self, view: _View, stored: _Stored) -> int:
        """Turns out of the context and not yet in the summary."""
        first_in_context = view.tail.total_turns - view.turns_in_context
        if view.error is not None:
            first_in_context = view.tail.total_turns - 1  # keep the newest turn verbatim
        return max(0, first_in_context - stored.turns)

    def _fold_inputs(self, tail: Tail, pending: int) -> list[Message]:
        turns = group_turns(tail.messages)
        return [m for turn in turns[:pending] for m in turn.messages]

    def _record(self, stored: _Stored, pending: int, result: SummaryResult) -> dict[str, Any]:
        self.last_result = result
        self.last_error = None
        return {
            SUMMARY_KEY: {
                "text": result.text,
                "turns": stored.turns + pending,
                "updated_at": time.time(),
                "prompt_tokens": result.prompt_tokens,
                "completion_tokens": result.completion_tokens,
            }
        }

    def _failed(self, exc: SummarizerError) -> None:
        self.failures += 1
        self.last_error = str(exc)
        if self.strict:
            raise exc

    def _after_write(self) -> None:
        self.flush()

    def flush(self) -> None:
        """Fold now whatever turns the context no longer holds (writes do this already)."""
        for _ in range(_MAX_FOLDS):
            stored = _Stored.of(self._io.get_metadata(self.session_id))
            view = self._read(self._fit_stored(stored))
            pending = self._pending(view, stored)
            if not pending:
                return
            # Only the turns from the watermark on: what is already summarized is not read.
            tail = self._io.tail(self.session_id, view.tail.total_turns - stored.turns)
            try:
                result = run_summarizer(
                    self.summarizer, stored.text, self._fold_inputs(tail, pending)
                )
            except SummarizerError as exc:
                self._failed(exc)
                return
            # Another worker may have folded meanwhile: its summary stands, ours is dropped.
            if _Stored.of(self._io.get_metadata(self.session_id)).turns == stored.turns:
                self._io.update_metadata(self.session_id, self._record(stored, pending, result))

    async def _aafter_write(self) -> None:
        if not self.background:
            await self._afold()
            return
        task = asyncio.get_running_loop().create_task(self._afold())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def aflush(self) -> None:
        """Wait for the folds running in the background, then fold what is still pending."""
        if self._tasks:
            await asyncio.gather(*self._tasks)
        await self._afold()

    async def _afold(self) -> None:
        async with self._fold_lock():
            for _ in range(_MAX_FOLDS):
                stored = _Stored.of(await self._ametadata())
                view = await self._aread(self._fit_stored(stored))
                pending = self._pending(view, stored)
                if not pending:
                    return
                tail = await self._atail(view.tail.total_turns - stored.turns)
                try:
                    result = await arun_summarizer(
                        self.summarizer, stored.text, self._fold_inputs(tail, pending)
                    )
                except SummarizerError as exc:
                    self._failed(exc)
                    return
                if _Stored.of(await self._ametadata()).turns == stored.turns:
                    await self._aupdate(self._record(stored, pending, result))

    def _fold_lock(self) -> asyncio.Lock:
        # One fold at a time per memory: background folds queue instead of racing.
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _ametadata(self) -> dict[str, Any]:
        if self._async is not None:
            return await self._async.aget_metadata(self.session_id)
        return await asyncio.to_thread(self._io.get_metadata, self.session_id)

    async def _aupdate(self, values: dict[str, Any]) -> None:
        if self._async is not None:
            await self._async.aupdate_metadata(self.session_id, values)
        else:
            await asyncio.to_thread(self._io.update_metadata, self.session_id, values)

    def _extra_stats(self, view: _View) -> dict[str, Any]:
        stats = super()._extra_stats(view)
        result = self.last_result
        stats.update(
            {
                "summary_tokens": view.summary_tokens,
                "turns_summarized": view.summary_turns,
                "turns_pending": max(
                    0, view.tail.total_turns - view.turns_in_context - view.summary_turns
                ),
                "last_summarized_at": view.summary_at,
                "summary_prompt_tokens": None if result is None else result.prompt_tokens,
                "summary_completion_tokens": None if result is None else result.completion_tokens,
                "summary_failures": self.failures,
                "summary_error": self.last_error,
            }
        )
        return stats


class ConversationSummaryMemory(ConversationSummaryBufferMemory):
    """Pinned system messages and a running summary of every turn, plus the turn in progress.

    Each write folds every complete turn into the summary (a turn is complete once the user
    speaks again, or once it has an assistant reply and no unanswered tool call).
    """

    _type_name: ClassVar[str] = "ConversationSummaryMemory"

    def __init__(self, summarizer: Summarizer | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("max_token_limit", sys.maxsize // 2)
        super().__init__(summarizer=summarizer, **kwargs)

    def _fit(
        self,
        tail: Tail,
        slot: tuple[Sequence[Message], int] | None = None,
        first_turn: int = 0,
    ) -> _View | None:
        view = super()._fit(tail, slot, first_turn)
        if view is None or view.error is not None or not view.turns_in_context:
            return view
        newest = group_turns(view.tail.messages[view.start :])[-1]
        complete = newest.reply is not None and not newest.pending_tool_calls
        keep = 0 if complete else 1
        if keep == view.turns_in_context:
            return view
        start = len(view.tail.messages) - (len(newest.messages) if keep else 0)
        counts = self._counts(view.tail.messages, view.tail.tokens)
        view.turn_tokens = sum(counts[start:])
        view.start, view.turns_in_context = start, keep
        return view

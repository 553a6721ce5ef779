"""Summary memories: turns that leave the context are folded into a running, persisted summary."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from zerda.errors import ConfigurationError, ContextOverflowError, SummarizerError
from zerda.memory._base import _DEFAULT_SESSION, Tools, _View, legacy_positional
from zerda.memory._flow import AppendThenTail, CompareAndSet, Flow, ReadTail, Summarize
from zerda.memory._observe import log
from zerda.memory._record import SUMMARY_KEY, Locate, Stored, forget_summary
from zerda.memory._stats import SummaryMemoryStats
from zerda.memory._token import ConversationTokenBufferMemory
from zerda.messages import Message, Role, group_stored_turns
from zerda.policies import Overflow
from zerda.stores._base import AsyncStore, Store, Tail
from zerda.summarize import ExtractiveSummarizer, Summarizer, SummaryResult
from zerda.tokens import TokenCounterLike

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ConversationSummaryBufferMemory", "ConversationSummaryMemory"]

T = TypeVar("T")

DEFAULT_PREFIX = "Summary of the earlier conversation:\n"
# ConversationSummaryMemory's default budget: none to speak of (the summary bounds it).
_UNBOUNDED = sys.maxsize // 2
# The default summary's token target: a quarter of the budget, and never more than this.
_DEFAULT_SUMMARY_CAP = 1024


class ConversationSummaryBufferMemory(ConversationTokenBufferMemory):
    """The newest whole turns verbatim within a token budget; older turns in a running summary.

    When a write pushes turns out of the budget, they are folded into the summary by the
    ``summarizer`` (default: :class:`~zerda.summarize.ExtractiveSummarizer`, offline, kept to
    a quarter of the budget, at most 1,024 tokens). The
    summary and its watermark live in the store's session metadata, so a restart neither
    re-summarizes nor loses anything. The summary is sent as a system message after the pinned
    ones and counts inside the budget.

    Folding is exactly-once, however many threads, processes or machines share the session:
    the summary, its watermark and the turns after it are read in one snapshot, and the new
    summary is written by compare-and-set on the one it was made from. A worker that loses
    the race drops its result and reads again, so every turn is either in the summary, once,
    or in the context verbatim. A write that folds nothing costs one round trip to the store
    (the append and the read after it), a read one.

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

    @legacy_positional("summarizer")
    def __init__(
        self,
        max_token_limit: int = 2000,
        *,
        summarizer: Summarizer | None = None,
        background: bool = False,
        summary_prefix: str = DEFAULT_PREFIX,
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
        if summarizer is not None and not isinstance(summarizer, Summarizer):
            raise ConfigurationError(
                f"summarizer must implement zerda.summarize.Summarizer, got {summarizer!r}"
            )
        if not isinstance(background, bool):
            raise ConfigurationError(f"background must be a bool, got {background!r}")
        if not isinstance(summary_prefix, str):
            raise ConfigurationError(f"summary_prefix must be a string, got {summary_prefix!r}")
        super().__init__(
            max_token_limit,
            token_counter=token_counter,
            reserve_tokens=reserve_tokens,
            overflow=overflow,
            tools=tools,
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
        self.background = background
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock: asyncio.Lock | None = None
        self.summary_prefix = summary_prefix
        self.last_error: str | None = None
        self.failures = 0
        self.last_result: SummaryResult | None = None

    # -- reading: the stored summary in the slot, no turn it covers in the context ----------

    def _fit(self, tail: Tail, tools: Tools | None = None) -> _View | None:
        stored = Stored.of(tail.metadata)
        summary, tokens = self._slot(stored)
        view = self._fit_budget(tail, summary, tokens, stored.turns, self._tools_cost(tools))
        if view is not None:
            view.summary_at = stored.updated_at
            view.summary_state = stored
        return view

    def _slot(self, stored: Stored) -> tuple[list[Message], int]:
        if not stored.text:
            return [], 0
        message = Message(Role.SYSTEM, self.summary_prefix + stored.text)
        return [message], self.token_counter.count_message(message)

    # -- reading and writing: fold what the context leaves out ------------------------------

    def _read_flow(
        self, tail: Tail | None = None, tools: Tools | None = None, *, raising: bool = True
    ) -> Flow[_View]:
        """The view of the session, once every turn it leaves out is in the summary: a write
        folds them, but so must a read after whatever else leaves turns out (an edit that
        dropped the summary, another writer's append, a smaller budget), so that each stored
        turn is in the context or in its summary (pending only while the summarizer fails)."""
        view: _View = yield from self._fold_flow(tail, tools, raising=raising)
        return view

    def _write_flow(self, batch: list[Message]) -> Flow[None]:
        tail = yield from self._append_flow(batch)
        yield from self._fold_flow(tail)

    def _append_flow(self, batch: list[Message]) -> Flow[Tail]:
        """Append, and read the tail right after, in one round trip."""
        reply: tuple[int, Tail] = yield AppendThenTail(
            self.session_id, batch, self._count(batch), self._turns_to_read(), self._counter_name()
        )
        return reply[1]

    def _read(self, tools: Tools | None = None, *, lenient: bool = False) -> _View:
        return self._run(self._read_flow(tools=tools, raising=not lenient))

    def _fold_flow(
        self, tail: Tail | None, tools: Tools | None = None, *, raising: bool = True
    ) -> Flow[_View]:
        """Fold whatever turns the context of ``tail`` (read first when ``None``) no longer
        holds, until a fresh read shows nothing left to fold; that read's view.

        Each fold summarizes exactly the turns from the stored watermark to the context, read
        in the same snapshot as the summary, and stores the result only if the summary is
        still the one it started from (compare-and-set). Win or lose, it reads again. When
        the summarizer fails, the view leaves the turns it could not fold out (pending).
        """
        while True:
            view = yield from super()._read_flow(tail, tools)
            stored: Stored = view.summary_state
            pending = self._pending(view, stored)
            if not pending:
                return view
            source = view.tail
            if _first_turn(source) > stored.turns:  # the read did not reach the watermark
                source = yield ReadTail(
                    self.session_id, source.total_turns - stored.turns, self._counter_name()
                )
                source = self._repaired(source)[0]
                if _first_turn(source) > stored.turns or Stored.of(source.metadata) != stored:
                    # Turns were added or folded meanwhile: start again from what is stored.
                    tail = source
                    continue
            try:
                result = yield Summarize(
                    self.summarizer, stored.text, _turns_from(source, stored.turns, pending)
                )
            except SummarizerError as exc:
                self._failed(exc, pending, raising)
                return view
            record = self._record(stored, pending, result)
            won = yield CompareAndSet(self.session_id, SUMMARY_KEY, stored.raw, record)
            if won:
                log.info(
                    "summary folded: session=%r memory=%s turns=%d (now %d in the summary), "
                    "completion_tokens=%s seconds=%.2f",
                    self.session_id,
                    self._type_name,
                    pending,
                    record["turns"],
                    result.completion_tokens,
                    result.seconds,
                )
            else:
                log.debug("summary fold lost a race: session=%r; reading again", self.session_id)
            tail = None  # won or lost, see what is stored now

    def _pending(self, view: _View, stored: Stored) -> int:
        """Turns out of the context and not yet in the summary."""
        first_in_context = view.tail.total_turns - view.turns_in_context
        if isinstance(view.error, ContextOverflowError):
            first_in_context = view.tail.total_turns - 1  # keep the newest turn verbatim
        # (A strict memory's refusal to repair is no reason to fold: the turns fit.)
        return max(0, first_in_context - stored.turns)

    def _record(self, stored: Stored, pending: int, result: SummaryResult) -> dict[str, Any]:
        self.last_result = result
        if self.last_error is not None:
            log.info(
                "summarizer works again: session=%r memory=%s; folding the pending turns",
                self.session_id,
                self._type_name,
            )
        self.last_error = None
        return {
            "text": result.text,
            "turns": stored.turns + pending,
            "updated_at": time.time(),
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
        }

    def _failed(self, exc: SummarizerError, pending: int, raising: bool) -> None:
        """Count and log a failed fold (a WARNING when the summarizer stops answering, then
        DEBUG until it answers again); with ``strict``, raise it (but for stats)."""
        self.failures += 1
        first = self.last_error is None
        self.last_error = str(exc)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            # The error's text may quote the conversation: only its type is logged.
            "summarizer failed: session=%r memory=%s failures=%d: %s; %d turns wait out of the "
            "context, stored, and are folded at the next read or write once it works",
            self.session_id,
            self._type_name,
            self.failures,
            type(exc).__name__,
            pending,
        )
        if self.strict and raising:
            raise exc

    # -- edits: a summary made of edited turns is forgotten ----------------------------------

    def _forget_flow(self, first_turn: int | Locate, rebuild: bool) -> Flow[None]:
        """Forget the summary (see :func:`~zerda.memory._record.forget_summary`); its text
        was in ``last_result`` too. Then, with ``rebuild``, fold at once."""
        changed = yield from forget_summary(self.session_id, first_turn, mark_absent=True)
        if changed is not None:
            self.last_result = None
            self._log_dropped(changed)
        if rebuild:
            yield from self._fold_flow(None)

    def _forked(self, new_session_id: str) -> Self:
        clone = super()._forked(new_session_id)
        clone._tasks = set()
        clone._lock = None
        clone.last_result = None
        clone.last_error = None
        clone.failures = 0
        return clone

    def flush(self) -> None:
        """Fold now whatever turns the context no longer holds (reads and writes do this
        already)."""
        self._run(self._fold_flow(None))

    async def _awrite(self, batch: list[Message]) -> None:
        if not self.background:
            async with self._fold_lock():
                await self._arun(self._write_flow(batch))
            return
        tail = await self._arun(self._append_flow(batch))
        view = self._fit(tail)
        if view is not None and not self._pending(view, view.summary_state):
            return  # nothing to fold: no task, no further round trip
        # The fold runs later, maybe after other writes: it reads afresh then.
        task = asyncio.get_running_loop().create_task(self._afold(None))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _aread(self, tools: Tools | None = None, *, lenient: bool = False) -> _View:
        return await self._areading(self._read_flow(tools=tools, raising=not lenient))

    async def _areading(self, flow: Flow[T]) -> T:
        # A read may fold: one fold at a time per memory, after the background ones.
        async with self._fold_lock():
            return await self._arun(flow)

    def _settle_flow(self, tools: Tools | None) -> Flow[None]:
        yield from self._fold_flow(None, tools, raising=False)

    async def aflush(self) -> None:
        """Wait for the folds running in the background, then fold what is still pending."""
        if self._tasks:
            await asyncio.gather(*self._tasks)
        await self._afold(None)

    async def _afold(self, tail: Tail | None) -> None:
        async with self._fold_lock():
            await self._arun(self._fold_flow(tail))

    def _fold_lock(self) -> asyncio.Lock:
        # One fold at a time per memory: background folds queue instead of racing (workers
        # elsewhere may still race; compare-and-set settles that).
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    # The stats of a summary memory carry the summary's keys too: the same calls, typed so.

    def get_memory_stats(self, *, tools: Tools | None = None) -> SummaryMemoryStats:
        return cast(SummaryMemoryStats, super().get_memory_stats(tools=tools))

    async def aget_memory_stats(self, *, tools: Tools | None = None) -> SummaryMemoryStats:
        return cast(SummaryMemoryStats, await super().aget_memory_stats(tools=tools))

    def get_context_with_stats(
        self, *, tools: Tools | None = None
    ) -> tuple[list[Message], SummaryMemoryStats]:
        context, stats = super().get_context_with_stats(tools=tools)
        return context, cast(SummaryMemoryStats, stats)

    async def aget_context_with_stats(
        self, *, tools: Tools | None = None
    ) -> tuple[list[Message], SummaryMemoryStats]:
        context, stats = await super().aget_context_with_stats(tools=tools)
        return context, cast(SummaryMemoryStats, stats)

    def _accounting(self, view: _View) -> dict[str, int]:
        """Where each stored turn is: the oldest in the summary, then those waiting for their
        fold (while the summarizer fails), then those in the context; none evicted but a
        greeting the repair rules do not send, or the newest turn of a context over the
        budget."""
        stored: Stored = view.summary_state or Stored()
        total = view.tail.total_turns
        summarized = min(stored.turns, total)
        pending = min(self._pending(view, stored), total - summarized)
        in_context = view.turns_shown if view.error is None else 0
        return {
            "turns_in_context": in_context,
            "turns_summarized": summarized,
            "turns_pending": pending,
            "turns_evicted": total - in_context - summarized - pending,
        }

    def _extra_stats(self, view: _View) -> dict[str, Any]:
        stats = super()._extra_stats(view)
        result = self.last_result
        stats.update(
            {
                "summary_tokens": view.summary_tokens,
                "last_summarized_at": view.summary_at,
                "summary_prompt_tokens": None if result is None else result.prompt_tokens,
                "summary_completion_tokens": None if result is None else result.completion_tokens,
                "summary_failures": self.failures,
                "summary_error": self.last_error,
            }
        )
        return stats


def _first_turn(tail: Tail) -> int:
    """The number, counted from the session's first turn, of the tail's first turn."""
    return tail.total_turns - len(tail.turn_starts)


def _turns_from(tail: Tail, first: int, count: int) -> list[Message]:
    """The messages of the ``count`` turns numbered ``first`` on (the tail must hold them)."""
    offset = first - _first_turn(tail)
    starts = [*tail.turn_starts, len(tail.messages)]
    return list(tail.messages[starts[offset] : starts[offset + count]])


class ConversationSummaryMemory(ConversationSummaryBufferMemory):
    """Pinned system messages and a running summary of every turn, plus the turn in progress.

    Each write folds every complete turn into the summary (a turn is complete once the user
    speaks again, or once it has an assistant reply and no unanswered tool call).
    """

    _type_name: ClassVar[str] = "ConversationSummaryMemory"

    @legacy_positional("summarizer")
    def __init__(
        self,
        *,
        summarizer: Summarizer | None = None,
        background: bool = False,
        summary_prefix: str = DEFAULT_PREFIX,
        token_counter: TokenCounterLike | None = None,
        max_token_limit: int = _UNBOUNDED,
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
        super().__init__(
            max_token_limit,
            summarizer=summarizer,
            background=background,
            summary_prefix=summary_prefix,
            token_counter=token_counter,
            reserve_tokens=reserve_tokens,
            overflow=overflow,
            tools=tools,
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

    def _fit(self, tail: Tail, tools: Tools | None = None) -> _View | None:
        view = super()._fit(tail, tools)
        if view is None or view.error is not None or not view.turns_in_context:
            return view
        turns = group_stored_turns(view.tail.messages[view.start :])
        if not turns:  # repair left the turns in context empty (a greeting, an orphan result)
            return view
        newest = turns[-1]
        complete = newest.reply is not None and not newest.pending_tool_calls
        keep = 0 if complete else 1
        if keep == view.turns_in_context:
            return view
        start = len(view.tail.messages) - (len(newest.messages) if keep else 0)
        counts = self._counts(view.tail.messages, view.tail.tokens)
        view.turn_tokens = sum(counts[start:])
        view.start, view.turns_in_context = start, keep
        return view

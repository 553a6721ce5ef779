"""BaseMemory: the message-level API, the seed (LangChain-style) API and their async twins."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from zerda.errors import (
    ConfigurationError,
    InvalidMessageError,
    ZerdaError,
    warn,
)
from zerda.memory import _observe
from zerda.memory._flow import (
    Append,
    DeleteMessages,
    DeleteSession,
    EditMessage,
    Flow,
    Fork,
    History,
    PopTurn,
    ReadSince,
    ReadTail,
    adrive,
    drive,
)
from zerda.memory._inspect import Inspection, PartTokens, build
from zerda.memory._record import Locate, changed_turn, drop_summary_past, forget_summary
from zerda.memory._stats import MemoryStats
from zerda.messages import (
    Message,
    Role,
    Turn,
    group_stored_turns,
    stamp_batch,
    stamped_batch,
)
from zerda.parts import Part
from zerda.policies import RepairEvent, count_repairs, rename_reused_ids, repair
from zerda.stores._base import (
    AsyncStore,
    BoundedCache,
    Since,
    Store,
    Tail,
    TokenCounts,
    as_async,
    check_ids,
    check_session_id,
)
from zerda.stores._memory import InMemoryStore
from zerda.tokens import TokenCounter, TokenCounterLike, as_token_counter

if TYPE_CHECKING:
    from typing_extensions import Self

T = TypeVar("T")
StatsT = TypeVar("StatsT", bound=MemoryStats)
Tools = Sequence[Mapping[str, Any]]
"""Tool definitions as a request sends them: OpenAI ``{"type": "function", "function": {...}}``
(or the Responses API's flat ``{"type": "function", "name": ...}``)."""

log = _observe.log
# Sessions whose repaired context has been logged already: a WARNING once per session.
_WARNED: BoundedCache[tuple[int, str], bool] = BoundedCache(4096)

__all__ = ["BaseMemory", "MessageLike"]

MessageLike = Message | Mapping[str, Any]
"""What the message-level API accepts: a :class:`Message` or a dict in OpenAI format (which may
also carry ``metadata``, ``created_at`` and ``id``)."""

# Marks a message recorded by ``save_context`` from a missing key or a ``None`` value, so that
# the turn dict gives ``None`` back (the message itself holds ``""``).
NONE_MARK = "zerda:none"

_DEFAULT_SESSION = "default"
# How far back from a tail's end a read looks for where the last read's checks ended.
_LOOK_BACK = 256


@dataclass(slots=True)  # not frozen: internal, built on every read, and frozen init is slow
class _View:
    """What a memory shows: the pinned system messages and the tail from ``start`` on.

    ``error`` is set when no context fits the budget: reading the context raises it, stats
    report it. The token fields are filled by memories that count tokens; ``hint`` is how many
    turns the next read should ask for, and ``summary_state`` the stored summary the view was
    fitted with (summary memories).
    """

    tail: Tail
    start: int
    turns_in_context: int
    summary: Sequence[Message] = ()
    truncated: bool = False
    truncated_tokens: int = 0
    error: ZerdaError | None = None
    system_tokens: int = 0
    summary_tokens: int = 0
    tools_tokens: int = 0
    turn_tokens: int = 0
    overhead_tokens: int = 0
    summary_at: float | None = None
    hint: int | None = None
    summary_state: Any = None
    # What repair did to the tail: see zerda.policies.repair (the events' turns count from
    # the tail's first; their message indexes are the tail's before repair).
    repairs: Sequence[RepairEvent] = ()
    # What the memory keeps of this view to advance it on the next read instead of fitting
    # the tail again (token memories over a store with tail_since); None: nothing.
    window: Any = None
    # The tokens cut from each message of a context whose newest turn was shortened.
    cuts: Sequence[int] = ()

    def context(self) -> list[Message]:
        if self.error is not None:
            raise self.error
        return [*self.tail.system, *self.summary, *self.tail.messages[self.start :]]

    def turns(self) -> list[Turn]:
        if self.error is not None:
            raise self.error
        return group_stored_turns(self.tail.messages[self.start :])

    @property
    def context_tokens(self) -> int:
        return (
            self.system_tokens
            + self.summary_tokens
            + self.tools_tokens
            + self.turn_tokens
            + self.overhead_tokens
        )

    @property
    def first_turn(self) -> int:
        """The context's first turn, by its index in ``tail.turn_starts`` (not found by its
        start: a turn repair emptied, a greeting, starts where the next one does)."""
        return len(self.tail.turn_starts) - self.turns_in_context

    @property
    def turns_shown(self) -> int:
        """Turns of the context with a message in it (repair may have emptied a greeting)."""
        starts = self.tail.turn_starts[self.first_turn :]
        if not starts:
            return 0
        ends = [*starts[1:], len(self.tail.messages)]
        return sum(1 for begin, end in zip(starts, ends, strict=True) if end > begin)

    def tokens_by_part(self) -> dict[str, int]:
        """Where the context's tokens go (with the reply priming, ``context_tokens``)."""
        return {
            "system": self.system_tokens,
            "summary": self.summary_tokens,
            "tools": self.tools_tokens,
            "turns": self.turn_tokens,
        }

    def repair_counts(self) -> dict[str, int]:
        """What repair did to the turns in the context, by kind."""
        return count_repairs(self.repairs, self.first_turn)

    def repairs_made(self) -> dict[str, int]:
        """:meth:`repair_counts` without the kinds that did not happen."""
        return {kind: n for kind, n in self.repair_counts().items() if n}


def _seed_value(message: Message | None) -> str | None:
    if message is None or message.metadata.get(NONE_MARK):
        return None
    return message.text


def turn_dict(turn: Turn) -> dict[str, Any]:
    """A turn as the seed API shows it: ``{"input", "output", "timestamp"}``.

    For a turn with tool calls, ``input`` is the user's text and ``output`` the final
    assistant text (``None`` while the turn is still waiting for it).
    """
    first = turn.user or turn.messages[0]
    return {
        "input": _seed_value(turn.user),
        "output": _seed_value(turn.reply),
        "timestamp": first.created_at,
    }


def _stamped(item: MessageLike, now: float) -> Message:
    """``item`` as a validated Message with ``created_at`` (``now`` if it had none) and an
    ``id`` (a new one if it had none)."""
    m = item if isinstance(item, Message) else Message.from_dict(item)
    return m.stamped(now)


_Init = TypeVar("_Init", bound=Callable[..., None])


def legacy_positional(*names: str) -> Callable[[_Init], _Init]:
    """For one release: let ``__init__`` take ``names``, now keyword-only, by position too
    (in that order, after its positional parameters), with a :class:`~zerda.ZerdaWarning`
    that says how to write the call. A store given by position is refused: it was never a
    positional parameter, and guessing which it meant would hide the mistake."""

    def decorate(init: _Init) -> _Init:
        signature = inspect.signature(init)
        positional = sum(
            p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in signature.parameters.values()
        )  # self included

        @functools.wraps(init)
        def wrapper(self: object, *args: Any, **kwargs: Any) -> None:
            extra = args[positional - 1 :]
            if extra:
                cls = type(self).__name__
                for value in extra:
                    if isinstance(value, (Store, AsyncStore)):
                        raise ConfigurationError(
                            f"{cls}() takes the store by keyword: {cls}(store=...)"
                        )
                if len(extra) > len(names):
                    raise TypeError(
                        f"{cls}() takes at most {positional - 1} positional argument(s); "
                        "pass the others by keyword"
                    )
                used = names[: len(extra)]
                for name, value in zip(used, extra, strict=True):
                    if name in kwargs:
                        raise TypeError(f"{cls}() got multiple values for argument {name!r}")
                    kwargs[name] = value
                warn(
                    f"{cls}(): passing {', '.join(used)} by position is deprecated and stops "
                    f"working in the next release; write {', '.join(f'{n}=...' for n in used)}"
                )
                args = args[: positional - 1]
            init(self, *args, **kwargs)

        return cast(_Init, wrapper)

    return decorate


def _check_key(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {value!r}")
    return value


class BaseMemory(ABC, Generic[StatsT]):
    """What every Zerda memory does; subclasses only say which turns they keep.

    Two ways in, one conversation: ``save_context`` records a user message and an assistant
    message (one turn), ``add_message`` / ``add_messages`` record any messages, tool calls and
    results included. Every method is safe to call from many threads at once, and each has an
    ``a``-prefixed async twin.
    """

    _type_name: ClassVar[str] = "BaseMemory"
    # How many of the newest turns the next read asks for (None: all); views update it.
    _turns_hint: int | None = None
    # (session, first turn, message id, place): the tail from that turn to that message is
    # valid; ``place`` is the message's place among the session's non-system messages, which
    # a deletion before it (by any worker) changes.
    _valid_mark: tuple[str, int, str, int] | None = None

    @legacy_positional("return_messages", "input_key", "output_key", "memory_key")
    def __init__(
        self,
        *,
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
        if not isinstance(return_messages, bool):
            raise ConfigurationError(f"return_messages must be a bool, got {return_messages!r}")
        if not isinstance(strict, bool):
            raise ConfigurationError(f"strict must be a bool, got {strict!r}")
        self.strict = strict
        self.return_messages = return_messages
        self.input_key = _check_key(input_key, "input_key")
        self.output_key = _check_key(output_key, "output_key")
        self.memory_key = _check_key(memory_key, "memory_key")
        self.human_prefix = _check_key(human_prefix, "human_prefix")
        self.ai_prefix = _check_key(ai_prefix, "ai_prefix")
        self.session_id = check_session_id(session_id)
        if isinstance(store, type):  # a class passes the protocol check (unbound methods)
            raise ConfigurationError(
                f"store must be a store instance, got the class {store.__name__}; "
                f"write store={store.__name__}(...)"
            )
        self.store: Store | AsyncStore = InMemoryStore() if store is None else store
        self._sync: Store | None = self.store if isinstance(self.store, Store) else None
        if self._sync is None and not isinstance(self.store, AsyncStore):
            raise ConfigurationError(
                f"store must implement zerda.stores.Store or AsyncStore, got {store!r}"
            )
        # Async calls over a sync store run its methods in a worker thread.
        self._async: AsyncStore = as_async(self.store)

    # The context last read, kept to be advanced by what the store gained since (see
    # ``_advance``); set from each view's ``window``.
    _window: Any = None

    # -- what subclasses decide -----------------------------------------------------------

    def _turns_to_read(self) -> int | None:
        """How many of the newest turns to read first (``None``: all)."""
        return self._turns_hint

    @abstractmethod
    def _fit(self, tail: Tail, tools: Tools | None = None) -> _View | None:
        """Choose the context from ``tail`` (pure: no I/O, no change to ``self``); ``None``
        asks for a longer tail. ``tools``: the request's tool definitions, where the call
        gave them (memories with a token budget count them)."""

    def _counter_name(self) -> str | None:
        """The counter whose stored counts the tail should carry (``None``: no counts)."""
        return None

    def _inspection_counter(self, given: TokenCounterLike | None) -> TokenCounter:
        """The counter an inspection counts with: the memory's own, where it counts (the
        token memories), else ``given`` (default: the default counter)."""
        return as_token_counter(given)

    def _budget(self) -> int | None:
        """The tokens the context may use (``None``: no budget)."""
        return None

    def _settle_flow(self, tools: Tools | None) -> Flow[None]:
        """What an inspection does before it reads: summary memories fold what the context
        leaves out, as every read of theirs does (never raising a summarizer's failure)."""
        return
        yield

    def _usable_window(self) -> Any:
        """The kept window (a view's ``window``) if it may be advanced now, with this
        memory's settings and session; ``None``: fit the tail."""
        return None

    def _advance(self, window: Any, since: Since) -> _View | None:
        """The view of ``window`` with what the store gained since (``since``), the same as
        fitting the tail would give (pure, like ``_fit``); ``None``: fit the tail instead."""
        return None

    def _count(self, batch: Sequence[Message]) -> TokenCounts | None:
        """Token counts to store with a batch (``None``: this memory does not count)."""
        return None

    def _extra_stats(self, view: _View) -> dict[str, Any]:
        return {}

    def _accounting(self, view: _View) -> dict[str, int]:
        """Where each stored turn of ``view`` is (the accounting invariant): in the context,
        or evicted, the oldest (and a greeting the repair rules drop). Summary memories add
        the turns in the summary and those pending their fold."""
        in_context = view.turns_shown if view.error is None else 0
        return {
            "turns_in_context": in_context,
            "turns_evicted": view.tail.total_turns - in_context,
        }

    def _repaired(self, tail: Tail) -> tuple[Tail, list[RepairEvent]]:
        """``tail`` as every provider takes it (:func:`zerda.policies.repair`), and what was
        repaired; the store is never changed.

        Remembers the newest message of a tail found valid (a cache, with no effect on what
        is returned): logs only grow, so the next read checks only what came after it.
        """
        first_turn = tail.total_turns - len(tail.turn_starts)
        messages = tail.messages
        fixed = repair(messages, tail.tokens, tail.turn_starts, self._known_valid(tail, first_turn))
        if fixed is None or not fixed.events:  # valid (a repair that changed nothing too)
            if messages and messages[-1].id is not None:
                place = _non_system_total(tail) - 1
                self._valid_mark = (self.session_id, first_turn, messages[-1].id, place)
            return tail, []
        repaired = dataclasses.replace(
            tail, messages=fixed.messages, turn_starts=fixed.turn_starts, tokens=fixed.tokens
        )
        return repaired, fixed.events

    def _known_valid(self, tail: Tail, first_turn: int) -> int:
        """How many of ``tail``'s messages an earlier read found valid (see ``_repaired``):
        those up to the marked message, when the tail starts in the range that read checked
        and the message is among the newest."""
        mark = self._valid_mark
        if mark is None or mark[0] != self.session_id or first_turn < mark[1]:
            return 0
        messages, marked = tail.messages, mark[2]
        low = max(len(messages) - _LOOK_BACK, 0)
        # Most often a whole turn came since: the marked message ends the turn before it.
        starts = tail.turn_starts
        found = None
        if starts and starts[-1] > low and messages[starts[-1] - 1].id == marked:
            found = starts[-1] - 1
        else:
            found = next(
                (i for i in range(len(messages) - 1, low - 1, -1) if messages[i].id == marked), None
            )
        # A message deleted before it since (by any worker) moves it: check all again.
        if found is None or _non_system_total(tail) - (len(messages) - found) != mark[3]:
            return 0
        return found + 1

    def _checked(self, view: _View) -> _View:
        """``view`` with the call ids its context uses twice renamed (the last repair rule,
        :func:`zerda.policies.rename_reused_ids`: it is about the context, not the tail);
        in ``strict`` mode, refusing a context that needed repairs."""
        if view.error is None:
            _rename_reused(view)
        if self.strict and view.error is None and view.repairs:
            counts = view.repairs_made()
            if counts:
                what = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items())
                view.error = InvalidMessageError(
                    f"session {self.session_id!r}: the context is not valid as stored ({what}); "
                    "strict=True refuses to repair it (zerda.policies.repair says how each "
                    "rule works; strict=False repairs the context and leaves the log as is)"
                )
        return view

    # -- the operations, each written once as a flow (see zerda.memory._flow) ----------------

    def _write_flow(self, batch: list[Message]) -> Flow[None]:
        """Record a prepared batch (summary memories fold after it)."""
        yield Append(self.session_id, batch, self._count(batch))

    def _read_flow(self, tail: Tail | None = None, tools: Tools | None = None) -> Flow[_View]:
        """The view of ``tail`` (read first when ``None``), reading longer tails for as long
        as the policy asks for more turns. A kept window is advanced by what the store
        gained since it, where the store can tell and the window allows."""
        if tail is None and tools is None:
            window = self._usable_window()
            if window is not None:
                since = yield ReadSince(self.session_id, window.cursor, self._counter_name())
                view = None if since is None else self._advance(window, since)
                if view is not None:
                    return self._shown(view)
        turns = self._turns_to_read()
        while True:
            if tail is None:
                tail = yield ReadTail(self.session_id, turns, self._counter_name())
            view = self._fit(tail, tools)
            if view is not None:
                return self._shown(view)
            turns = _more(len(tail.turn_starts))
            tail = None

    def _shown(self, view: _View) -> _View:
        """``view``, once the memory has kept what the next read needs of it and logged it."""
        if view.hint is not None:
            self._turns_hint = view.hint
        self._window = view.window
        if view.repairs:
            self._log_repairs(view)
        _observe.log_context(self._type_name, self.session_id, view, self._accounting)
        return view

    def _log_repairs(self, view: _View) -> None:
        key = (id(self.store), self.session_id)
        if _WARNED.lookup(key):
            return
        counts = view.repairs_made()
        if counts:
            _WARNED.put(key, True)
            log.warning(
                "session %r: the context was repaired for the model (the log is unchanged): %s",
                self.session_id,
                ", ".join(f"{k}={n}" for k, n in counts.items()),
            )

    def _totals_flow(self) -> Flow[Tail]:
        tail: Tail = yield ReadTail(self.session_id, 0, None)
        return tail

    def _history_flow(self) -> Flow[list[Message]]:
        history: list[Message] = yield History(self.session_id)
        return history

    def _clear_flow(self) -> Flow[None]:
        self._valid_mark = None
        yield DeleteSession(self.session_id)

    # -- editing the log (DESIGN.md section 10): the store edits it in one atomic step; what
    #    a summary made of the edited turns is forgotten after (summary memories) ----------

    def _forget_flow(self, first_turn: int | Locate, rebuild: bool) -> Flow[None]:
        """Forget what was derived from turns ``first_turn`` on, which an edit changed: a
        summary of the session that covers them (whichever memory made it), so that the
        removed text is in no later context. Summary memories also fold again at once with
        ``rebuild``; the others fold nothing."""
        changed = yield from forget_summary(self.session_id, first_turn, mark_absent=False)
        if changed is not None:
            self._log_dropped(changed)

    def _log_dropped(self, first_turn: int) -> None:
        log.info(
            "summary dropped: session=%r memory=%s: an edit changed turn %d, which it "
            "covered; a summary memory folds the turns again on its next read or write",
            self.session_id,
            self._type_name,
            first_turn,
        )

    def _pop_flow(self, rebuild: bool) -> Flow[Turn | None]:
        popped: list[Message] = yield PopTurn(self.session_id)
        self._valid_mark = None
        if not popped:
            return None
        calls = {c.id for m in popped for c in m.tool_calls}
        if all(m.role is not Role.TOOL or m.tool_call_id in calls for m in popped):
            left: Tail = yield ReadTail(self.session_id, 0, None)
            yield from self._forget_flow(left.total_turns, rebuild)  # the popped turn came after
        else:  # results of an older turn's calls went too: that turn changed
            ids = {m.id for m in popped if m.id is not None}
            yield from self._forget_flow(lambda left: changed_turn([*left, *popped], ids), rebuild)
        return Turn(tuple(popped))

    def _delete_flow(self, ids: Collection[str], rebuild: bool) -> Flow[int]:
        wanted = set(check_ids(ids))
        history: list[Message] = yield History(self.session_id)
        # The results of a deleted message's calls go with it: a result alone means nothing.
        calls = {c.id for m in history if m.id in wanted for c in m.tool_calls}
        wanted.update(
            m.id
            for m in history
            if m.role is Role.TOOL and m.tool_call_id in calls and m.id is not None
        )
        first = changed_turn(history, wanted)
        deleted: int = yield DeleteMessages(self.session_id, sorted(wanted))
        self._valid_mark = None
        if deleted and first is not None:
            yield from self._forget_flow(first, rebuild)
        return deleted

    def _edit_flow(
        self, message_id: str, content: str | tuple[Part, ...] | None, rebuild: bool
    ) -> Flow[Message]:
        message: Message = yield EditMessage(self.session_id, message_id, content)
        # An edit moves nothing: where it was is read afterwards, and only if a summary is kept.
        yield from self._forget_flow(lambda history: changed_turn(history, {message_id}), rebuild)
        return message

    def _fork_flow(self, new_session_id: str, at: str | None) -> Flow[None]:
        """Fork; the new session keeps the summary only if it covers no message past ``at``
        (its turns all end before the fork's last turn, which ``at`` may cut short)."""
        yield Fork(self.session_id, new_session_id, at)
        if at is not None:
            yield from drop_summary_past(new_session_id)

    def _forked(self, new_session_id: str) -> Self:
        """A memory of the same kind and settings on ``new_session_id``, with none of this
        one's per-session state."""
        clone = copy.copy(self)
        clone.session_id = new_session_id
        clone._valid_mark = None
        clone._window = None
        return clone

    # -- the drivers: sync calls need a sync store; async calls are native over an async
    #    store and run in a worker thread over a sync one ---------------------------------------

    @property
    def _io(self) -> Store:
        if self._sync is None:
            raise ZerdaError(
                f"{type(self.store).__name__} is an async store: use the memory's async methods "
                "(await memory.aget_context(), ...) or a sync store"
            )
        return self._sync

    def _run(self, flow: Flow[T]) -> T:
        if not _observe.tracing():
            return drive(flow, self._io)
        with _observe.span(self._type_name, self.session_id, flow):
            return drive(flow, self._io)

    async def _arun(self, flow: Flow[T]) -> T:
        if not _observe.tracing():
            return await adrive(flow, self._async)
        with _observe.span(self._type_name, self.session_id, flow):
            return await adrive(flow, self._async)

    def _read(self, tools: Tools | None = None, *, lenient: bool = False) -> _View:
        """The view every read shows (summary memories fold what it leaves out first;
        ``lenient``: a read for stats, which never raises a summarizer's failure)."""
        return self._run(self._read_flow(tools=tools))

    async def _aread(self, tools: Tools | None = None, *, lenient: bool = False) -> _View:
        return await self._areading(self._read_flow(tools=tools))

    async def _areading(self, flow: Flow[T]) -> T:
        """Drive a read from async code (summary memories: one fold at a time)."""
        return await self._arun(flow)

    # -- inspection: one account of the context (zerda.memory._inspect) ---------------------

    def _inspect_flow(
        self, tools: Tools | None, turns: int | None, counter: TokenCounter
    ) -> Flow[Inspection]:
        """Settle, then read the newest ``turns`` turns (all with ``None``; at least what
        the context needs) with their counts, and account for the view fitted from them."""
        yield from self._settle_flow(tools)
        hint = self._turns_to_read()
        want = None if turns is None or hint is None else max(turns, hint)
        while True:
            raw: Tail = yield ReadTail(self.session_id, want, counter.name)
            view = self._fit(raw, tools)
            if view is not None:
                return self._inspection(raw, view, counter, turns)
            want = _more(len(raw.turn_starts))

    def _inspection(
        self, raw: Tail, view: _View, counter: TokenCounter, turns: int | None
    ) -> Inspection:
        context = None if view.error is not None else view.context()
        budget = self._budget()
        # A token memory counted every part as it fitted; for the others the account counts.
        tokens = None
        if budget is not None:
            tokens = PartTokens(
                view.system_tokens,
                view.summary_tokens,
                view.tools_tokens,
                view.turn_tokens,
                view.overhead_tokens,
                budget,
            )
        return build(
            session_id=self.session_id,
            memory=self._type_name,
            counter=counter,
            raw=raw,
            tail=view.tail,
            start=view.start,
            turns_in_context=view.turns_in_context,
            summary=view.summary,
            context=context,
            cuts=view.cuts,
            accounting=self._accounting(view),
            tokens=tokens,
            stats=self._stats(view),
            error=view.error,
            keep=None if turns is None else max(turns, view.turns_in_context),
        )

    # -- shared, I/O-free steps -----------------------------------------------------------

    @staticmethod
    def _prepare(messages: Iterable[MessageLike]) -> list[Message]:
        """Validate a batch and stamp ``created_at`` and ``id``; raises before anything is
        stored."""
        if type(messages) is not list and (
            isinstance(messages, (Message, Mapping, str, bytes))
            or not isinstance(messages, Iterable)
        ):
            raise InvalidMessageError(
                "add_messages takes a list of messages, got "
                f"{type(messages).__name__}; use add_message for a single one"
            )
        return stamped_batch(messages, time.time())

    def _seed_turn(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> list[Message]:
        # Check both before building either, so a bad ``outputs`` does not first warn about a
        # missing input key ("stored None") for a turn that is then not stored.
        for values, what in ((inputs, "inputs"), (outputs, "outputs")):
            if not isinstance(values, Mapping):
                raise ConfigurationError(f"{what} must be a dict, got {type(values).__name__}")
        user = self._seed_message(Role.USER, inputs, self.input_key, "inputs")
        assistant = self._seed_message(Role.ASSISTANT, outputs, self.output_key, "outputs")
        return stamp_batch([user, assistant], time.time())

    @staticmethod
    def _seed_message(role: Role, values: Mapping[str, Any], key: str, what: str) -> Message:
        if key not in values:
            warn(
                f"save_context: key {key!r} is missing from {what} (keys there: "
                f"{sorted(map(str, values))}); stored None. Set "
                f"{'input_key' if role is Role.USER else 'output_key'}= to your chain's key."
            )
        value = values.get(key)
        if value is None:
            return Message(role, "", metadata={NONE_MARK: True})
        return Message(role, value if isinstance(value, str) else str(value))

    def _format(self, view: _View) -> Any:
        turns = view.turns()
        dicts = [turn_dict(t) for t in turns]
        if self.return_messages:
            return dicts
        # The summary (a system message after the pinned ones) is part of what the model sees.
        lines = [f"{m.role.value}: {m.text}" for m in (*view.tail.system, *view.summary)]
        human, ai = self.human_prefix, self.ai_prefix
        for d in dicts:
            # None (a missing key, an answer still to come) is no text to show the model.
            if d["input"] is not None:
                lines.append(f"{human}: {d['input']}")
            if d["output"] is not None:
                lines.append(f"{ai}: {d['output']}")
        return "\n".join(lines)

    @staticmethod
    def _check_limit(limit: int | None, what: str = "limit") -> None:
        if limit is None:
            return
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"{what} must be None or an integer >= 0, got {limit!r}")

    @staticmethod
    def _last_dicts(view: _View, limit: int | None) -> list[dict[str, Any]]:
        turns = view.turns()
        if limit is not None:
            turns = turns[max(len(turns) - limit, 0) :]
        return [turn_dict(t) for t in turns]

    def _stats(self, view: _View) -> StatsT:
        # Stats never raise: with no context that fits, they describe an empty one.
        turns = view.turns() if view.error is None else []
        characters = 0
        for turn in turns:
            # The seed API's characters: the turn's input and output as turn_dict shows them
            # (None as "None"), then every other message's text and tool calls.
            user, reply = turn.user, turn.reply  # each a scan: once a turn, not a message
            characters += len(str(_seed_value(user))) + len(str(_seed_value(reply)))
            for m in turn.messages:
                if m is user or m is reply:
                    continue
                characters += len(m.text)
                for c in m.tool_calls:
                    characters += len(c.name) + len(c.arguments)
        tail = view.tail
        stats: dict[str, Any] = {
            "type": self._type_name,
            "repairs": view.repair_counts(),
            "message_count": len(turns),
            "total_messages": len(tail.system) + sum(len(t.messages) for t in turns),
            "total_characters": characters,
            "estimated_tokens": characters // 4,
            "stored_turns": tail.total_turns,
            "stored_messages": tail.total_messages,
        }
        stats.update(self._accounting(view))
        stats.update(self._extra_stats(view))
        return cast(StatsT, stats)

    # -- message-level API ----------------------------------------------------------------

    def add_message(self, message: MessageLike) -> Message:
        """Record one message; returns it as stored, with ``created_at`` and ``id`` set.

        A message whose id the session already holds is not stored again: to retry a write
        whose outcome is unknown, send the same id (keep what this returned, or give ids).
        """
        batch = [_stamped(message, time.time())]
        self._run(self._write_flow(batch))
        return batch[0]

    def add_messages(self, messages: Iterable[MessageLike]) -> list[Message]:
        """Record messages as one atomic batch: all are stored, together, or none is."""
        batch = self._prepare(messages)
        self._run(self._write_flow(batch))
        return batch

    def get_context(self, *, tools: Tools | None = None) -> list[Message]:
        """What to send to the model: pinned system messages first, then the kept turns.

        ``tools``: the tool definitions this request sends, when they differ from the
        memory's own ``tools=`` (token memories count them in the budget; the others keep
        no budget and ignore them).
        """
        return self._read(tools).context()

    def get_context_with_stats(self, *, tools: Tools | None = None) -> tuple[list[Message], StatsT]:
        """:meth:`get_context` and :meth:`get_memory_stats` from one read of the store: the
        stats describe exactly that context, and it costs half the I/O of the two calls."""
        view = self._read(tools)
        return view.context(), self._stats(view)

    def inspect(
        self,
        *,
        tools: Tools | None = None,
        turns: int | None = None,
        token_counter: TokenCounterLike | None = None,
    ) -> Inspection:
        """One account of the context :meth:`get_context` gives now (``tools`` as there),
        from one read: its messages; for each of the newest ``turns`` stored turns (default:
        all) its fate (``"context"``, ``"summary"``, ``"pending"``, ``"evicted"``) and
        tokens; for each message what the context sends of it and each repair; the tokens
        by part; the stats. It never raises for a context over the budget (``error`` says
        why) nor for a failing summarizer (the turns show as pending).

        ``token_counter`` counts for the memories that count nothing themselves (the buffer
        and the window; default: the default counter); a token memory counts with its own.
        See docs/inspect.md."""
        self._check_limit(turns, "turns")
        counter = self._inspection_counter(token_counter)
        return self._run(self._inspect_flow(tools, turns, counter))

    def get_history(self) -> list[Message]:
        """Every stored message, in order, system messages included."""
        return self._run(self._history_flow())

    # -- seed API ---------------------------------------------------------------------------

    def save_context(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        """Record one turn: ``inputs[input_key]`` said by the user, ``outputs[output_key]``."""
        self._run(self._write_flow(self._seed_turn(inputs, outputs)))

    def load_memory_variables(self, inputs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``{memory_key: text}``, or ``{memory_key: [turn dicts]}`` with ``return_messages``.

        ``inputs`` is accepted for compatibility and ignored.
        """
        return {self.memory_key: self._format(self._read())}

    def get_messages(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The last ``limit`` turns the memory keeps, as a new list of turn dicts.

        ``None`` gives every kept turn, ``0`` none; a negative limit raises ``ValueError``.
        """
        self._check_limit(limit)
        return self._last_dicts(self._read(), limit)

    def get_memory_stats(self, *, tools: Tools | None = None) -> StatsT:
        """Counts over what the memory keeps; ``stored_*`` count the whole stored session."""
        return self._stats(self._read(tools, lenient=True))

    def clear(self) -> None:
        """Forget the session: every message and its metadata, system messages included."""
        self._run(self._clear_flow())

    # -- editing and branching --------------------------------------------------------------------

    def pop_turn(self, *, rebuild: bool = False) -> Turn | None:
        """Remove the newest turn from the store and return it (``None`` when there is none):
        regenerate an answer, roll back a failed step. System messages stay.

        Like every edit, it forgets a summary made of what it removed: the summary memories
        drop it, and fold the turns again on the next write (``rebuild=True``: now)."""
        return self._run(self._pop_flow(rebuild))

    def delete_messages(self, ids: Collection[str], *, rebuild: bool = False) -> int:
        """Delete messages by id; how many were deleted. Deleting an assistant message with
        tool calls deletes their results too; deleting a result deletes nothing else (the
        repair rules keep the context valid). A summary that covered a deleted message is
        dropped (see :meth:`pop_turn`), so its text appears in no later context."""
        return self._run(self._delete_flow(ids, rebuild))

    def edit_message(
        self, message_id: str, content: str | tuple[Part, ...] | None, *, rebuild: bool = False
    ) -> Message:
        """Replace a message's content, keeping its id, role and place; its metadata records
        ``edited_at``. Returns the message as stored. A summary that covered it is dropped
        (see :meth:`pop_turn`)."""
        return self._run(self._edit_flow(message_id, content, rebuild))

    def fork(self, new_session_id: str, at: str | None = None) -> Self:
        """A memory of the same kind and settings on ``new_session_id``, holding this
        session's log up to and including the message ``at`` (default: all of it); this
        session is unchanged. :class:`~zerda.SessionExistsError` if the new session holds
        anything."""
        self._run(self._fork_flow(check_session_id(new_session_id), at))
        return self._forked(new_session_id)

    # -- async twins: the same flows, driven by the async driver ----------------------------------

    async def aadd_message(self, message: MessageLike) -> Message:
        batch = [_stamped(message, time.time())]
        await self._awrite(batch)
        return batch[0]

    async def aadd_messages(self, messages: Iterable[MessageLike]) -> list[Message]:
        batch = self._prepare(messages)
        await self._awrite(batch)
        return batch

    async def _awrite(self, batch: list[Message]) -> None:
        await self._arun(self._write_flow(batch))

    async def aget_context(self, *, tools: Tools | None = None) -> list[Message]:
        return (await self._aread(tools)).context()

    async def aget_context_with_stats(
        self, *, tools: Tools | None = None
    ) -> tuple[list[Message], StatsT]:
        view = await self._aread(tools)
        return view.context(), self._stats(view)

    async def ainspect(
        self,
        *,
        tools: Tools | None = None,
        turns: int | None = None,
        token_counter: TokenCounterLike | None = None,
    ) -> Inspection:
        self._check_limit(turns, "turns")
        counter = self._inspection_counter(token_counter)
        return await self._areading(self._inspect_flow(tools, turns, counter))

    async def aget_history(self) -> list[Message]:
        return await self._arun(self._history_flow())

    async def asave_context(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        await self._awrite(self._seed_turn(inputs, outputs))

    async def aload_memory_variables(
        self, inputs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return {self.memory_key: self._format(await self._aread())}

    async def aget_messages(self, limit: int | None = None) -> list[dict[str, Any]]:
        self._check_limit(limit)
        return self._last_dicts(await self._aread(), limit)

    async def aget_memory_stats(self, *, tools: Tools | None = None) -> StatsT:
        return self._stats(await self._aread(tools, lenient=True))

    async def aclear(self) -> None:
        await self._arun(self._clear_flow())

    async def apop_turn(self, *, rebuild: bool = False) -> Turn | None:
        return await self._arun(self._pop_flow(rebuild))

    async def adelete_messages(self, ids: Collection[str], *, rebuild: bool = False) -> int:
        return await self._arun(self._delete_flow(ids, rebuild))

    async def aedit_message(
        self, message_id: str, content: str | tuple[Part, ...] | None, *, rebuild: bool = False
    ) -> Message:
        return await self._arun(self._edit_flow(message_id, content, rebuild))

    async def afork(self, new_session_id: str, at: str | None = None) -> Self:
        await self._arun(self._fork_flow(check_session_id(new_session_id), at))
        return self._forked(new_session_id)

    @property
    def memory_variables(self) -> list[str]:
        """The keys ``load_memory_variables`` returns (LangChain compatibility)."""
        return [self.memory_key]


def _rename_reused(view: _View) -> None:
    """Rename the call ids the context of ``view`` uses twice, in its tail, and add the
    events (see :meth:`BaseMemory._checked`)."""
    tail, start = view.tail, view.start
    first = view.first_turn
    starts = tail.turn_starts
    renamed = rename_reused_ids(tail.messages[start:], [s - start for s in starts[first:]])
    if renamed is None:
        return
    messages, events = renamed
    view.tail = dataclasses.replace(tail, messages=[*tail.messages[:start], *messages])
    shifted = (e._replace(turn=e.turn + first, stored_turn=e.stored_turn + first) for e in events)
    view.repairs = [*view.repairs, *shifted]


def _non_system_total(tail: Tail) -> int:
    """How many of the session's stored messages are not pinned: the tail's messages are the
    newest of them."""
    return tail.total_messages - len(tail.system)


def _more(turns: int | None) -> int | None:
    """The next, longer tail to read when a policy asks for more turns."""
    return None if turns is None else max(2 * turns, 8)

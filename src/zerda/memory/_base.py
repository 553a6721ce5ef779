"""BaseMemory: the message-level API, the seed (LangChain-style) API and their async twins."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from zerda.errors import (
    ConfigurationError,
    ContextOverflowError,
    InvalidMessageError,
    ZerdaError,
    warn,
)
from zerda.messages import Message, Role, Turn, group_turns
from zerda.stores._base import AsyncStore, Store, Tail, TokenCounts, check_session_id
from zerda.stores._memory import InMemoryStore

__all__ = ["BaseMemory", "MessageLike"]

MessageLike = Message | Mapping[str, Any]
"""What the message-level API accepts: a :class:`Message` or a dict in OpenAI format (which may
also carry ``metadata`` and ``created_at``)."""

# Marks a message recorded by ``save_context`` from a missing key or a ``None`` value, so that
# the turn dict gives ``None`` back (the message itself holds ``""``).
NONE_MARK = "zerda:none"

_DEFAULT_SESSION = "default"


@dataclass(slots=True)  # not frozen: internal, built on every read, and frozen init is slow
class _View:
    """What a memory shows: the pinned system messages and the tail from ``start`` on.

    ``error`` is set when no context fits the budget: reading the context raises it, stats
    report it. The token fields are filled by memories that count tokens.
    """

    tail: Tail
    start: int
    turns_in_context: int
    summary: Sequence[Message] = ()
    truncated: bool = False
    error: ContextOverflowError | None = None
    system_tokens: int = 0
    summary_tokens: int = 0
    turn_tokens: int = 0
    overhead_tokens: int = 0
    summary_turns: int = 0
    summary_at: float | None = None

    def context(self) -> list[Message]:
        if self.error is not None:
            raise self.error
        return [*self.tail.system, *self.summary, *self.tail.messages[self.start :]]

    def turns(self) -> list[Turn]:
        if self.error is not None:
            raise self.error
        return group_turns(self.tail.messages[self.start :])

    @property
    def context_tokens(self) -> int:
        return self.system_tokens + self.summary_tokens + self.turn_tokens + self.overhead_tokens


def _seed_value(message: Message | None) -> str | None:
    if message is None or message.metadata.get(NONE_MARK):
        return None
    return message.content


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
    """``item`` as a validated Message with ``created_at`` set (to ``now`` if it had none)."""
    m = item if isinstance(item, Message) else Message.from_dict(item)
    return m if m.created_at is not None else m.with_created_at(now)


def _check_key(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {value!r}")
    return value


class BaseMemory(ABC):
    """What every Zerda memory does; subclasses only say which turns they keep.

    Two ways in, one conversation: ``save_context`` records a user message and an assistant
    message (one turn), ``add_message`` / ``add_messages`` record any messages, tool calls and
    results included. Every method is safe to call from many threads at once, and each has an
    ``a``-prefixed async twin.
    """

    _type_name: ClassVar[str] = "BaseMemory"

    def __init__(
        self,
        return_messages: bool = False,
        input_key: str = "input",
        output_key: str = "output",
        memory_key: str = "history",
        *,
        store: Store | AsyncStore | None = None,
        session_id: str = _DEFAULT_SESSION,
    ) -> None:
        if not isinstance(return_messages, bool):
            raise ConfigurationError(f"return_messages must be a bool, got {return_messages!r}")
        self.return_messages = return_messages
        self.input_key = _check_key(input_key, "input_key")
        self.output_key = _check_key(output_key, "output_key")
        self.memory_key = _check_key(memory_key, "memory_key")
        self.session_id = check_session_id(session_id)
        if isinstance(store, type):  # a class passes the protocol check (unbound methods)
            raise ConfigurationError(
                f"store must be a store instance, got the class {store.__name__}; "
                f"write store={store.__name__}(...)"
            )
        self.store: Store | AsyncStore = InMemoryStore() if store is None else store
        self._sync: Store | None = self.store if isinstance(self.store, Store) else None
        self._async: AsyncStore | None = self.store if isinstance(self.store, AsyncStore) else None
        if self._sync is None and self._async is None:
            raise ConfigurationError(
                f"store must implement zerda.stores.Store or AsyncStore, got {store!r}"
            )

    # -- what subclasses decide -----------------------------------------------------------

    @abstractmethod
    def _turns_to_read(self) -> int | None:
        """How many of the newest turns to read first (``None``: all)."""

    @abstractmethod
    def _fit(self, tail: Tail) -> _View | None:
        """Choose the context from ``tail`` (a pure step); ``None`` asks for a longer tail."""

    def _counter_name(self) -> str | None:
        """The counter whose stored counts the tail should carry (``None``: no counts)."""
        return None

    def _count(self, batch: Sequence[Message]) -> TokenCounts | None:
        """Token counts to store with a batch (``None``: this memory does not count)."""
        return None

    def _extra_stats(self, view: _View) -> dict[str, Any]:
        return {}

    # -- store I/O: sync calls need a sync store; async calls are native over an async store
    #    and run in a worker thread over a sync one ------------------------------------------

    @property
    def _io(self) -> Store:
        if self._sync is None:
            raise ZerdaError(
                f"{type(self.store).__name__} is an async store: use the memory's async methods "
                "(await memory.aget_context(), ...) or a sync store"
            )
        return self._sync

    async def _aappend(self, batch: list[Message]) -> None:
        tokens = self._count(batch)
        if self._async is not None:
            await self._async.aappend(self.session_id, batch, tokens)
        else:
            await asyncio.to_thread(self._io.append, self.session_id, batch, tokens)

    async def _atail(self, turns: int | None) -> Tail:
        if self._async is not None:
            return await self._async.atail(self.session_id, turns, self._counter_name())
        return await asyncio.to_thread(self._io.tail, self.session_id, turns, self._counter_name())

    def _read(self, fit: Callable[[Tail], _View | None] | None = None) -> _View:
        """Read tails, longer each time ``fit`` (default: ``self._fit``) asks, until it fits."""
        fit = fit or self._fit
        turns = self._turns_to_read()
        while True:
            view = fit(self._io.tail(self.session_id, turns, self._counter_name()))
            if view is not None:
                return view
            turns = _more(turns)

    async def _aread(self, fit: Callable[[Tail], _View | None] | None = None) -> _View:
        fit = fit or self._fit
        turns = self._turns_to_read()
        while True:
            view = fit(await self._atail(turns))
            if view is not None:
                return view
            turns = _more(turns)

    def _after_write(self) -> None:  # noqa: B027  (a hook: most memories do nothing)
        """Called after every write (summary memories fold evicted turns here)."""

    async def _aafter_write(self) -> None:  # noqa: B027
        """The async twin of :meth:`_after_write`."""

    # -- shared, I/O-free steps -----------------------------------------------------------

    @staticmethod
    def _prepare(messages: Iterable[MessageLike]) -> list[Message]:
        """Validate a batch and stamp ``created_at``; raises before anything is stored."""
        if isinstance(messages, (Message, Mapping, str, bytes)) or not isinstance(
            messages, Iterable
        ):
            raise InvalidMessageError(
                "add_messages takes a list of messages, got "
                f"{type(messages).__name__}; use add_message for a single one"
            )
        now = time.time()
        batch: list[Message] = []
        append = batch.append
        for item in messages:
            if type(item) is Message and item.created_at is None:
                append(item.with_created_at(now))  # the common case, kept cheap
                continue
            try:
                append(_stamped(item, now))
            except InvalidMessageError as exc:
                raise InvalidMessageError(f"message {len(batch)}: {exc}") from None
        return batch

    def _seed_turn(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> list[Message]:
        # Check both before building either, so a bad ``outputs`` does not first warn about a
        # missing input key ("stored None") for a turn that is then not stored.
        for values, what in ((inputs, "inputs"), (outputs, "outputs")):
            if not isinstance(values, Mapping):
                raise ConfigurationError(f"{what} must be a dict, got {type(values).__name__}")
        now = time.time()
        user = self._seed_message(Role.USER, inputs, self.input_key, "inputs", now)
        assistant = self._seed_message(Role.ASSISTANT, outputs, self.output_key, "outputs", now)
        return [user, assistant]

    @staticmethod
    def _seed_message(
        role: Role, values: Mapping[str, Any], key: str, what: str, now: float
    ) -> Message:
        if key not in values:
            warn(
                f"save_context: key {key!r} is missing from {what} (keys there: "
                f"{sorted(map(str, values))}); stored None. Set "
                f"{'input_key' if role is Role.USER else 'output_key'}= to your chain's key."
            )
        value = values.get(key)
        if value is None:
            return Message(role, "", metadata={NONE_MARK: True}, created_at=now)
        return Message(role, value if isinstance(value, str) else str(value), created_at=now)

    def _format(self, view: _View) -> Any:
        turns = view.turns()
        dicts = [turn_dict(t) for t in turns]
        if self.return_messages:
            return dicts
        # The summary (a system message after the pinned ones) is part of what the model sees.
        lines = [f"system: {m.content}" for m in (*view.tail.system, *view.summary)]
        for turn, d in zip(turns, dicts, strict=True):
            if turn.user is not None:
                lines.append(f"user: {d['input']}")
            lines.append(f"assistant: {d['output']}")
        return "\n".join(lines)

    @staticmethod
    def _check_limit(limit: int | None) -> None:
        if limit is None:
            return
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigurationError(f"limit must be None or an integer >= 0, got {limit!r}")

    @staticmethod
    def _last_dicts(view: _View, limit: int | None) -> list[dict[str, Any]]:
        turns = view.turns()
        if limit is not None:
            turns = turns[max(len(turns) - limit, 0) :]
        return [turn_dict(t) for t in turns]

    def _stats(self, view: _View) -> dict[str, Any]:
        # Stats never raise: with no context that fits, they describe an empty one.
        turns = view.turns() if view.error is None else []
        characters = 0
        for turn in turns:
            d = turn_dict(turn)
            characters += len(str(d["input"])) + len(str(d["output"]))
            for m in turn.messages:
                if m is turn.user or m is turn.reply:
                    continue
                characters += len(m.text) + sum(
                    len(c.name) + len(c.arguments) for c in m.tool_calls
                )
        tail = view.tail
        stats: dict[str, Any] = {
            "type": self._type_name,
            "message_count": len(turns),
            "total_messages": len(tail.system) + sum(len(t.messages) for t in turns),
            "total_characters": characters,
            "estimated_tokens": characters // 4,
            "stored_turns": tail.total_turns,
            "stored_messages": tail.total_messages,
        }
        stats.update(self._extra_stats(view))
        return stats

    # -- message-level API ----------------------------------------------------------------

    def add_message(self, message: MessageLike) -> Message:
        """Record one message; returns it as stored (with ``created_at`` set)."""
        batch = [_stamped(message, time.time())]
        self._io.append(self.session_id, batch, self._count(batch))
        self._after_write()
        return batch[0]

    def add_messages(self, messages: Iterable[MessageLike]) -> list[Message]:
        """Record messages as one atomic batch: all are stored, together, or none is."""
        batch = self._prepare(messages)
        self._io.append(self.session_id, batch, self._count(batch))
        self._after_write()
        return batch

    def get_context(self) -> list[Message]:
        """What to send to the model: pinned system messages first, then the kept turns."""
        return self._read().context()

    def get_history(self) -> list[Message]:
        """Every stored message, in order, system messages included."""
        return self._io.history(self.session_id)

    # -- seed API ---------------------------------------------------------------------------

    def save_context(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        """Record one turn: ``inputs[input_key]`` said by the user, ``outputs[output_key]``."""
        batch = self._seed_turn(inputs, outputs)
        self._io.append(self.session_id, batch, self._count(batch))
        self._after_write()

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

    def get_memory_stats(self) -> dict[str, Any]:
        """Counts over what the memory keeps; ``stored_*`` count the whole stored session."""
        return self._stats(self._read())

    def clear(self) -> None:
        """Forget the session: every message and its metadata, system messages included."""
        self._io.delete_session(self.session_id)

    # -- async twins --------------------------------------------------------------------------

    async def aadd_message(self, message: MessageLike) -> Message:
        batch = [_stamped(message, time.time())]
        await self._aappend(batch)
        await self._aafter_write()
        return batch[0]

    async def aadd_messages(self, messages: Iterable[MessageLike]) -> list[Message]:
        batch = self._prepare(messages)
        await self._aappend(batch)
        await self._aafter_write()
        return batch

    async def aget_context(self) -> list[Message]:
        return (await self._aread()).context()

    async def aget_history(self) -> list[Message]:
        if self._async is not None:
            return await self._async.ahistory(self.session_id)
        return await asyncio.to_thread(self._io.history, self.session_id)

    async def asave_context(self, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
        batch = self._seed_turn(inputs, outputs)
        await self._aappend(batch)
        await self._aafter_write()

    async def aload_memory_variables(
        self, inputs: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        return {self.memory_key: self._format(await self._aread())}

    async def aget_messages(self, limit: int | None = None) -> list[dict[str, Any]]:
        self._check_limit(limit)
        return self._last_dicts(await self._aread(), limit)

    async def aget_memory_stats(self) -> dict[str, Any]:
        return self._stats(await self._aread())

    async def aclear(self) -> None:
        if self._async is not None:
            await self._async.adelete_session(self.session_id)
        else:
            await asyncio.to_thread(self._io.delete_session, self.session_id)

    @property
    def memory_variables(self) -> list[str]:
        """The keys ``load_memory_variables`` returns (LangChain compatibility)."""
        return [self.memory_key]


def _more(turns: int | None) -> int | None:
    """The next, longer tail to read when a policy asks for more turns."""
    return None if turns is None else max(2 * turns, 8)

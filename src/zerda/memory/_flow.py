"""A memory's operations as generator flows over store requests, with a sync and an async driver.

Each operation (record a batch, read the context, fold the summary) is written once, as a
generator that yields what it needs done (a :class:`Request`) and receives the answer. The
sync driver answers through a :class:`~zerda.stores.Store`, the async one through an
:class:`~zerda.stores.AsyncStore`; an error raised answering a request is thrown into the flow,
which may handle it (a summarizer failure) or let it through.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from zerda.messages import Message
from zerda.parts import Part
from zerda.stores._base import AsyncStore, Since, Store, Tail, TailSince, TokenCounts
from zerda.summarize import Summarizer, SummaryResult, arun_summarizer, run_summarizer

__all__ = [
    "Append",
    "AppendThenTail",
    "CompareAndSet",
    "DeleteMessages",
    "DeleteSession",
    "EditMessage",
    "Flow",
    "Fork",
    "History",
    "PopTurn",
    "ReadSince",
    "ReadTail",
    "Request",
    "Summarize",
    "adrive",
    "drive",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Request(Protocol[T_co]):
    """One thing a flow needs done, with its sync and its async way of doing it."""

    def run(self, store: Store) -> T_co: ...

    async def arun(self, store: AsyncStore) -> T_co: ...


Flow = Generator["Request[Any]", Any, T]
"""An operation written once: it yields requests and gets their answers back."""

# Requests are slotted dataclasses, not frozen: one is built for every operation, and a frozen
# dataclass sets each field through object.__setattr__. Nothing changes them once built.


@dataclass(slots=True)
class ReadTail:
    """The session's newest ``turns`` turns and its metadata: one round trip."""

    session_id: str
    turns: int | None
    counter: str | None

    def run(self, store: Store) -> Tail:
        return store.tail(self.session_id, self.turns, self.counter)

    async def arun(self, store: AsyncStore) -> Tail:
        return await store.atail(self.session_id, self.turns, self.counter)


@dataclass(slots=True)
class ReadSince:
    """What the session gained after ``cursor``, from a store that can tell (``tail_since``,
    see :class:`~zerda.stores._base.Since`); ``None``: read the tail again."""

    session_id: str
    cursor: object
    counter: str | None

    def run(self, store: Store) -> Since | None:
        since: TailSince | None = getattr(store, "tail_since", None)
        return None if since is None else since(self.session_id, self.cursor, self.counter)

    async def arun(self, store: AsyncStore) -> Since | None:
        since: Callable[[str, object, str | None], Awaitable[Since | None]] | None = getattr(
            store, "atail_since", None
        )
        if since is None:
            return None
        return await since(self.session_id, self.cursor, self.counter)


@dataclass(slots=True)
class Append:
    """Append a batch (idempotent by message id); how many messages were stored."""

    session_id: str
    messages: Sequence[Message]
    tokens: TokenCounts | None

    def run(self, store: Store) -> int:
        return store.append(self.session_id, self.messages, self.tokens)

    async def arun(self, store: AsyncStore) -> int:
        return await store.aappend(self.session_id, self.messages, self.tokens)


@dataclass(slots=True)
class DeleteMessages:
    """Delete messages by id; how many were deleted."""

    session_id: str
    ids: Sequence[str]

    def run(self, store: Store) -> int:
        return store.delete_messages(self.session_id, self.ids)

    async def arun(self, store: AsyncStore) -> int:
        return await store.adelete_messages(self.session_id, self.ids)


@dataclass(slots=True)
class PopTurn:
    """Remove the newest turn; its messages."""

    session_id: str

    def run(self, store: Store) -> list[Message]:
        return store.pop_turn(self.session_id)

    async def arun(self, store: AsyncStore) -> list[Message]:
        return await store.apop_turn(self.session_id)


@dataclass(slots=True)
class Fork:
    """Copy the log up to ``at`` into a new session; how many messages were copied."""

    session_id: str
    new_session_id: str
    at: str | None

    def run(self, store: Store) -> int:
        return store.fork(self.session_id, self.new_session_id, self.at)

    async def arun(self, store: AsyncStore) -> int:
        return await store.afork(self.session_id, self.new_session_id, self.at)


@dataclass(slots=True)
class EditMessage:
    """Replace one message's content; the message as stored."""

    session_id: str
    message_id: str
    content: str | tuple[Part, ...] | None

    def run(self, store: Store) -> Message:
        return store.edit_message(self.session_id, self.message_id, self.content)

    async def arun(self, store: AsyncStore) -> Message:
        return await store.aedit_message(self.session_id, self.message_id, self.content)


@dataclass(slots=True)
class AppendThenTail:
    """Append a batch, then read the tail as it is right after: one round trip."""

    session_id: str
    messages: Sequence[Message]
    tokens: TokenCounts | None
    turns: int | None
    counter: str | None

    def run(self, store: Store) -> tuple[int, Tail]:
        return store.append_then_tail(
            self.session_id, self.messages, self.tokens, self.turns, self.counter
        )

    async def arun(self, store: AsyncStore) -> tuple[int, Tail]:
        return await store.aappend_then_tail(
            self.session_id, self.messages, self.tokens, self.turns, self.counter
        )


@dataclass(slots=True)
class CompareAndSet:
    """Set one metadata key if it still holds ``expected``; whether it did."""

    session_id: str
    key: str
    expected: Any
    value: Mapping[str, Any] | None

    def run(self, store: Store) -> bool:
        return store.compare_and_set(self.session_id, self.key, self.expected, self.value)

    async def arun(self, store: AsyncStore) -> bool:
        return await store.acompare_and_set(self.session_id, self.key, self.expected, self.value)


@dataclass(slots=True)
class History:
    """Every stored message of the session."""

    session_id: str

    def run(self, store: Store) -> list[Message]:
        return store.history(self.session_id)

    async def arun(self, store: AsyncStore) -> list[Message]:
        return await store.ahistory(self.session_id)


@dataclass(slots=True)
class DeleteSession:
    """Forget the session; whether it existed."""

    session_id: str

    def run(self, store: Store) -> bool:
        return store.delete_session(self.session_id)

    async def arun(self, store: AsyncStore) -> bool:
        return await store.adelete_session(self.session_id)


@dataclass(slots=True)
class Summarize:
    """Fold ``messages`` into ``previous``: a summarizer call, which may raise
    :class:`~zerda.SummarizerError` into the flow."""

    summarizer: Summarizer
    previous: str
    messages: Sequence[Message]

    def run(self, store: Store) -> SummaryResult:
        return run_summarizer(self.summarizer, self.previous, self.messages)

    async def arun(self, store: AsyncStore) -> SummaryResult:
        return await arun_summarizer(self.summarizer, self.previous, self.messages)


def drive(flow: Flow[T], store: Store) -> T:
    """Run ``flow`` to its end, answering its requests through ``store``."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            request = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        try:
            reply, error = request.run(store), None
        except Exception as exc:
            reply, error = None, exc


async def adrive(flow: Flow[T], store: AsyncStore) -> T:
    """The async twin of :func:`drive`."""
    reply: Any = None
    error: Exception | None = None
    while True:
        try:
            request = flow.send(reply) if error is None else flow.throw(error)
        except StopIteration as stop:
            result: T = stop.value
            return result
        try:
            reply, error = await request.arun(store), None
        except Exception as exc:
            reply, error = None, exc

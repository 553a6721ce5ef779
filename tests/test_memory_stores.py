"""Memories over stores: store= and session_id=, restarts, tail-only reads, stored token counts,
and the sync/async pairing of memory methods and store protocols."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from _conversations import scan_turns
from zerda.errors import ConfigurationError, InvalidSessionIdError, ZerdaError
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
    ConversationTokenBufferMemory,
)
from zerda.messages import Message, Role, ToolCall
from zerda.stores import InMemoryStore, SessionInfo, SQLiteStore, Store, Tail
from zerda.tokens import CallableCounter, TokenCounter

T = TypeVar("T")
LEN = CallableCounter(len, name="len")


def len_count(m: Message) -> int:
    """What LEN charges for a message, from tokens.py's formula written out independently:
    3 per message, + content, + name and 1, + per tool call its name, arguments and 3."""
    n = 3 + len(m.content or "")
    if m.name is not None:
        n += len(m.name) + 1
    return n + sum(len(c.name) + len(c.arguments) + 3 for c in m.tool_calls)


# -- stores ------------------------------------------------------------------------------------


@dataclass
class Backend:
    """A store, and how to open another store over the same data (a restart, a second
    worker). For the in-memory store that is the same object: its data lives in it."""

    name: str
    store: Store
    reopen: Callable[[], Store]


@pytest.fixture(params=["memory", "sqlite"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    opened: list[Store] = []

    def track(store: Store) -> Store:
        opened.append(store)
        return store

    if request.param == "memory":
        store = InMemoryStore()
        made = Backend("memory", store, lambda: store)
    else:
        path = tmp_path / "zerda.db"
        try:
            first = track(SQLiteStore(path))
        except NotImplementedError:
            pytest.skip("SQLiteStore is still a placeholder")
        made = Backend("sqlite", first, lambda: track(SQLiteStore(path)))
    try:
        yield made
    finally:
        for store in opened:
            store.close()


# -- memories ------------------------------------------------------------------------------------

MemoryFactory = Callable[..., BaseMemory]

MEMORIES: dict[str, MemoryFactory] = {
    "buffer": lambda **kw: ConversationBufferMemory(**kw),
    "window": lambda **kw: ConversationBufferWindowMemory(k=2, **kw),
    "token": lambda **kw: ConversationTokenBufferMemory(
        max_token_limit=90, token_counter=kw.pop("token_counter", LEN), **kw
    ),
}


@pytest.fixture(params=sorted(MEMORIES))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def stamp(role: str, content: str | None, at: float, **extra: Any) -> Message:
    return Message(Role(role), content, created_at=at, **extra)


def conversation(turns: int, tag: str = "") -> list[Message]:
    """A system prompt, then ``turns`` turns; every third turn calls a tool."""
    out = [stamp("system", f"Be brief{tag}.", 1.0)]
    for t in range(turns):
        at = 10.0 + t
        out.append(stamp("user", f"question {t}{tag}", at))
        if t % 3 == 1:
            call = ToolCall(f"call_{t}", "lookup", f'{{"n": {t}}}')
            out.append(stamp("assistant", None, at, tool_calls=(call,)))
            out.append(stamp("tool", f"result {t}", at, tool_call_id=call.id))
        out.append(stamp("assistant", f"answer {t}{tag}", at))
    return out


def fill(memory: BaseMemory, messages: Sequence[Message]) -> list[Message]:
    """Record ``messages`` through every way in: one batch, single messages, save_context."""
    half = len(messages) // 2
    stored = memory.add_messages(messages[:half])
    for m in messages[half:]:
        stored.append(memory.add_message(m))
    memory.save_context({"input": "last question"}, {"output": "last answer"})
    return [*stored, *memory.get_history()[len(messages) :]]


def snapshot(memory: BaseMemory) -> dict[str, Any]:
    """Everything a memory shows."""
    view: dict[str, Any] = {
        "context": memory.get_context(),
        "history": memory.get_history(),
        "stats": memory.get_memory_stats(),
        "variables": memory.load_memory_variables({}),
        "messages": memory.get_messages(),
    }
    if isinstance(memory, ConversationBufferWindowMemory):
        view["window"] = memory.get_window_info()
    return view


def expected_context(kind: str, history: Sequence[Message]) -> list[Message] | None:
    """The context a memory must give for ``history`` (``None``: checked elsewhere)."""
    systems = [m for m in history if m.role is Role.SYSTEM]
    turns = scan_turns(list(history))
    if kind == "buffer":
        return systems + [m for t in turns for m in t]
    if kind == "window":
        return systems + [m for t in turns[-2:] for m in t]
    return None


# -- store= and session_id= ------------------------------------------------------------------------


def test_memory_writes_to_its_store_and_session(backend: Backend, kind: str) -> None:
    memory = MEMORIES[kind](store=backend.store, session_id="user-1")
    stored = fill(memory, conversation(5))
    assert backend.store.history("user-1") == stored
    assert memory.get_history() == stored
    assert backend.store.history("default") == []
    assert [i.session_id for i in backend.store.list_sessions()] == ["user-1"]
    expected = expected_context(kind, stored)
    if expected is not None:
        assert memory.get_context() == expected


def test_two_sessions_over_one_store_are_isolated(backend: Backend, kind: str) -> None:
    alice = MEMORIES[kind](store=backend.store, session_id="alice")
    bob = MEMORIES[kind](store=backend.store, session_id="bob")
    a = alice.add_messages(conversation(4, " for alice"))
    b = bob.add_messages(conversation(3, " for bob"))
    assert alice.get_history() == a
    assert bob.get_history() == b
    assert all("bob" not in (m.content or "") for m in alice.get_context())
    assert all("alice" not in (m.content or "") for m in bob.get_context())
    assert alice.get_memory_stats()["stored_messages"] == len(a)
    alice.clear()
    assert alice.get_history() == []
    assert bob.get_history() == b


def test_restart_gives_the_same_view(backend: Backend, kind: str) -> None:
    before = MEMORIES[kind](store=backend.store, session_id="s")
    fill(before, conversation(7))
    seen = snapshot(before)
    for store in (backend.store, backend.reopen()):
        after = MEMORIES[kind](store=store, session_id="s")
        assert snapshot(after) == seen


def test_two_workers_see_each_others_writes(backend: Backend, kind: str) -> None:
    one = MEMORIES[kind](store=backend.store, session_id="s")
    two = MEMORIES[kind](store=backend.reopen(), session_id="s")
    one.save_context({"input": "from one"}, {"output": "ok one"})
    two.save_context({"input": "from two"}, {"output": "ok two"})
    for memory in (one, two):
        assert [t["input"] for t in memory.get_messages()] == ["from one", "from two"]
        assert snapshot(memory) == snapshot(one)


# -- reads take only the tail they need ----------------------------------------------------------


class SpyStore:
    """A sync-only store over another one, recording each call, its thread and its result."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.calls: list[tuple[str, tuple[Any, ...], int]] = []
        self.results: list[Any] = []

    def _record(self, name: str, args: tuple[Any, ...], result: T) -> T:
        self.calls.append((name, args, threading.get_ident()))
        self.results.append(result)
        return result

    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]

    def tail_turns(self) -> list[int | None]:
        return [args[1] for name, args, _ in self.calls if name == "tail"]

    def append(self, session_id: str, messages: Sequence[Message], tokens: Any = None) -> int:
        stored = self.inner.append(session_id, messages, tokens)
        return self._record("append", (session_id, messages, tokens), stored)

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: Any,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        reply = self.inner.append_then_tail(session_id, messages, tokens, turns, counter)
        return self._record("append_then_tail", (session_id, turns, counter), reply)

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self._record(
            "tail", (session_id, turns, counter), self.inner.tail(session_id, turns, counter)
        )

    def history(self, session_id: str) -> list[Message]:
        return self._record("history", (session_id,), self.inner.history(session_id))

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        return self._record("get_metadata", (session_id,), self.inner.get_metadata(session_id))

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self._record("update_metadata", (session_id, values), None)
        self.inner.update_metadata(session_id, values)

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        done = self.inner.compare_and_set(session_id, key, expected, value)
        return self._record("compare_and_set", (session_id, key), done)

    def list_sessions(self) -> list[SessionInfo]:
        return self._record("list_sessions", (), self.inner.list_sessions())

    def delete_session(self, session_id: str) -> bool:
        return self._record("delete_session", (session_id,), self.inner.delete_session(session_id))

    def clear(self) -> None:
        self._record("clear", (), None)
        self.inner.clear()

    def purge_expired(self) -> int:
        return self._record("purge_expired", (), self.inner.purge_expired())

    def delete_messages(self, session_id: str, ids: Any) -> int:
        deleted = self.inner.delete_messages(session_id, ids)
        return self._record("delete_messages", (session_id, ids), deleted)

    def pop_turn(self, session_id: str) -> list[Message]:
        return self._record("pop_turn", (session_id,), self.inner.pop_turn(session_id))

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        copied = self.inner.fork(session_id, new_session_id, at)
        return self._record("fork", (session_id, new_session_id, at), copied)

    def edit_message(self, session_id: str, message_id: str, content: Any) -> Message:
        edited = self.inner.edit_message(session_id, message_id, content)
        return self._record("edit_message", (session_id, message_id), edited)

    def close(self) -> None:
        self._record("close", (), None)


class Counting:
    """A summarizer that records its calls and answers with a fixed, short summary."""

    def __init__(self) -> None:
        self.calls: list[list[Message]] = []

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        self.calls.append(list(messages))
        return "earlier turns"

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


def read_everything(memory: BaseMemory, times: int = 3) -> None:
    for _ in range(times):
        memory.get_context()
        memory.load_memory_variables({})
        memory.get_messages()
        memory.get_messages(limit=1)
        memory.get_memory_stats()
        if isinstance(memory, ConversationBufferWindowMemory):
            memory.get_window_info()


def long_session(store: Store, turns: int) -> None:
    """``turns`` turns of 22 LEN tokens each (two 8-character messages), counted by LEN."""
    batch: list[Message] = []
    for t in range(turns):
        batch += [stamp("user", f"q{t:07d}", 1.0), stamp("assistant", f"a{t:07d}", 1.0)]
    store.append("s", batch, {LEN.name: [len_count(m) for m in batch]})


def test_window_reads_at_most_k_turns(backend: Backend) -> None:
    long_session(backend.store, 500)
    spy = SpyStore(backend.store)
    memory = ConversationBufferWindowMemory(k=3, store=spy, session_id="s")
    read_everything(memory)
    assert "history" not in spy.names()
    asked = spy.tail_turns()
    assert asked, "the window read nothing"
    assert all(turns is not None and turns <= 3 for turns in asked), asked
    assert all(len(t.messages) <= 6 for t in spy.results if isinstance(t, Tail))
    assert [t["input"] for t in memory.get_messages()] == ["q0000497", "q0000498", "q0000499"]


def test_token_memory_reads_a_tail_bounded_by_the_budget(backend: Backend) -> None:
    # Five 22-token turns and the reply priming fit in 115 tokens; a sixth does not.
    asked_by_length: dict[int, list[int | None]] = {}
    for session_turns in (200, 2_000):
        store = backend.store
        store.delete_session("s")
        long_session(store, session_turns)
        spy = SpyStore(store)
        memory = ConversationTokenBufferMemory(
            max_token_limit=115,
            token_counter=LEN,
            store=spy,
            session_id="s",
        )
        read_everything(memory)
        assert memory.get_memory_stats()["turns_in_context"] == 5
        assert "history" not in spy.names()
        asked = spy.tail_turns()
        assert None not in asked, "a token memory read the whole session"
        assert max(t for t in asked if t is not None) <= 32, asked
        assert max(len(t.messages) for t in spy.results if isinstance(t, Tail)) <= 64
        asked_by_length[session_turns] = asked
    assert asked_by_length[200] == asked_by_length[2_000], "reads grew with the session"


@pytest.mark.parametrize("kind", ["buffer", "window", "token", "summary_buffer", "summary"])
def test_one_store_call_per_write_and_per_read_when_nothing_folds(kind: str) -> None:
    """The round trips of the issue's target: a write is one store call, a read one; a summary
    memory's write reads the tail in that same call, to see whether a fold is due."""
    spy = SpyStore(InMemoryStore())
    long_session(spy.inner, 50)
    summarizer = Counting()
    memory: BaseMemory
    if kind == "summary_buffer":
        memory = ConversationSummaryBufferMemory(
            400, summarizer=summarizer, token_counter=LEN, store=spy, session_id="s"
        )
    elif kind == "summary":
        memory = ConversationSummaryMemory(
            summarizer=summarizer, token_counter=LEN, store=spy, session_id="s"
        )
    else:
        memory = MEMORIES[kind](store=spy, session_id="s")
    memory.get_context()  # the first read learns how many turns to read
    if kind.startswith("summary"):
        memory.add_message(Message(Role.USER, "q"))  # folds what the first read left pending
    for write in (
        lambda: memory.add_message(Message(Role.USER, "q")),
        lambda: memory.add_messages([Message(Role.ASSISTANT, "a")]),
        lambda: memory.save_context({"input": "q"}, {"output": "a"}),
    ):
        spy.calls.clear()
        calls = len(summarizer.calls)
        write()
        if len(summarizer.calls) == calls:  # the summary memory folds the turn that ended
            assert spy.names() == ["append_then_tail" if kind.startswith("summary") else "append"]
    # A summary memory's write read the tail already, so it knows how much to read; a token
    # memory may need a second read after writes made room, then learns again.
    memory.get_context()
    for read in (memory.get_context, memory.get_memory_stats, memory.load_memory_variables):
        spy.calls.clear()
        read()
        assert spy.names() == ["tail"]


def test_a_fold_costs_a_compare_and_set_and_a_read() -> None:
    spy = SpyStore(InMemoryStore())
    summarizer = Counting()
    memory = ConversationSummaryBufferMemory(
        40, summarizer=summarizer, token_counter=LEN, store=spy, session_id="s"
    )
    memory.add_messages([Message(Role.USER, "q1"), Message(Role.ASSISTANT, "a" * 20)])
    spy.calls.clear()
    memory.add_messages([Message(Role.USER, "q2"), Message(Role.ASSISTANT, "b" * 20)])
    assert len(summarizer.calls) == 1
    assert spy.names() == ["append_then_tail", "compare_and_set", "tail"]
    assert spy.results[-2] is True, "the fold was stored"


def test_buffer_memory_reads_everything_through_tail(backend: Backend) -> None:
    # The buffer keeps every turn; it still reads through tail(None), so system messages are
    # pinned first and counts come along.
    long_session(backend.store, 10)
    spy = SpyStore(backend.store)
    memory = ConversationBufferMemory(store=spy, session_id="s")
    assert len(memory.get_context()) == 20
    assert spy.tail_turns() == [None]


# -- token counts are stored with the messages ---------------------------------------------------


class CountingCounter:
    """A TokenCounter over LEN that counts how often it is asked to count."""

    def __init__(self, inner: TokenCounter = LEN) -> None:
        self.inner = inner
        self.counted = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def count_text(self, text: str) -> int:
        self.counted += 1
        return self.inner.count_text(text)

    def count_message(self, message: Message) -> int:
        self.counted += 1
        return self.inner.count_message(message)

    def count_messages(self, messages: Iterable[Message]) -> int:
        messages = list(messages)
        self.counted += len(messages)
        return self.inner.count_messages(messages)


def test_counts_are_stored_by_counter_name(backend: Backend) -> None:
    memory = ConversationTokenBufferMemory(
        max_token_limit=500, token_counter=LEN, store=backend.store, session_id="s"
    )
    stored = fill(memory, conversation(6))
    tail = backend.store.tail("s", None, "len")
    non_system = [m for m in stored if m.role is not Role.SYSTEM]
    systems = [m for m in stored if m.role is Role.SYSTEM]
    assert list(tail.messages) == non_system
    assert list(tail.tokens) == [len_count(m) for m in non_system]
    assert list(tail.system_tokens) == [len_count(m) for m in systems]
    other = backend.store.tail("s", None, "another-counter")
    assert list(other.tokens) == [None] * len(non_system)
    assert list(other.system_tokens) == [None] * len(systems)


def test_buffer_memory_stores_no_counts(backend: Backend) -> None:
    memory = ConversationBufferMemory(store=backend.store, session_id="s")
    memory.add_messages(conversation(2))
    assert set(backend.store.tail("s", None, "len").tokens) == {None}


def test_token_memory_never_counts_a_message_twice(backend: Backend) -> None:
    counter = CountingCounter()
    memory = ConversationTokenBufferMemory(
        max_token_limit=90, token_counter=counter, store=backend.store, session_id="s"
    )
    constructed = counter.counted  # the reply priming, counted once per memory
    added = len(fill(memory, conversation(9)))
    assert counter.counted - constructed == added
    read_everything(memory, times=5)
    assert counter.counted - constructed == added
    for store in (backend.store, backend.reopen()):
        start = counter.counted
        rebuilt = ConversationTokenBufferMemory(
            max_token_limit=90, token_counter=counter, store=store, session_id="s"
        )
        constructed = counter.counted - start
        read_everything(rebuilt, times=5)
        assert counter.counted - start == constructed, "a rebuilt memory counted again"
        assert rebuilt.get_context() == memory.get_context()
        rebuilt.save_context({"input": "one more"}, {"output": "ok"})
        assert counter.counted - start == constructed + 2


# -- sync and async: memory methods and store protocols ----------------------------------------


class AsyncOnlyStore:
    """An InMemoryStore behind the async protocol alone, recording what it is asked."""

    def __init__(self) -> None:
        self._inner = InMemoryStore()
        self.calls: list[tuple[str, int]] = []

    def _seen(self, name: str) -> None:
        self.calls.append((name, threading.get_ident()))

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: Any = None
    ) -> int:
        self._seen("aappend")
        return await self._inner.aappend(session_id, messages, tokens)

    async def aappend_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: Any,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        self._seen("aappend_then_tail")
        return await self._inner.aappend_then_tail(session_id, messages, tokens, turns, counter)

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        self._seen("atail")
        return await self._inner.atail(session_id, turns, counter)

    async def ahistory(self, session_id: str) -> list[Message]:
        self._seen("ahistory")
        return await self._inner.ahistory(session_id)

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        return await self._inner.aget_metadata(session_id)

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        await self._inner.aupdate_metadata(session_id, values)

    async def acompare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        self._seen("acompare_and_set")
        return await self._inner.acompare_and_set(session_id, key, expected, value)

    async def alist_sessions(self) -> list[SessionInfo]:
        return await self._inner.alist_sessions()

    async def adelete_session(self, session_id: str) -> bool:
        self._seen("adelete_session")
        return await self._inner.adelete_session(session_id)

    async def aclear(self) -> None:
        await self._inner.aclear()

    async def apurge_expired(self) -> int:
        return await self._inner.apurge_expired()

    async def adelete_messages(self, session_id: str, ids: Any) -> int:
        self._seen("adelete_messages")
        return await self._inner.adelete_messages(session_id, ids)

    async def apop_turn(self, session_id: str) -> list[Message]:
        self._seen("apop_turn")
        return await self._inner.apop_turn(session_id)

    async def afork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        self._seen("afork")
        return await self._inner.afork(session_id, new_session_id, at)

    async def aedit_message(self, session_id: str, message_id: str, content: Any) -> Message:
        self._seen("aedit_message")
        return await self._inner.aedit_message(session_id, message_id, content)

    async def aclose(self) -> None:
        await self._inner.aclose()


class DualSpyStore(SpyStore):
    """A SpyStore with the async protocol too: a memory's async methods must use it."""

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: Any = None
    ) -> int:
        return self._record(
            "aappend", (session_id,), self.inner.append(session_id, messages, tokens)
        )

    async def aappend_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: Any,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        reply = self.inner.append_then_tail(session_id, messages, tokens, turns, counter)
        return self._record("aappend_then_tail", (session_id, turns), reply)

    async def acompare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        done = self.inner.compare_and_set(session_id, key, expected, value)
        return self._record("acompare_and_set", (session_id, key), done)

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self._record(
            "atail", (session_id, turns), self.inner.tail(session_id, turns, counter)
        )

    async def ahistory(self, session_id: str) -> list[Message]:
        return self._record("ahistory", (session_id,), self.inner.history(session_id))

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        return self.inner.get_metadata(session_id)

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self.inner.update_metadata(session_id, values)

    async def alist_sessions(self) -> list[SessionInfo]:
        return self.inner.list_sessions()

    async def adelete_session(self, session_id: str) -> bool:
        return self._record("adelete_session", (session_id,), self.inner.delete_session(session_id))

    async def aclear(self) -> None:
        self.inner.clear()

    async def apurge_expired(self) -> int:
        return self.inner.purge_expired()

    async def adelete_messages(self, session_id: str, ids: Any) -> int:
        return self._record(
            "adelete_messages", (session_id,), self.inner.delete_messages(session_id, ids)
        )

    async def apop_turn(self, session_id: str) -> list[Message]:
        return self._record("apop_turn", (session_id,), self.inner.pop_turn(session_id))

    async def afork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        copied = self.inner.fork(session_id, new_session_id, at)
        return self._record("afork", (session_id, new_session_id, at), copied)

    async def aedit_message(self, session_id: str, message_id: str, content: Any) -> Message:
        edited = self.inner.edit_message(session_id, message_id, content)
        return self._record("aedit_message", (session_id, message_id), edited)

    async def aclose(self) -> None:
        pass


SYNC_CALLS: dict[str, Callable[[BaseMemory], object]] = {
    "add_message": lambda m: m.add_message({"role": "user", "content": "hi"}),
    "add_messages": lambda m: m.add_messages([{"role": "user", "content": "hi"}]),
    "save_context": lambda m: m.save_context({"input": "hi"}, {"output": "hello"}),
    "get_context": lambda m: m.get_context(),
    "get_history": lambda m: m.get_history(),
    "load_memory_variables": lambda m: m.load_memory_variables({}),
    "get_messages": lambda m: m.get_messages(),
    "get_memory_stats": lambda m: m.get_memory_stats(),
    "clear": lambda m: m.clear(),
    "get_window_info": lambda m: m.get_window_info(),
}


async def async_script(memory: BaseMemory, messages: Sequence[Message]) -> dict[str, Any]:
    """Write and read through every async method; what each read gave."""
    await memory.aadd_messages(messages[:3])
    for m in messages[3:]:
        await memory.aadd_message(m)
    await memory.asave_context({"input": "last question"}, {"output": "last answer"})
    view: dict[str, Any] = {
        "context": await memory.aget_context(),
        "history": await memory.aget_history(),
        "stats": await memory.aget_memory_stats(),
        "variables": await memory.aload_memory_variables({}),
        "messages": await memory.aget_messages(),
    }
    if isinstance(memory, ConversationBufferWindowMemory):
        view["window"] = await memory.aget_window_info()
    await memory.aclear()
    view["after_clear"] = await memory.aget_history()
    return view


def sync_script(memory: BaseMemory, messages: Sequence[Message]) -> dict[str, Any]:
    """The same as ``async_script``, through the sync methods."""
    memory.add_messages(messages[:3])
    for m in messages[3:]:
        memory.add_message(m)
    memory.save_context({"input": "last question"}, {"output": "last answer"})
    view = snapshot(memory)
    memory.clear()
    view["after_clear"] = memory.get_history()
    return view


def without_times(value: Any) -> Any:
    """``value`` with the stamps that depend on when it ran removed (save_context's times,
    and the ids memories give messages)."""
    if isinstance(value, Message):
        return dataclasses.replace(value, created_at=0.0, id=None)
    if isinstance(value, Mapping):
        return {k: without_times(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


def test_sync_methods_over_an_async_store_raise(kind: str) -> None:
    store = AsyncOnlyStore()
    memory = MEMORIES[kind](store=store, session_id="s")  # constructing does no I/O
    for name, call in SYNC_CALLS.items():
        if name == "get_window_info" and kind != "window":
            continue
        with pytest.raises(ZerdaError, match=r"AsyncOnlyStore is an async store.*async methods"):
            call(memory)
    assert store.calls == []
    assert asyncio.run(memory.aget_history()) == []


def test_async_methods_over_an_async_store_are_native(kind: str) -> None:
    store = AsyncOnlyStore()
    memory = MEMORIES[kind](store=store, session_id="s")
    messages = conversation(4)

    async def run() -> tuple[dict[str, Any], int]:
        return await async_script(memory, messages), threading.get_ident()

    view, loop_thread = asyncio.run(run())
    expected = sync_script(MEMORIES[kind](store=InMemoryStore(), session_id="s"), messages)
    assert without_times(view) == without_times(expected)
    assert {name for name, _ in store.calls} >= {"aappend", "atail", "ahistory"}
    assert {thread for _, thread in store.calls} == {loop_thread}


def test_async_methods_over_a_sync_store_run_in_a_worker_thread(kind: str) -> None:
    spy = SpyStore(InMemoryStore())
    memory = MEMORIES[kind](store=spy, session_id="s")
    messages = conversation(4)

    async def run() -> tuple[dict[str, Any], int]:
        return await async_script(memory, messages), threading.get_ident()

    view, loop_thread = asyncio.run(run())
    assert spy.calls, "the store was not used"
    assert {"append", "tail"} <= set(spy.names())
    assert loop_thread not in {thread for _, _, thread in spy.calls}, (
        "a sync store was called on the event loop's thread"
    )
    sync_spy = SpyStore(InMemoryStore())
    expected = sync_script(MEMORIES[kind](store=sync_spy, session_id="s"), messages)
    assert without_times(view) == without_times(expected)
    assert {thread for _, _, thread in sync_spy.calls} == {threading.get_ident()}
    assert [name for name in spy.names() if name != "tail"] == [
        name for name in sync_spy.names() if name != "tail"
    ]


def test_async_methods_prefer_the_async_protocol(kind: str) -> None:
    spy = DualSpyStore(InMemoryStore())
    memory = MEMORIES[kind](store=spy, session_id="s")
    view = asyncio.run(async_script(memory, conversation(3)))
    assert view["after_clear"] == []
    assert spy.names(), "the store was not used"
    assert set(spy.names()) <= {"aappend", "atail", "ahistory", "adelete_session"}
    spy.calls.clear()
    sync_script(memory, conversation(3))
    assert set(spy.names()) <= {"append", "tail", "history", "delete_session"}


# -- constructor checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "session_id", ["", "x" * 201, "a b", "'; DROP TABLE x; --", "../../etc", "{tag}", 7, None]
)
def test_invalid_session_id_is_refused_by_the_constructor(kind: str, session_id: Any) -> None:
    store = InMemoryStore()
    with pytest.raises(InvalidSessionIdError):
        MEMORIES[kind](store=store, session_id=session_id)
    assert store.list_sessions() == []


@pytest.mark.parametrize(
    "store",
    [
        pytest.param("sqlite:///zerda.db", id="str"),
        pytest.param({}, id="dict"),
        pytest.param(object(), id="object"),
        pytest.param([], id="list"),
        pytest.param(InMemoryStore, id="class-not-instance"),
    ],
)
def test_store_of_a_wrong_type_is_refused(kind: str, store: Any) -> None:
    with pytest.raises(ConfigurationError, match="store"):
        MEMORIES[kind](store=store, session_id="s")


def test_default_store_is_a_fresh_in_memory_store(kind: str) -> None:
    one, two = MEMORIES[kind](), MEMORIES[kind]()
    assert isinstance(one.store, InMemoryStore)
    assert one.store is not two.store
    assert one.session_id == "default"
